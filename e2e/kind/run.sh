#!/usr/bin/env bash
# Runs the e2e suite on a kind cluster, for users with Docker. It cannot run on our development machines
# (no Docker engine there), which run the same suite on a local control plane (`python -m pytest e2e`).
#
# 1. create the kind cluster (e2e/kind/cluster.yaml) with the pinned kind from scripts/build-tools.sh;
# 2. install KWOK's controller and its default stages: the suite's fake topology nodes (2-NUMA AMX, 1-NUMA AVX2,
#    4-NUMA AVX-512, arm64, created by the suite) become Ready and their pods Running, exactly as locally;
# 3. build the operator image from the Dockerfile, load it into kind, and install the chart with it, pinned
#    to the real workers (labelled cpullm.io/operator-host=true);
# 4. run the suite against that cluster and that in-cluster operator.
# Environment: KWOK_MANIFESTS=dir holding kwok.yaml and stage-fast.yaml of the KWOK release, if the script has
# no network; KEEP_CLUSTER=1 keeps the cluster afterwards. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/tool-versions.env
eval "$(scripts/build-tools.sh kind kubernetes helm | grep _BIN_DIR=)"
kind=$KIND_BIN_DIR/kind kubectl=$KUBERNETES_BIN_DIR/kubectl helm=$HELM_BIN_DIR/helm
image=cpullm-operator:e2e
kubeconfig=$(mktemp)
k() { "$kubectl" --kubeconfig "$kubeconfig" "$@"; }

"$kind" create cluster --config e2e/kind/cluster.yaml --kubeconfig "$kubeconfig" --wait 120s
[[ ${KEEP_CLUSTER:-0} == 1 ]] || trap '"$kind" delete cluster --name cpullm-e2e' EXIT

release=https://github.com/kubernetes-sigs/kwok/releases/download/$KWOK_VERSION
for manifest in kwok.yaml stage-fast.yaml; do
  source=${KWOK_MANIFESTS:+$KWOK_MANIFESTS/$manifest}
  k apply -f "${source:-$release/$manifest}"
done
k -n kube-system rollout status deployment/kwok-controller --timeout=120s

docker build -t "$image" .
"$kind" load docker-image "$image" --name cpullm-e2e
for node in $(k get nodes -l '!node-role.kubernetes.io/control-plane' -o name); do
  k label "$node" cpullm.io/operator-host=true --overwrite
done
"$helm" --kubeconfig "$kubeconfig" install kind-operator charts/cpullm-operator \
  --namespace cpullm-operator --create-namespace \
  --set image.repository=cpullm-operator --set image.tag=e2e --set image.pullPolicy=Never \
  --set-string 'nodeSelector.cpullm\.io/operator-host=true' --wait --timeout 180s

scripts/setup.sh
CPULLM_E2E_KUBECONFIG=$kubeconfig CPULLM_E2E_KUBECTL=$kubectl \
  CPULLM_E2E_OPERATOR=cpullm-operator/kind-operator-cpullm-operator \
  .venv/bin/python -m pytest e2e -q "$@"

#!/usr/bin/env bash
# Runs the e2e suite on a kind cluster, for users with Docker. It cannot run on our development machines
# (no Docker engine there); they run the same suite on a local control plane (`python -m pytest e2e`).
#
# 1. create the kind cluster (e2e/kind/cluster.yaml) with the pinned kind from scripts/build-tools.sh;
# 2. install KWOK's controller and its default stages, so the suite's fake topology nodes (2-NUMA AMX,
#    1-NUMA AVX2, 4-NUMA AVX-512, arm64) become Ready and their pods Running, exactly as on the local cluster;
# 3. run the suite against it (the operator runs as a local process with the kind kubeconfig).
# Environment: KWOK_MANIFESTS=dir with kwok.yaml and stage-fast.yaml from the KWOK v0.8.0 release, if you
# have no network from the script; KEEP_CLUSTER=1 keeps the cluster afterwards.
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/tool-versions.env
eval "$(scripts/build-tools.sh kind kubernetes | grep _BIN_DIR=)"
kind=$KIND_BIN_DIR/kind kubectl=$KUBERNETES_BIN_DIR/kubectl
kubeconfig=$(mktemp)
"$kind" create cluster --config e2e/kind/cluster.yaml --kubeconfig "$kubeconfig" --wait 120s
[[ ${KEEP_CLUSTER:-0} == 1 ]] || trap '"$kind" delete cluster --name cpullm-e2e' EXIT
release=https://github.com/kubernetes-sigs/kwok/releases/download/$KWOK_VERSION
for manifest in kwok.yaml stage-fast.yaml; do
  source=${KWOK_MANIFESTS:+$KWOK_MANIFESTS/$manifest}
  "$kubectl" --kubeconfig "$kubeconfig" apply -f "${source:-$release/$manifest}"
done
"$kubectl" --kubeconfig "$kubeconfig" -n kube-system rollout status deployment/kwok-controller --timeout=120s
scripts/setup.sh
CPULLM_E2E_KUBECONFIG=$kubeconfig CPULLM_E2E_KUBECTL=$kubectl .venv/bin/python -m pytest e2e -q "$@"

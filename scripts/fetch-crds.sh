#!/usr/bin/env bash
# Fetches the published CRDs of the optional APIs the operator can write (the Prometheus Operator's PodMonitor,
# KEDA's ScaledObject, the Gateway API Inference Extension's InferencePool, the Gateway API's HTTPRoute) or read
# (NodeResourceTopology) from their projects' Go modules through the Go module proxy (cached in the Go module
# cache, keyed by version; nothing is written inside the repo). Prints one `NAME=path` line per CRD file.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=tool-versions.env
source "$here/tool-versions.env"
export GOTOOLCHAIN=local GOFLAGS=-mod=mod

# module_dir MODULE@VERSION: the module's directory in the Go module cache (downloaded on first use)
module_dir() {
  go mod download -json "$1" | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])'
}

prom=$(module_dir "github.com/prometheus-operator/prometheus-operator@$PROMETHEUS_OPERATOR_VERSION")
keda=$(module_dir "github.com/kedacore/keda/v2@$KEDA_VERSION")
inference=$(module_dir "sigs.k8s.io/gateway-api-inference-extension@$GATEWAY_API_INFERENCE_EXTENSION_VERSION")
gateway=$(module_dir "sigs.k8s.io/gateway-api@$GATEWAY_API_VERSION")
topology=$(module_dir "github.com/k8stopologyawareschedwg/noderesourcetopology-api@$NODE_RESOURCE_TOPOLOGY_API_VERSION")
echo "PODMONITOR_CRD=$prom/example/prometheus-operator-crd/monitoring.coreos.com_podmonitors.yaml"
echo "SERVICEMONITOR_CRD=$prom/example/prometheus-operator-crd/monitoring.coreos.com_servicemonitors.yaml"
echo "SCALEDOBJECT_CRD=$keda/config/crd/bases/keda.sh_scaledobjects.yaml"
echo "INFERENCEPOOL_CRD=$inference/config/crd/bases/inference.networking.k8s.io_inferencepools.yaml"
echo "HTTPROUTE_CRD=$gateway/config/crd/standard/gateway.networking.k8s.io_httproutes.yaml"
echo "NODERESOURCETOPOLOGY_CRD=$topology/manifests/crd.yaml"

#!/usr/bin/env bash
# The planner with no cluster: plans every bundled example against the bundled sample nodes (the human table),
# then renders one's Deployment and Service (--no-launcher: without the launcher ConfigMap's Python source).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
for service in manifests/examples/*.yaml; do
  echo "== $service"
  .venv/bin/cpullm plan "$service" --nodes examples/nodes.yaml
done
echo "== rendered children of manifests/examples/llama-8b-amx.yaml"
.venv/bin/cpullm render manifests/examples/llama-8b-amx.yaml --nodes examples/nodes.yaml --no-launcher

#!/usr/bin/env bash
# The main job, with no cluster of your own: the operator's planner plans every bundled example
# against the bundled sample nodes, and renders the Deployment of the first.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
for service in manifests/examples/*.yaml; do
  echo "== $service"
  .venv/bin/cpullm plan "$service" --nodes examples/nodes.yaml -o yaml
done
echo "== rendered children of manifests/examples/llama-8b-amx.yaml"
.venv/bin/cpullm render manifests/examples/llama-8b-amx.yaml --nodes examples/nodes.yaml

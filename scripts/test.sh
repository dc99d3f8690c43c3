#!/usr/bin/env bash
# The test command: lint, types, the layer contract, unit tests (with a coverage floor), the e2e suite on a local control plane (scripts/build-tools.sh
# builds it on first use; CPULLM_SKIP_E2E=1 skips it), then the real-vLLM tests (scripts/setup-vllm.sh
# installs vLLM's CPU build on first use; CPULLM_SKIP_VLLM=1 skips them), then the real-node tests (root: a
# kubelet with containerd joined to a local control plane runs the operator's Deployment with real vLLM;
# scripts/setup-node.sh and scripts/build-images.sh on first use; CPULLM_SKIP_NODE=1 skips them), then the kind
# path (root: a Docker engine from scripts/docker.sh, kind's images built here; its own tests, then the e2e suite
# on a kind cluster against the in-cluster operator, testbed/kind/run.sh; CPULLM_SKIP_KIND=1 skips them).
# `scripts/test.sh --fast`: lint, types, the layer contract and the unit tests only (seconds, no cluster).
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ ${1:-} == --fast ]]; then
  export CPULLM_SKIP_E2E=1 CPULLM_SKIP_VLLM=1 CPULLM_SKIP_NODE=1 CPULLM_SKIP_KIND=1
elif [[ $# -gt 0 ]]; then
  echo "usage: scripts/test.sh [--fast]" >&2
  exit 2
fi
stage() { echo "== test.sh [$((SECONDS / 60))m$((SECONDS % 60))s] $*" >&2; }
stage "setup, lint, types, layer contract"
scripts/setup.sh
.venv/bin/ruff check operator tests e2e testbed bench
.venv/bin/ruff format --check operator tests e2e testbed bench
.venv/bin/mypy
.venv/bin/lint-imports  # the layer contract (pyproject.toml, [tool.importlinter])
# Unit tests: warnings are errors (pyproject.toml); line+branch coverage must stay at 90% or more (95% now).
stage "unit tests"
.venv/bin/python -m pytest tests -q --cov --cov-report=term:skip-covered --cov-fail-under=90
if [[ ${CPULLM_SKIP_E2E:-0} != 1 ]]; then
  stage "e2e suite on a local control plane"
  .venv/bin/python -m pytest e2e -q -p no:logging
fi
if [[ ${CPULLM_SKIP_VLLM:-0} != 1 ]]; then
  stage "real-vLLM tests"
  .venv/bin/python -m pytest tests/vllm -m vllm -q -p no:logging
fi
if [[ ${CPULLM_SKIP_NODE:-0} != 1 ]]; then
  stage "real-node tests"
  .venv/bin/python -m pytest e2e/test_node.py -m node -q -p no:logging
fi
if [[ ${CPULLM_SKIP_KIND:-0} != 1 ]]; then
  stage "kind tests"
  .venv/bin/python -m pytest e2e/test_kind.py e2e/test_quickstart.py -m kind -q -p no:logging
  stage "e2e suite on kind (testbed/kind/run.sh)"
  testbed/kind/run.sh
fi
stage "done"

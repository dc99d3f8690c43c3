#!/usr/bin/env bash
# The test commands. `scripts/test.sh` (a contributor's): lint, types, the layer contract and the unit tests only
# (about 90 s on two cores; no root, no cluster, no vLLM). `scripts/test.sh --full` (what .ci/run calls): lint, types, the layer contract, unit tests (with a coverage floor), the e2e suite on a local
# control plane (scripts/build-tools.sh builds it on first use; CPULLM_SKIP_E2E=1 skips it; where the kind path runs
# the whole suite against the in-cluster operator, only the tests it skips there, marker local_operator, so each test
# runs once), then the real-vLLM tests (scripts/setup-vllm.sh installs vLLM's CPU build on first use;
# CPULLM_SKIP_VLLM=1 skips them; those of a server's memory peak, marker memory_peak, after prepare.sh's build),
# then the real-node tests (root: a kubelet with containerd joined to a local control plane runs the operator's
# Deployment with real vLLM; scripts/setup-node.sh and scripts/build-images.sh on first use; CPULLM_SKIP_NODE=1
# skips them), then the kind path (root: a Docker engine from scripts/docker.sh, kind's images built here; its own
# tests, the release path (scripts/release.sh into a registry on localhost, whose chart the quick start
# installs), then the e2e suite on a kind cluster against the in-cluster operator, testbed/kind/run.sh;
# CPULLM_SKIP_KIND=1 skips them).
# What the later stages install and build on first use is prepared in the background at idle priority
# (scripts/prepare.sh): `fetch` from the start, `build` while the e2e suite and the real-vLLM tests but the
# memory-peak ones run; its log goes to the output if it fails.
set -euo pipefail
cd "$(dirname "$0")/.."
case ${1:-} in
  "" | --fast) export CPULLM_SKIP_E2E=1 CPULLM_SKIP_VLLM=1 CPULLM_SKIP_NODE=1 CPULLM_SKIP_KIND=1 ;;
  --full) ;; # each later stage unless its CPULLM_SKIP_X=1
  *)
    echo "usage: scripts/test.sh [--full]" >&2
    exit 2
    ;;
esac
if [[ $# -gt 1 ]]; then
  echo "usage: scripts/test.sh [--full]" >&2
  exit 2
fi
stage() { echo "== test.sh [$((SECONDS / 60))m$((SECONDS % 60))s] $*" >&2; }
stage "setup, lint, types, layer contract"
scripts/setup.sh
wanted() { [[ ${!1:-0} != 1 ]]; } # wanted CPULLM_SKIP_X: that stage runs
prepare_log= prepare_pid=
if wanted CPULLM_SKIP_VLLM || wanted CPULLM_SKIP_NODE || wanted CPULLM_SKIP_KIND; then
  prepare_log=$(mktemp /tmp/cpullm-prepare-XXXXXX.log)
fi
prepare() { # STEP: scripts/prepare.sh STEP in the background at idle priority, when a later stage runs
  [[ -z $prepare_log ]] && return
  # A session of its own, niced as a whole: where the kernel groups CPU time by session (autogroup, the default
  # of most distributions), a process's own nice weighs only within its session, and the build took an equal
  # share of two vCPUs from the real-vLLM tests (13 -> 30 minutes); the session's nice weighs against theirs.
  setsid bash -c '{ echo 19 >/proc/self/autogroup; } 2>/dev/null; exec nice -n 19 scripts/prepare.sh "$1"' \
    prepare "$1" >>"$prepare_log" 2>&1 &
  prepare_pid=$!
}
trap '[[ -z $prepare_pid ]] || kill -- "-$prepare_pid" 2>/dev/null' EXIT # a failed stage ends it too
prepared() { # waits for that step; on failure, its log and the run's end
  [[ -z $prepare_pid ]] && return
  if ! wait "$prepare_pid"; then
    echo "scripts/prepare.sh failed; the end of its log ($prepare_log):" >&2
    tail -40 "$prepare_log" >&2
    exit 1
  fi
  prepare_pid=
}
prepare fetch
.venv/bin/ruff check operator tests e2e testbed bench
.venv/bin/ruff format --check operator tests e2e testbed bench
.venv/bin/mypy
.venv/bin/lint-imports  # the layer contract (pyproject.toml, [tool.importlinter])
# Each later stage prints its eight slowest tests (--durations): where the run's time goes.
# Unit tests, and the benches' own (bench/test_*.py): warnings are errors (pyproject.toml); line+branch coverage must stay at 90% or more (92% now: the in-pod probe and sizing scripts run only with vLLM).
stage "unit tests"
.venv/bin/python -m pytest tests bench -q --cov --cov-report=term:skip-covered --cov-fail-under=90
if wanted CPULLM_SKIP_E2E || wanted CPULLM_SKIP_NODE || wanted CPULLM_SKIP_KIND; then
  stage "the local control plane's tools (scripts/build-tools.sh)"
  scripts/build-tools.sh kubernetes etcd kwok helm >/dev/null # what the e2e suite runs; kind is prepared with `build`
fi
prepared
prepare build
if wanted CPULLM_SKIP_E2E && wanted CPULLM_SKIP_KIND; then # the whole suite runs on kind below: here, what it skips
  stage "e2e suite on a local control plane: the tests of a local operator process (marker local_operator)"
  .venv/bin/python -m pytest e2e -q -p no:logging -m local_operator --durations=8
elif wanted CPULLM_SKIP_E2E; then
  stage "e2e suite on a local control plane"
  .venv/bin/python -m pytest e2e -q -p no:logging --durations=8
fi
if wanted CPULLM_SKIP_VLLM; then # needs only what `fetch` installed: `build` goes on beside it
  stage "real-vLLM tests but those of the memory cgroup's peak"
  .venv/bin/python -m pytest tests/vllm -m 'vllm and not memory_peak' -q -p no:logging --durations=8
fi
prepared
if [[ -n $prepare_log ]]; then
  grep '^prepare: ' "$prepare_log" >&2 # each step's start, in seconds since its part began
  rm -f "$prepare_log"
fi
if wanted CPULLM_SKIP_VLLM; then # with nothing beside them (pyproject.toml, marker memory_peak)
  stage "real-vLLM tests of the memory cgroup's peak"
  .venv/bin/python -m pytest tests/vllm -m 'vllm and memory_peak' -q -p no:logging --durations=8
fi
if wanted CPULLM_SKIP_NODE; then
  stage "real-node tests"
  .venv/bin/python -m pytest e2e/test_node.py -m node -q -p no:logging --durations=8
fi
if wanted CPULLM_SKIP_KIND; then
  stage "kind tests"
  .venv/bin/python -m pytest e2e/test_kind.py e2e/test_quickstart.py e2e/test_release.py e2e/test_gateway_proxy.py \
    e2e/test_router_proxy.py -m kind -q -p no:logging --durations=8
  stage "e2e suite on kind (testbed/kind/run.sh)"
  testbed/kind/run.sh --durations=8
fi
stage "done"

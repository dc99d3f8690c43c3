#!/usr/bin/env bash
# Runs the e2e suite on a kind cluster against the operator installed in it with the chart, with nothing pulled
# from a registry (root):
#
#   testbed/kind/run.sh [pytest args]
#
# 1. a Docker engine: this machine's, or one scripts/docker.sh starts (and stops at the end);
# 2. python -m testbed.kind_up: kind's base and node images built here (testbed/kind_images.py), a cluster of a control
#    plane and two workers (testbed/kind_cluster.py: kind's default CNI with our kindnetd stand-in, the static CPU manager), KWOK's
#    controller rendered from its Go module with its image built here (the suite's topology nodes are KWOK nodes,
#    exactly as on the local control plane), the operator's image built from the Dockerfile, loaded with
#    `kind load`, and the chart installed with it on the real workers;
# 3. the suite with CPULLM_E2E_OPERATOR pointing at that in-cluster operator (stopped by scaling to 0, SIGKILLed
#    by a zero-grace force delete); the real-node and kind tests are local-only and skip themselves.
# KEEP_CLUSTER=1 keeps the cluster (and the engine) afterwards.
set -euo pipefail
cd "$(dirname "$0")/../.."
scripts/setup.sh
name=cpullm-e2e
workdir=$(mktemp -d /tmp/cpullm-kind-XXXXXX)
docker_host=$(scripts/docker.sh start | tail -1)
export "${docker_host?}"
[[ -n ${DOCKER_HOST:-} ]] || unset DOCKER_HOST

cleanup() {
  [[ ${KEEP_CLUSTER:-0} == 1 ]] && return
  eval "$(scripts/build-tools.sh kind | grep _BIN_DIR=)"
  "$KIND_BIN_DIR/kind" delete cluster --name "$name" || true
  scripts/docker.sh stop
  rm -rf "$workdir"
}
trap cleanup EXIT

env_lines=$(.venv/bin/python -m testbed.kind_up "$workdir" "$name")
# shellcheck disable=SC2046
export $(grep '^CPULLM_E2E_' <<<"$env_lines")
.venv/bin/python -m pytest e2e -q -p no:logging "$@"

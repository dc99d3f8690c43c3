#!/usr/bin/env bash
# Installs and builds, ahead of the stages of scripts/test.sh that use them, what those stages would otherwise
# install or build on first use. Each step is that stage's own idempotent script, so a warm run takes seconds, and
# a stage that finds its part missing still builds it itself. scripts/test.sh runs `fetch` in the background at
# idle priority from its start (it waits on the network and on the disk while lint, the unit tests and the control
# plane's Go build use the CPU), then `build` while the e2e suite on the local control plane runs (that suite waits
# on the API server: 36-70% of the two cores idle in the stretches measured with vmstat, docs/testing.md) and then
# the real-vLLM tests but those of a server's memory peak (they need only `fetch`'s part; the memory-peak tests and the
# real-node stage wait for it).
#
#   scripts/prepare.sh fetch   the vLLM environment (scripts/setup-vllm.sh), the real node's and Docker's Debian
#                              packages (scripts/setup-node.sh --packages, scripts/docker.sh install), Debian's
#                              docker-registry (testbed/registry.py) and qemu-user-static (scripts/binfmt.sh)
#   scripts/prepare.sh build   the kubelet, kube-proxy, Prometheus, kind, kubeadm, CoreDNS, the local-path
#                              provisioner, cosign, syft and kube-router (scripts/build-tools.sh), the real node's images, the release's
#                              arm64 base and kube-router's (scripts/build-images.sh) and kind's base image
#                              (testbed/kind_images.py)
#
# What a stage turned off with CPULLM_SKIP_VLLM/NODE/KIND=1 alone needs is left out. Root for the packages and the
# images (as the stages themselves).
set -euo pipefail
cd "$(dirname "$0")/.."
step() { echo "prepare: [${SECONDS}s] $*" >&2; }
wanted() { [[ ${!1:-0} != 1 ]]; } # wanted CPULLM_SKIP_X: the stage is not turned off
node_or_kind() { wanted CPULLM_SKIP_NODE || wanted CPULLM_SKIP_KIND; }

fetch() {
  if wanted CPULLM_SKIP_VLLM || node_or_kind; then # the vLLM image and the quick start copy the environment
    step "the vLLM environment"
    scripts/setup-vllm.sh >/dev/null
  fi
  if node_or_kind; then # mmdebstrap and buildah make the images of both
    step "the real node's Debian packages"
    scripts/setup-node.sh --packages
  fi
  if wanted CPULLM_SKIP_KIND; then
    step "Docker, the registry's and the release's Debian packages"
    scripts/docker.sh install
    .venv/bin/python -c "from testbed.registry import ensure_package; ensure_package()"
    scripts/binfmt.sh arm64 # qemu-user-static and arch-test: the release's arm64 image (testbed/release.py)
  fi
  step "fetched"
}

build() {
  local tools=() images=()
  node_or_kind && tools+=(kubelet prometheus) && images+=(pause debian vllm python-base operator)
  wanted CPULLM_SKIP_KIND && tools+=(kind kubeadm coredns local-path-provisioner cosign syft kube-router) &&
    images+=(haproxy python-base-arm64 kube-router)
  if ((${#tools[@]})); then
    step "Go tools: ${tools[*]}"
    scripts/build-tools.sh "${tools[@]}" >/dev/null
    step "images: ${images[*]}"
    scripts/build-images.sh "${images[@]}" >/dev/null
  fi
  if wanted CPULLM_SKIP_KIND; then
    step "kind's base image"
    .venv/bin/python -m testbed.kind_images kind-base >/dev/null
  fi
  step "built"
}

case ${1:-} in
  fetch) fetch ;;
  build) build ;;
  *)
    echo "usage: $0 fetch|build" >&2
    exit 2
    ;;
esac

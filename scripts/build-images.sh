#!/usr/bin/env bash
# Builds the test-only real node's images as OCI image layout tars, cached under
# ${CPULLM_IMAGES_CACHE:-$HOME/.cache/cpullm-operator/images} keyed by their inputs (idempotent):
#   pause  the pod sandbox image (testbed/node/pause/main.go)
#   debian the vLLM image's Debian base layer alone (~180 MB), a quick test image
#   vllm   a local stand-in for the published vLLM CPU image, under the reference the operator renders
#          (needs scripts/setup-vllm.sh's environment and scripts/setup-node.sh's mmdebstrap; root)
#   python-base  Debian's python3 with venv and this host's CA bundle: the Dockerfile's BASE here
#   python-base-arm64  the same for arm64 (under qemu-user-static: scripts/binfmt.sh arm64), for a release's arm64 image
#   operator     the operator's image from the repository's Dockerfile, built by buildah on python-base
# See testbed/images.py for how the stand-in differs from the published image.
#
#   scripts/build-images.sh [pause] [debian] [vllm] [python-base] [python-base-arm64] [operator]     (default: all)
#
# Prints NAME_IMAGE_REF=... and NAME_IMAGE_TAR=... lines; import with
#   ctr -n k8s.io images import "$TAR"       (the tar's index names the image REF)
set -euo pipefail
cd "$(dirname "$0")/.."
exec python3 -m testbed.images "$@"

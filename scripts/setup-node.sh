#!/usr/bin/env bash
# Prepares this machine to run a real Kubernetes node (testbed/realnode.py) next to the local control plane:
#  - Debian packages: containerd (1.6), runc, the CNI plugins (bridge, host-local, loopback under /usr/lib/cni),
#    iptables (kube-proxy), mmdebstrap (the images' root filesystems, scripts/build-images.sh), buildah (the
#    operator's image from the Dockerfile, without a Docker engine), libtcmalloc-minimal4;
#    apt-get runs only when one of them is missing;
#  - the kubelet and kube-proxy, built by scripts/build-tools.sh (cached under
#    ~/.cache/cpullm-operator/tools/node-<version>).
# Root only. Idempotent: a second run takes seconds. Writes nothing inside the repo.
#
#   sudo scripts/setup-node.sh               # the packages and the kubelet
#   sudo scripts/setup-node.sh --packages    # the packages only (scripts/prepare.sh fetch)
#
# Prints, last, KEY=value lines: KUBELET_BIN_DIR, CONTAINERD, CTR, RUNC, CNI_BIN_DIR (not with --packages).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
log() { echo "setup-node: $*" >&2; }

if [[ $(id -u) != 0 ]]; then
  log "must run as root (containerd and the kubelet run as root)"
  exit 1
fi

packages=(containerd runc containernetworking-plugins iptables mmdebstrap buildah libtcmalloc-minimal4 ca-certificates)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  log "apt-get install ${missing[*]}"
  apt-get update -qq
  # --no-install-recommends: containerd's recommends pull nothing we need; the daemon is started by
  # testbed/realnode.py with its own config, never as a system service (there is no systemd here).
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

[[ ${1:-} == --packages ]] && exit 0

kubelet_dir=$(bash "$here/build-tools.sh" kubelet | sed -n 's/^KUBELET_BIN_DIR=//p')

echo "KUBELET_BIN_DIR=$kubelet_dir"
echo "CONTAINERD=$(command -v containerd)"
echo "CTR=$(command -v ctr)"
echo "RUNC=$(command -v runc)"
echo "CNI_BIN_DIR=/usr/lib/cni"

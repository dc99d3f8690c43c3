#!/usr/bin/env bash
# Lets this machine run another architecture's programs (a release's foreign platforms, built by buildah): registers
# Debian's qemu-user-static with the kernel's binfmt_misc for each ARCH (arm64, amd64, ...) not already handled.
# Machines with systemd do this at boot (systemd-binfmt); containers and VMs without it need this once per boot. Root.
#
#   scripts/binfmt.sh ARCH...
set -euo pipefail
die() { echo "binfmt.sh: $*" >&2; exit 1; }
machine() { case $1 in amd64) echo x86_64 ;; arm64) echo aarch64 ;; *) echo "$1" ;; esac; }
for arch in "$@"; do
  qemu=$(machine "$arch")
  [[ $qemu == "$(uname -m)" ]] && continue
  if [[ ! -e /usr/lib/binfmt.d/qemu-$qemu.conf ]] || ! command -v arch-test >/dev/null; then
    [[ $(id -u) == 0 ]] || die "$arch binaries do not run here; as root: $0 $arch"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q qemu-user-static arch-test >/dev/null
  fi
  [[ -e /proc/sys/fs/binfmt_misc/qemu-$qemu ]] && continue
  [[ $(id -u) == 0 ]] || die "$arch binaries do not run here; as root: $0 $arch"
  [[ -e /proc/sys/fs/binfmt_misc/register ]] || mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc
  cat "/usr/lib/binfmt.d/qemu-$qemu.conf" >/proc/sys/fs/binfmt_misc/register
  echo "binfmt.sh: $arch binaries run under $(readlink -f "/usr/bin/qemu-$qemu-static")" >&2
done

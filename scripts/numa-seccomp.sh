#!/usr/bin/env bash
# Writes the chart's seccomp profiles for vLLM's NUMA calls (charts/cpullm-operator/files/numa-seccomp-ARCH.json, one
# per architecture the release builds) from containerd's default profile (scripts/numa-seccomp/main.go says what is
# added and why). Run after changing the containerd version in scripts/numa-seccomp/go.mod; the real-node tests
# check the files are what this writes. Another architecture's profile is built for it and run under
# qemu-user-static (scripts/binfmt.sh), since containerd's profile is chosen by the architecture it runs on.
#
#   scripts/numa-seccomp.sh [--check]     --check: compare instead of writing; exit 1 if a file differs
set -euo pipefail
cd "$(dirname "$0")/.."
check=0
[[ ${1:-} == --check ]] && check=1
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-buildvcs=false
out=charts/cpullm-operator/files
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
status=0
for arch in amd64 arm64; do
  scripts/binfmt.sh "$arch"
  (cd scripts/numa-seccomp && GOARCH=$arch go build -trimpath -o "$work/numa-seccomp-$arch" .)
  "$work/numa-seccomp-$arch" >"$work/numa-seccomp-$arch.json"
  if ((check)); then
    cmp -s "$work/numa-seccomp-$arch.json" "$out/numa-seccomp-$arch.json" || {
      echo "numa-seccomp.sh: $out/numa-seccomp-$arch.json is not what scripts/numa-seccomp.sh writes" >&2
      status=1
    }
  else
    mkdir -p "$out" && cp "$work/numa-seccomp-$arch.json" "$out/"
  fi
done
exit $status

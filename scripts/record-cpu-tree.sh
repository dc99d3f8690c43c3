#!/usr/bin/env bash
# Copy the procfs/sysfs files operator/cpullm/launcher.py reads (and a few neighbours that explain them) into
# DEST, keeping their paths, so the launcher's tests can run on this machine's real CPU layout:
#   scripts/record-cpu-tree.sh tests/unit/fixtures/cpu-trees/this-machine-$(date +%F)
# Idempotent: DEST/proc and DEST/sys are replaced, nothing else in DEST is touched.
set -euo pipefail
if [[ $# -ne 1 ]]; then
  echo "usage: $0 DEST" >&2
  exit 2
fi
dest=$1
rm -rf "$dest/proc" "$dest/sys"

copy() {  # copy SRC... to the same paths under $dest; missing ones (optional files) are skipped
  local src
  for src in "$@"; do
    [[ -f $src ]] || continue
    mkdir -p "$dest$(dirname "$src")"
    cat "$src" >"$dest$src"  # cat, not cp: sysfs reports sizes that are not the content's
  done
}

mkdir -p "$dest/proc/self"
# The status of the cat that copies it: same cpuset and memory nodes as this shell.
cat /proc/self/status >"$dest/proc/self/status"
copy /sys/devices/system/cpu/{online,possible,present}
for cpu in /sys/devices/system/cpu/cpu[0-9]*; do
  copy "$cpu/online" "$cpu"/topology/{thread_siblings_list,core_id,physical_package_id}
done
copy /sys/devices/system/node/{online,possible}
for node in /sys/devices/system/node/node[0-9]*; do
  copy "$node/cpulist"
done
copy /sys/fs/cgroup/cpu.max /sys/fs/cgroup/cpuset.cpus.effective
for dir in /sys/fs/cgroup/cpu,cpuacct /sys/fs/cgroup/cpu; do
  copy "$dir"/cpu.cfs_{quota,period}_us
done
echo "recorded $(find "$dest/proc" "$dest/sys" -type f | wc -l) files under $dest"

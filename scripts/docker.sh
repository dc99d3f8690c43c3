#!/usr/bin/env bash
# A Docker engine for the kind path (testbed/kind/run.sh) on a machine that has none: Debian's docker.io, with its
# own containerd and dockerd started without systemd. A machine whose `docker` already answers is left alone.
#
#   scripts/docker.sh start   # idempotent; prints DOCKER_HOST=... last (empty: the machine's own engine)
#   scripts/docker.sh stop    # stops the engine `start` started, if any (its containers with it; never the
#                             # machine's own engine); keeps the image store
#   scripts/docker.sh install # Debian's docker.io where no engine answers and dockerd is missing (start does it too)
#
# State: images under ~/.cache/cpullm-operator/docker (kept between runs), sockets, pids and logs under
# /run/cpullm-docker. Root only for `install`, and for `start` and `stop` of our own engine.
#
# Only where the capability bounding set lacks CAP_SYS_RESOURCE (some sandboxes, detected from
# /proc/self/status): privileged containers (kind's nodes) fail there, so the engine's default runtime becomes
# the TEST-ONLY wrapper testbed/node/runc-wrapper, which drops that one capability. A normal host never gets it.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
log() { echo "docker.sh: $*" >&2; }

run_dir=/run/cpullm-docker
cache=${XDG_CACHE_HOME:-$HOME/.cache}/cpullm-operator/docker
socket=$run_dir/docker.sock
wrapper=$here/../testbed/node/runc-wrapper

lacks_cap_sys_resource() {
  local bounding
  bounding=$(awk '/^CapBnd:/ {print $2}' /proc/self/status)
  (((0x$bounding >> 24 & 1) == 0))
}

machines_own_answers() { [[ -z ${CPULLM_OWN_DOCKER:-} ]] && docker version >/dev/null 2>&1; }

ours_running() { [[ -S $socket ]] && docker -H "unix://$socket" version >/dev/null 2>&1; }

stop_pid() { # name: SIGTERM, then wait up to 60 s for it to go
  local pid_file=$run_dir/$1.pid pid
  [[ -f $pid_file ]] || return 0
  pid=$(cat "$pid_file")
  if kill "$pid" 2>/dev/null; then
    for _ in $(seq 600); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
  fi
  rm -f "$pid_file"
}

install() {
  if command -v dockerd >/dev/null || machines_own_answers; then
    return
  fi
  log "apt-get install docker.io"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends docker.io >/dev/null
}

start() {
  if machines_own_answers; then
    log "using this machine's Docker engine"
    echo "DOCKER_HOST=${DOCKER_HOST:-}"
    return
  fi
  if ours_running; then
    echo "DOCKER_HOST=unix://$socket"
    return
  fi
  if [[ $(id -u) != 0 ]]; then
    log "no Docker engine answers, and starting one needs root"
    exit 1
  fi
  install
  mkdir -p "$run_dir" "$cache/containerd" "$cache/data"
  # A containerd of its own (not the real node's, nor a system one): no CRI plugin, its own root and socket.
  cat >"$run_dir/containerd.toml" <<EOF
version = 2
root = "$cache/containerd"
state = "$run_dir/containerd-state"
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = "$run_dir/containerd.sock"
EOF
  setsid containerd --config "$run_dir/containerd.toml" >"$run_dir/containerd.log" 2>&1 </dev/null &
  echo $! >"$run_dir/containerd.pid"
  for _ in $(seq 300); do [[ -S $run_dir/containerd.sock ]] && break; sleep 0.1; done

  local runtime=()
  if lacks_cap_sys_resource; then
    log "this host's bounding set lacks CAP_SYS_RESOURCE: default runtime is the test-only $wrapper"
    runtime=(--add-runtime "cpullm-runc=$(realpath "$wrapper")" --default-runtime cpullm-runc)
  fi
  setsid "$(command -v dockerd)" --host "unix://$socket" --containerd "$run_dir/containerd.sock" \
    --data-root "$cache/data" --exec-root "$run_dir/exec" --pidfile "$run_dir/dockerd.pid" \
    --storage-driver overlay2 "${runtime[@]}" >"$run_dir/dockerd.log" 2>&1 </dev/null &
  for _ in $(seq 600); do ours_running && break; sleep 0.1; done
  if ! ours_running; then
    log "dockerd did not answer within 60 s; its log:"
    tail -20 "$run_dir/dockerd.log" >&2
    exit 1
  fi
  echo "DOCKER_HOST=unix://$socket"
}

stop() {
  stop_pid dockerd
  stop_pid containerd
}

case ${1:-} in
  install) install ;;
  start) start ;;
  stop) stop ;;
  *)
    echo "usage: $0 start|stop|install" >&2
    exit 2
    ;;
esac

#!/usr/bin/env bash
# From nothing to a served completion on a machine with Docker: a kind cluster, the operator installed with its
# chart, a small CpuLLMService, progress while it comes up, then a completion through a port-forward.
#
#   scripts/quickstart.sh                      # kind's node image, vLLM's published CPU image, a model from the Hub
#   scripts/quickstart.sh --offline --registry localhost:5000 --model-dir DIR
#                                              # every image from REGISTRY, the model from a local directory
#
# Options:
#   --name NAME            the kind cluster (default cpullm-quickstart); an existing one is reused
#   --model ID             a Hugging Face Hub model (default Qwen/Qwen2.5-0.5B-Instruct; vLLM downloads it)
#   --model-dir DIR        a local model directory (config.json, tokenizer, *.safetensors) copied into the nodes
#   --cpus N               whole CPUs for the server (default: the planner's, all the worker's CPUs that its
#                          DaemonSets leave, e.g. 7 on an 8-CPU machine beside kindnet's 100m)
#   --registry HOST:PORT   take every image from this registry, under the names given below; a registry on this
#                          machine (localhost, 127.0.0.1) is reached from the kind nodes through the kind network's
#                          gateway, so it must listen there (e.g. on 0.0.0.0:PORT), over plain HTTP
#   --node-image REF       kind's node image (default: kind's own, or REGISTRY/kindest/node:<KUBERNETES_VERSION of
#                          scripts/tool-versions.env>)
#   --operator-image REF   the operator's image (default: built here with `docker build` and loaded into kind,
#                          or REGISTRY/cpullm-operator:<chart appVersion>)
#   --chart REF            install this released chart (oci://REGISTRY/charts/cpullm-operator, at the tree's
#                          version) and the image it names, instead of the tree's chart (docs/releasing.md)
#   --vllm-image REF       the server's image (default: the operator's choice, vLLM's published CPU image for the
#                          node's arch, or REGISTRY/<that image's path>)
#   --kind-config FILE     a kind Cluster config of your own (with --registry it must set containerd's
#                          config_path to /etc/containerd/certs.d, as the default config does)
#   --offline              reach no network but the registry: needs --registry and --model-dir
#   --port PORT            the local port the port-forward listens on (default 8000)
#   --timeout SECONDS      how long to wait for Ready (default 1800)
#
# Needs docker, and kind, kubectl and helm on PATH (otherwise scripts/build-tools.sh builds them with Go), and
# Python 3.11+ (scripts/setup.sh makes .venv, whose `cpullm plan` shows the plan first). Ends with the commands to
# ask again by hand and the one to delete everything.
set -euo pipefail
cd "$(dirname "$0")/.."
started=$SECONDS
say() { printf '[%3ds] %s\n' $((SECONDS - started)) "$*"; }
die() { echo "quickstart: $*" >&2; exit 1; }
usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 2; }

name=cpullm-quickstart model=Qwen/Qwen2.5-0.5B-Instruct model_dir="" cpus="" registry="" node_image=""
operator_image="" vllm_image="" kind_config="" offline=0 port=8000 timeout=1800 chart=""
while [[ $# -gt 0 ]]; do
  case $1 in
    --name) name=$2; shift 2 ;;
    --model) model=$2; shift 2 ;;
    --model-dir) model_dir=$(cd "$2" && pwd) || die "no directory $2"; shift 2 ;;
    --cpus) cpus=$2; shift 2 ;;
    --registry) registry=$2; shift 2 ;;
    --node-image) node_image=$2; shift 2 ;;
    --operator-image) operator_image=$2; shift 2 ;;
    --vllm-image) vllm_image=$2; shift 2 ;;
    --chart) chart=$2; shift 2 ;;
    --kind-config) kind_config=$2; shift 2 ;;
    --offline) offline=1; shift ;;
    --port) port=$2; shift 2 ;;
    --timeout) timeout=$2; shift 2 ;;
    -h | --help) usage ;;
    *) echo "quickstart: unknown option $1" >&2; usage ;;
  esac
done
[[ -z $cpus || $cpus =~ ^[1-9][0-9]*$ ]] || die "--cpus takes a whole number of CPUs, not '$cpus'"
[[ $timeout =~ ^[1-9][0-9]*$ ]] || die "--timeout takes seconds, not '$timeout'"
[[ $port =~ ^[1-9][0-9]*$ ]] || die "--port takes a port number, not '$port'"
if ((offline)); then
  [[ -n $registry && -n $model_dir ]] || die "--offline takes its images from --registry and its model from --model-dir"
fi
[[ -z $model_dir || -f $model_dir/config.json ]] || die "$model_dir has no config.json"
[[ -z $kind_config || -f $kind_config ]] || die "no kind config $kind_config"
[[ -z $chart || -z $operator_image ]] || die "--chart installs the image the chart names: drop --operator-image"
docker version >/dev/null 2>&1 || die "docker does not answer (is the engine running? DOCKER_HOST=${DOCKER_HOST:-})"

# --- tools -------------------------------------------------------------------------------------------------------
missing=()
for tool in kind kubectl helm; do command -v $tool >/dev/null || missing+=("$tool"); done
if ((${#missing[@]})); then
  say "building ${missing[*]} from the Go module proxy (scripts/build-tools.sh; once, cached)"
  tools=$(scripts/build-tools.sh kubernetes helm kind | grep _BIN_DIR=)
  for line in $tools; do PATH=${line#*=}:$PATH; done
fi
say "setting up .venv (scripts/setup.sh)"
scripts/setup.sh >/dev/null
cpullm=.venv/bin/cpullm
python=.venv/bin/python
# json_field KEY...: one field of the JSON on stdin (a number indexes a list)
json_field() {
  "$python" -c 'import json, sys
v = json.load(sys.stdin)
for k in sys.argv[1:]:
    v = v[int(k)] if isinstance(v, list) else v[k]
print(v)' "$@"
}

chart_version=$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' charts/cpullm-operator/Chart.yaml)
if [[ -n $registry ]]; then
  node_image=${node_image:-$registry/kindest/node:$(sed -n 's/^KUBERNETES_VERSION=//p' scripts/tool-versions.env)}
  [[ -n $chart ]] || operator_image=${operator_image:-$registry/cpullm-operator:$chart_version}
fi

# --- the cluster -------------------------------------------------------------------------------------------------
work=$(mktemp -d /tmp/cpullm-quickstart-XXXXXX)
trap 'rm -rf "$work"' EXIT
kubeconfig=$work/kubeconfig
if kind get clusters 2>/dev/null | grep -qx "$name"; then
  say "kind cluster $name exists: reusing it"
else
  if [[ -z $kind_config ]]; then
    kind_config=$work/kind-config.yaml
    {
      echo "kind: Cluster"
      echo "apiVersion: kind.x-k8s.io/v1alpha4"
      echo "nodes: [{role: control-plane}, {role: worker}]"
      echo "containerdConfigPatches:"
      echo "- |"
      echo "  [plugins.\"io.containerd.grpc.v1.cri\".registry]"
      echo "    config_path = \"/etc/containerd/certs.d\""
    } >"$kind_config"
  elif [[ -n $registry ]] && ! grep 'config_path' "$kind_config" | grep -q '/etc/containerd/certs.d'; then
    die "$kind_config does not set containerd's config_path = \"/etc/containerd/certs.d\", which --registry needs"
  fi
  say "creating kind cluster $name${node_image:+ from $node_image}"
  kind create cluster --name "$name" --config "$kind_config" ${node_image:+--image "$node_image"} --wait 5m \
    --kubeconfig "$kubeconfig"
fi
kind get kubeconfig --name "$name" >"$kubeconfig"
export KUBECONFIG=$kubeconfig
nodes=$(kind get nodes --name "$name")

if [[ -n $registry ]]; then
  server=http://$registry
  if [[ ${registry%:*} == localhost || ${registry%:*} == 127.0.0.1 ]]; then
    gateway=$(docker network inspect kind -f '{{range .IPAM.Config}}{{.Gateway}} {{end}}' | tr ' ' '\n' | grep -m1 '\.')
    server=http://$gateway:${registry##*:}
  fi
  say "kind nodes pull $registry from $server"
  for node in $nodes; do
    docker exec "$node" mkdir -p "/etc/containerd/certs.d/$registry"
    # server too: else a reference the mirror lacks falls back to localhost inside the node, and its "not found"
    # reads as "connection refused".
    printf 'server = "%s"\n\n[host."%s"]\n  capabilities = ["pull", "resolve"]\n' "$server" "$server" |
      docker exec -i "$node" cp /dev/stdin "/etc/containerd/certs.d/$registry/hosts.toml"
  done
fi

# --- the operator ------------------------------------------------------------------------------------------------
if [[ -n $chart ]]; then
  plain_http=()
  [[ $chart =~ ^oci://(localhost|127\.0\.0\.1)[:/] ]] && plain_http=(--plain-http)
  say "installing the operator from $chart, version $chart_version"
  helm upgrade --install cpullm-operator "$chart" --version "$chart_version" "${plain_http[@]}" \
    --namespace cpullm-operator --create-namespace --wait --timeout 5m >/dev/null
elif [[ -z $operator_image ]]; then
  operator_image=cpullm-operator:$chart_version pull_policy=Never  # on every node already: never pulled
  say "building $operator_image (docker build) and loading it into kind"
  docker build --quiet --tag "$operator_image" . >/dev/null
  kind load docker-image "$operator_image" --name "$name"
fi
if [[ -z $chart ]]; then
  say "installing the operator ($operator_image) with its chart"
  helm upgrade --install cpullm-operator charts/cpullm-operator --namespace cpullm-operator --create-namespace \
    --set-string "image.repository=${operator_image%:*},image.tag=${operator_image##*:}" \
    --set-string "image.pullPolicy=${pull_policy:-IfNotPresent}" --wait --timeout 5m >/dev/null
fi

# --- the model and its service -----------------------------------------------------------------------------------
models=$work/models.yaml service=$work/quickstart.yaml
served=$model
if [[ -n $model_dir ]]; then
  served=/models/$(basename "$model_dir")
  say "copying $model_dir into the kind nodes ($(du -sh "$model_dir" | cut -f1))"
  for node in $nodes; do
    docker exec "$node" mkdir -p /var/lib/cpullm-quickstart
    docker cp "$model_dir" "$node:/var/lib/cpullm-quickstart/"
  done
fi
"$python" - "$models" "$service" "$served" "$model_dir" "$cpus" <<'PY'
import json, pathlib, sys
models, service, served, model_dir, cpus = sys.argv[1:6]
spec = {"model": {"name": served}, "kvCacheGiB": 1, "maxModelLen": 2048, "maxNumSeqs": 4}
if cpus:
    spec["cpu"] = {"cpusPerRank": int(cpus)}
volumes = []
if model_dir:
    # The nodes' copy of the model directory, a hostPath volume the operator mounts at /models in the server.
    spec["model"]["config"] = json.loads((pathlib.Path(model_dir) / "config.json").read_text())
    spec["modelCache"] = {"persistentVolumeClaim": {"claimName": "quickstart-models"}}
    size, modes, klass = {"storage": "1Gi"}, ["ReadWriteOnce"], "quickstart-models"
    volumes = [
        {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": "quickstart-models"},
         "spec": {"capacity": size, "accessModes": modes, "storageClassName": klass,
                  "hostPath": {"path": "/var/lib/cpullm-quickstart", "type": "Directory"},
                  "claimRef": {"namespace": "default", "name": "quickstart-models"}}},
        {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
         "metadata": {"name": "quickstart-models", "namespace": "default"},
         "spec": {"accessModes": modes, "storageClassName": klass, "resources": {"requests": size},
                  "volumeName": "quickstart-models"}},
    ]
pathlib.Path(models).write_text("".join("---\n" + json.dumps(v, indent=1) + "\n" for v in volumes))
body = {"apiVersion": "cpullm.io/v1alpha1", "kind": "CpuLLMService",
        "metadata": {"name": "quickstart", "namespace": "default"}, "spec": spec}
pathlib.Path(service).write_text(json.dumps(body, indent=1) + "\n")
PY
say "the plan for this cluster (cpullm plan --from-cluster):"
"$cpullm" plan "$service" --from-cluster
if [[ -z $vllm_image && -n $registry ]]; then
  published=$("$cpullm" plan "$service" --from-cluster -o json | json_field image)
  vllm_image=$registry/${published#*/} # the published reference under the registry instead of its own host
fi
if [[ -n $vllm_image ]]; then
  "$python" -c 'import json, sys; p = sys.argv[1]; s = json.load(open(p)); s["spec"]["image"] = sys.argv[2]
json.dump(s, open(p, "w"), indent=1)' "$service" "$vllm_image"
fi
if [[ -s $models ]]; then kubectl apply -f "$models" >/dev/null; fi
kubectl apply -f "$service"

# --- progress until Ready ----------------------------------------------------------------------------------------
# phase: one line for where the service is (planning, scheduling, pulling, loading the model, ready, failed).
phase() {
  local service pods
  service=$(kubectl get cpullmservice quickstart -o json) && pods=$(kubectl get pods -l cpullm.io/service=quickstart -o json) &&
    "$python" - "$service" "$pods" <<'PY'
import json, sys
service, pods = json.loads(sys.argv[1]), json.loads(sys.argv[2])["items"]
pods = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
conditions = {c["type"]: c for c in service.get("status", {}).get("conditions", [])}
planned, ready = conditions.get("Planned", {}), conditions.get("Ready", {})
if ready.get("status") == "True":
    line = "ready"
elif planned.get("status") == "False":
    line = f"failed: not planned: {planned.get('reason')}: {planned.get('message')}"
elif not pods:
    line = "planned: the server pod is being created" if planned.get("status") == "True" else "planning"
elif not pods[0]["spec"].get("nodeName"):
    why = [c.get("message", "") for c in pods[0]["status"].get("conditions", []) if c["type"] == "PodScheduled"]
    line = f"scheduling {' '.join(why)}".rstrip()
else:
    node = pods[0]["spec"]["nodeName"]
    state = next(iter(pods[0]["status"].get("containerStatuses") or []), {}).get("state", {})
    waiting = state.get("waiting", {}).get("reason", "")
    if waiting in ("ErrImagePull", "ImagePullBackOff", "InvalidImageName"):
        line = f"pulling the image on {node}: {waiting}: {state['waiting'].get('message', '')}"
    elif "running" in state:
        line = f"loading the model on {node} (the server starts, then reads the weights)"
    elif state.get("terminated") or waiting == "CrashLoopBackOff":
        line = f"restarting on {node}: {waiting or state['terminated'].get('reason')} (kubectl logs deploy/quickstart)"
    else:
        line = f"pulling the image and starting the container on {node}"
print(line)
PY
}
say "waiting for Ready (up to ${timeout}s), each phase as it is reached:"
deadline=$((SECONDS + timeout)) last=""
while :; do
  now=$(phase 2>/dev/null) || now="waiting for the API server"
  [[ $now != "$last" ]] && say "  $now"
  last=$now
  [[ $now == ready ]] && break
  [[ $now == failed:* ]] && die "${now#failed: }"
  ((SECONDS < deadline)) || die "not Ready after ${timeout}s, last: $now (kubectl describe cpullmservice quickstart)"
  sleep 2
done

# --- a completion ------------------------------------------------------------------------------------------------
kubectl port-forward service/quickstart $port:8000 >"$work/port-forward.log" 2>&1 &
forward=$!
trap 'kill $forward 2>/dev/null || true; rm -rf "$work"' EXIT
request=$("$python" -c 'import json, sys
print(json.dumps({"model": sys.argv[1], "prompt": "The capital of France is", "max_tokens": 16}))' "$served")
for _ in $(seq 100); do curl -s -o /dev/null localhost:$port/health && break; sleep 0.2; done
say "asking for a completion through the port-forward:"
answer=$(curl -sS --fail-with-body localhost:$port/v1/completions -H 'Content-Type: application/json' -d "$request") ||
  die "the completion failed: $answer (kubectl port-forward said: $(cat "$work/port-forward.log"))"
echo "$answer"
say "completion: $(json_field choices 0 text <<<"$answer" | tr '\n' ' ')"
cat <<EOF

Again by hand:
  kind export kubeconfig --name $name
  kubectl get cpullmservice quickstart      # the plan and readiness; kubectl describe for conditions and events
  kubectl port-forward service/quickstart 8000:8000 &
  curl localhost:8000/v1/completions -H 'Content-Type: application/json' -d '$request'
Delete everything:
  kind delete cluster --name $name
EOF

#!/usr/bin/env bash
# Builds the local control plane's tools from the Go module proxy and caches them, keyed by version,
# under ${CPULLM_TOOLS_CACHE:-$HOME/.cache/cpullm-operator/tools}. Idempotent: a tool whose binaries are
# already in the cache is skipped, so a warm run takes seconds. Nothing is written inside the repo.
#
#   scripts/build-tools.sh [TOOL...]    TOOL: kubernetes etcd kwok helm kind kubelet kubeadm coredns
#                                       local-path-provisioner kube-router cosign syft prometheus
#                                       (default: the first five)
#
# The kubelet and kube-proxy (for a real node, scripts/setup-node.sh) are built only when asked for:
# `scripts/build-tools.sh kubelet`. It is kept out of the default list so e2e runs, which need only the
# control plane, never build it. It shares the kubernetes tool's wrapper module and Go build cache.
#
# Prints, last, the directory of each tool (one `NAME_BIN_DIR=path` line per tool built or found).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=tool-versions.env
source "$here/tool-versions.env"
cache=${CPULLM_TOOLS_CACHE:-$HOME/.cache/cpullm-operator/tools}
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-buildvcs=false
mkdir -p "$cache"

log() { echo "build-tools: $*" >&2; }

# have DIR BIN... : true when every BIN is an executable in DIR
have() { local dir=$1; shift; for b in "$@"; do [[ -x $dir/$b ]] || return 1; done; }

# Builds into a temporary directory and renames it into place, so an interrupted build never leaves
# a half-filled cache entry behind.
publish() { local tmp=$1 dir=$2; rm -rf "$dir"; mv "$tmp" "$dir"; }

# The Kubernetes commands, KWOK and Helm are built in one wrapper module (go.mod) with one set of build flags, so
# the packages they share (client-go, apimachinery, the apiserver library, gRPC, ...) resolve to one version each
# and compile once (measured cold here: KWOK and Helm took 125 s and 85 s on their own after the control plane,
# 50 s together in its module). Go's minimal version selection takes, for each dependency, the newest version any
# of them requires (gRPC v1.82.1 where Kubernetes alone requires v1.79.3), as in any program that imports these
# modules. Each tool keeps its own cache entry below.
K8S_CMDS=(kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet kube-proxy kubeadm)
GO_TAGS=selinux,notest,grpcnotrace

# shared_module : prepares that module in $cache/src/kubernetes-$KUBERNETES_VERSION (KWOK and Helm at their pinned
# versions as tools beside the commands) once per run, and sets k8s_ld to the ldflags that stamp the Kubernetes
# version.
shared_module() {
  [[ -n ${k8s_ld:-} ]] && return
  local v=$KUBERNETES_VERSION
  local work=$cache/src/kubernetes-$v
  mkdir -p "$work"
  # k8s.io/kubernetes requires its staging modules at v0.0.0 and replaces them with ./staging paths,
  # so it cannot be built as a dependency as is. A wrapper module replaces each staging module with its
  # published release (v1.X.Y -> v0.X.Y), the list taken from the real go.mod of this version.
  local gomod staging c tools=()
  gomod=$(go mod download -json "k8s.io/kubernetes@$v" | python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')
  staging="v0.${v#v1.}"
  for c in "${K8S_CMDS[@]}"; do tools+=("k8s.io/kubernetes/cmd/$c@$v"); done
  tools+=("sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION" "sigs.k8s.io/kwok/cmd/kwokctl@$KWOK_VERSION")
  tools+=("helm.sh/helm/v3/cmd/helm@$HELM_VERSION")
  (
    cd "$work"
    rm -f go.mod go.sum
    go mod init cpullm.local/kubernetes-tools >/dev/null 2>&1
    grep -oE '^\s*k8s\.io/[a-z0-9-]+ => \./staging/' "$gomod" | awk '{print $1}' | while read -r m; do
      go mod edit -replace "$m=$m@$staging"
    done
    go get -tool "${tools[@]}"
  )
  # Without the stamp /version says v0.0.0-master and Helm's kubeVersion checks fail.
  local minor=${v#v1.}; minor=${minor%%.*}
  local pkg
  k8s_ld="-s -w"
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    k8s_ld+=" -X $pkg.gitVersion=$v -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
    k8s_ld+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
  done
}

# shared_tool DIR LDFLAGS PKG... : one `go build` of every PKG of the shared module (their links run in parallel)
# into the cache entry DIR
shared_tool() {
  local dir=$1 ld=$2; shift 2
  local tmp=$dir.tmp
  rm -rf "$tmp"; mkdir -p "$tmp"
  shared_module
  log "  go build $*"
  (cd "$cache/src/kubernetes-$KUBERNETES_VERSION" &&
    go build -trimpath -tags "$GO_TAGS" -ldflags "$ld" -o "$tmp/" "$@")
  publish "$tmp" "$dir"
}

# k8s_tool DIR BIN... : the Kubernetes commands BIN, stamped with their version, into the cache entry DIR
k8s_tool() {
  local dir=$1 b pkgs=(); shift
  for b in "$@"; do pkgs+=("k8s.io/kubernetes/cmd/$b"); done
  shared_module
  shared_tool "$dir" "$k8s_ld" "${pkgs[@]}"
}

build_kubernetes() {
  local dir=$cache/kubernetes-$KUBERNETES_VERSION bins=(kube-apiserver kube-controller-manager kube-scheduler kubectl)
  if ! have "$dir" "${bins[@]}"; then
    log "kubernetes $KUBERNETES_VERSION: building ${bins[*]} (cold: about 10 min on 2 cores)"
    k8s_tool "$dir" "${bins[@]}"
  fi
  echo "KUBERNETES_BIN_DIR=$dir"
}

# The binaries of a real node (scripts/setup-node.sh): the kubelet and kube-proxy (the Service path: ClusterIPs,
# among them the API server's own for in-cluster clients), in their own cache entry so the control plane's stays
# valid.
build_kubelet() {
  local dir=$cache/node-$KUBERNETES_VERSION bins=(kubelet kube-proxy)
  if ! have "$dir" "${bins[@]}"; then
    log "kubelet and kube-proxy $KUBERNETES_VERSION: building (a few minutes once the control plane is built)"
    k8s_tool "$dir" "${bins[@]}"
  fi
  echo "KUBELET_BIN_DIR=$dir"
}

# kind's nodes (testbed/kind_images.py) run kubeadm; kept apart like the kubelet so the control plane's entry stays valid.
build_kubeadm() {
  local dir=$cache/kubeadm-$KUBERNETES_VERSION
  if ! have "$dir" kubeadm; then
    log "kubeadm $KUBERNETES_VERSION: building"
    k8s_tool "$dir" kubeadm
  fi
  echo "KUBEADM_BIN_DIR=$dir"
}

build_etcd() {
  local v=$ETCD_VERSION dir=$cache/etcd-$ETCD_VERSION
  if have "$dir" etcd etcdctl; then echo "ETCD_BIN_DIR=$dir"; return; fi
  log "etcd $v: building etcd, etcdctl"
  local work=$cache/src/etcd-$v tmp=$dir.tmp
  rm -rf "$tmp"; mkdir -p "$work" "$tmp"
  (
    cd "$work"
    rm -f go.mod go.sum
    go mod init cpullm.local/etcd-tools >/dev/null 2>&1
    go get -tool "go.etcd.io/etcd/server/v3@$v" "go.etcd.io/etcd/etcdctl/v3@$v"
    go build -trimpath -ldflags "-s -w" -o "$tmp/etcd" go.etcd.io/etcd/server/v3
    go build -trimpath -ldflags "-s -w" -o "$tmp/etcdctl" go.etcd.io/etcd/etcdctl/v3
  )
  publish "$tmp" "$dir"
  echo "ETCD_BIN_DIR=$dir"
}

# go_install NAME DIR VERSION LDFLAGS PKG... : `go install` each PKG@VERSION into DIR
go_install() {
  local name=$1 dir=$2 v=$3 ld=$4; shift 4
  local tmp=$dir.tmp
  rm -rf "$tmp"; mkdir -p "$tmp"
  log "$name $v: go install $*"
  for pkg in "$@"; do GOBIN=$tmp go install -trimpath -ldflags "$ld" "$pkg@$v"; done
  publish "$tmp" "$dir"
}

build_kwok() {
  local dir=$cache/kwok-$KWOK_VERSION
  if ! have "$dir" kwok kwokctl; then
    log "kwok $KWOK_VERSION: building kwok, kwokctl"
    shared_tool "$dir" "-s -w" sigs.k8s.io/kwok/cmd/kwok sigs.k8s.io/kwok/cmd/kwokctl
  fi
  echo "KWOK_BIN_DIR=$dir"
}

build_helm() {
  local dir=$cache/helm-$HELM_VERSION
  if ! have "$dir" helm; then
    # As Helm's Makefile does: the default Kubernetes version for offline template/lint follows the
    # client-go it is built with (v0.X.Y -> 1.X); unstamped it is v1.20 and kubeVersion checks fail.
    local gomod client_go ld="-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
    gomod=$(go mod download -json "helm.sh/helm/v3@$HELM_VERSION" | python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')
    client_go=$(awk '$1 == "k8s.io/client-go" {print $2}' "$gomod")
    client_go=${client_go#v0.}
    for pkg in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil; do
      ld+=" -X $pkg.k8sVersionMajor=1 -X $pkg.k8sVersionMinor=${client_go%%.*}"
    done
    log "helm $HELM_VERSION: building"
    shared_tool "$dir" "$ld" helm.sh/helm/v3/cmd/helm
  fi
  echo "HELM_BIN_DIR=$dir"
}

# The CoreDNS kubeadm deploys (its CoreDNSVersion for our Kubernetes), for kind's node image (testbed/kind_images.py).
build_coredns() {
  local dir=$cache/coredns-$COREDNS_VERSION
  have "$dir" coredns || go_install coredns "$dir" "$COREDNS_VERSION" "-s -w" github.com/coredns/coredns
  echo "COREDNS_BIN_DIR=$dir"
}

# kind's default StorageClass provisioner (rancher.io/local-path), for kind's node image (testbed/kind_images.py).
build_local_path_provisioner() {
  local dir=$cache/local-path-provisioner-$LOCAL_PATH_PROVISIONER_VERSION
  have "$dir" local-path-provisioner || go_install local-path-provisioner "$dir" "$LOCAL_PATH_PROVISIONER_VERSION" \
    "-s -w -X main.VERSION=$LOCAL_PATH_PROVISIONER_VERSION" github.com/rancher/local-path-provisioner
  echo "LOCAL_PATH_PROVISIONER_BIN_DIR=$dir"
}

# kube-router's NetworkPolicy firewall (iptables + ipset), the kind clusters' test-only enforcer (testbed/netpol.py).
# Stamped as its Makefile does; without the stamp --version prints an empty version.
build_kube_router() {
  local dir=$cache/kube-router-$KUBE_ROUTER_VERSION pkg=github.com/cloudnativelabs/kube-router/v2
  have "$dir" kube-router || go_install kube-router "$dir" "$KUBE_ROUTER_VERSION" \
    "-s -w -X $pkg/pkg/version.Version=$KUBE_ROUTER_VERSION -X $pkg/pkg/version.BuildDate=1970-01-01T00:00:00Z" \
    "$pkg/cmd/kube-router"
  echo "KUBE_ROUTER_BIN_DIR=$dir"
}

build_kind() {
  local dir=$cache/kind-$KIND_VERSION
  have "$dir" kind || go_install kind "$dir" "$KIND_VERSION" "-s -w" sigs.k8s.io/kind
  echo "KIND_BIN_DIR=$dir"
}

# The release's signer and SBOM generator (scripts/release.sh): cosign signs and verifies images and charts by digest;
# syft lists what an image holds (SPDX). Their version stamps are what `cosign version` and `syft version` print.
build_cosign() {
  local dir=$cache/cosign-$COSIGN_VERSION
  have "$dir" cosign || go_install cosign "$dir" "$COSIGN_VERSION" \
    "-s -w -X sigs.k8s.io/release-utils/version.gitVersion=$COSIGN_VERSION" github.com/sigstore/cosign/v3/cmd/cosign
  echo "COSIGN_BIN_DIR=$dir"
}

build_syft() {
  local dir=$cache/syft-$SYFT_VERSION
  have "$dir" syft || go_install syft "$dir" "$SYFT_VERSION" \
    "-s -w -X main.version=${SYFT_VERSION#v}" github.com/anchore/syft/cmd/syft
  echo "SYFT_BIN_DIR=$dir"
}

# Prometheus, for the test of the chart's dashboard and alert rules (testbed/prometheus.py): its scrape targets are
# static there, so it is built without its service discoveries (the build tag remove_all_sd drops the Kubernetes,
# cloud and other SD clients: a third of the code to compile). No web UI assets (the API is what the test uses).
# Its modules (2.5 GB unpacked) and build cache go to a directory of their own, removed once the binary is built:
# nothing else builds from them, and the disk is what the kind stage's quick start needs (testbed/spread.py).
build_prometheus() {
  local dir=$cache/prometheus-$PROMETHEUS_VERSION
  if ! have "$dir" prometheus; then
    local tmp=$dir.tmp scratch=$cache/src/prometheus-scratch
    rm -rf "$tmp"; mkdir -p "$tmp" "$scratch"
    log "prometheus $PROMETHEUS_VERSION: go install (tags remove_all_sd; about 3 minutes on two cores)"
    GOBIN=$tmp GOMODCACHE=$scratch/mod GOCACHE=$scratch/build go install -trimpath -tags remove_all_sd \
      -ldflags "-s -w" "github.com/prometheus/prometheus/cmd/prometheus@$PROMETHEUS_VERSION"
    GOMODCACHE=$scratch/mod go clean -modcache
    rm -rf "$scratch"
    publish "$tmp" "$dir"
  fi
  echo "PROMETHEUS_BIN_DIR=$dir"
}

tools=("$@")
((${#tools[@]})) || tools=(kubernetes etcd kwok helm kind)
for t in "${tools[@]}"; do
  case $t in
    kubernetes|etcd|kwok|helm|kind|kubelet|kubeadm|coredns|local-path-provisioner|kube-router|cosign|syft|prometheus)
      "build_${t//-/_}" ;;
    *) log "unknown tool '$t' (kubernetes etcd kwok helm kind kubelet kubeadm coredns local-path-provisioner" \
      "kube-router cosign syft prometheus)"; exit 2 ;;
  esac
done

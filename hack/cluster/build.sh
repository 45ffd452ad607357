#!/usr/bin/env bash
# Builds the local control plane's binaries from their Go modules, once, into the cache:
#   $CLEF_CACHE/k8s-<v>/bin/{kube-apiserver,kube-controller-manager,kube-scheduler,kubectl}
#   $CLEF_CACHE/etcd-<v>/bin/etcd
#   $CLEF_CACHE/kwok-<v>/bin/kwok
#   $CLEF_CACHE/node-<k8s>-<containerd>-<cni>/bin/...   (`build.sh node` only: the real node)
# A component whose directory holds a complete stamp is skipped, so this is cheap to call on every
# `make cluster-up`.  Uses the machine's Go (GOTOOLCHAIN=local) and the module proxy; no Docker.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=versions.env
source "$here/versions.env"
CLEF_CACHE=${CLEF_CACHE:-$HOME/.cache/clef}
export GOTOOLCHAIN=local GOFLAGS="-mod=mod -buildvcs=false" CGO_ENABLED=0

log() { printf 'cluster-build: %s\n' "$*" >&2; }

if ! command -v go >/dev/null 2>&1; then
  log "missing: go (install Go >= 1.26 from https://go.dev/dl/ and put it on PATH)"
  exit 3
fi

mkdir -p "$CLEF_CACHE"
# Two CI runs on one machine must not build into the same directory at once.
exec 9>"$CLEF_CACHE/.cluster-build.lock"
flock 9

go_version=$(go env GOVERSION)

done_already() { [[ -f "$1/.complete" ]]; }

# Runs a build into a scratch directory and moves it into place only when it succeeded, so an
# interrupted build never leaves a half-filled cache entry that later runs would trust.
finish() {
  local scratch=$1 dest=$2 what=$3 started=$4
  printf '%s built with %s in %ss\n' "$what" "$go_version" "$(( $(date +%s) - started ))" >"$scratch/.complete"
  rm -rf "$dest"
  mv "$scratch" "$dest"
  log "$what ready in $dest ($(( $(date +%s) - started ))s)"
}

new_module() {
  local dir=$1
  rm -rf "$dir"
  mkdir -p "$dir"
  printf 'module clef.local/clusterbuild\n\ngo 1.26.0\n' >"$dir/go.mod"
}

# A module that builds k8s.io/kubernetes at tag $1 into $2 (go.mod only).  Staging modules
# (k8s.io/api, client-go, ...) are published as v0.<minor>.<patch>; as a dependency
# k8s.io/kubernetes requires them at v0.0.0 and its own replace directives (to ./staging) do not
# apply, so the building module repoints every one of them to the tag.
k8s_module() {
  local v=$1 work=$2 staging upstream_mod
  new_module "$work"
  staging="v0.${v#v1.}"
  log "kubernetes $v: resolving staging modules at $staging"
  upstream_mod=$(cd "$work" && go mod download -json "k8s.io/kubernetes@$v" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
  if [[ ! -f "$upstream_mod" ]]; then
    log "kubernetes $v: could not fetch its go.mod from the module proxy ($(go env GOPROXY))"
    exit 1
  fi
  {
    echo
    echo "require k8s.io/kubernetes $v"
    echo
    echo "replace ("
    sed -n 's#^[[:space:]]*\(k8s\.io/[a-z0-9-]*\) v0\.0\.0$#\t\1 => \1 '"$staging"'#p' "$upstream_mod"
    echo ")"
  } >>"$work/go.mod"
}

# The version stamps `kubectl version` and the API server report (the same for every binary).
k8s_ldflags() {
  local v=$1 minor p ldflags="-s -w"
  minor=${v#v1.}; minor=${minor%%.*}
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags+=" -X $p.gitVersion=$v -X $p.gitMajor=1 -X $p.gitMinor=$minor -X $p.gitTreeState=clean"
    ldflags+=" -X $p.buildDate=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
  done
  printf '%s' "$ldflags"
}

build_kubernetes() {
  local v=$KUBERNETES_VERSION dest="$CLEF_CACHE/k8s-$KUBERNETES_VERSION"
  done_already "$dest" && return 0
  local started scratch work
  started=$(date +%s)
  scratch="$CLEF_CACHE/.k8s-$v.partial"
  work="$CLEF_CACHE/build/k8s-$v"
  rm -rf "$scratch"
  mkdir -p "$scratch/bin"
  k8s_module "$v" "$work"
  local pkgs=(
    k8s.io/kubernetes/cmd/kube-apiserver
    k8s.io/kubernetes/cmd/kube-controller-manager
    k8s.io/kubernetes/cmd/kube-scheduler
    k8s.io/kubernetes/cmd/kubectl
  )
  log "kubernetes $v: building ${pkgs[*]##*/} (first time: tens of minutes on 2 cores)"
  (cd "$work" && go build -trimpath -ldflags "$(k8s_ldflags "$v")" -o "$scratch/bin/" "${pkgs[@]}")
  finish "$scratch" "$dest" "kubernetes $v" "$started"
}

# The real node of `make test-real` (docs/local-cluster.md, "A real node"), only when asked:
#   $CLEF_CACHE/node-<k8s>-<containerd>-<cni>/bin/{kubelet,containerd,containerd-shim-runc-v2,ctr,
#                                                 bridge,host-local,loopback,portmap,pause}
# A cache entry of its own, so the control plane's k8s-<v> stamp is untouched.  The kubelet comes
# from the same module and version stamps as the control plane (so, after it, mostly from Go's
# build cache); containerd and the CNI plugins are plain `go install`s; `pause` (the sandbox
# image's only binary) is hack/cluster/pause.c, linked statically.
build_node() {
  local v=$KUBERNETES_VERSION c=$CONTAINERD_VERSION n=$CNI_PLUGINS_VERSION
  local dest="$CLEF_CACHE/node-$v-$c-$n"
  done_already "$dest" && return 0
  if ! command -v gcc >/dev/null 2>&1; then
    log "missing: gcc (apt-get install gcc) for the sandbox image's pause binary"
    exit 3
  fi
  local started scratch work
  started=$(date +%s)
  scratch="$CLEF_CACHE/.node-$v-$c-$n.partial"
  work="$CLEF_CACHE/build/node-$v"
  rm -rf "$scratch"
  mkdir -p "$scratch/bin"
  k8s_module "$v" "$work"
  log "node: kubelet $v"
  (cd "$work" && go build -trimpath -ldflags "$(k8s_ldflags "$v")" -o "$scratch/bin/" k8s.io/kubernetes/cmd/kubelet)
  log "node: containerd $c (containerd, containerd-shim-runc-v2, ctr)"
  (cd "$work" && GOBIN="$scratch/bin" go install -trimpath \
    -ldflags "-s -w -X github.com/containerd/containerd/v2/version.Version=$c" \
    "github.com/containerd/containerd/v2/cmd/containerd@$c" \
    "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2@$c" \
    "github.com/containerd/containerd/v2/cmd/ctr@$c")
  log "node: CNI plugins $n (bridge, host-local, loopback, portmap)"
  (cd "$work" && GOBIN="$scratch/bin" go install -trimpath -ldflags "-s -w" \
    "github.com/containernetworking/plugins/plugins/main/bridge@$n" \
    "github.com/containernetworking/plugins/plugins/ipam/host-local@$n" \
    "github.com/containernetworking/plugins/plugins/main/loopback@$n" \
    "github.com/containernetworking/plugins/plugins/meta/portmap@$n")
  log "node: pause"
  gcc -static -Os -Wall -Werror -o "$scratch/bin/pause" "$here/pause.c"
  strip "$scratch/bin/pause"
  finish "$scratch" "$dest" "node $v/$c/$n" "$started"
}

build_etcd() {
  local v=$ETCD_VERSION dest="$CLEF_CACHE/etcd-$ETCD_VERSION"
  done_already "$dest" && return 0
  local started scratch work
  started=$(date +%s)
  scratch="$CLEF_CACHE/.etcd-$v.partial"
  work="$CLEF_CACHE/build/etcd-$v"
  rm -rf "$scratch"
  mkdir -p "$scratch/bin"
  new_module "$work"
  printf '\nrequire go.etcd.io/etcd/server/v3 %s\n' "$v" >>"$work/go.mod"
  log "etcd $v: building"
  (cd "$work" && go build -trimpath -ldflags "-s -w" -o "$scratch/bin/etcd" go.etcd.io/etcd/server/v3)
  finish "$scratch" "$dest" "etcd $v" "$started"
}

build_kwok() {
  local v=$KWOK_VERSION dest="$CLEF_CACHE/kwok-$KWOK_VERSION"
  done_already "$dest" && return 0
  local started scratch work
  started=$(date +%s)
  scratch="$CLEF_CACHE/.kwok-$v.partial"
  work="$CLEF_CACHE/build/kwok-$v"
  rm -rf "$scratch"
  mkdir -p "$scratch/bin"
  new_module "$work"
  printf '\nrequire sigs.k8s.io/kwok %s\n' "$v" >>"$work/go.mod"
  log "kwok $v: building"
  (cd "$work" && go build -trimpath -ldflags "-s -w" \
    -o "$scratch/bin/kwok" sigs.k8s.io/kwok/cmd/kwok)
  finish "$scratch" "$dest" "kwok $v" "$started"
}

case "${1:-all}" in
  all) build_etcd; build_kwok; build_kubernetes ;;
  node) build_node ;;
  kubernetes) build_kubernetes ;;
  etcd) build_etcd ;;
  kwok) build_kwok ;;
  *) log "usage: $0 [all|kubernetes|etcd|kwok|node]"; exit 2 ;;
esac

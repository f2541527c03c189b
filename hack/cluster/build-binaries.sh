#!/usr/bin/env bash
# Builds (once per pinned version) the Kubernetes, CoreDNS, helm and kind (and on request kwok) binaries the
# local cluster needs, from Go modules only, into $MW_CACHE/bin/<name>-<version>.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=versions.env
source "$here/versions.env"
cache=${MW_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/multiworker}
bin=$cache/bin
mkdir -p "$bin"
export CGO_ENABLED=0 GOFLAGS=-mod=mod

k8s_cmds=(kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl)
missing=()
for c in "${k8s_cmds[@]}"; do
  [ -x "$bin/$c-$K8S_VERSION" ] || missing+=("k8s.io/kubernetes/cmd/$c")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "building Kubernetes $K8S_VERSION: ${missing[*]##*/} (cold build takes ~6-10 min on 2 cores)"
  v=${K8S_VERSION#v}
  pkg=k8s.io/component-base/version
  ldflags="-s -w -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=${v%%.*}"
  ldflags+=" -X $pkg.gitMinor=$(echo "$v" | cut -d. -f2) -X $pkg.gitTreeState=clean"
  ldflags+=" -X $pkg.buildDate=1970-01-01T00:00:00Z"
  ldflags+=" -X k8s.io/client-go/pkg/version.gitVersion=$K8S_VERSION"
  out=$(mktemp -d)
  (cd "$here/k8s-build" && go build -trimpath -ldflags "$ldflags" -o "$out/" "${missing[@]}")
  for p in "${missing[@]}"; do mv "$out/${p##*/}" "$bin/${p##*/}-$K8S_VERSION"; done
  rmdir "$out"
fi

go_install() { # name module@version version
  local name=$1 mod=$2 ver=$3 lock
  [ -x "$bin/$name-$ver" ] && return 0
  # One build of a binary at a time: CI builds some ahead in the background (.ci/run), and a
  # test fixture that needs one meanwhile waits for that build instead of starting its own.
  exec {lock}>"$bin/.$name.lock"
  flock "$lock"
  [ -x "$bin/$name-$ver" ] && { exec {lock}>&-; return 0; }
  echo "building $name $ver"
  local gb; gb=$(mktemp -d)
  GOBIN=$gb go install -trimpath -ldflags "-s -w" "$mod@$ver" 2>&1 | grep -v "^go: downloading" || true
  [ -n "$(ls "$gb")" ] || { echo "build of $name failed" >&2; exit 1; }
  mv "$gb/$(ls "$gb")" "$bin/$name-$ver"; rmdir "$gb"
  exec {lock}>&-
}
# CoreDNS with only the plugins the clusters' Corefiles use (coredns-build/main.go: a third less
# to compile cold than the full build); the key covers that package, so editing it rebuilds.
coredns_src=$here/coredns-build
pinned=$(cd "$coredns_src" && go list -m -f '{{.Version}}' github.com/coredns/coredns)
[ "$pinned" = "$COREDNS_VERSION" ] || {
  echo "coredns-build/go.mod pins coredns $pinned, versions.env says $COREDNS_VERSION:" \
    "make them agree" >&2; exit 1; }
coredns=coredns-$COREDNS_VERSION-$(cat "$coredns_src"/go.mod "$coredns_src"/go.sum "$coredns_src"/*.go \
  | sha256sum | cut -c1-8)
if [ ! -x "$bin/$coredns" ]; then
  echo "building coredns $COREDNS_VERSION (the plugins of coredns-build/main.go)"
  out=$(mktemp -d)
  (cd "$coredns_src" && go build -trimpath -ldflags "-s -w" -o "$out/coredns" .)
  mv "$out/coredns" "$bin/$coredns"; rmdir "$out"
fi
go_install helm helm.sh/helm/v3/cmd/helm "$HELM_VERSION"
go_install kind sigs.k8s.io/kind "$KIND_VERSION"
# kwok only for scale benchmarks with fake nodes: built on request (`build-binaries.sh kwok`).
[ "${1:-}" = kwok ] && go_install kwok sigs.k8s.io/kwok/cmd/kwok "$KWOK_VERSION"

# Stable names for scripts and users.
for c in "${k8s_cmds[@]}"; do ln -sf "$c-$K8S_VERSION" "$bin/$c"; done
ln -sf "$coredns" "$bin/coredns"; ln -sf "helm-$HELM_VERSION" "$bin/helm"
ln -sf "kind-$KIND_VERSION" "$bin/kind"
[ -x "$bin/kwok-$KWOK_VERSION" ] && ln -sf "kwok-$KWOK_VERSION" "$bin/kwok"
echo "binaries ready in $bin"

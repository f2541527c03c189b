#!/usr/bin/env bash
# Builds (once per pinned version) the Kubernetes, CoreDNS, helm and kind (and on request kwok)
# binaries the local cluster needs, from Go modules only (one module: k8s-build/go.mod), into
# $MW_CACHE/bin/<name>-<version>.
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

# The tools, from the same module (k8s-build/go.mod): they share most of their code with the
# Kubernetes binaries, which the build cache then holds. go.mod must pin what versions.env says.
mod_version() { (cd "$here/k8s-build" && go list -m -f '{{.Version}}' "$1"); }
tools=()
tool() { # name version module package
  local name=$1 ver=$2 mod=$3 pkg=$4 pinned
  [ -x "$bin/$name-$ver" ] && return 0
  pinned=$(mod_version "$mod")
  [ "$pinned" = "${ver%%-*}" ] || {
    echo "k8s-build/go.mod pins $mod $pinned, versions.env says ${ver%%-*}: make them agree" \
      "(cd hack/cluster/k8s-build && go get -tool $pkg@${ver%%-*})" >&2; exit 1; }
  tools+=("$name $ver $pkg")
}
# CoreDNS with only the plugins the clusters' Corefiles use (k8s-build/coredns/main.go: a third
# less to compile cold than the full build); the key covers that file, so editing it rebuilds.
coredns=$COREDNS_VERSION-$(sha256sum <"$here/k8s-build/coredns/main.go" | cut -c1-8)
tool coredns "$coredns" github.com/coredns/coredns ./coredns
tool helm "$HELM_VERSION" helm.sh/helm/v3 helm.sh/helm/v3/cmd/helm
tool kind "$KIND_VERSION" sigs.k8s.io/kind sigs.k8s.io/kind
# kwok only for fake nodes (the tests of tests/conftest.py's fake_nodes, scale benchmarks):
# built on request (`build-binaries.sh kwok`).
[ "${1:-}" = kwok ] && tool kwok "$KWOK_VERSION" sigs.k8s.io/kwok sigs.k8s.io/kwok/cmd/kwok
if [ ${#tools[@]} -gt 0 ]; then
  # One build of the tools at a time: CI builds kwok ahead in the background (.ci/run), and a
  # test fixture that needs it meanwhile waits for that build instead of starting its own.
  exec {lock}>"$bin/.tools.lock"
  flock "$lock"
  for t in "${tools[@]}"; do
    read -r name ver pkg <<<"$t"
    [ -x "$bin/$name-$ver" ] && continue
    echo "building $name ${ver%%-*}"
    out=$(mktemp -d)
    (cd "$here/k8s-build" && go build -trimpath -ldflags "-s -w" -o "$out/$name" "$pkg")
    mv "$out/$name" "$bin/$name-$ver"; rmdir "$out"
  done
  exec {lock}>&-
fi

# Stable names for scripts and users.
for c in "${k8s_cmds[@]}"; do ln -sf "$c-$K8S_VERSION" "$bin/$c"; done
ln -sf "coredns-$coredns" "$bin/coredns"; ln -sf "helm-$HELM_VERSION" "$bin/helm"
ln -sf "kind-$KIND_VERSION" "$bin/kind"
[ -x "$bin/kwok-$KWOK_VERSION" ] && ln -sf "kwok-$KWOK_VERSION" "$bin/kwok"
echo "binaries ready in $bin"

#!/usr/bin/env bash
# Builds (once per version and Go) the Kueue manager from the sigs.k8s.io/kueue Go module, a
# static binary for the offline `kueue` image (hack/images/build.sh kueue), and prints nothing
# but progress. Results in $MW_CACHE/bin: kueue (a symlink) and kueue-config-<version>/, the
# module's config/ (kustomize: CRDs, RBAC, manager, internal cert, visibility, webhooks) that
# hack/cluster/kueue.sh renders the manifests from.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=versions.env
source "$here/versions.env"
cache=${MW_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/multiworker}
bin=$cache/bin
mkdir -p "$bin"
export CGO_ENABLED=0 GOFLAGS=-mod=mod

# The Go that builds it is part of the key: a new toolchain rebuilds (and so gets its fixes).
key=$KUEUE_VERSION-$(go env GOVERSION)
config=$bin/kueue-config-$KUEUE_VERSION

built() { [ -x "$bin/kueue-$key" ] && [ -f "$config/default/kustomization.yaml" ]; }
# One build at a time (CI builds ahead in the background; kueue.sh then waits for it here).
if ! built; then exec 8>"$bin/.kueue.lock"; flock 8; fi
if ! built; then
  if [ ! -x "$bin/kueue-$key" ]; then
    echo "building the Kueue manager (sigs.k8s.io/kueue $KUEUE_VERSION; a few minutes on 2 cores)"
    t0=$SECONDS
    out=$(mktemp -d)
    ldflags="-s -w -X sigs.k8s.io/kueue/pkg/version.GitVersion=$KUEUE_VERSION"
    GOBIN=$out go install -trimpath -ldflags "$ldflags" "sigs.k8s.io/kueue/cmd/kueue@$KUEUE_VERSION"
    mv "$out/kueue" "$bin/kueue-$key"
    rmdir "$out"
    echo "built in $((SECONDS - t0))s"
  fi
  # The manifests' sources exactly as the module ships them (made writable: the module cache is
  # read-only, and kueue.sh copies this tree to overlay it).
  dir=$(go mod download -json "sigs.k8s.io/kueue@$KUEUE_VERSION" | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')
  rm -rf "$config.tmp"
  cp -r "$dir/config" "$config.tmp"
  chmod -R u+w "$config.tmp"
  rm -rf "$config"
  mv "$config.tmp" "$config"
fi
ln -sf "kueue-$key" "$bin/kueue"

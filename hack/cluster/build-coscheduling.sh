#!/usr/bin/env bash
# Builds (once per version and build-source hash) the coscheduling scheduler and the PodGroup
# controller from the sigs.k8s.io/scheduler-plugins Go module (coscheduling-build/), and copies
# the module's PodGroup CRD next to them. Prints nothing but progress; results in $MW_CACHE/bin:
#   coscheduler, podgroup-controller (symlinks) and scheduling.x-k8s.io_podgroups.yaml.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=versions.env
source "$here/versions.env"
cache=${MW_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/multiworker}
bin=$cache/bin
src=$here/coscheduling-build
mkdir -p "$bin"
export CGO_ENABLED=0 GOFLAGS=-mod=mod

pinned=$(cd "$src" && go list -m -f '{{.Version}}' sigs.k8s.io/scheduler-plugins)
[ "$pinned" = "$SCHEDULER_PLUGINS_VERSION" ] || {
  echo "coscheduling-build/go.mod pins scheduler-plugins $pinned, versions.env says" \
    "$SCHEDULER_PLUGINS_VERSION: make them agree" >&2; exit 1; }
# The key covers our own main packages too, so editing them rebuilds.
key=$SCHEDULER_PLUGINS_VERSION-$(cd "$src" && cat go.mod go.sum ./*/main.go | sha256sum | cut -c1-8)

built() { [ -x "$bin/coscheduler-$key" ] && [ -x "$bin/podgroup-controller-$key" ]; }
# One build at a time (CI builds ahead in the background; gang.sh then waits for it here).
if ! built; then exec 8>"$bin/.coscheduling.lock"; flock 8; fi
if ! built; then
  echo "building coscheduler and podgroup-controller (scheduler-plugins $SCHEDULER_PLUGINS_VERSION;" \
    "cold build takes several minutes on 2 cores)"
  t0=$SECONDS
  out=$(mktemp -d)
  v=1.34.7   # the kube-scheduler these are built from (coscheduling-build/go.mod)
  pkg=k8s.io/component-base/version
  ldflags="-s -w -X $pkg.gitVersion=v$v -X $pkg.gitMajor=1 -X $pkg.gitMinor=34"
  (cd "$src" && go build -trimpath -ldflags "$ldflags" -o "$out/" ./coscheduler ./podgroup-controller)
  mv "$out/coscheduler" "$bin/coscheduler-$key"
  mv "$out/podgroup-controller" "$bin/podgroup-controller-$key"
  rmdir "$out"
  echo "built in $((SECONDS - t0))s"
fi
ln -sf "coscheduler-$key" "$bin/coscheduler"
ln -sf "podgroup-controller-$key" "$bin/podgroup-controller"

# The PodGroup CRD exactly as the module ships it (scheduling.x-k8s.io/v1alpha1).
crd=$bin/scheduling.x-k8s.io_podgroups-$SCHEDULER_PLUGINS_VERSION.yaml
if [ ! -s "$crd" ]; then
  dir=$(cd "$src" && go list -m -f '{{.Dir}}' sigs.k8s.io/scheduler-plugins)
  install -m 644 "$dir/manifests/coscheduling/crd.yaml" "$crd.tmp" && mv "$crd.tmp" "$crd"
fi
ln -sf "$(basename "$crd")" "$bin/scheduling.x-k8s.io_podgroups.yaml"

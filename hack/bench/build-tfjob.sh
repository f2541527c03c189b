#!/usr/bin/env bash
# Builds Kubeflow training-operator (its TFJob controller) from its Go module for the side-by-side
# benchmark (tests/bench/bench_side_by_side.py). None of its code is kept in this repo: the
# module comes from the Go module proxy, like the Kubernetes binaries (hack/cluster/).
# Cached by version (built once):
#   $MW_CACHE/bin/training-operator-<version>                 the binary (cmd/training-operator.v1)
#   $MW_CACHE/training-operator-<version>/kubeflow.org_tfjobs.yaml   its TFJob CRD, same module
# A cold build takes a few minutes on 2 cores: run it under `flock /tmp/mw-build.lock`.
#   build-tfjob.sh [VERSION]      (default v1.8.1); prints the binary's path
set -euo pipefail
version=${1:-${TRAINING_OPERATOR_VERSION:-v1.8.1}}
module=github.com/kubeflow/training-operator
cache=${MW_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/multiworker}
binary=$cache/bin/training-operator-$version
crd=$cache/training-operator-$version/kubeflow.org_tfjobs.yaml
export CGO_ENABLED=0 GOFLAGS=-mod=mod

if [ ! -x "$binary" ]; then
  echo "building training-operator $version" >&2
  gobin=$(mktemp -d); trap 'rm -rf "$gobin"' EXIT
  # The module has no replace directives, so `go install module/cmd@version` builds it as
  # released, with the dependency versions its own go.mod pins.
  GOBIN=$gobin go install -trimpath -ldflags "-s -w" "$module/cmd/training-operator.v1@$version" \
    2>&1 | grep -v '^go: downloading' >&2 || true
  [ -x "$gobin/training-operator.v1" ] || { echo "build of training-operator failed" >&2; exit 1; }
  mkdir -p "$(dirname "$binary")"
  mv "$gobin/training-operator.v1" "$binary"
fi

if [ ! -f "$crd" ]; then
  dir=$(go mod download -json "$module@$version" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
  [ -n "$dir" ] || { echo "go mod download $module@$version gave no directory" >&2; exit 1; }
  mkdir -p "$(dirname "$crd")"
  cp "$dir/manifests/base/crds/kubeflow.org_tfjobs.yaml" "$crd"
fi
echo "$binary"

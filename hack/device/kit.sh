#!/usr/bin/env bash
# Packs what the scale benchmarks need on a machine with no Go, no registry and no network (a
# lent device machine) into .kit/ (ignored; hack/device/run.sh unpacks it there):
#   k8s.xz   kube-apiserver, kube-controller-manager, kube-scheduler and kubectl as one binary
#            (hack/cluster/k8s-build/multicall: four separate ones do not fit a 64 MiB transfer)
#   etcd.xz, kwok.xz, and with --tfjob training-operator.xz plus its TFJob CRD
#   wheels/  the operator's runtime dependencies (versions as in .venv) for CPython 3.12, and py-spy
# Built once per version (cached in $MW_CACHE/kit); the operator's own code travels as source.
#   kit.sh [--tfjob]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
source "$repo/hack/cluster/versions.env"
cache=${MW_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/multiworker}
kit=$repo/.kit
store=$cache/kit
python=${PYTHON_VERSION:-3.12}
mkdir -p "$kit/wheels" "$store"
log() { printf '[kit] %s\n' "$*" >&2; }

# pack NAME BINARY: $kit/NAME.xz from BINARY, compressed once per binary (keyed by its hash).
pack() {
  local name=$1 binary=$2 key
  key=$(sha256sum < "$binary" | cut -c1-16)
  if [ ! -f "$store/$name-$key.xz" ]; then
    log "compressing $name ($(du -h "$binary" | cut -f1))"
    xz -T0 -9 -c "$binary" > "$store/$name-$key.xz.part" && mv "$store/$name-$key.xz.part" "$store/$name-$key.xz"
  fi
  cp "$store/$name-$key.xz" "$kit/$name.xz"
}

multicall=$store/k8s-$K8S_VERSION
if [ ! -x "$multicall" ]; then
  log "building the control plane as one binary (Kubernetes $K8S_VERSION)"
  v=${K8S_VERSION#v} pkg=k8s.io/component-base/version
  ldflags="-s -w -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=${v%%.*}"
  ldflags+=" -X $pkg.gitMinor=$(echo "$v" | cut -d. -f2) -X $pkg.gitTreeState=clean"
  ldflags+=" -X k8s.io/client-go/pkg/version.gitVersion=$K8S_VERSION"
  (cd "$repo/hack/cluster/k8s-build" && CGO_ENABLED=0 GOFLAGS=-mod=mod \
    go build -trimpath -ldflags "$ldflags" -o "$multicall" ./multicall)
fi
pack k8s "$multicall"
"$repo/hack/cluster/build-binaries.sh" kwok >/dev/null
pack kwok "$cache/bin/kwok-$KWOK_VERSION"
pack etcd "$(readlink -f "$(command -v etcd)")"
if [ "${1:-}" = --tfjob ]; then
  pack training-operator "$("$repo/hack/bench/build-tfjob.sh")"
  cp "$cache/training-operator-${TRAINING_OPERATOR_VERSION:-v1.8.1}/kubeflow.org_tfjobs.yaml" "$kit/"
else
  rm -f "$kit/training-operator.xz" "$kit/kubeflow.org_tfjobs.yaml"
fi

# The runtime closure of the installed multiworker distribution, pinned to .venv's versions.
reqs=$("$repo/.venv/bin/python" - "$python" <<'PY'
import importlib.metadata as md, re, sys
from packaging.requirements import Requirement
env = {"extra": "", "python_version": sys.argv[1], "sys_platform": "linux", "os_name": "posix",
       "platform_system": "Linux", "platform_machine": "x86_64", "implementation_name": "cpython",
       "platform_python_implementation": "CPython", "python_full_version": sys.argv[1] + ".0"}
seen, todo = {}, ["multiworker"]
while todo:
    dist = md.distribution(todo.pop())
    key = re.sub(r"[-_.]+", "-", dist.metadata["Name"]).lower()
    if key in seen:
        continue
    seen[key] = dist.version
    todo += [r.name for r in map(Requirement, dist.requires or [])
             if not r.marker or r.marker.evaluate(env)]
seen.pop("multiworker")
print("\n".join(f"{k}=={v}" for k, v in sorted(seen.items())))
PY
)
rm -f "$kit"/wheels/*.whl
platforms=()
for n in 17 24 27 28 31 34; do platforms+=(--platform "manylinux_2_${n}_x86_64"); done
# shellcheck disable=SC2086  # one requirement per word
"$repo/.venv/bin/python" -m pip download -q --no-deps --only-binary=:all: --python-version "$python" \
  --implementation cp "${platforms[@]}" --platform manylinux2014_x86_64 --platform linux_x86_64 \
  --platform any -d "$kit/wheels" $reqs py-spy
log "kit ready: $(du -sh "$kit" | cut -f1) in $kit"

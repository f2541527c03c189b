#!/usr/bin/env bash
# Packs what the scale benchmarks need on a machine with no Go, no registry and no network (a
# lent device machine) into .kit/ (ignored; hack/device/run.sh unpacks it there):
#   bin.tar.xz  k8s: kube-apiserver, kube-controller-manager, kube-scheduler and kubectl as one
#               binary (hack/cluster/k8s-build/multicall: four separate ones do not fit a 64 MiB
#               transfer), etcd, kwok, and with --tfjob training-operator (plus its TFJob CRD)
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
"$repo/hack/cluster/build-binaries.sh" kwok >/dev/null
stage=$(mktemp -d); trap 'rm -rf "$stage"' EXIT
ln -s "$multicall" "$stage/k8s"
ln -s "$cache/bin/kwok-$KWOK_VERSION" "$stage/kwok"
ln -s "$(readlink -f "$(command -v etcd)")" "$stage/etcd"
rm -f "$kit/kubeflow.org_tfjobs.yaml" "$kit"/*.xz
if [ "${1:-}" = --tfjob ]; then
  ln -s "$("$repo/hack/bench/build-tfjob.sh")" "$stage/training-operator"
  cp "$cache/training-operator-${TRAINING_OPERATOR_VERSION:-v1.8.1}/kubeflow.org_tfjobs.yaml" "$kit/"
fi
# One solid archive with a dictionary larger than the binaries: they share much of their Go code
# (Kubernetes' libraries above all), which separate archives would each carry again (35 MB
# against 43 MB for the control plane, kwok and etcd). Built once per set of binaries.
names=$(cd "$stage" && ls)
# shellcheck disable=SC2086  # one name per word
key=$(cd "$stage" && cat $names | sha256sum | cut -c1-16)
archive=$store/bin-$key.tar.xz
if [ ! -f "$archive" ]; then
  log "compressing" $names "(a few minutes)"
  # shellcheck disable=SC2086
  tar -C "$stage" -chf - $names | xz -T1 --x86 --lzma2=preset=9e,dict=512MiB > "$archive.part"
  mv "$archive.part" "$archive"
fi
cp "$archive" "$kit/bin.tar.xz"

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

#!/usr/bin/env bash
# On a lent device machine (no Go, no registry, no network): unpacks .kit/ (hack/device/kit.sh),
# puts the operator (this checkout's source) and its carried wheels on a Python, brings up the
# control plane alone (hack/cluster/up.sh --no-node; kwok's fake nodes come from the benchmarks)
# and runs COMMAND from the repo root; the cluster is stopped on the way out.
#   hack/device/run.sh COMMAND...     e.g. hack/device/run.sh .venv/bin/python tests/bench/bench_scale.py
# .venv/bin/python there is the machine's python3 with the kit's wheels and operator/src first on
# its path, and .venv/bin/multiworker-operator runs the operator's CLI with it.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
kit=$repo/.kit
export MW_CACHE=${MW_CACHE:-/tmp/mw-cache}
bin=$MW_CACHE/bin site=$MW_CACHE/site
log() { printf '[device] %s\n' "$*" >&2; }
cd "$repo"
[ -f "$kit/bin.tar.xz" ] || { log "no .kit/ here: run hack/device/kit.sh and carry .kit"; exit 2; }

mkdir -p "$bin"
tar -xJf "$kit/bin.tar.xz" -C "$bin"
for c in kube-apiserver kube-controller-manager kube-scheduler kubectl; do ln -sf k8s "$bin/$c"; done
if [ -x "$bin/training-operator" ]; then  # where bench/contenders.py looks for them
  ln -sf training-operator "$bin/training-operator-${TRAINING_OPERATOR_VERSION:-v1.8.1}"
  mkdir -p "$MW_CACHE/training-operator-${TRAINING_OPERATOR_VERSION:-v1.8.1}"
  cp "$kit/kubeflow.org_tfjobs.yaml" "$MW_CACHE/training-operator-${TRAINING_OPERATOR_VERSION:-v1.8.1}/"
fi
# The scripts need curl only for `curl -fsS URL` (etcd's health): python3 stands in if absent.
if ! command -v curl >/dev/null; then
  printf '#!/bin/sh\nfor u; do :; done\nexec python3 -c "import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())" "$u"\n' > "$bin/curl"
  chmod +x "$bin/curl"
fi
export PATH="$bin:$PATH" MW_NO_NODE=1   # up.sh, also when a benchmark calls it

python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target "$site" "$kit"/wheels/*.whl
# A venv without pip (no ensurepip needed) gives the interpreter the path the benchmarks take
# the operator's from (harness.OPERATOR); the packages come from $site through PYTHONPATH.
if [ -d .venv ] && [ ! -f .venv/.device ]; then
  log ".venv exists and is not this script's: run it in a checkout of its own"; exit 2
fi
[ -x .venv/bin/python ] || python3 -m venv --without-pip .venv
touch .venv/.device
cat > .venv/bin/multiworker-operator <<'SH'
#!/bin/sh
exec "$(dirname "$0")/python" -c 'import sys; from multiworker.cli import main; sys.exit(main())' "$@"
SH
chmod +x .venv/bin/multiworker-operator
[ -x "$site/bin/py-spy" ] && ln -sf "$site/bin/py-spy" "$bin/py-spy"
export PYTHONPATH="$site:$repo/operator/src:$repo${PYTHONPATH:+:$PYTHONPATH}"
log "$(nproc) cores, $(python3 --version), $(.venv/bin/python -c 'import kopf, kubernetes; print("kopf", kopf.__version__ if hasattr(kopf, "__version__") else "", "kubernetes", kubernetes.__version__)')"

trap 'hack/cluster/down.sh --quiet' EXIT
hack/cluster/up.sh --no-node
"$@"

#!/bin/sh
# Creates the virtualenv /opt/venv of one image inside its (throwaway) build stage:
#   install-venv.sh FLAVOR SRC      FLAVOR: operator | worker | worker-gpu; SRC holds
#                                   operator/ (pyproject + src) and images/common/
# Then installs the multiworker package itself without dependencies, and removes pip.
#
# Build arguments (environment) chosen by hack/images/build.sh for offline builds:
#   WHEELS  a directory of wheels: install from it only, never from an index
#   LOCK    a requirements file with exact versions and hashes (pip --require-hashes)
# With neither (e.g. `docker build` on a laptop), the requirements are read from pyproject.toml
# and resolved against the configured package index.
set -eu
flavor=$1
src=$2
venv=/opt/venv

python3 -m venv "$venv"
pip() { "$venv/bin/python" -m pip --no-cache-dir --disable-pip-version-check --no-input "$@"; }
if [ -n "${WHEELS:-}" ]; then
  set -- --no-index --find-links "$WHEELS"
else
  set --
fi

wanted=/tmp/requirements.txt
if [ -n "${LOCK:-}" ]; then
  cp "$LOCK" "$wanted"
  pip install "$@" --require-hashes --no-deps -r "$wanted"
else
  python3 "$src/images/common/requirements.py" "$flavor" "$src/operator/pyproject.toml" > "$wanted"
  pip install "$@" -r "$wanted"
fi
# The package's own dependencies are the operator's: the worker needs only multiworker.runtime.
pip install "$@" --no-deps "$src/operator"
[ "$flavor" != operator ] || pip check

# pip (and setuptools, unless something needs it) only served the build.
grep -qi '^setuptools\b' "$wanted" || pip uninstall -q -y setuptools 2>/dev/null || true
pip uninstall -q -y pip
# Headers are for compiling TensorFlow custom ops, not for running it.
rm -rf "$venv"/lib/python3*/site-packages/tensorflow/include
rm -f "$wanted"

#!/bin/sh
# Installs Python code into the virtualenv /opt/venv of an image, in two steps so that the big,
# rarely changing part is a layer of its own (rebuilt only when the requirements change):
#   install-venv.sh deps LOCK              create /opt/venv with exactly the packages of LOCK,
#                                          the image's committed lock (exact versions, sha256s)
#   install-venv.sh package FLAVOR DIR     add the multiworker package from DIR (the operator/
#                                          directory) without its dependencies: the worker needs
#                                          only multiworker.runtime. FLAVOR: operator | worker*
#
# Build argument (environment), set by hack/images/build.sh for offline builds:
#   WHEELS       a directory of wheels: install from it only, never from an index
# Without it (e.g. `docker build` on a laptop), the same files come from the index; either way
# pip checks every file against the lock's hashes and resolves nothing (--no-deps).
set -eu
venv=/opt/venv
# pip runs from the wheel python3 bundles for ensurepip, so neither pip nor an old setuptools
# lands in /opt/venv; without such a wheel, the venv gets its own pip.
# shellcheck disable=SC2012  # plain file names; the last sorts as the newest
pip_wheel=$(ls /usr/share/python-wheels/pip-*.whl \
  /usr/local/lib/python3*/ensurepip/_bundled/pip-*.whl 2>/dev/null | tail -1 || true)
pip() {
  set -- --no-cache-dir --disable-pip-version-check --no-input "$@"
  if [ -n "$pip_wheel" ]; then
    "$venv/bin/python" "$pip_wheel/pip" "$@"
  else
    "$venv/bin/python" -m pip "$@"
  fi
}
index_options() {
  if [ -n "${WHEELS:-}" ]; then echo "--no-index --find-links $WHEELS"; fi
}

deps() {
  lock=$1
  if [ -n "$pip_wheel" ]; then python3 -m venv --without-pip "$venv"; else python3 -m venv "$venv"; fi
  # shellcheck disable=SC2046  # index_options is words on purpose
  pip install $(index_options) --only-binary=:all: --require-hashes --no-deps -r "$lock"
  # Headers are for compiling TensorFlow custom ops, not for running it.
  rm -rf "$venv"/lib/python3*/site-packages/tensorflow/include
}

package() {
  flavor=$1 dir=$2
  # shellcheck disable=SC2046
  pip install $(index_options) --no-deps "$dir"
  # The operator needs all its dependencies; the worker lacks them on purpose.
  if [ "$flavor" = operator ]; then pip check; fi
}

step=${1:?usage: install-venv.sh deps LOCK | package FLAVOR DIR}
shift
case $step in
  deps) deps "$@" ;;
  package) package "$@" ;;
  *) echo "install-venv.sh: unknown step $step" >&2; exit 2 ;;
esac

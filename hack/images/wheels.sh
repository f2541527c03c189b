#!/usr/bin/env bash
# Downloads the wheels of one image's committed lock (images/FLAVOR/requirements.txt, written
# by locks.sh) into $MW_CACHE/wheels, shared by every build, checking each file's sha256
# against the lock; also the build backend of the multiworker package itself (pip's isolated
# build env needs it). A warm cache needs no network at all.
#   wheels.sh FLAVOR          FLAVOR: operator | worker | worker-gpu
set -euo pipefail
source "$(dirname "$0")/lib.sh"

flavor=${1:?usage: wheels.sh operator|worker|worker-gpu}
lock=$repo/images/$flavor/requirements.txt
[ -s "$lock" ] || die "$flavor: no lock at ${lock#"$repo"/} (make locks writes it)"
python_version=3.11            # the images' python3 (Debian bookworm, python:3.11-slim-bookworm)
mkdir -p "$wheels"

# Host pip settings (a find-links dir, say) stay out: the cache and PyPI are the only sources.
pip() { env -u PIP_FIND_LINKS -u PIP_INDEX_URL -u PIP_EXTRA_INDEX_URL python3 -m pip "$@"; }
# Only wheels, for the images' Python and this machine's platform.
binary=(--only-binary=:all: --python-version "$python_version" --disable-pip-version-check)

# fetch WHAT ARGS...: pip download into the cache, offline when everything is already there.
fetch() {
  local what=$1; shift
  pip download --quiet --dest "$wheels" "${binary[@]}" \
    --no-index --find-links "$wheels" "$@" >/dev/null 2>&1 && return 0
  log "$flavor: downloading $what into $wheels"
  pip download --quiet --dest "$wheels" "${binary[@]}" "$@" \
    || die "$flavor: could not download $what (is PyPI reachable?)"
}
fetch "the wheels of ${lock#"$repo"/}" --no-deps --require-hashes -r "$lock"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 "$repo/images/common/requirements.py" build > "$tmp/build.txt"
fetch "the build backend" -r "$tmp/build.txt"

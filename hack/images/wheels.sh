#!/usr/bin/env bash
# Resolves one image's Python requirements (from operator/pyproject.toml via
# images/common/requirements.py) to exact versions with hashes, downloads those wheels into
# $MW_CACHE/wheels (shared, reused across builds) and prints the lock file's path.
#   wheels.sh FLAVOR          FLAVOR: operator | worker | worker-gpu
# The lock ($MW_CACHE/wheels/locks/FLAVOR-<hash of the requirements>.txt) is kept until the
# requirements change; MW_REFRESH_LOCKS=1 resolves again against the index (newer releases).
# A warm cache needs no network at all.
set -euo pipefail
source "$(dirname "$0")/lib.sh"

flavor=${1:?usage: wheels.sh operator|worker|worker-gpu}
python_version=3.11            # the images' python3 (Debian bookworm, python:3.11-slim-bookworm)
requirements=$(python3 "$repo/images/common/requirements.py" "$flavor")
build_requirements=$(python3 "$repo/images/common/requirements.py" build)
key=$(hash_text "$requirements" "$python_version" "$(uname -m)")
lock=$wheels/locks/$flavor-${key:0:16}.txt
files=${lock%.txt}.files       # the wheel file names of the lock
fetched=${lock%.txt}.fetched   # written once every wheel is in the cache
mkdir -p "$wheels/locks"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# The host's pip resolves and downloads; --report needs pip >= 22.2.
pip() { python3 -m pip "$@"; }
python3 -c 'import sys; from pip import __version__ as v; sys.exit(tuple(map(int, v.split(".")[:2])) < (22, 2))' \
  2>/dev/null || die "wheels.sh needs python3 with pip >= 22.2 (python3 -m pip install -U pip)"

# Only wheels, for the images' Python and this machine's platform.
binary=(--only-binary=:all: --python-version "$python_version" --disable-pip-version-check)

resolve() {
  log "$flavor: resolving $(echo "$requirements" | xargs)"
  echo "$requirements" > "$tmp/requirements.txt"
  pip install --quiet --dry-run --target "$tmp/target" "${binary[@]}" \
    --report "$tmp/report.json" -r "$tmp/requirements.txt" \
    || die "$flavor: could not resolve the requirements (is PyPI reachable?)"
  python3 "$here/lock_from_report.py" "$tmp/report.json" "$tmp/lock" "$tmp/files"
  mv "$tmp/files" "$files"
  mv "$tmp/lock" "$lock"
  rm -f "$fetched"
}
if [ ! -s "$lock" ] || [ ! -s "$files" ] || [ "${MW_REFRESH_LOCKS:-0}" = 1 ]; then resolve; fi

# Fast path: every wheel of the lock (and the build backend) was fetched and is still there.
fetched_key=$(hash_text "$build_requirements" "$(cat "$lock")")
all_present() {
  [ "$(cat "$fetched" 2>/dev/null)" = "$fetched_key" ] || return 1
  local f
  while read -r f; do [ -s "$wheels/$f" ] || return 1; done < "$files"
}
if all_present; then echo "$lock"; exit 0; fi

# fetch ARGS...: pip download into the cache, offline when everything is already there.
fetch() {
  pip download --quiet --dest "$wheels" "${binary[@]}" --no-index --find-links "$wheels" "$@" \
    >/dev/null 2>&1 && return 0
  log "$flavor: downloading wheels into $wheels"
  pip download --quiet --dest "$wheels" "${binary[@]}" "$@" \
    || die "$flavor: could not download the wheels (is PyPI reachable?)"
}
fetch --no-deps --require-hashes -r "$lock"
# The build backend of the multiworker package itself (pip's isolated build env uses it).
echo "$build_requirements" > "$tmp/build.txt"
fetch -r "$tmp/build.txt"
echo "$fetched_key" > "$fetched"
echo "$lock"

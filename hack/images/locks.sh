#!/usr/bin/env bash
# Resolves each image's Python requirements (operator/pyproject.toml, read by
# images/common/requirements.py) to exact versions with the sha256 of every file of those
# versions, with pip-compile (pip-tools), into the committed lock images/<image>/requirements.txt.
# Image builds install exactly these (pip --require-hashes --no-deps); nothing else resolves.
#   locks.sh [--upgrade] [operator|worker|worker-gpu]...     (default: all three)
# Without --upgrade, versions already locked stay unless pyproject.toml no longer allows them
# (pip-compile's rule); --upgrade takes the newest releases the requirements allow.
# Run on purpose, by `make locks` / `make locks UPGRADE=1`; needs PyPI, and pip-compile
# ($PIP_COMPILE, default .venv/bin/pip-compile) running on the images' Python (3.11).
set -euo pipefail
source "$(dirname "$0")/lib.sh"

compile=${PIP_COMPILE:-$repo/.venv/bin/pip-compile}
upgrade=()
flavors=()
for arg in "$@"; do
  case $arg in
    --upgrade) upgrade=(--upgrade) ;;
    operator | worker | worker-gpu) flavors+=("$arg") ;;
    *) die "unknown argument '$arg' (--upgrade, operator, worker, worker-gpu)" ;;
  esac
done
[ ${#flavors[@]} -gt 0 ] || flavors=(operator worker worker-gpu)
[ -x "$compile" ] || die "no pip-compile at $compile (make locks installs pip-tools into .venv)"
# The lock holds the dependencies of the Python that resolved it: it must be the images'.
python=$(head -1 "$compile" | sed 's/^#!//')
"$python" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' \
  || die "pip-compile must run on Python 3.11, the images' python3 (it runs on $("$python" -V))"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for flavor in "${flavors[@]}"; do
  lock=$repo/images/$flavor/requirements.txt
  # The input is named after the flavor: it shows up in the lock's "via" comments.
  python3 "$repo/images/common/requirements.py" "$flavor" > "$tmp/$flavor.in"
  [ ! -f "$lock" ] || cp "$lock" "$tmp/$flavor.txt"
  log "$flavor: resolving $(xargs < "$tmp/$flavor.in") -> ${lock#"$repo"/}"
  # tf-keras requires `tensorflow`; in the CPU image tensorflow-cpu is that package under
  # another name (images/common/requirements.py). Naming it the one unsafe package leaves it
  # out of the lock (setuptools and pip are pinned like any other then).
  unsafe=(--allow-unsafe)
  [ "$flavor" != worker ] || unsafe=(--unsafe-package tensorflow)
  # Host pip settings (a find-links dir, say) must not leak into the lock.
  (cd "$tmp" && env -u PIP_FIND_LINKS -u PIP_INDEX_URL -u PIP_EXTRA_INDEX_URL \
    CUSTOM_COMPILE_COMMAND="make locks" "$compile" --quiet "${upgrade[@]}" \
    --generate-hashes "${unsafe[@]}" --strip-extras --no-emit-options \
    --pip-args "--only-binary=:all:" --output-file "$flavor.txt" "$flavor.in")
  cp "$tmp/$flavor.txt" "$lock"
  log "$flavor: $(grep -c '==' "$lock") packages locked"
done

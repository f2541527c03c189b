#!/usr/bin/env bash
# Resolves one image's Python requirements (from operator/pyproject.toml via
# images/common/requirements.py) to exact versions with hashes, downloads those wheels into
# $MW_CACHE/wheels (shared, reused across builds) and prints the lock file's path.
#   wheels.sh FLAVOR          FLAVOR: operator | worker | worker-gpu
# The lock ($MW_CACHE/wheels/locks/FLAVOR-<hash of the requirements>.txt) is kept until the
# requirements change; MW_REFRESH_LOCKS=1 resolves again against the index (newer releases).
# Wheels are looked up in the cache first, so a warm cache needs no network at all.
set -euo pipefail
source "$(dirname "$0")/lib.sh"

flavor=${1:?usage: wheels.sh operator|worker|worker-gpu}
python_version=3.11            # the images' python3 (Debian bookworm, python:3.11-slim-bookworm)
requirements=$(python3 "$repo/images/common/requirements.py" "$flavor")
build_requirements=$(python3 "$repo/images/common/requirements.py" build)
key=$(hash_text "$requirements" "$python_version" "$(uname -m)")
lock=$wheels/locks/$flavor-${key:0:16}.txt
mkdir -p "$wheels/locks"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# Only wheels, for the images' Python and this machine's platform.
binary=(--only-binary=:all: --python-version "$python_version" --disable-pip-version-check)

if [ ! -s "$lock" ] || [ "${MW_REFRESH_LOCKS:-0}" = 1 ]; then
  log "$flavor: resolving $(echo "$requirements" | xargs)"
  echo "$requirements" > "$tmp/requirements.txt"
  pip install --quiet --dry-run --target "$tmp/target" "${binary[@]}" \
    --report "$tmp/report.json" -r "$tmp/requirements.txt" \
    || die "$flavor: could not resolve the requirements (is PyPI reachable?)"
  python3 - "$tmp/report.json" > "$tmp/lock" <<'EOF'
import json, sys
report = json.load(open(sys.argv[1]))
print("# Resolved by hack/images/wheels.sh; pip install --require-hashes --no-deps -r <this>")
for item in sorted(report["install"], key=lambda i: i["metadata"]["name"].lower()):
    info = item["download_info"]["archive_info"]
    digest = info.get("hashes", {}).get("sha256") or info["hash"].split("=", 1)[1]
    print(f'{item["metadata"]["name"]}=={item["metadata"]["version"]} --hash=sha256:{digest}')
EOF
  mv "$tmp/lock" "$lock"
fi

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
echo "$lock"

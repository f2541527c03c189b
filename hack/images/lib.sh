# shellcheck shell=bash disable=SC2034  # variables are used by the scripts that source this
# Shared settings and helpers for the offline image scripts (sourced, not run).
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# The sources an image is built from: this checkout, or (MW_IMAGE_TREE) an earlier release's
# tree exported by build.sh for an `operator@<rev>` image.
repo=${MW_IMAGE_TREE:-$(cd "$here/../.." && pwd)}
cache=${MW_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/multiworker}
archives=$cache/images          # <name>.tar (docker-archive) + <name>.key (hash of its inputs)
wheels=$cache/wheels            # wheels shared by every build; locks/ holds resolved, hashed sets
base_ref=multiworker.local/base:bookworm
# shellcheck source=../cluster/versions.env
source "$here/../cluster/versions.env"   # KUEUE_VERSION: the kueue image's tag

log() { printf '[images] %s\n' "$*" >&2; }
die() { printf '[images] error: %s\n' "$*" >&2; exit 1; }

# ref NAME: the contract reference of an image.
ref() {
  case $1 in
    pause) echo multiworker.local/pause:3.10 ;;
    base) echo "$base_ref" ;;
    worker | worker-gpu | operator) echo "multiworker.local/$1:dev" ;;
    operator@*) echo "multiworker.local/operator:${1#operator@}" ;;  # an earlier release
    kueue) echo "multiworker.local/kueue:$KUEUE_VERSION" ;;
    *) die "unknown image '$1' (known: pause base worker worker-gpu operator kueue)" ;;
  esac
}

# need COMMAND DEBIAN_PACKAGE...: install the packages when COMMAND is missing.
need() {
  local cmd=$1; shift
  command -v "$cmd" >/dev/null 2>&1 && return 0
  [ "$(id -u)" = 0 ] || die "$cmd is missing; install: $*"
  log "installing Debian packages: $*"
  DEBIAN_FRONTEND=noninteractive apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

# hash_tree PATH...: one sha256 over the names and contents of the files under PATHs (relative
# to the repo), ignoring Python caches and build leftovers. A missing path hashes as missing.
hash_tree() {
  local p
  for p in "$@"; do
    if [ -e "$repo/$p" ]; then
      (cd "$repo" && find "$p" -type f ! -path '*/__pycache__/*' ! -path '*.egg-info/*' \
         ! -name '*.pyc' -print0 | LC_ALL=C sort -z | xargs -0r sha256sum)
    else
      echo "missing $p"
    fi
  done | sha256sum | cut -c1-64
}

hash_text() { printf '%s\n' "$@" | sha256sum | cut -c1-64; }

# fresh NAME KEY: the archive of NAME exists and was built from inputs hashing to KEY.
fresh() {
  [ -s "$archives/$1.tar" ] && [ "$(cat "$archives/$1.key" 2>/dev/null)" = "$2" ]
}

# record NAME KEY: mark the archive of NAME as built from KEY (after it is fully written).
record() { echo "$2" > "$archives/$1.key.tmp" && mv "$archives/$1.key.tmp" "$archives/$1.key"; }

# archive_id TAR: the image ID (config digest) of a docker-archive.
archive_id() {
  tar -xOf "$1" manifest.json | python3 -c \
    'import json,sys; c=json.load(sys.stdin)[0]["Config"]; print("sha256:"+c.rsplit("/",1)[-1].removesuffix(".json"))'
}

human_size() { du -h "$1" | cut -f1; }

# lock_images: one image build at a time per cache (they share the wheels and buildah storage).
# Scripts started by a script that holds the lock inherit it (MW_IMAGES_LOCKED).
lock_images() {
  [ -z "${MW_IMAGES_LOCKED:-}" ] || return 0
  mkdir -p "$archives"
  exec 9>"$archives/.lock"
  flock -n 9 || { log "waiting for another image build to finish"; flock 9; }
  export MW_IMAGES_LOCKED=1
}

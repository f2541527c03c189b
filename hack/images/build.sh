#!/usr/bin/env bash
# Builds multiworker's container images offline and writes each one as a docker-archive,
# $MW_CACHE/images/<name>.tar, tagged with its contract name (docs/contracts.md).
#   build.sh [--force] [pause|base|worker|operator|worker-gpu|kueue|operator@REV|all]...
# `all` (the default) is pause, base, worker and operator; worker-gpu (several GB) and kueue
# (the Kueue manager, for hack/cluster/kueue.sh) only when named. operator@REV: the operator of
# git revision REV (its sources, Dockerfile and lock, on today's base), tagged
# multiworker.local/operator:REV — the release an upgrade test starts from.
# Each archive is rebuilt only when a hash of its inputs changes (stored beside it as
# <name>.key): pause.c; the kueue binary (hack/cluster/build-kueue.sh builds it first); the
# base's script and package list; for worker/operator images/<name> (the Dockerfile and the
# committed wheel lock, requirements.txt), images/common, the package sources,
# examples/training and the base image ID.
# pause, kueue and base need only gcc, go, debootstrap and python3; the others need buildah.
# Debian updates and new PyPI releases are not inputs: `--force base` runs debootstrap again,
# `make locks` (hack/images/locks.sh) moves the committed locks on purpose.
set -euo pipefail
source "$(dirname "$0")/lib.sh"

force=0
targets=()
for arg in "$@"; do
  case $arg in
    --force) force=1 ;;
    all) targets+=(pause base worker operator) ;;
    pause | base | worker | operator | worker-gpu | kueue | operator@?*) targets+=("$arg") ;;
    -h | --help) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown image '$arg' (pause, base, worker, operator, worker-gpu, kueue, all)" ;;
  esac
done
[ ${#targets[@]} -gt 0 ] || targets=(pause base worker operator)
# The Kueue manager's Go build (minutes when cold; its own lock) before the images' lock, so
# other image builds do not wait for it.
if [[ " ${targets[*]} " == *" kueue "* ]]; then "$here/../cluster/build-kueue.sh" >&2; fi
lock_images

# forced NAME: --force was given and NAME was asked for (not just needed by another image).
forced() { [ "$force" = 1 ] && [[ " ${targets[*]} " == *" $1 "* ]]; }

# up_to_date NAME KEY: true (and says so) when the archive was built from the same inputs.
up_to_date() {
  if ! forced "$1" && fresh "$1" "$2"; then
    log "$1: up to date ($archives/$1.tar, $(human_size "$archives/$1.tar"))"
    return 0
  fi
  return 1
}

build_pause() {
  local key src=$repo/images/pause/pause.c
  key=$(hash_text "$(sha256sum "$src" "$here/mkarchive.py" | cut -c1-64)" "$(uname -m)")
  up_to_date pause "$key" && return 0
  need gcc gcc libc6-dev
  local work; work=$(mktemp -d)
  gcc -static -Os -s -Wall -Wextra -Werror -o "$work/pause" "$src"
  # One file owned by root, fixed timestamps: the same source gives the same image ID.
  tar --numeric-owner --owner=0 --group=0 --mtime=@0 --format=gnu -C "$work" -cf "$work/layer.tar" pause
  python3 "$here/mkarchive.py" --layer "$work/layer.tar" --tag "$(ref pause)" \
    --arch "$(dpkg --print-architecture)" --entrypoint '["/pause"]' --user 65535:65535 \
    --out "$archives/pause.tar" >/dev/null
  rm -rf "$work"
  record pause "$key"
  log "pause: built $(ref pause) ($(human_size "$archives/pause.tar"))"
}

# kueue: the static Kueue manager (hack/cluster/build-kueue.sh) as /manager, alone in one layer,
# run as 65532 (distroless' nonroot, as upstream's image) — what kueue.sh's Deployment runs.
build_kueue() {
  local key binary
  binary=$(readlink -f "$cache/bin/kueue") || die "kueue: no binary: run hack/cluster/build-kueue.sh"
  [ -x "$binary" ] || die "kueue: $binary is missing: run hack/cluster/build-kueue.sh"
  key=$(hash_text "$(sha256sum "$binary" "$here/mkarchive.py" | cut -c1-64)" "$(ref kueue)" "$(uname -m)")
  up_to_date kueue "$key" && return 0
  local work; work=$(mktemp -d)
  install -m 755 "$binary" "$work/manager"
  tar --numeric-owner --owner=0 --group=0 --mtime=@0 --format=gnu -C "$work" -cf "$work/layer.tar" manager
  python3 "$here/mkarchive.py" --layer "$work/layer.tar" --tag "$(ref kueue)" \
    --arch "$(dpkg --print-architecture)" --entrypoint '["/manager"]' --user 65532:65532 \
    --label org.opencontainers.image.title=kueue \
    --label org.opencontainers.image.version="$KUEUE_VERSION" \
    --out "$archives/kueue.tar" >/dev/null
  rm -rf "$work"
  record kueue "$key"
  log "kueue: built $(ref kueue) ($(human_size "$archives/kueue.tar"))"
}

# The base image's configuration; part of its key.
base_options=(--env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
  --env LANG=C.UTF-8 --entrypoint '["/usr/bin/tini", "--"]' --cmd '["/bin/bash"]'
  --label org.opencontainers.image.title=multiworker-base
  --label org.opencontainers.image.description="Debian bookworm + python3, bash, coreutils, tini")

base_done=0
build_base() {
  [ "$base_done" = 0 ] || return 0
  base_done=1
  local rootfs key old=
  # --force base runs debootstrap again: the way to pick up new Debian security updates.
  if forced base; then rootfs=$("$here/base-rootfs.sh" --force); else rootfs=$("$here/base-rootfs.sh"); fi
  key=$(hash_text "$(cat "$archives/base-rootfs.key")" "$(sha256sum "$here/mkarchive.py" | cut -c1-64)" \
    "${base_options[@]}")
  if ! up_to_date base "$key"; then
    [ -s "$archives/base.tar" ] && old=$(archive_id "$archives/base.tar")
    python3 "$here/mkarchive.py" --layer "$rootfs" --tag "$base_ref" \
      --arch "$(dpkg --print-architecture)" "${base_options[@]}" --out "$archives/base.tar" >/dev/null
    record base "$key"
    log "base: built $base_ref ($(human_size "$archives/base.tar"))"
  fi
  load_base_into_buildah
  # Drop this cache's previous base from buildah's storage (images built on it keep its layer).
  if [ -n "$old" ] && [ "${old#sha256:}" != "$base_id" ] && command -v buildah >/dev/null 2>&1; then
    buildah rmi "${old#sha256:}" >/dev/null 2>&1 || true
  fi
}

# The worker and operator Dockerfiles build FROM the base in buildah's storage, by image ID (a
# build from another cache on this machine may move the tag meanwhile).
base_id=
load_base_into_buildah() {
  base_id=$(archive_id "$archives/base.tar"); base_id=${base_id#sha256:}
  command -v buildah >/dev/null 2>&1 || return 0
  if ! buildah inspect --type image "$base_id" >/dev/null 2>&1; then
    log "base: loading $base_ref into buildah's storage"
    buildah pull --quiet "docker-archive:$archives/base.tar" >/dev/null
    buildah inspect --type image "$base_id" >/dev/null 2>&1 \
      || die "base: loading $archives/base.tar did not give image $base_id"
  fi
  buildah tag "$base_id" "$base_ref"
}

# build_python NAME SOURCES...: a Dockerfile image whose venv is exactly the committed lock
# images/NAME/requirements.txt, installed from the wheel cache.
build_python() {
  local name=$1 flavor=${1%@*}; shift
  local dockerfile=$repo/images/$flavor/Dockerfile key
  [ -f "$dockerfile" ] || die "$name: $dockerfile is missing"
  need buildah buildah
  for src in "$@"; do [ -e "$repo/$src" ] || die "$name: $src is missing from the repo"; done
  build_base
  # Wheels come in through a read-only bind mount, so they never land in a layer. --layers
  # keeps each step as a cached layer: a source change rebuilds only the small top layers.
  local bud=(--isolation chroot --pull=never --layers --file "$dockerfile"
    --ignorefile "$dockerfile.dockerignore" --build-arg "BASE=$base_id" --build-arg WHEELS=/wheels
    --volume "$wheels:/wheels:ro")
  # The key: the sources (images/NAME holds the lock) and buildah's arguments (the base's ID).
  key=$(hash_text "$(hash_tree "images/$flavor" images/common "$@")" "${bud[@]#"$repo"/}")
  up_to_date "$name" "$key" && return 0

  "$here/wheels.sh" "$flavor"
  local t0=$SECONDS old new
  old=$(buildah inspect --type image --format '{{.FromImageID}}' "$(ref "$name")" 2>/dev/null || true)
  log "$name: building $(ref "$name") from $base_ref ${base_id:0:12} (log: $archives/$name.build.log)"
  buildah bud --quiet "${bud[@]}" --tag "$(ref "$name")" "$repo" > "$archives/$name.build.log" 2>&1 \
    || { tail -30 "$archives/$name.build.log" >&2; die "$name: buildah bud failed"; }
  log "$name: built in $((SECONDS - t0))s; writing $archives/$name.tar"
  rm -f "$archives/$name.tar.tmp"
  buildah push --quiet "$(ref "$name")" "docker-archive:$archives/$name.tar.tmp:$(ref "$name")" >/dev/null
  mv "$archives/$name.tar.tmp" "$archives/$name.tar"
  record "$name" "$key"
  # The previous build of this tag is now unnamed: drop it so storage does not grow.
  new=$(buildah inspect --type image --format '{{.FromImageID}}' "$(ref "$name")")
  if [ -n "$old" ] && [ "$old" != "$new" ]; then buildah rmi "$old" >/dev/null 2>&1 || true; fi
  log "$name: done in $((SECONDS - t0))s ($(human_size "$archives/$name.tar"))"
}

# build_release REV: the operator of git revision REV, built from its own tree (git archive).
build_release() {
  local rev=$1 tree
  git -C "$repo" cat-file -e "$rev^{commit}" 2>/dev/null \
    || die "operator@$rev: no such commit in $repo (a shallow clone? fetch its history)"
  build_base  # today's, from this checkout
  tree=$(mktemp -d)
  git -C "$repo" archive "$rev" images operator | tar -x -C "$tree"
  ( export MW_IMAGE_TREE=$tree; repo=$tree; build_python "operator@$rev" "${runtime_sources[@]}" )
  rm -rf "$tree"
}

runtime_sources=(operator/pyproject.toml operator/src/multiworker)
for target in "${targets[@]}"; do
  case $target in
    operator@*) build_release "${target#operator@}" ;;
    pause) build_pause ;;
    kueue) build_kueue ;;
    base) build_base ;;
    worker) build_python worker "${runtime_sources[@]}" examples/training ;;
    worker-gpu) build_python worker-gpu "${runtime_sources[@]}" examples/training ;;
    operator) build_python operator "${runtime_sources[@]}" ;;
  esac
done

#!/usr/bin/env bash
# Imports built image archives ($MW_CACHE/images/<name>.tar) into a cluster's containerd.
#   load.sh [--kind CLUSTER | --address SOCKET] NAME...     NAME: pause base worker operator
#                                                            worker-gpu kueue, or a docker-archive path
# Default: the local cluster's containerd (/run/multiworker/containerd/containerd.sock,
# namespace k8s.io). --kind: `kind load image-archive` into every worker node of a kind cluster.
# An image whose ID (config digest) is already there under the same name is skipped; for the
# local cluster only the layers containerd lacks are sent (oci_delta.py).
set -euo pipefail
source "$(dirname "$0")/lib.sh"

address=${MW_CONTAINERD_ADDRESS:-/run/multiworker/containerd/containerd.sock}
namespace=k8s.io
kind_cluster=
names=()
while [ $# -gt 0 ]; do
  case $1 in
    --kind) kind_cluster=${2:?--kind needs a cluster name}; shift 2 ;;
    --address) address=${2:?--address needs a socket path}; shift 2 ;;
    -h | --help) sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) die "unknown option $1" ;;
    *) names+=("$1"); shift ;;
  esac
done
[ ${#names[@]} -gt 0 ] || die "usage: load.sh [--kind CLUSTER | --address SOCKET] NAME..."

# archive_of NAME: the archive path (NAME may be a path already).
archive_of() {
  case $1 in
    */* | *.tar) echo "$1" ;;
    *) ref "$1" >/dev/null; echo "$archives/$1.tar" ;;
  esac
}

# archive_ref TAR: the name the archive is tagged with.
archive_ref() {
  tar -xOf "$1" manifest.json | python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["RepoTags"][0])'
}

# config_digest: read an image manifest (or index) as JSON on stdin, print its config digest;
# for an index, print the first manifest's digest prefixed with "index ".
config_digest() {
  python3 -c '
import json, sys
m = json.load(sys.stdin)
if "config" in m:
    print(m["config"]["digest"])
else:
    print("index", m["manifests"][0]["digest"])'
}

# containerd_id REF: the image ID containerd holds under REF, or nothing.
containerd_id() {
  local digest out
  digest=$(ctr --address "$address" -n "$namespace" images ls "name==$1" | awk 'NR==2 {print $3}')
  [ -n "$digest" ] || return 0
  for _ in 1 2; do
    out=$(ctr --address "$address" -n "$namespace" content get "$digest" | config_digest) || return 0
    case $out in
      "index "*) digest=${out#index } ;;
      *) echo "$out"; return 0 ;;
    esac
  done
}

load_local() {
  local tar=$1 want=$2 name=$3 t0=$SECONDS skipped
  [ -S "$address" ] || die "no containerd at $address (is the local cluster up? make cluster-up)"
  if [ "$(containerd_id "$name")" = "$want" ]; then
    log "$name: already in containerd (${want:7:12})"; return 0
  fi
  # Send only the layers containerd lacks (a rebuilt worker shares its big layers with the last).
  local tmp; tmp=$(mktemp -d)
  ctr --address "$address" -n "$namespace" content ls -q > "$tmp/have"
  skipped=$(python3 "$here/oci_delta.py" "$tar" "$tmp/have" "$tmp/delta.tar")
  log "$name: importing $(human_size "$tmp/delta.tar") into containerd ($address;" \
    "$((skipped / 1048576)) MiB of layers already there)"
  if ! ctr --address "$address" -n "$namespace" images import "$tmp/delta.tar" >"$tmp/log" 2>&1 \
      || [ "$(containerd_id "$name")" != "$want" ]; then
    log "$name: partial import failed ($(tail -1 "$tmp/log")); importing all of $tar"
    ctr --address "$address" -n "$namespace" images import "$tar" >/dev/null
  fi
  rm -rf "$tmp"
  [ "$(containerd_id "$name")" = "$want" ] || die "$name: import did not give image ${want:7:12}"
  log "$name: imported in $((SECONDS - t0))s"
}

load_kind() {
  local tar=$1 want=$2 name=$3 node have missing=0 t0=$SECONDS
  local engine=${KIND_EXPERIMENTAL_PROVIDER:-docker}
  command -v kind >/dev/null 2>&1 || PATH=$cache/bin:$PATH
  command -v kind >/dev/null 2>&1 || die "kind is not installed (nor in $cache/bin)"
  local nodes workers; nodes=$(kind get nodes --name "$kind_cluster" 2>/dev/null)
  [ -n "$nodes" ] || die "no kind cluster named $kind_cluster"
  # Pods run on the workers only (kubeadm taints a control plane that has workers): a 1.4 GB
  # image written into a node that never runs it is a third of the load's time for nothing.
  workers=$(grep -v -- '-control-plane[0-9]*$' <<<"$nodes" || true)
  [ -z "$workers" ] || nodes=$workers
  for node in $nodes; do
    have=$("$engine" exec "$node" crictl inspecti -o go-template --template '{{.status.id}}' "$name" 2>/dev/null || true)
    [ "$have" = "$want" ] || missing=1
  done
  if [ "$missing" = 0 ]; then log "$name: already on kind cluster $kind_cluster"; return 0; fi
  log "$name: loading into kind cluster $kind_cluster"
  kind load image-archive "$tar" --name "$kind_cluster" --nodes "$(paste -sd, <<<"$nodes")"
  log "$name: loaded in $((SECONDS - t0))s"
}

for item in "${names[@]}"; do
  tar=$(archive_of "$item")
  [ -s "$tar" ] || die "$tar is missing: build it first (hack/images/build.sh ${item})"
  want=$(archive_id "$tar")
  name=$(archive_ref "$tar")
  if [ -n "$kind_cluster" ]; then load_kind "$tar" "$want" "$name"; else load_local "$tar" "$want" "$name"; fi
done

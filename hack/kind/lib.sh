# shellcheck shell=bash disable=SC2034  # variables are used by the scripts that source this
# Shared settings for the kind scripts (sourced, not run): the cluster, the private Docker
# engine started when no engine answers, and the offline node image.
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
# shellcheck source=hack/cluster/versions.env
source "$repo/hack/cluster/versions.env"
cache=${MW_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/multiworker}
bin=$cache/bin
export PATH="$bin:$PATH"

cluster_name=multiworker
# The cluster's pod range (kind's default) and service range, written into its config, and the tag of
# its unreachable routes on this host (hack/cluster/ranges.sh).
pod_subnet=10.244.0.0/16      # the node image's mw-cni unit gives node n 10.244.n.0/24
service_subnet=10.97.0.0/16   # its own: the local cluster has 10.96.0.0/16, and both may be up at once
range_metric=4202
workers=${MW_KIND_WORKERS:-2}
node_gpus=${MW_NODE_GPUS:-4}
state=$repo/.cluster                        # kind-kubeconfig, kind.env, kind-config.yaml
kubeconfig=$state/kind-kubeconfig
# One host directory in every node at the same path: hostPath volumes under it are shared by
# pods on different nodes (the e2e checkpoint volumes; real clusters use a ReadWriteMany class).
shared_dir=${MW_KIND_SHARED_DIR:-/var/lib/multiworker/kind-shared}
# examples/checkpoint-pvc.yaml's hostPath: one host folder behind it on every node, so the
# example's checkpoints are shared by workers on different nodes here as on one local node.
example_checkpoints=/var/lib/multiworker/example-checkpoints

# The private engine: only started when no Docker engine answers. Its images (the node image)
# live in the cache and survive `down`; sockets, pid and log live under /run.
engine_run=/run/multiworker-kind
engine_sock=$engine_run/docker.sock
engine_pid=$engine_run/dockerd.pid
engine_log=$engine_run/dockerd.log
engine_owned=$engine_run/started-by-multiworker
engine_data=$cache/kind/docker

# The offline node image and what it is built from.
node_repo=multiworker.local/kind-node
kind_work=$cache/kind                       # rootfs tarball and build keys

# shellcheck source=hack/cluster/ranges.sh
source "$repo/hack/cluster/ranges.sh"

log() { printf '[kind] %s\n' "$*" >&2; }
die() { printf '[kind] error: %s\n' "$*" >&2; exit 1; }

# use_engine: point docker (and kind, which runs docker) at our private engine when it runs.
use_engine() {
  if [ -S "$engine_sock" ] && [ -f "$engine_owned" ]; then
    export DOCKER_HOST=unix://$engine_sock
  fi
}

engine_answers() { timeout 20 docker info >/dev/null 2>&1; }

# wait_until SECONDS DESCRIPTION COMMAND...: poll until COMMAND succeeds.
wait_until() {
  local limit=$1 what=$2; shift 2
  local deadline=$((SECONDS + limit))
  until "$@" >/dev/null 2>&1; do
    [ $SECONDS -lt $deadline ] || die "timed out after ${limit}s waiting for $what"
    sleep 0.3
  done
}

hash_text() { printf '%s\n' "$@" | sha256sum | cut -c1-64; }

cluster_exists() { kind get clusters 2>/dev/null | grep -qx "$cluster_name"; }

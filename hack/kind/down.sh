#!/usr/bin/env bash
# Deletes the kind cluster `multiworker`, the gang-scheduling processes and the host routes
# up.sh added (to the nodes' pods, and the unreachable guards of its address ranges), and, when the engine is the private dockerd up.sh started, the `kind` network and
# that dockerd: afterwards a plain `docker info` fails again. A Docker engine that was already there is left running. Keeps
# the node image (in the engine's data root under $MW_CACHE) and the shared directory
# ($MW_KIND_SHARED_DIR: checkpoints written there survive). Safe to run when nothing is up.
set -euo pipefail
# shellcheck source=hack/kind/lib.sh
source "$(dirname "$0")/lib.sh"
use_engine

"$repo/hack/cluster/gang.sh" --kind --stop
if engine_answers; then
  if cluster_exists; then
    log "deleting kind cluster $cluster_name"
    kind delete cluster --name "$cluster_name" --kubeconfig "$kubeconfig"
  fi
  if [ -f "$engine_owned" ] && docker network inspect kind >/dev/null 2>&1; then
    docker network rm kind >/dev/null || log "warning: could not remove the kind network"
  fi
fi
if [ -f "$state/kind-routes" ]; then
  while read -r cidr _ via; do
    ip route del "$cidr" via "$via" 2>/dev/null || true
  done < "$state/kind-routes"
fi
unguard_ranges kind "$range_metric"
rm -f "$kubeconfig" "$state/kind.env" "$state/kind-config.yaml" "$state/kind-routes"
"$here/docker.sh" down
[ -d "$shared_dir" ] && log "kept $shared_dir ($(du -sh "$shared_dir" | cut -f1); shared volumes' data)"
exit 0

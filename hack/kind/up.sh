#!/usr/bin/env bash
# Creates (once) the kind cluster `multiworker`, advertises nvidia.com/gpu on its workers like
# the local cluster does, and writes .cluster/kind-kubeconfig. Needs a Docker engine.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
"$repo/hack/cluster/build-binaries.sh" >/dev/null
export PATH="${MW_CACHE:-$HOME/.cache/multiworker}/bin:$PATH"
kubeconfig=$repo/.cluster/kind-kubeconfig
gpus=${MW_NODE_GPUS:-4}
mkdir -p "$repo/.cluster"
docker info >/dev/null 2>&1 || { echo "[kind] needs a running Docker engine" >&2; exit 1; }
if ! kind get clusters 2>/dev/null | grep -qx multiworker; then
  kind create cluster --config "$here/cluster.yaml" --wait 120s
fi
kind get kubeconfig --name multiworker > "$kubeconfig"
for n in $(kubectl --kubeconfig "$kubeconfig" get nodes -l '!node-role.kubernetes.io/control-plane' -o name); do
  kubectl --kubeconfig "$kubeconfig" patch "$n" --subresource=status --type=merge \
    -p "{\"status\":{\"capacity\":{\"nvidia.com/gpu\":\"$gpus\"},\"allocatable\":{\"nvidia.com/gpu\":\"$gpus\"}}}" >/dev/null
done
echo "[kind] ready: export KUBECONFIG=$kubeconfig"

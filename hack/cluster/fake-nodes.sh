#!/usr/bin/env bash
# Fake nodes for scale tests and benchmarks, simulated by kwok (stages in kwok/stages.yaml).
# Each fake-<i> advertises GPUS nvidia.com/gpu, carries the label `type: kwok` and the taint
# multiworker.dev/fake-node=true:NoSchedule, so only pods that tolerate it land there; kwok marks
# those pods Running and Ready (pod IPs from $fake_pod_cidr with nothing behind them) without running
# anything, and removes them at once when they are deleted. Their pod and node ranges
# ($fake_pod_cidr, $fake_node_cidr in lib.sh) are locally unreachable (ranges.sh): a connection
# to a fake pod fails at once with "No route to host" and never leaves the machine.
#   fake-nodes.sh N [GPUS]   exactly N fake nodes (fake-0 .. fake-N-1), GPUS each (default 8);
#                            idempotent: existing nodes are updated, extra ones deleted
#   fake-nodes.sh --delete   delete every fake node and stop kwok (down.sh stops kwok too)
set -euo pipefail
source "$(dirname "$0")/lib.sh"
selector=multiworker.dev/fake-node=true
proxy_port=$((api_port + 1))  # kwok/watch-proxy.py, when needed
kc get --raw /readyz >/dev/null 2>&1 || die "the local cluster is not up (make cluster-up)"
guard_local_ranges   # a cluster brought up before the guards existed gets them now

delete_nodes() { # NAME...: delete and wait until gone (pod GC removes their pods within ~1 min)
  [ $# -gt 0 ] || return 0
  kc delete nodes "$@" --wait=false >/dev/null
  kc wait --for=delete nodes "$@" --timeout=60s >/dev/null 2>&1 || true
}

if [ "${1:-}" = --delete ]; then
  # shellcheck disable=SC2046
  delete_nodes $(kc get nodes -l "$selector" -o jsonpath='{.items[*].metadata.name}')
  stop_process kwok
  log "fake nodes deleted, kwok stopped"; exit 0
fi
count=${1:?usage: fake-nodes.sh N [GPUS] | --delete}
gpus=${2:-8}
[[ $count =~ ^[0-9]+$ && $gpus =~ ^[0-9]+$ ]] || die "N and GPUS must be whole numbers"

# Nodes beyond the requested count (from an earlier, larger call).
extra=()
for n in $(kc get nodes -l "$selector" -o jsonpath='{.items[*].metadata.name}'); do
  [[ $n =~ ^fake-([0-9]+)$ ]] && [ "${BASH_REMATCH[1]}" -lt "$count" ] || extra+=("$n")
done
delete_nodes "${extra[@]}"
if [ "$count" -eq 0 ]; then stop_process kwok; log "no fake nodes; kwok stopped"; exit 0; fi

[ -x "$bin/kwok" ] || "$here/build-binaries.sh" kwok >/dev/null
# This API server may refuse kwok's watches (see kwok/watch-proxy.py): then kwok runs behind
# that proxy, which fixes them. Both are one process group, stopped together.
broken_watch() {
  local q='watch=1&resourceVersion=0&allowWatchBookmarks=true&timeoutSeconds=1'
  kc get --raw "/api/v1/namespaces?$q&fieldSelector=metadata.name%3Ddefault" 2>&1 \
    | grep -q RequestWatchProgress
}
# kwok outlives this script: it must not inherit the descriptor that `flock LOCKFILE cmd` passes
# down, or the lock (e.g. /tmp/mw-cluster.lock) stays held until kwok stops.
for fd in /proc/$$/fd/*; do
  [[ $(readlink "$fd" 2>/dev/null) == *.lock ]] && eval "exec ${fd##*/}>&-"
done
kwok_args=(--config "$here/kwok/stages.yaml" --cidr "$fake_pod_cidr"
           --manage-nodes-with-label-selector "$selector")
# A kwok started with other stages is restarted with these.
config_hash=$(sha256sum < "$here/kwok/stages.yaml" | cut -c1-16)
if is_running kwok && [ "$(cat "$state/kwok.stages-hash" 2>/dev/null)" != "$config_hash" ]; then
  log "kwok's stages changed: restarting it"; stop_process kwok
fi
echo "$config_hash" > "$state/kwok.stages-hash"
if is_running kwok; then :
elif broken_watch; then
  cat > "$state/kwok.kubeconfig" <<EOT
apiVersion: v1
kind: Config
clusters: [{name: proxy, cluster: {server: "http://127.0.0.1:$proxy_port"}}]
users: [{name: kwok, user: {}}]
contexts: [{name: proxy, context: {cluster: proxy, user: kwok}}]
current-context: proxy
EOT
  start kwok python3 "$here/kwok/watch-proxy.py" "$proxy_port" "https://127.0.0.1:$api_port" \
    "$state/pki/ca.crt" "$state/pki/admin.crt" "$state/pki/admin.key" -- \
    kwok --kubeconfig "$state/kwok.kubeconfig" "${kwok_args[@]}"
else
  start kwok kwok --kubeconfig "$kubeconfig" "${kwok_args[@]}"
fi

manifest=$(mktemp); trap 'rm -f "$manifest"' EXIT
for i in $(seq 0 $((count - 1))); do
  cat <<EOT
apiVersion: v1
kind: Node
metadata:
  name: fake-$i
  labels: {type: kwok, multiworker.dev/fake-node: "true", kubernetes.io/hostname: fake-$i}
spec:
  taints: [{key: multiworker.dev/fake-node, value: "true", effect: NoSchedule}]
status:
  addresses: [{type: InternalIP, address: ${fake_node_cidr%.0.0/16}.$((i / 256)).$((i % 256))}]
  allocatable: {cpu: "64", memory: 512Gi, pods: "110", nvidia.com/gpu: "$gpus"}
  capacity: {cpu: "64", memory: 512Gi, pods: "110", nvidia.com/gpu: "$gpus"}
---
EOT
done > "$manifest"
# Status is taken from the body only on create; the second apply updates it on existing nodes.
kc apply --server-side --force-conflicts --field-manager=fake-nodes -f "$manifest" >/dev/null
kc apply --server-side --force-conflicts --field-manager=fake-nodes --subresource=status \
  -f "$manifest" >/dev/null

exec 3>&2  # wait_until silences its command; a dead kwok should still be reported
ready() { # all fake nodes Ready and untainted by the node controller (its not-ready taint
  # outlives the condition: a pod bound meanwhile is marked NotReady, and kwok never marks it
  # Ready again), or fail at once if kwok is gone
  is_running kwok || die "kwok exited: $(tail -c 300 "$state/logs/kwok.log")" 2>&3
  local q='{range .items[*]}{.status.conditions[?(@.type=="Ready")].status} {.spec.taints[*].key}{"\n"}{end}'
  [ "$(kc get nodes -l "$selector" -o jsonpath="$q" | grep -c '^True multiworker.dev/fake-node$')" \
    -eq "$count" ]
}
wait_until 60 "$count fake nodes Ready" ready
log "$count fake nodes Ready with $gpus nvidia.com/gpu each" \
  "(nodeSelector type: kwok; toleration multiworker.dev/fake-node)"

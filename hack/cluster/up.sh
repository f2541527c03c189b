#!/usr/bin/env bash
# Brings up a real single-node Kubernetes cluster on this machine: etcd, kube-apiserver (RBAC),
# controller-manager, scheduler, CoreDNS, a private containerd, kube-proxy and a kubelet whose
# node advertises nvidia.com/gpu. Idempotent: a healthy cluster is left alone; a partial one is
# torn down and started again. Writes .cluster/kubeconfig.
# `--gang` (or MW_GANG=1) also runs gang.sh: the coscheduling scheduler beside kube-scheduler
# and the PodGroup CRD; it can be added to a cluster that is already up.
# `--no-node` (or MW_NO_NODE=1): the control plane alone (etcd, API server, controller-manager,
# scheduler), for kwok's fake nodes (fake-nodes.sh): what the scale benchmarks need, on a
# machine with neither containerd nor Go, from binaries already in $MW_CACHE/bin
# (hack/bench/device-kit.sh carries them there).
set -euo pipefail
source "$(dirname "$0")/lib.sh"
source "$here/components.sh"   # every component's command line (restart.sh uses them too)
gang=${MW_GANG:-}
no_node=${MW_NO_NODE:-}
for arg in "$@"; do
  case $arg in
    --gang) gang=1 ;;
    --no-node) no_node=1 ;;
    *) die "unknown argument $arg (usage: up.sh [--gang] [--no-node])" ;;
  esac
done
[ "$gang" = 0 ] && gang=
[ "$no_node" = 0 ] && no_node=
[ -z "$no_node" ] || components=(etcd kube-apiserver kube-controller-manager kube-scheduler)

[ "$(id -u)" = 0 ] || die "the local cluster needs root (it runs a kubelet and containerd)"

healthy() {
  for c in "${components[@]}"; do is_running "$c" || return 1; done
  kc get --raw /readyz >/dev/null 2>&1 && { [ -n "$no_node" ] || kc get node "$node" >/dev/null 2>&1; }
}
if [ -f "$kubeconfig" ] && healthy; then
  log "cluster already up (kubeconfig: $kubeconfig)"
  guard_local_ranges
  [ -z "$gang" ] || "$here/gang.sh"
  exit 0
fi
t0=$SECONDS
if [ -z "$no_node" ]; then
  require_free_disk "$containerd_root" "$kubelet_root" "$state"
  "$here/install-deps.sh"
  "$here/build-binaries.sh"
else
  for c in "${components[@]}" kubectl openssl curl; do
    command -v "$c" >/dev/null || die "--no-node needs $c on PATH or in $bin"
  done
fi
"$here/down.sh" --quiet           # clear whatever is left of an earlier, partial cluster
"$here/pki.sh"
"$here/configs.sh"

if [ -z "$no_node" ]; then
  log "network: bridge $bridge $gateway/16"
  sysctl -qw net.ipv4.ip_forward=1
  modprobe br_netfilter 2>/dev/null && sysctl -qw net.bridge.bridge-nf-call-iptables=1 || true
  ip link show "$bridge" >/dev/null 2>&1 || ip link add "$bridge" type bridge
  ip addr replace "$gateway/16" dev "$bridge"
  ip link set "$bridge" up
fi
log "address ranges: served here or unreachable (ranges.sh)"
guard_local_ranges

log "etcd"
rm -rf "$state/etcd" "$run/cni-ipam"
start_component etcd
await_component etcd

log "kube-apiserver"
start_component kube-apiserver
await_component kube-apiserver

log "controller-manager, scheduler"
start_component kube-controller-manager
start_component kube-scheduler

kc apply -f "$here/rbac.yaml" >/dev/null
if [ -n "$no_node" ]; then
  wait_until 60 "default ServiceAccount" kc -n default get serviceaccount default
  log "control plane up in $((SECONDS - t0))s, no node (fake nodes: fake-nodes.sh). Use it with:"
  echo "  export KUBECONFIG=$kubeconfig PATH=$bin:\$PATH"
  exit 0
fi
log "CoreDNS on $gateway:53"
start_component coredns

log "containerd (private socket $sock)"
start_component containerd
await_component containerd
"$repo/hack/images/build.sh" pause
"$repo/hack/images/load.sh" pause

log "kube-proxy (iptables)"
start_component kube-proxy

log "kubelet (node $node)"
start_component kubelet
await_component kubelet

if [ "$node_gpus" -gt 0 ]; then
  log "advertising nvidia.com/gpu: $node_gpus on $node"
  kc patch node "$node" --subresource=status --type=merge \
    -p "{\"status\":{\"capacity\":{\"nvidia.com/gpu\":\"$node_gpus\"},\"allocatable\":{\"nvidia.com/gpu\":\"$node_gpus\"}}}" >/dev/null
fi
wait_until 60 "default ServiceAccount" kc -n default get serviceaccount default
[ -z "$gang" ] || "$here/gang.sh"

log "up in $((SECONDS - t0))s. Use it with:"
echo "  export KUBECONFIG=$kubeconfig PATH=$bin:\$PATH"
echo "  kubectl get nodes"

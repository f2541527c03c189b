#!/usr/bin/env bash
# Brings up a real single-node Kubernetes cluster on this machine: etcd, kube-apiserver (RBAC),
# controller-manager, scheduler, CoreDNS, a private containerd, kube-proxy and a kubelet whose
# node advertises nvidia.com/gpu. Idempotent: a healthy cluster is left alone; a partial one is
# torn down and started again. Writes .cluster/kubeconfig.
# `--gang` (or MW_GANG=1) also runs gang.sh: the coscheduling scheduler beside kube-scheduler
# and the PodGroup CRD; it can be added to a cluster that is already up.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
source "$here/components.sh"   # every component's command line (restart.sh uses them too)
gang=${MW_GANG:-}
for arg in "$@"; do
  case $arg in
    --gang) gang=1 ;;
    *) die "unknown argument $arg (usage: up.sh [--gang])" ;;
  esac
done
[ "$gang" = 0 ] && gang=

[ "$(id -u)" = 0 ] || die "the local cluster needs root (it runs a kubelet and containerd)"

healthy() {
  for c in "${components[@]}"; do is_running "$c" || return 1; done
  kc get --raw /readyz >/dev/null 2>&1 && kc get node "$node" >/dev/null 2>&1
}
if [ -f "$kubeconfig" ] && healthy; then
  log "cluster already up (kubeconfig: $kubeconfig)"
  guard_local_ranges
  [ -z "$gang" ] || "$here/gang.sh"
  exit 0
fi
t0=$SECONDS
"$here/install-deps.sh"
"$here/build-binaries.sh"
"$here/down.sh" --quiet           # clear whatever is left of an earlier, partial cluster
"$here/pki.sh"
"$here/configs.sh"

log "network: bridge $bridge $gateway/16"
sysctl -qw net.ipv4.ip_forward=1
modprobe br_netfilter 2>/dev/null && sysctl -qw net.bridge.bridge-nf-call-iptables=1 || true
ip link show "$bridge" >/dev/null 2>&1 || ip link add "$bridge" type bridge
ip addr replace "$gateway/16" dev "$bridge"
ip link set "$bridge" up
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

log "CoreDNS on $gateway:53"
kc apply -f "$here/rbac.yaml" >/dev/null
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

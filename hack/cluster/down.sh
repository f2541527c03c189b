#!/usr/bin/env bash
# Stops everything up.sh started, by PID, and removes its pods, network and mounts.
# Leaves caches (binaries, images) in place. Safe to run when nothing is up.
set -uo pipefail
source "$(dirname "$0")/lib.sh"
quiet=${1:-}
say() { [ "$quiet" = --quiet ] || log "$@"; }

stop() { # NAME
  is_running "$1" && say "stopping $1 ($(cat "$state/pids/$1.pid"))"
  stop_process "$1"
}

# Let the kubelet tear pods down through CRI (that also releases their network).
if is_running kubelet && is_running kube-apiserver; then
  say "removing pods"
  kc delete pods --all-namespaces --all --grace-period=0 --force --wait=false >/dev/null 2>&1
  for _ in $(seq 100); do
    [ -z "$(ctr --address "$sock" -n k8s.io tasks ls -q 2>/dev/null)" ] && break; sleep 0.2
  done
fi
stop kubelet
# Whatever the kubelet did not remove: kill and delete directly.
if is_running containerd; then
  for t in $(ctr --address "$sock" -n k8s.io tasks ls -q 2>/dev/null); do
    ctr --address "$sock" -n k8s.io tasks kill -s SIGKILL "$t" >/dev/null 2>&1
  done
  sleep 0.5
  for c in $(ctr --address "$sock" -n k8s.io containers ls -q 2>/dev/null); do
    ctr --address "$sock" -n k8s.io tasks rm -f "$c" >/dev/null 2>&1
    ctr --address "$sock" -n k8s.io containers rm "$c" >/dev/null 2>&1
  done
fi
for c in podgroup-controller coscheduler kwok kube-proxy containerd coredns kube-scheduler kube-controller-manager kube-apiserver etcd; do
  stop "$c"
done
# containerd's shims outlive it; they belong to us if they talk to our socket.
pkill -KILL -f "containerd-shim-runc-v2 .*-address $sock" 2>/dev/null
[ -x "$bin/kube-proxy" ] && kube-proxy --cleanup >/dev/null 2>&1
# Leftover mounts (secret volumes, sandbox netns) from pods the kubelet did not clean.
if [ -d "$kubelet_root" ]; then
  grep -o " $kubelet_root[^ ]*" /proc/mounts | sort -r | xargs -r -n1 umount -l 2>/dev/null
  rm -rf "$kubelet_root"
fi
grep -o " $run/[^ ]*" /proc/mounts | sort -r | xargs -r -n1 umount -l 2>/dev/null
for ns in $(ip netns list 2>/dev/null | awk '/^cni-/{print $1}'); do ip netns delete "$ns" 2>/dev/null; done
ip link delete "$bridge" 2>/dev/null   # takes the service route through it along
unguard_ranges local "$range_metric"
rm -rf "$run"
say "cluster down"
exit 0

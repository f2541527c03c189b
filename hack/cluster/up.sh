#!/usr/bin/env bash
# Brings up a real single-node Kubernetes cluster on this machine: etcd, kube-apiserver (RBAC),
# controller-manager, scheduler, CoreDNS, a private containerd, kube-proxy and a kubelet whose
# node advertises nvidia.com/gpu. Idempotent: a healthy cluster is left alone; a partial one is
# torn down and started again. Writes .cluster/kubeconfig.
# `--gang` (or MW_GANG=1) also runs gang.sh: the coscheduling scheduler beside kube-scheduler
# and the PodGroup CRD; it can be added to a cluster that is already up.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
gang=${MW_GANG:-}
for arg in "$@"; do
  case $arg in
    --gang) gang=1 ;;
    *) die "unknown argument $arg (usage: up.sh [--gang])" ;;
  esac
done
[ "$gang" = 0 ] && gang=
components=(etcd kube-apiserver kube-controller-manager kube-scheduler coredns containerd kube-proxy kubelet)

[ "$(id -u)" = 0 ] || die "the local cluster needs root (it runs a kubelet and containerd)"

healthy() {
  for c in "${components[@]}"; do is_running "$c" || return 1; done
  kc get --raw /readyz >/dev/null 2>&1 && kc get node "$node" >/dev/null 2>&1
}
if [ -f "$kubeconfig" ] && healthy; then
  log "cluster already up (kubeconfig: $kubeconfig)"
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

log "etcd"
rm -rf "$state/etcd" "$run/cni-ipam"
start etcd etcd --name mw --data-dir "$state/etcd" \
  --listen-client-urls "http://127.0.0.1:$etcd_port" --advertise-client-urls "http://127.0.0.1:$etcd_port" \
  --listen-peer-urls http://127.0.0.1:12380 --initial-advertise-peer-urls http://127.0.0.1:12380 \
  --initial-cluster mw=http://127.0.0.1:12380
wait_until 30 etcd curl -fsS "http://127.0.0.1:$etcd_port/health"

log "kube-apiserver"
pki=$state/pki
start kube-apiserver kube-apiserver --etcd-servers "http://127.0.0.1:$etcd_port" \
  --bind-address 0.0.0.0 --secure-port "$api_port" --advertise-address "$gateway" \
  --tls-cert-file "$pki/apiserver.crt" --tls-private-key-file "$pki/apiserver.key" \
  --client-ca-file "$pki/ca.crt" --authorization-mode Node,RBAC --allow-privileged=true \
  --service-cluster-ip-range "$service_cidr" \
  --service-account-key-file "$pki/sa.pub" --service-account-signing-key-file "$pki/sa.key" \
  --service-account-issuer https://kubernetes.default.svc.cluster.local \
  --kubelet-client-certificate "$pki/apiserver-kubelet-client.crt" \
  --kubelet-client-key "$pki/apiserver-kubelet-client.key" \
  --kubelet-preferred-address-types InternalIP --enable-admission-plugins NodeRestriction
wait_until 90 "kube-apiserver /readyz" kc get --raw /readyz

log "controller-manager, scheduler"
start kube-controller-manager kube-controller-manager --kubeconfig "$state/controller-manager.kubeconfig" \
  --authentication-kubeconfig "$state/controller-manager.kubeconfig" \
  --authorization-kubeconfig "$state/controller-manager.kubeconfig" \
  --service-account-private-key-file "$pki/sa.key" --root-ca-file "$pki/ca.crt" \
  --use-service-account-credentials --leader-elect=false --bind-address 127.0.0.1 \
  --cluster-signing-cert-file "$pki/ca.crt" --cluster-signing-key-file "$pki/ca.key"
start kube-scheduler kube-scheduler --kubeconfig "$state/scheduler.kubeconfig" \
  --authentication-kubeconfig "$state/scheduler.kubeconfig" \
  --authorization-kubeconfig "$state/scheduler.kubeconfig" \
  --leader-elect=false --bind-address 127.0.0.1

log "CoreDNS on $gateway:53"
kc apply -f "$here/rbac.yaml" >/dev/null
start coredns coredns -conf "$state/Corefile"

log "containerd (private socket $sock)"
mkdir -p "$run/containerd" "$containerd_root"
start containerd containerd --config "$state/containerd.toml"
wait_until 30 containerd ctr --address "$sock" version
"$repo/hack/images/build.sh" pause
"$repo/hack/images/load.sh" pause

log "kube-proxy (iptables)"
start kube-proxy kube-proxy --config "$state/kube-proxy.yaml"

log "kubelet (node $node)"
mkdir -p "$kubelet_root"
start kubelet kubelet --config "$state/kubelet.yaml" --kubeconfig "$state/kubelet.kubeconfig" \
  --root-dir "$kubelet_root" --hostname-override "$node" --node-ip "$gateway" \
  --node-labels "multiworker.dev/local-cluster=true"
wait_until 90 "node $node to register" kc get node "$node"
wait_until 90 "node $node Ready" kc wait --for=condition=Ready "node/$node" --timeout=1s

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

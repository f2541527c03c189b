#!/usr/bin/env bash
# Writes the config files of containerd, CNI, kubelet, kube-proxy and CoreDNS into .cluster/.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
mkdir -p "$state/cni" "$run/containerd"

cat > "$state/containerd.toml" <<EOT
version = 2
root = "$containerd_root"
state = "$run/containerd/state"
[grpc]
  address = "$sock"
[debug]
  address = ""
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = "$run/containerd/opt"
[plugins."io.containerd.grpc.v1.cri"]
  # Nothing can be pulled here: the sandbox image is imported like every other image.
  sandbox_image = "multiworker.local/pause:3.10"
  # Root in these VMs lacks CAP_SYS_RESOURCE: runc may not raise oom_score_adj.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$state/cni"
EOT

cat > "$state/cni/10-multiworker.conflist" <<EOT
{
  "cniVersion": "1.0.0",
  "name": "multiworker",
  "plugins": [
    {
      "type": "bridge", "bridge": "$bridge", "isGateway": true, "ipMasq": true, "hairpinMode": true,
      "ipam": {
        "type": "host-local", "dataDir": "$run/cni-ipam",
        "ranges": [[{"subnet": "$pod_cidr", "gateway": "$gateway", "rangeStart": "10.88.1.0"}]],
        "routes": [{"dst": "0.0.0.0/0"}]
      }
    },
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
EOT

# Pods resolve through the cluster DNS only; there is no upstream to forward to.
echo "nameserver $gateway" > "$state/resolv.conf"

cat > "$state/kubelet.yaml" <<EOT
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false          # these VMs mount cgroup v1; kubelet >= 1.35 refuses it by default
cgroupDriver: cgroupfs
failSwapOn: false
containerRuntimeEndpoint: unix://$sock
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $state/pki/ca.crt}
authorization: {mode: Webhook}
clusterDomain: cluster.local
clusterDNS: [$gateway]
resolvConf: $state/resolv.conf
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
serializeImagePulls: false
imageGCHighThresholdPercent: 100   # images are imported, never pulled: never collect them
evictionHard: {memory.available: 100Mi, nodefs.available: 1%, imagefs.available: 1%, nodefs.inodesFree: 1%}
maxPods: 250
# What managed clusters commonly allow a pod: a trainer whose threads grow with its
# collectives fails the tests in minutes instead of a user's run after hours.
podPidsLimit: 4096
EOT

cat > "$state/kube-proxy.yaml" <<EOT
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: $state/kube-proxy.kubeconfig}
mode: iptables
clusterCIDR: $pod_cidr
hostnameOverride: $node
bindAddress: 0.0.0.0
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
conntrack: {maxPerCore: 0}   # leave the host's conntrack table size alone
nodePortAddresses: [primary]
EOT

cat > "$state/Corefile" <<EOT
cluster.local:53 in-addr.arpa:53 ip6.arpa:53 {
  bind $gateway
  errors
  kubernetes cluster.local in-addr.arpa ip6.arpa {
    kubeconfig $state/coredns.kubeconfig
    pods insecure
    ttl 5
    fallthrough in-addr.arpa ip6.arpa
  }
}
.:53 {
  bind $gateway
  # No upstream exists here: answer everything else at once instead of timing out.
  template ANY ANY {
    rcode NXDOMAIN
  }
}
EOT

#!/bin/bash
# The pod network of the offline kind node image, doing kindnetd's job (there is no kindnetd
# image offline) with Debian's CNI plugins, at boot and without the API: a node's pods get
# 10.244.<last octet of its eth0 IPv4>.0/24 on a bridge; the other nodes' subnets are routed
# to them (kind puts every node on one docker network as a.b.c.<n>); only traffic leaving the
# pod network is masqueraded, so pods see each other's real IPs. (A node's credentials may
# read only its own Node object, so spec.podCIDR of the others is out of reach; up.sh turns
# the controller-manager's allocation off so no spec.podCIDR contradicts this.)
set -euo pipefail
cluster_cidr=10.244.0.0/16   # kind's default podSubnet (hack/kind/up.sh keeps it)
ip4=
for _ in $(seq 100); do
  ip4=$(ip -4 -o addr show dev eth0 2>/dev/null | awk '{split($4, a, "/"); print a[1]; exit}')
  [ -n "$ip4" ] && break
  sleep 0.1
done
[ -n "$ip4" ] || { echo "mw-cni: eth0 has no IPv4 address" >&2; exit 1; }
IFS=. read -r a b c own <<<"$ip4"
subnet=10.244.$own.0/24

mkdir -p /etc/cni/net.d
cat > /etc/cni/net.d/10-multiworker.conflist <<CONF
{
  "cniVersion": "1.0.0",
  "name": "multiworker",
  "plugins": [
    {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false, "hairpinMode": true,
     "ipam": {"type": "host-local", "ranges": [[{"subnet": "$subnet"}]],
              "routes": [{"dst": "0.0.0.0/0"}]}},
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
CONF

# Node n (2..254; .1 is the docker network's gateway) owns 10.244.n.0/24.
for n in $(seq 2 254); do
  [ "$n" = "$own" ] || echo "route replace 10.244.$n.0/24 via $a.$b.$c.$n dev eth0 onlink"
done | ip -batch -

rule=(-s "$subnet" ! -d "$cluster_cidr" -j MASQUERADE)
iptables -t nat -C POSTROUTING "${rule[@]}" 2>/dev/null || iptables -t nat -A POSTROUTING "${rule[@]}"
echo "mw-cni: pod subnet $subnet on cni0; routes to 10.244.n.0/24 via $a.$b.$c.n"

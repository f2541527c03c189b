#!/usr/bin/env bash
# Installs the Debian packages the local cluster and image builds need, if any is missing.
set -euo pipefail
need=()
for pair in etcd:etcd-server containerd:containerd runc:runc iptables:iptables \
    debootstrap:debootstrap conntrack:conntrack openssl:openssl curl:curl ip:iproute2 \
    buildah:buildah; do
  command -v "${pair%%:*}" >/dev/null 2>&1 || need+=("${pair#*:}")
done
[ -x /usr/lib/cni/bridge ] || need+=(containernetworking-plugins)
[ ${#need[@]} -eq 0 ] && exit 0
echo "[cluster] installing Debian packages: ${need[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null

#!/usr/bin/env bash
# Generates the cluster's certificates and kubeconfigs with openssl (kept if present).
set -euo pipefail
source "$(dirname "$0")/lib.sh"
pki=$state/pki
mkdir -p "$pki"
cd "$pki"

[ -f ca.key ] || {
  openssl genrsa -out ca.key 2048 2>/dev/null
  openssl req -x509 -new -key ca.key -days 3650 -subj "/CN=multiworker-local-ca" -out ca.crt
}
[ -f sa.key ] || { openssl genrsa -out sa.key 2048 2>/dev/null; openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null; }

# cert NAME SUBJECT [SANS]: a CA-signed cert for a client or server.
cert() {
  local name=$1 subj=$2 sans=${3:-}
  [ -f "$name.crt" ] && return 0
  openssl genrsa -out "$name.key" 2048 2>/dev/null
  openssl req -new -key "$name.key" -subj "$subj" -out "$name.csr"
  local ext; ext=$(mktemp)
  if [ -n "$sans" ]; then
    printf 'subjectAltName=%s\nextendedKeyUsage=serverAuth,clientAuth\n' "$sans" > "$ext"
  else
    printf 'extendedKeyUsage=clientAuth\n' > "$ext"
  fi
  openssl x509 -req -in "$name.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -days 3650 \
    -extfile "$ext" -out "$name.crt" 2>/dev/null
  rm -f "$name.csr" "$ext"
}

cert apiserver "/CN=kube-apiserver" \
  "DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,DNS:localhost,IP:127.0.0.1,IP:$api_service_ip,IP:$gateway"
cert apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client"
cert admin "/O=system:masters/CN=multiworker-admin"
cert controller-manager "/CN=system:kube-controller-manager"
cert scheduler "/CN=system:kube-scheduler"
cert kubelet "/O=system:nodes/CN=system:node:$node"
cert kube-proxy "/CN=system:kube-proxy"
cert coredns "/CN=multiworker:coredns"
cert podgroup-controller "/CN=multiworker:podgroup-controller"   # gang.sh

# kubeconfig FILE CERT: a kubeconfig for one identity, replaced atomically (gang.sh runs this on
# a live cluster whose processes may be reading these files).
kubeconfig_for() {
  local file=$1 who=$2
  cat > "$file.tmp" <<KC
apiVersion: v1
kind: Config
clusters:
- name: multiworker-local
  cluster:
    server: https://127.0.0.1:$api_port
    certificate-authority-data: $(base64 -w0 ca.crt)
users:
- name: $who
  user:
    client-certificate-data: $(base64 -w0 "$who.crt")
    client-key-data: $(base64 -w0 "$who.key")
contexts:
- name: multiworker-local
  context: {cluster: multiworker-local, user: $who}
current-context: multiworker-local
KC
  chmod 600 "$file.tmp"
  mv "$file.tmp" "$file"
}
for who in controller-manager scheduler kubelet kube-proxy coredns podgroup-controller; do
  kubeconfig_for "$state/$who.kubeconfig" "$who"
done
kubeconfig_for "$kubeconfig" admin
chmod 600 "$state"/*.kubeconfig "$kubeconfig" ./*.key

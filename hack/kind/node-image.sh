#!/usr/bin/env bash
# Builds the kind node image offline and prints its reference,
# multiworker.local/kind-node:<Kubernetes version>-<key>: what `kind build node-image` makes,
# from Go modules and Debian packages instead of registries.
#   - root filesystem: debootstrap bookworm + systemd, Debian's containerd/runc/CNI plugins
#     (node-rootfs.sh), then the steps of kind's images/base/Dockerfile with the files of the
#     sigs.k8s.io/kind module at $KIND_VERSION, and the pod-network unit in node/ (no kindnetd);
#   - kubeadm, kubelet, kubectl and the control-plane images from the same pinned Kubernetes
#     build as the local cluster (hack/cluster/k8s-build), etcd and crictl from the modules in
#     etcd-build/ and crictl-build/, CoreDNS from the local cluster's build, pause from
#     images/pause; the images preloaded into the node's containerd under the names kubeadm
#     asks for.
# The key hashes every input, so a second run with nothing changed only checks that the engine
# holds the image (seconds). Needs root, a Docker engine (docker.sh up), Go and the Go proxy.
#   node-image.sh [--prepare]   --prepare: build the binaries and the root filesystem only (no
#                               engine needed), so CI can pay for them while another tier runs.
set -euo pipefail
prepare=0
case ${1:-} in
  "") ;;
  --prepare) prepare=1 ;;
  *) echo "usage: node-image.sh [--prepare]" >&2; exit 2 ;;
esac
# shellcheck source=hack/kind/lib.sh
source "$(dirname "$0")/lib.sh"
use_engine
crictl_version=v1.36.0
arch=$(dpkg --print-architecture)
export CGO_ENABLED=0

"$repo/hack/cluster/build-binaries.sh" >&2

# go_build OUT DIR PACKAGE [GO BUILD FLAGS...]: build PACKAGE in module DIR to OUT, once.
go_build() {
  local out=$1 dir=$2 pkg=$3; shift 3
  [ -x "$out" ] && return 0
  local t0=$SECONDS tmp; tmp=$(mktemp -d)
  log "building ${out##*/} from $pkg"
  (cd "$dir" && go build -trimpath "$@" -o "$tmp/out" "$pkg") || { rm -rf "$tmp"; die "building $pkg failed"; }
  mv "$tmp/out" "$out"; rm -rf "$tmp"
  log "built ${out##*/} in $((SECONDS - t0))s"
}

build_kubeadm() {
  local out=$bin/kubeadm-$K8S_VERSION v=${K8S_VERSION#v} pkg=k8s.io/component-base/version
  [ -x "$out" ] && return 0
  # The same module and version stamp as build-binaries.sh, in a copy: kubeadm may need
  # go.sum lines the other binaries do not, and the committed go.sum stays as it is.
  local mod; mod=$(mktemp -d)
  cp "$repo/hack/cluster/k8s-build/go.mod" "$repo/hack/cluster/k8s-build/go.sum" "$mod/"
  local ldflags="-s -w -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=${v%%.*}"
  ldflags+=" -X $pkg.gitMinor=$(echo "$v" | cut -d. -f2) -X $pkg.gitTreeState=clean"
  ldflags+=" -X $pkg.buildDate=1970-01-01T00:00:00Z -X k8s.io/client-go/pkg/version.gitVersion=$K8S_VERSION"
  GOFLAGS=-mod=mod go_build "$out" "$mod" k8s.io/kubernetes/cmd/kubeadm -ldflags "$ldflags"
  rm -rf "$mod"
}

build_etcd() { # VERSION (v3.x.y)
  local version=$1
  grep -q "go.etcd.io/etcd/server/v3 $version\b" "$here/etcd-build/go.mod" \
    || die "kubeadm $K8S_VERSION wants etcd $version, hack/kind/etcd-build pins another; run there:" \
      "go get go.etcd.io/etcd/server/v3@$version && go list -deps go.etcd.io/etcd/server/v3"
  GOFLAGS=-mod=readonly go_build "$bin/etcd-$version" "$here/etcd-build" go.etcd.io/etcd/server/v3 -ldflags "-s -w"
}

build_crictl() {
  grep -q "sigs.k8s.io/cri-tools $crictl_version\b" "$here/crictl-build/go.mod" \
    || die "hack/kind/crictl-build does not pin cri-tools $crictl_version"
  GOFLAGS=-mod=readonly go_build "$bin/crictl-$crictl_version" "$here/crictl-build" \
    sigs.k8s.io/cri-tools/cmd/crictl \
    -ldflags "-s -w -X sigs.k8s.io/cri-tools/pkg/version.Version=$crictl_version"
}

build_kubeadm
kubeadm=$bin/kubeadm-$K8S_VERSION
# The images kubeadm will ask the node's containerd for, e.g. registry.k8s.io/etcd:3.6.8-0.
mapfile -t wanted < <("$kubeadm" config images list --kubernetes-version "$K8S_VERSION" 2>/dev/null)
[ ${#wanted[@]} -ge 7 ] || die "kubeadm config images list gave: ${wanted[*]:-nothing}"
image_for() { printf '%s\n' "${wanted[@]}" | grep -E "/$1:" || die "kubeadm lists no $1 image"; }
etcd_ref=$(image_for etcd); etcd_tag=${etcd_ref##*:}
pause_ref=$(image_for pause)
# CoreDNS is the local cluster's build ($COREDNS_VERSION); up.sh tells kubeadm that tag.
coredns_ref=$(image_for coredns/coredns); coredns_ref=${coredns_ref%:*}:$COREDNS_VERSION
build_etcd "v${etcd_tag%-*}"
build_crictl
rootfs=$("$here/node-rootfs.sh")
[ "$prepare" = 0 ] || { log "node image: binaries and root filesystem ready"; exit 0; }

kind_mod=$(go mod download -json "sigs.k8s.io/kind@$KIND_VERSION" | jq -r .Dir)
kind_files=$kind_mod/images/base/files
[ -d "$kind_files" ] || die "no images/base/files in sigs.k8s.io/kind@$KIND_VERSION ($kind_mod)"
binaries=("$kubeadm" "$bin/kubelet-$K8S_VERSION" "$bin/kubectl-$K8S_VERSION"
  "$bin/kube-apiserver-$K8S_VERSION" "$bin/kube-controller-manager-$K8S_VERSION"
  "$bin/kube-scheduler-$K8S_VERSION" "$bin/kube-proxy-$K8S_VERSION"
  "$bin/etcd-v${etcd_tag%-*}" "$bin/coredns" "$bin/crictl-$crictl_version")
# Binaries are named by version and built once: name, size and time identify them.
key=$(hash_text "$(cat "$kind_work/node-rootfs.key")" "$KIND_VERSION" "$arch" "${wanted[@]}" \
  "$coredns_ref" "$(stat -L -c '%n %s %Y' "${binaries[@]}")" \
  "$(cd "$repo" && sha256sum hack/kind/node-image.sh hack/kind/node/* images/pause/pause.c \
      hack/images/mkarchive.py | cut -c1-64)")
ref=$node_repo:$K8S_VERSION-${key:0:12}
if docker image inspect "$ref" >/dev/null 2>&1; then
  log "node image $ref: up to date"
  echo "$ref"; exit 0
fi

t0=$SECONDS
work=$(mktemp -d "$kind_work/node.XXXXXX")
root=$work/root
ctrd_pid=
cleanup() {
  [ -n "$ctrd_pid" ] && kill "$ctrd_pid" 2>/dev/null && wait "$ctrd_pid" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
log "node image $ref: building (work dir $work)"
mkdir -p "$root"
tar --numeric-owner --xattrs -xf "$rootfs" -C "$root"

# --- kind's base image steps, on Debian's containerd 1.6 --------------------------------
install -m 0755 "$kind_files"/usr/local/bin/* "$root/usr/local/bin/"
mkdir -p "$root/kind/bin" "$root/LICENSES" "$root/etc/containerd" "$root/etc/default" \
  "$root/etc/sysctl.d" "$root/etc/systemd/system/kubelet.service.d" "$root/etc/kubernetes/manifests" \
  "$root/opt/cni/bin"
install -m 0644 "$kind_files/kind/README.txt" "$root/kind/"
install -m 0755 "$kind_files"/kind/bin/* "$here/node/mw-cni.sh" "$root/kind/bin/"
install -m 0644 "$kind_files"/LICENSES/* "$root/LICENSES/"
install -m 0644 "$kind_files/etc/crictl.yaml" "$root/etc/"
install -m 0644 "$kind_files/etc/default/kubelet" "$root/etc/default/"
install -m 0644 "$kind_files"/etc/sysctl.d/* "$root/etc/sysctl.d/"
install -m 0644 "$kind_files"/etc/systemd/system/*.service "$kind_files"/etc/systemd/system/*.slice \
  "$here/node/mw-cni.service" "$root/etc/systemd/system/"
rm -f "$root/etc/systemd/system/containerd-fuse-overlayfs.service"  # no fuse-overlayfs here
install -m 0644 "$kind_files"/etc/systemd/system/kubelet.service.d/* "$root/etc/systemd/system/kubelet.service.d/"
# kind's containerd config, less the fuse-overlayfs snapshotter (rootless only), with the
# pause image kubeadm lists, and oom_score_adj kept within containerd's own (root may lack
# CAP_SYS_RESOURCE, so it cannot lower it).
python3 - "$kind_files/etc/containerd/config.toml" "$root/etc/containerd/config.toml" "$pause_ref" <<'PY'
import re, sys
src, dst, pause = sys.argv[1:]
text = open(src).read()
text, proxies = re.subn(r'\[proxy_plugins\]\n(#[^\n]*\n)?\[proxy_plugins\."fuse-overlayfs"\]\n(  [^\n]*\n)+', "", text)
text, sandbox = re.subn(r'sandbox_image = "[^"]*"', f'sandbox_image = "{pause}"', text)
text, oom = re.subn(r"restrict_oom_score_adj = false", "restrict_oom_score_adj = true", text)
if (proxies, sandbox, oom) != (1, 1, 1):
    sys.exit(f"kind's containerd config changed shape: {proxies=} {sandbox=} {oom=}")
open(dst, "w").write(text)
PY
ln -sf /usr/bin/containerd "$root/usr/local/bin/containerd"
ln -sf /usr/bin/ctr "$root/usr/local/bin/ctr"
for f in "$root"/usr/lib/cni/*; do ln -sf "/usr/lib/cni/${f##*/}" "$root/opt/cni/bin/"; done
chroot "$root" ctr oci spec \
  | jq '.hooks.createContainer[.hooks.createContainer | length] |= . + {"path": "/kind/bin/mount-product-files.sh"}' \
  | jq 'del(.process.rlimits)' > "$root/etc/containerd/cri-base.json"
find "$root/lib/systemd/system/sysinit.target.wants/" -name systemd-tmpfiles-setup.service -delete
rm -f "$root"/lib/systemd/system/multi-user.target.wants/* "$root"/etc/systemd/system/*.wants/* \
  "$root"/lib/systemd/system/local-fs.target.wants/* "$root"/lib/systemd/system/sockets.target.wants/*udev* \
  "$root"/lib/systemd/system/sockets.target.wants/*initctl* "$root"/lib/systemd/system/basic.target.wants/*
echo "ReadKMsg=no" >> "$root/etc/systemd/journald.conf"
ln -sf /usr/lib/systemd/systemd "$root/sbin/init"
chroot "$root" systemctl enable kubelet.service containerd.service undo-mount-hacks.service \
  mw-cni.service >/dev/null 2>&1
chroot "$root" systemctl mask systemd-binfmt.service >/dev/null 2>&1
# A node's systemd applies these at boot, and some (fs.protected_*, kernel.pid_max) are not
# namespaced: they would change the host's kernel. kind's own /etc/sysctl.d (per-netns) stays.
rm -f "$root"/usr/lib/sysctl.d/* "$root/etc/sysctl.conf"

# --- Kubernetes ----------------------------------------------------------------------------
install -m 0755 "$kubeadm" "$root/usr/bin/kubeadm"
install -m 0755 "$bin/kubelet-$K8S_VERSION" "$root/usr/bin/kubelet"
install -m 0755 "$bin/kubectl-$K8S_VERSION" "$root/usr/bin/kubectl"
install -m 0755 "$bin/crictl-$crictl_version" "$root/usr/local/bin/crictl"
printf '%s' "$K8S_VERSION" > "$root/kind/version"

# The control-plane images, single-layer archives (mkarchive.py: same inputs, same image ID).
images=$work/images
mkdir -p "$images"
# image NAME REF LAYER_DIR [mkarchive options]: archive LAYER_DIR as REF.
image() {
  local name=$1 image_ref=$2 dir=$3; shift 3
  tar --numeric-owner --owner=0 --group=0 --mtime=@0 --sort=name -C "$dir" -cf "$images/$name.layer" .
  python3 "$repo/hack/images/mkarchive.py" --layer "$images/$name.layer" --tag "$image_ref" \
    --arch "$arch" "$@" --out "$images/$name.tar" >/dev/null
  rm -f "$images/$name.layer"
}
static_image() { # NAME REF BINARY [mkarchive options]: one static binary in /usr/local/bin
  local name=$1 image_ref=$2 binary=$3 dir=$work/layers/$1; shift 3
  mkdir -p "$dir/usr/local/bin" "$dir/etc" "$dir/tmp"; chmod 1777 "$dir/tmp"
  install -m 0755 "$binary" "$dir/usr/local/bin/$name"
  image "$name" "$image_ref" "$dir" --env PATH=/usr/local/bin:/usr/bin:/bin "$@"
}
for c in kube-apiserver kube-controller-manager kube-scheduler; do
  static_image "$c" "$(image_for "$c")" "$bin/$c-$K8S_VERSION"
done
static_image etcd "$etcd_ref" "$bin/etcd-v${etcd_tag%-*}"
static_image coredns "$coredns_ref" "$bin/coredns" --entrypoint '["/usr/local/bin/coredns"]'
command -v gcc >/dev/null 2>&1 || die "gcc is missing (Debian packages gcc libc6-dev)"
gcc -static -Os -s -o "$work/pause" "$repo/images/pause/pause.c"
mkdir -p "$work/layers/pause"; install -m 0755 "$work/pause" "$work/layers/pause/pause"
image pause "$pause_ref" "$work/layers/pause" --entrypoint '["/pause"]' --user 65535:65535
# kube-proxy (iptables mode) needs iptables and conntrack userspace: the node's root without
# the node-only parts.
tar --numeric-owner -C "$root" -cf "$images/kube-proxy.layer" \
  --exclude=./usr/bin/containerd\* --exclude=./usr/bin/ctr --exclude=./usr/sbin/runc \
  --exclude=./usr/lib/cni --exclude=./opt --exclude=./kind --exclude=./usr/bin/kube\* \
  --exclude=./usr/lib/systemd --exclude=./usr/local/bin --exclude=./usr/share/zoneinfo .
mkdir -p "$work/layers/kube-proxy/usr/local/bin"
install -m 0755 "$bin/kube-proxy-$K8S_VERSION" "$work/layers/kube-proxy/usr/local/bin/kube-proxy"
tar --numeric-owner --owner=0 --group=0 -C "$work/layers/kube-proxy" -rf "$images/kube-proxy.layer" ./usr/local/bin/kube-proxy
python3 "$repo/hack/images/mkarchive.py" --layer "$images/kube-proxy.layer" \
  --tag "$(image_for kube-proxy)" --arch "$arch" \
  --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin --out "$images/kube-proxy.tar" >/dev/null
rm -f "$images/kube-proxy.layer"

# Preload: the host's containerd (the same Debian 1.6 as the node's) writes the content
# store straight into the node's /var/lib/containerd; the node unpacks on first use.
command -v containerd >/dev/null 2>&1 || die "containerd is missing (Debian package containerd)"
cat > "$work/containerd.toml" <<EOF
version = 2
root = "$root/var/lib/containerd"
state = "$work/ctrd-state"
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = "$work/ctrd.sock"
EOF
containerd --config "$work/containerd.toml" > "$work/containerd.log" 2>&1 &
ctrd_pid=$!
ctr_() { ctr --address "$work/ctrd.sock" -n k8s.io "$@"; }
wait_until 30 "the build containerd" ctr_ version
for tar in "$images"/*.tar; do
  ctr_ images import --all-platforms --no-unpack "$tar" >/dev/null \
    || die "importing ${tar##*/} into the node's containerd failed (log: $work/containerd.log)"
done
have=$(ctr_ images ls -q)
for want in "${wanted[@]}"; do
  [[ $want == */coredns/coredns:* ]] && want=$coredns_ref
  grep -qx "$want" <<<"$have" || die "$want is missing from the node's containerd after the import"
done
kill "$ctrd_pid"; wait "$ctrd_pid" 2>/dev/null || true; ctrd_pid=
rm -rf "$images" "$work/layers"

log "node image $ref: importing into the engine ($(du -sh "$root" | cut -f1))"
# (kind's own image also has STOPSIGNAL SIGRTMIN+3, which `docker import` cannot set: a
# `docker stop` of a node takes its 10 s timeout; kind itself deletes nodes with SIGKILL.)
tar --numeric-owner --xattrs -C "$root" -c . | docker import \
  --change 'ENV container=docker' \
  --change 'ENTRYPOINT ["/usr/local/bin/entrypoint", "/sbin/init"]' - "$ref" >/dev/null
# Older builds of this image only take space in the engine.
docker images --format '{{.Repository}}:{{.Tag}}' "$node_repo" | grep -vx "$ref" \
  | xargs -r docker rmi >/dev/null 2>&1 || true
log "node image $ref: built in $((SECONDS - t0))s"
echo "$ref"

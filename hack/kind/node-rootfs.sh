#!/usr/bin/env bash
# Builds the Debian bookworm root filesystem of the offline kind node image: debootstrap
# minbase + hack/kind/node/packages.txt, bookworm-updates and -security applied, docs and apt
# lists removed. Written as one tarball, $MW_CACHE/kind/node-rootfs.tar, and rebuilt only when
# this script, the package list or the mirrors change (or with --force). Prints its path.
# Needs root (debootstrap, chroot) and the Debian mirror; about 1.5 minutes on 2 cores.
set -euo pipefail
# shellcheck source=hack/kind/lib.sh
source "$(dirname "$0")/lib.sh"

suite=bookworm
mirror=${MW_DEBIAN_MIRROR:-http://deb.debian.org/debian}
security=${MW_DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}
arch=$(dpkg --print-architecture)
packages_file=$here/node/packages.txt
out=$kind_work/node-rootfs.tar
key_file=$kind_work/node-rootfs.key

key=$(hash_text "$(sha256sum "$0" "$packages_file" | cut -c1-64)" "$suite $arch $mirror $security")
fresh() { [ -s "$out" ] && [ "$(cat "$key_file" 2>/dev/null)" = "$key" ]; }
if [ "${1:-}" != --force ] && fresh; then echo "$out"; exit 0; fi
[ "$(id -u)" = 0 ] || die "building the node root filesystem needs root (debootstrap, chroot)"
command -v debootstrap >/dev/null 2>&1 || {
  log "installing debootstrap"
  DEBIAN_FRONTEND=noninteractive apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap >/dev/null
}
mkdir -p "$kind_work"
exec 9>"$kind_work/.rootfs.lock"
flock 9
if [ "${1:-}" != --force ] && fresh; then echo "$out"; exit 0; fi  # built while we waited

work=$(mktemp -d "$kind_work/rootfs.XXXXXX")
root=$work/root
cleanup() {
  umount "$root/proc" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

t0=$SECONDS
packages=$(sed -e 's/#.*//' "$packages_file" | xargs | tr ' ' ,)
log "node rootfs: debootstrap $suite ($arch, minbase + $packages) from $mirror"
debootstrap --variant=minbase --arch="$arch" --include="$packages" "$suite" "$root" "$mirror" \
  > "$work/debootstrap.log" 2>&1 || { tail -20 "$work/debootstrap.log" >&2; die "debootstrap failed"; }

rm -f "$root/etc/apt/sources.list"
cat > "$root/etc/apt/sources.list.d/debian.sources" <<EOF
Types: deb
URIs: $mirror
Suites: $suite $suite-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: $security
Suites: $suite-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
printf '#!/bin/sh\nexit 101\n' > "$root/usr/sbin/policy-rc.d"   # no service starts in the chroot
chmod +x "$root/usr/sbin/policy-rc.d"
log "node rootfs: applying $suite-updates and $suite-security"
cp /etc/resolv.conf "$root/etc/resolv.conf"
mount -t proc proc "$root/proc"
chroot "$root" /usr/bin/env DEBIAN_FRONTEND=noninteractive sh -ec \
  'apt-get update -qq && apt-get -y -qq upgrade && apt-get clean' > "$work/upgrade.log" 2>&1 \
  || { tail -20 "$work/upgrade.log" >&2; die "apt-get upgrade in the node root failed"; }
umount "$root/proc"
rm -f "$root/usr/sbin/policy-rc.d"

rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/* "$root"/usr/share/man/* \
  "$root"/usr/share/info/* "$root"/usr/share/locale/* "$root"/tmp/* "$root"/var/tmp/*
find "$root/usr/share/doc" -mindepth 1 ! -name copyright ! -type d -delete
find "$root/usr/share/doc" -mindepth 1 -type d -empty -delete
find "$root/var/log" -type f -delete
: > "$root/etc/resolv.conf"; : > "$root/etc/hostname"; : > "$root/etc/machine-id"
for f in usr/bin/containerd usr/sbin/runc usr/lib/cni/bridge usr/sbin/iptables lib/systemd/systemd; do
  [ -e "$root/$f" ] || die "$f is missing from the node root"
done
tar --numeric-owner --xattrs --sort=name -C "$root" -cf "$out.tmp" .
mv "$out.tmp" "$out"
echo "$key" > "$key_file"
log "node rootfs: $(du -h "$out" | cut -f1) in $((SECONDS - t0))s"
echo "$out"

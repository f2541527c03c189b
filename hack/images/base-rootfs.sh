#!/usr/bin/env bash
# Builds the Debian bookworm root filesystem of multiworker.local/base:bookworm with
# `debootstrap --variant=minbase` plus images/base/packages.txt, security updates applied, docs
# and apt lists removed, and writes it as one tarball: $MW_CACHE/images/base-rootfs.tar.
# Cached by content: rebuilt only when this script, the package list, the mirror or the suite
# change (or with --force). Prints the tarball's path. Needs root (debootstrap, chroot).
set -euo pipefail
source "$(dirname "$0")/lib.sh"

suite=bookworm
mirror=${MW_DEBIAN_MIRROR:-http://deb.debian.org/debian}
security=${MW_DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}
arch=$(dpkg --print-architecture)
packages_file=$repo/images/base/packages.txt
out=$archives/base-rootfs.tar

key=$(hash_text "$(sha256sum "$0" "$packages_file" | cut -c1-64)" "$suite $arch $mirror $security")
if [ "${1:-}" != --force ] && fresh base-rootfs "$key"; then
  echo "$out"; exit 0
fi
[ "$(id -u)" = 0 ] || die "debootstrap needs root"
lock_images
fresh base-rootfs "$key" && [ "${1:-}" != --force ] && { echo "$out"; exit 0; }  # built while we waited
need debootstrap debootstrap

packages=$(sed -e 's/#.*//' "$packages_file" | xargs | tr ' ' ,)
work=$(mktemp -d "$archives/base-rootfs.XXXXXX")
root=$work/root
cleanup() {
  umount "$root/proc" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

t0=$SECONDS
log "base: debootstrap $suite ($arch, minbase + $packages) from $mirror"
debootstrap --variant=minbase --arch="$arch" --include="$packages" "$suite" "$root" "$mirror" \
  > "$work/debootstrap.log" 2>&1 || { tail -20 "$work/debootstrap.log" >&2; die "debootstrap failed"; }

# The sources a derived image's apt-get sees, as in Debian's own container images.
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
# Keep later installs lean too: no docs, man pages or translations; no recommends; no .deb cache.
cat > "$root/etc/dpkg/dpkg.cfg.d/multiworker-slim" <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
path-include /usr/share/locale/locale.alias
path-exclude /usr/share/lintian/*
EOF
cat > "$root/etc/apt/apt.conf.d/90multiworker-slim" <<'EOF'
APT::Install-Recommends "false";
APT::Install-Suggests "false";
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
EOF
printf '#!/bin/sh\nexit 101\n' > "$root/usr/sbin/policy-rc.d"   # no services start in the chroot
chmod +x "$root/usr/sbin/policy-rc.d"

log "base: applying $suite-updates and $suite-security"
cp /etc/resolv.conf "$root/etc/resolv.conf"
mount -t proc proc "$root/proc"
chroot "$root" /usr/bin/env DEBIAN_FRONTEND=noninteractive sh -ec \
  'apt-get update -qq && apt-get -y -qq upgrade && apt-get clean' > "$work/upgrade.log" 2>&1 \
  || { tail -20 "$work/upgrade.log" >&2; die "apt-get upgrade in the new root failed"; }
umount "$root/proc"

log "base: trimming"
rm -f "$root/usr/sbin/policy-rc.d"
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/* "$root"/var/cache/debconf/*-old \
  "$root"/var/lib/dpkg/*-old "$root"/usr/share/man/* "$root"/usr/share/info/* \
  "$root"/usr/share/lintian "$root"/tmp/* "$root"/var/tmp/*
find "$root/usr/share/doc" -mindepth 1 ! -name copyright ! -type d -delete
find "$root/usr/share/doc" -mindepth 1 -type d -empty -delete
find "$root/usr/share/locale" -mindepth 1 -maxdepth 1 ! -name locale.alias -exec rm -rf {} +
find "$root/var/log" -type f -delete
# Per-container files: the runtime provides them.
: > "$root/etc/resolv.conf"; : > "$root/etc/hostname"; : > "$root/etc/machine-id"

for f in usr/bin/tini usr/bin/python3; do [ -x "$root/$f" ] || die "$f is missing from the new root"; done
tar --numeric-owner --xattrs --sort=name -C "$root" -cf "$out.tmp" .
mv "$out.tmp" "$out"
record base-rootfs "$key"
log "base: root filesystem $(human_size "$out") in $((SECONDS - t0))s"
echo "$out"

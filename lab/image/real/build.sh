#!/usr/bin/env bash
# Builds the lab's real test OS image, a small Debian 12 system, from Debian packages:
#
#   lab/image/real/build.sh OUTPUT_DIR
#
# Result: OUTPUT_DIR/machinery-real.qcow2, a BIOS-bootable disk with an MBR partition table: syslinux, the
# kernel and its initramfs on a small FAT partition, the root file system (systemd, cloud-init, sshd, Python,
# the QEMU guest agent) on an ext4 partition. OUTPUT_DIR/machinery-real.recipe records the hash of the recipe
# that built it; a second run with an unchanged recipe returns at once. The absolute path of the image is the
# last line on stdout.
#
# Runs as root on Debian 12 and needs mmdebstrap, fdisk (sfdisk), e2fsprogs, mtools, syslinux, syslinux-common
# and qemu-utils. Packages come from Debian's archive only. Nothing is mounted on the machine or attached to a
# loop device: mmdebstrap runs in a mount namespace of its own, the file systems are written into the image
# file at their partitions' offsets.
set -euo pipefail

IMAGE_NAME=machinery-real
SUITE=bookworm
MIRROR=http://deb.debian.org/debian
SECURITY_MIRROR=http://deb.debian.org/debian-security
# The disk's virtual size; a qcow2 stores only what is written, and a machine's root_size can make it larger
# (cloud-init then grows the root partition and its file system on first boot).
DISK_MIB=2048
# The first partition starts at 1 MiB, as partitioning tools align it.
ALIGN_SECTORS=2048
MBR_BIN=/usr/lib/syslinux/mbr/mbr.bin

RECIPE_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)

usage() {
    echo "usage: $0 OUTPUT_DIR" >&2
    exit 2
}

log() {
    echo "build.sh (real): $*" >&2
}

die() {
    log "error: $*"
    exit 1
}

# Every file of this recipe except its documentation, with its relative path.
recipe_hash() {
    (
        cd "$RECIPE_DIR"
        find . -type f ! -name '*.md' -print0 | LC_ALL=C sort -z | xargs -0 sha256sum
    ) | sha256sum | cut -d ' ' -f 1
}

is_cached() {
    [ -f "$IMAGE" ] && [ -f "$RECIPE_FILE" ] && [ "$(cat "$RECIPE_FILE")" = "$HASH" ]
}

packages() {
    sed -e 's/#.*//' "$RECIPE_DIR/packages.list" | tr -s ' \t\n' '\n' | grep -v '^$' | paste -sd , -
}

# The root file system, in a directory. mmdebstrap mounts /proc, /sys and /dev into the tree while it installs;
# a private mount namespace keeps those mounts away from the machine even if the build is interrupted.
build_root() {
    local started=$SECONDS
    log "mmdebstrap $SUITE: $(packages)"
    MACHINERY_ROOT_UUID=$ROOT_UUID unshare --mount --propagation private \
        mmdebstrap --mode=root --variant=minbase --include="$(packages)" \
        --dpkgopt='path-exclude=/usr/share/man/*' \
        --dpkgopt='path-exclude=/usr/share/info/*' \
        --dpkgopt='path-exclude=/usr/share/locale/*' \
        --dpkgopt='path-include=/usr/share/locale/locale.alias' \
        --dpkgopt='path-exclude=/usr/share/doc/*' \
        --dpkgopt='path-include=/usr/share/doc/*/copyright' \
        --setup-hook="$RECIPE_DIR/setup.sh" \
        --customize-hook="$RECIPE_DIR/customize.sh" \
        "$SUITE" "$ROOT" \
        "deb $MIRROR $SUITE main" \
        "deb $MIRROR $SUITE-updates main" \
        "deb $SECURITY_MIRROR $SUITE-security main" >&2
    VMLINUZ=$(find "$ROOT/boot" -maxdepth 1 -name 'vmlinuz-*' | sort | tail -n 1)
    [ -n "$VMLINUZ" ] || die "no kernel in /boot"
    KVER=${VMLINUZ##*/vmlinuz-}
    INITRD="$ROOT/boot/initrd.img-$KVER"
    [ -f "$INITRD" ] || die "no initramfs for kernel $KVER in /boot"
    log "root file system: $(du -sm "$ROOT" | cut -f 1) MiB in $((SECONDS - started)) s (kernel $KVER)"
}

# An MBR disk: syslinux's boot code, a bootable FAT partition (syslinux, kernel, initramfs) and an ext4 root
# partition filling the rest.
build_disk() {
    local raw="$WORK/disk.raw" boot_mib root_mib boot_start root_start content_mib
    boot_mib=$(( ($(stat -c %s "$VMLINUZ") + $(stat -c %s "$INITRD")) / 1048576 + 16 ))
    [ "$boot_mib" -ge 64 ] || boot_mib=64
    boot_start=$ALIGN_SECTORS
    root_start=$(( boot_start + boot_mib * 2048 ))
    root_mib=$(( DISK_MIB - boot_mib - ALIGN_SECTORS / 2048 ))
    content_mib=$(du -sm "$ROOT" | cut -f 1)
    [ $(( content_mib * 5 / 4 + 64 )) -le "$root_mib" ] ||
        die "the root file system ($content_mib MiB) does not fit a $root_mib MiB partition"

    truncate -s "${DISK_MIB}M" "$raw"
    sfdisk --quiet --no-reread --no-tell-kernel "$raw" >&2 <<EOF
label: dos
unit: sectors
start=$boot_start, size=$(( boot_mib * 2048 )), type=e, bootable
start=$root_start, type=83
EOF
    # The MBR's boot code (its first 440 bytes; the partition table follows) starts the active partition's
    # boot sector, which syslinux writes.
    dd if="$MBR_BIN" of="$raw" bs=440 count=1 conv=notrunc status=none

    local boot="$raw@@$(( boot_start * 512 ))"
    mformat -i "$boot" -T $(( boot_mib * 2048 )) -H "$boot_start" -h 64 -s 32 -v BOOT ::
    syslinux --install --offset $(( boot_start * 512 )) "$raw"
    mcopy -i "$boot" "$VMLINUZ" ::/vmlinuz
    mcopy -i "$boot" "$INITRD" ::/initrd.img
    sed "s/@ROOT_UUID@/$ROOT_UUID/" "$RECIPE_DIR/syslinux.cfg" >"$WORK/syslinux.cfg"
    mcopy -i "$boot" "$WORK/syslinux.cfg" ::/syslinux.cfg

    mkfs.ext4 -q -F -L root -U "$ROOT_UUID" -d "$ROOT" -E "offset=$(( root_start * 512 ))" "$raw" "${root_mib}M"

    local started=$SECONDS
    qemu-img convert -c -f raw -O qcow2 "$raw" "$WORK/$IMAGE_NAME.qcow2"
    log "qcow2 compressed in $((SECONDS - started)) s"
}

[ $# -eq 1 ] || usage
mkdir -p "$1"
OUTPUT_DIR=$(cd "$1" && pwd -P)
IMAGE="$OUTPUT_DIR/$IMAGE_NAME.qcow2"
RECIPE_FILE="$OUTPUT_DIR/$IMAGE_NAME.recipe"
HASH=$(recipe_hash)

if is_cached; then
    echo "$IMAGE"
    exit 0
fi

# One build at a time per output directory; a waiter finds the result cached.
exec 9>"$OUTPUT_DIR/.$IMAGE_NAME.lock"
flock 9
if is_cached; then
    echo "$IMAGE"
    exit 0
fi

[ "$(id -u)" -eq 0 ] || die "must run as root"
for tool in mmdebstrap unshare sfdisk mkfs.ext4 mformat mcopy syslinux qemu-img flock; do
    command -v "$tool" >/dev/null ||
        die "$tool not found (apt-get install mmdebstrap fdisk e2fsprogs mtools syslinux syslinux-common qemu-utils)"
done
[ -f "$MBR_BIN" ] || die "$MBR_BIN not found (apt-get install syslinux-common)"

WORK=$(mktemp -d "$OUTPUT_DIR/.$IMAGE_NAME.build.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
# apt downloads as the unprivileged _apt user, which must reach the tree's package cache.
chmod 0755 "$WORK"
ROOT="$WORK/root"
ROOT_UUID=$(cat /proc/sys/kernel/random/uuid)

STARTED=$SECONDS
log "building $IMAGE (recipe $HASH)"
build_root
build_disk

# Drop the old hash first so no reader pairs it with the new image.
rm -f "$RECIPE_FILE"
mv -f "$WORK/$IMAGE_NAME.qcow2" "$IMAGE"
echo "$HASH" >"$WORK/recipe"
mv -f "$WORK/recipe" "$RECIPE_FILE"
log "image: $(du -h --apparent-size "$IMAGE" | cut -f 1) in $((SECONDS - STARTED)) s (kernel $KVER)"
echo "$IMAGE"

#!/usr/bin/env bash
# Builds the lab's Secure Boot test image from the busybox test image and Debian's signed boot chain:
#
#   lab/image/secureboot/build.sh OUTPUT_DIR TEST_IMAGE
#
# Result: OUTPUT_DIR/machinery-secureboot.qcow2, an unpartitioned FAT disk (as the test image) that UEFI firmware
# boots through its removable-media path: \EFI\BOOT\BOOTX64.EFI is Debian's shim (signed by Microsoft's UEFI CA),
# which starts grubx64.efi (Debian's signed GRUB) beside it, which reads \EFI\debian\grub.cfg and starts the test
# image's kernel (Debian's cloud kernel, signed by Debian) with its busybox initramfs. Under Secure Boot every
# step is verified, and the kernel says so ("secureboot: Secure boot enabled"). OUTPUT_DIR/machinery-secureboot.recipe
# records the recipe's and the test image's hash; a second run with both unchanged returns at once. The image's
# absolute path is the last line on stdout.
#
# Runs as root on Debian 12; needs apt-get, dpkg, mtools and qemu-utils. Packages come from Debian's archive only.
set -euo pipefail

IMAGE_NAME=machinery-secureboot
DISK_MIB=48
SHIM=usr/lib/shim/shimx64.efi.signed
GRUB=usr/lib/grub/x86_64-efi-signed/grubx64.efi.signed
RECIPE_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)

log() {
    echo "build.sh (secureboot): $*" >&2
}

die() {
    log "error: $*"
    exit 1
}

[ $# -eq 2 ] || { echo "usage: $0 OUTPUT_DIR TEST_IMAGE" >&2; exit 2; }
mkdir -p "$1"
OUTPUT_DIR=$(cd "$1" && pwd -P)
TEST_IMAGE=$2
[ -f "$TEST_IMAGE" ] || die "no test image at $TEST_IMAGE"
IMAGE="$OUTPUT_DIR/$IMAGE_NAME.qcow2"
RECIPE_FILE="$OUTPUT_DIR/$IMAGE_NAME.recipe"
HASH=$( (sha256sum "$RECIPE_DIR/build.sh" "$RECIPE_DIR/grub.cfg" | cut -d ' ' -f 1; sha256sum <"$TEST_IMAGE") |
    sha256sum | cut -d ' ' -f 1)

if [ -f "$IMAGE" ] && [ "$(cat "$RECIPE_FILE" 2>/dev/null)" = "$HASH" ]; then
    echo "$IMAGE"
    exit 0
fi
exec 9>"$OUTPUT_DIR/.$IMAGE_NAME.lock"
flock 9
if [ -f "$IMAGE" ] && [ "$(cat "$RECIPE_FILE" 2>/dev/null)" = "$HASH" ]; then
    echo "$IMAGE"
    exit 0
fi
for tool in apt-get dpkg mformat mmd mcopy qemu-img; do
    command -v "$tool" >/dev/null || die "$tool not found (apt-get install mtools qemu-utils)"
done

WORK=$(mktemp -d "$OUTPUT_DIR/.$IMAGE_NAME.build.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
log "building $IMAGE"
(
    cd "$WORK"
    # Root downloading into a directory _apt cannot write to is expected here.
    if ! apt-get download -q -o APT::Sandbox::User=root shim-signed grub-efi-amd64-signed >&2; then
        apt-get update -q >&2
        apt-get download -q -o APT::Sandbox::User=root shim-signed grub-efi-amd64-signed >&2
    fi
)
for deb in "$WORK"/*.deb; do
    dpkg -x "$deb" "$WORK/chain"
done
[ -f "$WORK/chain/$SHIM" ] || die "shim-signed has no $SHIM"
[ -f "$WORK/chain/$GRUB" ] || die "grub-efi-amd64-signed has no $GRUB"

# the kernel and initramfs of the test image, from its FAT file system
qemu-img convert -f qcow2 -O raw "$TEST_IMAGE" "$WORK/test.raw"
mcopy -i "$WORK/test.raw" ::/vmlinuz ::/initrd.gz "$WORK/"

raw="$WORK/disk.raw"
truncate -s "${DISK_MIB}M" "$raw"
mformat -i "$raw" -T $((DISK_MIB * 2048)) -h 64 -s 32 -v MACHINERY ::
mmd -i "$raw" ::/EFI ::/EFI/BOOT ::/EFI/debian
mcopy -i "$raw" "$WORK/chain/$SHIM" ::/EFI/BOOT/BOOTX64.EFI
mcopy -i "$raw" "$WORK/chain/$GRUB" ::/EFI/BOOT/grubx64.efi
# Debian's signed GRUB reads its configuration from /EFI/debian (its built-in prefix)
mcopy -i "$raw" "$RECIPE_DIR/grub.cfg" ::/EFI/debian/grub.cfg
mcopy -i "$raw" "$WORK/vmlinuz" ::/vmlinuz
mcopy -i "$raw" "$WORK/initrd.gz" ::/initrd.gz
qemu-img convert -c -f raw -O qcow2 "$raw" "$WORK/$IMAGE_NAME.qcow2"

rm -f "$RECIPE_FILE"
mv -f "$WORK/$IMAGE_NAME.qcow2" "$IMAGE"
echo "$HASH" >"$WORK/recipe"
mv -f "$WORK/recipe" "$RECIPE_FILE"
echo "$IMAGE"

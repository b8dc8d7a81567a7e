#!/usr/bin/env bash
# Builds the lab's idle image:
#
#   lab/image/idle/build.sh OUTPUT_DIR
#
# Result: OUTPUT_DIR/machinery-idle.qcow2, a 24 MiB disk whose boot sector (idle.S) prints MACHINERY-IDLE on the
# serial console and then waits, halted, for the ACPI power button, which powers it off. A guest of this image
# costs nothing after a boot of a few milliseconds, where the busybox image's boot takes about 7 CPU seconds
# under TCG: integration tests that only read what libvirt shows of a running machine use it. It has no
# network, no guest agent and no hot-plug support. The absolute path of the image is the last line on stdout;
# OUTPUT_DIR/machinery-idle.recipe records the recipe's hash, and an unchanged recipe returns at once.
#
# Needs binutils (as, ld) and qemu-utils.
set -euo pipefail

IMAGE_NAME=machinery-idle
# The busybox image's virtual size, so sizes that tests compare with the image's (a root_size below it) mean the
# same with either image; a qcow2 stores only the boot sector.
DISK_MIB=24
RECIPE_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)

[ $# -eq 1 ] || { echo "usage: $0 OUTPUT_DIR" >&2; exit 2; }
mkdir -p "$1"
OUTPUT_DIR=$(cd "$1" && pwd -P)
IMAGE="$OUTPUT_DIR/$IMAGE_NAME.qcow2"
RECIPE_FILE="$OUTPUT_DIR/$IMAGE_NAME.recipe"
HASH=$(cd "$RECIPE_DIR" && cat build.sh idle.S | sha256sum | cut -d ' ' -f 1)

if [ -f "$IMAGE" ] && [ -f "$RECIPE_FILE" ] && [ "$(cat "$RECIPE_FILE")" = "$HASH" ]; then
    echo "$IMAGE"
    exit 0
fi
for tool in as ld qemu-img; do
    command -v "$tool" >/dev/null || { echo "build.sh (idle): $tool not found (apt-get install binutils qemu-utils)" >&2; exit 1; }
done

WORK=$(mktemp -d "$OUTPUT_DIR/.$IMAGE_NAME.build.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
as --32 -o "$WORK/idle.o" "$RECIPE_DIR/idle.S"
ld -m elf_i386 -e start -Ttext 0x7c00 --oformat binary -o "$WORK/boot.bin" "$WORK/idle.o"
[ "$(stat -c %s "$WORK/boot.bin")" -eq 512 ] || { echo "build.sh (idle): the boot sector is not 512 bytes" >&2; exit 1; }
truncate -s "${DISK_MIB}M" "$WORK/disk.raw"
dd if="$WORK/boot.bin" of="$WORK/disk.raw" conv=notrunc status=none
qemu-img convert -f raw -O qcow2 "$WORK/disk.raw" "$WORK/$IMAGE_NAME.qcow2"

# A concurrent build writes the same bytes; each moves its own file into place whole.
rm -f "$RECIPE_FILE"
mv -f "$WORK/$IMAGE_NAME.qcow2" "$IMAGE"
echo "$HASH" >"$WORK/recipe"
mv -f "$WORK/recipe" "$RECIPE_FILE"
echo "$IMAGE"

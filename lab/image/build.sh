#!/usr/bin/env bash
# Builds the lab's test OS image from Debian packages:
#
#   lab/image/build.sh OUTPUT_DIR
#
# Result: OUTPUT_DIR/machinery-test.qcow2, a small BIOS-bootable disk (FAT +
# syslinux, a Debian kernel and a busybox initramfs whose /init reports on
# the serial console). OUTPUT_DIR/machinery-test.recipe records the hash of
# the recipe that built it; a second run with an unchanged recipe returns at
# once. The absolute path of the image is the last line on stdout.
#
# Runs as root on Debian 12 and needs apt, binutils (readelf), mtools, syslinux
# and qemu-utils.
# Nothing is installed, mounted or attached to a loop device.
set -euo pipefail

IMAGE_NAME=machinery-test
# Debian's cloud flavour: its kernel decompresses itself from LZ4, where the
# generic flavour's XZ costs about 5 s of CPU per boot under TCG (the suite
# boots well over a hundred guests). It is built without AHCI
# (CONFIG_SATA_AHCI is not set): the NoCloud seed is on a virtio-scsi cdrom,
# which it reads, and a SATA disk stays invisible to this image.
KERNEL_METAPACKAGE=linux-image-cloud-amd64
# Lower bound for the FAT volume; the kernel and initramfs need about 16 MiB.
MIN_DISK_MIB=24
# The QEMU guest agent, a dynamically linked program: its package and every
# package it depends on are unpacked, and only the shared libraries the
# program loads (read from the ELF headers) go into the initramfs.
AGENT_PACKAGE=qemu-guest-agent
AGENT_BINARY=usr/sbin/qemu-ga

RECIPE_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)

usage() {
    echo "usage: $0 OUTPUT_DIR" >&2
    exit 2
}

log() {
    echo "build.sh: $*" >&2
}

die() {
    log "error: $*"
    exit 1
}

# Every file of the recipe except its documentation, with its relative path,
# so renaming a file also changes the hash. real/ and idle/ are the recipes of
# the other images (real/build.sh, idle/build.sh, secureboot/build.sh), not of
# this one.
recipe_hash() {
    (
        cd "$RECIPE_DIR"
        find . \( -path ./real -o -path ./idle -o -path ./secureboot \) -prune -o -type f ! -name '*.md' -print0 |
            LC_ALL=C sort -z | xargs -0 sha256sum
    ) | sha256sum | cut -d ' ' -f 1
}

is_cached() {
    [ -f "$IMAGE" ] && [ -f "$RECIPE_FILE" ] && [ "$(cat "$RECIPE_FILE")" = "$HASH" ]
}

# The kernel ABI package (e.g. linux-image-6.1.0-56-amd64) changes with every
# kernel update; the metapackage always depends on the current one.
resolve_kernel_package() {
    apt-cache depends "$KERNEL_METAPACKAGE" 2>/dev/null |
        awk '$1 ~ /^\|?Depends:$/ && $2 ~ /^linux-image-[0-9]/ { print $2; exit }'
}

download() {
    # Root downloading into a directory _apt cannot write to is expected here.
    apt-get download -q -o APT::Sandbox::User=root "$@" >&2
}

fetch_packages() {
    local kernel_package
    kernel_package=$(resolve_kernel_package)
    if [ -z "$kernel_package" ]; then
        apt-get update -q >&2
        kernel_package=$(resolve_kernel_package)
        [ -n "$kernel_package" ] || die "apt-cache cannot resolve $KERNEL_METAPACKAGE"
    fi
    log "packages: $kernel_package busybox-static"
    mkdir -p "$WORK/debs"
    (
        cd "$WORK/debs"
        if ! download "$kernel_package" busybox-static; then
            apt-get update -q >&2
            download "$kernel_package" busybox-static
        fi
    )
    fetch_agent
    dpkg -x "$WORK"/debs/linux-image-*.deb "$WORK/kernel"
    dpkg -x "$WORK"/debs/busybox-static_*.deb "$WORK/busybox"
    # Debian 13's packages install under /usr only (usr/bin/busybox, usr/lib/modules), Debian 12's do not.
    BUSYBOX="$WORK/busybox/bin/busybox"
    [ -x "$BUSYBOX" ] || BUSYBOX="$WORK/busybox/usr/bin/busybox"
    [ -x "$BUSYBOX" ] || die "busybox-static has no bin/busybox nor usr/bin/busybox"
    if [ ! -d "$WORK/kernel/lib/modules" ] && [ -d "$WORK/kernel/usr/lib/modules" ]; then
        mkdir -p "$WORK/kernel/lib"
        ln -s ../usr/lib/modules "$WORK/kernel/lib/modules"
    fi
    VMLINUZ=$(echo "$WORK"/kernel/boot/vmlinuz-*)
    [ -f "$VMLINUZ" ] || die "$kernel_package has no /boot/vmlinuz-*"
    KVER=${VMLINUZ##*/vmlinuz-}
    [ -d "$WORK/kernel/lib/modules/$KVER" ] || die "$kernel_package has no modules for $KVER"
    # Debian 13's modules are xz-compressed (.ko.xz), which busybox's depmod and modprobe do not read: unpack them
    # (only where the package compresses them).
    find "$WORK/kernel/lib/modules/$KVER/" -name '*.ko.xz' -print0 | xargs -0 -r -n 64 -P "$(nproc)" xz -d
}

# The agent's package and its dependencies, recursively (real packages only:
# virtual ones are printed as <name>), unpacked together into $WORK/agent.
fetch_agent() {
    local packages deb
    packages=$(apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts --no-breaks \
        --no-replaces --no-enhances --no-pre-depends "$AGENT_PACKAGE" 2>/dev/null |
        awk '/^[a-z0-9]/ { print $1 }' | LC_ALL=C sort -u)
    [ -n "$packages" ] || die "apt-cache cannot resolve $AGENT_PACKAGE"
    log "agent packages: $(tr '\n' ' ' <<<"$packages")"
    mkdir -p "$WORK/agent-debs" "$WORK/agent"
    # shellcheck disable=SC2086 # one package name per word
    (cd "$WORK/agent-debs" && download $packages)
    for deb in "$WORK"/agent-debs/*.deb; do
        dpkg -x "$deb" "$WORK/agent"
    done
    [ -x "$WORK/agent/$AGENT_BINARY" ] || die "$AGENT_PACKAGE has no $AGENT_BINARY"
}

# Where the unpacked packages hold a shared library (by its soname).
find_library() {
    local dir
    for dir in lib/x86_64-linux-gnu usr/lib/x86_64-linux-gnu lib64 lib usr/lib; do
        if [ -e "$WORK/agent/$dir/$1" ]; then
            echo "$WORK/agent/$dir/$1"
            return 0
        fi
    done
    return 1
}

# Copies the agent and, transitively, the libraries it needs (DT_NEEDED) and
# the dynamic loader into the initramfs; the loader finds them in its default
# directory /lib/x86_64-linux-gnu, so no ld.so.cache is needed.
install_agent() {
    local root="$WORK/initramfs" libdir="$WORK/initramfs/lib/x86_64-linux-gnu" file name found interp
    local -a queue
    declare -A seen
    mkdir -p "$libdir" "$root/lib64" "$root/usr/sbin"
    cp "$WORK/agent/$AGENT_BINARY" "$root/$AGENT_BINARY"
    interp=$(readelf -l "$root/$AGENT_BINARY" | sed -n 's/.*Requesting program interpreter: \(.*\)]/\1/p')
    [ -n "$interp" ] || die "$AGENT_BINARY names no program interpreter"
    queue=("$root/$AGENT_BINARY")
    while [ ${#queue[@]} -gt 0 ]; do
        file=${queue[0]}
        queue=("${queue[@]:1}")
        for name in $(readelf -d "$file" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'); do
            [ -n "${seen[$name]:-}" ] && continue
            seen[$name]=1
            found=$(find_library "$name") || die "library $name (needed by ${file##*/}) is in no unpacked package"
            cp -L "$found" "$libdir/$name"
            queue+=("$libdir/$name")
        done
    done
    found=$(find_library "${interp##*/}") || die "the loader $interp is in no unpacked package"
    cp -L "$found" "$libdir/${interp##*/}"
    [ "$interp" = "/lib/x86_64-linux-gnu/${interp##*/}" ] || ln -sf "/lib/x86_64-linux-gnu/${interp##*/}" "$root$interp"
    log "agent: ${AGENT_BINARY##*/} with ${#seen[@]} libraries ($(du -sh "$libdir" | cut -f 1))"
}

# Module names treat '-' and '_' alike; compare them in one spelling.
normalize_module() {
    echo "${1//-/_}"
}

# Writes the wanted modules that are loadable (not built in) to
# $WORK/modules.load and copies them, with everything they depend on, into
# the initramfs tree.
collect_modules() {
    local kernel_modules="$WORK/kernel/lib/modules/$KVER"
    local target="$WORK/initramfs/lib/modules/$KVER"
    local name wanted path dep line

    # The package ships no modules.dep; busybox writes the same format its
    # modprobe reads in the guest.
    "$BUSYBOX" depmod -b "$WORK/kernel" "$KVER"

    # "path: dep dep ..." keyed by normalized module name.
    declare -A deps_of path_of
    while IFS= read -r line; do
        path=${line%%:*}
        name=${path##*/}
        name=$(normalize_module "${name%.ko*}")
        path_of[$name]=$path
        deps_of[$name]=${line#*:}
    done <"$kernel_modules/modules.dep"

    declare -A builtin
    while IFS= read -r path; do
        name=${path##*/}
        builtin[$(normalize_module "${name%.ko*}")]=1
    done <"$kernel_modules/modules.builtin"

    declare -A files
    : >"$WORK/modules.load"
    while read -r wanted _; do
        case "$wanted" in '' | '#'*) continue ;; esac
        name=$(normalize_module "$wanted")
        if [ -n "${builtin[$name]:-}" ]; then
            log "module $name: built in"
            continue
        fi
        [ -n "${path_of[$name]:-}" ] || die "module $name: not in kernel $KVER"
        echo "$name" >>"$WORK/modules.load"
        files[${path_of[$name]}]=1
        for dep in ${deps_of[$name]}; do
            files[$dep]=1
        done
    done <"$RECIPE_DIR/modules.list"

    for path in "${!files[@]}"; do
        mkdir -p "$target/$(dirname "$path")"
        cp "$kernel_modules/$path" "$target/$path"
    done
    cp "$kernel_modules/modules.builtin" "$kernel_modules/modules.order" "$target/"
    "$BUSYBOX" depmod -b "$WORK/initramfs" "$KVER"
    log "modules: $(tr '\n' ' ' <"$WORK/modules.load")(${#files[@]} files with dependencies)"
}

build_initramfs() {
    local root="$WORK/initramfs" applet
    mkdir -p "$root"/{bin,sbin,usr/bin,usr/sbin,dev,proc,sys,run,tmp,mnt,etc/machinery,lib/modules}
    cp "$BUSYBOX" "$root/bin/busybox"
    # Applets as symlinks, at the paths busybox itself lists.
    while IFS= read -r applet; do
        [ "$applet" = bin/busybox ] || [ -e "$root/$applet" ] || ln -s /bin/busybox "$root/$applet"
    done < <("$BUSYBOX" --list-full)

    collect_modules
    install_agent
    cp "$WORK/modules.load" "$root/etc/machinery/modules"

    cp -R "$RECIPE_DIR/rootfs/." "$root/"
    chmod 0755 "$root/init" "$root/etc/udhcpc/default.script" "$root/etc/acpi/PWRF/00000080"
    # The agent runs in the initramfs as it would on the guest's root: check that it loads there.
    chroot "$root" /usr/sbin/qemu-ga --version >/dev/null || die "qemu-ga does not start in the initramfs"
    # The kernel opens /dev/console before /init runs; where mknod is not
    # allowed the kernel's built-in initramfs still provides one.
    mknod -m 0600 "$root/dev/console" c 5 1 2>/dev/null || true

    (
        cd "$root"
        find . -mindepth 1 | LC_ALL=C sort | "$BUSYBOX" cpio -o -H newc -R 0:0 2>/dev/null
    ) | gzip -9 -n >"$WORK/initrd.gz"
}

build_disk() {
    local raw="$WORK/disk.raw" content_mib disk_mib
    content_mib=$(( ($(stat -c %s "$VMLINUZ") + $(stat -c %s "$WORK/initrd.gz")) / 1048576 + 2 ))
    disk_mib=$(( content_mib > MIN_DISK_MIB ? content_mib : MIN_DISK_MIB ))
    truncate -s "${disk_mib}M" "$raw"
    # An unpartitioned ("superfloppy") FAT: the BIOS runs its boot sector,
    # which syslinux replaces with its own.
    mformat -i "$raw" -T $((disk_mib * 2048)) -h 64 -s 32 -v MACHINERY ::
    syslinux --install "$raw"
    mcopy -i "$raw" "$VMLINUZ" ::/vmlinuz
    mcopy -i "$raw" "$WORK/initrd.gz" ::/initrd.gz
    mcopy -i "$raw" "$RECIPE_DIR/syslinux.cfg" ::/syslinux.cfg
    qemu-img convert -c -f raw -O qcow2 "$raw" "$WORK/$IMAGE_NAME.qcow2"
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
for tool in apt-get apt-cache dpkg readelf chroot mformat mcopy syslinux qemu-img gzip flock xz; do
    command -v "$tool" >/dev/null || die "$tool not found (apt-get install mtools syslinux syslinux-common qemu-utils binutils xz-utils)"
done

WORK=$(mktemp -d "$OUTPUT_DIR/.$IMAGE_NAME.build.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

log "building $IMAGE (recipe $HASH)"
fetch_packages
build_initramfs
build_disk

# Drop the old hash first so no reader pairs it with the new image.
rm -f "$RECIPE_FILE"
mv -f "$WORK/$IMAGE_NAME.qcow2" "$IMAGE"
echo "$HASH" >"$WORK/recipe"
mv -f "$WORK/recipe" "$RECIPE_FILE"
log "image: $(du -h --apparent-size "$IMAGE" | cut -f 1) (kernel $KVER)"
echo "$IMAGE"

#!/usr/bin/env bash
# Debian 13 (trixie) roots made from Debian packages, kept under DIR (the Makefile's .cache/debian13):
#   DIR/base     what a fresh Debian 13 machine of this project's kind starts with, made with mmdebstrap: the
#                important packages, ca-certificates, make and git (the README's "apt-get install -y make"). What
#                the machine's own base adds to reach the package registries (local CA certificates, pip's
#                settings and environment) is carried over, so apt and pip inside answer the network as here.
#   DIR/machine  a copy of base that the README's commands run in (made again by `readme`: a fresh machine)
#   DIR/lab      a root like base with the lab's daemons installed (libvirt 11, QEMU 10, dnsmasq): lab.py --newer
#                runs pools' daemons with its /usr (lab/README.md); the Makefile keeps it in a directory of the
#                machine's instead (DEBIAN13_LAB_DIR), shared by its clones
#
#   root.sh build DIR          make DIR/base unless its stamp says it is complete
#   root.sh run DIR CMD...     run CMD (bash -c) in DIR/machine as root, at /src/machinery
#   root.sh readme DIR         a fresh DIR/machine, then the README's two commands in it: make demo (then
#                              make demo-down) and make test, each timed; labs left up inside are taken down
#   root.sh lab DIR            make DIR/lab unless its stamp says it is complete; prints its path
#
# Entering mounts, in a mount namespace of its own, the kernel's file systems and /dev (with /dev/kvm and
# /dev/net/tun), this repository at /src/machinery, and over its .venv, .lab and .cache directories of the root's
# own, so the working tree's Debian 12 environment and labs are never touched. The network is the machine's.
set -euo pipefail
usage="usage: root.sh build DIR | run DIR CMD... | readme DIR | lab DIR"
action=${1:?$usage}
dir=${2:?$usage}
shift 2
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
SUITE=trixie
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
SECURITY_MIRROR=${DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}
# the lab's daemons and what they run: the packages of the Makefile's deps that lab.py --newer takes from here
LAB_PACKAGES="libvirt-daemon-system libvirt-daemon-driver-qemu libvirt-daemon-driver-interface libvirt-clients
    qemu-system-x86 qemu-utils dnsmasq-base iproute2 iptables ovmf"

log() { echo "debian13: $*" >&2; }

# make_root NAME PACKAGES: DIR/NAME by mmdebstrap, the important packages and PACKAGES (comma-separated)
make_root() {
    local root=$dir/$1
    local stamp=$root/.machinery-debian13
    if [ -f "$stamp" ]; then
        return 0
    fi
    # One build at a time (the clones of a machine share the lab's root, the Makefile's DEBIAN13_LAB_DIR); a waiter
    # finds the root made. A made root is never made again here: running labs use it.
    local lock
    exec {lock}>"$dir/.$1.lock"
    flock "$lock"
    if [ -f "$stamp" ]; then
        exec {lock}>&-
        return 0
    fi
    command -v mmdebstrap >/dev/null || {
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends mmdebstrap
    }
    rm -rf "$root"
    mkdir -p "$(dirname "$root")"
    local started=$SECONDS
    log "mmdebstrap $SUITE into $root"
    # a mount namespace of its own keeps mmdebstrap's mounts from the machine even if the build is interrupted
    unshare --mount --propagation private \
        mmdebstrap --mode=root --variant=important --include="$2" \
        --dpkgopt='path-exclude=/usr/share/man/*' \
        --dpkgopt='path-exclude=/usr/share/doc/*' \
        --dpkgopt='path-include=/usr/share/doc/*/copyright' \
        "$SUITE" "$root" \
        "deb $MIRROR $SUITE main" \
        "deb $MIRROR $SUITE-updates main" \
        "deb $SECURITY_MIRROR $SUITE-security main" >&2
    # the machine's own way to the registries: its local CA certificates and pip's settings
    if compgen -G '/usr/local/share/ca-certificates/*.crt' >/dev/null; then
        cp /usr/local/share/ca-certificates/*.crt "$root/usr/local/share/ca-certificates/"
        chroot "$root" update-ca-certificates >/dev/null 2>&1
    fi
    if [ -f /etc/pip.conf ]; then
        cp /etc/pip.conf "$root/etc/pip.conf"
    fi
    cp /etc/resolv.conf "$root/etc/resolv.conf" 2>/dev/null || true
    mkdir -p "$root/src/machinery" "$root/var/lib/machinery/venv" "$root/var/lib/machinery/lab" \
        "$root/var/lib/machinery/cache"
    echo "$SUITE $(date -u +%Y-%m-%dT%H:%M:%SZ)" > "$stamp"
    log "built in $((SECONDS - started)) s, $(du -sh "$root" | cut -f1)"
    exec {lock}>&-
}

# The mounts, made in a mount namespace of this command's own (they vanish with it), then chroot.
build() {
    make_root base ca-certificates,make,git
}

# a copy of base, made unless there (or made again with "again")
copy() {
    local root=$dir/$1
    if [ "${2:-}" = again ] || [ ! -f "$root/.machinery-debian13" ]; then
        build
        rm -rf "$root"
        cp -a "$dir/base" "$root"
    fi
}

enter() {
    copy machine
    local root=$dir/machine
    cp /etc/resolv.conf "$root/etc/resolv.conf" 2>/dev/null || true
    local pip_env=()
    local name
    for name in $(compgen -e | grep '^PIP_' || true); do
        case "${!name}" in /opt/*) continue ;; esac  # the machine's own wheel directories are not in the root
        pip_env+=("$name=${!name}")
    done
    # shellcheck disable=SC2016  # expanded by the inner shell
    unshare --mount --propagation private -- /bin/bash -euo pipefail -c '
        root=$1 repo=$2; shift 2
        # the root a mount point of its own: the lab (unshare --propagation private) needs / to be one
        mount --bind "$root" "$root"
        mount --rbind /dev "$root/dev"
        mount -t proc proc "$root/proc"
        mount --rbind /sys "$root/sys"
        mount -t tmpfs -o mode=0755 tmpfs "$root/run"
        mount -t tmpfs -o mode=1777 tmpfs "$root/tmp"
        mount --bind "$repo" "$root/src/machinery"
        # a git worktree keeps its repository elsewhere (.git is a file naming it): that too, at its own path
        if [ -f "$repo/.git" ]; then
            common=$(git -C "$repo" rev-parse --path-format=absolute --git-common-dir)
            mkdir -p "$root$common"
            mount --bind "$common" "$root$common"
        fi
        for dir in venv:.venv lab:.lab cache:.cache; do
            mkdir -p "$repo/${dir#*:}"
            mount --bind "$root/var/lib/machinery/${dir%%:*}" "$root/src/machinery/${dir#*:}"
        done
        exec chroot "$root" /usr/bin/env -i HOME=/root TERM=dumb LANG=C.UTF-8 \
            PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "$@"
    ' enter "$root" "$repo" "${pip_env[@]}" /bin/bash -c "cd /src/machinery && $*"
}

# The README's commands as one script run inside; its labs live in the root's own .lab.
readme() {
    copy machine again
    # shellcheck disable=SC2016  # expanded inside the root
    enter '
        status=0
        for step in "make demo" "make demo-down" "make test"; do
            started=$SECONDS
            echo "debian13: $step" >&2
            if ! $step; then status=1; fi
            echo "debian13: $step took $((SECONDS - started)) s (rc $status)" >&2
            [ $status -eq 0 ] || break
        done
        for lab in .lab .lab/test1 .lab/test2 .lab/test3 .lab/molecule-test; do
            [ -f "$lab/lab.json" ] && python3 lab/lab.py down --dir "$lab" >/dev/null 2>&1
        done
        exit $status'
}

lab() {
    # shellcheck disable=SC2086  # one word per package
    make_root lab "ca-certificates,$(printf '%s,' $LAB_PACKAGES | sed 's/,$//')"
    echo "$dir/lab"
}

case "$action" in
    build) build ;;
    run) enter "$@" ;;
    readme) readme ;;
    lab) lab ;;
    *) echo "$usage" >&2; exit 2 ;;
esac

#!/usr/bin/env bash
# The execution environment's base image made from Debian packages: a Debian 13 (trixie) root by mmdebstrap
# (Python 3.13 and its venv module, nothing else but what apt needs) written as a tarball, then imported into
# podman as localhost/machinery-ee-base:trixie. The execution environment's Python is a virtual environment of
# Debian's, /opt/ee, first in PATH: pip installs into it what ansible-builder asks (Debian's own Python refuses pip
# installs and disables ensurepip, which ansible-builder installs pip with). ansible-builder builds the execution environment on it
# (extensions/awx/execution-environment-debian.yml, docs/awx.md).
#
#   base.sh WORKDIR    makes WORKDIR/machinery-ee-base.tar unless there, and imports it unless podman has it
#
# What this machine adds to reach the package registries (local CA certificates, pip's settings) is carried over,
# so apt and pip in the build answer the network as they do here.
set -euo pipefail
work=${1:?usage: base.sh WORKDIR}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
IMAGE=localhost/machinery-ee-base:trixie
SUITE=trixie
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
SECURITY_MIRROR=${DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}
tarball=$work/machinery-ee-base.tar
mkdir -p "$work"

if [ ! -f "$tarball" ]; then
    started=$SECONDS
    hooks=$(mktemp -d)
    trap 'rm -rf "$hooks"' EXIT
    # shellcheck disable=SC2016  # expanded by mmdebstrap's hook shell ($1 is the root)
    {
        echo 'set -e'
        echo "install -m 0755 '$here/apt-as-dnf' \"\$1/usr/local/sbin/apt-as-dnf\""
        if compgen -G '/usr/local/share/ca-certificates/*.crt' >/dev/null; then
            echo "cp /usr/local/share/ca-certificates/*.crt \"\$1/usr/local/share/ca-certificates/\""
            echo 'chroot "$1" update-ca-certificates >/dev/null 2>&1'
        fi
        [ -f /etc/pip.conf ] && echo "cp /etc/pip.conf \"\$1/etc/pip.conf\""
        echo 'chroot "$1" python3 -m venv /opt/ee'
        echo 'rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*.bin'
    } > "$hooks/customize.sh"
    unshare --mount --propagation private \
        mmdebstrap --mode=root --format=tar --variant=minbase --include=python3,python3-venv,ca-certificates \
        --dpkgopt='path-exclude=/usr/share/man/*' \
        --dpkgopt='path-exclude=/usr/share/doc/*' \
        --dpkgopt='path-include=/usr/share/doc/*/copyright' \
        --dpkgopt='path-exclude=/usr/share/locale/*' \
        --customize-hook="sh $hooks/customize.sh \"\$1\"" \
        "$SUITE" "$tarball.part" \
        "deb $MIRROR $SUITE main" \
        "deb $MIRROR $SUITE-updates main" \
        "deb $SECURITY_MIRROR $SUITE-security main" >&2
    mv "$tarball.part" "$tarball"
    echo "ee base: $tarball in $((SECONDS - started)) s, $(du -h "$tarball" | cut -f1)" >&2
fi
if ! podman image exists "$IMAGE"; then
    podman import --change 'ENV PATH=/opt/ee/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'CMD ["/bin/bash"]' "$tarball" "$IMAGE" >/dev/null
fi
echo "$IMAGE"

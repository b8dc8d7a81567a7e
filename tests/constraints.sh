#!/usr/bin/env bash
# Prints constraints.txt as this machine installs it. libvirt-python builds against the machine's libvirt headers
# and knows only the API of its own release and older ones: the pinned release (the oldest the collection supports,
# for Debian 12's libvirt 9.0) cannot build against a newer libvirt (Debian 13's 11.3). On a machine whose libvirt
# is newer than the pin, the pin becomes the binding of the machine's libvirt release, as distributions pair them.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
pinned=$(sed -n 's/^libvirt-python==//p' "$repo/constraints.txt")
installed=$(pkg-config --modversion libvirt 2>/dev/null || echo "$pinned")
wanted=$pinned
if [ "$(printf '%s\n%s\n' "${pinned%.*}" "${installed%.*}" | sort -V | tail -n 1)" != "${pinned%.*}" ]; then
    wanted=${installed%.*}.0
fi
sed "s/^libvirt-python==.*/libvirt-python==$wanted/" "$repo/constraints.txt"

#!/bin/sh
# mmdebstrap setup hook of the real test image: runs outside the chroot before any package is installed, with
# the root directory as $1. What must be in place when the packages' maintainer scripts run goes here.
set -eu

root=${1:?usage: setup.sh ROOT}

# The kernel's postinst builds the initramfs: it must not look for a resume (hibernation) device, which does
# not exist in the guests and which initramfs-tools would otherwise guess from the build machine.
mkdir -p "$root/etc/initramfs-tools/conf.d"
echo RESUME=none >"$root/etc/initramfs-tools/conf.d/resume"

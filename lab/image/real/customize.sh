#!/bin/sh
# mmdebstrap customize hook of the real test image: runs outside the chroot once every package is installed,
# with the root directory as $1 and MACHINERY_ROOT_UUID (the ext4 root's UUID) in the environment.
#
# It makes the tree a template for many machines: nothing that must differ between two guests (machine id,
# ssh host keys, hostname) stays in it; cloud-init and systemd create them on each guest's first boot.
set -eu

root=${1:?usage: customize.sh ROOT}
uuid=${MACHINERY_ROOT_UUID:?MACHINERY_ROOT_UUID is not set}
recipe=$(cd "$(dirname "$0")" && pwd -P)

cp -R "$recipe/rootfs/." "$root/"

printf 'UUID=%s / ext4 rw,discard,errors=remount-ro 0 1\n' "$uuid" >"$root/etc/fstab"

# mmdebstrap copies the build machine's name and resolver in; the guest gets both from cloud-init and DHCP.
echo localhost >"$root/etc/hostname"
printf '127.0.0.1 localhost\n::1 localhost ip6-localhost ip6-loopback\n' >"$root/etc/hosts"
rm -f "$root/etc/resolv.conf"

# An empty machine-id means "first boot": systemd generates one per guest.
: >"$root/etc/machine-id"
rm -f "$root/var/lib/dbus/machine-id"
rm -f "$root"/etc/ssh/ssh_host_*

# The guests have no way out of the lab's network: no daily apt runs that could only time out. And no
# e2scrub, which looks for LVM snapshots (there is no LVM) and keeps the one TCG vCPU busy for a minute of boot.
for unit in apt-daily.timer apt-daily-upgrade.timer e2scrub_all.timer e2scrub_reap.service; do
    ln -sfn /dev/null "$root/etc/systemd/system/$unit"
done

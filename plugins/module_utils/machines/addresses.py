# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A machine's addresses: fixed DHCP reservations on its networks, and waiting for the lease a guest was granted."""

from __future__ import annotations

import time

from ansible_collections.machinery.compute.plugins.module_utils.core import capabilities as cap
from ansible_collections.machinery.compute.plugins.module_utils.core import connection as lv
from ansible_collections.machinery.compute.plugins.module_utils.core import elements
from ansible_collections.machinery.compute.plugins.module_utils.core.errors import LibvirtFailure, MachineryError, ValidationError
from ansible_collections.machinery.compute.plugins.module_utils.machines.machine_status import PoolView

POLL = 0.5


def network_hosts(conn, network):
    """The DHCP host entries of a libvirt network [{mac, ip, name}] (none when it is gone)."""
    net = lv.lookup_network(conn, network)
    if net is None:
        return []
    return elements.read_network(elements.parse(net.XMLDesc(lv.libvirt.VIR_NETWORK_XML_INACTIVE)))["dhcp_hosts"]


def observe_reservations(conn, record):
    """Replace the fixed addresses the record lists by what the networks hold for the NICs' MACs: the network
    is the truth (a reservation removed by hand shows as missing and is made again)."""
    hosts = {}
    for nic in record.get("spec", {}).get("network_interfaces") or []:
        if not nic.get("network"):
            continue
        if nic["network"] not in hosts:
            hosts[nic["network"]] = {(host.get("mac") or "").lower(): host.get("ip")
                                     for host in network_hosts(conn, nic["network"])}
        held = hosts[nic["network"]].get(nic["mac"].lower())
        if held or nic.get("ip_address"):
            nic["ip_address"] = held


def reserved_nics(record):
    """The NICs of a record with a fixed address on a libvirt network."""
    return [nic for nic in (record or {}).get("spec", {}).get("network_interfaces") or []
            if nic.get("network") and nic.get("ip_address")]


def _update_network(ctx, nic, command, entry):
    net = ctx.network(nic["network"])
    if net is None:
        return
    flags = lv.libvirt.VIR_NETWORK_UPDATE_AFFECT_CONFIG
    if net.isActive():
        flags |= lv.libvirt.VIR_NETWORK_UPDATE_AFFECT_LIVE
    try:
        net.update(command, lv.libvirt.VIR_NETWORK_SECTION_IP_DHCP_HOST, -1, entry, flags)
    except lv.libvirt.libvirtError as exc:
        raise LibvirtFailure("cannot update the DHCP reservations of network %s: %s"
                             % (nic["network"], lv.describe(exc)), "network_interfaces") from None


def reserve_address(ctx, nic, machine):
    """A DHCP host entry for the NIC's MAC on its network (live and persistent); the machine's name is the
    entry's host name unless another entry has it (a second NIC of the machine on the network)."""
    hosts = MachineHosts(ctx, nic["network"])
    name = machine if machine not in hosts.names() else None
    _update_network(ctx, nic, lv.libvirt.VIR_NETWORK_UPDATE_COMMAND_ADD_LAST,
                    cap.host_entry(nic["mac"], nic["ip_address"], name))


def release_address(ctx, nic):
    """Remove every DHCP host entry of the NIC's MAC from its network."""
    for host in MachineHosts(ctx, nic["network"]).of(nic["mac"]):
        _update_network(ctx, nic, lv.libvirt.VIR_NETWORK_UPDATE_COMMAND_DELETE,
                        cap.host_entry(host["mac"], host["ip"], host.get("name")))


class MachineHosts:
    """The DHCP host entries of one network, read once."""

    def __init__(self, ctx, network):
        self.hosts = network_hosts(ctx.conn, network)

    def names(self):
        return {host.get("name") for host in self.hosts if host.get("name")}

    def of(self, mac):
        return [host for host in self.hosts if (host.get("mac") or "").lower() == mac.lower()]


def lease_expiries(ctx, nics):
    """{(network, mac): expiry time} of the DHCP leases the networks list for ``nics`` now, read just before a
    guest boots (or a NIC is plugged in), for ``wait_for_address``.

    dnsmasq keeps a lease until it expires (an hour by default) when its guest goes away without releasing it,
    and a machine's MACs derive from its name: a machine deleted and created again, or stopped and started, finds
    its predecessor's lease still listed before its own guest has even booted. The guest's DHCP request renews
    that lease, which moves its expiry time later; that is how the wait tells the new guest's lease apart."""
    view = PoolView(ctx)
    found = {}
    for nic in nics or []:
        if nic.get("network") and nic.get("mac"):
            expiry = view.lease_expiry(nic["network"], nic["mac"])
            if expiry:
                found[(nic["network"], nic["mac"].lower())] = expiry
    return found


def wait_for_address(ctx, dom, name, nics, timeout, earlier_leases=None):
    """Until one of ``nics`` (on libvirt networks) has a DHCP lease; with ``earlier_leases`` (``lease_expiries``
    read before the guest booted) one granted or renewed since."""
    nics = [nic for nic in nics or [] if nic.get("network")]
    if not nics:
        raise ValidationError("wait: address needs a network interface on a libvirt network", "wait")
    earlier_leases = earlier_leases or {}
    deadline = time.monotonic() + timeout
    book = PoolView(ctx)

    def leased(nic):
        addresses = book.addresses(nic["network"], nic["mac"], earlier_leases.get((nic["network"],
                                                                                   nic["mac"].lower())))
        # a NIC with a fixed address counts once its lease is that address (a lease from before the
        # reservation changed may still be listed)
        return nic["ip_address"] in addresses if nic.get("ip_address") else bool(addresses)

    while True:
        if any(leased(nic) for nic in nics):
            return
        if not dom.isActive():
            raise MachineryError("%s stopped while waiting for an address" % name, "wait")
        if time.monotonic() > deadline:
            raise MachineryError("%s got no DHCP address within %ss" % (name, timeout), "wait_timeout")
        time.sleep(POLL)
        book.refresh()

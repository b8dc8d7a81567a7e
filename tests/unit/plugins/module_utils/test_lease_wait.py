# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""wait: address and the leases dnsmasq keeps for a guest that is gone: a machine created again (its MACs derive
from its name) must wait for its own guest's lease, not return at once with its predecessor's."""

from __future__ import annotations

import libvirt
import pytest

from ansible_collections.machinery.compute.plugins.module_utils.machines import addresses
from ansible_collections.machinery.compute.plugins.module_utils.core.errors import MachineryError
from ansible_collections.machinery.compute.plugins.module_utils.machines.machine_status import PoolView

from conftest import FakeDomain

MAC = "52:54:00:9a:5d:38"


class FakeNetwork:
    """A libvirt network whose lease table changes as ``tables`` says, one table a read."""

    def __init__(self, *tables):
        self.tables = list(tables)
        self.reads = 0

    def isActive(self):  # noqa: N802 (libvirt's name)
        return True

    def DHCPLeases(self):  # noqa: N802
        self.reads += 1
        return self.tables[min(self.reads, len(self.tables)) - 1]


class FakeContext:
    def __init__(self, net):
        self.net = net

    def network(self, name):
        return self.net if name == "machinery" else None


def running():
    return FakeDomain("inv-a", state=libvirt.VIR_DOMAIN_RUNNING)


def lease(expiry, address="192.168.101.71", mac=MAC):
    return {"mac": mac.upper(), "ipaddr": address, "expirytime": expiry}


NIC = {"name": "eth0", "network": "machinery", "mac": MAC, "ip_address": None}


def test_addresses_after_a_renewal_leave_out_leases_that_did_not_move():
    view = PoolView(FakeContext(FakeNetwork([lease(1000), lease(1200, "192.168.101.9", "52:54:00:00:00:01")])))
    assert view.addresses("machinery", MAC) == ["192.168.101.71"]
    assert view.addresses("machinery", MAC, 1000) == []
    assert view.addresses("machinery", MAC, 999) == ["192.168.101.71"]
    assert view.lease_expiry("machinery", MAC) == 1000
    assert view.lease_expiry("machinery", "52:54:00:00:00:02") is None


def test_leases_that_never_expire_give_no_expiry_to_compare():
    view = PoolView(FakeContext(FakeNetwork([lease(0)])))
    assert view.lease_expiry("machinery", MAC) is None
    assert addresses.lease_expiries(FakeContext(FakeNetwork([lease(0)])), [NIC]) == {}


def test_lease_expiries_of_the_nics_on_networks():
    ctx = FakeContext(FakeNetwork([lease(1000)]))
    bridged = {"name": "eth1", "network": None, "bridge": "br0", "mac": "52:54:00:00:00:05"}
    assert addresses.lease_expiries(ctx, [NIC, bridged]) == {("machinery", MAC): 1000}
    assert addresses.lease_expiries(ctx, None) == {}


def test_the_wait_passes_over_the_earlier_guests_lease_until_it_is_renewed(monkeypatch):
    monkeypatch.setattr(addresses, "POLL", 0)
    # the lease the earlier guest left, read twice more while the new guest boots, then renewed by it
    net = FakeNetwork([lease(1000)], [lease(1000)], [lease(1000)], [lease(1500)])
    addresses.wait_for_address(FakeContext(net), running(), "inv-a", [NIC], 30, {("machinery", MAC): 1000})
    assert net.reads == 4


def test_without_earlier_leases_any_lease_counts(monkeypatch):
    monkeypatch.setattr(addresses, "POLL", 0)
    net = FakeNetwork([lease(1000)])
    addresses.wait_for_address(FakeContext(net), running(), "inv-a", [NIC], 30)
    assert net.reads == 1


def test_a_lease_never_renewed_times_out(monkeypatch):
    monkeypatch.setattr(addresses, "POLL", 0)
    with pytest.raises(MachineryError, match="inv-a got no DHCP address within 0.01s"):
        addresses.wait_for_address(FakeContext(FakeNetwork([lease(1000)])), running(), "inv-a", [NIC], 0.01,
                                   {("machinery", MAC): 1000})


def test_a_fixed_address_counts_only_once_renewed_to_it(monkeypatch):
    monkeypatch.setattr(addresses, "POLL", 0)
    fixed = dict(NIC, ip_address="192.168.101.20")
    net = FakeNetwork([lease(1000)], [lease(1500)], [lease(1600, "192.168.101.20")])
    addresses.wait_for_address(FakeContext(net), running(), "inv-a", [fixed], 30, {("machinery", MAC): 1000})
    assert net.reads == 3

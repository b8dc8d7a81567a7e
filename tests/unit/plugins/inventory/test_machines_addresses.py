"""Which address source gives a host its ansible_host (no libvirt: the other sources are a stub)."""

import pytest

from ansible_collections.machinery.compute.plugins.inventory import machines
from ansible_collections.machinery.compute.plugins.module_utils.machines.guest import routable_addresses

GUEST = {"interfaces": [{"name": "eth0", "mac": None,
                         "addresses": [{"address": "10.77.0.5", "prefix": 24, "family": "ipv4"}]}]}


def machine(leases=(), guest=None, phase="Running"):
    return {"name": "m", "phase": phase, "guest": guest,
            "network_interfaces": [{"name": "eth0", "ip_addresses": list(leases)}]}


def asked(answers):
    calls = []

    def ask(source):
        calls.append(source)
        return answers.get(source, [])
    return ask, calls


@pytest.mark.parametrize("sources, status, facts_read, expected, calls", [
    (["lease", "agent", "arp"], machine(["192.168.1.2"], GUEST), True, ["192.168.1.2"], []),
    (["agent", "lease"], machine(["192.168.1.2"], GUEST), True, ["10.77.0.5"], []),
    (["lease", "agent"], machine([], GUEST), True, ["10.77.0.5"], []),
    # facts were read and the agent said nothing: not asked again
    (["agent"], machine([], None), True, [], []),
    (["agent", "arp"], machine([], None), True, ["192.168.1.7"], ["arp"]),
    # facts were not read (guest_facts: false): the agent is asked for the addresses alone
    (["agent"], machine([], None), False, ["10.77.0.6"], ["agent"]),
    (["lease"], machine([], GUEST), True, [], []),
    (["arp"], machine([], None, phase="Shutdown"), True, [], []),
])
def test_first_source_that_knows_an_address_wins(sources, status, facts_read, expected, calls):
    ask, made = asked({"agent": ["10.77.0.6"], "arp": ["192.168.1.7"]})
    assert machines.addresses_of(status, sources, ask, routable_addresses, facts_read) == expected
    assert made == calls

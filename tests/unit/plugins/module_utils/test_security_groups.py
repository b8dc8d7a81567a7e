"""Security groups as pure functions: rule validation, the nwfilter rules they become, the group's plan and the
machine's plan for the security groups of its NICs."""

import pytest

from ansible_collections.machinery.compute.plugins.module_utils.pools import security_groups as sgs
from ansible_collections.machinery.compute.plugins.module_utils.core.errors import ConflictError
from ansible_collections.machinery.compute.plugins.module_utils.machines.machine_observe import Observed
from ansible_collections.machinery.compute.plugins.module_utils.machines.machine_plan import plan_machine

from conftest import refused


def rule(**given):
    return dict({"direction": "ingress", "protocol": "tcp", "port": None, "port_end": None,
                 "remote_cidr": "0.0.0.0/0"}, **given)


def test_rules_get_defaults_a_canonical_order_and_no_duplicates():
    rules = sgs.normalize_rules([{"protocol": "udp", "port": 53}, {"port": 22}, {"port": 22, "port_end": 22},
                                 {"direction": "egress", "protocol": "all"}])
    assert rules == [rule(direction="egress", protocol="all"), rule(port=22), rule(protocol="udp", port=53)]


@pytest.mark.parametrize("given, field, words", [
    ({"port": 0}, "rules[0].port", "between 1 and 65535"),
    ({"port": 65536}, "rules[0].port", "between 1 and 65535"),
    ({"port": 80, "port_end": 79}, "rules[0].port_end", "below port 80"),
    ({"port_end": 80}, "rules[0].port_end", "needs port"),
    ({"protocol": "icmp", "port": 8}, "rules[0].port", "no ports"),
    ({"protocol": "all", "port_end": 8}, "rules[0].port_end", "no ports"),
    ({"protocol": "sctp"}, "rules[0].protocol", "tcp, udp, icmp, all"),
    ({"direction": "inbound"}, "rules[0].direction", "ingress, egress"),
    ({"remote_cidr": "10.0.0.1/8"}, "rules[0].remote_cidr", "host bits"),
    ({"remote_cidr": "fd00::/8"}, "rules[0].remote_cidr", "IPv4"),
    ({"remote_cidr": "everywhere"}, "rules[0].remote_cidr", "CIDR"),
    ({"ports": 80}, "rules[0]", "unknown key ports"),
])
def test_bad_rules_name_their_field(given, field, words):
    assert words in refused(field, sgs.normalize_rules, [given])


def test_rules_become_nwfilter_rules_and_read_back():
    rules = sgs.normalize_rules([{"port": 8000, "port_end": 8099, "remote_cidr": "10.1.0.0/16"},
                                 {"direction": "egress", "protocol": "udp", "port": 53, "remote_cidr": "10.0.0.1/32"}])
    built = sgs.group_rules("web", rules)
    assert [(entry["direction"], entry["protocol"]) for entry in built] == [("out", "udp"), ("in", "tcp")]
    assert built[0]["match"]["dstipaddr"] == "10.0.0.1" and built[1]["match"]["srcipmask"] == "16"
    assert [sgs.read_rule(entry) for entry in built] == rules
    assert sgs.is_ours({"rules": built})


def test_a_group_without_egress_rules_allows_all_egress():
    built = sgs.group_rules("web", sgs.normalize_rules([{"port": 80}]))
    defaults = [entry for entry in built if entry["priority"] == sgs.DEFAULT_EGRESS_PRIORITY]
    assert [(entry["action"], entry["direction"], entry["protocol"]) for entry in defaults] == \
        [("accept", "out", "all"), ("accept", "out", "all-ipv6")]


def test_a_nics_filter_passes_dhcp_and_drops_the_rest_after_every_group_rule():
    rules = sgs.nic_rules("m", "eth0")
    accepts = [entry for entry in rules if entry["action"] == "accept"]
    drops = [entry for entry in rules if entry["action"] == "drop"]
    assert {entry["match"]["dstportstart"] for entry in accepts} == {"67", "68"}
    assert all(entry["statematch"] == "false" for entry in accepts)
    assert {(entry["direction"], entry["protocol"]) for entry in drops} == \
        {("in", "all"), ("in", "all-ipv6"), ("out", "all"), ("out", "all-ipv6")}
    assert min(entry["priority"] for entry in drops) > max(sgs.RULE_PRIORITY, sgs.DEFAULT_EGRESS_PRIORITY)
    assert sgs.nic_filter("a-b", "c") != sgs.nic_filter("a", "b-c")


def test_filters_without_the_marker_are_not_ours():
    assert not sgs.is_ours({"rules": []})
    assert not sgs.is_ours({"rules": [{"match": {"comment": "someone else"}}]})


def test_group_plan_create_update_unchanged_delete():
    plan = sgs.plan_group({"name": "web", "rules": [{"port": 80}]}, None, [])
    assert plan.summaries() == ["create"] and plan.find("create").data["rules"] == [rule(port=80)]
    assert not sgs.plan_group({"name": "web", "rules": [{"port": 80}]}, [rule(port=80)], []).changed
    plan = sgs.plan_group({"name": "web", "rules": [{"port": 81}]}, [rule(port=80)], ["m/eth0"])
    assert plan.summaries() == ["update rules"]
    assert plan.diff() == ({"rules": [rule(port=80)]}, {"rules": [rule(port=81)]})
    assert plan.facts["group"]["network_interfaces"] == ["m/eth0"]
    assert not sgs.plan_group({"name": "web", "state": "absent"}, None, []).changed
    assert sgs.plan_group({"name": "web", "state": "absent"}, [], []).summaries() == ["delete"]


def test_deleting_a_group_in_use_needs_force():
    with pytest.raises(ConflictError) as caught:
        sgs.plan_group({"name": "web", "state": "absent"}, [rule(port=80)], ["m/eth0"])
    assert caught.value.field == "name" and "m/eth0" in str(caught.value)
    plan = sgs.plan_group({"name": "web", "state": "absent", "force": True}, [rule(port=80)], ["m/eth0"])
    steps = plan.find("delete").steps
    assert [entry["action"] for entry in steps] == ["define_nwfilter", "undefine_nwfilter"]


def existing_machine(groups, active=True):
    record = {"spec": {"name": "m", "cpu": 1, "memory": 2 ** 27, "labels": {}, "machine_class": None,
                       "boot_config": None, "network_interfaces": [{"name": "eth0"}, {"name": "eth1"}],
                       "volumes": []}}
    observed = Observed("m", dom=object(), tree=None, record=record, state=(1 if active else 5, 0))
    observed.security_groups = groups
    return observed


def machine_spec(requested):
    return {"name": "m", "state": "running", "requested_security_groups": requested}


def test_machine_plans_security_group_changes_per_nic(monkeypatch):
    from ansible_collections.machinery.compute.plugins.module_utils.core import options
    monkeypatch.setattr(options, "owned_values", lambda tree, record: {})
    observed = existing_machine({"eth0": ["web"], "eth1": []})
    assert not plan_machine(machine_spec({"eth0": ["web"]}), observed).changed
    assert not plan_machine(machine_spec({}), observed).changed  # left out: kept
    plan = plan_machine(machine_spec({"eth0": [], "eth1": ["db", "web"]}), observed)
    assert plan.summaries() == ["update security_groups"]
    assert plan.diff() == ({"security_groups": {"eth0": ["web"], "eth1": []}},
                           {"security_groups": {"eth0": [], "eth1": ["db", "web"]}})
    steps = [(entry["action"], entry["target"]) for entry in plan.find("update").steps]
    assert steps == [("update_device", "ua-nic-eth0"), ("undefine_nwfilter", "machinery-nic-m.eth0"),
                     ("define_nwfilter", "machinery-nic-m.eth1"), ("update_device", "ua-nic-eth1")]
    # a group added beside another only redefines the NIC's filter
    plan = plan_machine(machine_spec({"eth0": ["db", "web"]}), observed)
    assert [entry["action"] for entry in plan.find("update").steps] == ["define_nwfilter"]

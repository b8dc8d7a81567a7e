"""security_group and per-NIC security_groups of machine: the lifecycle read back from libvirt's nwfilters, and
the proof by traffic between two guests on one lab network.

Guest A (the server) listens on two ports; guest B (the client, created once A has its DHCP address, which its
user-data script is given) connects to both every round and prints what answered. A's groups allow one port:
it answers, the other does not. Changing the group's rules, then A's groups, on the running guests shows each
change taking effect live.
"""

import re
import time

import libvirt
import pytest

from conftest import assert_failed, first_pool, load_lab, run_module

SERVER = "sg-server"
CLIENT = "sg-client"
WEB = "it-web"
SSH_ONLY = "it-ssh-only"
ALLOWED, BLOCKED = 8080, 9090

SERVER_SCRIPT = """#!/bin/sh
printf '#!/bin/sh\\necho open\\n' >/run/answer
chmod +x /run/answer
for port in %d %d; do
    nc -ll -p "$port" -e /run/answer >/dev/null 2>&1 &
done
echo listening
""" % (ALLOWED, BLOCKED)

# busybox nc's -w bounds the connect only: a connection made just before the server's groups change, whose
# answer the new rules then drop, would block its read, and with it every later round. timeout ends such a probe.
CLIENT_SCRIPT = """#!/bin/sh
round=0
while :; do
    for port in %d %d; do
        if [ "$(timeout -s KILL 6 nc -w 3 %%s "$port" </dev/null 2>/dev/null)" = open ]; then
            echo "MACHINERY-PROBE $round $port open"
        else
            echo "MACHINERY-PROBE $round $port closed"
        fi
    done
    round=$((round + 1))
    sleep 1
done
""" % (ALLOWED, BLOCKED)

PROBE = re.compile(r"^MACHINERY-PROBE (\d+) (\d+) (open|closed)\s*$", re.M)


@pytest.fixture(scope="module")
def image():
    """The lab's image (this test needs one pool only, so it does not ask for the 3-pool lab)."""
    return load_lab()["image"]


@pytest.fixture(scope="module")
def sg_pool():
    with first_pool(clean) as pool:
        yield pool


def clean(pool):
    for name in (CLIENT, SERVER, "sg-guarded"):
        if pool.domain(name) is not None:
            run_module("machine", uri=pool.uri, name=name, state="absent", shutdown_timeout=0)
    for group in (WEB, SSH_ONLY, "it-lifecycle"):
        run_module("security_group", uri=pool.uri, name=group, state="absent", force=True)


def nwfilters(pool):
    return sorted(name for name in pool.conn.listNWFilters() if name.startswith("machinery-"))


def filter_xml(pool, name):
    return pool.conn.nwfilterLookupByName(name).XMLDesc(0)


def test_group_lifecycle(sg_pool, module):
    pool = sg_pool
    args = dict(uri=pool.uri, name="it-lifecycle", rules=[{"port": 22}, {"protocol": "icmp"}])

    result = module("security_group", check=True, **args)
    assert result["changed"] is True and result["actions"] == ["create"], result
    assert "machinery-sg-it-lifecycle" not in nwfilters(pool)

    result = module("security_group", **args)
    assert result["changed"] is True, result
    assert result["security_group"]["filter"] == "machinery-sg-it-lifecycle"
    xml = filter_xml(pool, "machinery-sg-it-lifecycle")
    assert "dstportstart='22'" in xml and "<icmp" in xml and "machinery.compute" in xml

    assert module("security_group", **args)["changed"] is False
    # the same rules in another order, one twice, defaults spelled out: no change
    same = [{"protocol": "icmp", "remote_cidr": "0.0.0.0/0"}, {"port": 22, "direction": "ingress"}, {"port": 22}]
    assert module("security_group", uri=pool.uri, name="it-lifecycle", rules=same)["changed"] is False

    changed = dict(args, rules=[{"port": 22, "remote_cidr": "10.0.0.0/8"},
                                {"direction": "egress", "protocol": "udp", "port": 53, "port_end": 54}])
    result = module("security_group", **changed)
    assert result["changed"] is True and result["actions"] == ["update rules"], result
    assert result["diff"]["before"]["rules"][0]["protocol"] == "icmp"
    assert {"direction": "egress", "protocol": "udp", "port": 53, "port_end": 54,
            "remote_cidr": "0.0.0.0/0"} in result["diff"]["after"]["rules"]
    xml = filter_xml(pool, "machinery-sg-it-lifecycle")
    assert "srcipaddr='10.0.0.0'" in xml and "dstportend='54'" in xml and "<icmp" not in xml
    assert module("security_group", **changed)["changed"] is False

    result = module("security_group", uri=pool.uri, name="it-lifecycle", state="absent")
    assert result["changed"] is True
    assert "machinery-sg-it-lifecycle" not in nwfilters(pool)
    assert module("security_group", uri=pool.uri, name="it-lifecycle", state="absent")["changed"] is False


def test_foreign_filter_is_left_alone(sg_pool, module):
    pool = sg_pool
    foreign = pool.conn.nwfilterDefineXML("<filter name='machinery-sg-foreign'><rule action='accept' "
                                          "direction='in'><tcp dstportstart='1'/></rule></filter>")
    try:
        for state in ("present", "absent"):
            result = module("security_group", uri=pool.uri, name="foreign", state=state)
            assert_failed(result, "name", "not written by machinery.compute")
        assert "dstportstart='1'" in filter_xml(pool, "machinery-sg-foreign")
    finally:
        foreign.undefine()


def leases_of(pool, mac):
    return [lease["ipaddr"] for lease in pool.leases() if lease["mac"].lower() == mac.lower()]


def probes(pool, after_round=-1):
    """{round: {port: result}} of the client's complete rounds after ``after_round``."""
    rounds = {}
    for number, port, result in PROBE.findall(pool.console(CLIENT)):
        rounds.setdefault(int(number), {})[int(port)] = result
    return {number: ports for number, ports in rounds.items() if number > after_round and len(ports) == 2}


def wait_rounds(pool, expected, after_round=-1, timeout=240):
    """The first complete round after ``after_round`` that shows ``expected``; a second in a row confirms it."""
    deadline = time.monotonic() + timeout
    seen = {}
    while time.monotonic() < deadline:
        seen = probes(pool, after_round)
        matching = [number for number, ports in sorted(seen.items()) if ports == expected]
        if any(number + 1 in matching for number in matching):
            return max(matching)
        time.sleep(2)
    raise AssertionError("the client never reported %s after round %d; rounds: %s"
                         % (expected, after_round, sorted(seen.items())[-6:]))


def server_args(pool, image, groups):
    return dict(uri=pool.uri, name=SERVER, machine_class="small", image=image,
                network_interfaces=[{"name": "eth0", "network": "machinery", "security_groups": groups}],
                cloud_init={"user_data": SERVER_SCRIPT})


def test_groups_filter_traffic_live(sg_pool, module, image):
    pool = sg_pool
    started = time.monotonic()
    web = module("security_group", uri=pool.uri, name=WEB, rules=[{"port": ALLOWED}])
    assert web["changed"], web
    ssh = module("security_group", uri=pool.uri, name=SSH_ONLY, rules=[{"port": 22}])
    assert ssh["changed"], ssh

    # an unknown group: the field is named and nothing is created
    refused = module("machine", wait="none", **server_args(pool, image, [WEB, "no-such-group"]))
    assert_failed(refused, "network_interfaces[0].security_groups[1]", "no-such-group")
    assert pool.domain(SERVER) is None and "machinery-nic-%s.eth0" % SERVER not in nwfilters(pool)

    server = module("machine", wait="address", wait_timeout=300, **server_args(pool, image, [WEB]))
    assert server["changed"] and not server.get("failed"), server
    nic_filter = "machinery-nic-%s.eth0" % SERVER
    assert "filter='%s'" % nic_filter in pool.domain(SERVER).XMLDesc(0)
    assert "machinery-sg-%s" % WEB in filter_xml(pool, nic_filter)
    assert module("machine", **server_args(pool, image, [WEB]))["changed"] is False
    mac = server["machine"]["network_interfaces"][0]["mac"]
    address = leases_of(pool, mac)[0]  # DHCP reached the guest through the default deny

    client = module("machine", uri=pool.uri, name=CLIENT, machine_class="small", image=image, wait="none",
                    network_interfaces=[{"name": "eth0", "network": "machinery"}],
                    cloud_init={"user_data": CLIENT_SCRIPT % address})
    assert client["changed"] and not client.get("failed"), client
    last = wait_rounds(pool, {ALLOWED: "open", BLOCKED: "closed"})
    booted = time.monotonic() - started

    # a group in use is not deleted
    refused = module("security_group", uri=pool.uri, name=WEB, state="absent")
    assert_failed(refused, "name", "%s/eth0" % SERVER, "force")
    assert "machinery-sg-%s" % WEB in nwfilters(pool)

    # the group's rules change: the running server takes them at once
    result = module("security_group", uri=pool.uri, name=WEB, rules=[{"port": ALLOWED}, {"port": BLOCKED}])
    assert result["changed"] and result["security_group"]["network_interfaces"] == ["%s/eth0" % SERVER], result
    last = wait_rounds(pool, {ALLOWED: "open", BLOCKED: "open"}, last)

    # the server's NIC changes groups, live: check mode first, then for real with a diff
    planned = module("machine", check=True, **server_args(pool, image, [SSH_ONLY]))
    assert planned["changed"] and planned["actions"] == ["update security_groups"], planned
    assert "machinery-sg-%s" % WEB in filter_xml(pool, nic_filter)
    result = module("machine", **server_args(pool, image, [SSH_ONLY]))
    assert result["changed"], result
    assert result["diff"] == {"before": {"security_groups": {"eth0": [WEB]}},
                              "after": {"security_groups": {"eth0": [SSH_ONLY]}}}
    assert "machinery-sg-%s" % SSH_ONLY in filter_xml(pool, nic_filter)
    last = wait_rounds(pool, {ALLOWED: "closed", BLOCKED: "closed"}, last)

    # no groups: the NIC's filter goes, live and persistent, and everything answers
    result = module("machine", **server_args(pool, image, []))
    assert result["changed"], result
    assert "filterref" not in pool.domain(SERVER).XMLDesc(0)
    assert "filterref" not in pool.domain(SERVER).XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE)
    assert nic_filter not in nwfilters(pool)
    last = wait_rounds(pool, {ALLOWED: "open", BLOCKED: "open"}, last)
    assert module("machine", **server_args(pool, image, []))["changed"] is False

    # back under a group, then deleting the machine removes its NIC's filter
    assert module("machine", **server_args(pool, image, [WEB]))["changed"]
    assert nic_filter in nwfilters(pool)
    assert not module("machine", uri=pool.uri, name=SERVER, state="absent", shutdown_timeout=0).get("failed")
    assert nic_filter not in nwfilters(pool)
    for group in (WEB, SSH_ONLY):
        assert module("security_group", uri=pool.uri, name=group, state="absent")["changed"] is True
    print("security groups: guests up and first probe round after %.0fs, whole test %.0fs"
          % (booted, time.monotonic() - started))


def test_force_takes_the_group_off_its_nics(sg_pool, module, image):
    pool = sg_pool
    assert module("security_group", uri=pool.uri, name=WEB, rules=[{"port": 80}])["changed"]
    made = module("machine", uri=pool.uri, name="sg-guarded", machine_class="small", image=image, state="present",
                  network_interfaces=[{"name": "eth0", "network": "machinery", "security_groups": [WEB]}])
    assert made["changed"] and not made.get("failed"), made
    result = module("security_group", uri=pool.uri, name=WEB, state="absent", force=True)
    assert result["changed"], result
    assert "machinery-sg-%s" % WEB not in nwfilters(pool)
    # the NIC keeps its filter: default deny, no group
    assert "machinery-sg-" not in filter_xml(pool, "machinery-nic-sg-guarded.eth0")
    assert not module("machine", uri=pool.uri, name="sg-guarded", state="absent").get("failed")
    assert "machinery-nic-sg-guarded.eth0" not in nwfilters(pool)

"""Guest facts and commands through the QEMU guest agent.

The busybox test image runs the real qemu-guest-agent (from the Debian package) on the channel every machine gets.
One busybox machine sits on a host bridge of the pool with no DHCP at all and gives itself a static address: only
its agent can tell the address. The connection plugin runs shell commands in it (``raw``: busybox has no Python).
Modules and a file copy through the plugin need Python in the guest: test_12 runs them in its real Debian guests
(test_tasks_through_the_guest_agent), which saves booting another real guest here.
"""

import subprocess
import time

import libvirt
import pytest

from conftest import adhoc, first_pool, hostvars, lab_pid, load_lab, write_source

BRIDGE = "mgabr0"
STATIC = "10.77.0.5"
BRIDGED = "ga-bridged"
PARKED = "ga-parked"
# the user-data script: no DHCP server answers on the bridge, so stop asking and take a static address
SCRIPT = """#!/bin/sh
kill "$(cat /run/udhcpc.eth0.pid)" 2>/dev/null
ip addr add %s/24 dev eth0
ip -4 -o addr show dev eth0
""" % STATIC


def in_pool(pool, *command):
    return subprocess.run(["nsenter", "--net=/proc/%d/ns/net" % lab_pid(pool)] + list(command),
                          capture_output=True, text=True, check=False, timeout=60)


def info(module, pool, name):
    result = module("machine_info", uri=pool.uri, name=name)
    assert not result.get("failed"), result
    return result["machines"][0]


def wait_for_agent(module, pool, name, timeout):
    deadline = time.monotonic() + timeout
    while True:
        machine = info(module, pool, name)
        if machine["guest"] is not None:
            return machine
        assert time.monotonic() < deadline, "the agent of %s never answered: %s" % (name, machine)
        time.sleep(3)


@pytest.fixture(scope="module")
def lab_pools():
    with first_pool() as pool:
        yield [pool]


@pytest.fixture(scope="module")
def bridged(lab_pools, module):
    """A running busybox machine on a bridge with no DHCP, and a defined one that never started."""
    pool = lab_pools[0]
    image = load_lab()["image"]
    for name in (BRIDGED, PARKED):
        module("machine", uri=pool.uri, name=name, state="absent")
    in_pool(pool, "ip", "link", "del", BRIDGE)
    made = in_pool(pool, "ip", "link", "add", BRIDGE, "type", "bridge")
    assert made.returncode == 0, made.stderr
    in_pool(pool, "ip", "link", "set", BRIDGE, "up")
    started = time.monotonic()
    machine = module("machine", uri=pool.uri, name=BRIDGED, machine_class="small", image=image,
                     network_interfaces=[{"name": "eth0", "bridge": BRIDGE}], cloud_init={"user_data": SCRIPT})
    assert not machine.get("failed"), machine
    parked = module("machine", uri=pool.uri, name=PARKED, machine_class="small", image=image, state="present",
                    network_interfaces=[])
    assert not parked.get("failed"), parked
    console = pool.wait_console(BRIDGED, "MACHINERY-SCRIPT-END", timeout=300)
    assert "MACHINERY-AGENT /dev/vport" in console, console[-3000:]
    facts = wait_for_agent(module, pool, BRIDGED, 120)
    print("\nbusybox machine created, booted and its agent answered in %.0f s" % (time.monotonic() - started))
    yield {"pool": pool, "machine": facts, "mac": machine["machine"]["network_interfaces"][0]["mac"],
           "console": console}
    for name in (BRIDGED, PARKED):
        module("machine", uri=pool.uri, name=name, state="absent")
    in_pool(pool, "ip", "link", "del", BRIDGE)


def test_status_has_the_guests_own_facts(bridged, module):
    pool, machine = bridged["pool"], bridged["machine"]
    guest = machine["guest"]
    assert guest["hostname"] == BRIDGED
    assert guest["os"]["id"] == "machinery-test" and guest["os"]["name"] == "Machinery test guest"
    assert guest["os"]["version_id"] == "1"
    # the same answers libvirt gives when asked directly
    dom = pool.domain(BRIDGED)
    direct = dom.guestInfo(libvirt.VIR_DOMAIN_GUEST_INFO_OS | libvirt.VIR_DOMAIN_GUEST_INFO_HOSTNAME, 0)
    assert guest["kernel"] == {"release": direct["os.kernel-release"], "version": direct["os.kernel-version"]}
    assert guest["kernel"]["release"].endswith("-amd64")
    # booted after the machine was created, and not in the future
    assert machine["created"] <= guest["boot_time"] <= time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime())
    # no DHCP on the bridge: no lease, yet an address, the one the guest gave itself
    eth0 = next(nic for nic in guest["interfaces"] if nic["mac"] == bridged["mac"])
    assert {"address": STATIC, "prefix": 24, "family": "ipv4"} in eth0["addresses"]
    assert machine["network_interfaces"][0]["ip_addresses"] == []
    assert machine["ip_addresses"] == [STATIC]
    assert "%s/24" % STATIC in bridged["console"]
    conditions = {condition["type"]: condition for condition in machine["conditions"]}
    assert conditions["BootstrapReady"]["status"] == "True"
    assert conditions["BootstrapReady"]["reason"] == "GuestAgentAnswered"
    assert guest["agent_errors"] == []


def test_no_agent_no_cost(bridged, module):
    parked = info(module, bridged["pool"], PARKED)
    assert parked["phase"] == "Pending" and parked["guest"] is None
    conditions = {condition["type"]: condition for condition in parked["conditions"]}
    assert conditions["BootstrapReady"]["status"] == "False"
    assert conditions["BootstrapReady"]["reason"] == "NotRunning"
    # the live XML marks the agent's channel connected: that is what status reads before asking the agent
    xml = bridged["pool"].domain(BRIDGED).XMLDesc(0)
    assert "name='org.qemu.guest_agent.0' state='connected'" in xml.replace('"', "'"), xml


def test_inventory_address_source_agent(bridged, tmp_path):
    pools = [bridged["pool"]]
    by_agent = hostvars(write_source(tmp_path, pools, address_source=["agent"]))[BRIDGED]
    assert by_agent["ansible_host"] == STATIC
    assert by_agent["machinery"]["guest"]["hostname"] == BRIDGED
    # what the guest_agent connection needs, set by the inventory
    assert by_agent["machinery_uri"] == bridged["pool"].uri and by_agent["machinery_domain"] == BRIDGED
    # the leases know nothing of the bridge
    by_lease = hostvars(write_source(tmp_path, pools, address_source=["lease"]))[BRIDGED]
    assert "ansible_host" not in by_lease and by_lease["machinery"]["ip_addresses"] == []
    # without guest facts in the status, the agent source still asks the agent for the addresses alone
    quick = hostvars(write_source(tmp_path, pools, address_source=["agent"], guest_facts=False))[BRIDGED]
    assert quick["ansible_host"] == STATIC and quick["machinery"]["guest"] is None


def test_connection_runs_shell_in_busybox(bridged, tmp_path):
    source = write_source(tmp_path, [bridged["pool"]])
    rc, result = adhoc(source, BRIDGED, "raw", "hostname; ip -4 -o addr show dev eth0; echo to-stderr >&2")
    assert rc == 0, result
    lines = result["stdout"].splitlines()
    assert lines[0] == BRIDGED and STATIC in lines[1], result
    assert "to-stderr" in result["stderr"]
    rc, result = adhoc(source, BRIDGED, "raw", "exit 3")
    assert rc != 0 and result["rc"] == 3, result
    # a machine that is not running is unreachable, with the reason
    rc, result = adhoc(source, PARKED, "raw", "true")
    assert rc != 0 and result.get("unreachable") is True, result
    assert "is not running" in result["msg"], result


def test_agent_moves_files(bridged):
    """The agent's file commands under the plugin's put_file and fetch_file, on bytes of every value and more
    than one chunk."""
    from ansible_collections.machinery.compute.plugins.module_utils.machines import guest

    agent = guest.Agent(bridged["pool"].domain(BRIDGED))
    data = bytes(range(256)) * 800  # 204,800 bytes: four chunks
    agent.write_file("/tmp/machinery-agent.bin", data)
    assert agent.read_file("/tmp/machinery-agent.bin") == data
    code, out, _err = agent.run("/bin/sh", ["-c", "wc -c </tmp/machinery-agent.bin; cat"], stdin=b"fed through stdin")
    assert code == 0 and out.split() == [b"204800", b"fed", b"through", b"stdin"], out
    with pytest.raises(guest.AgentError, match="guest-file-open"):
        agent.read_file("/nonexistent/file")

"""The machines inventory plugin through ansible-inventory and ansible-playbook, against the lab."""

import json
import subprocess
import sys
import time

import libvirt
import pytest
from lxml import etree

from conftest import NS, ansible, inventory, lab_pid, listing, start_daemons, stop_daemon, write_source

INJECTION = "{{ lookup('pipe', 'echo INJECTED') }}"


def members(data, group):
    return sorted(data.get(group, {}).get("hosts", []))


@pytest.fixture(scope="module")
def fleet(registered, module, image):
    pools = registered
    names = ["inv-a", "inv-b", "inv-c"]
    specs = [{"name": "inv-a", "machine_class": "small", "image": image, "labels": {"app": "web"},
              "wait": "address", "wait_timeout": 180},
             {"name": "inv-b", "machine_class": "small", "image": image, "labels": {"app": "db"},
              "state": "present", "network_interfaces": []},
             {"name": "inv-c", "machine_class": "small", "image": image, "labels": {"app": "web"},
              "state": "present", "network_interfaces": [], "machine_pool": pools[2].name}]
    made = module("machine_batch", pools=[{"name": p.name, "uri": p.uri} for p in pools], machines=specs)
    assert not made.get("failed"), made
    yield {machine["name"]: machine for machine in made["machines"]}
    module("machine_batch", pools=[p.uri for p in pools], machines=[{"name": n, "state": "absent"} for n in names])


def test_hosts_groups_and_hostvars(registered, fleet, tmp_path):
    pools = registered
    source = write_source(tmp_path, [{"name": p.name, "uri": p.uri} for p in pools], include_pools=True,
                          keyed_groups=[{"key": "machinery.labels.app | default('none')", "prefix": "app"}],
                          compose={"cpu_count": "machinery.cpu * 2"},
                          groups={"running_web": "machinery.phase == 'Running' and machinery.labels.app == 'web'"})
    data, warnings = listing(source)
    hostvars = data["_meta"]["hostvars"]
    assert {"inv-a", "inv-b", "inv-c"} <= set(hostvars)
    running = fleet["inv-a"]
    assert hostvars["inv-a"]["ansible_host"] == running["ip_addresses"][0]
    assert "ansible_host" not in hostvars["inv-b"]
    assert hostvars["inv-a"]["machinery"]["uuid"] == running["uuid"]
    assert hostvars["inv-a"]["machinery"]["network_interfaces"][0]["mac"] == running["network_interfaces"][0]["mac"]
    assert hostvars["inv-c"]["machinery"]["pool"] == pools[2].name
    assert "inv-c" in members(data, "machinery_pool_" + pools[2].name)
    assert "inv-a" in members(data, "machinery_phase_Running")
    assert {"inv-b", "inv-c"} <= set(members(data, "machinery_phase_Pending"))
    assert {"inv-a", "inv-b", "inv-c"} <= set(members(data, "machinery_class_small"))
    assert {"inv-a", "inv-c"} <= set(members(data, "app_web")) and "inv-b" in members(data, "app_db")
    assert "inv-a" in members(data, "running_web") and not {"inv-b", "inv-c"} & set(members(data, "running_web"))
    assert int(hostvars["inv-a"]["cpu_count"]) == 2  # a string before ansible-core 2.19 (no native types)
    assert sorted(members(data, "machine_pools")) == sorted(p.name for p in pools)
    assert hostvars[pools[0].name]["machinery_pool"]["state"] == "Ready"

    graph = inventory(source, "--graph")
    assert graph.returncode == 0 and "@machinery_phase_Running:" in graph.stdout and "inv-a" in graph.stdout

    by_uuid, _warnings = listing(write_source(tmp_path, [p.uri for p in pools], hostname="uuid"))
    assert fleet["inv-a"]["uuid"] in by_uuid["_meta"]["hostvars"]


def test_unreachable_pool_warns_or_fails(registered, fleet, tmp_path):
    pools = [{"name": p.name, "uri": p.uri} for p in registered]
    broken = {"name": "gone", "uri": "qemu+unix:///system?socket=/nonexistent/libvirt-sock"}
    data, warnings = listing(write_source(tmp_path, pools + [broken]))
    assert "inv-a" in data["_meta"]["hostvars"]
    assert "pool gone" in warnings and "/nonexistent/libvirt-sock" in warnings
    proc = inventory(write_source(tmp_path, pools + [broken], strict=True), "--list")
    assert proc.returncode != 0 or "inv-a" not in proc.stdout
    assert "pool gone" in " ".join(proc.stderr.split())


def test_labels_are_never_templated(registered, module, fleet, tmp_path):
    dom = next(p.domain("inv-a") for p in registered if p.domain("inv-a"))
    conn = dom.connect()
    # write a record whose label is a template, as a hostile or buggy writer could, bypassing validation
    tree = etree.fromstring(dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE).encode())
    node = tree.find("metadata/{%s}machine" % NS)
    record = json.loads(node.text)
    record["spec"]["labels"]["note"] = INJECTION
    node.text = json.dumps(record)
    conn.defineXML(etree.tostring(tree).decode())
    source = write_source(tmp_path, [p.uri for p in registered])
    data, _warnings = listing(source, raw=True)
    assert data["_meta"]["hostvars"]["inv-a"]["machinery"]["labels"]["note"] == {"__ansible_unsafe": INJECTION}
    playbook = tmp_path / "show.yml"
    playbook.write_text(json.dumps([{"hosts": "machinery_phase_Running:&inv-a", "gather_facts": False,
                                     "connection": "local", "tasks": [
                                         {"name": "Read the machine's own record",
                                          "ansible.builtin.debug": {"msg": "{{ machinery.labels.note }} on "
                                                                           "{{ hostvars[inventory_hostname]"
                                                                           "['machinery']['pool'] }}"}}]}]))
    proc = ansible("ansible-playbook", "-i", source, playbook)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "inv-a" in proc.stdout and "lookup('pipe'" in proc.stdout
    assert "INJECTED on" not in proc.stdout


def test_cache_is_used_on_the_second_run(registered, fleet, tmp_path, lab):
    pools = registered
    cache_dir = tmp_path / "cache"
    source = write_source(tmp_path, [{"name": p.name, "uri": p.uri} for p in pools], cache=True,
                          cache_plugin="ansible.builtin.jsonfile", cache_connection=str(cache_dir),
                          cache_timeout=3600)
    cold, _warnings = listing(source, raw=True)
    assert "inv-c" in cold["_meta"]["hostvars"]
    assert list(cache_dir.iterdir())
    # stop the daemon of the pool that holds inv-c: a run that called libvirt could not list it any more
    try:
        stop_daemon(pools[2])
        uncached, warnings = listing(write_source(tmp_path / "..", [{"name": p.name, "uri": p.uri}
                                                                    for p in pools]))
        assert "inv-c" not in uncached["_meta"]["hostvars"] and "was not read" in warnings
        cached, warnings = listing(source, raw=True)
        assert "was not read" not in warnings
        # the same hosts, groups and hostvars, down to which strings are marked unsafe (all of them: even the
        # pool URIs, which a fresh reading copies from the source file)
        assert cached == cold
        machine = cached["_meta"]["hostvars"]["inv-c"]["machinery"]
        assert machine["uri"] == {"__ansible_unsafe": pools[2].uri}
        assert machine["pool"] == {"__ansible_unsafe": pools[2].name}
    finally:
        start_daemons(pools)
    assert "inv-c" in pools[2].domain_names()


def test_address_sources(registered, fleet, tmp_path):
    running = fleet["inv-a"]
    address = running["ip_addresses"][0]
    pool = next(p for p in registered if p.name == running["pool"])
    pools = [{"name": p.name, "uri": p.uri} for p in registered]
    # the test image runs the guest agent: asked only for the agent, the machine has the address its lease gave
    # (test_18 proves the agent alone on a machine with no lease at all). The guest's agent connects a while after
    # its lease (later still on a loaded machine): wait until libvirt can reach it before asking the inventory
    deadline = time.monotonic() + 120
    while True:
        try:
            pool.domain("inv-a").interfaceAddresses(libvirt.VIR_DOMAIN_INTERFACE_ADDRESSES_SRC_AGENT, 0)
            break
        except libvirt.libvirtError:
            assert time.monotonic() < deadline, "the guest agent of inv-a never answered"
            time.sleep(0.5)
    data, _warnings = listing(write_source(tmp_path, pools, address_source=["agent"]))
    assert data["_meta"]["hostvars"]["inv-a"]["ansible_host"] == address
    assert data["_meta"]["hostvars"]["inv-a"]["machinery"]["guest"]["os"]["id"] == "machinery-test"
    # the pool host learns the guest's MAC by talking to it (inside the lab's own network namespace); the ARP
    # source then finds the same address the DHCP lease gave
    in_pool = ["nsenter", "--net=/proc/%d/ns/net" % lab_pid(pool)]
    probe = "import socket; socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b'arp', (%r, 9))" % address
    deadline = time.monotonic() + 20
    while "lladdr" not in subprocess.run(in_pool + ["ip", "neigh", "show", address], capture_output=True,
                                         text=True, check=True).stdout:
        assert time.monotonic() < deadline, "the pool host never resolved %s" % address
        subprocess.run(in_pool + [sys.executable, "-c", probe], check=True, timeout=30)
        time.sleep(0.5)
    data, warnings = listing(write_source(tmp_path, pools, address_source=["arp"]))
    hostvars = data["_meta"]["hostvars"]["inv-a"]
    # libvirt's own ARP reader is the truth: some releases cannot parse this kernel's neighbour table (Debian
    # 12's libvirt 9.0 here fails with "wrong nlmsg len"); then the run must say so, naming pool and source
    try:
        arp = pool.domain("inv-a").interfaceAddresses(libvirt.VIR_DOMAIN_INTERFACE_ADDRESSES_SRC_ARP, 0)
    except libvirt.libvirtError as exc:
        assert "ansible_host" not in hostvars and hostvars["machinery"]["ip_addresses"] == []
        assert "pool %s: the arp address source failed" % pool.name in warnings
        assert exc.get_error_message() in warnings
    else:
        assert address in [entry["addr"] for nic in arp.values() for entry in nic["addrs"] or []]
        assert hostvars["ansible_host"] == address and hostvars["machinery"]["ip_addresses"] == [address]
        assert "address source failed" not in warnings


def test_unmanaged_domains_only_when_asked(registered, fleet, tmp_path):
    pool = registered[0]
    pool.conn.defineXML("<domain type='qemu'><name>inv-foreign</name><memory unit='MiB'>64</memory>"
                        "<os><type arch='x86_64'>hvm</type></os></domain>")
    try:
        pools = [{"name": p.name, "uri": p.uri} for p in registered]
        data, _warnings = listing(write_source(tmp_path, pools))
        assert "inv-foreign" not in data["_meta"]["hostvars"] and "inv-a" in data["_meta"]["hostvars"]
        data, _warnings = listing(write_source(tmp_path, pools, include_unmanaged=True))
        foreign = data["_meta"]["hostvars"]["inv-foreign"]["machinery"]
        assert foreign["managed"] is False and foreign["pool"] == pool.name and foreign["machine_class"] is None
        assert "inv-foreign" in members(data, "machinery_pool_" + pool.name)
        assert "inv-foreign" not in members(data, "machinery_class_small")
        assert data["_meta"]["hostvars"]["inv-a"]["machinery"]["managed"] is True
    finally:
        pool.conn.lookupByName("inv-foreign").undefine()

"""A machine boots from the test image with Ignition and cloud-init; the guest's own console proves the path."""

import json

import libvirt

from conftest import warnings_of

SECRET = "ignition-secret-7f3a"
HOSTNAME = "e2e-host.lab.internal"
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIMachineryTestKey test@machinery"


def test_boot_with_ignition_and_cloud_init(registered, module, image):
    pool = registered[1]
    name = "e2e-boot"
    module("machine", uri=pool.uri, name=name, state="absent", shutdown_timeout=5)
    ignition = {"ignition": {"version": "3.4.0"}, "storage": {"files": [{"path": "/etc/" + SECRET}]}}
    result = module("machine", uri=pool.uri, name=name, machine_class="small", image=image, ignition=ignition,
                    cloud_init={"user_data": {"runcmd": ["echo machinery"]}}, ssh_authorized_keys=[KEY],
                    hostname=HOSTNAME, labels={"suite": "e2e"}, wait="address", wait_timeout=180)
    assert result["changed"] is True, result
    machine = result["machine"]
    assert machine["phase"] == "Running"
    assert machine["ip_addresses"], machine
    address = machine["ip_addresses"][0]
    mac = machine["network_interfaces"][0]["mac"]

    # the same address in libvirt's DHCP lease for the NIC's MAC
    leases = {lease["mac"]: lease["ipaddr"] for lease in pool.leases()}
    assert leases[mac] == address

    # the guest's own report on its serial console
    console = pool.wait_console(name, "MACHINERY-READY", timeout=120)
    assert "MACHINERY-TEST-BOOT" in console
    assert "MACHINERY-ADDRESS eth0 %s" % address in console
    ignition_seen = console.split("MACHINERY-IGNITION-BEGIN", 1)[1].split("MACHINERY-IGNITION-END", 1)[0]
    # the hostname option: /etc/hostname in the Ignition config, local-hostname in the seed the guest set
    hostname_file = {"path": "/etc/hostname", "mode": 420, "overwrite": True, "contents": {"source": "data:," + HOSTNAME}}
    assert json.loads(ignition_seen.strip()) == {"ignition": ignition["ignition"],
                                                 "storage": {"files": ignition["storage"]["files"] + [hostname_file]}}
    assert "MACHINERY-HOSTNAME %s" % HOSTNAME in console
    user_data = console.split("MACHINERY-USERDATA-BEGIN", 1)[1].split("MACHINERY-USERDATA-END", 1)[0]
    assert user_data.strip().startswith("#cloud-config")
    assert KEY in user_data and "echo machinery" in user_data

    # secrets travel by file reference only, in 0600 volumes
    dom = pool.domain(name)
    for xml in (dom.XMLDesc(0), dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE)):
        assert SECRET not in xml and KEY not in xml
        assert "%s-ignition.json" % name in xml
    storage = pool.conn.storagePoolLookupByName("machinery")
    for volume in ("%s-ignition.json" % name, "%s-cidata.iso" % name):
        assert "<mode>0600</mode>" in storage.storageVolLookupByName(volume).XMLDesc(0)

    # idempotent while running
    again = module("machine", uri=pool.uri, name=name, machine_class="small", image=image, ignition=ignition,
                   cloud_init={"user_data": {"runcmd": ["echo machinery"]}}, ssh_authorized_keys=[KEY],
                   hostname=HOSTNAME, labels={"suite": "e2e"}, wait="address")
    assert again["changed"] is False, again

    # graceful stop through the ACPI power button: no forced power-off
    stopped = module("machine", uri=pool.uri, name=name, state="stopped", shutdown_timeout=60)
    assert stopped["changed"] is True and stopped["actions"] == ["stop"]
    assert stopped["machine"]["phase"] == "Shutdown"
    assert not any("forced" in warning for warning in warnings_of(stopped))
    assert "MACHINERY-POWEROFF" in pool.console(name)
    assert not pool.domain(name).isActive()
    assert module("machine", uri=pool.uri, name=name, state="stopped")["changed"] is False

    # started again: one restart, same MAC and so the same address
    started = module("machine", uri=pool.uri, name=name, state="running", wait="address", wait_timeout=180)
    assert started["machine"]["restart_count"] == 1
    assert started["machine"]["ip_addresses"][0] == address
    # dnsmasq still listed the first boot's lease when the guest started again: wait: address returned only once
    # this boot's guest had renewed it, so its agent (started before DHCP in the test image) already answered
    booted = [cond for cond in started["machine"]["conditions"] if cond["type"] == "BootstrapReady"]
    assert booted[0]["reason"] == "GuestAgentAnswered", booted

    # check mode on a running machine changes nothing
    planned = module("machine", check=True, uri=pool.uri, name=name, memory="256Mi")
    assert planned["changed"] is True
    assert pool.domain(name).maxMemory() == 131072

    gone = module("machine", uri=pool.uri, name=name, state="absent")
    assert gone["changed"] is True
    assert pool.domain(name) is None
    assert [volume for volume in pool.volumes() if volume.startswith(name + "-")] == []


def test_machine_info(registered, module, image):
    pool = registered[2]
    for name, labels in (("info-a", {"tier": "web"}), ("info-b", {"tier": "db"})):
        result = module("machine", uri=pool.uri, name=name, machine_class="small", image=image, state="present",
                        labels=labels)
        assert not result.get("failed"), result
    try:
        everything = module("machine_info", uri=pool.uri)
        assert everything["changed"] is False
        names = [machine["name"] for machine in everything["machines"]]
        assert {"info-a", "info-b"} <= set(names)
        assert names == sorted(names)
        web = module("machine_info", uri=pool.uri, labels={"tier": "web"})
        assert [machine["name"] for machine in web["machines"]] == ["info-a"]
        assert web["table"][0].split() == ["NAME", "POOL", "CLASS", "PHASE", "RESTARTS", "AGE", "IPS"]
        assert web["table"][1].split()[:5] == ["info-a", pool.name, "small", "Pending", "0"]
        assert module("machine_info", uri=pool.uri, phase=["Running"], name=["info-a"])["machines"] == []
        assert module("machine_info", uri=pool.uri, name=["no-such"])["machines"] == []
    finally:
        for name in ("info-a", "info-b"):
            module("machine", uri=pool.uri, name=name, state="absent")

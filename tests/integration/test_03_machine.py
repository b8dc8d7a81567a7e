"""machine: lifecycle, bad input (nothing created, seen from libvirt), adoption, images by path and URL."""

import hashlib

import libvirt
import pytest

from conftest import assert_failed, served_file


@pytest.fixture(name="image", scope="session")
def idle_guest_image(idle_image):
    """Nothing here looks inside a guest: its machines run the idle image (conftest.idle_image), at no CPU cost."""
    return idle_image


NS = "https://machinery.compute/xmlns/machine/1"


def sha256(path):
    with open(path, "rb") as handle:
        return hashlib.sha256(handle.read()).hexdigest()


def test_machine_lifecycle(pool, module, image):
    name = "life"
    module("machine", uri=pool.uri, name=name, state="absent", shutdown_timeout=5)
    volumes_before = pool.volumes()
    args = dict(uri=pool.uri, name=name, machine_class="small", image=image, state="present",
                labels={"app": "web"}, volumes=[{"name": "data", "size": "64Mi"}])

    result = module("machine", check=True, **args)
    assert result["changed"] is True
    assert result["actions"] == ["create"]
    assert pool.domain(name) is None
    assert [v for v in pool.volumes() if v.startswith(name + "-")] == []

    result = module("machine", **args)
    assert result["changed"] is True, result
    machine = result["machine"]
    assert machine["phase"] == "Pending"
    assert (machine["cpu"], machine["memory"], machine["machine_class"]) == (1, "128Mi", "small")
    assert [v["device"] for v in machine["volumes"]] == ["vda", "vdb"]
    assert machine["network_interfaces"][0]["network"] == "machinery"
    dom = pool.domain(name)
    assert dom is not None and not dom.isActive()
    assert dom.info()[3] == 1 and dom.maxMemory() == 131072
    assert NS in dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE)
    assert {name + "-root.qcow2", name + "-data.qcow2"} <= set(pool.volumes())

    again = module("machine", **args)
    assert again["changed"] is False, again
    assert again["actions"] == []

    result = module("machine", uri=pool.uri, name=name, cpu=2, memory="256Mi", labels={"app": "db"},
                    state="present")
    assert result["changed"] is True
    assert result["diff"]["before"] == {"cpu": 1, "memory": "128Mi", "labels": {"app": "web"}}
    assert result["diff"]["after"] == {"cpu": 2, "memory": "256Mi", "labels": {"app": "db"}}
    dom = pool.domain(name)
    assert dom.info()[3] == 2 and dom.maxMemory() == 262144
    # a re-run that names nothing of the size keeps it
    assert module("machine", uri=pool.uri, name=name, state="present")["changed"] is False
    assert pool.domain(name).info()[3] == 2

    refused = module("machine", uri=pool.uri, name=name, image=image + ".other", state="present")
    assert_failed(refused, "image", "cannot change")

    gone = module("machine", uri=pool.uri, name=name, state="absent")
    assert gone["changed"] is True
    assert gone["machine"]["phase"] == "Terminated"
    assert pool.domain(name) is None
    assert [v for v in pool.volumes() if v.startswith(name + "-")] == []
    assert set(pool.volumes()) <= set(volumes_before) | {v for v in pool.volumes() if v.startswith("image-")}
    assert module("machine", uri=pool.uri, name=name, state="absent")["changed"] is False


BAD = [
    (dict(name="</name>"), "name"),
    (dict(name="../x"), "name"),
    (dict(name="with space"), "name"),
    (dict(name="x" * 64), "name"),
    (dict(name="Upper"), "name"),
    (dict(cpu=0, memory="128Mi", machine_class=None), "cpu"),
    (dict(cpu=-2, memory="128Mi", machine_class=None), "cpu"),
    (dict(cpu=257, memory="128Mi", machine_class=None), "cpu"),
    (dict(cpu=1, memory="16Gx", machine_class=None), "memory"),
    (dict(cpu=1, memory="0", machine_class=None), "memory"),
    (dict(cpu=1, memory="-128Mi", machine_class=None), "memory"),
    (dict(machine_class="no-such-class"), "machine_class"),
    (dict(image="/nonexistent/disk.qcow2"), "image"),
    (dict(image_checksum="sha256:" + "0" * 64), "image_checksum"),
    (dict(image="http://127.0.0.1:9/disk.qcow2"), "image_checksum"),
    (dict(network_interfaces=[{"name": "eth0", "network": "no-such-net"}]), "network_interfaces[0].network"),
    (dict(volumes=[{"name": "data", "size": "lots"}]), "volumes[0].size"),
    (dict(volumes=[{"name": "data", "volume": "no-such-volume"}]), "volumes[0].volume"),
    (dict(network_interfaces=[{"name": "eth0", "network": "machinery", "mac": "01:00:5e:00:00:01"}]),
     "network_interfaces[0].mac"),
]


@pytest.mark.parametrize("change,field", BAD, ids=[field + ":" + str(list(change.values())[0])[:20]
                                                   for change, field in BAD])
def test_bad_input_creates_nothing(pool, module, image, change, field):
    domains = pool.domain_names()
    volumes = pool.volumes()
    args = dict(uri=pool.uri, name="bad-input", machine_class="small", image=image, state="running")
    args.update(change)
    args = {key: value for key, value in args.items() if value is not None}
    assert_failed(module("machine", **args), field)
    assert pool.domain_names() == domains
    assert pool.volumes() == volumes


def test_unreachable_uri(module, image):
    assert_failed(module("machine", uri="qemu+unix:///system?socket=/nonexistent/libvirt-sock", name="x",
                         machine_class="small", image=image), "uri", "cannot connect")


def test_foreign_domain_is_refused_then_adopted(pool, module):
    name = "foreign"
    module("machine", uri=pool.uri, name=name, state="absent")
    xml = ("<domain type='qemu'><name>%s</name><memory unit='MiB'>64</memory><vcpu>1</vcpu>"
           "<os><type arch='x86_64' machine='q35'>hvm</type></os></domain>" % name)
    existing = pool.domain(name)
    if existing is not None:
        existing.undefine()
    dom = pool.conn.defineXML(xml)
    before = dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE)
    try:
        refused = module("machine", uri=pool.uri, name=name, cpu=2, memory="128Mi", state="present")
        assert_failed(refused, "name", "adopt")
        assert pool.domain(name).XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE) == before
        assert module("machine", uri=pool.uri, name=name, state="absent")["failed"]
        assert pool.domain(name) is not None

        adopted = module("machine", uri=pool.uri, name=name, adopt=True, state="present")
        assert adopted["changed"] is True and adopted["actions"] == ["adopt"]
        assert adopted["machine"]["cpu"] == 1 and adopted["machine"]["memory"] == "64Mi"
        assert NS in pool.domain(name).XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE)
        assert module("machine", uri=pool.uri, name=name, state="present")["changed"] is False
    finally:
        module("machine", uri=pool.uri, name=name, state="absent")
    assert pool.domain(name) is None


@pytest.fixture
def image_server(image):
    """The test image served over HTTP on loopback only."""
    with served_file(image) as url:
        yield url


def test_image_by_url(registered, module, image, image_server, tmp_path, monkeypatch):
    pool = registered[1]
    name = "from-url"
    module("machine", uri=pool.uri, name=name, state="absent")
    checksum = sha256(image)
    env_cache = str(tmp_path / "cache")
    monkeypatch.setenv("XDG_CACHE_HOME", env_cache)
    wrong = module("machine", uri=pool.uri, name=name, machine_class="small", image=image_server,
                   image_checksum="sha256:" + "1" * 64, state="present")
    assert_failed(wrong, "image_checksum", "mismatch")
    assert pool.domain(name) is None
    result = module("machine", uri=pool.uri, name=name, machine_class="small", image=image_server,
                    image_checksum="sha256:" + checksum, state="present")
    assert result["changed"] is True, result
    assert "image-%s.qcow2" % checksum[:32] in pool.volumes()
    assert module("machine", uri=pool.uri, name=name, machine_class="small", image=image_server,
                  image_checksum=checksum, state="present")["changed"] is False
    assert module("machine", uri=pool.uri, name=name, state="absent")["changed"] is True


def test_explicit_devices_and_macs_are_stable(pool, module, image):
    name = "stable"
    args = dict(uri=pool.uri, name=name, machine_class="small", image=image, state="present",
                volumes=[{"name": "a", "size": "16Mi", "device": "vdc"}, {"name": "b", "size": "16Mi"}],
                network_interfaces=[{"name": "eth0", "network": "machinery"},
                                    {"name": "eth1", "network": "machinery", "mac": "52:54:00:aa:bb:cc"}])
    first = module("machine", **args)["machine"]
    module("machine", uri=pool.uri, name=name, state="absent")
    second = module("machine", **args)["machine"]
    try:
        assert [v["device"] for v in first["volumes"]] == ["vda", "vdc", "vdb"]
        assert [n["mac"] for n in first["network_interfaces"]] == [n["mac"] for n in second["network_interfaces"]]
        assert first["network_interfaces"][1]["mac"] == "52:54:00:aa:bb:cc"
    finally:
        module("machine", uri=pool.uri, name=name, state="absent")


def test_uefi_machine_and_its_nvram(pool, module, image):
    name = "uefi-1"
    module("machine", uri=pool.uri, name=name, state="absent", shutdown_timeout=2)
    result = module("machine", uri=pool.uri, name=name, machine_class="small", image=image, firmware="uefi",
                    network_interfaces=[], state="running", wait="running", shutdown_timeout=2)
    assert result["changed"] is True, result
    dom = pool.domain(name)
    assert "firmware='efi'" in dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE)
    # libvirt picks the OVMF build and creates the guest's NVRAM when it starts (seen in the live XML)
    live = dom.XMLDesc(0)
    assert dom.isActive() and "<loader" in live and "<nvram" in live
    refused = module("machine", uri=pool.uri, name=name, firmware="bios", state="running")
    assert_failed(refused, "firmware", "fixed at creation")
    gone = module("machine", uri=pool.uri, name=name, state="absent", shutdown_timeout=2)
    assert gone["changed"] is True
    assert pool.domain(name) is None


def test_memory_that_is_no_whole_mib_is_idempotent(pool, module, image):
    args = dict(uri=pool.uri, name="odd-memory", cpu=1, memory="1.5G", image=image, state="present",
                network_interfaces=[])
    module("machine", uri=pool.uri, name="odd-memory", state="absent")
    try:
        made = module("machine", **args)
        assert made["changed"] is True and made["machine"]["memory"] == "1431Mi"
        assert pool.domain("odd-memory").maxMemory() == 1431 * 1024
        assert module("machine", **args)["changed"] is False
    finally:
        module("machine", uri=pool.uri, name="odd-memory", state="absent")

"""The upstream vitistack and KupenStack documents on the lab (issue 40): applied, read back from libvirt and from
the guests' consoles, re-applied and exported as no-ops, deleted.

The documents are written here in upstream's shape:
- vitistack/kubevirt-operator commit 63ee0ee41542f2cedf16aaccaccd54a7651e9efb: the 14 Machines of
  config/samples/sample-machine.yaml and examples/machine-*.yaml, and examples/machineclasses.yaml's
  MachineClasses (their sizes made lab-sized: the lab's host cannot hold 8 to 48 GiB guests);
  the ISO URLs of machine-boot-*.yaml point at the lab's busybox image served on loopback (the lab reaches no
  other host).
- Kupenstack/kupenstack commit aaa15113e5935344a7cba6169467ab9df4032d02: config/samples/virtualmachine-sample.yaml,
  flavor-sample.yaml, image-sample.yaml (its src served on loopback), keypair-with-public-key.yaml,
  network-sample.yaml, virtualnetwork-sample.yaml, and design-doc/custom-resources/volume.md.
"""

import copy
import ipaddress

import pytest
from lxml import etree

from conftest import NS, OVERCOMMIT, Pool, load_lab, register, run_module, served_file, warnings_of

KUBEVIRT_SERVED = ["libvirt", "kubevirt"]
VS = "vitistack.io/v1alpha1"
KS = "kupenstack.io/v1alpha1"
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIAABAgMEBQYHCAkKCwwNDg8QERITFBUWFxgZGhscHR4f test@machinery"


@pytest.fixture(scope="module")
def lab3():
    """The lab's three pools, registered with room for the examples' 32-vCPU machine (cpu overcommit 64) and
    their 390 GB of thin disks (storage overcommit 8)."""
    data = load_lab()
    pools = [Pool(entry["name"], entry["uri"]) for entry in data["pools"][:3]]
    before = {pool.name: (set(pool.domain_names()), set(pool.volumes())) for pool in pools}
    for pool in pools:
        register(pool, overcommit={"cpu": 64.0, "memory": 1.0, "storage": 8.0})
    yield pools, [{"name": pool.name, "uri": pool.uri} for pool in pools]
    # the lab as this file found it, whatever a test left (its documents' 390 GB would fill the next file's pools)
    for pool in pools:
        for name in sorted(set(pool.domain_names()) - before[pool.name][0]):
            run_module("machine", uri=pool.uri, name=name, state="absent", shutdown_timeout=1)
        for name in sorted(set(pool.volumes()) - before[pool.name][1]):
            if not name.startswith("image-"):  # the image cache is anyone's
                run_module("volume", uri=pool.uri, name=name, state="absent", force=True)
        register(pool, overcommit=dict(OVERCOMMIT, storage=1.0))


@pytest.fixture(scope="module")
def served_image(lab3):
    """The lab's busybox image on loopback, as an HTTP URL (the examples' ISO URLs and KupenStack's image src)."""
    image = load_lab()["image"]
    with served_file(image) as url:
        yield url


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    """A controller cache of this test's own, so the first download of a URL is this test's."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def where(pools, name):
    return next((pool for pool in pools if pool.domain(name) is not None), None)


def vs_machine(name, spec, namespace=None, annotations=None):
    metadata = {"name": name, "labels": {"app": "vitistack-examples"}}
    if namespace:
        metadata["namespace"] = namespace
    if annotations:
        metadata["annotations"] = annotations
    return {"apiVersion": VS, "kind": "Machine", "metadata": metadata, "spec": spec}


def vs_class(name, default=False):
    return {"apiVersion": VS, "kind": "MachineClass", "metadata": {"name": name},
            "spec": {"enabled": True, "default": default, "category": "Standard", "displayName": name.title(),
                     "description": "%s, lab-sized" % name, "cpu": {"cores": 1, "sockets": 1, "threads": 1},
                     "memory": {"quantity": "128Mi"}, "machineProviders": ["kubevirt"]}}


def kubevirt_examples(url):
    datavolume = {"kubevirt.io/boot-source": "datavolume", "kubevirt.io/boot-source-type": "http"}

    def iso(name, host, distribution, version, size):
        return vs_machine(name, {"machineClass": "medium", "name": host, "provider": "kubevirt",
                                 "os": {"family": "linux", "distribution": distribution, "version": version,
                                        "architecture": "amd64", "imageID": url},
                                 "disks": [{"name": "root", "sizeGB": size, "boot": True, "type": "virtio",
                                            "encrypted": False}]}, annotations=datavolume)
    return [vs_class("small"), vs_class("medium", True), vs_class("large"), vs_class("xlarge"),
            vs_machine("sample-machine", {"name": "test-vm"}, "default"),
            iso("example-machine-iso-debian", "debian-iso-vm", "debian", "13.3", 20),
            iso("example-machine-iso-talos", "talos-iso-vm", "talos", "1.11.5", 50),
            iso("example-machine-iso-ubuntu", "ubuntu-iso-vm", "ubuntu", "24.04", 50),
            vs_machine("test-machine", {"provider": "kubevirt", "machineClass": "small", "cpu": {"cores": 2},
                                        "memory": 268435456, "disks": [{"name": "root", "sizeGB": 20, "boot": True}]},
                       "my-custom-namespace"),
            vs_machine("simple-machine", {"machineClass": "small", "name": "simple-vm", "provider": "kubevirt"},
                       "default"),
            vs_machine("single-disk-machine", {"machineClass": "medium", "name": "single-disk-vm",
                                               "provider": "kubevirt",
                                               "disks": [{"name": "root", "sizeGB": 30, "boot": True,
                                                          "type": "virtio"}]}, "default"),
            vs_machine("multi-disk-machine", {
                "provider": "kubevirt", "machineClass": "large", "name": "multi-disk-vm", "memory": 268435456,
                "cpu": {"cores": 4},
                "disks": [{"name": "root", "sizeGB": 40, "boot": True, "type": "virtio", "encrypted": False},
                          {"name": "data1", "sizeGB": 100, "boot": False, "type": "virtio", "encrypted": False},
                          {"name": "data2", "sizeGB": 200, "boot": False, "type": "sata", "encrypted": False},
                          {"name": "scratch", "sizeGB": 50, "boot": False, "type": "scsi", "encrypted": False,
                           "iops": 3000, "throughput": 500}]}, "default"),
            vs_machine("example-machine-large", {"machineClass": "large", "name": "example-vm-large",
                                                 "provider": "kubevirt"}),
            vs_machine("example-machine-medium-with-overrides", {
                "machineClass": "medium", "name": "example-vm-medium-with-overrides", "provider": "kubevirt",
                "memory": 201326592, "cpu": {"cores": 3}}),
            vs_machine("example-machine-medium", {"machineClass": "medium", "name": "example-vm-medium",
                                                  "provider": "kubevirt"}),
            vs_machine("example-machine-small-ish", {"machineClass": "small", "provider": "kubevirt",
                                                     "name": "example-vm-small",
                                                     "cpu": {"cores": 4, "sockets": 4, "threadsPerCore": 2},
                                                     "memory": 268435456}),
            vs_machine("example-machine-small", {"machineClass": "small", "name": "example-vm-small",
                                                 "provider": "kubevirt"}),
            vs_machine("example-machine-with-disks", {
                "machineClass": "medium", "name": "example-vm-with-disks", "provider": "kubevirt",
                "disks": [{"name": "root", "sizeGB": 20, "boot": True, "type": "virtio", "encrypted": False},
                          {"name": "data", "sizeGB": 50, "boot": False, "type": "virtio", "encrypted": False},
                          {"name": "logs", "sizeGB": 10, "boot": False, "type": "virtio", "encrypted": False}]},
                       "default")]


def test_vitistack_kubevirt_examples_apply_with_kubevirt_served(lab3, served_image, fresh_cache):
    pools, entries = lab3
    documents = kubevirt_examples(served_image)
    names = [doc["metadata"]["name"] for doc in documents if doc["kind"] == "Machine"]
    assert len(names) == 14
    cleared = run_module("manifest", pools=entries, definition=documents, providers=KUBEVIRT_SERVED, state="absent",
                         shutdown_timeout=1)
    before = {pool.name: pool.domain_names() for pool in pools}
    # the first run that reads the documents (this one) downloads the URL once, records its sha256 and warns
    assert any(line.startswith("Machine/example-machine-iso-debian: spec.os.imageID: no checksum given: ")
               for line in warnings_of(cleared)), warnings_of(cleared)

    # libvirt alone is served by default: every example is refused naming its provider and the option
    refused = run_module("manifest", check=True, pools=entries, definition=documents)
    assert refused["failed"] and len(refused["problems"]) == 14, refused
    assert all("provider 'kubevirt' is not served by this run (the manifest option providers is [libvirt])"
               in line for line in refused["problems"]), refused["problems"]
    planned = run_module("manifest", check=True, pools=entries, definition=documents, providers=KUBEVIRT_SERVED)
    assert not planned.get("failed") and planned["changed"], planned
    assert {pool.name: pool.domain_names() for pool in pools} == before

    made = run_module("manifest", pools=entries, definition=documents, providers=KUBEVIRT_SERVED, wait="running",
                      wait_timeout=240)
    assert made["changed"] and not made.get("failed"), (made.get("msg"), warnings_of(made))
    for name in names:
        pool = where(pools, name)
        assert pool is not None and pool.domain(name).isActive(), name
    said = warnings_of(made)
    assert not any("no checksum given" in line for line in said), said
    assert any(line.startswith("Machine/sample-machine: spec.os: no image: the machine boots its empty boot disk")
               for line in said), said

    # from libvirt: the operator's default size and 10 GB empty boot disk, the topology, the buses and limits
    sample = where(pools, "sample-machine").domain("sample-machine")
    assert sample.info()[3] == 2 and sample.maxMemory() == 2 * 1024 * 1024
    xml = sample.XMLDesc(2)
    assert "<boot order='1'/>" in xml and "sample-machine-boot" in xml and "-root.qcow2" not in xml
    small = where(pools, "example-machine-small-ish").domain("example-machine-small-ish").XMLDesc(2)
    # libvirt 9 writes dies='1', libvirt 10 and later clusters='1' too: the attributes that matter are compared
    topology = etree.fromstring(small).find("cpu/topology")
    assert {key: topology.get(key) for key in ("sockets", "cores", "threads")} == \
        {"sockets": "4", "cores": "4", "threads": "2"}, small
    multi = where(pools, "multi-disk-machine").domain("multi-disk-machine").XMLDesc(2)
    assert "bus='sata'" in multi and "bus='scsi'" in multi and "<total_iops_sec>3000</total_iops_sec>" in multi
    assert "<total_bytes_sec>500000000</total_bytes_sec>" in multi, multi  # 500 MB/s
    # spec.name is the guest's host name, apart from metadata.name: from the guest's console
    for name, host in (("example-machine-iso-debian", "debian-iso-vm"), ("example-machine-iso-talos", "talos-iso-vm")):
        where(pools, name).wait_console(name, "MACHINERY-HOSTNAME %s" % host, timeout=240)
    tables = made["tables"]
    assert tables["Machine"][0].split()[:3] == ["NAME", "PHASE", "STATE"]
    assert tables["MachineClass"][0].split() == ["NAME", "CPU", "MEMORY", "ENABLED", "POOLS"]

    again = run_module("manifest", pools=entries, definition=documents, providers=KUBEVIRT_SERVED)
    assert again["changed"] is False and not again.get("failed"), again["actions"]
    assert not any("no checksum given" in line for line in warnings_of(again))  # recorded by the first run
    exported = run_module("manifest_info", pools=entries, dialect="vitistack", name=names)
    assert len(exported["documents"]) == 14
    shown = {doc["metadata"]["name"]: doc for doc in exported["documents"]}
    assert shown["multi-disk-machine"]["spec"]["disks"][3]["type"] == "scsi"
    assert shown["sample-machine"]["spec"]["disks"] == [{"name": "root", "sizeGB": 10, "boot": True}]
    reapplied = run_module("manifest", pools=entries, definition=exported["documents"])
    assert reapplied["changed"] is False and not reapplied.get("failed"), (reapplied.get("msg"), reapplied["actions"])

    deleted = run_module("manifest", pools=entries, definition=documents, providers=KUBEVIRT_SERVED,
                         state="absent", shutdown_timeout=1)
    assert not deleted.get("failed"), deleted
    assert all(where(pools, name) is None for name in names)
    assert all("sample-machine-boot" not in " ".join(pool.volumes()) for pool in pools)


def ks_documents(url):
    return [
        {"apiVersion": KS, "kind": "VirtualMachine", "metadata": {"name": "virtualmachine-sample"},
         "spec": {"image": "image-sample", "flavor": "flavor-sample", "keyPair": "keypair-sample",
                  "network": ["network-sample"], "virtualNetworks": ["virtualnetwork-sample"],
                  "diskAttachments": [{"name": "volume-sample"}]}},
        {"apiVersion": KS, "kind": "Flavor", "metadata": {"name": "flavor-sample"},
         "spec": {"vcpu": 1, "ram": 128, "disk": 1, "swap": 0, "rxtx": "1.0", "ephemeral": 0}},
        {"apiVersion": KS, "kind": "Image", "metadata": {"name": "image-sample"},
         "spec": {"src": url, "format": "raw"}},
        {"apiVersion": KS, "kind": "KeyPair", "metadata": {"name": "keypair-sample"}, "spec": {"publicKey": KEY}},
        {"apiVersion": KS, "kind": "Network", "metadata": {"name": "network-sample"},
         "spec": {"cidr": "10.10.10.1/24"}},
        {"apiVersion": KS, "kind": "VirtualNetwork", "metadata": {"name": "virtualnetwork-sample"},
         "spec": {"cidr": "10.10.20.0/24", "allocationPools": [{"startIP": "10.*.*.56", "endIP": "10.*.*.125"}],
                  "gatewayIP": "10.10.20.5", "mtu": 1200}},
        {"apiVersion": KS, "kind": "Volume", "metadata": {"name": "volume-sample", "namespace": "default"},
         "spec": {"size": "64Mi"}},
    ]


def test_kupenstack_sample_with_its_flavor_image_keypair_and_networks_boots(lab3, served_image, fresh_cache):
    pools, entries = lab3
    documents = ks_documents(served_image)
    run_module("manifest", pools=entries, definition=documents, state="absent", shutdown_timeout=1)
    assert all(pool.domain("virtualmachine-sample") is None for pool in pools)
    nets_before = {pool.name: sorted(pool.conn.listNetworks()) for pool in pools}

    planned = run_module("manifest", check=True, pools=entries, definition=documents)
    assert planned["changed"] and not planned.get("failed"), planned
    assert {pool.name: sorted(pool.conn.listNetworks()) for pool in pools} == nets_before
    assert all(pool.domain("virtualmachine-sample") is None for pool in pools)

    made = run_module("manifest", pools=entries, definition=documents, wait="address", wait_timeout=240)
    assert made["changed"] and not made.get("failed"), (made.get("msg"), warnings_of(made))
    actions = made["actions"]
    first_vm = next(i for i, line in enumerate(actions) if line.startswith("VirtualMachine/"))
    # the objects the VirtualMachine names, though later in the documents, were made before it
    assert all(i < first_vm for i, line in enumerate(actions)
               if line.split("/")[0] in ("Network", "VirtualNetwork", "Image", "Flavor", "Volume")), actions
    pool = where(pools, "virtualmachine-sample")
    for each in pools:  # a network of each pool, addressed as the documents say
        net = each.conn.networkLookupByName("virtualnetwork-sample").XMLDesc(0)
        assert "address='10.10.20.5'" in net and "start='10.10.20.56'" in net and "end='10.10.20.125'" in net
        assert "<mtu size='1200'/>" in net
        assert "address='10.10.10.1'" in each.conn.networkLookupByName("network-sample").XMLDesc(0)
    dom = pool.domain("virtualmachine-sample")
    assert dom.info()[3] == 1 and dom.maxMemory() == 128 * 1024
    record = dom.XMLDesc(2)
    assert NS in record and "volume-sample" in record and "network-sample" in record
    console = pool.wait_console("virtualmachine-sample", "MACHINERY-READY", timeout=240)
    assert KEY.split()[1] in console
    lease = [entry["ipaddr"] for entry in pool.leases("network-sample")]
    assert lease and all(ipaddress.ip_address(ip) in ipaddress.ip_network("10.10.10.0/24") for ip in lease)
    status = next(obj for obj in made["objects"] if obj["kind"] == "VirtualMachine")["status"]
    assert status["state"] == "Running" and status["node"] == pool.name and "network-sample(10.10.10." in status["ip"]
    for kind in ("VirtualMachine", "Flavor", "Image", "KeyPair", "Network", "VirtualNetwork", "Volume"):
        assert kind in made["tables"], made["tables"].keys()
    assert made["tables"]["Image"][1].split()[:3] == ["image-sample", "VirtualMachine/virtualmachine-sample", "true"]

    again = run_module("manifest", pools=entries, definition=documents)
    assert again["changed"] is False and not again.get("failed"), again["actions"]
    exported = run_module("manifest_info", pools=entries, dialect="kupenstack", name=["virtualmachine-sample"])
    document = exported["documents"][0]
    assert (document["spec"]["image"], document["spec"]["flavor"]) == ("image-sample", "flavor-sample")
    reapplied = run_module("manifest", pools=entries, definition=exported["documents"])
    assert reapplied["changed"] is False and not reapplied.get("failed"), reapplied["actions"]

    missing = copy.deepcopy(documents[0])
    missing["metadata"]["name"] = "lost-vm"
    missing["spec"]["flavor"] = "no-such-flavor"
    refused = run_module("manifest", pools=entries, definition=[missing])
    # the image, networks and volume are on the pools now; the flavor never was, and a key pair is not kept
    assert refused["failed"] and sorted(refused["problems"]) == [
        "VirtualMachine/lost-vm: spec.flavor: Flavor 'no-such-flavor' is neither among the documents nor published "
        "on a pool",
        "VirtualMachine/lost-vm: spec.keyPair: KeyPair 'keypair-sample' is not among the documents (the pools keep "
        "no key pairs: apply it with the VirtualMachine)"], refused
    assert all(each.domain("lost-vm") is None for each in pools)

    deleted = run_module("manifest", pools=entries, definition=documents, state="absent", shutdown_timeout=1)
    assert not deleted.get("failed"), deleted
    assert all(each.domain("virtualmachine-sample") is None for each in pools)
    assert {each.name: sorted(each.conn.listNetworks()) for each in pools} == nets_before


def test_vitistack_current_machine_with_cloud_init_refs_and_a_limited_boot_disk(lab3, served_image, fresh_cache):
    """A current-generation Machine in the shape of vitistack/common's CRD (commit 26fba3f): cloudInit user data
    from a Secret and network data from a ConfigMap, an image URL, a boot disk with iops and throughput."""
    pools, entries = lab3
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "viti-ci"},
              "stringData": {"userdata": "#cloud-config\nwrite_files: [{path: /etc/viti, content: from-secret}]\n"}}
    config = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "viti-net"},
              "data": {"networkdata": "version: 2\nethernets: {eth0: {dhcp4: true}}\n"}}
    machine = vs_machine("viti-current", {
        "name": "viti-host.example.com", "provider": "libvirt", "machineClass": "viti.small",
        "os": {"family": "linux", "distribution": "busybox", "version": "1", "imageID": served_image},
        "disks": [{"name": "root", "sizeGB": 1, "boot": True, "iops": 500, "throughput": 125}],
        "network": {"vpc": "machinery"},
        "cloudInit": {"type": "noCloud", "userDataSecretRef": {"name": "viti-ci"},
                      "networkDataConfigMapRef": {"name": "viti-net"}}})
    documents = [dict(vs_class("viti.small")), secret, config, machine]
    run_module("manifest", pools=entries, definition=documents, state="absent", shutdown_timeout=1)
    made = run_module("manifest", pools=entries, definition=documents, wait="running", wait_timeout=240)
    assert made["changed"] and not made.get("failed"), (made.get("msg"), warnings_of(made))
    pool = where(pools, "viti-current")
    xml = pool.domain("viti-current").XMLDesc(0)
    # the boot disk is a volume of the image (backed by its cached copy), booted first, with its own limits
    boot = next(disk for disk in xml.split("<disk ")[1:] if "/viti-current-boot.qcow2'" in disk.split("</disk>")[0])
    boot = boot.split("</disk>")[0]
    assert "<total_iops_sec>500</total_iops_sec>" in boot and "<total_bytes_sec>125000000</total_bytes_sec>" in boot
    assert "<boot order='1'/>" in boot and "<backingStore type='file'" in boot, boot
    assert "-root.qcow2" not in xml and '"machine_class":"viti.small"' in xml
    console = pool.wait_console("viti-current", "MACHINERY-READY", timeout=240)
    assert "MACHINERY-HOSTNAME viti-host.example.com" in console and "from-secret" in console, console[-2000:]
    again = run_module("manifest", pools=entries, definition=documents)
    assert again["changed"] is False and not again.get("failed"), again["actions"]
    exported = run_module("manifest_info", pools=entries, dialect="vitistack", name=["viti-current"])
    spec = exported["documents"][0]["spec"]
    assert spec["instanceType"] == "viti.small" and spec["os"]["imageID"] == served_image
    assert spec["disks"][0] == {"name": "root", "sizeGB": 1, "boot": True, "iops": 500, "throughput": 125}
    reapplied = run_module("manifest", pools=entries, definition=exported["documents"])
    assert reapplied["changed"] is False and not reapplied.get("failed"), (reapplied.get("msg"), reapplied["actions"])
    run_module("manifest", pools=entries, definition=documents, state="absent", shutdown_timeout=1)
    assert where(pools, "viti-current") is None

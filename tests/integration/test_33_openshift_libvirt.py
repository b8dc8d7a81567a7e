"""OpenShift's own libvirt providerSpec on the lab (issue 39): an installer-shaped MachineSet with its user-data
Secret applied on one pool, every effect read from libvirt (the domains, the overlay's backing file, the DHCP
host entries, autostart) and from inside the guests (the Ignition config on the console).

The documents follow the shape openshift/installer writes for libvirt (pkg/asset/machines/libvirt/machinesets.go
at 3c28bc3c21c20e261490b6e6bc1c3c1da53c4112: names <cluster>-worker-0, the cluster and machineset labels, a
LibvirtMachineProviderConfig with ignition.userDataSecret, volume {poolName, baseVolumeID}, networkInterfaceName,
networkInterfaceAddress as the machine network CIDR, uri) and the worker-user-data Secret the installer makes
(key userData: an Ignition config). Sizes are the lab's (the installer writes 8192 MiB and 4 vCPUs), autostart
true (the installer writes false, libvirt's default, which could not tell whether it was applied).
"""

import ipaddress
import xml.etree.ElementTree as ET

import pytest

from conftest import first_pool, run_module, warnings_of

CLUSTER = "ocp-lab7x"
SET = CLUSTER + "-worker-0"
BASE = CLUSTER + "-base"
LABELS = {"machine.openshift.io/cluster-api-machineset": SET, "machine.openshift.io/cluster-api-cluster": CLUSTER}


def documents(pool, cidr, **provider):
    value = {"apiVersion": "libvirtproviderconfig.openshift.io/v1beta1", "kind": "LibvirtMachineProviderConfig",
             "domainMemory": 128, "domainVcpu": 1, "ignition": {"userDataSecret": "worker-user-data"},
             "volume": {"poolName": "machinery", "baseVolumeID": BASE}, "networkInterfaceName": "machinery",
             "networkInterfaceAddress": cidr, "autostart": True, "uri": pool.uri}
    value.update(provider)
    # the interruptible-instance label (OpenShift's spot-instance sets carry it) puts the members under the
    # machine-api-operator's shipped health check
    template_labels = dict(LABELS, **{"machine.openshift.io/cluster-api-machine-role": "worker",
                                      "machine.openshift.io/cluster-api-machine-type": "worker",
                                      "machine.openshift.io/interruptible-instance": ""})
    machine_set = {"apiVersion": "machine.openshift.io/v1beta1", "kind": "MachineSet",
                   "metadata": {"name": SET, "namespace": "openshift-machine-api",
                                "labels": {"machine.openshift.io/cluster-api-cluster": CLUSTER}},
                   "spec": {"replicas": 2, "selector": {"matchLabels": dict(LABELS)},
                            "template": {"metadata": {"labels": template_labels},
                                         "spec": {"providerSpec": {"value": value}}}}}
    secret = {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
              "metadata": {"name": "worker-user-data", "namespace": "openshift-machine-api"},
              "stringData": {"disableTemplating": "true",
                             "userData": '{"ignition": {"version": "3.2.0"}, "storage": {"files": [{"path": '
                                         '"/etc/ocp-lab", "contents": {"source": "data:,worker"}}]}}'}}
    return [secret, machine_set]


def members(pool):
    return sorted(name for name in pool.domain_names() if name.startswith(SET + "-"))


def hosts(pool):
    tree = ET.fromstring(pool.conn.networkLookupByName("machinery").XMLDesc(0))
    return {host.get("mac"): host.get("ip") for host in tree.findall("ip/dhcp/host")}


def mac_of(dom):
    return ET.fromstring(dom.XMLDesc(0)).find("devices/interface/mac").get("address")


@pytest.fixture(scope="module")
def lab1(image):
    def clean(pool):
        run_module("manifest", pools=[pool.uri], definition=documents(pool, "10.0.0.0/24"), state="absent",
                   shutdown_timeout=2)
        run_module("volume", uri=pool.uri, name=BASE, state="absent", force=True)

    with first_pool(clean) as pool:
        made = run_module("volume", uri=pool.uri, name=BASE, image=image)
        assert not made.get("failed"), made
        tree = ET.fromstring(pool.conn.networkLookupByName("machinery").XMLDesc(0))
        ip = tree.find("ip")
        cidr = str(ipaddress.IPv4Network("%s/%s" % (ip.get("address"), ip.get("netmask") or ip.get("prefix")),
                                         strict=False))
        yield pool, cidr


def test_an_installer_machine_set_applies_boots_and_is_a_no_op_again(lab1):
    pool, cidr = lab1
    docs = documents(pool, cidr)
    planned = run_module("manifest", check=True, pools=[pool.uri], definition=docs)
    assert planned["changed"] and not planned.get("failed"), planned
    assert members(pool) == []

    made = run_module("manifest", pools=[pool.uri], definition=docs)
    assert not made.get("failed"), made
    names = members(pool)
    assert len(names) == 2, names
    base_path = pool.conn.storagePoolLookupByName("machinery").storageVolLookupByName(BASE).path()
    held = hosts(pool)
    addresses = []
    for name in names:
        dom = pool.domain(name)
        assert dom.isActive() and dom.autostart() == 1
        assert dom.maxMemory() == 128 * 1024 and dom.info()[3] == 1
        root = pool.conn.storagePoolLookupByName("machinery").storageVolLookupByName(name + "-root.qcow2")
        backing = ET.fromstring(root.XMLDesc(0)).find("backingStore/path").text
        assert backing == base_path  # the base volume itself, as the provider layers it
        assert root.info()[1] >= 17706254336  # the provider's default size when volumeSize is not given
        address = held.get(mac_of(dom))
        assert address is not None, (name, held)
        addresses.append(ipaddress.IPv4Address(address))
    network = ipaddress.IPv4Network(cidr)
    assert len(set(addresses)) == 2 and all(int(address) - int(network.network_address) >= 51 for address in addresses)
    for name in names:
        console = pool.wait_console(name, "MACHINERY-IGNITION-END", timeout=120)
        assert "data:,worker" in console
    machines = [obj for obj in made["objects"] if obj["kind"] == "MachineSet"]
    assert machines[0]["status"]["replicas"] == 2, made["objects"]

    again = run_module("manifest", pools=[pool.uri], definition=docs)
    assert again["changed"] is False and again["actions"] == [], again
    assert hosts(pool) == held


def go_written(docs):
    """The documents as Go's encoding/json writes them (oc get machineset -o yaml, the installer's manifests): every
    field of LibvirtMachineProviderConfig without omitempty, set or not, and the older Machine API's embedded
    ObjectMeta with creationTimestamp: null (issue 50)."""
    secret, machine_set = [dict(doc) for doc in docs]
    machine_set = {**machine_set, "metadata": dict(machine_set["metadata"], creationTimestamp=None),
                   "status": {"replicas": 0}}
    template = machine_set["spec"]["template"]
    value = dict(template["spec"]["providerSpec"]["value"], ignKey="", cloudInit=None, networkInterfaceHostname="",
                 networkUUID="")
    value["volume"] = dict(value["volume"], volumeName="")
    machine_set["spec"] = dict(machine_set["spec"], template={
        "metadata": dict(template["metadata"], creationTimestamp=None),
        "spec": {"metadata": {"creationTimestamp": None}, "lifecycleHooks": {}, "providerSpec": {"value": value}}})
    return [secret, machine_set]


def test_the_same_set_as_go_writes_it_is_the_same_set(lab1):
    pool, cidr = lab1
    before = members(pool)
    again = run_module("manifest", pools=[pool.uri], definition=go_written(documents(pool, cidr)))
    assert not again.get("failed"), again
    assert again["changed"] is False and again["actions"] == [], again
    said = "\n".join(warnings_of(again))
    for field in (".ignKey: ", "creationTimestamp: ", ".networkUUID: ", ".volumeName: ", ".cloudInit: ", " status: "):
        assert field not in said, said  # read as unset: neither refused nor warned
    assert members(pool) == before


# the health check the machine-api-operator ships (openshift/machine-api-operator,
# install/0000_30_machine-api-operator_13_machinehealthcheck.yaml at 6afce911d47e3afa073a30d2afb2722e8d9cb468)
SHIPPED_CHECK = {"apiVersion": "machine.openshift.io/v1beta1", "kind": "MachineHealthCheck",
                 "metadata": {"name": "machine-api-termination-handler", "namespace": "openshift-machine-api",
                              "labels": {"api": "clsuterapi", "k8s-app": "termination-handler"},
                              "annotations": {"include.release.openshift.io/self-managed-high-availability": "true",
                                              "exclude.release.openshift.io/internal-openshift-hosted": "true"}},
                 "spec": {"selector": {"matchLabels": {"machine.openshift.io/interruptible-instance": ""}},
                          "maxUnhealthy": "100%", "nodeStartupTimeout": "0",
                          "unhealthyConditions": [{"type": "Terminating", "status": "True", "timeout": "0s"}]}}
# the shape OpenShift's documentation gives every cloud's worker check
READY_CHECK = {"apiVersion": "machine.openshift.io/v1beta1", "kind": "MachineHealthCheck",
               "metadata": {"name": "workers-ready", "namespace": "openshift-machine-api"},
               "spec": {"selector": {"matchLabels": {"machine.openshift.io/cluster-api-machineset": SET}},
                        "unhealthyConditions": [{"type": "Ready", "status": "False", "timeout": "300s"},
                                                {"type": "Ready", "status": "Unknown", "timeout": "300s"}],
                        "maxUnhealthy": "40%", "nodeStartupTimeout": "10m"}}


def test_the_operators_shipped_check_and_a_ready_check_keep_the_set_at_size(lab1):
    pool, cidr = lab1
    names = members(pool)
    for name in names:  # the guest agent answers: the guest is ready (NodeReady), not merely running
        pool.wait_console(name, "MACHINERY-AGENT", timeout=120)
    applied = run_module("manifest", pools=[pool.uri], definition=documents(pool, cidr) + [SHIPPED_CHECK, READY_CHECK])
    assert not applied.get("failed") and applied["actions"] == [], applied
    assert members(pool) == names
    checks = {obj["metadata"]["name"]: obj["status"] for obj in applied["objects"]
              if obj["kind"] == "MachineHealthCheck"}
    assert checks["machine-api-termination-handler"]["expectedMachines"] == 2
    assert checks["machine-api-termination-handler"]["currentHealthy"] == 2  # startup check disabled by "0"
    assert checks["workers-ready"] == {"expectedMachines": 2, "currentHealthy": 2, "remediationsAllowed": 0}
    warned = [line for line in warnings_of(applied) if "spec.unhealthyConditions[0].type: Terminating" in line]
    assert warned, warnings_of(applied)


def test_a_uri_no_pool_has_is_refused_naming_it_and_nothing_changes(lab1):
    pool, cidr = lab1
    before = (members(pool), hosts(pool))
    docs = documents(pool, cidr, uri="qemu+ssh://root@nowhere/system", domainMemory=256)
    refused = run_module("manifest", pools=[pool.uri], definition=docs)
    assert refused["failed"] and "spec.template.spec.providerSpec.value.uri: no pool of this run has the URI" \
        in refused["msg"], refused
    missing = documents(pool, cidr, volume={"poolName": "machinery", "baseVolumeID": "no-such-base"})
    refused = run_module("manifest", pools=[pool.uri], definition=missing)
    assert refused["failed"] and "value.volume.baseVolumeID: " in refused["msg"], refused
    assert (members(pool), hosts(pool)) == before
    assert all(pool.domain(name).maxMemory() == 128 * 1024 for name in before[0])


def single_machine(pool, name, **provider):
    value = {"apiVersion": "libvirtproviderconfig.openshift.io/v1beta1", "kind": "LibvirtMachineProviderConfig",
             "domainMemory": 128, "domainVcpu": 1, "volume": {"poolName": "machinery", "baseVolumeID": BASE},
             "networkInterfaceName": "machinery", "uri": pool.uri}
    value.update(provider)
    return {"apiVersion": "machine.openshift.io/v1beta1", "kind": "Machine",
            "metadata": {"name": name, "namespace": "openshift-machine-api"},
            "spec": {"providerSpec": {"value": value}}}


def upload(pool, name, data):
    storage = pool.conn.storagePoolLookupByName("machinery")
    vol = storage.createXML("<volume><name>%s</name><capacity>%d</capacity><target><format type='raw'/>"
                            "</target></volume>" % (name, len(data)), 0)
    stream = pool.conn.newStream(0)
    vol.upload(stream, 0, len(data), 0)
    stream.send(data)
    stream.finish()


def test_ign_key_and_cloud_init_boot_with_the_providers_meaning(lab1):
    """ignKey: a volume of the pool holding the Ignition config (the provider's older way); cloudInit: the
    Secret's userData is a script, handed over as one with a cloud-config part for sshAccess."""
    pool, _cidr = lab1
    storage = pool.conn.storagePoolLookupByName("machinery")
    storage.refresh(0)
    if "ocp-lab.ign" in storage.listVolumes():
        storage.storageVolLookupByName("ocp-lab.ign").delete(0)
    upload(pool, "ocp-lab.ign", b'{"ignition": {"version": "3.2.0"}, "passwd": {"users": [{"name": "ign-key"}]}}')
    script = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "script-data"},
              "stringData": {"userData": "echo provider-script"}}
    docs = [single_machine(pool, "ocp-ignkey", ignKey="ocp-lab.ign"),
            single_machine(pool, "ocp-cloudinit", cloudInit={"userDataSecret": "script-data", "sshAccess": True}),
            script]
    try:
        made = run_module("manifest", pools=[pool.uri], definition=docs)
        assert not made.get("failed"), made
        assert any("cloudInit.sshAccess: the provider also installs its own fixed" in line
                   for line in warnings_of(made)), warnings_of(made)
        assert "ign-key" in pool.wait_console("ocp-ignkey", "MACHINERY-IGNITION-END", timeout=120)
        console = pool.wait_console("ocp-cloudinit", "MACHINERY-USERDATA-END", timeout=120)
        assert "#!/bin/bash\necho provider-script" in console.replace("\r", "") and "ssh_deletekeys" in console
        statuses = {obj["metadata"]["name"]: obj["status"] for obj in made["objects"] if obj["kind"] == "Machine"}
        provider = statuses["ocp-ignkey"]["providerStatus"]
        assert provider["instanceID"] == pool.domain("ocp-ignkey").UUIDString()
        assert provider["instanceState"] == "Running" and provider["conditions"][0]["type"] == "MachineCreated"
        exported = run_module("manifest_info", pools=[pool.uri], dialect="openshift", name=["ocp-ignkey"])
        assert exported["documents"][0]["spec"]["providerSpec"]["value"]["image"] == "volume:machinery/" + BASE
        reapplied = run_module("manifest", pools=[pool.uri], definition=exported["documents"])
        assert reapplied["changed"] is False and not reapplied.get("failed"), reapplied
    finally:
        run_module("manifest", pools=[pool.uri], definition=docs, state="absent", shutdown_timeout=2)
        storage.refresh(0)
        storage.storageVolLookupByName("ocp-lab.ign").delete(0)
    assert pool.domain("ocp-ignkey") is None and pool.domain("ocp-cloudinit") is None


def test_deleting_the_set_frees_its_addresses(lab1):
    pool, cidr = lab1
    names = members(pool)
    macs = {mac_of(pool.domain(name)) for name in names}
    assert macs and macs <= set(hosts(pool))
    gone = run_module("manifest", pools=[pool.uri], definition=documents(pool, cidr), state="absent",
                      shutdown_timeout=2)
    assert gone["changed"] and not gone.get("failed"), gone
    assert members(pool) == [] and not macs & set(hosts(pool))
    again = run_module("manifest", pools=[pool.uri], definition=documents(pool, cidr), state="absent")
    assert again["changed"] is False, again

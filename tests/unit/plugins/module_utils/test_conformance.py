"""Conformance (issue #22): every field a dialect's schema allows is applied, refused naming it, or warned about
naming it; never silently ignored.

The schemas are written here, apart from the dialects' tables, as maximal documents: every field the seeds
(IronCore's compute API and its storage and networking kinds, OpenShift's Machine API, KupenStack's
VirtualMachine, vitistack's Machine CRD) allow, set. The tests fail when a field of a schema is in none of the
table's three verdicts, when a reader reads a field its table does not list, when an applied field is never
read, and when a warned or refused field is not reported under its own path.
"""

import copy

import pytest

from ansible_collections.machinery.compute.plugins.module_utils.manifests import (
    conformance, engine, ironcore, kupenstack, openshift, vitistack)
from ansible_collections.machinery.compute.plugins.module_utils.manifests import documents as docs

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIAABAgMEBQYHCAkKCwwNDg8QERITFBUWFxgZGhscHR4f test@example"
SERVER_META = {"namespace": "default", "annotations": {"note": "x"}, "uid": "u-1", "resourceVersion": "1",
               "generation": 1, "creationTimestamp": "2026-01-01T00:00:00Z", "managedFields": [{"manager": "x"}],
               # what an export from a cluster carries too (issue 39)
               "finalizers": ["machine.machine.openshift.io"], "generateName": "web-",
               "ownerReferences": [{"apiVersion": "v1", "kind": "X", "name": "o", "uid": "u", "controller": True}],
               "deletionGracePeriodSeconds": 30, "selfLink": "/apis/x"}


def meta(name, **extra):
    return dict(SERVER_META, name=name, labels={"app": "web"}, **extra)


VOLUME_SPEC = {"volumeClassRef": {"name": "fast"}, "volumePoolSelector": {"zone": "a"},
               "imagePullSecretRef": {"name": "pull"}, "tolerations": [{"key": "k", "operator": "Exists"}],
               "resources": {"storage": "1Gi", "iops": "3000", "tps": "200M"}, "image": "my-image",
               "dataSource": {"osImage": {"image": "my-image"}}}
NIC_SPEC = {"networkRef": {"name": "machinery"}, "ips": [{"value": "10.0.0.5"}, {"ephemeral": {"prefixTemplate": {}}}],
            "virtualIP": {"virtualIPRef": {"name": "vip"}}, "prefixes": [{"value": "10.1.0.0/24"}],
            "ipFamilies": ["IPv4"]}
IC = "compute.ironcore.dev/v1alpha1"
IRONCORE = {
    "MachineClass": {"apiVersion": IC, "kind": "MachineClass", "metadata": meta("small"),
                     "capabilities": {"cpu": 1, "memory": "1Gi"}, "status": {}},
    "MachinePool": {"apiVersion": IC, "kind": "MachinePool", "metadata": meta("pool1"),
                    "spec": {"providerID": "ironcore://shared", "taints": [{"key": "k", "effect": "NoSchedule"}]},
                    "status": {"state": "Ready"}},
    "Volume": {"apiVersion": "storage.ironcore.dev/v1alpha1", "kind": "Volume", "metadata": meta("vol-1"),
               "spec": dict(VOLUME_SPEC, volumePoolRef={"name": "pool1"}), "status": {"state": "Available"}},
    "NetworkInterface": {"apiVersion": "networking.ironcore.dev/v1alpha1", "kind": "NetworkInterface",
                         "metadata": meta("nic-1"), "spec": dict(NIC_SPEC, machineRef={"name": "web-1"}),
                         "status": {"state": "Available"}},
    "Secret": {"apiVersion": "v1", "kind": "Secret", "metadata": meta("ign"), "type": "Opaque", "immutable": True,
               "data": {"ignition": "eyJpZ25pdGlvbiI6IHsidmVyc2lvbiI6ICIzLjQuMCJ9fQ=="},
               "stringData": {"other": "x"}},
    "Machine": {"apiVersion": IC, "kind": "Machine", "metadata": meta("web-1"), "status": {"state": "Running"},
                "spec": {
                    "machineClassRef": {"name": "small"}, "machinePoolRef": {"name": "pool1"},
                    "machinePoolSelector": {"zone": "a"},
                    "tolerations": [{"key": "k", "operator": "Equal", "value": "v", "effect": "NoSchedule"}],
                    "image": "my-image", "imagePullSecretRef": {"name": "pull"},
                    "volumes": [{"name": "rootdisk", "device": "a", "volumeRef": {"name": "vol-1"}},
                                {"name": "scratch", "emptyDisk": {"sizeLimit": "1Gi"}},
                                {"name": "eph", "ephemeral": {"volumeTemplate": {
                                    "metadata": {"labels": {"a": "b"}},
                                    "spec": dict(VOLUME_SPEC, volumePoolRef={"name": "pool1"})}}}],
                    "networkInterfaces": [{"name": "primary", "networkInterfaceRef": {"name": "nic-1"}},
                                          {"name": "eph", "ephemeral": {"networkInterfaceTemplate": {
                                              "metadata": {"labels": {"a": "b"}},
                                              "spec": dict(NIC_SPEC, machineRef={"name": "web-1"})}}}],
                    "ignitionRef": {"name": "ign", "key": "ignition"}, "power": "On",
                    "efiVars": [{"name": "Machinery", "uuid": "1f5a2e9c-0d4b-4c8e-9a71-3b6e2d8f4c10",
                                 "value": "AQID"}], "hostname": "web-1"}},
}

# IronCore's own types, every field set: ironcore-dev/ironcore api/compute/v1alpha1/machine_types.go,
# api/storage/v1alpha1/volume_types.go, api/networking/v1alpha1/networkinterface_types.go at v0.4.3 (spec.image,
# spec.imagePullSecret, a Volume's image and imagePullSecretRef) and at 0b3fd712 (v0.5+: guestConfig, localDisk),
# the device names its admission assigns (oda...) and the ephemeral volumeTemplate of its e2e samples
# (config/samples/e2e/bases/machine-with-ephemeral-resources/machine.yaml).
UPSTREAM_VOLUME_SPEC = {"volumeClassRef": {"name": "fast"}, "resources": {"storage": "10Gi"},
                        "encryption": {"secretRef": {"name": "enc"}},
                        "dataSource": {"osImage": {"image": "my-image", "architecture": "amd64"}}}
IRONCORE_UPSTREAM = {
    "Machine": {"apiVersion": IC, "kind": "Machine", "metadata": meta("web-2", uid="c0ffee00-0000-4000-8000-000000000001"),
                "spec": {
                    "machineClassRef": {"name": "small"}, "image": "my-image", "imagePullSecret": {"name": "pull"},
                    "guestConfig": {"hostname": "web-2"},
                    "volumes": [{"name": "root-disk", "device": "oda",
                                 "ephemeral": {"volumeTemplate": {"spec": UPSTREAM_VOLUME_SPEC}}},
                                {"name": "local", "device": "odb", "localDisk": {"sizeLimit": "1Gi",
                                                                                 "image": "my-image"}},
                                {"name": "shared", "device": "odc", "volumeRef": {"name": "vol-2"}}],
                    "networkInterfaces": [{"name": "primary", "networkInterfaceRef": {"name": "nic-2"}}],
                    "ignitionRef": {"name": "ign"}}},
    "Volume": {"apiVersion": "storage.ironcore.dev/v1alpha1", "kind": "Volume", "metadata": meta("vol-2"),
               "spec": {"volumePoolRef": {"name": "pool1"}, "resources": {"storage": "1Gi"},
                        "claimRef": {"name": "web-2", "uid": "c0ffee00-0000-4000-8000-000000000001"},
                        "imagePullSecretRef": {"name": "pull"}, "image": "my-image",
                        "encryption": {"secretRef": {"name": "enc"}},
                        "dataSource": {"volumeSnapshotRef": {"name": "snap"}}}},
    "NetworkInterface": {"apiVersion": "networking.ironcore.dev/v1alpha1", "kind": "NetworkInterface",
                         "metadata": meta("nic-2"),
                         "spec": {"networkRef": {"name": "machinery"}, "providerID": "libvirt://x",
                                  "attributes": {"vendor/x": "y"}, "ipFamilies": ["IPv4"], "ips": [{"value": "10.0.0.6"}],
                                  "machineRef": {"name": "web-2", "uid": "c0ffee00-0000-4000-8000-000000000001"}}},
    "MachineClass": {"apiVersion": IC, "kind": "MachineClass", "metadata": meta("gpu"),
                     "capabilities": {"cpu": 4, "memory": "16Gi", "nvidia.com/gpu": 1}},
}

OS = "machine.openshift.io/v1beta1"
PROVIDER = {"apiVersion": "machinery.compute/v1alpha1", "kind": "LibvirtMachineProviderSpec",
            "machineClass": "small", "cpu": 1, "memory": "1Gi", "image": "my-image", "imageChecksum": "sha256:" + "0" * 64,
            "rootSize": "2Gi", "firmware": "bios", "swap": "1Gi", "state": "running",
            "volumes": [{"name": "data", "size": "1Gi", "device": "vdb", "bus": "virtio", "ephemeral": True},
                        {"name": "shared", "volume": "vol-1"}, {"name": "copy", "image": "my-image"}],
            "networkInterfaces": [{"name": "eth0", "network": "machinery", "mac": "52:54:00:00:00:01",
                                  "model": "virtio"}, {"name": "eth1", "bridge": "br0"}],
            "sshAuthorizedKeys": [KEY], "userDataSecret": {"name": "user-data", "key": "userData"},
            "machinePool": "pool1", "machinePoolSelector": {"zone": "a"},
            "tolerations": [{"key": "k", "operator": "Equal", "value": "v", "effect": "NoSchedule"}]}


def machine_spec():
    return {"providerSpec": {"value": copy.deepcopy(PROVIDER)}, "providerID": "libvirt:///pool1/u",
            "taints": [{"key": "k", "effect": "NoSchedule"}], "metadata": {"labels": {"node": "x"}},
            "lifecycleHooks": {"preDrain": [{"name": "h", "owner": "o"}]}}


AUTOSCALER = {"machine.openshift.io/cluster-api-autoscaler-node-group-min-size": "1",
              "machine.openshift.io/cluster-api-autoscaler-node-group-max-size": "3"}
OPENSHIFT = {
    "Machine": {"apiVersion": OS, "kind": "Machine", "metadata": meta("os-1"),
                "spec": dict(machine_spec(), authoritativeAPI="MachineAPI"), "status": {"phase": "Running"}},
    "MachineSet": {"apiVersion": OS, "kind": "MachineSet",
                   "metadata": dict(meta("workers"), annotations=dict(AUTOSCALER)),
                   "spec": {"replicas": 2, "selector": {"matchLabels": {"set": "workers"}},
                            "deletePolicy": "Oldest", "minReadySeconds": 30, "authoritativeAPI": "MachineAPI",
                            "template": {"metadata": {"labels": {"set": "workers"}, "annotations": {"a": "b"}},
                                         "spec": machine_spec()}}},
    "MachineHealthCheck": {"apiVersion": OS, "kind": "MachineHealthCheck", "metadata": meta("workers"),
                           "spec": {"selector": {"matchLabels": {"set": "workers"}},
                                    "unhealthyConditions": [{"type": "Ready", "status": "Unknown", "timeout": "300s"},
                                                            {"type": "Ready", "status": "False", "timeout": "300s"}],
                                    "maxUnhealthy": "40%", "nodeStartupTimeout": "10m",
                                    "remediationTemplate": {"kind": "Metal3RemediationTemplate", "name": "r"}}},
    "Secret": {"apiVersion": "v1", "kind": "Secret", "metadata": meta("user-data"), "type": "Opaque",
               "immutable": True, "stringData": {"userData": "{\"ignition\": {\"version\": \"3.4.0\"}}"},
               "data": {"other": "eA=="}},
}

# Kupenstack/kupenstack commit aaa15113e5935344a7cba6169467ab9df4032d02: apis/v1alpha1 (the implemented
# VirtualMachine, Flavor, Image, KeyPair, Network, VirtualNetwork) and design-doc/custom-resources (the design's
# VirtualMachine form, Volume, VirtualNetwork), every field set
KS = "kupenstack.io/v1alpha1"
KS_KINDS = {
    "Flavor": {"apiVersion": KS, "kind": "Flavor", "metadata": meta("m1.tiny"),
               "spec": {"vcpu": 1, "ram": 128, "disk": 1, "swap": 64, "rxtx": "1.0", "ephemeral": 1},
               "status": {"usage": {"inUse": []}, "id": "x"}},
    "Image": {"apiVersion": KS, "kind": "Image", "metadata": meta("cirros"),
              "spec": {"src": "http://images.example.com/cirros.img", "format": "qcow2", "containerFormat": "bare",
                       "minDisk": 1, "minRam": 64}, "status": {"usage": {"inUse": []}, "ready": True}},
    "KeyPair": {"apiVersion": KS, "kind": "KeyPair", "metadata": meta("mykey"), "spec": {"publicKey": KEY},
                "status": {"usage": {"inUse": []}}},
    "Network": {"apiVersion": KS, "kind": "Network", "metadata": meta("net-a"), "spec": {"cidr": "10.10.10.0/24"},
                "status": {"usage": {"inUse": []}}},
    "VirtualNetwork": {"apiVersion": KS, "kind": "VirtualNetwork", "metadata": meta("net-b"),
                       "spec": {"cidr": "10.10.20.0/24",
                                "allocationPools": [{"startIP": "10.10.20.100", "endIP": "10.10.20.150"}],
                                "gatewayIP": "10.10.20.5", "disableDhcp": False, "mtu": 1400},
                       "status": {"ready": True, "gatewayName": "none"}},
    "Volume": {"apiVersion": KS, "kind": "Volume", "metadata": meta("vol-a"),
               "spec": {"size": "1Gi", "source": {"image": "cirros"}}, "status": {"ready": True}},
}
KS_VM = {"apiVersion": KS, "kind": "VirtualMachine", "metadata": meta("impl-vm"),
         "spec": {"image": "cirros", "flavor": "m1.tiny", "keyPair": "mykey", "network": ["net-a", "net-b"]},
         "status": {"id": "x", "state": "Running", "ip": "", "node": "n"}}
KUPENSTACK_IMPLEMENTED = {"VirtualMachine": KS_VM}
KUPENSTACK = {"VirtualMachine": {
    "apiVersion": "kupenstack.io/v1alpha1", "kind": "VirtualMachine", "metadata": meta("sample-vm"),
    "spec": {"running": True, "vcpu": 3, "memory": "500Mi", "swap": "1Gi", "publicKey": KEY,
             "virtualNetworks": ["net-db", "net-backend"], "diskAttachments": [{"name": "boot-vol"}]},
    "status": {"id": "x", "phase": "Running", "node": "node1", "ip": "", "restartCount": 0}}}

VITISTACK = {"Machine": {
    "apiVersion": "vitistack.io/v1alpha1", "kind": "Machine", "metadata": meta("vm-1"),
    "spec": {"name": "vm-1", "instanceType": "small",
             "os": {"family": "linux", "distribution": "debian", "version": "12", "architecture": "amd64",
                    "imageID": "debian-12", "imageFamily": "debian-12"},
             "providerConfig": {"name": "libvirt", "region": "west", "zone": "a", "config": {"k": "v"},
                                "credentialsRef": {"name": "creds"}},
             "cpu": {"cores": 2, "threadsPerCore": 1, "sockets": 1}, "memory": 536870912,
             "disks": [{"name": "root", "sizeGB": 20, "boot": True, "type": "gp3"},
                       {"name": "data", "sizeGB": 1, "encrypted": True, "iops": 3000, "throughput": 125}],
             "network": {"vpc": "machinery", "subnet": "subnet-1", "assignPublicIP": True, "privateIP": "10.0.1.100",
                         "publicIP": "eip-1", "interfaces": [{"name": "eth0", "primary": True, "subnet": "subnet-1",
                                                              "securityGroups": ["sg-web"]}]},
             "sshKeys": [KEY], "userData": "#cloud-config\n", "tags": {"team": "platform"},
             "securityGroups": ["sg-mon"], "monitoring": True,
             "backup": {"enabled": True, "schedule": "0 2 * * *", "retentionDays": 30}},
    "status": {"phase": "Running", "lastUpdated": "2026-01-01T00:00:00Z"}}}

# vitistack/common's current generation (commit 26fba3f, crds/vitistack.io_machines.yaml and
# vitistack.io_machineclasses.yaml): every field, in two documents where the CRD's cloud-init sources exclude
# each other (user data from a Secret and network data from a ConfigMap, then the other way round)
VS_CURRENT = {
    "apiVersion": "vitistack.io/v1alpha1", "kind": "Machine", "metadata": meta("vm-2"),
    "spec": {"name": "vm-2.example.com", "machineClass": "small", "provider": "libvirt", "machineType": "q35",
             "os": {"family": "linux", "distribution": "debian", "version": "12", "architecture": "amd64",
                    "isoUri": "https://images.example.com/debian-12.iso", "imageFamily": "debian-12"},
             "cpu": {"cores": 2}, "memory": 536870912,
             "disks": [{"name": "root", "sizeGB": 20, "boot": True},
                       {"name": "data", "sizeGB": 1, "type": "scsi", "device": "/dev/sdb"}],
             "network": {"vpc": "machinery", "networkNamespaceName": "nn-1"},
             "cloudInit": {"type": "noCloud", "userDataSecretRef": {"name": "ci", "key": "userdata"},
                           "networkDataConfigMapRef": {"name": "ci-net", "key": "networkdata"}}}}
VS_CURRENT_OTHER = copy.deepcopy(VS_CURRENT)
VS_CURRENT_OTHER["metadata"]["name"] = "vm-3"
VS_CURRENT_OTHER["spec"]["cloudInit"] = {"type": "noCloud", "userDataConfigMapRef": {"name": "ci-net", "key": "u"},
                                         "networkDataSecretRef": {"name": "ci", "key": "networkdata"}}
VS_COMPANIONS = [
    {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "ci"},
     "stringData": {"userdata": "#cloud-config\n", "networkdata": "version: 2\n"}},
    {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "ci-net"},
     "data": {"networkdata": "version: 2\n", "u": "#cloud-config\n"}}]
VITISTACK_CURRENT = {"Machine": VS_CURRENT, "MachineClass": {
    "apiVersion": "vitistack.io/v1alpha1", "kind": "MachineClass", "metadata": meta("small"),
    "spec": {"enabled": True, "default": True, "category": "Standard", "displayName": "Small", "description": "d",
             "cpu": {"cores": 2, "sockets": 1, "threads": 1},
             "memory": {"quantity": "1Gi", "minQuantity": "512Mi", "maxQuantity": "2Gi"},
             "machineProviders": ["libvirt"], "gpu": {"cores": 0, "manufacturer": "none"}},
    "status": {"phase": "Ready"}},
    "ConfigMap": {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta("ci-net"), "immutable": True,
                  "data": {"networkdata": "version: 2\n"}, "binaryData": {"blob": "eA=="}}}
VITISTACK_OTHER = {"Machine": VS_CURRENT_OTHER}

# OpenShift's own libvirt providerSpec, every field of LibvirtMachineProviderConfig set (its Go type in
# openshift/cluster-api-provider-libvirt, pkg/apis/libvirtproviderconfig/v1beta1/libvirtmachineproviderconfig_types.go
# at a336f0b5), in a Machine and in a MachineSet.
UPSTREAM_PROVIDER = {"apiVersion": "libvirtproviderconfig.openshift.io/v1beta1", "kind": "LibvirtMachineProviderConfig",
                     "domainMemory": 2048, "domainVcpu": 2, "ignKey": "worker.ign",
                     "ignition": {"userDataSecret": "user-data"},
                     "cloudInit": {"userDataSecret": "user-data", "sshAccess": True},
                     "volume": {"poolName": "default", "baseVolumeID": "coreos_base", "volumeName": "ignored",
                                "volumeSize": "20Gi"},
                     "networkInterfaceName": "machinery", "networkInterfaceHostname": "h",
                     "networkInterfaceAddress": "192.168.100.0/24", "networkUUID": "u", "autostart": True,
                     "uri": "qemu:///system"}


def upstream_spec():
    return dict(machine_spec(), providerSpec={"value": copy.deepcopy(UPSTREAM_PROVIDER)})


OPENSHIFT_LIBVIRT = {
    "Machine": {"apiVersion": OS, "kind": "Machine", "metadata": meta("os-2"), "spec": upstream_spec()},
    "MachineSet": {"apiVersion": OS, "kind": "MachineSet", "metadata": meta("workers-2"),
                   "spec": {"replicas": 2, "selector": {"matchLabels": {"set": "workers"}},
                            "authoritativeAPI": "MachineAPI",
                            "template": {"metadata": {"labels": {"set": "workers"}, "name": "w", "generateName": "w-",
                                                      "namespace": "openshift-machine-api",
                                                      "ownerReferences": [{"kind": "MachineSet", "name": "w"}]},
                                         "spec": dict(upstream_spec(), authoritativeAPI="MachineAPI")}}},
}

SCHEMAS = [(ironcore, IRONCORE), (ironcore, IRONCORE_UPSTREAM), (openshift, OPENSHIFT),
           (openshift, OPENSHIFT_LIBVIRT), (kupenstack, KUPENSTACK), (kupenstack, KS_KINDS),
           (kupenstack, KUPENSTACK_IMPLEMENTED), (vitistack, VITISTACK), (vitistack, VITISTACK_CURRENT),
           (vitistack, VITISTACK_OTHER)]
CASES = [(dialect, kind, doc) for dialect, kinds in SCHEMAS for kind, doc in kinds.items()]
IDS = ["%s-%s-%s" % (dialect.__name__.rsplit(".", 1)[1], kind, doc["metadata"]["name"]) for dialect, kind, doc in CASES]


class FakePools:
    def __init__(self):
        self.snapshots = [{"name": "pool1", "classes": {"small": {}}}]
        self.by_name = {"pool1": self.snapshots[0]}
        self.volumes = {"pool1": {"vol-1", "boot-vol"}}
        self.images = {"pool1": {"my-image": {}, "debian-12": {
            "os": {"family": "linux", "distribution": "debian", "version": "12"}}}}
        self.machines = []

    def class_on(self, name):
        return ["pool1"] if name == "small" else []

    def volume_on(self, name):
        return ["pool1"] if name in self.volumes["pool1"] else []

    def networks_of(self, pool):
        return {"machinery", "net-db", "net-backend"}


class Read(dict):
    """A mapping of a document that records the path of every key a reader asks for."""

    def __init__(self, value, path, seen):
        super().__init__({key: _track(item, "%s.%s" % (path, key) if path else key, seen)
                          for key, item in value.items()})
        self.path, self.seen = path, seen

    def _note(self, key):
        self.seen.add(("%s.%s" % (self.path, key) if self.path else str(key), self.path or None))

    def get(self, key, default=None):
        self._note(key)
        return super().get(key, default)

    def __getitem__(self, key):
        self._note(key)
        return super().__getitem__(key)

    def __contains__(self, key):
        self._note(key)
        return super().__contains__(key)


def _track(value, path, seen):
    if isinstance(value, dict):
        return Read(value, path, seen)
    if isinstance(value, list):
        return [_track(item, "%s[%d]" % (path, index), seen) for index, item in enumerate(value)]
    return value


def _companions(dialect, kind):
    """The documents a kind's references need, so that its reader runs to the end."""
    if dialect is ironcore and kind == "Machine":
        encryption = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "enc"},
                      "data": {"encryptionKey": "c2VjcmV0LWtleS1vZi0zMi1ieXRlcy0xMjM0NTY3OA=="}}
        pull = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "pull"},
                "type": "kubernetes.io/dockerconfigjson",
                "stringData": {".dockerconfigjson": '{"auths": {"registry.example.com": {"auth": "dTpw"}}}'}}
        return [IRONCORE[name] for name in ("Volume", "NetworkInterface", "Secret")] + [
            IRONCORE_UPSTREAM["Volume"], IRONCORE_UPSTREAM["NetworkInterface"], encryption, pull]
    if dialect is openshift and kind in ("Machine", "MachineSet"):
        return [OPENSHIFT["Secret"]]
    if dialect is vitistack and kind == "Machine":
        return copy.deepcopy(VS_COMPANIONS)
    if dialect is kupenstack and kind == "Volume":
        return [copy.deepcopy(KS_KINDS["Image"])]
    if dialect is kupenstack and kind == "VirtualMachine":
        return [copy.deepcopy(KS_KINDS[name]) for name in ("Flavor", "Image", "KeyPair", "Network",
                                                           "VirtualNetwork")]
    return []


def _run(documents):
    problems = docs.Problems()
    objects = engine.parse([("definition[%d]" % index, doc) for index, doc in enumerate(documents)], problems)
    pools = FakePools()
    engine.link(objects, problems, pools)
    for obj in objects:
        if not problems.of(obj.ref):
            engine.core_checks(obj, docs.Fields(problems, obj.ref), pools)
    return problems


def _leaves(doc):
    for where, parent, value in conformance.walk(doc):
        if not isinstance(value, (dict, list)) or value in ({}, []) or (
                isinstance(value, list) and not any(isinstance(item, (dict, list)) for item in value)):
            if value not in (None, False, "", [], {}):
                yield where, parent


def _is_container(fields_table, path):
    return any(key.startswith(path + ".") or key.startswith(path + "[]") for key in fields_table)


@pytest.mark.parametrize("dialect, kind, doc", CASES, ids=IDS)
def test_every_field_of_the_schema_is_applied_warned_or_refused(dialect, kind, doc):
    fields_table = dialect.FIELDS[kind]
    missing = [where for where, parent in _leaves(doc) if conformance.lookup(fields_table, where, parent) is None
               and not any(conformance.lookup(fields_table, head, None) not in (None, conformance.APPLIED)
                           for head in _heads(where))]
    assert missing == []
    assert all(verdict == conformance.APPLIED or (verdict[0] in ("warned", "refused") and verdict[1])
               for verdict in fields_table.values())


def _heads(where):
    """The paths of the containers of ``where`` (spec, spec.volumes[0], ...)."""
    heads, current = [], ""
    for part in where.replace("[", ".[").split("."):
        current = current + part if part.startswith("[") else (current + "." + part if current else part)
        heads.append(current)
    return heads[:-1]


@pytest.mark.parametrize("dialect, kind, doc", CASES, ids=IDS)
def test_readers_read_only_the_fields_their_table_lists_and_every_applied_one(dialect, kind, doc):
    """Every applied field is read by one of the kind's documents (a kind can have more than one shape: the
    seed's providerSpec and OpenShift's own)."""
    fields_table = dialect.FIELDS[kind]
    seen = set()
    for variant in [other for mod, other_kind, other in CASES if mod is dialect and other_kind == kind]:
        # a kind whose fields exclude each other has several documents: together they read every field
        _run(_companions(dialect, kind) + [_track(copy.deepcopy(variant), "", seen)])
    read = {(conformance.generic(where), parent and conformance.generic(parent)) for where, parent in seen}
    unlisted = sorted(where for where, parent in read if conformance.lookup(fields_table, where, parent) is None
                      and not _is_container(fields_table, where)
                      and not any(conformance.lookup(fields_table, head, None) for head in _heads(where)))
    assert unlisted == [], "read but not in the table"
    for other in [item for item_dialect, item_kind, item in CASES if item_dialect is dialect and item_kind == kind
                  and item is not doc]:
        _run(_companions(dialect, kind) + [_track(copy.deepcopy(other), "", seen)])
    read = {(conformance.generic(where), parent and conformance.generic(parent)) for where, parent in seen}
    unlisted = sorted(where for where, parent in read if conformance.lookup(fields_table, where, parent) is None
                      and not _is_container(fields_table, where)
                      and not any(conformance.lookup(fields_table, head, None) for head in _heads(where)))
    assert unlisted == [], "read but not in the table"
    read_paths = {where for where, _parent in read}
    unread = sorted(path for path, verdict in fields_table.items() if verdict == conformance.APPLIED
                    and path.rstrip(".*") not in read_paths and path[:-2] not in read_paths
                    and not path.startswith("metadata.") and path not in ("apiVersion", "kind"))
    assert unread == [], "applied but never read"


@pytest.mark.parametrize("dialect, kind, doc", CASES, ids=IDS)
def test_warned_and_refused_fields_are_reported_under_their_own_path(dialect, kind, doc):
    fields_table = dialect.FIELDS[kind]
    problems = _run(_companions(dialect, kind) + [copy.deepcopy(doc)])
    ref = "%s/%s: " % (kind, doc["metadata"]["name"])
    said = [line[len(ref):] for line in problems.warnings + problems.errors if line.startswith(ref)]
    for where, parent in _leaves(doc):
        verdict = conformance.lookup(fields_table, where, parent)
        heads = [head for head in _heads(where) + [where]
                 if conformance.lookup(fields_table, head, None) not in (None, conformance.APPLIED)]
        if verdict is None or verdict == conformance.APPLIED:
            if not heads:
                continue
        shown = heads[0] if heads else where
        if (verdict or conformance.lookup(fields_table, shown, None)) in (None, conformance.APPLIED):
            continue
        assert any(line.startswith(shown + ": ") for line in said), (shown, said)
    applied_errors = [line for line in problems.errors if line.startswith(ref)
                      and conformance.lookup(fields_table, line[len(ref):].split(": ")[0], None) == conformance.APPLIED]
    assert applied_errors == []

"""KupenStack's upstream samples, parsed and linked as the manifest module does.

Written in the shape of Kupenstack/kupenstack commit aaa15113e5935344a7cba6169467ab9df4032d02,
config/samples/virtualmachine-sample.yaml, flavor-sample.yaml, image-sample.yaml, keypair-with-public-key.yaml,
keypair-without-public-key.yaml, network-sample.yaml and virtualnetwork-sample.yaml, and
design-doc/custom-resources/volume.md and virtualnetwork.md.
"""

import copy

import pytest

from ansible_collections.machinery.compute.plugins.module_utils.manifests import documents as docs
from ansible_collections.machinery.compute.plugins.module_utils.manifests import engine

KS = "kupenstack.io/v1alpha1"
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIAABAgMEBQYHCAkKCwwNDg8QERITFBUWFxgZGhscHR4f test@example"
FLAVOR = {"apiVersion": KS, "kind": "Flavor", "metadata": {"name": "flavor-sample"},
          "spec": {"vcpu": 2, "ram": 500, "disk": 1, "swap": 0, "rxtx": "1.0", "ephemeral": 0}}
IMAGE = {"apiVersion": KS, "kind": "Image", "metadata": {"name": "image-sample"},
         "spec": {"src": "http://download.cirros-cloud.net/0.5.1/cirros-0.5.1-x86_64-disk.img", "format": "raw"}}
KEYPAIR = {"apiVersion": KS, "kind": "KeyPair", "metadata": {"name": "keypair-sample"}, "spec": {"publicKey": KEY}}
KEYPAIR_GENERATED = {"apiVersion": KS, "kind": "KeyPair", "metadata": {"name": "keypair-sample-2"}}
NETWORK = {"apiVersion": KS, "kind": "Network", "metadata": {"name": "network-sample"},
           "spec": {"cidr": "10.10.10.1/24"}}
VNET = {"apiVersion": KS, "kind": "VirtualNetwork", "metadata": {"name": "virtualnetwork-sample"},
        "spec": {"allocationPools": [{"startIP": "10.*.*.56", "endIP": "10.*.*.125"}], "mtu": 1200}}
VOLUME = {"apiVersion": KS, "kind": "Volume", "metadata": {"name": "volume-sample", "namespace": "default"},
          "spec": {"size": "2Gi", "source": {"image": "image-sample"}}}
VM = {"apiVersion": KS, "kind": "VirtualMachine", "metadata": {"name": "virtualmachine-sample"},
      "spec": {"image": "image-sample", "flavor": "flavor-sample"}}


class Pools:
    def __init__(self):
        self.snapshots = [{"name": "pool1", "classes": {}}]
        self.by_name = {"pool1": self.snapshots[0]}
        self.volumes = {"pool1": set()}
        self.images = {"pool1": {}}
        self.machines = []

    def class_on(self, name):
        return []

    def volume_on(self, name):
        return []

    def networks_of(self, pool):
        return {"default"}


def check(*documents):
    try:
        objects, warnings = engine.check_documents([("d[%d]" % i, doc) for i, doc in enumerate(documents)], Pools())
    except docs.ManifestError as exc:
        return None, exc.problems, []
    return {obj.ref: obj for obj in objects}, [], warnings


def test_the_sample_with_its_flavor_image_keypair_and_network_in_any_order():
    vm = copy.deepcopy(VM)
    vm["spec"].update(keyPair="keypair-sample", network=["network-sample"])
    # the VirtualMachine first: the objects it names come later in the documents and are made before it
    objects, errors, warnings = check(vm, FLAVOR, IMAGE, KEYPAIR, NETWORK)
    assert errors == []
    params = objects["VirtualMachine/virtualmachine-sample"].params
    assert (params["machine_class"], params["image"], params["root_size"]) == ("flavor-sample", "image-sample", 2 ** 30)
    assert params["ssh_authorized_keys"] == [KEY]
    assert params["network_interfaces"] == [{"name": "network-sample", "network": "network-sample",
                                             "ephemeral": True}]
    assert objects["Flavor/flavor-sample"].data == {"name": "flavor-sample", "cpu": 2, "memory": 500 * 2 ** 20}
    assert objects["Network/network-sample"].data == {"name": "network-sample", "cidr": "10.10.10.0/24",
                                                      "dhcp": True}
    assert [line.split(": ")[1] for line in warnings] == ["spec.rxtx", "spec.format"]


def test_the_upstream_sample_as_it_is_takes_the_default_network():
    objects, errors, _warnings = check(VM, FLAVOR, IMAGE)
    assert errors == []
    assert objects["VirtualMachine/virtualmachine-sample"].params["network_interfaces"][0]["network"] == "default"


def test_a_reference_to_a_missing_object_is_refused_naming_it():
    vm = copy.deepcopy(VM)
    vm["spec"].update(keyPair="gone", network=["no-net"])
    _objects, errors, _warnings = check(vm)
    assert sorted(errors) == sorted([
        "VirtualMachine/virtualmachine-sample: spec.flavor: Flavor 'flavor-sample' is neither among the documents "
        "nor published on a pool",
        "VirtualMachine/virtualmachine-sample: spec.keyPair: KeyPair 'gone' is not among the documents (the pools "
        "keep no key pairs: apply it with the VirtualMachine)",
        "VirtualMachine/virtualmachine-sample: spec.image: no image named 'image-sample' is published on any pool "
        "of this run (pool1) (publish it with machinery.compute.machine_image)",
        "VirtualMachine/virtualmachine-sample: spec.network[0]: no libvirt network 'no-net' on any pool of this run "
        "(pool1)"])


def test_a_generated_key_pair_is_refused_with_the_reason():
    _objects, errors, _warnings = check(KEYPAIR_GENERATED)
    assert errors[0].startswith("KeyPair/keypair-sample-2: spec.publicKey: required here: KupenStack generates")


def test_virtual_network_fills_its_wildcards_and_volume_takes_an_image():
    objects, errors, _warnings = check(VNET, VOLUME, IMAGE)
    assert errors == []
    data = objects["VirtualNetwork/virtualnetwork-sample"].data
    assert data["cidr"].startswith("10.") and data["cidr"].endswith(".0/24") and data["mtu"] == 1200
    prefix = data["cidr"].rsplit(".", 1)[0]
    assert (data["dhcp_start"], data["dhcp_end"]) == (prefix + ".56", prefix + ".125")
    assert objects["Volume/volume-sample"].data["image"] == "image-sample"
    assert objects["Volume/volume-sample"].data["size"] == 2 * 2 ** 30


@pytest.mark.parametrize("doc, path, words", [
    ({"apiVersion": KS, "kind": "Flavor", "metadata": {"name": "f"}, "spec": {"ram": 128}}, "spec.vcpu",
     "required value"),
    ({"apiVersion": KS, "kind": "Image", "metadata": {"name": "i"}, "spec": {"src": "/tmp/x.img"}}, "spec.src",
     "not an http(s) URL"),
    ({"apiVersion": KS, "kind": "Image", "metadata": {"name": "i"},
      "spec": {"src": "http://x.example/a.img", "containerFormat": "ovf"}}, "spec.containerFormat", "archive"),
    ({"apiVersion": KS, "kind": "Network", "metadata": {"name": "n"}, "spec": {"cidr": "10.0.0.0/30"}}, "spec.cidr",
     "at least 16 addresses"),
    ({"apiVersion": KS, "kind": "VirtualNetwork", "metadata": {"name": "n"},
      "spec": {"cidr": "10.9.0.0/24", "allocationPools": [{"startIP": "10.9.0.10"}, {"startIP": "10.9.0.50"}]}},
     "spec.allocationPools[1]", "one DHCP range"),
    ({"apiVersion": KS, "kind": "VirtualNetwork", "metadata": {"name": "n"},
      "spec": {"cidr": "10.9.0.0/24", "gatewayIP": "10.8.0.1"}}, "spec.gatewayIP", "not a host address"),
    ({"apiVersion": KS, "kind": "Volume", "metadata": {"name": "v"}, "spec": {}}, "spec.size", "required value"),
    ({"apiVersion": KS, "kind": "VirtualMachine", "metadata": {"name": "vm"}, "spec": {"image": "x"}}, "spec.vcpu",
     "required value (or spec.flavor)"),
])
def test_bad_companion_documents_name_their_field(doc, path, words):
    _objects, errors, _warnings = check(doc)
    ref = "%s/%s: %s: " % (doc["kind"], doc["metadata"]["name"], path)
    assert any(line.startswith(ref) and words in line for line in errors), errors

"""The IronCore fields that were "unknown field" (issue 50), each applied or refused naming it and why: a volume
template's volumePoolRef, resources.iops and resources.tps (of a template and of a Volume: the disk QoS of the
machine's volume), and a network-interface template's machineRef. Written from ironcore-dev/ironcore's types
(api/storage/v1alpha1 VolumeSpec and ResourceIOPS / ResourceTPS, api/networking/v1alpha1 NetworkInterfaceSpec)."""

import copy

import pytest

from ansible_collections.machinery.compute.plugins.module_utils.manifests import documents as docs
from ansible_collections.machinery.compute.plugins.module_utils.manifests import engine

IC = "compute.ironcore.dev/v1alpha1"
STORAGE = "storage.ironcore.dev/v1alpha1"
TEMPLATE = "spec.volumes[0].ephemeral.volumeTemplate.spec"
NIC_TEMPLATE = "spec.networkInterfaces[0].ephemeral.networkInterfaceTemplate.spec"


class Pools:
    snapshots = [{"name": "pool1", "classes": {"small": {}}}, {"name": "pool2", "classes": {"small": {}}}]
    by_name = {"pool1": snapshots[0], "pool2": snapshots[1]}
    volumes = {"pool1": set(), "pool2": set()}
    images = {"pool1": {"my-image": {}}, "pool2": {"my-image": {}}}

    def class_on(self, name):
        return ["pool1", "pool2"]

    def volume_on(self, name):
        return []

    def networks_of(self, pool):
        return {"machinery"}


def machine(template=None, nic=None, **spec):
    doc = {"apiVersion": IC, "kind": "Machine", "metadata": {"name": "web"},
           "spec": dict({"machineClassRef": {"name": "small"}, "image": "my-image",
                         "volumes": [{"name": "data", "ephemeral": {"volumeTemplate": {"spec": dict(
                             {"resources": {"storage": "1Gi"}}, **(template or {}))}}}],
                         "networkInterfaces": [{"name": "primary", "ephemeral": {"networkInterfaceTemplate": {
                             "spec": dict({"networkRef": {"name": "machinery"}}, **(nic or {}))}}}]}, **spec)}
    return doc


def check(*documents):
    """(objects by ref, warnings) of check mode's reading, or the ManifestError's problems."""
    try:
        objects, warnings = engine.check_documents([("d[%d]" % i, d) for i, d in enumerate(documents)], Pools())
    except docs.ManifestError as exc:
        return None, exc.problems
    return {obj.ref: obj for obj in objects}, warnings


def test_a_volume_templates_pool_places_the_machine_whose_storage_holds_it():
    objects, warnings = check(machine({"volumePoolRef": {"name": "pool2"}}))
    assert objects is not None, warnings
    assert objects["Machine/web"].params["machine_pool"] == "pool2"


@pytest.mark.parametrize("spec, said", [
    ({"machinePoolRef": {"name": "pool1"}},
     TEMPLATE + ".volumePoolRef.name: 'pool2': an ephemeral volume is made in the storage of its Machine's pool, "
     "and the Machine is on 'pool1' (spec.machinePoolRef.name)"),
])
def test_a_volume_templates_pool_other_than_the_machines_is_refused(spec, said):
    _objects, problems = check(machine({"volumePoolRef": {"name": "pool2"}}, **spec))
    assert "Machine/web: " + said in problems


def test_a_volume_templates_pool_that_is_no_pool_of_the_run_is_refused_under_its_own_path():
    _objects, problems = check(machine({"volumePoolRef": {"name": "volumepool-sample"}}))
    assert any(line.startswith("Machine/web: %s.volumePoolRef.name: no pool named 'volumepool-sample'" % TEMPLATE)
               for line in problems), problems


def test_iops_and_tps_of_a_template_are_the_disks_qos():
    objects, warnings = check(machine({"resources": {"storage": "1Gi", "iops": "3k", "tps": "200M"}}))
    assert objects is not None, warnings
    volume = objects["Machine/web"].params["volumes"][0]
    assert (volume["iops"], volume["throughput"]) == (3000, 200)


def test_a_tps_of_no_whole_megabyte_is_rounded_down_with_a_warning():
    objects, warnings = check(machine({"resources": {"storage": "1Gi", "tps": "1Gi"}}))
    assert objects["Machine/web"].params["volumes"][0]["throughput"] == 1073
    assert any("%s.resources.tps: 1073741824 bytes per second" % TEMPLATE in line for line in warnings), warnings


@pytest.mark.parametrize("resources, said", [
    ({"iops": "50"}, ".resources.iops: must be between 100 and 64000 (I/O operations per second"),
    ({"tps": "100Mi"}, ".resources.tps: must be between 125000000 and 4000000000 (125 to 4000 MB/s"),
    ({"iops": "1.5"}, ".resources.iops: "),
    ({"tps": "fast"}, ".resources.tps: "),
])
def test_qos_out_of_range_or_no_quantity_is_refused_naming_the_field(resources, said):
    _objects, problems = check(machine({"resources": dict({"storage": "1Gi"}, **resources)}))
    assert any(line.startswith("Machine/web: " + TEMPLATE + said) for line in problems), problems


VOLUME = {"apiVersion": STORAGE, "kind": "Volume", "metadata": {"name": "shared"},
          "spec": {"resources": {"storage": "1Gi", "iops": "1000", "tps": "125M"}}}


def test_a_volumes_iops_and_tps_go_to_the_disk_of_the_machine_that_attaches_it():
    doc = machine()
    doc["spec"]["volumes"] = [{"name": "shared", "volumeRef": {"name": "shared"}}]
    objects, warnings = check(doc, VOLUME)
    assert objects is not None, warnings
    attached = objects["Machine/web"].params["volumes"][0]
    assert (attached["iops"], attached["throughput"]) == (1000, 125)


def test_a_volumes_qos_with_no_machine_attaching_it_is_warned():
    objects, warnings = check(VOLUME)
    assert objects is not None
    for key in ("iops", "tps"):
        assert any(line.startswith("Volume/shared: spec.resources.%s: a limit of the disk" % key) and
                   "not applied" in line for line in warnings), warnings


def test_a_nic_templates_machine_ref_is_its_own_machine():
    objects, warnings = check(machine(nic={"machineRef": {"name": "web"}}))
    assert objects is not None, warnings


@pytest.mark.parametrize("ref, uid, said", [
    ({"name": "other"}, None, NIC_TEMPLATE + (".machineRef.name: 'other': an ephemeral NetworkInterface belongs "
                                              "to the Machine whose template makes it, web")),
    ({"name": "web", "uid": "u-2"}, "u-1", NIC_TEMPLATE + (".machineRef.uid: 'u-2' is not this Machine's "
                                                           "metadata.uid ('u-1')")),
])
def test_a_nic_templates_machine_ref_to_another_machine_is_refused(ref, uid, said):
    doc = machine(nic={"machineRef": ref})
    if uid:
        doc["metadata"]["uid"] = uid
    _objects, problems = check(doc)
    assert "Machine/web: " + said in problems, problems


def test_none_of_them_is_an_unknown_field_any_more():
    doc = machine({"volumePoolRef": {"name": "pool1"}, "resources": {"storage": "1Gi", "iops": 500, "tps": "500M"}},
                  {"machineRef": {"name": "web", "uid": "u-1"}})
    doc["metadata"]["uid"] = "u-1"
    volume = copy.deepcopy(VOLUME)
    volume["spec"]["volumePoolRef"] = {"name": "pool1"}
    objects, warnings = check(doc, volume)
    assert objects is not None, warnings
    assert not any("unknown field" in line for line in warnings)

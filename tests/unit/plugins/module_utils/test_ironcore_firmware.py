"""The firmware of an IronCore Machine (issue 50): UEFI for one that boots an OCI image (as IronCore's
libvirt-provider boots every machine, and the images IronCore's tools build expect) or carries efiVars; BIOS, the
collection's default, for one that boots a published image, a path, a URL or a volume; either through the
annotation machinery.compute/firmware; and an existing machine keeps its own."""

import pytest

from ansible_collections.machinery.compute.plugins.module_utils.manifests import documents as docs
from ansible_collections.machinery.compute.plugins.module_utils.manifests import engine, ironcore

IC = "compute.ironcore.dev/v1alpha1"
OCI = "ghcr.io/ironcore-dev/os-images/gardenlinux:1877.0"
ANNOTATION = "machinery.compute/firmware"


def machine(image=None, annotations=None, volumes=None, **spec):
    doc = {"apiVersion": IC, "kind": "Machine", "metadata": {"name": "web"},
           "spec": dict({"machineClassRef": {"name": "small"}}, **spec)}
    if image:
        doc["spec"]["image"] = image
    if volumes:
        doc["spec"]["volumes"] = volumes
    if annotations:
        doc["metadata"]["annotations"] = annotations
    return doc


class Pools:
    """Pools on which machine ``existing`` is already a machine (of pool1)."""

    def __init__(self, existing=()):
        self.machines = [{"name": name, "pool": "pool1"} for name in existing]


def read(doc, pools=None):
    problems = docs.Problems()
    objects = engine.parse([("d", doc)], problems)
    obj = objects[0] if objects else None
    if obj is not None and pools is not None:
        ironcore.link(obj, {obj.key: obj}, docs.Fields(problems, obj.ref), pools)
    return obj, problems


@pytest.mark.parametrize("doc, firmware", [
    (machine(OCI), "uefi"),
    (machine("oci://registry.example.com/os/debian@sha256:" + "a" * 64), "uefi"),
    (machine(volumes=[{"name": "root", "ephemeral": {"volumeTemplate": {"spec": {
        "resources": {"storage": "10Gi"}, "dataSource": {"osImage": {"image": OCI}}}}}}]), "uefi"),
    (machine(volumes=[{"name": "root", "localDisk": {"sizeLimit": "10Gi", "image": OCI}}]), "uefi"),
    (machine("my-image"), None),  # a published image: the collection's default, BIOS
    (machine("/srv/images/debian.qcow2"), None),
    (machine("https://images.example.com/debian.qcow2"), None),
    (machine(volumes=[{"name": "root", "volumeRef": {"name": "boot"}}]), None),
    (machine("my-image", efiVars=[{"name": "Role", "uuid": "1f5a2e9c-0d4b-4c8e-9a71-3b6e2d8f4c10",
                                   "value": "AQID"}]), "uefi"),
    (machine(OCI, annotations={ANNOTATION: "bios"}), "bios"),
    (machine("my-image", annotations={ANNOTATION: "uefi"}), "uefi"),
])
def test_which_forms_boot_which_firmware(doc, firmware):
    obj, problems = read(doc)
    assert problems.errors == [], problems.errors
    assert obj.params.get("firmware") == firmware
    assert not any(ANNOTATION in line for line in problems.warnings)  # applied, not "annotations are not kept"


@pytest.mark.parametrize("annotations, efi, said", [
    ({ANNOTATION: "coreboot"}, False, "metadata.annotations.machinery.compute/firmware: unsupported value"),
    ({ANNOTATION: "bios"}, True, "metadata.annotations.machinery.compute/firmware: bios: the Machine's efiVars"),
])
def test_a_bad_or_contradicted_firmware_annotation_is_refused_naming_it(annotations, efi, said):
    extra = {"efiVars": [{"name": "Role", "uuid": "1f5a2e9c-0d4b-4c8e-9a71-3b6e2d8f4c10", "value": "AQID"}]} \
        if efi else {}
    _obj, problems = read(machine(OCI, annotations=annotations, **extra))
    assert any(line.startswith("Machine/web: " + said) for line in problems.errors), problems.errors


def test_an_existing_machine_keeps_its_firmware_unless_the_annotation_asks():
    obj, problems = read(machine(OCI), Pools(["web"]))
    assert problems.errors == [] and "firmware" not in obj.params  # made before (BIOS): fixed at creation
    obj, _problems = read(machine(OCI), Pools(["other"]))
    assert obj.params["firmware"] == "uefi"
    obj, _problems = read(machine(OCI, annotations={ANNOTATION: "uefi"}), Pools(["web"]))
    assert obj.params["firmware"] == "uefi"  # asked for: the machine's fixed firmware is checked against it


@pytest.mark.parametrize("image, firmware, annotated", [
    ("oci://" + OCI, "uefi", None), ("oci://" + OCI, "bios", "bios"), ("my-image", "bios", None),
    ("my-image", "uefi", "uefi"),
])
def test_the_export_names_the_firmware_only_when_it_is_not_the_default(image, firmware, annotated):
    exported = ironcore.export({"name": "web", "image": image, "pool": "pool1", "power_state": "running",
                                "machine_class": "small"},
                               {"volumes": [], "network_interfaces": [], "firmware": firmware})[0]
    assert (exported["metadata"].get("annotations") or {}).get(ANNOTATION) == annotated
    obj, problems = read(exported)
    assert problems.errors == []
    assert (obj.params.get("firmware") or "bios") == firmware  # a re-apply asks for the same firmware

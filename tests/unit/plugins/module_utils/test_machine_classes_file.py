"""libvirt-provider's machine-class file (its --machine-classes-file) read by manifest's src as its classes (issue
50), in the three shapes it has had: {name, capabilities: {cpu, memory}}; the runtime interface's cpu_millis and
memory_bytes (libvirt-provider's own tests write it so); whole MachineClass objects (its internal/mcr loader and
config/development/machineclasses.yaml)."""

import pytest

from ansible_collections.machinery.compute.plugins.module_utils.manifests import documents as docs
from ansible_collections.machinery.compute.plugins.module_utils.manifests import engine

GIB = 2 ** 30


def classes_of(tmp_path, text):
    path = tmp_path / "machineclasses.yaml"
    path.write_text(text)
    documents, problems = docs.load_sources(src=str(path))
    parsed = docs.Problems()
    objects = engine.parse(documents, parsed)
    return {obj.name: obj.data for obj in objects}, problems, parsed.errors, str(path)


def test_name_and_capabilities_items_are_its_classes(tmp_path):
    found, problems, errors, _path = classes_of(tmp_path, """
- name: t3-small
  capabilities: {cpu: 2, memory: 2Gi}
- name: half
  capabilities: {cpu: 500m, memory: 1Gi}
""")
    assert problems == [] and errors == []
    assert found == {"t3-small": {"name": "t3-small", "cpu": 2, "memory": 2 * GIB},
                     "half": {"name": "half", "cpu": 0.5, "memory": GIB}}


def test_the_runtime_interfaces_millis_and_bytes(tmp_path):
    found, problems, errors, _path = classes_of(tmp_path, '[{"name": "x3-xlarge", "capabilities": '
                                                          '{"cpu_millis": 4000, "memory_bytes": 8589934592}}]')
    assert problems == [] and errors == []
    assert found["x3-xlarge"] == {"name": "x3-xlarge", "cpu": 4, "memory": 8 * GIB}


def test_whole_machine_class_objects_with_a_gpu_class_refused_for_its_reason(tmp_path):
    found, problems, errors, _path = classes_of(tmp_path, """
- apiVersion: compute.ironcore.dev/v1alpha1
  kind: MachineClass
  metadata: {name: gpu}
  capabilities: {cpu: "4", memory: 8Gi, nvidia.com/gpu: "1"}
- metadata: {name: t3-small}
  capabilities: {cpu: "2", memory: 2Gi}
""")
    assert problems == []
    assert found["t3-small"]["cpu"] == 2
    assert any(line.startswith("MachineClass/gpu: capabilities.nvidia.com/gpu: a libvirt machine here is sized")
               for line in errors), errors


@pytest.mark.parametrize("text, said", [
    ("- capabilities: {cpu: 1, memory: 1Gi}", "#1[0].name: required value"),
    ("- {name: a, capabilities: {cpu: 1, memory: 1Gi}, cores: 2}", "#1[0].cores: unknown field"),
    ("- just-a-name", "#1[0]: must be a mapping"),
    ("- {name: a}", "#1[0].capabilities: required value"),
    ("- {name: a, capabilities: {cpu_millis: 1.5, memory_bytes: 1024}}", "#1[0].capabilities.cpu_millis: must be a "
                                                                         "whole number"),
    ("- {kind: Machine, metadata: {name: a}, capabilities: {}}", "#1[0].kind: must be MachineClass"),
    ("[]", "#1: an empty list"),
])
def test_a_list_that_is_no_machine_class_file_is_refused_naming_the_item(tmp_path, text, said):
    found, problems, _errors, path = classes_of(tmp_path, text)
    assert any(line.startswith("src: %s%s" % (path, said)) for line in problems), problems


def test_check_mode_refuses_the_file_before_anything_is_written(tmp_path):
    path = tmp_path / "classes.yaml"
    path.write_text("- {name: a, capabilities: {cpu: 0, memory: 1Gi}}\n")
    documents, problems = docs.load_sources(src=str(path))
    with pytest.raises(docs.ManifestError) as info:
        engine.check_documents(documents, None, problems)
    assert "MachineClass/a: capabilities.cpu: must be between 1 and 256, got 0" in info.value.problems

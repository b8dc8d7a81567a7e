"""OpenShift documents as Go writes them (issue 50): every zero value the upstream types write for a field without
omitempty reads exactly as the field left out, one field at a time; anywhere else, and of another type, a zero
value is still the user's and still checked.

The zero values are those of openshift/api machine/v1beta1 (2a3d73913) and openshift/cluster-api-provider-libvirt
pkg/apis/libvirtproviderconfig/v1beta1 (a336f0b5), as encoding/json writes them.
"""

import copy
import os

import pytest
import yaml
from test_openshift_libvirt import parse as parse_objects

from ansible_collections.machinery.compute.plugins.module_utils.manifests import go_zero

OS = "machine.openshift.io/v1beta1"
CLUSTER = "ocp-4hq9z"
SECRET = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "worker-user-data"}, "type": "Opaque",
          "stringData": {"userData": '{"ignition": {"version": "3.2.0"}}'}}
PROVIDER = {"apiVersion": "libvirtproviderconfig.openshift.io/v1beta1", "kind": "LibvirtMachineProviderConfig",
            "domainMemory": 4096, "domainVcpu": 2, "ignition": {"userDataSecret": "worker-user-data"},
            "volume": {"poolName": CLUSTER, "baseVolumeID": CLUSTER + "-base"},
            "networkInterfaceName": CLUSTER, "networkInterfaceAddress": "192.168.126.0/24",
            "uri": "qemu+tcp://192.168.122.1/system"}
LABELS = {"machine.openshift.io/cluster-api-machineset": CLUSTER + "-worker-0"}
BASE = {
    "Machine": {"apiVersion": OS, "kind": "Machine", "metadata": {"name": CLUSTER + "-master-0"},
                "spec": {"providerSpec": {"value": PROVIDER}}},
    "MachineSet": {"apiVersion": OS, "kind": "MachineSet", "metadata": {"name": CLUSTER + "-worker-0"},
                   "spec": {"replicas": 2, "selector": {"matchLabels": LABELS},
                            "template": {"metadata": {"labels": LABELS},
                                         "spec": {"providerSpec": {"value": PROVIDER}}}}},
    "MachineHealthCheck": {"apiVersion": OS, "kind": "MachineHealthCheck", "metadata": {"name": "workers"},
                           "spec": {"selector": {"matchLabels": LABELS}, "maxUnhealthy": "40%",
                                    "unhealthyConditions": [{"type": "Ready", "status": "False",
                                                             "timeout": "300s"},
                                                            {"type": "Ready", "status": "Unknown",
                                                             "timeout": "300s"}]}},
}
UPSTREAM = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "upstream_fields.yml")


def parse(*documents):
    objects, problems = parse_objects(*documents)
    return {ref: obj.params for ref, obj in objects.items()}, problems.errors, problems.warnings


def put(doc, path, value):
    """``doc`` with ``value`` at ``path`` (``[]``: in every item of that list), its mappings made on the way."""
    parts = path.split(".")
    holders = [doc]
    for part in parts[:-1]:
        found = []
        for holder in holders:
            if part.endswith("[]"):
                found.extend(holder[part[:-2]])
                continue
            if not isinstance(holder.get(part), dict):
                holder[part] = {}
            found.append(holder[part])
        holders = found
    for holder in holders:
        holder[parts[-1]] = copy.deepcopy(value)
    return doc


def drop(doc, path):
    parts = path.split(".")
    holders = [doc]
    for part in parts[:-1]:
        holders = [item for holder in holders for item in
                   (holder[part[:-2]] if part.endswith("[]") else [holder[part]])]
    for holder in holders:
        holder.pop(parts[-1], None)
    return doc


CASES = [(kind, path, zero) for kind, table in sorted(go_zero.MACHINE_API.items()) for path, zero in table.items()]


@pytest.mark.parametrize("kind, path, zero", CASES, ids=["%s-%s" % case[:2] for case in CASES])
def test_a_zero_value_go_writes_reads_as_the_field_left_out(kind, path, zero):
    written = put(copy.deepcopy(BASE[kind]), path, zero)
    left_out = drop(copy.deepcopy(written), path)
    assert written != left_out
    assert parse(written, SECRET) == parse(left_out, SECRET)


def test_an_installer_machine_set_as_go_writes_it_applies():
    """openshift/installer's libvirt MachineSet through encoding/json: ignKey "", the unset strings and pointers of
    the provider config, creationTimestamp: null in each embedded ObjectMeta, a status with replicas: 0."""
    written = copy.deepcopy(BASE["MachineSet"])
    written["metadata"]["creationTimestamp"] = None
    written["spec"]["template"]["metadata"]["creationTimestamp"] = None
    template_spec = written["spec"]["template"]["spec"]
    template_spec.update(metadata={"creationTimestamp": None}, lifecycleHooks={})
    template_spec["providerSpec"]["value"] = dict(
        PROVIDER, ignKey="", cloudInit=None, networkInterfaceHostname="", networkUUID="", autostart=False,
        volume=dict(PROVIDER["volume"], volumeName=""))
    written["status"] = {"replicas": 0}
    params, errors, warnings = parse(written, SECRET)
    assert errors == [] and warnings == []
    assert params == parse(BASE["MachineSet"], SECRET)[0]


def test_cloud_init_with_only_ssh_access_as_go_writes_it():
    """CloudInit{SSHAccess: true} is written with userDataSecret: "": the SSH-only form, not an empty name."""
    doc = copy.deepcopy(BASE["Machine"])
    value = doc["spec"]["providerSpec"]["value"]
    del value["ignition"]
    value.update(ignKey="", ignition=None, cloudInit={"userDataSecret": "", "sshAccess": True})
    params, errors, _warnings = parse(doc)
    assert errors == []
    assert "cloud_init" in params["Machine/%s-master-0" % CLUSTER]


@pytest.mark.parametrize("path, value, said", [
    ("spec.providerSpec.value.domainVcpu", 0, "domainVcpu: required value"),
    ("spec.providerSpec.value.domainMemory", 0, "domainMemory: required value"),
    ("spec.providerSpec.value.volume.baseVolumeID", "", "volume.baseVolumeID: required value"),
    ("spec.providerSpec.value.ignition.userDataSecret", "", "ignition.userDataSecret: required value: the provider"),
    # the zero of another type is no Go zero: still the user's, still checked
    ("spec.providerSpec.value.autostart", 0, "autostart: must be true or false"),
    ("spec.providerSpec.value.domainVcpu", False, "domainVcpu: must be an integer"),
    ("spec.providerSpec.value.uri", None, None),
])
def test_a_required_field_go_wrote_unset_is_refused_as_missing(path, value, said):
    doc = put(copy.deepcopy(BASE["Machine"]), path, value)
    _params, errors, _warnings = parse(doc, SECRET)
    if said is None:
        assert errors == []
    else:
        assert any(said in line for line in errors), errors


def test_an_empty_string_where_go_writes_none_is_still_checked():
    """Our own providerSpec is no Go type: its image "" is the user's mistake, named."""
    doc = copy.deepcopy(BASE["Machine"])
    doc["spec"]["providerSpec"]["value"] = {"kind": "LibvirtMachineProviderSpec", "machineClass": "small",
                                            "image": ""}
    _params, errors, _warnings = parse(doc)
    assert any("spec.providerSpec.value.image: must be a non-empty string" in line for line in errors)


def test_a_template_creation_timestamp_a_server_set_is_warned_not_unknown():
    doc = copy.deepcopy(BASE["MachineSet"])
    doc["spec"]["template"]["metadata"]["creationTimestamp"] = "2026-11-01T10:00:00Z"
    _params, errors, warnings = parse(doc, SECRET)
    assert errors == []
    assert any("spec.template.metadata.creationTimestamp: set by a Kubernetes API server" in line
               for line in warnings)


def test_every_zero_value_is_of_a_field_upstream_has():
    with open(UPSTREAM) as handle:
        upstream = yaml.safe_load(handle)["kinds"]["openshift"]
    for kind, table in go_zero.MACHINE_API.items():
        spec = upstream[kind]
        paths = set(spec.get("object_meta") or []) | set(spec.get("fields") or [])
        for prefix, fields in (spec.get("prefixed") or {}).items():
            paths |= {"%s.%s" % (prefix, field) for field in fields}
        for path in table:
            heads = [".".join(path.split(".")[:cut]) for cut in range(1, path.count(".") + 1)]
            assert path in paths or any(known.startswith((path + ".", path + "[]")) for known in paths) or \
                any(head in paths for head in heads), (kind, path)

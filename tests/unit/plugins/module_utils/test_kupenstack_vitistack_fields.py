"""Every field of every upstream CRD (vitistack/common and vitistack/crds Machine, vitistack/common
MachineClass, Kupenstack/kupenstack's six CRDs) and of KupenStack's design documents' kinds is applied, warned
about with a reason, or refused with a reason by its dialect's table: none is unknown. The field lists are in
data/kupenstack_vitistack_fields.yml, each with the repository, commit and file it was taken from.
"""

import collections
import os

import pytest
import yaml

from ansible_collections.machinery.compute.plugins.module_utils.manifests import kupenstack, vitistack

DIALECTS = {"vitistack": vitistack, "kupenstack": kupenstack}
with open(os.path.join(os.path.dirname(__file__), "data", "kupenstack_vitistack_fields.yml")) as handle:
    UPSTREAM = yaml.safe_load(handle)


def verdict(fields_table, path):
    """The field's own verdict, else that of the nearest container the table classifies (a warned
    ``spec.backup`` covers ``spec.backup.schedule``), else None."""
    found = fields_table.get(path)
    while found is None and "." in path:
        path = path.rsplit(".", 1)[0]
        found = fields_table.get(path) or fields_table.get(path + ".*")
        if found is not None and found[0] == "applied":
            return None  # an applied container does not classify fields it does not list
    return found


def counts(label):
    entry = UPSTREAM["kinds"][label]
    fields_table = DIALECTS[entry["dialect"]].FIELDS[entry["kind"]]
    tally = collections.Counter()
    unknown = []
    for path in UPSTREAM["metadata"] + entry["fields"]:
        found = verdict(fields_table, path)
        if found is None:
            unknown.append(path)
        elif found[0] != "applied" and not found[1]:
            unknown.append(path + " (no reason)")
        else:
            tally[found[0]] += 1
    return tally, unknown


@pytest.mark.parametrize("label", sorted(UPSTREAM["kinds"]))
def test_every_upstream_field_has_a_verdict_with_a_reason(label):
    tally, unknown = counts(label)
    assert unknown == []
    assert tally["applied"] > 0


def test_the_lists_are_those_of_the_upstream_crds():
    """A spot check that the lists are the CRDs' (a list cut short would pass the test above)."""
    kinds = UPSTREAM["kinds"]
    assert len(kinds["Machine (common)"]["fields"]) == 60 and len(kinds["Machine (crds)"]["fields"]) == 44
    assert {"spec.cloudInit.userDataSecretRef.name", "spec.os.isoUri", "spec.network.networkNamespaceName",
            "spec.disks[].device", "spec.provider", "spec.machineClass"} <= set(kinds["Machine (common)"]["fields"])
    assert kinds["VirtualMachine"]["fields"] == ["spec.flavor", "spec.image", "spec.keyPair", "spec.network"]
    assert all("commit" not in entry["source"] and len(entry["source"].split()) == 3 for entry in kinds.values())


if __name__ == "__main__":  # the per-kind counts of the closing note
    for name in sorted(UPSTREAM["kinds"]):
        found, missing = counts(name)
        print("%-26s applied %3d  warned %3d  refused %2d  unknown %d" % (
            name, found["applied"], found["warned"], found["refused"], len(missing)))

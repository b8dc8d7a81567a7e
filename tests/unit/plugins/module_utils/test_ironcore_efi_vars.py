# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""IronCore's Machine.spec.efiVars: read into efi_vars of a UEFI machine, refused under the document's own paths,
written back by the export so that a re-apply reads the same."""

from __future__ import annotations

import base64

from ansible_collections.machinery.compute.plugins.module_utils.core import efi_vars as efi
from ansible_collections.machinery.compute.plugins.module_utils.manifests import documents as docs
from ansible_collections.machinery.compute.plugins.module_utils.manifests import engine, ironcore

OURS = "1f5a2e9c-0d4b-4c8e-9a71-3b6e2d8f4c10"


def b64(data):
    return base64.b64encode(data).decode()


def ironcore_machine(efi_vars):
    return {"apiVersion": "compute.ironcore.dev/v1alpha1", "kind": "Machine", "metadata": {"name": "web-1"},
            "spec": {"machineClassRef": {"name": "small"}, "image": "my-image", "efiVars": efi_vars}}


def read_machine(efi_vars):
    problems = docs.Problems()
    objects = engine.parse([("definition[0]", ironcore_machine(efi_vars))], problems)
    return objects[0], problems


def test_ironcore_efivars_become_efi_vars_of_a_uefi_machine():
    obj, problems = read_machine([{"name": "Var", "uuid": OURS.upper(), "value": b64(b"\x01\x02")}])
    assert problems.errors == [] and problems.warnings == []
    assert obj.params["firmware"] == "uefi"
    assert obj.params["efi_vars"] == [{"name": "Var", "guid": OURS, "value": "AQI=", "runtime_access": True}]


def test_ironcore_efivars_errors_name_the_documents_own_path():
    _obj, problems = read_machine([{"name": "Var", "uuid": OURS, "value": "AQI="},
                                   {"name": "Var2", "uuid": "not-a-guid", "value": "AQI="},
                                   {"name": "PK", "uuid": efi.GLOBAL, "value": "AQI="},
                                   {"name": "Var", "uuid": OURS, "value": "AQ=", "extra": 1}])
    shown = [line.split(": ")[1] for line in problems.errors]
    assert shown == ["spec.efiVars[1].uuid", "spec.efiVars[2].name", "spec.efiVars[3].extra",
                     "spec.efiVars[3].value"]


def test_ironcore_export_keeps_the_variables_so_a_reapply_reads_the_same():
    entries = efi.check([{"name": "Var", "guid": OURS, "value": "AQI="}])
    machine = {"name": "web-1", "machine_class": "small", "image": "my-image", "pool": "pool1", "phase": "Running",
               "labels": {}}
    exported = ironcore.export(machine, {"volumes": [], "network_interfaces": [], "efi_vars": entries})[0]
    assert exported["spec"]["efiVars"] == [{"name": "Var", "uuid": OURS, "value": "AQI="}]
    obj, problems = read_machine(exported["spec"]["efiVars"])
    assert problems.errors == [] and obj.params["efi_vars"] == entries

# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""efi_vars as pure functions: the option's checks (each naming its field), OVMF's variable store read and edited
as bytes, and where the plan writes the variables (off, with a restart or a stop, or waiting) - no libvirt daemon."""

from __future__ import annotations

import base64
import os
import struct
import uuid

import libvirt
import pytest

from ansible_collections.machinery.compute.plugins.module_utils.core import domain as dx
from ansible_collections.machinery.compute.plugins.module_utils.core import efi_vars as efi
from ansible_collections.machinery.compute.plugins.module_utils.core import options
from ansible_collections.machinery.compute.plugins.module_utils.core import varstore as vs
from ansible_collections.machinery.compute.plugins.module_utils.core.errors import ValidationError
from ansible_collections.machinery.compute.plugins.module_utils.machines.machine_observe import Observed
from ansible_collections.machinery.compute.plugins.module_utils.machines.machine_plan import plan_machine
from ansible_collections.machinery.compute.plugins.module_utils.machines.machine_spec import Facts, normalize, params

OURS = "1f5a2e9c-0d4b-4c8e-9a71-3b6e2d8f4c10"
OTHER = "0d7e44b6-6a43-4f0c-8e35-2b9f8a1c7d52"
GOLDEN = os.path.join(os.path.dirname(__file__), "golden")
RUNNING = (libvirt.VIR_DOMAIN_RUNNING, libvirt.VIR_DOMAIN_RUNNING_BOOTED)
SHUTOFF = (libvirt.VIR_DOMAIN_SHUTOFF, libvirt.VIR_DOMAIN_SHUTOFF_SHUTDOWN)
MIB = 2 ** 20
TEMPLATE = "/usr/share/OVMF/OVMF_VARS_4M.ms.fd"


def b64(data):
    return base64.b64encode(data).decode()


# --- a store as OVMF lays it out (firmware volume, store header, records), made here byte by byte -------------

def record(guid, name, data, attributes=7, state=vs.ADDED):
    encoded = (name + "\0").encode("utf-16-le")
    raw = struct.pack("<HBxIQ16sIII16s", 0x55AA, state, attributes, 0, bytes(16), 0, len(encoded), len(data),
                      uuid.UUID(guid).bytes_le) + encoded + data
    return raw + b"\xff" * (-len(raw) % 4)


def store(*records, size=4096, tail=b"FTW-AREA"):
    header_length = 72
    volume = bytes(16) + vs.NV_DATA_VOLUME.bytes_le + struct.pack("<Q", header_length + size + len(tail)) + \
        b"_FVH" + struct.pack("<IHHHBB", 0, header_length, 0, 0, 0, 2)
    volume += b"\0" * (header_length - len(volume))
    body = b"".join(records)
    return volume + struct.pack("<16sIBBHI", vs.AUTHENTICATED_STORE.bytes_le, size, 0x5A, 0xFE, 0, 0) + body + \
        b"\xff" * (size - 28 - len(body)) + tail


def test_the_valid_variables_are_read_and_deleted_records_are_not():
    data = store(record(OURS, "Old", b"1", state=0x3C), record(OURS, "Kept", b"2"),
                 record(OURS, "Cut", b"3", state=vs.ADDED_IN_TRANSITION), record(OTHER, "Kept", b"4"))
    found = vs.variables(data)
    assert sorted(found) == [(OTHER, "Kept"), (OURS, "Cut"), (OURS, "Kept")]
    assert found[(OURS, "Kept")].data == b"2" and found[(OTHER, "Kept")].data == b"4"


def test_a_cut_off_update_counts_only_without_its_newer_record():
    data = store(record(OURS, "Var", b"old", state=vs.ADDED_IN_TRANSITION), record(OURS, "Var", b"new"))
    assert vs.variables(data)[(OURS, "Var")].data == b"new"


def test_a_variable_is_set_beside_one_of_the_same_name_of_another_vendor():
    data = store(record(OTHER, "Name", b"theirs"), record(OURS, "Other", b"kept", attributes=3))
    edited = vs.with_variables(data, [vs.Variable(OURS, "Name", 7, b"ours")])
    found = vs.variables(edited)
    assert found[(OURS, "Name")].data == b"ours" and found[(OTHER, "Name")].data == b"theirs"
    assert found[(OURS, "Other")] == vs.Variable(OURS, "Other", 3, b"kept")
    assert len(edited) == len(data) and edited.endswith(b"FTW-AREA")


def test_a_variable_set_again_replaces_its_record_and_deleted_ones_go():
    data = store(record(OURS, "Gone", b"x", state=0x3C), record(OURS, "Var", b"old"), record(OURS, "Next", b"n"))
    edited = vs.with_variables(data, [vs.Variable(OURS, "Var", 7, b"new")])
    assert [(variable.name, variable.data) for _offset, _state, variable, _raw in vs.records(edited)] == [
        ("Next", b"n"), ("Var", b"new")]


def test_a_store_that_holds_the_variables_already_comes_back_unchanged():
    data = store(record(OURS, "Var", b"same", state=vs.ADDED_IN_TRANSITION), record(OURS, "Old", b"x", state=0x3C))
    assert vs.with_variables(data, [vs.Variable(OURS, "Var", 7, b"same")]) == data
    assert vs.with_variables(data, [vs.Variable(OURS, "Var", 3, b"same")]) != data  # other attributes


def test_variables_that_do_not_fit_are_refused():
    with pytest.raises(vs.VarstoreError) as info:
        vs.with_variables(store(size=256), [vs.Variable(OURS, "Big", 7, b"x" * 300)])
    assert "the machine's variable store holds 228" in info.value.message


def test_bytes_that_are_no_store_or_a_damaged_one_are_refused():
    with pytest.raises(vs.VarstoreError) as info:
        vs.variables(b"\0" * 8192)
    assert "no UEFI variable store" in info.value.message
    damaged = bytearray(store(record(OURS, "Var", b"data")))
    struct.pack_into("<I", damaged, 72 + 28 + 36, 0x10000)  # the data size of the first record
    with pytest.raises(vs.VarstoreError) as info:
        vs.variables(bytes(damaged))
    assert "damaged at offset 0x64" in info.value.message


@pytest.mark.skipif(not os.path.exists(TEMPLATE), reason="Debian's ovmf package is not installed")
def test_debians_secure_boot_template_keeps_its_keys_when_a_variable_is_added():
    with open(TEMPLATE, "rb") as handle:
        data = handle.read()
    before = vs.variables(data)
    edited = vs.with_variables(data, [vs.Variable(OURS, "MachineryTest", 7, b"\x01\x02")])
    after = vs.variables(edited)
    assert len(edited) == len(data) and (efi.SECURITY_DATABASE, "db") in before
    assert {key: after[key] for key in before} == before and after[(OURS, "MachineryTest")].data == b"\x01\x02"


# --- the option ---------------------------------------------------------------------------------------------------

def test_entries_are_normalized():
    assert efi.check([{"name": "Var", "guid": OURS.upper(), "value": "aGVs\nbG8=", "runtime_access": None}]) == [
        {"name": "Var", "guid": OURS, "value": "aGVsbG8=", "runtime_access": True}]


@pytest.mark.parametrize("entries, field, words", [
    ([{"name": "A", "guid": OURS, "value": "AQ=="}, {"name": "B", "guid": "not-a-guid", "value": "AQ=="}],
     "efi_vars[1].guid", "is not a GUID"),
    ([{"name": "A", "guid": OURS, "value": "AQ="}], "efi_vars[0].value", "is not base64"),
    ([{"name": "A", "guid": OURS, "value": "A*=="}], "efi_vars[0].value", "is not base64"),
    ([{"name": "A", "guid": OURS, "value": ""}], "efi_vars[0].value", "not empty"),
    ([{"name": "", "guid": OURS, "value": "AQ=="}], "efi_vars[0].name", "non-empty"),
    ([{"name": "A\tB", "guid": OURS, "value": "AQ=="}], "efi_vars[0].name", "printable"),
    ([{"name": "A", "guid": OURS, "value": "AQ=="}, {"name": "A", "guid": OURS.upper(), "value": "Ag=="}],
     "efi_vars[1].name", "given twice"),
    ([{"name": "db", "guid": efi.SECURITY_DATABASE, "value": "AQ=="}], "efi_vars[0].name", "secure_boot"),
    ([{"name": "PK", "guid": efi.GLOBAL, "value": "AQ=="}], "efi_vars[0].name", "Secure Boot's own"),
    ([{"name": "A", "guid": OURS, "value": b64(b"x" * (efi.VALUE_LIMIT + 1))}], "efi_vars[0].value", "holds up to"),
])
def test_bad_entries_name_their_field(entries, field, words):
    with pytest.raises(ValidationError) as info:
        efi.check(entries)
    assert info.value.field == field and words in info.value.message


def test_a_name_owned_by_secure_boot_is_free_for_another_vendor():
    assert efi.check([{"name": "db", "guid": OURS, "value": "AQ=="}])[0]["name"] == "db"


def test_the_module_options_reach_the_check_and_refuse_bios_firmware():
    prm = params({"name": "web-1", "image": "/images/a.qcow2", "firmware": "uefi",
                  "efi_vars": [{"name": "Var", "guid": OURS.upper(), "value": "AQ=="}]})
    assert prm["efi_vars"][0]["guid"] == OURS and prm["efi_vars"][0]["runtime_access"] is True
    with pytest.raises(ValidationError) as info:
        params({"name": "web-1", "efi_vars": [{"name": "Var", "guid": "x", "value": "AQ=="}]}, "machines[2]")
    assert info.value.field == "machines[2].efi_vars[0].guid"
    bios = params({"name": "web-1", "efi_vars": [{"name": "Var", "guid": OURS, "value": "AQ=="}]})
    with pytest.raises(ValidationError) as info:
        normalize(bios, Facts(), existing_record(firmware="bios"), current())
    assert info.value.field == "efi_vars" and "firmware: uefi" in info.value.message


# --- the plan -----------------------------------------------------------------------------------------------------

def existing_record(**changes):
    spec = {"name": "web-1", "machine_class": None, "cpu": 1, "memory": 128 * MIB, "labels": {}, "firmware": "uefi",
            "boot_config": None, "image": {"source": "/images/a.qcow2", "checksum": "0" * 64, "format": "qcow2"},
            "root_size": 2 ** 30, "volumes": [], "network_interfaces": [], "swap": None, "run_strategy": "always",
            "files": {"console": "web-1-console.log"}}
    spec.update(changes)
    return {"version": 1, "created": "2026-01-01T00:00:00+00:00", "boots": 1, "spec": spec}


def current():
    return {"cpu": 1, "memory": 128 * MIB, "labels": {}, "boot_config": None, "run_strategy": "always"}


def observed(rec, state, found):
    with open(os.path.join(GOLDEN, "web-1-libvirt.xml"), "rb") as handle:
        tree = dx.parse(handle.read())
    dx.write_run_strategy(tree, rec, "always")
    dx.write_record(tree, rec)
    seen = Observed("web-1", dom=object(), tree=tree, record=rec, state=state, live_max_memory=128 * MIB,
                    autostart=True, saved=False)
    seen.efi_vars = found
    return seen


WANTED = [{"name": "Var", "guid": OURS, "value": b64(b"new")}]


def planned(state, found, wanted=(), recorded=None):
    wanted = WANTED if wanted == () else wanted
    rec = existing_record(efi_vars=recorded)
    seen = observed(rec, state[0], found)
    spec = normalize(params({"name": "web-1", "state": state[1], "efi_vars": wanted}), Facts(), rec,
                     options.owned_values(seen.tree, rec))
    return plan_machine(spec, seen, rec)


def holding(data):
    return {(OURS, "Var"): vs.Variable(OURS, "Var", 7, data)}


def test_a_stopped_machine_gets_them_before_its_start_and_the_diff_shows_the_store():
    plan = planned((SHUTOFF, "running"), holding(b"old"))
    assert plan.summaries() == ["update efi_vars", "start"]
    before, after = plan.diff()
    assert before["efi_vars"][0]["value"] == b64(b"old") and after["efi_vars"][0]["value"] == b64(b"new")
    assert plan.actions[0].data["efi_vars"] == efi.check(WANTED)
    assert plan.actions[0].steps[0] == {"action": "write_volume", "target": "web-1-nvram.fd",
                                        "variables": ["Var-%s" % OURS]}


def test_a_store_and_record_that_hold_them_plan_nothing():
    plan = planned((RUNNING, "running"), holding(b"new"), recorded=efi.check(WANTED))
    assert plan.actions == [] and not plan.facts["restart_required"]


def test_the_record_alone_is_brought_up_to_date_on_a_running_machine():
    plan = planned((RUNNING, "running"), holding(b"new"), recorded=None)
    assert plan.summaries() == ["update efi_vars"]
    assert [step["action"] for step in plan.actions[0].steps] == ["write_record"]


def test_a_running_machine_waits_and_says_so():
    plan = planned((RUNNING, "running"), holding(b"old"))
    assert plan.actions == [] and plan.facts["restart_required"]
    assert any("efi_vars of the running machine web-1 (Var)" in note and "nothing was written" in note
               for note in plan.warnings)


def test_a_restart_writes_them_while_the_machine_is_off():
    plan = planned((RUNNING, "restarted"), holding(b"old"))
    assert plan.summaries() == ["restart"]
    restart = plan.actions[0]
    assert restart.data["efi_vars"] == efi.check(WANTED) and "efi_vars" in restart.after
    assert [step["action"] for step in restart.steps] == ["shutdown", "write_volume", "write_record", "start"]


def test_a_stop_is_followed_by_the_write():
    plan = planned((RUNNING, "stopped"), None)
    assert plan.summaries()[-2:] == ["stop", "update efi_vars"]
    assert plan.diff()[0]["efi_vars"][0]["value"] is None


def test_a_new_machine_gets_them_between_its_create_and_its_start():
    prm = params({"name": "web-1", "image": "/images/a.qcow2", "firmware": "uefi", "efi_vars": WANTED,
                  "network_interfaces": [], "cpu": 1, "memory": "128Mi"})
    facts = Facts(images={"image": {"image": {"source": "/images/a.qcow2", "checksum": "0" * 64,
                                              "path": "/images/a.qcow2"}, "format": "qcow2", "size": 2 ** 30}})
    plan = plan_machine(normalize(prm, facts), Observed("web-1"))
    assert plan.kinds() == ["create", "update", "start"]
    assert plan.actions[1].fields == ["efi_vars"] and plan.actions[1].before == {}


def test_left_out_they_are_not_compared():
    plan = planned((SHUTOFF, "stopped"), holding(b"other"), wanted=None, recorded=efi.check(WANTED))
    assert "efi_vars" not in plan.diff()[1]

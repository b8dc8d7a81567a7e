"""machine_snapshot's plan as a pure function: create, revert, delete and retention from an observation; the
snapshot XML both ways; which disks can hold an internal snapshot."""

import datetime

import pytest

from ansible_collections.machinery.compute.plugins.module_utils.core import elements
from ansible_collections.machinery.compute.plugins.module_utils.core.errors import (
    ConflictError, NotFoundError, ValidationError)
from ansible_collections.machinery.compute.plugins.module_utils.fleets import move_plan
from ansible_collections.machinery.compute.plugins.module_utils.machines import snapshots as sn

NOW = datetime.datetime(2026, 3, 10, 2, 0, 0, 250000, tzinfo=datetime.timezone.utc)


def entry(name, minutes_ago, memory=True, ours=True):
    return {"name": name, "created": (NOW - datetime.timedelta(minutes=minutes_ago)).isoformat(), "memory": memory,
            "state": "running" if memory else "shutoff", "disks": ["vda"], "current": False, "ours": ours}


def seen(snapshots=(), active=True, boots=1, last_revert=None, refused=(), exists=True, reverted_now=None):
    return {"machine": "m", "exists": exists, "active": active, "snapshots": list(snapshots), "boots": boots,
            "disks": {"internal": ["vda", "vdb"], "skipped": ["sda"], "refused": list(refused)},
            "last_revert": last_revert, "reverted_now": reverted_now, "pool": "p1"}


def params(**given):
    return dict({"name": "s", "state": "present", "memory": None, "retention": None, "moment": NOW}, **given)


def test_a_running_machine_is_snapshotted_with_its_memory():
    plan = sn.plan_snapshots(params(), seen())
    assert plan.kinds() == ["create"]
    assert plan.actions[0].after == {"snapshot": "s", "memory": True, "state": "running", "disks": ["vda", "vdb"]}
    assert [entry["name"] for entry in plan.facts["remaining"]] == ["s"]


def test_a_stopped_machine_is_snapshotted_disk_only():
    plan = sn.plan_snapshots(params(), seen(active=False))
    assert plan.actions[0].after["memory"] is False and plan.actions[0].after["state"] == "shutoff"


@pytest.mark.parametrize("memory, active", [(True, False), (False, True)])
def test_memory_libvirt_cannot_honour_is_refused_naming_memory(memory, active):
    with pytest.raises(ConflictError) as caught:
        sn.plan_snapshots(params(memory=memory), seen(active=active))
    assert caught.value.field == "memory"


def test_an_existing_snapshot_is_left_alone_whatever_memory_says():
    assert not sn.plan_snapshots(params(memory=False), seen([entry("s", 5)])).changed


def test_disks_that_cannot_hold_an_internal_snapshot_refuse_the_machine():
    with pytest.raises(ConflictError) as caught:
        sn.plan_snapshots(params(), seen(refused=[("vdc", "an encrypted (LUKS) volume")]))
    assert caught.value.field == "machine" and "vdc is an encrypted (LUKS) volume" in caught.value.message


def test_snapshot_disks_sorts_out_cdroms_luks_and_shareable_raw():
    disks = [
        {"device": "vda", "type": "disk", "readonly": False, "format": "qcow2", "secret": None, "shareable": False},
        {"device": "vdb", "type": "disk", "readonly": False, "format": "raw", "secret": "u-1", "shareable": False},
        {"device": "vdc", "type": "disk", "readonly": False, "format": "raw", "secret": None, "shareable": True},
        {"device": "sda", "type": "cdrom", "readonly": True, "format": "raw", "secret": None, "shareable": False},
    ]
    internal, skipped, refused = sn.snapshot_disks(disks)
    assert internal == ["vda"] and skipped == ["sda"]
    assert refused == [("vdb", "an encrypted (LUKS) volume"), ("vdc", "a shareable raw volume")]


def test_delete_and_delete_again():
    plan = sn.plan_snapshots(params(state="absent"), seen([entry("s", 5)]))
    assert plan.kinds() == ["delete"] and plan.diff() == ({"snapshot": "s"}, {})
    assert not sn.plan_snapshots(params(state="absent"), seen()).changed
    assert not sn.plan_snapshots(params(state="absent"), seen(exists=False)).changed


def test_a_missing_machine_or_snapshot_names_its_field():
    with pytest.raises(NotFoundError) as caught:
        sn.plan_snapshots(params(), seen(exists=False))
    assert caught.value.field == "machine"
    with pytest.raises(NotFoundError) as caught:
        sn.plan_snapshots(params(state="reverted"), seen())
    assert caught.value.field == "name"


def test_a_snapshot_with_memory_is_reverted_to_on_every_run_but_once_per_run():
    snapshot = entry("s", 5)
    last = {"snapshot": "s", "boots": 1}
    assert sn.plan_snapshots(params(state="reverted"), seen([snapshot], last_revert=last)).kinds() == ["revert"]
    assert not sn.plan_snapshots(params(state="reverted"), seen([snapshot], reverted_now="s")).changed


def test_a_disk_only_revert_is_no_change_until_the_machine_boots_again():
    snapshot = entry("s", 5, memory=False)
    last = {"snapshot": "s", "boots": 3}
    revert = params(state="reverted")
    plan = sn.plan_snapshots(revert, seen([snapshot], active=False, boots=3))
    assert plan.kinds() == ["revert"] and plan.diff()[1] == {"reverted": "s", "state": "shutoff"}
    assert not sn.plan_snapshots(revert, seen([snapshot], active=False, boots=3, last_revert=last)).changed
    assert sn.plan_snapshots(revert, seen([snapshot], active=False, boots=4, last_revert=last)).changed
    assert sn.plan_snapshots(revert, seen([snapshot], active=True, boots=3, last_revert=last)).changed


def test_retention_prunes_the_oldest_of_ours_and_keeps_the_new_one():
    old = [entry("a", 30), entry("b", 20), entry("foreign", 25, ours=False)]
    plan = sn.plan_snapshots(params(retention={"count": 2}), seen(old))
    assert plan.kinds() == ["create", "prune"] and plan.summaries()[1] == "prune retention"
    assert plan.actions[1].data["names"] == ["a"]
    assert sorted(entry["name"] for entry in plan.facts["remaining"]) == ["b", "foreign", "s"]
    again = sn.plan_snapshots(params(retention={"count": 2}), seen([entry("b", 20), entry("s", 0)]))
    assert not again.changed


@pytest.mark.parametrize("retention, field", [({"count": 0}, "retention.count"), ({}, "retention"),
                                              ({"count": "x"}, "retention.count")])
def test_bad_retention_names_its_field(retention, field):
    with pytest.raises(ValidationError) as caught:
        sn.check_retention(retention)
    assert caught.value.field == field


def test_snapshot_xml_round_trip_and_the_mark():
    node = elements.domain_snapshot("s", sn.description(NOW), ["vda", "vdb"], ["sda"], memory=True)
    xml = elements.to_string(node)
    assert "<memory snapshot=\"internal\"/>" in xml and "<disk name=\"sda\" snapshot=\"no\"/>" in xml
    read = sn.snapshot_entry(elements.parse(xml.replace("</description>", "</description><state>running</state>"
                                                        "<creationTime>1773108000</creationTime>")), True)
    assert read == {"name": "s", "created": NOW.isoformat(), "memory": True, "state": "running",
                    "disks": ["vda", "vdb"], "current": True, "ours": True}
    foreign = sn.snapshot_entry(elements.parse("<domainsnapshot><name>f</name><state>shutoff</state>"
                                               "<creationTime>1773108000</creationTime></domainsnapshot>"))
    assert foreign["ours"] is False and foreign["memory"] is False
    assert foreign["created"] == "2026-03-10T02:00:00+00:00"


def test_a_machine_with_snapshots_is_not_moved():
    with pytest.raises(ConflictError) as caught:
        move_plan.unmovable("m", {"spec": {}}, snapshots=["s1", "s2"])
    assert caught.value.field == "machine" and "s1, s2" in caught.value.message
    move_plan.unmovable("m", {"spec": {}}, snapshots=[])

"""machine_backup's plan as a pure function: retention, backup, restore and delete from an observation."""

import datetime

import pytest

from ansible_collections.machinery.compute.plugins.module_utils.machines import backups as bk
from ansible_collections.machinery.compute.plugins.module_utils.core import elements
from ansible_collections.machinery.compute.plugins.module_utils.core.errors import (
    ConflictError, NotFoundError)

from conftest import refused

NOW = datetime.datetime(2026, 3, 10, 2, 0, tzinfo=datetime.timezone.utc)


def entry(name, days_ago):
    return {"name": name, "created": (NOW - datetime.timedelta(days=days_ago)).isoformat(),
            "disks": [{"device": "vda", "volume": "m.backup.%s.vda.qcow2" % name, "size": 1}]}


def seen(backups=(), active=True, boots=1, last_restore=None):
    return {"machine": "m", "active": active, "disks": [{"device": "vda", "path": "/p/m-root.qcow2"}],
            "skipped": ["sda"], "backups": list(backups), "boots": boots, "last_restore": last_restore}


def params(**given):
    return dict({"name": "b", "state": "present", "restore": False, "retention": None, "moment": NOW}, **given)


@pytest.mark.parametrize("retention, field", [
    ({"count": 0}, "retention.count"), ({"days": 0}, "retention.days"), ({"count": -1}, "retention.count"),
    ({"count": "many"}, "retention.count"), ({}, "retention"), ({"count": None, "days": None}, "retention")])
def test_bad_retention_names_its_field(retention, field):
    refused(field, bk.check_retention, retention)


def test_retention_by_count_and_days_keeps_the_newest():
    backups = [entry("a", 40), entry("b", 20), entry("c", 5), entry("d", 1)]
    assert bk.expired(backups, {"count": 2, "days": None}, NOW) == ["a", "b"]
    assert bk.expired(backups, {"count": None, "days": 10}, NOW) == ["a", "b"]
    assert bk.expired(backups, {"count": 3, "days": 30}, NOW) == ["a"]
    assert bk.expired([entry("old", 90)], {"count": 1, "days": 1}, NOW) == []  # the newest always stays
    assert bk.expired(backups, None, NOW) == []


def test_a_running_machine_is_backed_up_by_a_push_job_a_stopped_one_by_copies():
    plan = bk.plan_backups(params(), seen())
    assert plan.summaries() == ["backup"] and plan.find("backup").data["method"] == "push"
    steps = [s["action"] for s in plan.find("backup").steps]
    assert steps == ["fs_freeze", "backup_begin", "fs_thaw", "wait_job", "write_document"]
    plan = bk.plan_backups(params(), seen(active=False))
    assert plan.find("backup").data["method"] == "copy"
    assert plan.find("backup").steps[0] == {"action": "copy_volume", "target": "/p/m-root.qcow2",
                                            "to": "m.backup.b.vda.qcow2"}
    assert not bk.plan_backups(params(), seen([entry("b", 0)])).changed


def test_a_new_backup_counts_for_retention():
    plan = bk.plan_backups(params(retention={"count": 2}), seen([entry("a", 2), entry("z", 1)]))
    assert plan.summaries() == ["backup", "prune retention"]
    assert plan.find("prune").before == {"backups": ["a"]}
    assert [e["name"] for e in plan.facts["remaining"]] == ["z", "b"]


def test_restore_needs_the_backup_and_a_stopped_machine_and_is_done_once_per_boot():
    with pytest.raises(NotFoundError):
        bk.plan_backups(params(restore=True), seen(active=False))
    with pytest.raises(ConflictError) as caught:
        bk.plan_backups(params(restore=True), seen([entry("b", 1)]))
    assert caught.value.field == "restore"
    plan = bk.plan_backups(params(restore=True), seen([entry("b", 1)], active=False, boots=3))
    assert plan.summaries() == ["restore"]
    assert not bk.plan_backups(params(restore=True), seen([entry("b", 1)], active=False, boots=3,
                                                          last_restore={"backup": "b", "boots": 3})).changed
    assert bk.plan_backups(params(restore=True), seen([entry("b", 1)], active=False, boots=4,
                                                      last_restore={"backup": "b", "boots": 3})).changed


def test_delete():
    plan = bk.plan_backups(params(state="absent"), seen([entry("b", 1)]))
    assert plan.summaries() == ["delete"]
    assert [s["action"] for s in plan.find("delete").steps] == ["delete_volume", "write_document"]
    assert not bk.plan_backups(params(state="absent"), seen()).changed


def test_backup_job_xml_copies_own_disks_and_skips_the_rest():
    node = elements.domain_backup({"vdb": "/p/b.qcow2", "vda": "/p/a.qcow2"}, ["sda"])
    assert elements.to_string(node) == (
        '<domainbackup mode="push"><disks>'
        '<disk name="vda" backup="yes" type="file"><target file="/p/a.qcow2"/><driver type="qcow2"/></disk>'
        '<disk name="vdb" backup="yes" type="file"><target file="/p/b.qcow2"/><driver type="qcow2"/></disk>'
        '<disk name="sda" backup="no"/></disks></domainbackup>')


def test_default_names_sort_by_time():
    assert bk.default_name(NOW) == "b20260310-020000"


def test_backups_outlive_their_machine_they_are_deleted_not_taken_or_restored():
    gone = dict(seen([entry("b", 1)], active=False), exists=False, pool="hv1")
    assert bk.plan_backups(params(state="absent"), gone).summaries() == ["delete"]
    assert not bk.plan_backups(params(), gone).changed  # listed, nothing to take
    for asked in (params(name="new"), params(restore=True)):
        with pytest.raises(NotFoundError) as caught:
            bk.plan_backups(asked, gone)
        assert caught.value.field == "machine"


@pytest.mark.parametrize("volume, machine", [
    ("web-1.backup.nightly.vda.qcow2", "web-1"), ("web-1.backup.nightly.nvram.fd", "web-1"),
    (bk.tpm_backup("web-1", "nightly", "tpm2-00.permall"), "web-1")])
def test_every_volume_of_a_backup_names_its_machine(volume, machine):
    """A backup's disk copies, its UEFI variables and its TPM state files are all the machine's own (the volume
    module refuses to delete them, force or not)."""
    found = bk.BACKUP_VOLUME.match(volume)
    assert found is not None and found.group("machine") == machine


@pytest.mark.parametrize("volume", ["web-1-data.qcow2", "web-1.backup.qcow2", "web-1.backup.nightly.tpm."])
def test_other_volumes_are_no_backup_volumes(volume):
    assert bk.BACKUP_VOLUME.match(volume) is None

"""capture.plan_capture and plan_replica: pure plans of a captured image, and the refusals naming their field."""

import pytest

from ansible_collections.machinery.compute.plugins.module_utils.core.errors import (
    ConflictError, NotFoundError, ValidationError)
from ansible_collections.machinery.compute.plugins.module_utils.machines import capture

ROOT = {"device": "vda", "path": "/pool/web-root.qcow2", "secret": None}


def params(**extra):
    base = {"name": "golden", "os": None, "generalize": False,
            "from_machine": {"uri": "qemu:///system", "machine": "web", "snapshot": None}}
    base.update(extra)
    return base


def seen(**extra):
    base = {"pool": "hv1", "record": None, "cached": False, "exists": True, "managed": True, "active": False,
            "agent": False, "root": ROOT, "snapshots": [], "image_os": {"family": "linux"}}
    base.update(extra)
    return base


def test_a_stopped_machine_is_captured_and_published_with_its_image_os():
    plan = capture.plan_capture(params(), seen())
    assert plan.kinds() == ["capture", "publish"]
    assert plan.facts["published"] == {"name": "golden", "source": "machine:hv1/web", "checksum": None,
                                       "os": {"family": "linux"}, "generalized": False}
    assert [entry["action"] for entry in plan.find("capture").steps] == ["copy_volume", "sha256", "cache_image"]


def test_generalize_seals_the_running_machine_first():
    plan = capture.plan_capture(params(generalize=True), seen(active=True, agent=True))
    assert plan.kinds() == ["generalize", "capture", "publish"]
    assert plan.find("generalize").after == {"state": "stopped"}


def test_a_snapshot_is_reverted_to_and_back():
    source = {"uri": "qemu:///system", "machine": "web", "snapshot": "s1"}
    plan = capture.plan_capture(params(from_machine=source), seen(snapshots=["s1"]))
    steps = [entry["action"] for entry in plan.find("capture").steps]
    assert steps[:2] == ["snapshot_create", "snapshot_revert"]
    assert steps[-2:] == ["snapshot_revert", "snapshot_delete"]
    assert plan.facts["published"]["source"] == "machine:hv1/web@s1"


def test_the_same_source_captured_already_is_left_alone_but_its_os_follows():
    recorded = {"name": "golden", "source": "machine:hv1/web", "checksum": "ab" * 32, "os": {}}
    assert capture.plan_capture(params(), seen(record=recorded, cached=True, active=True)).actions == []
    plan = capture.plan_capture(params(os={"family": "linux"}), seen(record=recorded, cached=True))
    assert plan.kinds() == ["publish"]
    # the same name from another source (or with its bits gone) is captured again
    assert capture.plan_capture(params(), seen(record=recorded, cached=False)).kinds() == ["capture", "publish"]


@pytest.mark.parametrize("extra, wanted, error, field, words", [
    ({}, {"exists": False}, NotFoundError, "from_machine.machine", "no machine web"),
    ({}, {"managed": False}, ConflictError, "from_machine.machine", "not created by"),
    ({}, {"root": dict(ROOT, secret="uuid")}, ValidationError, "from_machine.machine", "encrypted"),
    ({}, {"active": True}, ConflictError, "from_machine.machine", "is running"),
    ({"generalize": True}, {}, ConflictError, "generalize", "it is stopped"),
    ({"generalize": True}, {"active": True}, ConflictError, "generalize", "agent does not answer"),
    ({"from_machine": {"uri": "u", "machine": "web", "snapshot": "s9"}}, {"snapshots": ["s1"]}, NotFoundError,
     "from_machine.snapshot", "no snapshot s9"),
    ({"generalize": True, "from_machine": {"uri": "u", "machine": "web", "snapshot": "s1"}},
     {"snapshots": ["s1"], "active": True, "agent": True}, ValidationError, "generalize", "as it was taken"),
])
def test_refusals_name_their_field(extra, wanted, error, field, words):
    with pytest.raises(error) as caught:
        capture.plan_capture(params(**extra), seen(**wanted))
    assert caught.value.field == field and words in str(caught.value)


def test_a_replica_copies_by_checksum_and_follows_the_origin_record():
    origin = {"name": "golden", "source": "machine:hv1/web", "checksum": "ab" * 32, "os": {},
              "generalized": True, "format": "qcow2"}
    assert capture.plan_replica(params(), None, False, origin).kinds() == ["copy", "publish"]
    assert capture.plan_replica(params(), None, True, origin).kinds() == ["publish"]
    recorded = dict(origin, virtual_size=1)
    assert capture.plan_replica(params(), recorded, True, origin).actions == []
    # a check-mode run that has not captured yet still shows both steps
    assert capture.plan_replica(params(), None, False, None).kinds() == ["copy", "publish"]


def test_from_machine_is_checked():
    assert capture.from_machine({"machine": "web"}, "qemu:///system") == {
        "uri": "qemu:///system", "machine": "web", "snapshot": None}
    with pytest.raises(ValidationError) as caught:
        capture.from_machine({"machine": "web", "disk": "vdb"}, "qemu:///system")
    assert caught.value.field == "from_machine"
    with pytest.raises(ValidationError) as caught:
        capture.from_machine({"machine": "Web_1"}, "qemu:///system")
    assert caught.value.field == "from_machine.machine"


def test_clone_from_is_checked_with_full_by_default():
    from ansible_collections.machinery.compute.plugins.module_utils.machines import clone

    assert clone.clone_source({"machine": "web"}, "qemu:///system") == {
        "uri": "qemu:///system", "machine": "web", "snapshot": None, "mode": "full"}
    with pytest.raises(ValidationError) as caught:
        clone.clone_source({"machine": "web", "mode": "thin"}, "qemu:///system")
    assert caught.value.field == "clone_from.mode"
    with pytest.raises(ValidationError) as caught:
        clone.clone_source({"machine": "web", "size": "1Gi"}, "qemu:///system")
    assert caught.value.field == "clone_from"


def test_a_clone_refusal_names_clone_from():
    with pytest.raises(ConflictError) as caught:
        raise capture.refusal(seen(active=True), {"machine": "web", "snapshot": None}, False, option="clone_from")
    assert caught.value.field == "clone_from.machine" and "generalize" not in str(caught.value)

"""The standalone volume's plan as a pure function: validated parameters and an observation in, actions out."""

import pytest

from ansible_collections.machinery.compute.plugins.module_utils.core.errors import ConflictError, ValidationError
from ansible_collections.machinery.compute.plugins.module_utils.machines.volumes import (
    Seen, plan_volume, selected, shown, validated, volume_key, volume_name)

MIB = 2 ** 20
GIB = 2 ** 30
IMAGE = {"source": "debian-12", "checksum": "ab" * 32, "virtual_size": 2 * GIB}


def no_image(source, field):
    raise AssertionError("no image expected, got %s for %s" % (source, field))


def published(source, _field):
    assert source == "debian-12"
    return dict(IMAGE)


def want(**params):
    return validated(dict({"name": "data"}, **params), published if params.get("image") else no_image)


def seen(capacity=None, fmt="qcow2", record=None, users=()):
    volume = None if capacity is None else {"path": "/var/lib/machinery/data", "capacity": capacity, "format": fmt}
    return Seen("hv1", volume, record, users)


USER = {"machine": "web-1", "active": False, "device": "vdb", "managed": True}
RUNNING = {"machine": "web-2", "active": True, "device": "vdc", "managed": True}


def test_an_empty_volume_is_made_qcow2_by_default():
    plan = plan_volume(want(size="1Gi", labels={"app": "web"}), seen())
    assert plan.summaries() == ["create"]
    create = plan.find("create")
    assert [s["action"] for s in create.as_dict()["steps"]] == ["create_volume", "write_document"]
    assert create.data["size"] == GIB and create.data["fmt"] == "qcow2"
    assert create.after == {"name": "data", "size": "1Gi", "format": "qcow2", "labels": {"app": "web"},
                            "image": None}
    assert plan.facts["volume"]["state"] == "Pending" and plan.facts["volume"]["attached_to"] == []


def test_a_volume_from_an_image_is_a_copy_at_least_the_image_size():
    plan = plan_volume(want(image="debian-12", format="raw"), seen())
    create = plan.find("create")
    assert [s["action"] for s in create.as_dict()["steps"]] == ["cache_image", "copy_volume", "write_document"]
    assert create.data["size"] == 2 * GIB and create.data["fmt"] == "raw"
    assert create.data["body"]["image"] == {"source": "debian-12", "checksum": IMAGE["checksum"]}
    bigger = plan_volume(want(image="debian-12", size="3Gi"), seen()).find("create")
    assert bigger.data["size"] == 3 * GIB and bigger.after["image"] == "debian-12"


def test_sizes_are_whole_sectors():
    assert want(size=MIB + 1)["size"] == MIB + 512
    # a volume of that size is not grown again by the same request
    assert plan_volume(want(size=MIB + 1), seen(MIB + 512)).actions == []


def test_an_existing_volume_is_left_alone():
    assert plan_volume(want(size="1Gi"), seen(GIB, record={"name": "data", "labels": {}})).actions == []
    assert plan_volume(want(), seen(GIB)).actions == []
    assert plan_volume(want(format="qcow2", labels={}), seen(GIB)).actions == []


def test_grow_through_a_running_user():
    plan = plan_volume(want(size="2Gi"), seen(GIB, users=[USER, RUNNING]))
    grow = plan.find("grow")
    assert plan.summaries() == ["grow"] and grow.before == {"size": "1Gi"} and grow.after == {"size": "2Gi"}
    assert grow.data["through"] == RUNNING
    assert [s["target"] for s in grow.as_dict()["steps"]] == ["data", "web-1", "web-2"]
    assert plan.diff() == ({"size": "1Gi"}, {"size": "2Gi"})
    assert plan_volume(want(size="2Gi"), seen(GIB)).find("grow").data["through"] is None


def test_relabel_keeps_the_recorded_image():
    record = {"name": "data", "labels": {"a": "1"}, "image": {"source": "debian-12", "checksum": "x"}}
    plan = plan_volume(want(labels={"b": "2"}), seen(GIB, record=record))
    assert plan.summaries() == ["update labels"]
    assert plan.find("update").data["body"] == {"name": "data", "labels": {"b": "2"}, "image": record["image"]}
    assert plan.facts["volume"]["labels"] == {"b": "2"} and plan.facts["volume"]["image"] == "debian-12"


@pytest.mark.parametrize("params, observed, field, words", [
    ({"size": "512Mi"}, seen(GIB), "size", "never shrunk"),
    ({"format": "raw"}, seen(GIB), "format", "fixed"),
    ({"image": "debian-12"}, seen(GIB), "image", "without an image"),
    ({}, seen(), "size", "is required"),
    ({"image": "debian-12", "size": "1Gi"}, seen(), "size", "smaller than image"),
])
def test_refusals_name_the_field(params, observed, field, words):
    with pytest.raises((ValidationError, ConflictError)) as caught:
        plan_volume(want(**params), observed)
    assert caught.value.field == field and words in caught.value.message


@pytest.mark.parametrize("params, field", [
    ({"name": "image-0123.qcow2"}, "name"),
    ({"name": "web-1-console.log"}, "name"),
    ({"name": "web-1-cidata.iso"}, "name"),
    ({"name": "upload-abc.lock"}, "name"),
    ({"name": "bad/name"}, "name"),
    ({"name": "data", "size": "-1Gi"}, "size"),
    ({"name": "data", "size": "10"}, "size"),
    ({"name": "data", "format": "vmdk"}, "format"),
    ({"name": "data", "labels": {"bad key!": "x"}}, "labels.bad key!"),
    ({"name": "data", "state": "gone"}, "state"),
    ({"name": "data", "image": "https://example.com/disk.qcow2"}, "image"),
])
def test_bad_input_names_the_field(params, field):
    with pytest.raises((ValidationError, ConflictError)) as caught:
        validated(params, no_image)
    assert caught.value.field == field


def test_delete():
    record = {"name": "data", "labels": {"a": "1"}, "image": None}
    plan = plan_volume(want(state="absent"), seen(GIB, record=record))
    delete = plan.find("delete")
    assert plan.summaries() == ["delete"]
    assert [s["action"] for s in delete.as_dict()["steps"]] == ["delete_volume", "delete_document"]
    assert delete.before["labels"] == {"a": "1"} and plan.facts["volume"]["state"] == "Absent"
    assert plan_volume(want(state="absent"), seen()).actions == []
    # labels of a volume deleted another way go too
    assert plan_volume(want(state="absent"), seen(record=record)).summaries() == ["forget"]


def test_delete_while_attached_needs_force():
    with pytest.raises(ConflictError) as caught:
        plan_volume(want(state="absent"), seen(GIB, users=[USER]))
    assert caught.value.field == "name" and "web-1" in caught.value.message and "force" in caught.value.message
    plan = plan_volume(want(state="absent", force=True), seen(GIB, users=[USER, RUNNING]))
    assert [s["action"] for s in plan.find("delete").as_dict()["steps"]] == [
        "detach_device", "detach_device", "delete_volume"]


@pytest.mark.parametrize("state, force", [("absent", True), ("absent", False), ("present", False)])
def test_a_machines_own_volume_is_refused_whatever_force_says(state, force):
    owner = ("vf1", "the root disk", "machinery.compute.machine with state: absent deletes it with the machine")
    observed = Seen("hv1", {"path": "/p/vf1-root.qcow2", "capacity": GIB, "format": "qcow2"}, None,
                    [dict(USER, machine="vf1", device="vda")], owner)
    with pytest.raises(ConflictError) as caught:
        plan_volume(want(state=state, force=force, size="2Gi" if state == "present" else None), observed)
    assert caught.value.field == "name"
    assert "the root disk of machine vf1" in caught.value.message and "state: absent" in caught.value.message
    # gone already: nothing to refuse, nothing to do
    assert plan_volume(want(state="absent", force=True), Seen("hv1", None, None, [], owner)).actions == []


def test_shown_and_filters():
    volume = shown("data", seen(GIB, record={"name": "data", "labels": {"app": "web"}}, users=[RUNNING, USER]))
    assert volume == {"name": "data", "pool": "hv1", "size": "1Gi", "format": "qcow2", "labels": {"app": "web"},
                      "image": None, "attached_to": ["web-1", "web-2"], "state": "Available"}
    assert selected(volume, ["data"], {"app": "web"}) and selected(volume, None, {})
    assert not selected(volume, ["other"], {}) and not selected(volume, None, {"app": "db"})


def test_registry_keys_fit_any_volume_name():
    assert volume_key("Web_1.data.qcow2") != volume_key("web_1.data.qcow2")
    assert volume_key("x").startswith("volume-") and len(volume_key("x" * 128)) == len("volume-") + 32
    assert volume_name("Web_1.data.qcow2") == "Web_1.data.qcow2"

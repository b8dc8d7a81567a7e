"""Named images: the plan of machine_image and the parts of resolving a name that need no libvirt."""

import pytest

from ansible_collections.machinery.compute.plugins.module_utils.machines import named_images as ni
from ansible_collections.machinery.compute.plugins.module_utils.core.errors import ConflictError

from conftest import refused

SUM = "a" * 64
PARAMS = {"name": "debian-12", "state": "present", "os": {"family": "linux", "version": 12},
          "resolved": {"source": "/images/debian.qcow2", "checksum": SUM, "path": "/images/debian.qcow2"}}
PUBLISHED = {"name": "debian-12", "source": "/images/debian.qcow2", "checksum": SUM,
             "os": {"family": "linux", "version": "12"}, "format": "qcow2", "virtual_size": 2 ** 30}


def test_new_image_is_cached_then_published():
    plan = ni.plan_image(PARAMS, None, False)
    assert plan.summaries() == ["cache", "publish"]
    assert plan.actions[1].data["body"]["os"] == {"family": "linux", "version": "12"}


def test_published_and_cached_image_is_left_alone():
    assert ni.plan_image(PARAMS, PUBLISHED, True).actions == []


def test_os_left_out_keeps_the_published_description():
    assert ni.plan_image(dict(PARAMS, os=None), PUBLISHED, True).actions == []
    assert ni.plan_image(dict(PARAMS, os={}), PUBLISHED, True).diff()[1]["os"] == {}


def test_a_new_os_description_republishes():
    plan = ni.plan_image(dict(PARAMS, os={"family": "linux", "version": "13"}), PUBLISHED, True)
    assert plan.summaries() == ["publish"]
    assert plan.diff()[1]["os"]["version"] == "13"


def test_withdraw_refuses_while_machines_use_it_unless_forced():
    with pytest.raises(ConflictError):
        ni.plan_image({"name": "debian-12", "state": "absent"}, PUBLISHED, True, ["web-1"])
    plan = ni.plan_image({"name": "debian-12", "state": "absent", "force": True}, PUBLISHED, True, ["web-1"])
    assert plan.summaries() == ["withdraw"]
    assert ni.plan_image({"name": "debian-12", "state": "absent"}, None, False).actions == []


OS_CASES = [({"family": "beos"}, "os.family"), ({"architecture": "sparc"}, "os.architecture"),
            ({"kernel": "6.1"}, "os"), ({"version": ""}, "os.version"), ("linux", "os")]


@pytest.mark.parametrize("value,field", OS_CASES)
def test_os_description_is_checked(value, field):
    refused(field, ni.os_info, value)


def test_a_reference_is_a_label_that_is_no_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert ni.is_reference("debian-12")
    assert not ni.is_reference("./debian-12") and not ni.is_reference("/images/debian.qcow2")
    assert not ni.is_reference("https://example.com/debian.qcow2") and not ni.is_reference("Debian_12.qcow2")
    (tmp_path / "debian-12").write_bytes(b"")
    assert not ni.is_reference("debian-12")

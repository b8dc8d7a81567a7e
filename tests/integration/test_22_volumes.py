"""volume and volume_info (issue 22): a standalone volume's lifecycle, a bootable copy of a published image that a
machine without an image boots from, deletion refused while attached and forced, IronCore Volumes, bad input.
Every effect is read back from libvirt (the storage pool, the registry pool, the domains)."""

import json
import os
import subprocess
import sys

import pytest
from lxml import etree

from conftest import assert_failed, first_pool, load_lab, run_module

DATA = "it-svol-data"
BOOT = "it-svol-boot"
COPY = "it-svol-copy.raw"
MACHINE = "it-svol-vm"
OWNER = "it-svol-own"
IMAGE_NAME = "it-svol-image"
MIB = 2 ** 20


@pytest.fixture(scope="module")
def image():
    """The lab's image (this test needs one pool only, so it does not ask for the 3-pool lab)."""
    return load_lab()["image"]


def clean(pool):
    run_module("machine_backup", uri=pool.uri, machine=OWNER, name="b1", state="absent")
    for machine in (MACHINE, OWNER):
        if pool.domain(machine) is not None:
            run_module("machine", uri=pool.uri, name=machine, state="absent", shutdown_timeout=0)
    if f"{OWNER}.r1-root.qcow2" in pool.volumes():
        pool.conn.storagePoolLookupByName("machinery").storageVolLookupByName(f"{OWNER}.r1-root.qcow2").delete(0)
    for name in (DATA, BOOT, COPY, "it-svol-bad", "it-svol-ic", "it-svol-group"):
        run_module("volume", uri=pool.uri, name=name, state="absent", force=True)


@pytest.fixture(scope="module")
def vol_pool():
    with first_pool(clean) as pool:
        yield pool


def registry(pool):
    return pool.volumes("machinery-registry")


def volume_xml(pool, name):
    storage = pool.conn.storagePoolLookupByName("machinery")
    storage.refresh(0)
    return etree.fromstring(storage.storageVolLookupByName(name).XMLDesc(0).encode())


def capacity(pool, name):
    return int(volume_xml(pool, name).findtext("capacity"))


def test_lifecycle(vol_pool, module):
    pool = vol_pool
    args = dict(uri=pool.uri, name=DATA, size="32Mi", labels={"app": "web"})
    before = (pool.volumes(), registry(pool))

    planned = module("volume", check=True, **args)
    assert planned["changed"] is True and planned["actions"] == ["create"], planned
    assert planned["volume"]["state"] == "Pending" and planned["volume"]["size"] == "32Mi"
    assert (pool.volumes(), registry(pool)) == before  # check mode wrote nothing

    made = module("volume", **args)
    assert made["changed"] is True and not made.get("failed"), made
    assert made["volume"] == {"name": DATA, "pool": pool.name, "size": "32Mi", "format": "qcow2",
                              "labels": {"app": "web"}, "image": None, "attached_to": [], "state": "Available"}
    assert DATA in pool.volumes() and capacity(pool, DATA) == 32 * MIB
    assert volume_xml(pool, DATA).find("target/format").get("type") == "qcow2"
    assert len(registry(pool)) == len(before[1]) + 1

    again = module("volume", **args)
    assert again["changed"] is False and again["actions"] == [], again
    assert module("volume", uri=pool.uri, name=DATA)["changed"] is False  # options left out keep what is there

    grown = module("volume", uri=pool.uri, name=DATA, size="64Mi", labels={"app": "db"})
    assert grown["changed"] is True and grown["actions"] == ["grow", "update labels"], grown
    assert grown["diff"]["before"] == {"size": "32Mi", "labels": {"app": "web"}}
    assert grown["diff"]["after"] == {"size": "64Mi", "labels": {"app": "db"}}
    assert capacity(pool, DATA) == 64 * MIB
    assert module("volume", uri=pool.uri, name=DATA, size="64Mi", labels={"app": "db"})["changed"] is False

    listed = module("volume_info", uri=pool.uri, labels={"app": "db"})
    assert [v["name"] for v in listed["volumes"]] == [DATA], listed
    assert listed["volumes"][0]["size"] == "64Mi" and listed["volumes"][0]["labels"] == {"app": "db"}
    assert module("volume_info", uri=pool.uri, name=["no-such-volume"])["volumes"] == []
    assert module("volume_info", uri=pool.uri, labels={"app": "nobody"})["volumes"] == []
    everything = [v["name"] for v in module("volume_info", pools=[pool.uri])["volumes"]]
    assert DATA in everything
    assert not any(name.startswith(("image-", "upload-")) or name.endswith((".complete", "-console.log", ".lock"))
                   for name in everything), everything

    planned = module("volume", check=True, uri=pool.uri, name=DATA, state="absent")
    assert planned["actions"] == ["delete"] and DATA in pool.volumes()
    deleted = module("volume", uri=pool.uri, name=DATA, state="absent")
    assert deleted["changed"] is True and deleted["volume"]["state"] == "Absent", deleted
    assert deleted["diff"]["before"]["size"] == "64Mi"
    assert (pool.volumes(), registry(pool)) == before
    assert module("volume", uri=pool.uri, name=DATA, state="absent")["changed"] is False


def test_a_machine_boots_from_a_copy_of_a_published_image(vol_pool, module, image):
    pool = vol_pool
    published = module("machine_image", uri=pool.uri, name=IMAGE_NAME, path=image)
    assert not published.get("failed"), published

    made = module("volume", uri=pool.uri, name=BOOT, image=IMAGE_NAME, size="48Mi")
    assert made["changed"] is True and made["volume"]["image"] == IMAGE_NAME, made
    xml = volume_xml(pool, BOOT)
    # a full copy: no backing file, the size asked for, the default format
    assert xml.find("backingStore/path") is None and capacity(pool, BOOT) == 48 * MIB
    assert xml.find("target/format").get("type") == "qcow2"
    assert module("volume", uri=pool.uri, name=BOOT, image=IMAGE_NAME, size="48Mi")["changed"] is False

    # from a local file too, converted to raw
    copied = module("volume", uri=pool.uri, name=COPY, image=image, format="raw")
    assert copied["changed"] is True and copied["volume"]["format"] == "raw", copied
    assert volume_xml(pool, COPY).find("target/format").get("type") == "raw"
    # the image's own virtual-size: QEMU 8 and later also list the file node under "children", with the file's
    # length as its virtual-size, so the document is read as JSON rather than searched for the first key
    info = json.loads(subprocess.run(["qemu-img", "info", "--output=json", image], check=True, capture_output=True,
                                     text=True).stdout)
    assert info["format"] == "qcow2" and capacity(pool, COPY) == info["virtual-size"], info

    booted = module("machine", uri=pool.uri, name=MACHINE, machine_class="small",
                    volumes=[{"name": "boot", "volume": BOOT}], wait="running")
    assert not booted.get("failed"), booted
    assert f"{MACHINE}-root.qcow2" not in pool.volumes()  # no root disk of its own: it boots from the volume
    pool.wait_console(MACHINE, "MACHINERY-READY", timeout=180)

    listed = module("volume_info", uri=pool.uri, name=[BOOT])["volumes"]
    assert listed[0]["attached_to"] == [MACHINE] and listed[0]["image"] == IMAGE_NAME

    # grown while the guest runs: through the guest, which sees the new size at once
    grown = module("volume", uri=pool.uri, name=BOOT, size="64Mi")
    assert grown["actions"] == ["grow"], grown
    dom = pool.domain(MACHINE)
    assert dom.blockInfo("vda")[0] == 64 * MIB and capacity(pool, BOOT) == 64 * MIB
    assert module("volume", uri=pool.uri, name=BOOT, size="64Mi")["changed"] is False

    # in use: refused, nothing changes
    refused = module("volume", uri=pool.uri, name=BOOT, state="absent")
    assert_failed(refused, "name", MACHINE, "force")
    assert BOOT in pool.volumes() and BOOT in dom.XMLDesc(0)
    ironcore = {"apiVersion": "storage.ironcore.dev/v1alpha1", "kind": "Volume", "metadata": {"name": BOOT},
                "spec": {"image": IMAGE_NAME}}
    kept = module("manifest", uri=pool.uri, definition=[ironcore], state="absent")
    assert kept.get("failed") and f"Volume/{BOOT}" in kept["msg"] and MACHINE in kept["msg"], kept
    assert BOOT in pool.volumes()

    forced = module("volume", uri=pool.uri, name=BOOT, state="absent", force=True)
    assert forced["changed"] is True and forced["actions"] == ["delete"], forced
    assert BOOT not in pool.volumes()
    inactive = pool.domain(MACHINE).XMLDesc(2)  # VIR_DOMAIN_XML_INACTIVE
    assert BOOT not in inactive
    assert module("volume", uri=pool.uri, name=BOOT, state="absent", force=True)["changed"] is False

    assert module("machine", uri=pool.uri, name=MACHINE, state="absent", shutdown_timeout=0)["changed"]
    assert module("volume", uri=pool.uri, name=COPY, state="absent")["changed"] is True


def disks(dom, flags=0):
    return sorted(node.get("file") for node in etree.fromstring(dom.XMLDesc(flags).encode()).findall(
        "devices/disk/source") if (node.get("file") or "").endswith(".qcow2"))


def test_a_machines_own_disks_are_never_deleted_by_force(vol_pool, module, image):
    """Issue 44: force deleted a running machine's root and data disks, leaving it a definition with no disk."""
    pool = vol_pool
    made = module("machine", uri=pool.uri, name=OWNER, machine_class="small", image=image,
                  volumes=[{"name": "data", "size": "16Mi"}], wait="running")
    assert not made.get("failed"), made
    dom = pool.domain(OWNER)
    backup = module("machine_backup", uri=pool.uri, machine=OWNER, name="b1")
    assert not backup.get("failed"), backup
    backup_copy = f"{OWNER}.backup.b1.vda.qcow2"
    assert backup_copy in pool.volumes()
    # a root left by a rebuild, as a killed rebuild leaves it
    storage = pool.conn.storagePoolLookupByName("machinery")
    storage.createXML(f"<volume><name>{OWNER}.r1-root.qcow2</name><capacity>1048576</capacity>"
                      "<target><format type='qcow2'/></target></volume>", 0)
    before = (pool.volumes(), disks(dom), disks(dom, 2))
    assert len(before[1]) == 2 and len(before[2]) == 2, before
    for name, words in ((f"{OWNER}-root.qcow2", ["the root disk of machine " + OWNER, "state: absent"]),
                        (f"{OWNER}-data.qcow2", ["an ephemeral volume of machine " + OWNER, "state: absent"]),
                        (backup_copy, ["a backup copy of machine " + OWNER, "machine_backup"]),
                        (f"{OWNER}.r1-root.qcow2", ["rebuilds of machine " + OWNER])):
        for check in (True, False):
            refused = module("volume", check=check, uri=pool.uri, name=name, state="absent", force=True)
            assert_failed(refused, "name", *words)
        assert_failed(module("volume", uri=pool.uri, name=name, size="2Gi"), "name", OWNER)
    assert (pool.volumes(), disks(dom), disks(dom, 2)) == before
    assert dom.isActive()


def test_a_machine_notices_a_deleted_volume_of_its_own(vol_pool, module):
    """Issue 44: after its volume was deleted by force, the machine's task reported no change."""
    pool = vol_pool
    assert module("volume", uri=pool.uri, name=DATA, size="16Mi")["changed"]
    args = dict(uri=pool.uri, name=MACHINE, machine_class="small", state="stopped",
                volumes=[{"name": "boot", "volume": DATA}])
    assert not module("machine", **args).get("failed")
    assert module("machine", **args)["changed"] is False
    forced = module("volume", uri=pool.uri, name=DATA, state="absent", force=True)
    assert forced["changed"] is True and DATA not in pool.volumes()
    before = pool.domain(MACHINE).XMLDesc(2)
    for check in (True, False):
        assert_failed(module("machine", check=check, **args), "volumes[0].volume", DATA, "volume_attach")
    assert pool.domain(MACHINE).XMLDesc(2) == before
    assert module("machine", uri=pool.uri, name=MACHINE, state="absent")["changed"] is True


def test_ironcore_volume_from_an_os_image(vol_pool, module, image):
    pool = vol_pool
    assert not module("machine_image", uri=pool.uri, name=IMAGE_NAME, path=image).get("failed")
    doc = {"apiVersion": "storage.ironcore.dev/v1alpha1", "kind": "Volume",
           "metadata": {"name": "it-svol-ic", "labels": {"tier": "boot"}},
           "spec": {"dataSource": {"osImage": IMAGE_NAME}, "resources": {"storage": "40Mi"}}}
    planned = module("manifest", check=True, uri=pool.uri, definition=[doc])
    assert planned["actions"] == ["Volume/it-svol-ic: create on %s" % pool.name], planned
    assert "it-svol-ic" not in pool.volumes()
    applied = module("manifest", uri=pool.uri, definition=[doc])
    assert not applied.get("failed") and applied["objects"][0]["status"]["state"] == "Available", applied
    assert applied["tables"]["Volume"][1].split() == ["it-svol-ic", pool.name, "40Mi", "Available"]
    assert capacity(pool, "it-svol-ic") == 40 * MIB and volume_xml(pool, "it-svol-ic").find("backingStore/path") is None
    shown = module("volume_info", uri=pool.uri, name=["it-svol-ic"])["volumes"][0]
    assert shown["labels"] == {"tier": "boot"} and shown["image"] == IMAGE_NAME
    assert module("manifest", uri=pool.uri, definition=[doc])["changed"] is False
    deleted = module("manifest", uri=pool.uri, definition=[doc], state="absent")
    assert deleted["actions"] == ["Volume/it-svol-ic: delete on %s" % pool.name], deleted
    assert "it-svol-ic" not in pool.volumes()


@pytest.mark.parametrize("args, field, words", [
    ({"size": "1Mi", "image": "IMAGE"}, "size", ["smaller than image"]),
    ({"size": None}, "size", ["image"]),
    ({"image": "no-such-image"}, "image", ["machine_image"]),
    ({"image": "/nonexistent/disk.qcow2"}, "image", []),
    ({"format": "vmdk"}, "format", []),
    ({"labels": {"a b": "x"}}, "labels.a b", []),
    ({"size": "1Pi"}, "size", ["does not fit"]),
    ({"name": "web-1-console.log"}, "name", ["console log"]),
], ids=["below-image", "no-size", "unpublished", "missing-file", "format", "label", "too-big", "reserved"])
def test_bad_input_is_refused_and_nothing_is_made(vol_pool, module, image, args, field, words):
    pool = vol_pool
    before = (pool.volumes(), registry(pool))
    params = dict({"uri": pool.uri, "name": "it-svol-bad", "size": "16Mi"}, **args)
    params = {key: (image if value == "IMAGE" else value) for key, value in params.items() if value is not None}
    result = module("volume", **params)
    if field == "format":  # refused by Ansible's own check of the choices, which names the option in its message
        assert result.get("failed") and "value of format must be one of" in result["msg"], result
    else:
        assert_failed(result, field, *words)
    assert (pool.volumes(), registry(pool)) == before
    assert os.path.isfile(image)


PLAY = """
- hosts: localhost
  connection: local
  gather_facts: false
  module_defaults:
    group/machinery.compute.machinery:
      uri: "{{ pool_uri }}"
  tasks:
    - machinery.compute.volume:
        name: it-svol-group
        size: 16Mi
      register: made
    - machinery.compute.volume_info:
        name: [it-svol-group]
      register: listed
    - machinery.compute.volume:
        name: it-svol-group
        state: absent
    - ansible.builtin.assert:
        that:
          - made.volume.pool == pool_name
          - listed.volumes | map(attribute='name') | list == ['it-svol-group']
"""


def test_members_of_the_action_group(vol_pool, tmp_path):
    pool = vol_pool
    playbook = tmp_path / "group.yml"
    playbook.write_text(PLAY)
    variables = tmp_path / "vars.json"
    variables.write_text(json.dumps({"pool_uri": pool.uri, "pool_name": pool.name}))
    env = dict(os.environ, ANSIBLE_LOCALHOST_WARNING="false", ANSIBLE_INVENTORY_UNPARSED_WARNING="false",
               ANSIBLE_NOCOLOR="1")
    proc = subprocess.run([os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), str(playbook), "-e",
                           "@%s" % variables], capture_output=True, text=True, env=env, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "it-svol-group" not in pool.volumes()

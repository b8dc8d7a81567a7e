"""machine_backup: a backup of a running guest, restored over its disks after the guest changed them, proven by
what the guest reads from its data disk at the next boot.

The guest's user-data script reads a generation counter from its data disk, writes the next one and prints both
(MACHINERY-DISK seen=gen-N wrote=gen-N+1). Backup b1 is taken after the first boot (gen-1 on disk); the second
boot writes gen-2; after restoring b1 the third boot reads gen-1 again.
"""

import time

import pytest

from conftest import assert_failed, first_pool, load_lab, run_module

MACHINE = "bk-guest"
SCRIPT = """#!/bin/sh
seen=$(dd if=/dev/vdb bs=16 count=1 2>/dev/null | tr -d '\\000')
seen=${seen:-gen-0}
next="gen-$(( ${seen#gen-} + 1 ))"
printf '%s' "$next" | dd of=/dev/vdb conv=fsync 2>/dev/null
echo "MACHINERY-DISK seen=$seen wrote=$next"
"""


@pytest.fixture(scope="module")
def bk_pool():
    with first_pool(clean) as pool:
        yield pool


def clean(pool):
    for name in ("b1", "b2"):
        if pool.domain(MACHINE) is not None:
            run_module("machine_backup", uri=pool.uri, machine=MACHINE, name=name, state="absent")
    if pool.domain(MACHINE) is not None:
        run_module("machine", uri=pool.uri, name=MACHINE, state="absent", shutdown_timeout=0)


def backup_volumes(pool):
    return [name for name in pool.volumes() if name.startswith(MACHINE + ".backup.")]


def machine(module, pool, state):
    image = load_lab()["image"]
    result = module("machine", uri=pool.uri, name=MACHINE, machine_class="small", image=image, state=state,
                    volumes=[{"name": "data", "size": "16Mi"}], network_interfaces=[],
                    cloud_init={"user_data": SCRIPT}, shutdown_timeout=30)
    assert not result.get("failed"), result
    return result


def booted_and_saw(pool, generation):
    text = pool.wait_console(MACHINE, "MACHINERY-SCRIPT-END", timeout=300)
    assert "MACHINERY-DISK seen=%s " % generation in text, text[-2000:]


def test_backup_restore_prune(bk_pool, module):
    pool = bk_pool
    started = time.monotonic()
    args = dict(uri=pool.uri, machine=MACHINE)
    machine(module, pool, "running")
    booted_and_saw(pool, "gen-0")  # and wrote gen-1

    planned = module("machine_backup", check=True, name="b1", **args)
    assert planned["changed"] and planned["actions"] == ["backup"], planned
    assert backup_volumes(pool) == []

    taken = module("machine_backup", name="b1", **args)
    assert taken["changed"], taken
    backup = taken["backup"]
    assert backup["method"] == "push"
    # the busybox guest runs qemu-guest-agent: the file systems were frozen through it, unless the agent had not
    # answered yet, which the return must then say
    assert backup["quiesced"] is True or "guest agent" in (backup.get("reason") or ""), backup
    assert sorted(disk["device"] for disk in backup["disks"]) == ["vda", "vdb"]
    assert sorted(backup_volumes(pool)) == ["%s.backup.b1.vda.qcow2" % MACHINE, "%s.backup.b1.vdb.qcow2" % MACHINE]
    again = module("machine_backup", name="b1", **args)
    assert again["changed"] is False and [entry["name"] for entry in again["backups"]] == ["b1"], again

    refused = module("machine_backup", name="b1", restore=True, **args)
    assert_failed(refused, "restore", "running")

    machine(module, pool, "stopped")
    machine(module, pool, "running")
    booted_and_saw(pool, "gen-1")  # and wrote gen-2
    machine(module, pool, "stopped")

    offline = module("machine_backup", name="b2", **args)
    assert offline["changed"] and offline["backup"]["method"] == "copy", offline
    assert [entry["name"] for entry in offline["backups"]] == ["b1", "b2"]

    planned = module("machine_backup", check=True, name="b1", restore=True, **args)
    assert planned["changed"] and planned["actions"] == ["restore"], planned
    restored = module("machine_backup", name="b1", restore=True, **args)
    assert restored["changed"] and restored["diff"]["after"] == {"restored": "b1"}, restored
    assert module("machine_backup", name="b1", restore=True, **args)["changed"] is False

    machine(module, pool, "running")
    booted_and_saw(pool, "gen-1")  # the restored disk, not gen-2

    refused = module("machine_backup", name="b2", retention={"count": 0}, **args)
    assert_failed(refused, "retention.count")
    pruned = module("machine_backup", name="b2", retention={"count": 1}, **args)
    assert pruned["changed"] and pruned["actions"] == ["prune retention"], pruned
    assert pruned["diff"]["before"] == {"backups": ["b1"]}
    assert [entry["name"] for entry in pruned["backups"]] == ["b2"]
    assert not [name for name in backup_volumes(pool) if ".b1." in name]
    assert module("machine_backup", name="b2", retention={"count": 1}, **args)["changed"] is False

    deleted = module("machine_backup", name="b2", state="absent", **args)
    assert deleted["changed"] and deleted["backups"] == [], deleted
    assert backup_volumes(pool) == []
    assert module("machine_backup", name="b2", state="absent", **args)["changed"] is False
    registry = pool.conn.storagePoolLookupByName("machinery-registry")
    registry.refresh(0)
    assert not [name for name in registry.listVolumes() if name.startswith("backups-%s." % MACHINE)]
    print("backups: whole test %.0fs" % (time.monotonic() - started))

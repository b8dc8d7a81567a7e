"""machine_snapshot: internal snapshots of a busybox guest, proven from inside the guest through its agent.

A marker written after snapshot s1 (in the guest's RAM, /tmp, and on its data disk) is gone after the revert to
s1, a snapshot with memory of the running guest. A marker written to the data disk after the disk-only snapshot
s2 of the stopped machine is gone at the next boot after reverting to s2. Then retention, refusals, the move
refused, deletes, and a deleted machine's snapshot list gone with it.
"""

import os
import time

import pytest

from conftest import assert_failed, first_pool, guest_agent, guest_shell, load_lab, register, run_module

MACHINE = "sn-guest"
MARKER = "MACHINERY-SNAPSHOT-MARKER"
SHARED = "sn-shared.raw"
# the guest's shell reads the first bytes of its data disk
READ_DISK = "dd if=/dev/vdb bs=64 count=1 2>/dev/null | tr -d '\\000'"


@pytest.fixture(scope="module")
def sn_pool():
    with first_pool(clean) as pool:
        yield pool


def clean(pool):
    if pool.domain(MACHINE) is not None:
        run_module("machine", uri=pool.uri, name=MACHINE, state="absent", shutdown_timeout=0)
    drop_shared(pool)


def drop_shared(pool):
    if SHARED in pool.volumes():
        pool.conn.storagePoolLookupByName("machinery").storageVolLookupByName(SHARED).delete(0)


def machine(module, pool, state):
    result = module("machine", uri=pool.uri, name=MACHINE, machine_class="small", image=load_lab()["image"],
                    state=state, volumes=[{"name": "data", "size": "16Mi"}], network_interfaces=[],
                    shutdown_timeout=30)
    assert not result.get("failed"), result
    return result


def libvirt_snapshots(pool):
    dom = pool.domain(MACHINE)
    return sorted(dom.snapshotListNames(0)) if dom is not None else []


def agent_of(pool, timeout=240):
    """The guest agent of the machine, once it answers (after a boot or a revert)."""
    return guest_agent(pool, MACHINE, timeout)


shell = guest_shell


def write_markers(agent, ram=True):
    if ram:
        shell(agent, "echo %s >/tmp/marker" % MARKER)
    shell(agent, "printf %s | dd of=/dev/vdb conv=fsync 2>/dev/null; sync" % MARKER)
    assert MARKER in shell(agent, READ_DISK)


def load():
    return os.getloadavg()[0]


def test_snapshot_revert_retention_delete(sn_pool, module, capsys):
    pool = sn_pool
    args = dict(uri=pool.uri, machine=MACHINE)
    machine(module, pool, "running")
    agent_of(pool)

    planned = module("machine_snapshot", check=True, name="s1", **args)
    assert planned["changed"] and planned["actions"] == ["create"], planned
    assert [entry["name"] for entry in planned["snapshots"]] == ["s1"]
    assert libvirt_snapshots(pool) == []

    started = time.monotonic()
    taken = module("machine_snapshot", name="s1", **args)
    took = time.monotonic() - started
    assert taken["changed"] and taken["diff"]["after"]["memory"] is True, taken
    (s1,) = taken["snapshots"]
    assert s1["name"] == "s1" and s1["memory"] is True and s1["state"] == "running" and s1["current"] is True
    assert s1["disks"] == ["vda", "vdb"]  # the seed cdrom is left out
    assert libvirt_snapshots(pool) == ["s1"]
    again = module("machine_snapshot", name="s1", **args)
    assert again["changed"] is False and again["actions"] == [], again

    # after the snapshot: a file in the guest's RAM and bytes on its data disk
    agent = agent_of(pool)
    write_markers(agent)
    assert MARKER in shell(agent, "cat /tmp/marker")

    planned = module("machine_snapshot", check=True, name="s1", state="reverted", **args)
    assert planned["changed"] and planned["actions"] == ["revert"], planned
    load_before = load()
    started = time.monotonic()
    reverted = module("machine_snapshot", name="s1", state="reverted", **args)
    took_revert = time.monotonic() - started
    assert reverted["changed"] and reverted["diff"]["after"] == {"reverted": "s1", "state": "running"}, reverted
    assert pool.domain(MACHINE).isActive()
    agent = agent_of(pool)
    assert shell(agent, "test -e /tmp/marker && echo present || echo gone").strip() == "gone"
    assert MARKER not in shell(agent, READ_DISK)
    with capsys.disabled():
        print("\n[measure] snapshot with memory of a running 128 MiB TCG guest: %.2f s (module run); revert to it: "
              "%.2f s; load average %.2f (before the revert %.2f)" % (took, took_revert, load(), load_before))

    # a disk-only snapshot of the stopped machine; memory: true is refused there, and nothing is taken
    machine(module, pool, "stopped")
    refused = module("machine_snapshot", name="s2", memory=True, **args)
    assert_failed(refused, "memory", "not running")
    assert libvirt_snapshots(pool) == ["s1"]
    # a shareable raw volume cannot hold an internal snapshot: the machine is refused, naming the disk
    shared = dict(uri=pool.uri, machine=MACHINE, volume=SHARED)
    attached = module("volume_attach", size="1Mi", format="raw", shareable=True, **shared)
    assert not attached.get("failed"), attached
    refused = module("machine_snapshot", name="s2", **args)
    assert_failed(refused, "machine", "is a shareable raw volume")
    assert libvirt_snapshots(pool) == ["s1"]
    assert not module("volume_attach", state="detached", **shared).get("failed")
    drop_shared(pool)
    started = time.monotonic()
    cold = module("machine_snapshot", name="s2", **args)
    took_cold = time.monotonic() - started
    assert cold["changed"], cold
    s2 = next(entry for entry in cold["snapshots"] if entry["name"] == "s2")
    assert s2["memory"] is False and s2["state"] == "shutoff"

    machine(module, pool, "running")
    write_markers(agent_of(pool), ram=False)
    machine(module, pool, "stopped")
    started = time.monotonic()
    reverted = module("machine_snapshot", name="s2", state="reverted", **args)
    took_cold_revert = time.monotonic() - started
    assert reverted["changed"] and reverted["diff"]["after"] == {"reverted": "s2", "state": "shutoff"}, reverted
    assert not pool.domain(MACHINE).isActive()
    again = module("machine_snapshot", name="s2", state="reverted", **args)
    assert again["changed"] is False, again  # not started since the revert
    machine(module, pool, "running")
    assert MARKER not in shell(agent_of(pool), READ_DISK)
    with capsys.disabled():
        print("[measure] disk-only snapshot of the stopped guest: %.2f s; revert to it: %.2f s; load average %.2f"
              % (took_cold, took_cold_revert, load()))

    # bad input: named fields, nothing changed
    for bad, field in ((dict(name="s3", retention={"count": 0}), "retention.count"),
                       (dict(name="Not_A_Label"), "name"),
                       (dict(name="nope", state="reverted"), "name"),
                       (dict(name="s3", memory=False), "memory")):
        assert_failed(module("machine_snapshot", **dict(args, **bad)), field)
    assert libvirt_snapshots(pool) == ["s1", "s2"]

    # a move is refused while the machine has snapshots
    for other in load_lab()["pools"][1:2]:
        register(type(pool)(other["name"], other["uri"]))
        moved = module("machine_migrate", pools=[{"name": entry["name"], "uri": entry["uri"]}
                                                 for entry in load_lab()["pools"][:2]],
                       machine=MACHINE, target=other["name"], mode="cold")
        assert_failed(moved, "machine", "snapshots (s1, s2)")
    assert pool.domain(MACHINE).isActive()

    # retention: s3 taken, the oldest (s1) pruned
    pruned = module("machine_snapshot", name="s3", retention={"count": 2}, **args)
    assert pruned["changed"] and pruned["actions"] == ["create", "prune retention"], pruned
    assert pruned["diff"]["before"] == {"snapshots": ["s1"]}
    assert [entry["name"] for entry in pruned["snapshots"]] == ["s2", "s3"]
    assert libvirt_snapshots(pool) == ["s2", "s3"]
    assert module("machine_snapshot", name="s3", retention={"count": 2}, **args)["changed"] is False

    deleted = module("machine_snapshot", name="s2", state="absent", **args)
    assert deleted["changed"] and [entry["name"] for entry in deleted["snapshots"]] == ["s3"], deleted
    assert libvirt_snapshots(pool) == ["s3"]
    assert module("machine_snapshot", name="s2", state="absent", **args)["changed"] is False

    # the machine deleted with a snapshot: libvirt forgets the snapshot with it
    assert not module("machine", uri=pool.uri, name=MACHINE, state="absent", shutdown_timeout=0).get("failed")
    assert pool.domain(MACHINE) is None
    assert module("machine_snapshot", name="s3", state="absent", **args)["changed"] is False
    machine(module, pool, "stopped")
    assert libvirt_snapshots(pool) == []

"""One machine, one operation at a time (issue #38): snapshot, volume and NIC attach, backup restore and
`state: stopped` started while a cold or a live move of the same machine holds it are refused with
`reason: Conflict` naming the move, and afterwards libvirt shows exactly what the runs reported: the machine once,
with every disk it names, and nothing the refused runs would have made. A run that finds the machine held by
another (non-move) operation waits for it, saying so in its progress, or fails naming it after `hold_timeout`.

Each overlap is made, never hoped for: the move is frozen (SIGSTOP) once libvirt shows it under way (its journal
written, a cold move's guest stopped), the second run is made while it is frozen, and the move is then let go."""

import datetime
import json
import os
import signal
import socket

import libvirt
import pytest

from conftest import ModuleRun, run_module
from test_13_migrate import fleet, homes, journals, listed, make, remove
from test_24_races import holds, wait_for, whole_once

from ansible_collections.machinery.compute.plugins.module_utils.coordination import holds as coordination

NAME = "coord-1"
EXTRA = "coord-extra.qcow2"
HOST = coordination._word(socket.gethostname())


@pytest.fixture(name="image", scope="module")
def idle_guest_image(idle_image):
    """Nothing here looks inside the guest: the idle image, at no CPU cost."""
    return idle_image


@pytest.fixture(name="machine", scope="module")
def one_running_machine(registered, image):
    """One running machine (root, data volume, NIC) that every test moves to the other of the first two pools."""
    pools = registered
    make(pools[0], image, NAME, state="running", data="8Mi")
    yield pools[:2]
    for pool in pools:
        if pool.domain(NAME) is not None:
            run_module("machine_backup", uri=pool.uri, machine=NAME, name="b1", state="absent")
    remove(pools, NAME)
    for pool in pools:
        storage = pool.conn.storagePoolLookupByName("machinery")
        storage.refresh(0)
        if EXTRA in listed(pool):
            storage.storageVolLookupByName(EXTRA).delete(0)


def disk_paths(dom):
    from lxml import etree
    tree = etree.fromstring(dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE))
    return [node.get("file") or node.get("volume") for node in tree.findall("devices/disk/source")]


def nic_aliases(dom):
    from lxml import etree
    tree = etree.fromstring(dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE))
    return [node.get("name") for node in tree.findall("devices/interface/alias")]


# the second run of each race: its module and arguments (uri and machine added), and what libvirt must not show
# afterwards on the pool the machine ends on
OPERATIONS = {
    "snapshot": ("machine_snapshot", {"name": "s-race"}),
    "volume_attach": ("volume_attach", {"volume": EXTRA, "size": "8Mi"}),
    "nic_attach": ("nic_attach", {"name": "eth9", "network": "machinery"}),
    "restore": ("machine_backup", {"name": "b1", "restore": True}),
    "stopped": ("machine", {"state": "stopped", "shutdown_timeout": 1}),
}
COLD = ["snapshot", "volume_attach", "nic_attach", "restore", "stopped"]
LIVE = ["snapshot", "volume_attach", "nic_attach", "stopped"]  # a restore needs the guest stopped: refused anyway


def race(machine, operation, mode):
    """Move the machine to the other pool and run ``operation`` on it while the move holds it; returns (source,
    target, the operation's result, the move's result)."""
    source = next(pool for pool in machine if pool.domain(NAME) is not None)
    target = next(pool for pool in machine if pool is not source)
    assert source.domain(NAME).isActive()
    before = sorted(disk_paths(source.domain(NAME)))
    if operation == "restore":  # a backup to restore, where the machine is
        run_module("machine_backup", uri=source.uri, machine=NAME, name="b1", state="absent")
        taken = run_module("machine_backup", uri=source.uri, machine=NAME, name="b1")
        assert taken["changed"], taken
    mover = ModuleRun("machine_migrate", uri=source.uri, pools=fleet(machine), machine=NAME, target=target.name,
                      mode=mode, shutdown_timeout=1)
    try:
        def under_way():
            """the move under way: its hold and journal on the source (a cold move's guest stopped)"""
            held = any(".machine_migrate." in volume for volume in holds(source, NAME))
            return held and bool(journals(source, NAME)) and (mode == "live" or not source.domain(NAME).isActive())
        wait_for(under_way, timeout=300)
        os.killpg(mover.proc.pid, signal.SIGSTOP)
        try:
            assert mover.running()  # frozen mid-move
            module, args = OPERATIONS[operation]
            key = "machine" if module != "machine" else "name"
            result = run_module(module, uri=source.uri, **dict(args, **{key: NAME}))
        finally:
            os.killpg(mover.proc.pid, signal.SIGCONT)
        moved = mover.finish(timeout=600)
    finally:
        if mover.running():
            mover.kill()
    assert moved.get("changed") and not moved.get("failed"), moved
    assert [os.path.basename(path) for path in before] == \
        [os.path.basename(path) for path in sorted(disk_paths(target.domain(NAME)))]
    return source, target, result


def assert_refused_by_the_move(result):
    assert result.get("failed") and result.get("reason") == "Conflict", result
    assert "being moved" in result["msg"] and result.get("changed") is not True, result
    holder = result["holder"]
    assert holder["operation"] == "machine_migrate" and holder["controller"] == HOST, holder
    since = datetime.datetime.fromisoformat(holder["since"])
    assert abs((datetime.datetime.now(datetime.timezone.utc) - since).total_seconds()) < 900, holder


def assert_nothing_of(operation, pools, target):
    """libvirt shows nothing the refused ``operation`` would have made, and the machine whole, once, running."""
    dom = target.domain(NAME)
    assert whole_once(pools, NAME) is target and dom.isActive()
    assert dom.snapshotNum(0) == 0
    assert not any(EXTRA in (path or "") for path in disk_paths(dom))
    assert all(EXTRA not in listed(pool) for pool in pools)  # no volume made and left attached to nothing
    assert "ua-nic-eth9" not in nic_aliases(dom)
    assert all(holds(pool, NAME) == [] and journals(pool, NAME) == [] for pool in pools)
    assert homes(pools, NAME) == [target]


@pytest.mark.parametrize("operation", COLD)
def test_an_operation_during_a_cold_move_is_refused_and_lost_nowhere(machine, operation):
    _source, target, result = race(machine, operation, "cold")
    assert_refused_by_the_move(result)
    assert_nothing_of(operation, machine, target)


@pytest.mark.parametrize("operation", LIVE)
def test_an_operation_during_a_live_move_is_refused_and_lost_nowhere(machine, operation):
    _source, target, result = race(machine, operation, "live")
    assert_refused_by_the_move(result)
    assert_nothing_of(operation, machine, target)


def test_a_held_machine_is_waited_for_then_changed(machine, tmp_path, monkeypatch):
    """(Last in the file: the volume stays attached.) Another operation's hold (taken here, as a run on this controller would) makes volume_attach fail naming
    it after hold_timeout, with nothing attached; with room to wait, the attach shows it is waiting, is still
    waiting when the hold goes, and then attaches."""
    pool = next(pool for pool in machine if pool.domain(NAME) is not None)
    other = coordination.Coordination("machine_snapshot", 900)
    hold = other.machine(pool.conn, NAME, pool.uri).acquire()
    attach = {"uri": pool.uri, "machine": NAME, "volume": EXTRA, "size": "8Mi"}
    waiter = None
    try:
        refused = run_module("volume_attach", hold_timeout=2, **attach)
        assert refused.get("failed") and refused["reason"] == "Conflict", refused
        assert refused["holder"]["operation"] == "machine_snapshot" and refused["holder"]["controller"] == HOST
        assert "waited 2s" in refused["msg"], refused
        assert not any(EXTRA in (path or "") for path in disk_paths(pool.domain(NAME)))
        assert EXTRA not in listed(pool)
        progress = tmp_path / "progress.json"
        monkeypatch.setenv("MACHINERY_PROGRESS_FILE", str(progress))
        waiter = ModuleRun("volume_attach", hold_timeout=600, **attach)

        def waiting():
            """the attach saying it waits for the snapshot's hold"""
            return progress.exists() and "held by machine_snapshot" in json.loads(progress.read_text())["message"]
        wait_for(waiting)
        assert waiter.running() and not any(EXTRA in (path or "") for path in disk_paths(pool.domain(NAME)))
    finally:
        hold.release()
    attached = waiter.finish(timeout=600)
    assert attached.get("changed") and not attached.get("failed"), attached
    assert any(EXTRA in (path or "") for path in disk_paths(pool.domain(NAME)))
    assert holds(pool, NAME) == []  # (the idle guest lets no disk go live: the fixture's removal takes it)

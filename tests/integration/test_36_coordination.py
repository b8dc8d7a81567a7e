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
import time

import libvirt
import pytest

from conftest import ModuleRun, lab_pid, run_module
from test_13_migrate import MIB, fleet, homes, journals, listed, make, remove, upload
from test_24_races import holds, wait_for, whole_once

from ansible_collections.machinery.compute.plugins.module_utils.coordination import holds as coordination
from ansible_collections.machinery.compute.plugins.module_utils.coordination import keys
from ansible_collections.machinery.compute.plugins.module_utils.coordination import leases
from ansible_collections.machinery.compute.plugins.module_utils.core import convergence

NAME = "coord-1"
EXTRA = "coord-extra.qcow2"
HOST = keys.word(socket.gethostname())


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
    # a forced delete of the machine's data disk (the volume module names no machine), and the machine's whole task
    # on the pool it is leaving: each held for the machine, so refused naming the move
    "forced_delete": ("volume", {"name": "%s-data.qcow2" % NAME, "state": "absent", "force": True}),
    "machine_task": ("machine", {"machine_class": "small", "state": "running", "wait": "none",
                                 "cloud_init": {"user_data": "marker-%s" % NAME},
                                 "network_interfaces": [{"name": "eth0", "network": "machinery"}]}),
}
COLD = ["snapshot", "volume_attach", "nic_attach", "restore", "stopped", "forced_delete", "machine_task"]
LIVE = ["snapshot", "volume_attach", "nic_attach", "stopped"]  # a restore needs the guest stopped: refused anyway


def race(machine, operation, mode, image=None):
    """Move the machine to the other pool and run ``operation`` on it while the move holds it (``image``: the
    machine's, for its whole task); returns (source, target, the operation's result, the move's result)."""
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
            named = {} if module == "volume" else {"machine" if module != "machine" else "name": NAME}
            pictured = {"image": image} if operation == "machine_task" else {}
            result = run_module(module, uri=source.uri, **dict(args, **named, **pictured))
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
def test_an_operation_during_a_cold_move_is_refused_and_lost_nowhere(machine, image, operation):
    _source, target, result = race(machine, operation, "cold", image)
    assert_refused_by_the_move(result)
    assert_nothing_of(operation, machine, target)


@pytest.mark.parametrize("operation", LIVE)
def test_an_operation_during_a_live_move_is_refused_and_lost_nowhere(machine, operation):
    _source, target, result = race(machine, operation, "live")
    assert_refused_by_the_move(result)
    assert_nothing_of(operation, machine, target)


def lock_capacity(pool, name):
    """The size of the newest generation of the machine's hold (its holder grows it at each renewal of its
    lease), or None."""
    try:
        storage = pool.conn.storagePoolLookupByName("machinery-registry")
        generations = [keys.slot_generation(volume, keys.hold_volume(name)) for volume in storage.listVolumes()]
        newest = max([found for found in generations if found] or [0])
        return storage.storageVolLookupByName(keys.lock_slot(keys.hold_volume(name), newest)).info()[1] \
            if newest > 1 else None
    except libvirt.libvirtError:
        return None


def move_holding(machine, source, target, monkeypatch):
    """A cold move of the machine from ``source`` to ``target`` with a 2 s lease, once it holds the machine on the
    source (it holds it and reads both pools before any step): the run and its arguments."""
    monkeypatch.setenv(leases.LEASE_ENV, "2")
    args = dict(uri=source.uri, pools=fleet(machine), machine=NAME, target=target.name, mode="cold",
                shutdown_timeout=1)
    first = ModuleRun("machine_migrate", **args)
    try:
        def held():
            """the first move's hold on the source"""
            return any(".machine_migrate." in volume for volume in holds(source, NAME))
        wait_for(held, timeout=300)
    except BaseException:
        first.kill()
        raise
    return first, args


def test_a_move_that_outlasts_its_lease_keeps_it(machine, tmp_path, monkeypatch):
    """With the lease shortened to 2 s, a move renews it while it works: a second move started meanwhile waits
    (it says so) and never takes the hold over; the first move's hold is seen renewed over more than a lease.
    The machine gets 128 MiB of data to copy first (it keeps the volume from here on), and the target's libvirtd
    is stopped from the moment the move holds the machine until its hold was seen renewed three times: the move
    lasts past its lease however fast the machine copies (on an idle CI machine the copy took under 2 s)."""
    source = next(pool for pool in machine if pool.domain(NAME) is not None)
    target = next(pool for pool in machine if pool is not source)
    big = "%s-big.raw" % NAME
    attached = run_module("volume_attach", uri=source.uri, machine=NAME, volume=big, size="128Mi", format="raw")
    assert attached["changed"], attached
    upload(source, big, os.urandom(128 * MIB))
    first, args = move_holding(machine, source, target, monkeypatch)
    second = None
    try:
        progress = tmp_path / "move-progress.json"
        monkeypatch.setenv("MACHINERY_PROGRESS_FILE", str(progress))
        second = ModuleRun("machine_migrate", hold_timeout=600, **args)
        sizes = set()

        def watch():  # the hold's size, read all along: each renewal grows it by a block
            size = lock_capacity(source, NAME)
            if size is not None:
                sizes.add(size)
        stalled = lab_pid(target)
        os.kill(stalled, signal.SIGSTOP)
        try:
            deadline = time.monotonic() + 60
            while len(sizes) < 4 and first.running():
                assert time.monotonic() < deadline, "the hold was not renewed while the target stalled: %s" % sizes
                watch()
        finally:
            os.kill(stalled, signal.SIGCONT)
        assert first.running(), "the move ended while its target's libvirtd was stopped"
        while first.running():
            watch()
        moved = first.finish()
        assert moved.get("changed") and not moved.get("failed"), moved
        # the second one waited (the last it said names the move's hold on the source, or the claim of the
        # machine's name that the move holds on the target while it defines the machine there)
        assert progress.exists() and "waiting for machine %s, held by" % NAME in progress.read_text()
        after = second.finish()
        assert not after.get("failed") and after["changed"] is False, after  # found it moved, took nothing over
        assert len(sizes) >= 4, sizes  # renewed at least three times: every 2/3 s, so for more than one lease
        assert big in [os.path.basename(path) for path in disk_paths(target.domain(NAME))]
        assert whole_once(machine, NAME) is target and target.domain(NAME).isActive()
        assert all(holds(pool, NAME) == [] and journals(pool, NAME) == [] for pool in machine)
    finally:
        for run in (first, second):
            if run is not None and run.running():
                run.kill()


def test_a_holder_paused_past_its_lease_stops_before_its_next_step(machine, monkeypatch):
    """A move frozen (SIGSTOP) past its 2 s lease, once it holds the machine and before its first step, is taken
    over by a second move, which moves the machine; the first, let go again, never acts on its stale belief: it
    stops before its next step and says so (or, frozen before it read the pools, finds the machine moved), and
    undoes nothing: the machine is on the target once, whole, and no hold or journal is left."""
    source = next(pool for pool in machine if pool.domain(NAME) is not None)
    target = next(pool for pool in machine if pool is not source)
    first, args = move_holding(machine, source, target, monkeypatch)
    second = None
    try:
        os.killpg(first.proc.pid, signal.SIGSTOP)
        try:
            assert first.running()
            second = ModuleRun("machine_migrate", hold_timeout=600, **args)
            taken_over = second.finish()
            assert first.running()  # still frozen: the second one did not wait for it to end
        finally:
            os.killpg(first.proc.pid, signal.SIGCONT)
        stopped = first.finish()
    finally:
        for run in (first, second):
            if run is not None and run.running():
                run.kill()
    assert not taken_over.get("failed") and taken_over["changed"], taken_over
    # the first run, let go, either stops at its next step saying its lease was taken over, or (frozen before it
    # had read where the machine is) reads it afresh on the target and reports nothing to do: never a change
    lost = bool(stopped.get("failed")) and stopped.get("reason") == "Conflict" and \
        "paused for longer than its lease" in stopped.get("msg", "")
    found_moved = not stopped.get("failed") and stopped.get("changed") is False and \
        (stopped.get("machine") or {}).get("pool") == target.name
    assert lost or found_moved, stopped
    assert whole_once(machine, NAME) is target and target.domain(NAME).isActive()
    assert all(holds(pool, NAME) == [] and journals(pool, NAME) == [] for pool in machine)


def set_members(pools, name):
    from conftest import labelled_domains
    return sorted(dom.name() for _pool, dom, _record in labelled_domains(pools, "machinery.compute/machine-set",
                                                                         name))


def holders_of_set(pools, name):
    """The pids named by the holder markers of set ``name``'s hold, on each pool (None: that pool has no hold)."""
    prefix = "hold-set.%s.holder." % name
    found = []
    for pool in pools:
        volumes = listed(pool, "machinery-registry")
        markers = [keys.marker_fields(volume, prefix)[1] for volume in volumes if volume.startswith(prefix)]
        found.append(sorted(markers) if "hold-set.%s.lock" % name in volumes else None)
    return found


def set_args(pools, name, image):
    """A set of ``name`` on every pool, its members of class small with no NIC, not waited for."""
    return dict(pools=fleet(pools), name=name, selector={"match_labels": {"app": name}},
                template={"machine_class": "small", "image": image, "labels": {"app": name},
                          "network_interfaces": []}, wait="none", shutdown_timeout=1)


def set_run_stopped_holding(monkeypatch, name, replicas, args):
    """A machine_set run of ``replicas`` that stopped itself (SIGSTOP) once it held the set
    (convergence.STOP_HOLDING_ENV): returned once it has stopped."""
    monkeypatch.setenv(convergence.STOP_HOLDING_ENV, "machine set %s" % name)
    run = ModuleRun("machine_set", replicas=replicas, **args)
    monkeypatch.delenv(convergence.STOP_HOLDING_ENV)
    _pid, status = os.waitpid(run.proc.pid, os.WUNTRACED)  # returns once it stopped itself (or ended)
    assert os.WIFSTOPPED(status), ("the run ended without stopping where it holds the set", run.finish())
    return run


def end_runs(runs):
    """Continue and kill whichever of ``runs`` (None: not started) still runs: what a failed test left."""
    for run in runs:
        if run is not None and run.running():
            os.killpg(run.proc.pid, signal.SIGCONT)
            run.kill()


def test_two_runs_of_one_set_take_turns(registered, image, tmp_path, monkeypatch):
    """Two machine_set runs of one set at once (3 and 5 replicas). The first stops itself once it holds the set
    (convergence.STOP_HOLDING_ENV), so the overlap is certain however loaded the machine is; the second, started
    then, must say it waits for the set's hold while the first is stopped holding it. Let go, the first makes 3
    members; the second plans from them (2 more), both succeed and the set never has more than 5 members. Were
    sets not serialized, the second would not wait, or would plan 5 members from none."""
    pools, name = registered, "coord-set"
    args = set_args(pools, name, image)
    # the first run stays stopped while the second starts: a lease far longer than that, so no waiter takes over
    monkeypatch.setenv(leases.LEASE_ENV, "900")
    first = second = None
    try:
        first = set_run_stopped_holding(monkeypatch, name, 3, args)
        try:
            mine = [str(first.proc.pid)]
            assert holders_of_set(pools, name) == [mine] * len(pools)  # its hold, on every pool, and no other
            progress = tmp_path / "set-progress.json"
            monkeypatch.setenv("MACHINERY_PROGRESS_FILE", str(progress))
            second = ModuleRun("machine_set", replicas=5, **args)
            monkeypatch.delenv("MACHINERY_PROGRESS_FILE")

            def waiting():
                """the second run saying it waits for the first's hold on the set"""
                said = progress.exists() and "waiting for machine set %s, held by machine_set" % name in \
                    progress.read_text()
                assert said or second.running(), ("the second run ended without waiting", second.finish())
                return said
            wait_for(waiting, timeout=300)
            assert first.running() and second.running()  # overlapped: the second waits while the first holds
            # still the first's hold on every pool (the waiter's marker comes and goes as it tries), nothing made
            assert all(mine[0] in (pids or []) for pids in holders_of_set(pools, name)), holders_of_set(pools, name)
            assert set_members(pools, name) == []
        finally:
            os.killpg(first.proc.pid, signal.SIGCONT)
        peak = 0
        while first.running() or second.running():  # the count of members, read from libvirt all along
            peak = max(peak, len(set_members(pools, name)))
        one, two = first.finish(), second.finish()
        assert not one.get("failed") and not two.get("failed"), (one, two)
        assert one["changed"] and len(one["planned_members"]) == 3, one
        assert len(set_members(pools, name)) == two["replicas"] == 5, (one, two)
        assert peak <= 5 and len(two["planned_members"]) == 2, (peak, two)  # planned from the first's members
        assert holders_of_set(pools, name) == [None] * len(pools)
    finally:
        end_runs([first, second])
        run_module("machine_set", pools=fleet(pools), name=name, state="absent", shutdown_timeout=1)


def test_a_set_run_paused_past_its_lease_changes_no_member_after_it_resumes(registered, image, monkeypatch):
    """Run A of a set (replicas 1) stops itself once it holds the set, its lease at 4 s. Run B (replicas 3),
    started then, waits for A's hold, takes it over once A's lease passed unrenewed (A is frozen), and makes three
    members. A, let go, finds three members and plans to delete two: fenced before its first member action (and by
    the writer before any write), it fails with Conflict and deletes nothing. libvirt shows B's three members.
    Before the fence, a resumed A deleted both of B's extra members (the one-writer issue)."""
    pools, name = registered, "fenced-set"
    args = set_args(pools, name, image)
    monkeypatch.setenv(leases.LEASE_ENV, "4")
    first = second = None
    try:
        first = set_run_stopped_holding(monkeypatch, name, 1, args)
        second = ModuleRun("machine_set", replicas=3, hold_timeout=300, **args)
        two = second.finish(timeout=600)
        assert not two.get("failed") and two["changed"], two
        assert first.running()  # frozen all along while the second took the set over: the runs overlapped
        members = sorted(set_members(pools, name))
        assert len(members) == 3, members
        os.killpg(first.proc.pid, signal.SIGCONT)
        one = first.finish(timeout=300)
    finally:
        end_runs([first, second])
    try:
        assert one.get("failed") and one.get("reason") == "Conflict", one
        assert "paused for longer than its lease" in one["msg"], one["msg"]
        assert sorted(set_members(pools, name)) == members  # the resumed run deleted none of them
        assert holders_of_set(pools, name) == [None] * len(pools)
    finally:
        run_module("machine_set", pools=fleet(pools), name=name, state="absent", shutdown_timeout=1)


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

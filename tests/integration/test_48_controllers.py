"""Two controllers whose hostnames and clocks differ, and operations started at known points of a cold move
(issue #38). Every outcome is read back from libvirt and the pools' registries.

A second controller is a module run in a UTS namespace of its own with another hostname (so its holder markers
name another controller, whose processes this one cannot check) and, through libfaketime, a wall clock five
minutes off. What libfaketime 0.9.10 (Debian 12) does to a Python 3.11 run, as ``test_the_controllers_clocks``
checks: CLOCK_REALTIME is shifted by the offset; CLOCK_MONOTONIC (and _RAW, BOOTTIME) is faked too, as a value
near the faked wall time, advancing at the real rate, and ``time.sleep`` waits as long as it should. Timed waits
on a semaphore (``threading.Event.wait(timeout)``, ``Lock.acquire(timeout=)``: glibc's sem_clockwait) are not
translated and only end when woken; the lease renewer waits in short sleeps for this reason (leases.Renewer), so a
skewed run renews its holds like any other. FAKETIME_DONT_FAKE_MONOTONIC=1 is no way out: ``time.sleep`` then
fails with EINVAL.

The move is frozen where the test asks (convergence.STOP_BEFORE_STEP_ENV: before the first step of a kind), so
each race starts at a point libvirt shows, never at a time offset."""

import datetime
import glob
import json
import os
import signal
import socket
import subprocess
import sys
import time

import libvirt
import pytest

from conftest import ModuleRun, register, run_module
from test_13_migrate import fleet, homes, journals, listed, make, owned_volumes, remove
from test_24_races import holds, whole_once
from test_36_coordination import disk_paths, nic_aliases

from ansible_collections.machinery.compute.plugins.module_utils.coordination import holds as coordination
from ansible_collections.machinery.compute.plugins.module_utils.core import convergence
from ansible_collections.machinery.compute.plugins.module_utils.coordination import keys
from ansible_collections.machinery.compute.plugins.module_utils.coordination import leases
from ansible_collections.machinery.compute.plugins.module_utils.pools import capacity

NAME = "ctl-1"
DATA = "%s-data.qcow2" % NAME  # made by test_13_migrate.make, attached with volume_attach
NIC = "eth5"  # attached with nic_attach by the fixture
SKEW = 300
FAKETIME = "/usr/$LIB/faketime/libfaketime.so.1"  # $LIB: the dynamic linker's token, as faketime(1) sets it
HOST = keys.word(socket.gethostname())


@pytest.fixture(name="image", scope="module")
def idle_guest_image(idle_image):
    """Nothing here looks inside the guest: the idle image, at no CPU cost."""
    return idle_image


def clear_holds(pools):
    """Delete what a failed test may have left of the machine's holds (a killed controller's lease)."""
    for pool in pools:
        storage = pool.conn.storagePoolLookupByName("machinery-registry")
        for volume in holds(pool, NAME):
            storage.storageVolLookupByName(volume).delete(0)


@pytest.fixture(name="machine", scope="module")
def one_stopped_machine(registered, image):
    """One stopped machine with a data volume and a NIC attached after its creation, on the first of two pools;
    the moves take it from one to the other."""
    pools = registered[:2]
    make(pools[0], image, NAME, state="present", data="8Mi")
    attached = run_module("nic_attach", uri=pools[0].uri, machine=NAME, name=NIC, network="machinery")
    assert attached["changed"], attached
    yield pools
    clear_holds(pools)
    for pool in homes(pools, NAME):
        run_module("machine_backup", uri=pool.uri, machine=NAME, name="b-race", state="absent")
    remove(pools, NAME)


def home(machine):
    return next(pool for pool in machine if pool.domain(NAME) is not None)


# --- two controllers -------------------------------------------------------------------------------------------

def controller(hostname, offset=None):
    """The command line a run on another controller starts with: a UTS namespace of its own named ``hostname``,
    and its wall clock ``offset`` seconds off. Each part execs the next, so the run keeps the pid it started as."""
    command = ["unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"', hostname]
    if offset is not None:
        command += ["env", "LD_PRELOAD=%s" % FAKETIME, "FAKETIME=%+ds" % offset]
    return command


CLOCKS = """
import json, socket, time
wall, steady = time.time(), time.monotonic()
time.sleep(0.5)
print(json.dumps({"host": socket.gethostname(), "wall": wall, "slept_wall": time.time() - wall,
                  "slept_steady": time.monotonic() - steady}))
"""


@pytest.mark.parametrize("offset", [SKEW, -SKEW])
def test_the_controllers_clocks(offset):
    """Controller B as the tests below start it: hostname ctl-b, its wall clock ``offset`` seconds off, its
    monotonic clock and its sleeps running at the real rate."""
    assert glob.glob("/usr/lib/*/faketime/libfaketime.so.1"), "libfaketime is missing: make deps installs faketime"
    before = time.time()
    proc = subprocess.run(controller("ctl-b", offset) + [sys.executable, "-c", CLOCKS], capture_output=True,
                          text=True, timeout=60, check=False)
    after = time.time()
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout)
    assert seen["host"] == "ctl-b" and socket.gethostname() != "ctl-b"
    assert before + offset - 1 < seen["wall"] < after + offset + 1, (before, seen, after)
    assert 0.45 < seen["slept_steady"] < 3 and 0.45 < seen["slept_wall"] < 3, seen


def only_marker(pool):
    """The one holder marker of the machine's hold, and who it names."""
    markers = [volume for volume in holds(pool, NAME) if ".holder." in volume]
    assert len(markers) == 1 and keys.hold_volume(NAME) in holds(pool, NAME), holds(pool, NAME)
    return markers[0], coordination.holder(markers[0], keys.hold_prefix(NAME))


def registry_volume(pool, name):
    try:
        return pool.conn.storagePoolLookupByName("machinery-registry").storageVolLookupByName(name)
    except libvirt.libvirtError:
        return None


def lock_mtime(pool):
    """The modification time of the newest generation of the machine's hold (the one its holder renews)."""
    from lxml import etree
    newest = max(keys.slot_generation(volume, keys.hold_volume(NAME)) or 0 for volume in holds(pool, NAME))
    return float(etree.fromstring(registry_volume(pool, keys.lock_slot(keys.hold_volume(NAME), newest)).XMLDesc(0))
                 .findtext("target/timestamps/mtime"))


def stopped_holding(monkeypatch, resource, module_name, launcher, **args):
    """A run of ``module_name`` that stops itself (SIGSTOP) once it holds what ``resource`` (its describe())
    needs, before it observes again (convergence.STOP_HOLDING_ENV); returned once it has stopped."""
    monkeypatch.setenv(convergence.STOP_HOLDING_ENV, resource)
    run = ModuleRun(module_name, launcher=launcher, **args)
    monkeypatch.delenv(convergence.STOP_HOLDING_ENV)
    _pid, status = os.waitpid(run.proc.pid, os.WUNTRACED)
    assert os.WIFSTOPPED(status), ("the run ended without stopping where it holds the machine", run.finish())
    return run


def until(what, timeout):
    """Poll every 20 ms until ``what()`` holds (a libvirt lookup or a file read: not in a tight loop, which
    would load the pools the runs under test use); the test fails when it never does."""
    deadline = time.monotonic() + timeout
    while not what():
        assert time.monotonic() < deadline, "never saw %s" % what.__doc__
        time.sleep(0.02)


def progress_of(path):
    return json.loads(path.read_text())["message"] if path.exists() else ""


def test_a_controller_whose_clock_is_ahead_waits_for_a_live_holder(machine, tmp_path, monkeypatch):
    """Controller A (ctl-a) holds the machine for a volume attach and is frozen there, for less than its lease.
    Controller B (ctl-b), its clock 5 minutes ahead, finds A's lock 5 minutes old by its own clock, far past the
    lease: it does not break it. With a short hold_timeout it fails naming A (controller, operation, since); with
    a long one it waits, saying so. A, let go, attaches; B then attaches its NIC: libvirt shows both."""
    pool = home(machine)
    volume = "%s-ctla.qcow2" % NAME
    monkeypatch.setenv(leases.LEASE_ENV, "60")
    args = dict(uri=pool.uri, machine=NAME)
    first = stopped_holding(monkeypatch, "volumes of machine %s" % NAME, "volume_attach", controller("ctl-a"),
                            volume=volume, size="8Mi", **args)
    second = None
    try:
        try:
            marker, found = only_marker(pool)
            assert found["controller"] == "ctl-a" and found["operation"] == "volume_attach", found
            assert found["pid"] == first.proc.pid, found
            since = found["since"]
            assert abs((datetime.datetime.now(datetime.timezone.utc) -
                        datetime.datetime.fromisoformat(since)).total_seconds()) < 120, since
            # what B's clock makes of the lock's file time: older than the lease, were age what a waiter judged
            assert time.time() + SKEW - lock_mtime(pool) > SKEW - 30 > 60
            nic = dict(name="eth6", network="machinery", **args)
            refused = ModuleRun("nic_attach", launcher=controller("ctl-b", SKEW), hold_timeout=3, **nic).finish()
            assert refused.get("failed") and refused.get("reason") == "Conflict", refused
            assert refused["holder"] == {"controller": "ctl-a", "operation": "volume_attach", "since": since}
            assert "waited 3s" in refused["msg"] and "volume_attach on ctl-a" in refused["msg"], refused
            assert only_marker(pool)[0] == marker  # A's lease, not broken
            progress = tmp_path / "progress.json"
            monkeypatch.setenv("MACHINERY_PROGRESS_FILE", str(progress))
            second = ModuleRun("nic_attach", launcher=controller("ctl-b", SKEW), hold_timeout=600, **nic)
            monkeypatch.delenv("MACHINERY_PROGRESS_FILE")
            said = "waiting for machine %s, held by volume_attach on ctl-a (pid %d) since %s" % (
                NAME, first.proc.pid, since)

            def waiting():
                """B saying it waits for A's hold"""
                ended = "B ended without waiting"
                assert said in progress_of(progress) or second.running(), (ended, second.finish())
                return said in progress_of(progress)
            until(waiting, timeout=120)
            assert first.running() and second.running()  # overlapped: B waits while A holds, frozen
            assert [volume for volume in holds(pool, NAME) if ".holder." in volume] == [marker]  # B left nothing
            dom = pool.domain(NAME)
            assert volume not in map(os.path.basename, filter(None, disk_paths(dom)))
            assert "ua-nic-eth6" not in nic_aliases(dom)
        finally:
            os.killpg(first.proc.pid, signal.SIGCONT)
        attached = first.finish(timeout=300)
        nic_added = second.finish(timeout=300)
    finally:
        for run in (first, second):
            if run is not None and run.running():
                run.kill()
    assert attached.get("changed") and not attached.get("failed"), attached
    assert nic_added.get("changed") and not nic_added.get("failed"), nic_added
    dom = pool.domain(NAME)
    assert volume in map(os.path.basename, filter(None, disk_paths(dom)))
    assert "ua-nic-eth6" in nic_aliases(dom)
    assert holds(pool, NAME) == []


LEASE = 8  # seconds: the lease a dead holder's waiter sits out


def test_a_controller_whose_clock_is_behind_takes_a_dead_holders_lease_over_after_one_lease(
        machine, tmp_path, monkeypatch):
    """Controller A (ctl-a) is killed (SIGKILL) while it holds the machine for a NIC attach, before it acted.
    Controller B (ctl-b), its clock 5 minutes behind, cannot tell whether A's process lives (another controller)
    and finds A's lock's file time in its future: it waits, naming A, and takes the lease over once it has seen
    it unrenewed for one lease by its own monotonic clock (not at once, not never); its attach is made, A's is
    not, and no hold is left."""
    pool = home(machine)
    volume = "%s-ctlb.qcow2" % NAME
    monkeypatch.setenv(leases.LEASE_ENV, str(LEASE))
    args = dict(uri=pool.uri, machine=NAME)
    first = stopped_holding(monkeypatch, "network_interfaces of machine %s" % NAME, "nic_attach",
                            controller("ctl-a"), name="eth7", network="machinery", **args)
    second = None
    try:
        marker, found = only_marker(pool)
        assert found["controller"] == "ctl-a" and found["operation"] == "nic_attach", found
        assert first.kill()  # died of SIGKILL while holding the machine
        assert only_marker(pool)[0] == marker
        progress = tmp_path / "progress.json"
        monkeypatch.setenv("MACHINERY_PROGRESS_FILE", str(progress))
        second = ModuleRun("volume_attach", launcher=controller("ctl-b", -SKEW), hold_timeout=600,
                           volume=volume, size="8Mi", **args)
        monkeypatch.delenv("MACHINERY_PROGRESS_FILE")
        said = "held by nic_attach on ctl-a (pid %d) since %s" % (found["pid"], found["since"])

        def waiting():
            """B saying it waits for A's hold"""
            assert said in progress_of(progress) or second.running(), ("B ended without waiting", second.finish())
            return said in progress_of(progress)
        until(waiting, timeout=120)
        seen = time.monotonic()
        assert second.running() and registry_volume(pool, marker) is not None  # B waits while A's lease is there

        def broken():
            """A's marker gone: B took the lease over"""
            return registry_volume(pool, marker) is None
        until(broken, timeout=LEASE + 120)
        taken = time.monotonic() - seen
        attached = second.finish(timeout=300)
    finally:
        for run in (first, second):
            if run is not None and run.running():
                run.kill()
    assert LEASE - 1 < taken < LEASE + 10, taken
    assert attached.get("changed") and not attached.get("failed"), attached
    dom = pool.domain(NAME)
    assert volume in map(os.path.basename, filter(None, disk_paths(dom)))
    assert "ua-nic-eth7" not in nic_aliases(dom)
    assert holds(pool, NAME) == []


# --- operations during a cold move, at known points ------------------------------------------------------------

# the point each move is frozen at: before the first step of that kind (fleets/move_plan.move_steps)
PHASES = ["copy_volume", "define", "delete_volume", "undefine", "clear_journal"]
# each operation started while the move is frozen: its module and arguments (uri and machine added); the resize
# gives the whole spec, as a play does, so on a pool without the machine it would create it
OPERATIONS = {
    "volume_detach": ("volume_attach", {"volume": DATA, "state": "detached"}),
    "nic_detach": ("nic_attach", {"name": NIC, "state": "detached"}),
    "snapshot_revert": ("machine_snapshot", {"name": "s-race", "state": "reverted"}),
    "backup": ("machine_backup", {"name": "b-race"}),
    # the machine's data disk deleted by force (the volume module names no machine: the disk's machine is held)
    "forced_delete": ("volume", {"name": DATA, "state": "absent", "force": True}),
    "resize": ("machine", {"cpu": 2, "memory": "128Mi", "state": "present",
                           "network_interfaces": [{"name": "eth0", "network": "machinery"}]}),
}


def where_the_move_is(source, target):
    """What libvirt shows of a frozen move: its journal, and where the machine's domain and disks are."""
    return {"journal": bool(journals(source, NAME)),
            "source": (source.domain(NAME) is not None, bool(owned_volumes(source, NAME))),
            "target": (target.domain(NAME) is not None, bool(owned_volumes(target, NAME)))}


# (domain, disks) on each side of a move frozen before the first step of each kind
PLACES = {
    "copy_volume": {"journal": True, "source": (True, True), "target": (False, False)},
    "define": {"journal": True, "source": (True, True), "target": (False, True)},
    "delete_volume": {"journal": True, "source": (True, True), "target": (True, True)},
    "undefine": {"journal": True, "source": (True, False), "target": (True, True)},
    "clear_journal": {"journal": True, "source": (False, False), "target": (True, True)},
}


def machine_state(pool):
    """What the refused operations would have changed, as libvirt shows it on ``pool``."""
    dom = pool.domain(NAME)
    from lxml import etree
    tree = etree.fromstring(dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE))
    return {"disks": sorted(os.path.basename(path) for path in disk_paths(dom) if path),
            "nics": sorted(nic_aliases(dom)), "snapshots": dom.snapshotNum(0), "cpu": int(tree.findtext("vcpu")),
            "backups": sorted(volume for volume in listed(pool) if ".backup." in volume)}


@pytest.mark.parametrize("phase", PHASES)
def test_operations_during_a_cold_move_frozen_at_a_step(machine, image, phase, monkeypatch):
    """A cold move frozen before its first ``phase`` step; while it is frozen, each operation is started on the
    pool the machine is moved from. None may report a change that the move then loses: each is refused with a
    Conflict naming the move, even once the source has no machine left (the resize, given the whole spec, would
    create it there again), but for the revert while the machine is on the source: a machine with snapshots is
    not moved, so there is none to revert to. Afterwards the machine is whole on the target, exactly as before
    the move, and nothing the operations would have made exists on either pool."""
    source = home(machine)
    target = next(pool for pool in machine if pool is not source)
    before = machine_state(source)
    monkeypatch.setenv(convergence.STOP_BEFORE_STEP_ENV, phase)
    mover = ModuleRun("machine_migrate", uri=source.uri, pools=fleet(machine), machine=NAME, target=target.name,
                      mode="cold", shutdown_timeout=1)
    monkeypatch.delenv(convergence.STOP_BEFORE_STEP_ENV)
    runs, results = {}, {}
    try:
        try:
            _pid, status = os.waitpid(mover.proc.pid, os.WUNTRACED)
            assert os.WIFSTOPPED(status), ("the move ended without stopping before %s" % phase, mover.finish())
            assert where_the_move_is(source, target) == PLACES[phase]
            for operation, (module_name, args) in OPERATIONS.items():
                named = {"name": NAME, "image": image} if module_name == "machine" else \
                    {} if module_name == "volume" else {"machine": NAME}
                # a run that waited for the frozen move instead of refusing would fail after 30 s, not hang
                runs[operation] = ModuleRun(module_name, uri=source.uri, hold_timeout=30, **dict(args, **named))
            for operation, run in runs.items():
                results[operation] = run.finish(timeout=300)
            assert mover.running()  # still frozen: every operation ran while the move held the machine
        finally:
            os.killpg(mover.proc.pid, signal.SIGCONT)
        moved = mover.finish(timeout=300)
    finally:
        for run in [mover] + list(runs.values()):
            if run.running():
                run.kill()
    assert moved.get("changed") and not moved.get("failed"), moved
    outcomes = {operation: outcome(result) for operation, result in results.items()}
    assert outcomes == EXPECTED[phase], results
    for result in results.values():
        assert result.get("changed") is not True, result
    assert whole_once(machine, NAME) is target and not target.domain(NAME).isActive()
    assert machine_state(target) == dict(before, backups=[])
    assert all(".backup." not in volume for pool in machine for volume in listed(pool))
    # no hold, move journal, create journal or backup list of the machine is left in either registry
    assert [volume for pool in machine for volume in listed(pool, "machinery-registry") if NAME in volume] == []


MOVED = "refused: being moved by machine_migrate on %s" % HOST


def outcome(result):
    """A run's result in short: refused naming the move, or failed (reason, field), or what it did."""
    holder = result.get("holder") or {}
    if result.get("failed") and "being moved" in result.get("msg", ""):
        return "refused: being moved by %s on %s" % (holder.get("operation"), holder.get("controller"))
    if result.get("failed"):
        return "failed: %s (%s)" % (result.get("reason"), result.get("field"))
    return "changed" if result.get("changed") else "unchanged"


# what each operation must answer, by the point the move is frozen at: refused naming the move, but for the revert
# while the machine is still on the source (a machine with snapshots is never moved, so it has none to go back to)
REVERT_REFUSED = "failed: NotFound (name)"
EXPECTED = {
    "copy_volume": dict(dict.fromkeys(OPERATIONS, MOVED), snapshot_revert=REVERT_REFUSED),
    "define": dict(dict.fromkeys(OPERATIONS, MOVED), snapshot_revert=REVERT_REFUSED),
    "delete_volume": dict(dict.fromkeys(OPERATIONS, MOVED), snapshot_revert=REVERT_REFUSED),
    # the source's disks are deleted already: a forced delete of one there finds nothing to delete
    "undefine": dict(dict.fromkeys(OPERATIONS, MOVED), snapshot_revert=REVERT_REFUSED, forced_delete="unchanged"),
    # no machine on the source any more, and the move's hold still there: the move named all the same
    "clear_journal": dict(dict.fromkeys(OPERATIONS, MOVED), forced_delete="unchanged"),
}


# --- the last room of a pool ------------------------------------------------------------------------------------

def test_two_attaches_wanting_the_last_room_take_it_in_turns(registered, image, monkeypatch):
    """Room under the lock: two volume_attach runs on two machines of one pool, each adding a 64Mi disk where the
    storage has 96Mi left. Each stops itself once it holds its machine (convergence.STOP_HOLDING_ENV), after its
    plan's room check passed: both are stopped at once, so they overlap whatever the load. Let go, they count
    and make their disks under the pool's admission lock one after the other: one attaches, the other is refused
    naming ``size``, and libvirt holds one new volume. Were the room checked outside the lock, both would attach."""
    pool, names = registered[2], ["room-1", "room-2"]
    runs = []
    try:
        for name in names:
            run_module("machine", uri=pool.uri, name=name, state="absent", shutdown_timeout=1)
            made = run_module("machine", uri=pool.uri, name=name, machine_class="small", image=image,
                              state="present", network_interfaces=[])
            assert made["changed"], made
        used = capacity.disks_allocated(capacity.machine_sizes(pool.conn))
        total = capacity.storage_of(pool.conn)["capacity"]
        register(pool, reserved={"storage": "%dKi" % ((total - used) // 1024 - 96 * 1024)})
        for name in names:
            runs.append(stopped_holding(monkeypatch, "volumes of machine %s" % name, "volume_attach", (),
                                        uri=pool.uri, machine=name, volume="%s-extra.qcow2" % name, size="64Mi",
                                        ephemeral=True))
        assert all(run.running() for run in runs)  # both hold their machine, both planned: they overlap
        for run in runs:
            os.killpg(run.proc.pid, signal.SIGCONT)
        results = [run.finish() for run in runs]
        attached = [result for result in results if not result.get("failed")]
        refused = [result for result in results if result.get("failed")]
        assert len(attached) == 1 and len(refused) == 1, results
        assert refused[0]["field"] == "size" and "does not fit in the storage" in refused[0]["msg"], refused[0]
        made = [name for name in names if "%s-extra.qcow2" % name in pool.volumes()]
        assert len(made) == 1, pool.volumes()
    finally:
        for run in runs:
            if run.running():
                os.killpg(run.proc.pid, signal.SIGCONT)
                run.finish()
        register(pool, reserved={"storage": "0"})
        for name in names:
            run_module("machine", uri=pool.uri, name=name, state="absent", shutdown_timeout=1)

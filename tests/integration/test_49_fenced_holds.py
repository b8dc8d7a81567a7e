"""Holds fenced by the store (the one-writer issue): several waiters behind a holder killed on another
controller, and runs in another PID namespace of this host. Every outcome is read back from libvirt and the
pool's registry.

The holder is frozen where it holds the machine (convergence.STOP_HOLDING_ENV) and killed there, so each race
starts at a point the registry shows; another controller is a run in a UTS namespace of its own, its clock five
minutes ahead (test_48_controllers.controller)."""

import os
import signal
import time

import pytest

from conftest import ModuleRun, run_module
from test_13_migrate import homes, make, remove
from test_24_races import holds
from test_36_coordination import disk_paths, end_runs
from test_48_controllers import SKEW, controller, progress_of, stopped_holding, until

from ansible_collections.machinery.compute.plugins.module_utils.coordination import holds as coordination
from ansible_collections.machinery.compute.plugins.module_utils.coordination import keys
from ansible_collections.machinery.compute.plugins.module_utils.coordination import leases
from ansible_collections.machinery.compute.plugins.module_utils.coordination import locks
from ansible_collections.machinery.compute.plugins.module_utils.coordination import writer
from ansible_collections.machinery.compute.plugins.module_utils.core import convergence

NAME = "fence-1"
# seconds: a run on ctl-b does not renew its lease (libfaketime, test_48), so its attach must end within one
LEASE = 15


@pytest.fixture(name="image", scope="module")
def idle_guest_image(idle_image):
    """Nothing here looks inside the guest: the idle image, at no CPU cost."""
    return idle_image


@pytest.fixture(name="pool", scope="module")
def one_stopped_machine(registered, image):
    pools = registered[:1]
    make(pools[0], image, NAME, state="present")
    yield pools[0]
    storage = pools[0].conn.storagePoolLookupByName("machinery-registry")
    for volume in holds(pools[0], NAME):
        storage.storageVolLookupByName(volume).delete(0)
    for found in homes(pools, NAME):
        assert found is pools[0]
    remove(pools, NAME)


def only_marker(pool):
    """The one holder marker of the machine's hold, and who it names."""
    markers = [volume for volume in holds(pool, NAME) if ".holder." in volume]
    assert len(markers) == 1 and keys.hold_volume(NAME) in holds(pool, NAME), holds(pool, NAME)
    return markers[0], coordination.holder(markers[0], keys.hold_prefix(NAME))


def holder_killed_on_ctl_c(pool, monkeypatch, volume):
    """An attach of ``volume`` on controller ctl-c, killed (SIGKILL) while it holds the machine, the lease at
    LEASE: its holder marker and who that names."""
    monkeypatch.setenv(leases.LEASE_ENV, str(LEASE))
    holder = stopped_holding(monkeypatch, "volumes of machine %s" % NAME, "volume_attach", controller("ctl-c"),
                             uri=pool.uri, machine=NAME, volume=volume, size="8Mi")
    try:
        marker, found = only_marker(pool)
        assert found["controller"] == "ctl-c" and found["operation"] == "volume_attach", found
    finally:
        assert holder.kill()  # SIGKILL while it holds the machine
    return marker, found


def attached_volumes(pool):
    return set(map(os.path.basename, filter(None, disk_paths(pool.domain(NAME)))))


def detach_all(pool, volumes):
    """Detach and delete what a test attached, so the next starts from the machine alone."""
    for volume in volumes:
        done = run_module("volume_attach", uri=pool.uri, machine=NAME, volume=volume, state="detached")
        assert not done.get("failed"), done
        done = run_module("volume", uri=pool.uri, name=volume, state="absent")
        assert not done.get("failed"), done


@pytest.mark.parametrize("waiters", [1, 2, 4, 6])
def test_waiters_behind_a_holder_killed_on_another_controller_all_get_the_machine(pool, waiters, tmp_path,
                                                                                  monkeypatch):
    """A volume attach on controller ctl-c is killed while it holds the machine. ``waiters`` attaches of other
    volumes start at once, half on this controller and half on ctl-b (its clock five minutes ahead), each with
    hold_timeout 120. Each names ctl-c's attach while it waits; the first takes the machine over within two
    leases of the kill (the holder never renewed after it took the hold); all of them attach, and the killed
    run's volume is not there."""
    killed_volume = "%s-killed.qcow2" % NAME
    marker, found = holder_killed_on_ctl_c(pool, monkeypatch, killed_volume)
    killed_at = time.monotonic()
    runs = []
    try:
        for index in range(waiters):
            progress = tmp_path / ("progress-%d.json" % index)
            monkeypatch.setenv("MACHINERY_PROGRESS_FILE", str(progress))
            launcher = controller("ctl-b", SKEW) if index % 2 else ()
            runs.append((ModuleRun("volume_attach", launcher=launcher, hold_timeout=120, uri=pool.uri, machine=NAME,
                                   volume="%s-w%d.qcow2" % (NAME, index), size="8Mi"), progress))
        monkeypatch.delenv("MACHINERY_PROGRESS_FILE")
        said = "held by volume_attach on ctl-c (pid %d)" % found["pid"]

        def all_waiting():
            """every waiter naming the killed run as the holder"""
            return all(said in progress_of(progress) for _run, progress in runs)
        until(all_waiting, timeout=LEASE)
        assert marker in holds(pool, NAME) and all(run.running() for run, _progress in runs)  # they overlapped

        def taken_over():
            """a waiter holding the machine in place of the killed run"""
            return marker not in holds(pool, NAME)
        until(taken_over, timeout=3 * LEASE)
        assert time.monotonic() - killed_at <= 2 * LEASE
        results = [run.finish(timeout=300) for run, _progress in runs]
    finally:
        for run, _progress in runs:
            if run.running():
                run.kill()
    failed = [(index, "ctl-b" if index % 2 else "here", result) for index, result in enumerate(results)
              if result.get("failed") or not result.get("changed")]
    assert failed == []
    made = {"%s-w%d.qcow2" % (NAME, index) for index in range(waiters)}
    assert made <= attached_volumes(pool) and killed_volume not in attached_volumes(pool)
    assert holds(pool, NAME) == []
    detach_all(pool, sorted(made))


def test_a_run_in_another_pid_namespace_waits_for_a_live_holder(pool, monkeypatch):
    """A run of this host in a PID namespace of its own (an execution-environment container beside another) cannot
    see the holder's pid. It must not take a live holder for a dead one: with a short hold_timeout it fails
    naming the holder and leaves its hold alone; let go, the holder attaches, and the other run then does."""
    monkeypatch.setenv(leases.LEASE_ENV, "60")
    volume = "%s-ns.qcow2" % NAME
    first = stopped_holding(monkeypatch, "volumes of machine %s" % NAME, "volume_attach", (),
                            uri=pool.uri, machine=NAME, volume=volume, size="8Mi")
    other_ns = ["unshare", "--pid", "--fork", "--mount-proc"]
    try:
        marker, found = only_marker(pool)
        assert found["pid"] == first.proc.pid
        refused = ModuleRun("volume_attach", launcher=other_ns, hold_timeout=3, uri=pool.uri, machine=NAME,
                            volume="%s-ns2.qcow2" % NAME, size="8Mi").finish(timeout=120)
        assert refused.get("failed") and refused.get("reason") == "Conflict", refused
        assert refused["holder"]["operation"] == "volume_attach", refused
        assert first.running() and only_marker(pool)[0] == marker  # the live hold was not broken
    finally:
        os.killpg(first.proc.pid, signal.SIGCONT)
    attached = first.finish(timeout=300)
    assert attached.get("changed") and not attached.get("failed"), attached
    second = ModuleRun("volume_attach", launcher=other_ns, hold_timeout=120, uri=pool.uri, machine=NAME,
                       volume="%s-ns2.qcow2" % NAME, size="8Mi").finish(timeout=300)
    assert second.get("changed") and not second.get("failed"), second
    assert {volume, "%s-ns2.qcow2" % NAME} <= attached_volumes(pool)
    assert holds(pool, NAME) == []
    detach_all(pool, [volume, "%s-ns2.qcow2" % NAME])


def test_a_run_paused_inside_a_step_writes_nothing_once_its_hold_passed_on(pool, monkeypatch):
    """A volume attach stops itself (writer.STOP_BEFORE_WRITE_ENV) after it made its volume, right before it
    attaches it: converge checked its hold for that step already. With the lease at 3 s, a second attach of
    another volume waits for it, takes the machine over once the frozen run's lease passed, and attaches. The
    first, let go, reaches the writer, which finds its hold passed on: it fails with Conflict and attaches nothing.
    libvirt shows the second's volume attached and not the first's."""
    monkeypatch.setenv(leases.LEASE_ENV, "3")
    paused_volume, later_volume = "%s-paused.qcow2" % NAME, "%s-later.qcow2" % NAME
    monkeypatch.setenv(writer.STOP_BEFORE_WRITE_ENV, "attachDeviceFlags")
    first = ModuleRun("volume_attach", uri=pool.uri, machine=NAME, volume=paused_volume, size="8Mi")
    monkeypatch.delenv(writer.STOP_BEFORE_WRITE_ENV)
    second = None
    try:
        _pid, status = os.waitpid(first.proc.pid, os.WUNTRACED)
        assert os.WIFSTOPPED(status), ("the attach ended without stopping before its write", first.finish())
        marker, found = only_marker(pool)
        assert found["operation"] == "volume_attach" and found["pid"] == first.proc.pid, found
        second = ModuleRun("volume_attach", hold_timeout=120, uri=pool.uri, machine=NAME, volume=later_volume,
                           size="8Mi")
        later = second.finish(timeout=300)
        assert later.get("changed") and not later.get("failed"), later
        assert marker not in holds(pool, NAME)  # the second took the frozen run's hold over
        assert first.running()  # and the first was still there, frozen: the runs overlapped
        assert later_volume in attached_volumes(pool) and paused_volume not in attached_volumes(pool)
        os.kill(first.proc.pid, signal.SIGCONT)
        paused = first.finish(timeout=120)
    finally:
        end_runs([first, second])
    assert paused.get("failed") and paused.get("reason") == "Conflict", paused
    assert "paused for longer than its lease" in paused["msg"], paused["msg"]
    assert paused_volume not in attached_volumes(pool) and later_volume in attached_volumes(pool)
    assert holds(pool, NAME) == []
    detach_all(pool, [later_volume])
    done = run_module("volume", uri=pool.uri, name=paused_volume, state="absent")
    assert not done.get("failed"), done


def stopped_now(run):
    """Whether ``run`` has stopped itself (SIGSTOP) since it was last looked at (its stop reported once)."""
    pid, status = os.waitpid(run.proc.pid, os.WNOHANG | os.WUNTRACED)
    return pid == run.proc.pid and os.WIFSTOPPED(status)


def generations_held(pool):
    """The generations of the machine's hold in the registry (the anchor, 1, while any is held)."""
    return sorted(filter(None, (keys.slot_generation(volume, keys.hold_volume(NAME)) for volume in holds(pool, NAME))))


def test_two_controllers_breaking_one_expired_lock_at_once_exactly_one_holds(pool, monkeypatch):
    """A volume attach on ctl-c is killed while it holds the machine. Attaches on ctl-a and on ctl-b (its clock
    five minutes ahead) wait out its lease, and each stops itself in its take-over, named and right before the
    exclusive create that decides (locks.STOP_BEFORE_TAKEOVER_ENV): both broke the same expired lock. Continued
    together, exactly one holds the next generation (it stops again once it holds, STOP_HOLDING_ENV) while the
    other waits, leaving nothing of its own in the pool; then both attach in turn and the killed run's volume is
    not attached."""
    killed_volume = "%s-broken.qcow2" % NAME
    holder_killed_on_ctl_c(pool, monkeypatch, killed_volume)
    killed_top = generations_held(pool)[-1]
    runs = []
    try:
        monkeypatch.setenv(locks.STOP_BEFORE_TAKEOVER_ENV, keys.hold_volume(NAME))
        monkeypatch.setenv(convergence.STOP_HOLDING_ENV, "volumes of machine %s" % NAME)
        for index, launcher in enumerate([controller("ctl-a"), controller("ctl-b", SKEW)]):
            runs.append(ModuleRun("volume_attach", launcher=launcher, hold_timeout=120, uri=pool.uri, machine=NAME,
                                  volume="%s-b%d.qcow2" % (NAME, index), size="8Mi"))
        monkeypatch.delenv(locks.STOP_BEFORE_TAKEOVER_ENV)
        monkeypatch.delenv(convergence.STOP_HOLDING_ENV)
        for run in runs:  # each judged the lock expired and stopped at its take-over
            _pid, status = os.waitpid(run.proc.pid, os.WUNTRACED)
            assert os.WIFSTOPPED(status), ("an attach ended without stopping at its take-over", run.finish())
        assert generations_held(pool)[-1] == killed_top  # neither has created the next generation yet
        for run in runs:
            os.kill(run.proc.pid, signal.SIGCONT)
        stopped = []

        def one_holds():
            """one of the two stopped again, holding the machine"""
            stopped.extend(run for run in runs if stopped_now(run))
            return stopped
        until(one_holds, timeout=3 * LEASE)
        winner = stopped[0]
        loser = next(run for run in runs if run is not winner)
        assert len(stopped) == 1 and loser.running(), "both hold the machine"
        markers = [volume for volume in holds(pool, NAME) if ".holder." in volume]
        assert [coordination.holder(marker, keys.hold_prefix(NAME))["pid"] for marker in markers] == \
            [winner.proc.pid], markers  # the winner's name alone: the loser waits leaving nothing
        assert generations_held(pool) == [1, killed_top + 1]
        os.kill(winner.proc.pid, signal.SIGCONT)
        _pid, status = os.waitpid(loser.proc.pid, os.WUNTRACED)  # it holds the machine once the winner let go
        assert os.WIFSTOPPED(status), ("the loser ended without holding the machine", loser.finish())
        os.kill(loser.proc.pid, signal.SIGCONT)
        results = [run.finish(timeout=300) for run in runs]
    finally:
        end_runs(runs)
    assert [(result.get("failed"), result.get("changed")) for result in results] == [(None, True)] * 2, results
    made = {"%s-b%d.qcow2" % (NAME, index) for index in range(2)}
    assert made <= attached_volumes(pool) and killed_volume not in attached_volumes(pool)
    assert holds(pool, NAME) == []
    detach_all(pool, sorted(made))

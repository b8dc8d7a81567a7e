"""Runs that overlap on one machine or one registry (issue #23): two moves of one machine, two drains of one
pool, a start during a move, a registry document read while another run still writes it. Each test makes the
runs overlap by waiting for what libvirt shows (never for a fixed time) and asserts that they did."""

import os
import signal
import threading
import time

import libvirt
import pytest

from conftest import ModuleRun, run_module
from test_13_migrate import fleet, homes, journals, listed, make, owned_volumes, play, remove

from ansible_collections.machinery.compute.plugins.module_utils.coordination import documents
from ansible_collections.machinery.compute.plugins.module_utils.coordination.holds import machine_hold
from ansible_collections.machinery.compute.plugins.module_utils.coordination import keys


@pytest.fixture(name="image", scope="session")
def idle_guest_image(idle_image):
    """Nothing here looks inside a guest: its machines run the idle image (conftest.idle_image), at no CPU cost."""
    return idle_image


FILES = ("cidata.iso", "data.qcow2", "root.qcow2")


def start_module(module_name, **args):
    """A module run in a process of its own (conftest.ModuleRun): its process, and the file of its arguments."""
    run = ModuleRun(module_name, diff=False, **args)
    return run.proc, os.path.join(run.work, "args.json")


def wait_for(what, timeout=120):
    """Poll libvirt until ``what()`` holds; the test fails when it never does."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if what():
                return
        except libvirt.libvirtError:
            pass  # a domain or volume went between its lookup and the question: look again
        assert time.monotonic() < deadline, "never saw %s" % what.__doc__
        time.sleep(0.003)


def holds(pool, name):
    return [volume for volume in listed(pool, "machinery-registry") if volume.startswith("hold-%s." % name)]


def whole_once(pools, name):
    """The machine is on exactly one pool, with every volume it had."""
    found = homes(pools, name)
    assert len(found) == 1, (name, [pool.name for pool in found])
    volumes = set(owned_volumes(found[0], name))
    assert {"%s-%s" % (name, suffix) for suffix in FILES} <= volumes, (name, found[0].name, volumes)
    return found[0]


def test_a_second_move_of_a_machine_waits_for_the_first(registered, image):
    """Issue #23, 1: the second move used to take the first one's journal for a dead run's and roll its copy
    back (the winner's root disk and console log went). Now it waits for the first move's hold."""
    pools = registered
    source, name = pools[0], "race-move"
    first = second = None
    try:
        make(source, image, name, state="present", data="8Mi")
        args = dict(uri=source.uri, pools=fleet(pools), machine=name, mode="cold", shutdown_timeout=1)
        first, first_args = start_module("machine_migrate", **args)

        def journaled():
            """the first move's journal on the source"""
            return bool(journals(source, name))
        wait_for(journaled)
        first.send_signal(signal.SIGSTOP)
        try:
            assert first.poll() is None  # frozen mid-move, its journal written
            second, second_args = start_module("machine_migrate", **args)
            try:
                second.wait(timeout=20)
            except Exception:  # still waiting for the first move, as it must
                pass
            assert second.poll() is None, "the second move did not wait for the first (rc %s)" % second.returncode
            assert homes(pools, name) == [source] and len(owned_volumes(source, name)) >= len(FILES)
        finally:
            first.send_signal(signal.SIGCONT)
        assert first.wait(timeout=300) == 0 and second.wait(timeout=300) == 0
        os.unlink(first_args)
        os.unlink(second_args)
        home = whole_once(pools, name)
        assert home is not source and owned_volumes(source, name) == []
        assert all(journals(pool, name) == [] and holds(pool, name) == [] for pool in pools)
        again = run_module("machine_migrate", **args)
        assert again["changed"] is False and not again.get("failed"), again
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.kill()
                proc.wait()
        remove(pools, name)


def test_starting_a_machine_during_its_move_is_refused(registered, image):
    """Issue #23, 3: `machine state: running` on the source of a cold move used to start the guest it had just
    stopped; both copies ran, then the move deleted the source. The move's hold refuses it, naming the move."""
    pools = registered
    source, target, name = pools[0], pools[1], "race-start"
    mover = None
    try:
        make(source, image, name, state="running", data="8Mi")
        mover, mover_args = start_module("machine_migrate", uri=source.uri, pools=fleet(pools), machine=name,
                                         target=target.name, mode="cold", shutdown_timeout=1)

        def stopped():
            """the source stopped by the move"""
            return bool(journals(source, name)) and not source.domain(name).isActive()
        wait_for(stopped)
        mover.send_signal(signal.SIGSTOP)
        try:
            assert mover.poll() is None  # frozen after it stopped the guest
            started = run_module("machine", uri=source.uri, name=name, state="running", wait="none")
            assert started.get("failed") and "being moved" in started["msg"], started
            assert "to %s" % target.name in started["msg"] and "pid %d" % mover.pid in started["msg"], started
            assert not source.domain(name).isActive()
        finally:
            mover.send_signal(signal.SIGCONT)
        assert mover.wait(timeout=300) == 0
        os.unlink(mover_args)
        assert whole_once(pools, name) is target and target.domain(name).isActive()
    finally:
        if mover is not None and mover.poll() is None:
            mover.send_signal(signal.SIGCONT)
            mover.kill()
            mover.wait()
        remove(pools, name)


def test_two_drains_of_one_pool_at_once_lose_nothing(registered, image, tmp_path):
    """Issue #23, 2: two drain runs of one pool a moment apart lost a machine's volumes. The second one's moves
    wait for the first one's, and find their machines moved."""
    pools = registered
    drained = pools[0]
    names = ["race-drain-%d" % index for index in range(4)]
    try:
        for name in names:
            make(drained, image, name, state="present", data="8Mi")
        variables = {"drain_pool": drained.name, "drain_pools": fleet(pools), "drain_mode": "cold",
                     "drain_shutdown_timeout": 5}
        results = {}

        def drain(tag):
            results[tag] = play(tmp_path, tag, **variables)
        first = threading.Thread(target=drain, args=("first",))
        first.start()

        def moving():
            """the first drain's first move"""
            return any(journals(drained, name) for name in names)
        wait_for(moving, 300)
        overlapped = first.is_alive()
        second = threading.Thread(target=drain, args=("second",))
        second.start()
        first.join()
        second.join()
        assert overlapped  # the second drain started while the first one was moving a machine
        for tag in ("first", "second"):
            proc, recap = results[tag]
            assert recap["failed"] == 0, proc.stdout[-5000:]
        for name in names:
            assert whole_once(pools, name) is not drained
        assert all(journals(pool, name) == [] for pool in pools for name in names)
    finally:
        for name in names:
            remove(pools, name)


def test_a_document_still_being_written_is_not_there_yet(pool):
    """Issue #23, 5: a reader found a registry document another run was still creating and failed ("volume ...
    is still being allocated"). It must read as not there yet: the previous generation is the current one."""
    conn = libvirt.open(pool.uri)
    # the reader is another run: a connection of its own (calls on the writer's connection wait for its clone)
    reader = libvirt.open(pool.uri)
    registry_pool = conn.storagePoolLookupByName(keys.REGISTRY_POOL)
    listed = reader.storagePoolLookupByName(keys.REGISTRY_POOL)
    storage = conn.storagePoolLookupByName("machinery")
    big = cloning = None
    try:
        for leftover in [storage.storageVolLookupByName(name) for name in storage.listVolumes()
                         if name == "race-doc-source"]:
            leftover.delete(0)  # of a run whose clean-up could not delete it
        documents.Registry.open(conn).put("race-doc", {"generation": "first"})
        # a slow creation of the next generation: a clone of 4 GiB, which libvirt copies byte by byte
        big = storage.createXML("<volume><name>race-doc-source</name><capacity>4294967296</capacity>"
                                "<allocation>4294967296</allocation><target><format type='raw'/></target>"
                                "</volume>", 0)
        done = threading.Event()

        def clone():
            try:
                registry_pool.createXMLFrom("<volume><name>race-doc.2.json</name><capacity>4294967296</capacity>"
                                            "<target><format type='raw'/></target></volume>", big, 0)
            finally:
                done.set()
        cloning = threading.Thread(target=clone)
        cloning.start()

        def allocating():
            """race-doc.2.json being allocated"""
            return "race-doc.2.json" in listed.listVolumes() or done.is_set()  # no refresh: refused now
        wait_for(allocating)
        reads = overlapped = 0
        while not done.is_set():
            overlapped += 1  # this read starts while the next generation is being created
            body = documents.Registry.open(reader).get("race-doc")
            reads += 1
            assert body == {"generation": "first"}, body
        cloning.join()
        assert overlapped > 0, reads  # at least one read ran while the next generation was being created
    finally:
        if cloning is not None:
            cloning.join()
        registry_pool.refresh(0)
        for name in registry_pool.listVolumes():
            if name.startswith("race-doc."):
                registry_pool.storageVolLookupByName(name).delete(0)
        if big is not None:
            big.delete(0)
        conn.close()


# --- a create's hold on its machine, through its wave (admission.claim) ---------------------------------------

REGISTRY = "machinery-registry"


def waiting_run(monkeypatch, progress, *args, **kwargs):
    """A ModuleRun whose progress (what a waiting run says) goes to the file ``progress``."""
    monkeypatch.setenv("MACHINERY_PROGRESS_FILE", str(progress))
    try:
        return ModuleRun(*args, **kwargs)
    finally:
        monkeypatch.delenv("MACHINERY_PROGRESS_FILE")


def says_it_waits(progress, name):
    """Whether a run's progress file says it waits for the hold on machine ``name`` (a waiter leaves nothing in
    the registry: what it says is how a test sees it wait)."""
    return progress.exists() and ("waiting for machine %s," % name) in progress.read_text()


def waves(pool):
    return [volume for volume in listed(pool, REGISTRY) if volume.startswith(keys.WAVE_PREFIX)]


def test_a_create_lets_the_lock_go_and_waits_for_a_run_that_holds_its_machine(pool, image, tmp_path, monkeypatch):
    """A create holds its machine with a lock volume alone, named by its wave. Meeting a hold another run took (a
    move of that name, an update, a deletion), it makes nothing, lets the pool's admission lock go and waits for
    that hold as a change does, then creates the machine."""
    name = "race-held"
    run_module("machine", uri=pool.uri, name=name, state="absent")
    registry = documents.Registry(pool.conn, pool.conn.storagePoolLookupByName(REGISTRY))
    hold = machine_hold(pool.conn, name, 30, registry=registry).acquire()  # this test's process holds it
    creator = None
    try:
        progress = tmp_path / "progress.json"
        creator = waiting_run(monkeypatch, progress, "machine", diff=False, uri=pool.uri, name=name,
                              machine_class="small", image=image, state="present", network_interfaces=[])

        def waiting():
            """the create waiting for the hold the test has"""
            return says_it_waits(progress, name)
        wait_for(waiting)
        assert creator.running()
        names = listed(pool, REGISTRY)
        assert keys.ADMISSION_LOCK not in names and not waves(pool)  # it waits outside the admission lock
        assert pool.domain(name) is None and owned_volumes(pool, name) == []
    finally:
        hold.release()
    result = creator.finish()
    assert result.get("changed") and not result.get("failed"), result
    assert pool.domain(name) is not None
    assert holds(pool, name) == [] and waves(pool) == []
    run_module("machine", uri=pool.uri, name=name, state="absent")


def continued(creator):
    """Let the frozen create go on: (whether it made the machine, its result)."""
    os.kill(creator.proc.pid, signal.SIGCONT)
    made = creator.finish()
    return bool(made.get("changed") and not made.get("failed")), made


def killed(creator):
    """Kill the frozen create: (whether it was killed while it ran, what it was)."""
    return creator.kill(), "the create had ended before the kill"


ENDINGS = {"continued": continued, "killed": killed}


@pytest.mark.parametrize("ending", sorted(ENDINGS))
def test_a_delete_waits_for_the_create_holding_its_machine_unless_that_create_died(pool, image, ending, tmp_path,
                                                                                   monkeypatch):
    """A create holds its machine from before its first volume until its guest is started, with a lock volume
    whose holder its wave names. A deletion of the machine meanwhile waits for it, and deletes the machine once
    the create is done; when the create is killed, its hold is a dead run's and the deletion breaks it at once."""
    name = "race-claimed-%s" % ending
    run_module("machine", uri=pool.uri, name=name, state="absent", shutdown_timeout=1)
    args = dict(uri=pool.uri, name=name, machine_class="small", image=image, state="running", wait="none",
                network_interfaces=[])
    creator = deleter = None
    try:
        frozen = False
        for _attempt in range(10):
            creator = ModuleRun("machine", diff=False, **args)

            def starting():
                """the create's hold with no marker, and its domain defined: it is starting the guest"""
                names = listed(pool, REGISTRY)
                return keys.hold_volume(name) in names and pool.domain(name) is not None and \
                    not any(volume.startswith(keys.hold_prefix(name)) for volume in names)
            while creator.running() and not starting():
                time.sleep(0.002)
            os.kill(creator.proc.pid, signal.SIGSTOP)
            frozen = creator.running() and starting()
            if frozen:
                break
            os.kill(creator.proc.pid, signal.SIGCONT)  # it was done before the stop: once more
            assert not creator.finish().get("failed")
            run_module("machine", uri=pool.uri, name=name, state="absent", shutdown_timeout=1)
        assert frozen, "never froze a create while it held its machine"
        progress = tmp_path / "progress.json"
        deleter = waiting_run(monkeypatch, progress, "machine", diff=False, uri=pool.uri, name=name, state="absent",
                              shutdown_timeout=1)

        def waiting():
            """the deletion waiting for the hold the frozen create has"""
            return says_it_waits(progress, name)
        wait_for(waiting)
        assert deleter.running() and pool.domain(name) is not None
        assert keys.hold_volume(name) in listed(pool, REGISTRY)  # the live create's hold was not broken
        ended, detail = ENDINGS[ending](creator)
        assert ended, detail
        gone = deleter.finish()
        assert gone.get("changed") and not gone.get("failed"), gone
        assert pool.domain(name) is None and owned_volumes(pool, name) == []
        assert holds(pool, name) == [] and waves(pool) == []
    finally:
        for run in (creator, deleter):
            if run is not None and run.running():
                os.kill(run.proc.pid, signal.SIGCONT)
                run.kill()
        run_module("machine", uri=pool.uri, name=name, state="absent", shutdown_timeout=1)

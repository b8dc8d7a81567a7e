# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A run over many machines reads each domain once: the pool listing, sizes from it, observations from it, the
check under the lock from bulk stats, and admission locks handed over between the threads of one run."""

from __future__ import annotations

import threading
import time

import libvirt
import pytest

from ansible_collections.machinery.compute.plugins.module_utils.coordination import admission
from ansible_collections.machinery.compute.plugins.module_utils.coordination.holds import Coordination
from ansible_collections.machinery.compute.plugins.module_utils.pools import capacity
from ansible_collections.machinery.compute.plugins.module_utils.core import domain as dx
from ansible_collections.machinery.compute.plugins.module_utils.core import options
from ansible_collections.machinery.compute.plugins.module_utils.machines import machine_observe as machine
from ansible_collections.machinery.compute.plugins.module_utils.machines import machine_status
from ansible_collections.machinery.compute.plugins.module_utils.machines import pool_context
from ansible_collections.machinery.compute.plugins.module_utils.core.errors import PoolFull
from ansible_collections.machinery.compute.plugins.module_utils.machines.pool_context import PoolContext, read_domains

from conftest import FakeDomain

MIB = 2 ** 20


def domain_xml(name, cpu, memory, managed=True):
    record = {"version": 1, "created": "2026-01-01T00:00:00+00:00", "boots": 0, "last_error": None,
              "spec": {"name": name, "machine_class": "small", "cpu": cpu, "memory": memory, "labels": {},
                       "image": {"source": "x"}, "volumes": [], "root_size": 2 ** 30, "files": {},
                       "network_interfaces": []}}
    plan = {"name": name, "virt_type": "qemu", "cpu": cpu, "memory": memory, "firmware": "bios",
            "record": record, "nics": [], "disks": [{"name": "root", "path": "/p/%s-root.qcow2" % name,
                                                     "format": "qcow2", "device": "vda", "boot": True}],
            "console_path": "/p/%s-console.log" % name}
    tree = options.build_tree(plan, plan)
    if not managed:
        tree.remove(tree.find("metadata"))
    return dx.tostring(tree)


class FakeConn:
    def __init__(self, domains):
        self.domains = domains
        self.stats_calls = 0

    def listAllDomains(self, _flags=0):  # noqa: N802
        return list(self.domains)

    def getAllDomainStats(self, _flags, _flags2=0):  # noqa: N802
        self.stats_calls += 1
        tree_of = {dom.name(): dx.parse(dom.xml) for dom in self.domains}
        return [(dom, {"state.state": dom.state_value, "state.reason": 0,
                       "vcpu.current": dx.read_cpu(tree_of[dom.name()]),
                       "balloon.maximum": dx.read_memory(tree_of[dom.name()]) // 1024}) for dom in self.domains]

    def lookupByName(self, name):  # noqa: N802
        raise AssertionError("a listed machine is not looked up again (%s)" % name)


def fleet():
    return FakeConn([FakeDomain("a", domain_xml("a", 1, 128 * MIB)), FakeDomain("b", domain_xml("b", 2, 256 * MIB)),
                     FakeDomain("other", domain_xml("other", 1, 64 * MIB, managed=False))])


def test_listing_reads_each_domain_once_and_sizes_agree():
    conn = fleet()
    direct = capacity.machine_sizes(conn)
    for dom in conn.domains:
        dom.reads = 0
    ctx = PoolContext(conn, "test:///a")
    assert capacity.machine_sizes(conn, ctx.listing()) == direct
    capacity.machine_sizes(conn, ctx.listing())
    assert [dom.reads for dom in conn.domains] == [1, 1, 1]
    assert conn.stats_calls == 1
    assert sorted(name for name, _reading in read_domains(conn).items()) == ["a", "b", "other"]


class GoneDomain(FakeDomain):
    """A domain undefined between the stats call and the read of its XML."""

    def XMLDesc(self, _flags=0):  # noqa: N802
        error = libvirt.libvirtError("no domain")
        error.err = (libvirt.VIR_ERR_NO_DOMAIN,) + (None,) * 8
        raise error


def test_a_domain_undefined_while_the_pool_is_read_is_left_out():
    conn = fleet()
    conn.domains.insert(1, GoneDomain("gone", domain_xml("gone", 1, 64 * MIB)))
    assert sorted(read_domains(conn)) == ["a", "b", "other"]


def test_statuses_streamed_keep_no_listing_and_give_the_sizes(monkeypatch):
    monkeypatch.setattr(pool_context, "LISTING_CHUNK", 2)  # more domains than one chunk
    conn = FakeConn([FakeDomain("m%d" % index, domain_xml("m%d" % index, 1, 128 * MIB)) for index in range(5)] +
                    [FakeDomain("other", domain_xml("other", 1, 64 * MIB, managed=False))])
    ctx = PoolContext(conn, "test:///a")
    ctx._view, ctx._registration = FakeView(), {"name": "pool-a"}
    names = [machine["name"] for machine in machine_status.list_machines(ctx, guest=False, keep=False)]
    assert names == ["m0", "m1", "m2", "m3", "m4"]
    assert ctx.listed() is None
    assert ctx.streamed_sizes == capacity.machine_sizes(conn)
    assert [dom.reads for dom in conn.domains] == [2] * 6  # once streamed, once by machine_sizes above


class FakeView:
    """A pool's leases and volume names: none leased, none missing."""

    def addresses(self, _network, _mac):
        return []

    def missing(self, _path):
        return False


def test_observation_from_the_listing_then_fresh():
    conn = fleet()
    ctx = PoolContext(conn, "test:///a")
    ctx.listing()
    listed = ctx.listed()
    observed = machine.observe_machine(conn, "a", listing=listed)
    assert observed.exists and observed.record["spec"]["cpu"] == 1 and observed.state[0] == libvirt.VIR_DOMAIN_SHUTOFF
    assert not machine.observe_machine(conn, "new", listing=listed).exists
    ctx.forget_reads()
    assert ctx.listed() is None  # the next observation of a machine reads libvirt again


def test_current_sizes_take_cpu_and_memory_from_stats_and_records_once():
    conn = fleet()
    known = {}
    first = capacity.current_sizes(conn, known)
    assert sorted(first) == sorted(capacity.machine_sizes(conn))
    reads = [dom.reads for dom in conn.domains]
    conn.domains[0].xml = domain_xml("a", 4, 512 * MIB)  # grown by another run: stats show it
    again = capacity.current_sizes(conn, known)
    assert [dom.reads for dom in conn.domains] == reads
    assert ("a", 4, 512 * MIB) == again[0][:3]


class NamedConn(str):
    """A connection named by its string; it has no domains."""

    def listAllDomains(self, flags):
        return []


class FakeLock:
    taken = []
    released = []

    def __init__(self, conn, pool, identity=None):
        self.conn = conn
        self.pool = pool

    def acquire(self):
        FakeLock.taken.append(self.conn)
        return self

    def release(self):
        FakeLock.released.append(self.conn)


class WatchedCondition(threading.Condition):
    """The admissions' condition; ``waits`` counts the waits begun since the last notify_all (both run under its
    lock), so a thread found waiting after a notify_all has really gone back to waiting."""

    def __init__(self):
        super().__init__()
        self.waits = 0

    def wait(self, timeout=None):
        self.waits += 1
        return super().wait(timeout)

    def notify_all(self):
        self.waits = 0
        super().notify_all()


class WatchedLock:
    """A pool's lock within the process; ``blocked`` counts the threads that found it taken and wait for it."""

    def __init__(self):
        self.lock = threading.Lock()
        self.blocked = 0

    def acquire(self):
        if not self.lock.acquire(blocking=False):
            self.blocked += 1
            self.lock.acquire()
            self.blocked -= 1
        return True

    def release(self):
        self.lock.release()


def wait_for(condition, what, timeout=5.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "never " + what
        time.sleep(0.005)


def a_run(monkeypatch, *uris):
    """Fake registry locks, and a run (its Coordination) whose admissions watch ``uris``' locks."""
    monkeypatch.setattr(admission.locks, "admission_lock", FakeLock)
    monkeypatch.setattr(admission.lv, "lookup_storage_pool", lambda conn, name: "registry")
    run = Coordination()
    run.admissions.targets.update({uri: WatchedLock() for uri in uris})
    run.admissions.guard = WatchedCondition()
    FakeLock.taken, FakeLock.released = [], []
    return run


def pools_of(run):
    """Pools x and y as one run sees them."""
    return PoolContext(NamedConn("conn-x"), "test:///x", run), PoolContext(NamedConn("conn-y"), "test:///y", run)


def test_admission_locks_are_handed_over_within_a_run(monkeypatch):
    run = a_run(monkeypatch)
    x, y = pools_of(run)
    first = admission.Admission(x, [])
    first.__enter__()
    other = admission.Admission(y, [])
    other.__enter__()  # another admission of the run is under way
    first.__exit__()
    assert FakeLock.released == []  # x's lock is kept for the next admission
    with admission.Admission(x, []):
        assert FakeLock.taken == ["conn-x", "conn-y"]  # not taken again
    other.__exit__()  # the last one out gives every lock back
    assert sorted(FakeLock.released) == ["conn-x", "conn-y"]
    assert run.admissions.inside == 0
    assert not any(hold.held or hold.users for hold in run.admissions.holds.values())


def test_admissions_onto_different_pools_share_the_peer_locks(monkeypatch):
    """Two threads admit onto x and y with names unique across both: both are inside at once, each pool's lock
    taken from libvirt once; a third onto x waits for the first, and so does a second admission of one name."""
    run = a_run(monkeypatch, "test:///x", "test:///y")
    x, y = pools_of(run)
    for ctx, peer in ((x, y), (y, x)):
        ctx.peer_connections = {peer.uri: peer.conn}
    onto_x = admission.Admission(x, [x.uri, y.uri], "a")
    onto_x.__enter__()
    onto_y = admission.Admission(y, [x.uri, y.uri], "b")
    onto_y.__enter__()  # would block (no thread to let it go) if y were locked by the admission onto x
    assert sorted(FakeLock.taken) == ["conn-x", "conn-y"]
    entered = []

    def admit(ctx, name):
        with admission.Admission(ctx, [x.uri, y.uri], name):
            entered.append(name)
    waiting = [threading.Thread(target=admit, args=(x, "c")), threading.Thread(target=admit, args=(y, "a"))]
    guard, onto_x_lock = run.admissions.guard, run.admissions.targets[x.uri]

    def both_wait():  # c for x's lock, a for its name
        return onto_x_lock.blocked == 1 and guard.waits == 1
    for thread in waiting:
        thread.start()
    wait_for(both_wait, "saw both admissions wait")
    assert entered == []  # x is being admitted onto, and machine a is being admitted
    onto_y.__exit__()
    wait_for(both_wait, "saw both admissions wait again once y was left")
    assert entered == []
    onto_x.__exit__()
    for thread in waiting:
        thread.join(5)
    assert not any(thread.is_alive() for thread in waiting)
    assert sorted(entered) == ["a", "c"]
    assert sorted(FakeLock.released) == ["conn-x", "conn-y"] and run.admissions.inside == 0


def test_a_lock_held_past_the_hand_over_goes_back_once_unused(monkeypatch):
    run = a_run(monkeypatch)
    x, y = pools_of(run)
    staying = admission.Admission(y, [])
    staying.__enter__()
    with admission.Admission(x, []):
        pass
    run.admissions.holds[x.uri].taken -= admission.HAND_OVER_SECONDS
    with admission.Admission(x, []):
        assert FakeLock.released == ["conn-x"] and FakeLock.taken == ["conn-y", "conn-x", "conn-x"]
    staying.__exit__()


def test_checks_under_one_held_lock_read_the_sizes_once_and_count_what_was_admitted():
    conn = fleet()  # a (1 cpu) and b (2 cpu) are defined
    ctx = PoolContext(conn, "test:///a")
    ctx._registration = {"name": "a", "reserved": {"cpu": 0, "memory": 0}, "overcommit": {"cpu": 1.0, "memory": 1.0}}
    ctx._host_capacity = {"cpu": 5, "memory": 8 * 2 ** 30}
    spec = {"name": "c", "cpu": 1, "memory": 128 * MIB}
    capacity.check_room(ctx, spec, locked=True, epoch=7)
    capacity.admitted(ctx, 7, {"spec": dict(spec, machine_class="small", volumes=[], root_size=2 ** 30)})
    with pytest.raises(PoolFull):  # a, b and c take 4 of 5 cpus: d (2) does not fit, counted without a read
        capacity.check_room(ctx, {"name": "d", "cpu": 2, "memory": 128 * MIB}, locked=True, epoch=7)
    assert conn.stats_calls == 1
    capacity.check_room(ctx, {"name": "d", "cpu": 2, "memory": 128 * MIB}, locked=True, epoch=8)
    assert conn.stats_calls == 2  # a new hold of the lock reads the pool again (c was never really made)


def test_a_tally_keeps_the_sums_a_recount_gives_as_it_grows():
    sizes = [capacity.MachineSize("a", 1, 128 * MIB, "small", {"a-root": 10, "shared": 5}, [], None),
             capacity.MachineSize("b", 2, 256 * MIB, "small", {"b-root": 20, "shared": 7}, [], None),
             capacity.MachineSize("c", None, None, None, {}, [], None),  # adopted: no size of its own
             capacity.MachineSize("a", 1, 64 * MIB, "small", {"a-root": 12}, [], None)]  # read twice
    tally = capacity.Tally(sizes[:1])
    for size in sizes[1:]:
        tally.append(size)
    assert list(tally) == sizes
    assert capacity.disks_allocated(tally) == capacity.disks_allocated(list(tally)) == 12 + 7 + 20
    for name in ("a", "b", "c", "new"):
        others = [size for size in sizes if size.name != name]
        assert tally.used_except(name) == (sum(size.cpu or 0 for size in others),
                                           sum(size.memory or 0 for size in others))
    assert capacity.disks_allocated(tally, except_machine="b") == capacity.disks_allocated(sizes, "b")
    for change in (lambda: tally.remove(sizes[0]), tally.pop, lambda: tally.insert(0, sizes[0]),
                   lambda: tally.__setitem__(0, sizes[1]), tally.clear):
        with pytest.raises(TypeError):
            change()
    assert list(tally) == sizes


def test_a_room_check_counts_a_server_group_only_for_a_machine_of_one():
    conn = fleet()
    ctx = PoolContext(conn, "test:///a")
    ctx._registration = {"name": "a", "reserved": {"cpu": 0, "memory": 0}, "overcommit": {"cpu": 1.0, "memory": 1.0}}
    ctx._host_capacity = {"cpu": 8, "memory": 8 * 2 ** 30}
    group = {"name": "web", "policy": "anti-affinity"}
    capacity.check_room(ctx, {"name": "c", "cpu": 1, "memory": 128 * MIB, "server_group": group}, locked=True,
                        epoch=3)
    capacity.admitted(ctx, 3, {"spec": {"name": "c", "cpu": 1, "memory": 128 * MIB, "machine_class": "small",
                                        "volumes": [], "root_size": 2 ** 30, "server_group": group}})
    with pytest.raises(PoolFull) as refused:  # c is a member now: a second member of the group is refused
        capacity.check_room(ctx, {"name": "d", "cpu": 1, "memory": 128 * MIB, "server_group": group},
                            locked=True, epoch=3)
    assert refused.value.field == "server_group" and "already has member c" in str(refused.value)
    capacity.check_room(ctx, {"name": "d", "cpu": 1, "memory": 128 * MIB}, locked=True, epoch=3)  # no group
    capacity.check_room(ctx, {"name": "c", "cpu": 1, "memory": 128 * MIB, "server_group": group}, locked=True,
                        epoch=3)  # c itself is not its own neighbour

"""The journal of the creates on a pool (coordination/journals.py) and the wave an admission writes (Admission.journal):
what a reader finds, whose a wave is, and how many documents a run writes."""

import os
import subprocess

import pytest

from ansible_collections.machinery.compute.plugins.module_utils.coordination import journals as journal
from ansible_collections.machinery.compute.plugins.module_utils.coordination import admission as adm
from ansible_collections.machinery.compute.plugins.module_utils.coordination import documents
from ansible_collections.machinery.compute.plugins.module_utils.coordination import holds
from ansible_collections.machinery.compute.plugins.module_utils.coordination import keys
from ansible_collections.machinery.compute.plugins.module_utils.coordination import locks


class Listed:
    """A registry's storage pool, as far as a listing of its volume names goes."""

    def __init__(self, names=()):
        self.names = list(names)

    def listVolumes(self):  # noqa: N802 - libvirt's name
        return list(self.names)


class Documents:
    """A registry's documents as Registry shows them: keys listed, bodies read (None: listed, not readable)."""

    def __init__(self, bodies, volumes=()):
        self.pool = Listed(volumes)  # the volumes other than documents: holds and their markers
        self.bodies = dict(bodies)
        self.puts = []
        self.deleted = []
        self.listed_in = []
        self.identity = None

    def keys(self, prefix="", epoch=None):
        self.listed_in.append(epoch)
        return sorted(key for key in self.bodies if key.startswith(prefix))

    def get(self, key):
        return self.bodies.get(key)

    def put(self, key, body, locked=False, epoch=None):
        assert locked and epoch is not None
        self.puts.append((key, body))
        self.bodies[key] = body

    def remove(self, key, locked=False, epoch=None, expected=False):
        assert locked and expected
        self.deleted.append(key)
        return self.bodies.pop(key, None) is not None


ME = locks.Identity()  # this process, as its waves and markers name it


def a_dead_pid():
    """The pid of a process that has ended (and was reaped)."""
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def test_a_wave_key_is_a_registry_key_and_names_its_process():
    key = journal.wave_key(ME, 7)
    assert keys._DOCUMENT.match("%s.1.json" % key), key
    assert key.startswith(keys.WAVE_PREFIX) and key.endswith("-7")
    assert journal.wave_is_dead(key, ME) is False  # this process is running


def test_a_wave_of_a_gone_process_of_this_controller_is_dead():
    controller, start = ME.controller, ME.start
    assert journal.wave_is_dead("wave-%s-%d-%s-3" % (controller, a_dead_pid(), start), ME) is True
    # same pid, another start time: the pid was reused, the writer is gone
    assert journal.wave_is_dead("wave-%s-%d-1-3" % (controller, os.getpid()), ME) is True


@pytest.mark.parametrize("key", ["wave-0123456789ab-1-2-3", "wave-nodashes", "pending-web"])
def test_a_wave_that_cannot_be_told_is_not_called_dead(key):
    assert journal.wave_is_dead(key, ME) is None


def test_a_machine_journal_comes_before_a_wave_and_an_unreadable_one_is_reported():
    docs = Documents({"pending-web": {"machine": "web", "volumes": ["web-root.qcow2"]},
                      "pending-db": None,
                      "wave-a-1-2-3": {"machines": {"web": ["x"], "app": ["app-root.qcow2", "app-console.log"]}}})
    assert journal.journal_of(docs, "web") == {"machine": "web", "volumes": ["web-root.qcow2"]}
    assert journal.journal_of(docs, "db") == {"machine": "db", "volumes": [], "unreadable": True}
    assert journal.journal_of(docs, "app") == {"machine": "app", "volumes": ["app-root.qcow2", "app-console.log"],
                                               "wave": "wave-a-1-2-3"}
    assert journal.journal_of(docs, "ap") is None  # a prefix of a listed name is not listed
    assert journal.journaled(docs) == {"web", "db", "app"}


def test_this_processs_own_wave_journals_nothing():
    """A create of this run listed in its own wave is no dead run's: the machines a batch is about to make read
    as not journaled, so they plan as the preflight planned them."""
    docs = Documents({journal.wave_key(ME, 3): {"machines": {"web": ["web-root.qcow2"]}}})
    assert journal.journal_of(docs, "web") is None
    assert journal.journaled(docs) == set()


def test_an_unreadable_wave_lists_nothing():
    docs = Documents({"wave-a-1-2-3": None})
    assert journal.journal_of(docs, "web") is None
    assert journal.journaled(docs) == set()


class Ctx:
    def __init__(self, docs, planned=None, run=None):
        self.uri = "test:///journal"
        self.registry = docs
        self.planned_creates = dict(planned or {})
        self.coordination = run if run is not None else holds.Coordination()


@pytest.fixture
def held(monkeypatch):
    """An admission inside its epoch on a pool whose lock this process holds (no libvirt): what it cleans."""
    cleaned = []
    monkeypatch.setattr(journal, "remove_orphans", lambda ctx, entry, skip_defined=False: cleaned.append(
        (entry["machine"], tuple(entry["volumes"]), skip_defined)))

    def admission(ctx, epoch=5):
        hold = ctx.coordination.admissions.holds[ctx.uri] = adm._PoolHold()
        hold.lock, hold.held, hold.epoch = object(), True, epoch
        admitted = adm.Admission(ctx, [])
        admitted.epoch = epoch
        return admitted, hold
    admission.cleaned = cleaned
    return admission


def test_one_wave_a_hold_lists_every_planned_create(held):
    planned = {"m%d" % index: ["m%d-root.qcow2" % index] for index in range(20)}
    docs = Documents({})
    ctx = Ctx(docs, planned)
    admission, hold = held(ctx)
    for name, volumes in planned.items():
        admission.journal(name, volumes)
    assert len(docs.puts) == 1  # the first create wrote the wave, the 19 others found themselves listed
    key, body = docs.puts[0]
    assert key == journal.wave_key(ME, 5) and body == {"machines": planned}
    assert docs.listed_in[0] == 5  # dead waves were looked for in a listing taken under the lock
    assert hold.wave.key == key


def test_a_create_planned_later_writes_the_wave_again_with_what_is_planned_by_then(held):
    docs = Documents({})
    ctx = Ctx(docs, {"a": ["a-root.qcow2"]})
    admission, _hold = held(ctx)
    admission.journal("a", ["a-root.qcow2"])
    ctx.planned_creates.update(b=["b-root.qcow2"], c=["c-root.qcow2"])
    admission.journal("b", ["b-root.qcow2"])
    admission.journal("c", ["c-root.qcow2"])
    assert [sorted(body["machines"]) for _key, body in docs.puts] == [["a"], ["a", "b", "c"]]


def test_a_create_whose_volumes_changed_since_its_plan_is_written_as_it_is_made(held):
    docs = Documents({})
    ctx = Ctx(docs, {"a": ["a-root.qcow2"]})
    admission, _hold = held(ctx)
    admission.journal("a", ["a-root.qcow2", "a-data.qcow2"])
    assert docs.puts[-1][1]["machines"]["a"] == ["a-root.qcow2", "a-data.qcow2"]


def test_the_first_create_of_a_hold_removes_what_dead_waves_list_and_them(held):
    docs = Documents({"wave-dead-1-2-3": {"machines": {"x": ["x-root.qcow2"], "y": ["y-root.qcow2"]}},
                      "pending-z": {"machine": "z", "volumes": ["z-root.qcow2"]}})
    admission, _hold = held(Ctx(docs))
    admission.journal("a", ["a-root.qcow2"])
    assert held.cleaned == [("x", ("x-root.qcow2",), True), ("y", ("y-root.qcow2",), True)]
    assert docs.deleted == ["wave-dead-1-2-3"]
    assert "pending-z" in docs.bodies  # a machine's own journal is its create's or delete's to clear
    admission.journal("b", ["b-root.qcow2"])
    assert len(held.cleaned) == 2  # looked for once a hold


def test_a_clean_up_under_the_lock_keeps_the_holds_own_wave(held):
    docs = Documents({"wave-dead-1-2-3": {"machines": {"x": ["x-root.qcow2"]}}})
    admission, hold = held(Ctx(docs))
    admission.journal("a", ["a-root.qcow2"])
    docs.bodies["wave-dead-4-5-6"] = {"machines": {"y": ["y-root.qcow2"]}}
    admission.clean_dead_waves()
    assert docs.deleted == ["wave-dead-1-2-3", "wave-dead-4-5-6"]
    assert hold.wave.key in docs.bodies


def test_giving_the_lock_back_deletes_the_wave_first(held, monkeypatch):
    docs = Documents({})
    admission, hold = held(Ctx(docs))
    admission.journal("a", ["a-root.qcow2"])
    order = []

    class Lock:
        def release(self):
            order.append("lock released, waves left: %s" % sorted(k for k in docs.bodies if k.startswith("wave-")))
    hold.lock = Lock()
    adm.Admission._give_back(admission, [hold])
    assert order == ["lock released, waves left: []"]
    assert hold.wave is None and hold.lock is None


def test_a_pool_without_a_registry_journals_nothing(held):
    docs = Documents({})
    admission, hold = held(Ctx(docs))
    hold.lock = None
    admission.journal("a", ["a-root.qcow2"])
    assert docs.puts == [] and hold.wave is None


class FakeLock:
    """A pool's libvirt admission lock as Admission takes it: records when it is released and which waves the
    registry still held then."""

    def __init__(self, docs, events):
        self.docs = docs
        self.events = events

    def acquire(self):
        self.events.append("taken")
        return self

    def release(self):
        self.events.append("released, waves left: %d" % len([k for k in self.docs.bodies if k.startswith("wave-")]))


class FakeConn:
    def listAllDomains(self, _flags):
        return []


def test_a_hold_handed_over_mid_run_deletes_its_wave_before_the_lock_goes_back(monkeypatch):
    """A run that holds a pool longer than HAND_OVER_SECONDS gives the lock back and takes it again between two
    creates (while other admissions of the process are inside): the old hold's wave goes first, and the new hold
    writes its own."""
    events = []
    docs = Documents({})
    run = holds.Coordination()
    monkeypatch.setattr(adm.lv, "lookup_storage_pool", lambda conn, name: object())
    busy, ctx = Ctx(Documents({}), run=run), Ctx(docs, {"a": ["a-root.qcow2"], "b": ["b-root.qcow2"]}, run=run)
    busy.uri, busy.conn, busy.peer_connections = "test:///busy", FakeConn(), {}
    ctx.conn, ctx.peer_connections = FakeConn(), {}
    monkeypatch.setattr(adm.locks, "admission_lock", lambda conn, pool, identity: FakeLock(
        docs, events) if conn is ctx.conn else FakeLock(busy.registry, []))
    with adm.Admission(busy, []):  # another admission of the process stays inside: no hold goes back at its exit
        with adm.Admission(ctx, [], "a") as first:
            first.journal("a", ["a-root.qcow2"])
        hold = run.admissions.holds[ctx.uri]
        first_wave = hold.wave.key
        assert hold.held and first_wave in docs.bodies
        hold.taken -= adm.HAND_OVER_SECONDS  # held long enough: the next admission hands it over
        with adm.Admission(ctx, [], "b") as second:
            assert second.epoch != first.epoch
            assert first_wave not in docs.bodies  # deleted before the lock went back
            second.journal("b", ["b-root.qcow2"])
        assert hold.wave.key != first_wave and hold.wave.key in docs.bodies
    # the pool's lock went back twice (handed over, then at the end), each time with no wave left
    assert events == ["taken", "released, waves left: 0", "taken", "released, waves left: 0"]
    assert docs.deleted == [first_wave, journal.wave_key(ME, second.epoch)]


# A create's hold on its machine (admission.claim): a lock volume with no marker, named by the wave that lists it


def claim_of(monkeypatch, waves, volumes=(), age=1.0):
    """claim_abandoned of machine web in a registry holding ``waves`` ({key: body, None when unreadable}) and the
    other ``volumes``, for a claim of ``age`` seconds."""
    docs = Documents(waves)
    names = ["pool.1.json", "hold-web.lock"] + ["%s.1.json" % key for key in waves] + list(volumes)
    monkeypatch.setattr(adm.documents, "Registry", lambda conn, pool, identity=None: docs)
    return adm.claim_abandoned(None, Listed(names), "web", age, ME)


def test_a_claim_listed_in_a_live_wave_of_this_controller_is_kept_however_old(monkeypatch):
    assert claim_of(monkeypatch, {journal.wave_key(ME, 4): {"machines": {"web": []}}}, age=3600) is False


def test_a_claim_listed_only_in_a_dead_wave_is_abandoned_at_once(monkeypatch):
    controller, start = ME.controller, ME.start
    dead = "wave-%s-%d-%s-2" % (controller, a_dead_pid(), start)
    assert claim_of(monkeypatch, {dead: {"machines": {"web": []}}}, age=0.1) is True


def test_a_wave_of_another_controller_is_live_while_its_process_holds_the_admission_lock(monkeypatch):
    wave = {"wave-0123456789ab-77-9-3": {"machines": {"web": []}}}
    holder = keys.ADMISSION_HOLDER_PREFIX + "0123456789ab.77.9.140"
    assert claim_of(monkeypatch, wave, [keys.ADMISSION_LOCK, holder], age=3600) is False
    # its process let the lock go (or another holds it now): the wave is a dead run's
    other = keys.ADMISSION_HOLDER_PREFIX + "0123456789ab.78.9.140"
    assert claim_of(monkeypatch, wave, [keys.ADMISSION_LOCK, other], age=0.1) is True


def test_an_unreadable_live_wave_may_list_the_machine(monkeypatch):
    assert claim_of(monkeypatch, {journal.wave_key(ME, 4): None}, age=3600) is False


def test_a_claim_no_wave_lists_is_abandoned_once_markerless_long_enough(monkeypatch):
    other = {journal.wave_key(ME, 4): {"machines": {"db": []}}}  # a live wave of other machines does not hold web
    assert claim_of(monkeypatch, other, age=locks.MARKERLESS_SECONDS - 1) is False
    assert claim_of(monkeypatch, other, age=locks.MARKERLESS_SECONDS + 1) is True


def test_a_machine_hold_asks_the_waves_about_a_markerless_lock(monkeypatch):
    asked = []
    monkeypatch.setattr(adm, "claim_abandoned", lambda conn, pool, machine, age, identity: asked.append((machine, age)) or 1)
    hold = holds.machine_hold(None, "web", 5, registry=documents.Registry(None, Listed()))
    assert hold.name == "hold-web.lock" and hold.abandoned(locks.View(2, [], [1, 2], [], 2.0)) == 1
    assert asked == [("web", 2.0)]
    # a lock with its holder's marker (another controller's here) is judged by the marker, as before
    foreign = [keys.hold_prefix("web") + "g2.0123456789ab.1.2.3"]
    assert hold.abandoned(locks.View(2, foreign, [1, 2], foreign, 2.0)) is False
    assert asked == [("web", 2.0)]


def test_cleaning_a_dead_wave_removes_its_creates_claims_but_not_this_processs_or_a_held_machines(held, monkeypatch):
    controller, start = ME.controller, ME.start
    dead = keys.hold_prefix("w") + "%s.%d.%s.1" % (controller, a_dead_pid(), start)
    docs = Documents({"wave-dead-1-2-3": {"machines": {"w": ["w-root.qcow2"], "x": ["x-root.qcow2"],
                                                       "y": ["y-root.qcow2"], "z": ["z-root.qcow2"]}}},
                     ["hold-w.lock", dead, "hold-x.lock", "hold-y.lock", "hold-z.lock",
                      keys.hold_prefix("z") + "0123456789ab.1.2.3"])
    deleted = []
    monkeypatch.setattr(locks.VolumeLock, "clear_if_abandoned", lambda self, view=None: deleted.append(self.name))
    journal.clean_waves(Ctx(docs), ["wave-dead-1-2-3"], 5, {"y"}, ME)
    # y is this process's create; z is held by a run that cannot be told dead; w's hold, with a dead marker, is
    # the run's clean-up's to break (clear_dead_holds), its volumes go with the wave
    assert deleted == ["hold-x.lock"]
    assert held.cleaned == [("w", ("w-root.qcow2",), True), ("x", ("x-root.qcow2",), True)]
    assert docs.deleted == ["wave-dead-1-2-3"]


def test_an_admission_passes_this_processs_claims_to_the_clean_up(held, monkeypatch):
    docs = Documents({"wave-dead-1-2-3": {"machines": {"x": ["x-root.qcow2"]}}}, ["hold-x.lock"])
    ctx = Ctx(docs)
    admission, _hold = held(ctx)
    ctx.coordination.admissions.claimed[ctx.uri] = {"x"}
    admission.journal("a", ["a-root.qcow2"])
    assert held.cleaned == [] and docs.deleted == ["wave-dead-1-2-3"]


def test_a_claim_on_a_pool_without_a_registry_holds_nothing(held):
    admission, hold = held(Ctx(Documents({})))
    hold.lock = None
    assert admission.claim("a") is True
    admission.unclaim("a", True)


def test_a_runs_clean_up_breaks_only_holds_whose_holders_are_gone(monkeypatch):
    """clear_dead_holds: a hold whose every marker names a gone process of this controller, or a create's claim
    (no marker), is looked at and broken if still abandoned; a live or foreign holder's is left; a dead marker
    beside no lock goes."""
    controller, start = ME.controller, ME.start
    dead = "%s.%d.%s.1" % (controller, a_dead_pid(), start)
    live = "%s.%d.%s.1" % (controller, os.getpid(), start)
    names = ["hold-a.lock", "hold-a.holder." + dead,                   # killed while it held a
             "hold-b.lock", "hold-b.holder." + live,                   # held by this process
             "hold-c.lock", "hold-c.holder.0123456789ab.1.2.3",        # another controller's
             "hold-d.lock",                                            # a create's claim
             "hold-e.holder." + dead,                                  # a dead waiter's marker
             "pool.1.json", "admission.lock"]
    broken, deleted = [], []
    marked = {"hold-a.lock": ["hold-a.holder." + dead]}
    monkeypatch.setattr(locks.VolumeLock, "observe",
                        lambda self: locks.View(2, marked.get(self.name, []), [1, 2], [], 0.0))
    monkeypatch.setattr(locks.VolumeLock, "clear_if_abandoned", lambda self, view=None: broken.append(self.name))
    monkeypatch.setattr(locks.VolumeLock, "clear_unnamed", lambda self, view: broken.append(self.name + " unnamed"))
    monkeypatch.setattr(holds.volumes, "delete_quietly", lambda pool, name: deleted.append(name))
    holds.clear_dead_holds(None, Listed(names), names, ME)
    assert broken == ["hold-a.lock", "hold-d.lock unnamed"]
    assert deleted == ["hold-e.holder." + dead]


def test_a_name_the_holds_listing_lacks_needs_no_lookup(held):
    admission, hold = held(Ctx(Documents({})))
    hold.names = None  # a pool without a registry: nothing was listed, anything may be there
    assert admission.may_exist("web") is True
    hold.names = {"db"}
    assert admission.may_exist("web") is False and admission.may_exist("db") is True


def test_a_create_steps_aside_after_its_define_keeping_its_share(held, monkeypatch):
    """The start that follows a create lets the process's next create onto the pool in; the share (and so the
    wave) stays until the admission leaves."""
    admission, hold = held(Ctx(Documents({})))
    admission.table.names.add("web")
    hold.names, hold.users = {"db"}, 1
    admission.target = admission.table.target(admission.ctx.uri)
    admission.target.acquire()
    admission.named, admission.name = True, "web"
    admission.step_aside()
    assert not admission.table.target(admission.ctx.uri).locked()
    assert "web" not in admission.table.names and hold.names == {"db", "web"}
    assert hold.users == 1 and hold.held  # still shared: the wave stays
    admission.step_aside()  # twice, or then left: nothing more to give back
    assert admission.target is None and not admission.named

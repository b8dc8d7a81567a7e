"""A world in which the protocol's real classes run against an in-memory stand-in for the storage calls they make,
one call at a time, in an order an explorer chooses (test_protocol_model.py for the locks, test_document_model.py
for the registry's documents).

Every actor is a thread running real code (locks.VolumeLock and its callers) with a store of its own over the
world's volumes (``Store``: create exclusive, delete, resize, capacity, list, lookup). Each store call first
stops at a point where the actor waits for the explorer: the explorer lets one actor make its next call, kills an
actor there (its thread raises ``Killed`` and makes no further call), or lets time pass on the clock every actor
reads (a pause of whoever is not let go meanwhile). Nothing else in the code is replaced: the lock, its waits,
its lease judgement and its messages are the ones the modules run.
"""

import threading

from ansible_collections.machinery.compute.plugins.module_utils.coordination import keys
from ansible_collections.machinery.compute.plugins.module_utils.coordination import locks

LOCK = keys.hold_volume("web")
PREFIX = keys.hold_prefix("web")
LEASE = 30.0


class Killed(BaseException):
    """Raised in an actor's thread where the explorer kills it (a BaseException: no ``except`` of the code
    catches it, as no code runs on after SIGKILL)."""


class Store:
    """The storage calls of volumes.PoolStore, over the world's volumes, each one a point of the schedule."""

    def __init__(self, world, actor):
        self.world = world
        self.actor = actor

    def _call(self, what, name):
        self.actor.point((what, name))
        self.world.steps += 1
        if what in ("create", "delete", "resize"):
            self.world.version += 1  # a waiter reading the lock again may now see something new
        return self.world.volumes

    def _saw(self, what, name, result):
        self.actor.history.append((what, name, result))
        return result

    def create(self, name):
        volumes = self._call("create", name)
        if name in volumes:
            return self._saw("create", name, False)
        volumes[name] = 1
        if keys.slot_generation(name, LOCK):
            self.actor.created = self.world.steps  # where a hold it goes on to take begins
            self.world.events.append(("created", self.actor.name))
        return self._saw("create", name, True)

    def delete(self, name):
        self._saw("delete", name, self._call("delete", name).pop(name, None))

    def capacity(self, name):
        return self._saw("capacity", name, self._call("capacity", name).get(name))

    def resize(self, name, capacity):
        volumes = self._call("resize", name)
        if name not in volumes:
            return self._saw("resize", name, False)
        volumes[name] = capacity
        return self._saw("resize", name, True)

    def names(self):
        return self._saw("list", None, tuple(sorted(self._call("list", None))))

    def refresh(self):
        pass

    def exists(self, name):
        return self._saw("lookup", name, name in self._call("lookup", name))

    def present(self, name):
        return self.exists(name)


class Documents:
    """The storage calls of volumes.DocumentStore (what documents.Registry makes) over a dict of volumes
    {name: bytes}. ``point(call)`` runs before each call that reads or changes the volumes (a model's actor stops
    there) and ``saw(call, result)`` after it. A commit is one call, as libvirt's copy into a new volume is one
    call whose result is whole."""

    def __init__(self, volumes=None, point=None, saw=None):
        self.volumes = volumes if volumes is not None else {}
        self.point = point or (lambda _call: None)
        self.saw = saw or (lambda _call, result: result)

    def listing(self):
        self.point(("list", None))
        return self.saw(("list", None), sorted(self.volumes))

    def refresh(self, _flags=0):
        return True  # the stand-in's listing is never short

    def read(self, name, _limit):
        self.point(("read", name))
        return self.saw(("read", name), self.volumes.get(name))

    def stage(self, name, data):
        self.point(("stage", name))
        self.volumes[name] = bytes(data)
        self.saw(("stage", name), None)

    def commit(self, name, staged, _size):
        self.point(("commit", name))
        made = name not in self.volumes
        if made:
            self.volumes[name] = self.volumes[staged]
        return self.saw(("commit", name), made)

    def discard(self, name):
        self.point(("delete", name))
        self.saw(("delete", name), self.volumes.pop(name, None) is not None)

    def delete_when_read(self, name):
        self.discard(name)

    def prune(self, name):
        self.discard(name)
        return True


class Identity:
    """Who an actor is, as its markers name it: a controller, a pid. Its liveness is seen only from its own
    controller (where its pid can be looked up), as locks.Identity sees it."""

    def __init__(self, world, controller, pid):
        self.world = world
        self.controller = controller
        self.pid = pid
        self.start = "1"
        self._stagings = 0

    def next_staging(self):
        self._stagings += 1
        return self._stagings

    def marker(self, prefix, generation, tag=""):
        return keys.holder_marker(prefix, generation, self.controller, self.pid, self.start, 0, tag)

    def is_dead(self, marker, prefix):
        try:
            controller, pid = keys.marker_fields(marker, prefix)[:2]
        except ValueError:
            return None
        if controller != self.controller:
            return None
        return (controller, int(pid)) in self.world.killed


class Actor:
    """One run: a thread executing ``script(actor)`` that stops before each store call until it is let go."""

    def __init__(self, world, name, controller, script):
        self.world = world
        self.name = name
        self.identity = Identity(world, controller, len(world.actors) + 100)
        self.script = script
        self.store = Store(world, self)
        self.documents = Documents(world.volumes, self._document_call, self._document_result)
        self.state = "new"  # ready (stopped at a point) | done | killed | failed
        self.pending = None
        self.error = None
        self.kill = False
        self.created = None  # the step of its last create of a generation of the lock
        self.read_at = None  # the world's version when it last listed the volumes
        self.history = []  # every call it made and what it got, every clock reading: all its code depends on
        self._go = threading.Semaphore(0)
        self._stopped = threading.Semaphore(0)
        self._thread = threading.Thread(target=self._main, daemon=True)

    def lock(self, **options):
        """A lock of this actor's, as holds.machine_hold makes them, on the world's store and clock."""
        options.setdefault("lease", LEASE)
        options.setdefault("clock", self.read_clock)
        options.setdefault("timeout", 10 ** 6)
        return locks.VolumeLock(None, None, name=LOCK, holder_prefix=PREFIX, what="the hold on machine web",
                                identity=self.identity, store=self.store,
                                sleep=lambda _seconds: None, renew=False, tag=".volume_attach.0.%s" % self.name,
                                **options)

    def _document_call(self, call):
        self.point(call)
        self.world.steps += 1
        if call[0] in ("stage", "commit", "delete"):
            self.world.version += 1

    def _document_result(self, call, result):
        self.history.append((call, result if not isinstance(result, list) else tuple(result)))
        return result

    def read_clock(self):
        now = self.world.now
        self.history.append(("clock", now))
        return now

    def point(self, call):
        if self.kill:
            raise Killed()
        self.pending, self.state = call, "ready"
        self._stopped.release()
        self._go.acquire()
        if self.kill:
            raise Killed()
        self.state = "running"

    def _main(self):
        self._go.acquire()
        try:
            self.script(self)
            self.state = "done"
        except Killed:
            self.state = "killed"
        except Exception as exc:  # pylint: disable=broad-except
            self.error, self.state = exc, "failed"
        self._stopped.release()

    def begin(self):
        self._thread.start()
        self._go.release()
        self._stopped.acquire()

    def blocked(self):
        """Whether its next call lists the volumes again with nothing changed since it last did: it would read
        what it read and decide what it decided (a waiter's poll), so the explorer lets time pass instead."""
        return self.pending == ("list", None) and self.read_at == self.world.version

    def step(self):
        if self.pending == ("list", None):
            self.read_at = self.world.version
        self._go.release()
        self._stopped.acquire()
        self.world.states.add(tuple(sorted(self.world.volumes.items())))

    def die(self):
        self.kill = True
        self.world.killed.add((self.identity.controller, self.identity.pid))
        self._go.release()
        self._stopped.acquire()


class World:
    """The volumes, the clock, the actors, and what the properties need: which hold was taken when, and every
    check a holder passed."""

    def __init__(self):
        self.volumes = {}
        self.now = 1000.0
        self.killed = set()
        self.actors = []
        self.steps = 0
        self.version = 0  # counts the changes of the volumes and the clock
        self.states = set()  # every set of volumes the schedule went through
        self.events = []  # the order of creates of a generation, holds taken and checks passed
        self.holds = []  # (step, actor, number) of every hold taken: the step of its generation's create
        self.checks = []  # (step, actor, number of its hold) of every check a holder passed

    def clock(self):
        return self.now

    def signature(self):
        """Everything the world's future depends on: the volumes, the clock, who was killed, what each run has
        seen (its code is a function of that) and where it stands, and the order of the events the properties
        judge."""
        return (tuple(sorted(self.volumes.items())), self.now, frozenset(self.killed),
                tuple((actor.state, actor.pending, actor.read_at == self.version, tuple(actor.history))
                      for actor in self.actors), tuple(self.events))

    def tick(self, seconds):
        self.now += seconds
        self.version += 1

    def add(self, name, controller, script):
        actor = Actor(self, name, controller, script)
        self.actors.append(actor)
        return actor

    def took(self, actor):
        """``actor``'s acquire returned: it holds the lock since it created that generation."""
        self.holds.append((actor.created, actor.name, len(self.holds)))
        self.events.append(("took", actor.name))
        return len(self.holds) - 1

    def checked(self, actor, number):
        """``actor`` passed its check before a write, under its hold ``number``."""
        self.checks.append((self.steps, actor.name, number))
        self.events.append(("checked", actor.name))

    def violations(self):
        """Every write made while another run held the lock: a check passed after another hold was taken since
        the writer's own (a hold taken since is a take-over, or a new start after one: the writer's is gone)."""
        found = []
        for step, name, number in self.checks:
            taken = self.holds[number][0]
            for other_step, other, other_number in self.holds:
                if other_number != number and taken < other_step < step:
                    found.append("%s wrote at step %d after %s took the lock at step %d"
                                 % (name, step, other, other_step))
        return found

    def ready(self):
        return [actor for actor in self.actors if actor.state == "ready"]

    def start(self):
        for actor in self.actors:
            actor.begin()

    def finish(self):
        """Kill whatever is still running (a schedule's end) so no thread outlives its world."""
        for actor in self.actors:
            if actor.state == "ready":
                actor.die()


def holder(writes=2):
    """A run that takes the lock, checks it holds it before each of ``writes`` writes (renewing between), and
    lets it go."""
    def script(actor):
        lock = actor.lock()
        lock.acquire()
        number = actor.world.took(actor)
        try:
            for _write in range(writes):
                if not lock.still_held():
                    return
                actor.world.checked(actor, number)
                lock.renew()
        finally:
            lock.release()
    return script


def explore(build, choices, apply, used, key, each, max_steps):
    """Every schedule within the bounds ``choices`` keeps to, stateless as CHESS explores: each one is replayed from
    the start (``build()`` a new world; ``used()`` what the schedule has spent of the bounds), ``choices(world,
    spent)`` lists what may happen next (the first is taken, the others explored later), ``apply(world, choice,
    spent)`` makes it happen, and a schedule that reaches a state an earlier one reached (``key(world, spent)``)
    ends there: what follows was explored then. ``each(world, schedule)`` judges each ended schedule (its world
    finished); a true answer ends the exploration with it. Returns (schedules, distinct states, that answer)."""
    pending, schedules, seen = [[]], 0, set()
    while pending:
        prefix = pending.pop()
        world = build()
        world.start()
        spent = used()
        for choice in prefix:
            apply(world, choice, spent)
        taken = list(prefix)
        while len(taken) < max_steps:
            state = key(world, spent)
            if state in seen:
                break
            seen.add(state)
            found = choices(world, spent)
            if not found:
                break
            pending.extend(taken + [other] for other in found[1:])
            apply(world, found[0], spent)
            taken.append(found[0])
        world.finish()
        schedules += 1
        answer = each(world, taken)
        if answer:
            return schedules, len(seen), answer
    return schedules, len(seen), None

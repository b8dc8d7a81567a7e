"""The hold protocol checked on its own code: the explorer drives locks.VolumeLock (the class every hold, claim,
admission and upload lock is) against an in-memory stand-in for the five storage calls it makes
(protocol_world.py), choosing at every call who goes next, whom to kill there, and when a lease's worth of time
passes for everyone who is not let go (a pause).

Exhaustive over a bounded space (stateless, as CHESS explores: each schedule is replayed from the start, and a
schedule switches away from a run that could go on at most PREEMPTIONS times), then seeded random schedules of
more runs. What it checks:
- safety, in every schedule: no run passes its check before a write once another run has taken the lock after
  it took its own (a take-over, or a new start after one). This holds whatever the pauses: the store decides who
  holds (the exclusive create of a generation), not a reading of the clock. The one assumption is that a write
  follows its check with no pause as long as a lease: a check is the last store call before the write;
- liveness: behind a killed holder, 1, 2, 4 and 6 waiters on two controllers all get the lock, the first within
  two leases of the holder's last renewal, and every waiter names the real holder while it waits;
- nothing is left once every run is done but what a killed run left.
"""

import os
import random
import time

import pytest
import protocol_world as pw

from ansible_collections.machinery.compute.plugins.module_utils.coordination import locks

TICK = pw.LEASE * 0.6  # two ticks make a lease pass unrenewed; one makes a markerless lock abandoned
MAX_STEPS = 160
WRITES = ("create", "delete", "resize")


class Bounds:
    def __init__(self, preemptions, kills, ticks):
        self.preemptions, self.kills, self.ticks = preemptions, kills, ticks
        self.last = None


def options(world, bounds, used):
    """The choices at this point of a schedule, the one that goes on without a switch first."""
    ready = world.ready()
    enabled = [actor for actor in ready if not actor.blocked()]
    found = []
    last = world.actors[used.last] if used.last is not None else None
    if last in enabled:
        found.append(("step", world.actors.index(last)))
    for actor in enabled:
        if actor is not last and (last not in enabled or used.preemptions < bounds.preemptions):
            found.append(("step", world.actors.index(actor)))
    # a kill or a pause matters only before a call that changes the store (one before a read is the same, for
    # every other run, as one before the next write; the liveness tests kill between reads), and time matters
    # only to a run that reads the clock after it: they are offered where a run is about to write, or when
    # every run left only polls
    writing = [actor for actor in ready if actor.pending[0] in WRITES]
    if used.ticks < bounds.ticks and (writing or (ready and not enabled)):
        found.append(("tick",))
    if used.kills < bounds.kills:
        found.extend(("kill", world.actors.index(actor)) for actor in writing)
    return found


def apply(world, choice, used):
    if choice[0] == "tick":
        used.ticks += 1
        world.tick(TICK)
        return
    actor = world.actors[choice[1]]
    if choice[0] == "kill":
        used.kills += 1
        actor.die()
        return
    if used.last is not None and choice[1] != used.last and world.actors[used.last] in world.ready() \
            and not world.actors[used.last].blocked():
        used.preemptions += 1
    used.last = choice[1]
    actor.step()


def explore(build, bounds):
    """Every schedule within ``bounds``: (schedules, distinct states, violations found). A schedule that reaches
    a state an earlier one reached (``World.signature`` and the bounds used) ends there: what follows from it was
    explored then."""
    states, violations = set(), []

    def judged(world, taken):
        failed = [actor for actor in world.actors if actor.state == "failed"]
        assert not failed, (failed[0].name, failed[0].error, taken)
        violations.extend((found, taken) for found in world.violations())
        states.update(world.states)

    schedules, seen, _answer = pw.explore(
        build, lambda world, used: options(world, bounds, used), apply, lambda: Bounds(0, 0, 0),
        lambda world, used: (world.signature(), used.preemptions, used.kills, used.ticks, used.last), judged,
        MAX_STEPS)
    return schedules, seen, violations


def two_controllers():
    world = pw.World()
    world.add("a", "ctl-a", pw.holder())
    world.add("b", "ctl-b", pw.holder())
    return world


def three_runs():
    world = pw.World()
    world.add("a", "ctl-a", pw.holder())
    world.add("b", "ctl-b", pw.holder())
    world.add("c", "ctl-a", pw.holder(writes=1))
    return world


def holder_and_cleanup():
    """Two runs beside another run's clean-up (VolumeLock.clear_abandoned: take over and let go at once what a
    dead holder of its own controller left, and an anchor left alone)."""
    world = pw.World()
    world.add("a", "ctl-a", pw.holder())

    def cleanup(actor):
        actor.lock().clear_abandoned()
    world.add("clean", "ctl-a", cleanup)
    world.add("b", "ctl-b", pw.holder(writes=1))
    return world


# MACHINERY_MODEL=full (make unit's first run) explores more; the runs under the other ansible-cores, less
FULL = os.environ.get("MACHINERY_MODEL") == "full"
BOUNDS = {
    "two-controllers": (two_controllers, Bounds(preemptions=1 if FULL else 0, kills=1, ticks=2)),
    "three-runs": (three_runs, Bounds(preemptions=0, kills=1 if FULL else 0, ticks=1)),
    "clean-up": (holder_and_cleanup, Bounds(preemptions=0, kills=1, ticks=2 if FULL else 1)),
}


@pytest.mark.parametrize("case", sorted(BOUNDS))
def test_no_run_writes_once_another_took_the_lock_in_any_schedule(case):
    build, bounds = BOUNDS[case]
    began = time.monotonic()
    schedules, states, violations = explore(build, bounds)
    print("%s: %d schedules, %d states, %.1f s" % (case, schedules, states, time.monotonic() - began))
    assert schedules > 50 and states > 100
    assert violations == []


def random_world(rng, runs):
    world = pw.World()
    for index in range(runs):
        world.add("r%d" % index, "ctl-%s" % "ab"[index % 2], pw.holder(writes=rng.choice([1, 2])))
    return world


def random_schedules(count, seed=49):
    """``count`` random schedules of 3 to 5 runs on two controllers, with up to two kills and six pauses each:
    (schedules with a violation, distinct states of the volumes)."""
    rng = random.Random(seed)
    failing, states = 0, set()
    for _schedule in range(count):
        world = random_world(rng, rng.choice([3, 4, 5]))
        world.start()
        used, kills = Bounds(0, 0, 0), 0
        for _step in range(MAX_STEPS * 2):
            found = options(world, Bounds(preemptions=10 ** 6, kills=2, ticks=6), used)
            if not found:
                break
            choice = rng.choice(found)
            if choice[0] == "kill":
                if kills >= 2 or rng.random() < 0.8:
                    continue
                kills += 1
            apply(world, choice, used)
        world.finish()
        assert not [actor for actor in world.actors if actor.state == "failed"]
        failing += bool(world.violations())
        states |= world.states
    return failing, len(states)


def test_random_schedules_of_many_runs_on_two_controllers():
    failing, states = random_schedules(1000 if FULL else 300)
    assert failing == 0 and states > 20


def _take_unconfirmed(self, view):
    """locks.VolumeLock.take less its confirmation that the generation taken over is still there."""
    generation = 2 if view is None else view.top + 1
    if view is None and not self.store.create(self.slot(1)):
        return False
    if not self.store.create(self.slot(generation)):
        return False
    self.generation, self.lost, self.capacity = generation, False, 1
    self.marker = self.identity.marker(self.holder_prefix, generation, self.tag)
    self.store.create(self.marker)
    return True


def _held_by_own_volumes(self):
    """locks.VolumeLock.still_held as it was before generations: its own volume and marker are there."""
    return self.store.present(self.slot(self.generation)) and self.store.present(self.marker)


@pytest.mark.parametrize("method, broken", [("take", _take_unconfirmed), ("still_held", _held_by_own_volumes)])
def test_the_explorer_finds_the_fault_of_a_lock_without_its_fence(method, broken, monkeypatch):
    """The check can fail: with the confirmation of a take or the holder's look for a newer generation left out,
    a run writes after another took the lock over, and random schedules find it."""
    monkeypatch.setattr(locks.VolumeLock, method, broken)
    failing, _states = random_schedules(300)
    assert failing > 0


@pytest.mark.parametrize("waiters", [1, 2, 4, 6])
def test_waiters_behind_a_killed_holder_all_get_the_lock_within_two_leases(waiters):
    """A holder on a third controller is killed while it holds; ``waiters`` runs (half of them on another
    controller) wait for the lock, polling in turn while time passes a third of a lease at a time. All of them
    get it, the first within two leases of the holder's last renewal, and each names the killed run as the
    holder while it waits."""
    world = pw.World()
    named = []

    def waiter(actor):
        def waiting(marker, _seconds):
            named.append((actor.name, marker))
        lock = actor.lock(waiting=waiting)
        lock.acquire()
        number = world.took(actor)
        if lock.still_held():
            world.checked(actor, number)
        lock.release()

    holder = world.add("holder", "ctl-c", pw.holder(writes=1))
    for index in range(waiters):
        world.add("w%d" % index, "ctl-%s" % "ab"[index % 2], waiter)
    world.start()
    while holder.state == "ready" and holder.pending[0] != "lookup":  # up to its check: it holds, renewed
        holder.step()
    assert world.holds and world.holds[0][1] == "holder"
    renewed = world.now
    holder.die()
    first = None
    for _round in range(400):
        ready = world.ready()
        if not ready:
            break
        enabled = [actor for actor in ready if not actor.blocked()]
        if not enabled:
            world.tick(pw.LEASE / 3)
            continue
        for actor in enabled:
            actor.step()
        if first is None and len(world.holds) > 1:
            first = world.now - renewed
    assert [actor.state for actor in world.actors[1:]] == ["done"] * waiters
    assert first is not None and first <= 2 * pw.LEASE
    assert world.violations() == []
    holders = {marker.split(".")[-1] for _name, marker in named if marker}
    assert "holder" in holders and holders <= {"holder"} | {"w%d" % index for index in range(waiters)}
    # the killed holder's anchor went with the last hold; its marker went with the first take-over
    assert world.volumes == {}


def test_a_waiter_leaves_nothing_in_the_store():
    """While it waits a waiter only reads: the volumes are the holder's alone, however many wait."""
    world = pw.World()
    holder = world.add("holder", "ctl-a", pw.holder(writes=1))
    for index in range(3):
        world.add("w%d" % index, "ctl-b", pw.holder(writes=1))
    world.start()
    while holder.pending[0] != "lookup":
        holder.step()
    held = dict(world.volumes)
    for _round in range(5):
        for actor in world.ready()[1:]:
            if not actor.blocked():
                actor.step()
    assert world.volumes == held
    world.finish()


@pytest.mark.parametrize("listed_first", [True, False])
def test_a_lock_let_go_by_its_own_thread_while_another_thread_checks_it_fences_nothing(listed_first):
    """A batch's thread with no claim of its own checks every claim of the run before it writes (the wave); one
    claim is let go by its thread in the middle of that check. The check is not a take-over: it passes, and it
    does not fail on the generation the release forgot (a TypeError the lab's inventory fleet met)."""
    world = pw.World()
    actor = world.add("a", "ctl-a", lambda _actor: None)
    volumes = {}

    class Releasing:
        """The lock's store, letting the lock go (another thread) right after the checker listed once."""

        def __init__(self):
            self.volumes = volumes

        def create(self, name):
            if name in self.volumes:
                return False
            self.volumes[name] = 1
            return True

        def delete(self, name):
            self.volumes.pop(name, None)

        def names(self):
            listed = sorted(self.volumes)
            if releasing:
                releasing.pop()
                lock.release()
            return listed if listed_first else sorted(self.volumes)

        def present(self, name):
            return name in self.volumes

        exists = present

        def capacity(self, name):
            return self.volumes.get(name)

        def resize(self, name, capacity):
            return False

        def refresh(self):
            pass

    releasing = []
    lock = locks.VolumeLock(None, None, name=pw.LOCK, holder_prefix=pw.PREFIX, what="a claim", identity=actor.identity,
                            store=Releasing(), sleep=lambda _seconds: None, renew=False, named=False, timeout=1)
    lock.acquire()
    assert lock.still_held() and lock.generation == 2
    releasing.append(True)
    # released in the middle: after the listing (which had the generation) or before it (which had none)
    assert lock.still_held()
    assert lock.generation is None and not lock.lost and volumes == {}

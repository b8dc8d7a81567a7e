"""An exhaustive model of the hold protocol (coordination/holds.py, locks.VolumeLock), explored over every
interleaving of two or three controllers, each of which may crash after any step or be paused (SIGSTOP) between
any two, with a waiter's clock that only it reads (so skew does not exist for it; only rates, bounded below).

Why a Python explorer and not spin: the model is small (a few thousand states), it runs inside `make test` with
the unit tests and needs no package beyond pytest, and its steps are named after the code's (``HOLDER_STEPS``,
``WAITER_STEPS``), which a test compares, so the model cannot drift from the code unnoticed.

What it checks, in every reachable state:
- a controller acts on the machine only while it holds the lease (no two act on one machine at once),
  as long as a pause between a holder's check and its step is shorter than a lease: the assumption
  docs/concurrency.md states; with longer pauses the explorer finds the one gap it documents;
- a crashed or paused holder never blocks the others for good: a waiter takes over after a lease;
- recovery leaves no orphan: when every live controller is done, no lock or marker is left but a crashed
  controller's, which the next waiter breaks.
"""

from collections import deque

from ansible_collections.machinery.compute.plugins.module_utils.coordination import holds

LEASE = 3  # ticks of a waiter's clock without a change before it breaks the lock
RENEW = 1  # a running holder renews at least every RENEW ticks (a third of the lease in the code)

# a controller's position
START, MARKED, HOLDING, CHECKED, ACTED, DONE, STOPPED, CRASHED, WAITING = range(9)
FINISHED = (DONE, STOPPED, CRASHED)
HOLDS = (HOLDING, CHECKED, ACTED)


def initial(count):
    # shared: the lock's holder (or None) and the markers; per controller: (pc, paused, changed, waited,
    # since_renew). ``changed``: the lock changed since this waiter last looked (the code compares the lock's
    # size and markers; a renewal grows the size, so no change is ever undone and a flag is enough)
    return (None, frozenset(), tuple((START, False, False, 0, 0) for _index in range(count)))


def _changed(procs):
    """Every waiter will see a change of the lock when it next looks."""
    return tuple((p[0], p[1], True if p[0] == WAITING else p[2], p[3], p[4]) for p in procs)


def successors(state, max_pause, crashes=True):
    """(step name, next state) of every move any controller can make from ``state``."""
    lock, markers, procs = state
    out = []

    def put(name, index, proc, new_lock=lock, new_markers=markers, change=False):
        changed = procs[:index] + (proc,) + procs[index + 1:]
        out.append((name, (new_lock, new_markers, _changed(changed) if change else changed)))

    # time passes only while every holder of the lock is within its bound since its last renewal: a running one
    # renews every RENEW ticks, a paused one goes at most ``max_pause`` ticks without a renewal
    time_may_pass = all(p[4] < (max_pause if p[1] else RENEW) for i, p in enumerate(procs)
                        if p[0] in HOLDS and lock == i)
    for index, proc in enumerate(procs):
        pc, paused, changed, waited, since_renew = proc
        if pc in FINISHED:
            continue
        if crashes:
            put("crash", index, (CRASHED, False, False, 0, 0))
        if paused:
            put("resume", index, (pc, False, changed, waited, since_renew))
            continue
        if max_pause:
            put("pause", index, (pc, True, changed, waited, since_renew))
        if pc == START:
            put("mark", index, (MARKED, False, False, 0, 0), new_markers=markers | {index}, change=True)
        elif pc == MARKED:  # named first, then the lock: taken, or refused and the marker deleted again
            if lock is None:  # a break meanwhile may have deleted its marker: the holder names itself again
                put("take", index, (HOLDING, False, False, 0, 0), new_lock=index, new_markers=markers | {index},
                    change=True)
            else:
                put("take", index, (WAITING, False, True, 0, 0), new_markers=markers - {index})
        elif pc == WAITING:
            if lock is None:
                put("watch", index, (START, False, False, 0, 0))
            elif changed:
                put("watch", index, (WAITING, False, False, 0, 0))
            elif waited >= LEASE:  # a whole lease without a change, on this waiter's own clock
                put("break", index, (START, False, False, 0, 0), new_lock=None, new_markers=frozenset(),
                    change=True)
            elif time_may_pass:  # one tick of this waiter's own clock
                out.append(("tick", (lock, markers, tuple(
                    (p[0], p[1], p[2], p[3] + 1 if i == index else p[3],
                     p[4] + 1 if i == lock and p[0] in HOLDS else 0) for i, p in enumerate(procs)))))
        elif pc in HOLDS:
            if lock == index:
                put("renew", index, (pc, False, False, 0, 0), change=True)
            if pc == HOLDING:
                held = lock == index and index in markers
                put("check", index, (CHECKED if held else STOPPED, False, False, 0, since_renew),
                    new_markers=markers if held else markers - {index})
            elif pc == CHECKED:
                put("act", index, (ACTED, False, False, 0, since_renew))
            else:
                put("release", index, (DONE, False, False, 0, 0), new_lock=None if lock == index else lock,
                    new_markers=markers - {index}, change=True)
    return out


def explore(count, max_pause, crashes=True):
    """Every reachable state: (states, the first violation found or None)."""
    start = initial(count)
    seen = {start}
    queue = deque([start])
    while queue:
        state = queue.popleft()
        lock, markers, procs = state
        moves = successors(state, max_pause, crashes)
        for name, following in moves:
            if name == "act":
                actor = next(i for i, (a, b) in enumerate(zip(procs, following[2])) if a != b)
                if lock != actor:
                    return len(seen), ("acted without the lease", state)
            if following not in seen:
                seen.add(following)
                queue.append(following)
        if not moves:  # every controller done, stopped or crashed
            crashed = {i for i, p in enumerate(procs) if p[0] == CRASHED}
            if (lock is not None and lock not in crashed) or not markers <= crashed:
                return len(seen), ("orphan left", state)
        elif all(p[0] == WAITING or p[0] in FINISHED for p in procs) and \
                not any(name in ("take", "break", "tick", "watch") for name, _following in moves) and \
                not any(p[1] for p in procs):
            return len(seen), ("a waiter blocked for good", state)
    return len(seen), None


def test_the_model_is_made_of_the_codes_steps():
    model = {"mark", "take", "renew", "check", "act", "release", "watch", "break"}
    assert model == set(holds.HOLDER_STEPS) | set(holds.WAITER_STEPS)


def test_two_and_three_controllers_crashing_and_paused_within_the_assumed_bound():
    # a holder never more than a lease minus one tick without a renewal, pauses included: the assumption
    for count in (2, 3):
        states, violation = explore(count, max_pause=LEASE - 1)
        assert violation is None, violation
        assert states > 100
        print("%d controllers: %d states" % (count, states))


def test_a_pause_longer_than_a_lease_is_the_gap_the_docs_name():
    # the explorer can fail: paused past its lease between its check and its step, a holder acts after a taker
    states, violation = explore(2, max_pause=LEASE + 1, crashes=False)
    assert violation is not None and violation[0] == "acted without the lease", (states, violation)

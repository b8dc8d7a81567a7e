"""An exhaustive model of registry document writes (documents.Registry.put with ``expect``), explored over every
interleaving of two or three writers, each of which may crash after any step.

A document is stored as generations ``<key>.<n>.json``; a reader takes the newest complete one. A writer reads
(outside any lock), then, under the host's admission lock (test_protocol_model.py explores the lock itself):
checks that no complete generation newer than the one it read exists, creates generation n+1 (create-exclusive),
uploads its body and prunes the older generations. A writer whose check fails reads again and re-applies its
change once, then gives up as a conflict. A crash between create and upload leaves a generation that cannot be
read; the next writer ignores it.

The document's body is the set of the changes applied to it (each writer adds its own), so a lost update is
visible: when every writer is finished, each one that reported success must find its change in the newest
complete generation. The same explorer with the check left out (the last writer wins, as before compare and swap)
must find a lost update: the check is what the invariant rests on.

The steps are named after the code's (``documents.WRITE_STEPS``), which a test compares.
"""

from collections import deque

from ansible_collections.machinery.compute.plugins.module_utils.coordination import documents

STEPS = ("read", "check", "create", "upload", "prune")
# a writer's position
START, READ, CHECKED, CREATED, UPLOADED, DONE, CONFLICT, CRASHED = range(8)
FINISHED = (DONE, CONFLICT, CRASHED)
RETRIES = 1


def initial(count):
    # shared: the generations {n: body or None (created, not uploaded)}, as a sorted tuple, and who holds the
    # admission lock (check to prune); per writer: (pc, generation read, body read, generation created, retries)
    return ((), None, tuple((START, 0, frozenset(), 0, 0) for _index in range(count)))


def newest_complete(gens):
    complete = [(n, body) for n, body in gens if body is not None]
    return max(complete) if complete else (0, frozenset())


def successors(state, cas=True):
    gens, lock, writers = state
    out = []

    def go(name, index, writer, new_gens=gens, new_lock=lock):
        out.append((name, (tuple(sorted(new_gens, key=lambda g: g[0])), new_lock,
                           writers[:index] + (writer,) + writers[index + 1:])))

    for index, (pc, read, body, made, retries) in enumerate(writers):
        if pc in FINISHED:
            continue
        # a crash after any step: what it created stays; a lock it held is broken by the next writer
        go("crash", index, (CRASHED, read, body, made, retries), new_lock=None if lock == index else lock)
        if pc == START:
            generation, found = newest_complete(gens)
            go("read", index, (READ, generation, found, 0, retries))
        elif pc == READ and lock is None:
            newer = newest_complete(gens)[0] > read
            if cas and newer:
                if retries < RETRIES:
                    go("check", index, (START, 0, frozenset(), 0, retries + 1))
                else:
                    go("check", index, (CONFLICT, read, body, 0, retries))
            else:
                go("check", index, (CHECKED, read, body, 0, retries), new_lock=index)
        elif pc == CHECKED:
            generation = max([n for n, _body in gens] or [0]) + 1
            go("create", index, (CREATED, read, body, generation, retries), new_gens=gens + ((generation, None),))
        elif pc == CREATED:
            uploaded = tuple((n, body | {index}) if n == made else (n, b) for n, b in gens)
            go("upload", index, (UPLOADED, read, body, made, retries), new_gens=uploaded)
        elif pc == UPLOADED:
            go("prune", index, (DONE, read, body, made, retries),
               new_gens=tuple((n, b) for n, b in gens if n >= made), new_lock=None)
    return out


def lost_updates(state):
    """The writers that reported success and whose change the document does not hold, once all are finished."""
    gens, _lock, writers = state
    if any(writer[0] not in FINISHED for writer in writers):
        return []
    _generation, body = newest_complete(gens)
    return [index for index, writer in enumerate(writers) if writer[0] == DONE and index not in body]


def explore(count, cas=True):
    """Every reachable state; returns (states, the first state with a lost update or None, step names used)."""
    start = initial(count)
    seen = {start}
    queue = deque([start])
    used = set()
    while queue:
        state = queue.popleft()
        if lost_updates(state):
            return len(seen), state, used
        for name, following in successors(state, cas):
            used.add(name)
            if following not in seen:
                seen.add(following)
                queue.append(following)
    return len(seen), None, used


def test_the_model_takes_the_steps_of_the_code():
    assert STEPS == documents.WRITE_STEPS
    _states, _bad, used = explore(2)
    assert used == set(STEPS) | {"crash"}


def test_no_update_is_lost_with_two_or_three_writers_crashing_anywhere():
    states, bad, _used = explore(2)
    assert bad is None, bad
    assert states > 100
    states, bad, _used = explore(3)
    assert bad is None, bad
    assert states > 3000


def test_without_the_check_the_last_writer_loses_an_update():
    _states, bad, _used = explore(2, cas=False)
    assert bad is not None
    assert lost_updates(bad)

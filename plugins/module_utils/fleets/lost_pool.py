# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Members on a lost pool: when to replace them, and fencing them when their pool comes back.

A run cannot list the machines of a pool it cannot reach, so a set with ``unreachable_timeout`` keeps, in its
document in every reachable pool's registry, what it needs to reason about one it cannot reach:

- ``members``: each member's pool (name and URI) as of the last run;
- ``unreachable``: for each pool of the set that a run found Offline, when a run first saw it so (a pool seen
  reachable again loses its mark);
- ``replaced``: the members given up on a pool that stayed Offline for ``unreachable_timeout``; the set made
  others in their place, and whatever is still defined under those names on that pool when it comes back is
  fenced (destroyed and undefined, then its own volumes removed) before the run does anything else;
- ``revision``: raised at every change, so a pool that was away (and kept an older document) is not believed.

Everything here is pure: the clock is an argument (``moment``, an ISO time) and nothing reads libvirt.
"""

from __future__ import annotations

import datetime
import re

from ansible_collections.machinery.compute.plugins.module_utils.core.errors import ValidationError

POOL_REACHABLE = "PoolReachable"
LOST_KEYS = ("unreachable_timeout", "members", "unreachable", "replaced")
_NUMBER = r"(?:\d+(?:\.\d*)?|\.\d+)"
_DURATION = re.compile(r"^(?:(%s)h)?(?:(%s)m)?(?:(%s)s)?$" % (_NUMBER, _NUMBER, _NUMBER))
_SECONDS = re.compile(r"^%s$" % _NUMBER)


def seconds(value, field):
    """A duration as Kubernetes writes it (``90s``, ``5m``, ``1h30m``, ``1.5h``) or a number of seconds, whole or
    not, given as a number or as text (Ansible hands ``3.5`` and ``5`` to a text option alike, as text)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        number = float(value)
    else:
        text = str(value).strip()
        match = _DURATION.match(text)
        if _SECONDS.match(text):
            number = float(text)
        elif match and text:
            hours, minutes, secs = (float(part or 0) for part in match.groups())
            number = hours * 3600 + minutes * 60 + secs
        else:
            raise ValidationError("%r is not a duration such as 90s, 5m or 1h30m, nor a number of seconds"
                                  % (value,), field)
    if number < 0:
        raise ValidationError("must not be negative", field)
    return number


def age(since, moment):
    """Seconds from ``since`` to ``moment`` (ISO times); 0 when either cannot be read."""
    try:
        then = datetime.datetime.fromisoformat(since)
        current = datetime.datetime.fromisoformat(moment)
    except (TypeError, ValueError):
        return 0.0
    return max(0.0, (current - then).total_seconds())


def trusted(documents):
    """The newest of the set's documents (the highest ``revision``): a pool that was away keeps an older one."""
    found = None
    for document in documents:
        if isinstance(document, dict) and (found is None or document.get("revision", 0) > found.get("revision", 0)):
            found = document
    return found


def assess(record, reachable, seen, timeout, moment):
    """Where the set stands with its pools, from its ``record`` (the trusted document, or None), ``reachable``
    ({pool URI: True | False} for the set's pools), ``seen`` ({member: {pool, uri}} found on the reachable pools),
    ``unreachable_timeout`` in seconds and the time. Returns a dict:

    - ``unreachable``: {uri: since} the marks to keep (a new one for a pool first seen Offline now);
    - ``lost``: the recorded members on Offline pools not yet replaced, each {name, pool, uri, since, for,
      replace}: ``replace`` when their pool has been Offline for the timeout;
    - ``replaced``: {member: {pool, uri, since}} the record's, to which the lost members to replace are added.

    A member the record puts on a reachable pool and that is not seen there was deleted (by hand, by a health
    check): it is forgotten, as a set without the option forgets it. A pool that is no longer one of the set's
    is forgotten with its members."""
    record = record or {}
    marks = {}
    for uri, up in sorted(reachable.items()):
        if not up:
            marks[uri] = (record.get("unreachable") or {}).get(uri) or moment
    replaced = {name: dict(entry) for name, entry in sorted((record.get("replaced") or {}).items())
                if entry.get("uri") in reachable}
    lost = []
    for name, where in sorted((record.get("members") or {}).items()):
        uri = where.get("uri")
        if name in seen or name in replaced or uri not in marks:
            continue
        held = age(marks[uri], moment)
        entry = {"name": name, "pool": where.get("pool"), "uri": uri, "since": marks[uri], "for": held,
                 "replace": held >= timeout}
        lost.append(entry)
        if entry["replace"]:
            replaced[name] = {"pool": where.get("pool"), "uri": uri, "since": marks[uri]}
    return {"unreachable": marks, "lost": lost, "replaced": replaced}


def fence_plan(replaced, reachable, found, set_name):
    """What to do about each replaced member whose pool is reachable now, from ``found`` ({member: what the run
    read on that pool: {exists, owner, volumes, journal}}; a member absent from it was not read). Returns
    (fence, reclaim, settled, foreign):

    - ``fence``: members still defined there and owned by the set: destroyed and undefined first;
    - ``reclaim``: {member: [volumes]} the volumes that lived and died with those members (as their records say,
      or as the journal a fence left says), removed next;
    - ``settled``: members with nothing left there: their entry leaves the record;
    - ``foreign``: members whose name is taken there by a machine the set does not own: never touched, and their
      entry leaves the record (there is nothing of the set's to fence)."""
    fence, reclaim, settled, foreign = [], {}, [], []
    for name, entry in sorted(replaced.items()):
        if not reachable.get(entry.get("uri")) or name not in found:
            continue
        there = found[name]
        if there.get("exists") and there.get("owner") != set_name:
            foreign.append(name)
        elif there.get("exists"):
            fence.append(name)
            reclaim[name] = list(there.get("volumes") or [])
        elif there.get("journal"):
            reclaim[name] = list(there["journal"])
        else:
            settled.append(name)
    return fence, reclaim, settled, foreign


def lost_document(timeout, members, marks, replaced):
    """The part of the set's document that the option adds (without its revision)."""
    return {"unreachable_timeout": timeout, "members": members, "unreachable": marks, "replaced": replaced}


def with_revision(document, record):
    """``document`` with the revision it is written under: the record's when nothing changed, the next one
    otherwise (a pool holding an older revision is then rewritten)."""
    record = record or {}
    unchanged = {key: value for key, value in record.items() if key != "revision"} == document
    return dict(document, revision=record.get("revision", 0) + (0 if unchanged else 1))


def condition(reachable, since=None):
    """The member's PoolReachable condition."""
    shown = {"type": POOL_REACHABLE, "status": "True" if reachable else "False"}
    if not reachable:
        shown["since"] = since
    return shown


def covers(document, match):
    """Whether a health check selecting ``match`` covers the members of the set of ``document``: they carry the
    template's labels and the set's owner label."""
    labels = dict(((document.get("template") or {}).get("labels") or {}),
                  **{"machinery.compute/machine-set": document.get("name")})
    return all(labels.get(key) == value for key, value in match.items())


def check_update(record, reachable, seen, timeout, moment, allowed):
    """What a health check writes into a set's ``record`` (the trusted document): the unreachable marks brought
    up to date and, when ``allowed`` (max_unhealthy), the members whose pool stayed Offline for the timeout moved
    from ``members`` to ``replaced``. Pools the check does not read keep what the record says of them. Returns
    (assessment, the document to write or None when nothing changed)."""
    facts = assess(record, reachable, seen, timeout, moment)
    marks = {uri: mark for uri, mark in (record.get("unreachable") or {}).items() if uri not in reachable}
    marks.update(facts["unreachable"])
    replaced = {name: entry for name, entry in (record.get("replaced") or {}).items()
                if entry.get("uri") not in reachable}
    replaced.update({name: entry for name, entry in (record.get("replaced") or {}).items()
                     if entry.get("uri") in reachable})
    members = dict(record.get("members") or {})
    if allowed:
        for entry in facts["lost"]:
            if entry["replace"]:
                replaced[entry["name"]] = facts["replaced"][entry["name"]]
                members.pop(entry["name"], None)
    document = dict(record, unreachable=marks, replaced=replaced, members=members)
    document.pop("revision", None)
    written = with_revision(document, record)
    return facts, (None if written == record else written)

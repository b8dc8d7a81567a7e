# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Which pool's task drives each machine, when the pools are the hosts of a play (scale-out over forks, AWX job
slices and execution nodes).

Every machine gets exactly one driver among all the pools, decided from the machine's name and the pools' names
(or their URIs, when the pools are given as URIs alone) and nothing else (rendezvous hashing). A slice of a sliced
job sees only its own hosts, yet the slices agree, since each computes the same answer for every machine (the
slices of one job are given the same pools). A machine pinned to a pool by name (``machine_pool``) is driven by
that pool. Adding a pool moves only the machines it now wins. One task may drive what several pools drive (a
slice's hosts, in one process). The driver converges its machines over every pool (where they are placed, as the
scheduler decides, is another matter), so drivers on several processes compete for the same pools, and the
admission protocol keeps each pool from being over-admitted.
"""

from __future__ import annotations

import hashlib
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from ansible_collections.machinery.compute.plugins.module_utils.core.errors import ValidationError
from ansible_collections.machinery.compute.plugins.module_utils.fleets.fleet import pool_entries


# What a controller adds to a pool's URI to reach it (its key, its certificates, how it checks the host): not part of
# which pool it is. Everything else in the URI, the socket of a local daemon included, is.
ACCESS_PARAMETERS = ("keyfile", "pkipath", "known_hosts", "known_hosts_verify", "no_verify", "no_tty", "sshauth",
                     "command", "netcat", "proxy", "mode", "authfile")


def _identity(uri):
    """A pool's URI without the query parameters of access: the credential's keyfile= or pkipath= added on one
    controller and not on another leaves the pool the same pool, while a socket= names another one."""
    parts = urlsplit(uri)
    kept = sorted((key, value) for key, value in parse_qsl(parts.query, keep_blank_values=True)
                  if key not in ACCESS_PARAMETERS)
    return urlunsplit((parts.scheme, parts.netloc, parts.path, urlencode(kept), ""))


def _key(entry):
    """What a pool is known by for the hashing: its name when the pools are named, else its URI."""
    return entry.get("name") or _identity(entry["uri"])


def _weight(entry, name):
    return hashlib.sha256(("%s\0%s" % (_key(entry), name)).encode()).digest()


def driver(machine, entries):
    """The entry (of ``entries``, [{name, uri}]) whose task drives ``machine`` (a mapping with name)."""
    pinned = machine.get("machine_pool")
    if pinned:
        for entry in entries:
            if entry.get("name") == pinned:
                return entry
    return max(entries, key=lambda entry: _weight(entry, machine["name"]))


def _matching(pool, entries, field):
    found = isinstance(pool, str) and [entry for entry in entries
                                       if pool == entry.get("name") or _identity(pool) == _identity(entry["uri"])]
    if not found:
        raise ValidationError("%s is none of the pools given (%s)" % (pool, ", ".join(
            entry.get("name") or entry["uri"] for entry in entries)), field)
    return found[0]


def driven_by(machines, pool, pools, field="machines"):
    """The machines of ``machines`` that the pool ``pool`` drives, in the order given: ``pool`` is one pool (its
    name or URI) or a list of them (the hosts of a slice, whose one task drives what any of them drives);
    ``pools`` every pool of the fleet, as URIs or mappings with name and uri."""
    if not pools:
        raise ValidationError("give every pool of the fleet, not only this host's", "pools")
    entries = pool_entries(pools)
    if isinstance(pool, (list, tuple)):
        if not pool:
            raise ValidationError("give at least one pool", "pool")
        drivers = [_matching(item, entries, "pool[%d]" % index) for index, item in enumerate(pool)]
    else:
        drivers = [_matching(pool, entries, "pool")]
    for index, machine in enumerate(machines):
        if not isinstance(machine, dict) or not machine.get("name"):
            raise ValidationError("each machine needs a name", "%s[%d]" % (field, index))
    chosen = {id(entry) for entry in drivers}
    return [machine for machine in machines if id(driver(machine, entries)) in chosen]

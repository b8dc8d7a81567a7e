# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A pool as the machine code sees it: one connection, its registration, its storage and its networks."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

from ansible_collections.machinery.compute.plugins.module_utils.pools import capacity
from ansible_collections.machinery.compute.plugins.module_utils.core import connection as lv
from ansible_collections.machinery.compute.plugins.module_utils.core import domain as dx
from ansible_collections.machinery.compute.plugins.module_utils.coordination import documents
from ansible_collections.machinery.compute.plugins.module_utils.coordination import journals
from ansible_collections.machinery.compute.plugins.module_utils.coordination import keys
from ansible_collections.machinery.compute.plugins.module_utils.coordination import locks
from ansible_collections.machinery.compute.plugins.module_utils.core import storage
from ansible_collections.machinery.compute.plugins.module_utils.core.errors import NotFoundError
from ansible_collections.machinery.compute.plugins.module_utils.coordination.admission import Admission
from ansible_collections.machinery.compute.plugins.module_utils.coordination.holds import Coordination, clear_dead_holds
from ansible_collections.machinery.compute.plugins.module_utils.pools.classes import published_classes
from ansible_collections.machinery.compute.plugins.module_utils.pools.pool_registration import registration_in
from ansible_collections.machinery.compute.plugins.module_utils.machines.machine_status import PoolView
from ansible_collections.machinery.compute.plugins.module_utils.coordination import writer


class Reading:
    """One domain as a pool listing read it: its handle, persistent XML (parsed), record, (state, reason), for a
    running one the memory it can balloon up to (bytes), and whether its host starts it (autostart) and whether
    libvirt holds its saved memory (managed save); None where not read."""

    __slots__ = ("dom", "tree", "record", "state", "live_max_memory", "autostart", "saved")

    def __init__(self, dom, tree, state, live_max_memory=None, autostart=None, saved=None):
        self.dom = dom
        self.tree = tree
        self.record = dx.read_record(tree)
        self.state = state
        self.live_max_memory = live_max_memory
        self.autostart = autostart
        self.saved = saved


# Threads that read the domains' XML of one listing at once: a read is one round trip, and while one waits on the
# daemon the next can be on its way (1,000 domains: 0.24 s read one after another, 0.18 s three at a time). Kept
# under libvirtd's max_client_requests (5) with room for a run's other calls on the same connection.
LISTING_READERS = 3


def _inactive_xml(dom):
    """The persistent XML of ``dom``, or None when it was undefined since the listing."""
    try:
        return dom.XMLDesc(lv.libvirt.VIR_DOMAIN_XML_INACTIVE)
    except lv.libvirt.libvirtError as exc:
        if exc.get_error_code() == lv.libvirt.VIR_ERR_NO_DOMAIN:
            return None
        raise


# Domains whose XML is read before their readings are handed on (stream_domains): a reading holds the parsed XML
# (about 80 KiB a domain), so a reader that does not keep them holds this many at a time, not the pool's.
LISTING_CHUNK = 64


def _reading(dom, stats, xml, flagged):
    state = (stats.get("state.state"), stats.get("state.reason"))
    if state[0] is None:
        state = tuple(dom.state())
    live_max = None
    if state[0] not in (lv.libvirt.VIR_DOMAIN_SHUTOFF, lv.libvirt.VIR_DOMAIN_CRASHED, lv.libvirt.VIR_DOMAIN_NOSTATE):
        maximum = stats.get("balloon.maximum")
        live_max = (maximum if maximum is not None else dom.maxMemory()) * 1024
    uuid = dom.UUIDString() if flagged[0] or flagged[1] else None
    return Reading(dom, dx.parse(xml), state, live_max, uuid in flagged[0], uuid in flagged[1])


def _flagged(conn):
    """(UUIDs of the autostarted domains, UUIDs of those with a managed save image): two listings the daemon
    filters, instead of two round trips a domain. Read after the states, so every domain those name existed when
    its flags were read."""
    listed = lv.libvirt
    return tuple(frozenset(dom.UUIDString() for dom in conn.listAllDomains(flag))
                 for flag in (listed.VIR_CONNECT_LIST_DOMAINS_AUTOSTART, listed.VIR_CONNECT_LIST_DOMAINS_MANAGEDSAVE))


def stream_domains(conn):
    """A Reading of every domain of the host, one at a time: one bulk stats call for the states (and the balloon
    maximum of the running ones), two filtered listings for autostart and managed save, then the one read of each
    domain's XML that nothing else gives in bulk (LISTING_READERS at a time, LISTING_CHUNK domains ahead)."""
    flags = lv.libvirt.VIR_DOMAIN_STATS_STATE | lv.libvirt.VIR_DOMAIN_STATS_BALLOON
    found = conn.getAllDomainStats(flags, 0)
    flagged = _flagged(conn)
    with ThreadPoolExecutor(max_workers=LISTING_READERS) as executor:
        for start in range(0, len(found), LISTING_CHUNK):
            chunk = found[start:start + LISTING_CHUNK]
            for (dom, stats), xml in zip(chunk, executor.map(_inactive_xml, [dom for dom, _stats in chunk])):
                if xml is None:  # undefined since the stats call
                    continue
                try:
                    reading = _reading(dom, stats, xml, flagged)
                except lv.libvirt.libvirtError as exc:
                    if exc.get_error_code() != lv.libvirt.VIR_ERR_NO_DOMAIN:
                        raise
                    continue  # undefined since its XML was read
                yield reading


def read_domains(conn):
    """{name: Reading} of every domain of the host (stream_domains)."""
    return {reading.dom.name(): reading for reading in stream_domains(conn)}


# libvirtd serves at most max_client_requests calls of one connection at once (5 unless the host says otherwise)
# and stops reading the connection until one ends, keepalive answers included. A run's threads share one connection
# per pool, so at most this many of them change machines on a pool at once: a batch of 300 on 10 pools with 16
# threads hit the limit, and a connection was closed by keepalive while slow calls (volumes, refreshes) held it.
# Threads that only wait (for an address, a shutdown) make one short call at a time and are not counted.
APPLYING_PER_POOL = 4


class PoolContext:
    """What one run needs from a pool host, each piece fetched at most once."""

    def __init__(self, conn, uri, coordination=None):
        self.conn = conn
        self.uri = uri
        # the run's holds on machines (coordination/holds.py): shared by every pool of a run
        self.coordination = coordination if coordination is not None else Coordination()
        # the threads of a run that change machines on this pool at once (see APPLYING_PER_POOL)
        self.applying = threading.BoundedSemaphore(APPLYING_PER_POOL)
        self._registry = None
        self._registration = None
        self._storage = None
        self._storage_path = None
        self._networks = {}
        self.url_opener = None  # set by the Ansible side: how to fetch images given by URL
        self.peer_connections = {}  # uri -> open connection of other pools, shared by a batch run
        self._listing = None
        self._listing_sizes = None  # (listing, its machine sizes): machine_sizes
        self.streamed_sizes = None  # the machines' sizes when the domains were read without a listing (readings)
        self._view = None
        self._lock_cleared = False
        self.registry_names = []  # the registry's volumes as clear_abandoned_lock listed them
        self.records = {}  # uuid -> record (or None) of the domains seen by capacity.current_sizes
        self._records_seeded = None  # the listing whose records are among them (known_records)
        self.locked_sizes = (None, [])  # (admission epoch, machine sizes) for the checks under a held lock
        self._host_capacity = None
        self._storage_size = None
        self.images = {}  # checksum -> (volume, format) of the images cached on the pool, looked up once a run
        # name -> volumes of the creates this run plans on the pool (MachineResource.plan): the journal of the
        # creates lists them all at once (admission.Admission.journal)
        self.planned_creates = {}

    def forget_reads(self):
        """Forget what was read from the registry and the domains, so the next read is fresh."""
        self._registry = None
        self._registration = None
        self._listing = None
        self._view = None

    def listing(self):
        """Every domain of the pool, read once (``read_domains``) until ``forget_reads``: a run over many machines
        (machine_batch, machine_set, the info modules, the inventory) reads each domain's XML once, and each
        machine's first observation comes from here instead of its own round trips."""
        if self._listing is None:
            self._listing = read_domains(self.conn)
        return self._listing

    def machine_sizes(self):
        """capacity.machine_sizes of the pool: of the run's listing when one was read, worked out once per listing,
        else read from the pool now.

        A plan that creates a machine checks the pool's room against them: recounted for every create, a batch
        adding 100 machines to pools of 100 read 21,000 domains' sizes. A capacity.Tally, with its sums; shared:
        read it, never change it."""
        listing = self._listing
        if listing is None:
            return capacity.Tally(capacity.machine_sizes(self.conn))
        kept = self._listing_sizes
        if kept is None or kept[0] is not listing:
            kept = self._listing_sizes = (listing, capacity.Tally(capacity.machine_sizes(self.conn, listing)))
        return kept[1]

    def known_records(self):
        """{uuid: record or None} of the domains whose records this run read, for capacity.current_sizes: seeded
        from each listing the run reads, so the first check under the admission lock reads the XML of the domains
        made since, not of every domain again while it holds the lock."""
        listing = self._listing
        if listing is not None and self._records_seeded is not listing:
            for reading in listing.values():
                self.records.setdefault(reading.dom.UUIDString(), reading.record)
            self._records_seeded = listing
        return self.records

    def listed(self):
        """The listing when one was read in this run (else None: observe the machine by itself)."""
        return self._listing

    def readings(self, keep=True):
        """Every domain's Reading: from the run's listing (read now and kept, with ``keep``), or, when no listing
        was read and none is to be kept, one at a time from the pool (a reader of a large pool that only builds
        statuses holds a few parsed domains at a time, not all). Read that way, the machines' sizes are kept
        (``streamed_sizes``) for the pool's status."""
        if keep or self._listing is not None:
            return list(self.listing().values())
        return self._streamed()

    def _streamed(self):
        sizes = []
        for reading in stream_domains(self.conn):
            size = capacity.size_of(reading.dom.name(), reading.tree, reading.record)
            if size is not None:
                sizes.append(size)
            yield reading
        self.streamed_sizes = sizes

    def view(self):
        """The pool's leases and volume names for statuses, shared by the machines of one run until ``forget_reads``
        (machine_status.PoolView)."""
        if self._view is None:
            self._view = PoolView(self)
        return self._view

    def prime(self):
        """Fetch the lazily read pieces now, before several threads share this context."""
        if self.registration:
            published_classes(self.registry)
            self.storage_file("")  # resolves the storage path once
        return self

    def host_capacity(self):
        """{cpu, memory} of the host, read once a run: its hardware does not change under a run (every admission
        checks against it)."""
        if self._host_capacity is None:
            self._host_capacity = capacity.capacity_of(self.conn)
        return self._host_capacity

    def storage_size(self):
        """{capacity} of the pool's machine storage in bytes, read once a run (what admission checks disks
        against; how much is free is not cached: it is not read from here)."""
        if self._storage_size is None:
            self._storage_size = {"capacity": capacity.storage_of(self.conn)["capacity"]}
        return self._storage_size

    @property
    def registry(self):
        if self._registry is None:
            self._registry = documents.Registry.open(self.conn, self.coordination.identity)
        return self._registry

    def clear_abandoned_lock(self, again=False):
        """Once per pool and run (or ``again``, when the run's work on the pool is over): break the admission lock
        a killed run of this controller left, and its dead markers, even when this run writes nothing (so nothing
        a kill left outlives the next run). Returns the registry's volumes as it listed them."""
        if self._lock_cleared and not again:
            return self.registry_names
        self._lock_cleared = True
        pool = self.registry.pool if self.registration else None
        if pool is not None:
            identity = self.coordination.identity
            names = self.registry_names = locks.admission_lock(self.conn, pool, identity).clear_abandoned()
            if any(name.startswith((keys.HOLD_PREFIX, keys.STAGE_PREFIX)) for name in names):
                clear_dead_holds(self.conn, pool, names, identity)  # and documents a killed writer staged
            # a wave of this controller's run killed after its last create: no later create on the pool meets it
            if any(journals.wave_is_dead(key, identity) for key in self.registry.keys(keys.WAVE_PREFIX)):
                with Admission(self, []) as admission:
                    admission.clean_dead_waves()
        return self.registry_names

    @property
    def registration(self):
        """pool.json, or None when machine_pool never registered this host."""
        if self._registration is None:
            self._registration = registration_in(self.registry) or {}
        return self._registration or None

    @property
    def name(self):
        registration = self.registration
        return registration["name"] if registration else None

    def require_registration(self):
        if not self.registration:
            raise NotFoundError("%s is not a registered pool: run machinery.compute.machine_pool against it first"
                                % self.uri, "uri")
        return self.registration

    @property
    def storage(self):
        if self._storage is None:
            self._storage = lv.lookup_storage_pool(self.conn, storage.STORAGE_POOL)
            if self._storage is None:
                raise NotFoundError("%s has no storage pool %r: run machinery.compute.machine_pool against it "
                                    "first" % (self.uri, storage.STORAGE_POOL), "uri")
            if not self._storage.isActive():
                writer.write(self._storage, "create", 0)
        return self._storage

    @property
    def storage_path(self):
        if self._storage_path is None:
            self._storage_path = storage.pool_path(self.storage)
        return self._storage_path

    def storage_file(self, volume_name):
        return "%s/%s" % (self.storage_path.rstrip("/"), volume_name)

    def network(self, name):
        """The libvirt network ``name`` (cached), or None."""
        if name not in self._networks:
            self._networks[name] = lv.lookup_network(self.conn, name)
        return self._networks[name]

    def virt_type(self):
        """kvm or qemu as the pool's registration measured it (a KVM that really ran a guest)."""
        return (self.registration or {}).get("virt_type") or "qemu"

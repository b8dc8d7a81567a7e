# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What a pool holds and offers: host capacity, the machines defined on it, allocatable after reservations and
overcommit, and the public ``pool`` status. One accounting model: allocated = the sizes of the machines defined
on the pool."""

from __future__ import annotations

import collections
import contextlib

from ansible_collections.machinery.compute.plugins.module_utils.core import connection as lv
from ansible_collections.machinery.compute.plugins.module_utils.coordination import locks
from ansible_collections.machinery.compute.plugins.module_utils.core import domain as dx
from ansible_collections.machinery.compute.plugins.module_utils.core import validation as check
from ansible_collections.machinery.compute.plugins.module_utils.core.errors import PoolFull
from ansible_collections.machinery.compute.plugins.module_utils.core.quantity import format_quantity
from ansible_collections.machinery.compute.plugins.module_utils.core.storage import STORAGE_POOL
from ansible_collections.machinery.compute.plugins.module_utils.pools.classes import published_classes
from ansible_collections.machinery.compute.plugins.module_utils.pools import placement_rules as rules
from ansible_collections.machinery.compute.plugins.module_utils.pools import scheduler


def _version(number):
    return "%d.%d.%d" % (number // 1000000, (number // 1000) % 1000, number % 1000)


def machine_disks(record):
    """{volume name: virtual bytes} of the disks a machine's record accounts for (an adopted domain: none)."""
    spec = record.get("spec", {})
    if record.get("adopted") or not spec.get("name"):
        return {}
    disks = {dx.root_volume(spec): spec.get("root_size") or 0}
    for vol in spec.get("volumes") or []:
        disks[vol["volume"]] = vol.get("size") or 0
    return disks


# What the capacity of a pool counts of one machine on it.
MachineSize = collections.namedtuple("MachineSize", "name cpu memory machine_class disks tolerations server_group")


def machine_sizes(conn, listing=None):
    """[MachineSize(name, cpu, memory bytes, machine_class, {volume: bytes}, tolerations, server_group)] of the
    machines (domains with our record) on the host; from ``listing`` (pool_context.read_domains) when the run has read one."""
    if listing is None:
        readings = []
        for dom, tree in dx.defined_domains(conn):
            readings.append((dom.name(), tree, dx.read_record(tree)))
    else:
        readings = [(name, reading.tree, reading.record) for name, reading in listing.items()]
    return [size for size in (size_of(name, tree, record) for name, tree, record in readings) if size is not None]


def size_of(name, tree, record):
    """The MachineSize of one domain from its parsed XML and record; None for a domain the collection did not
    create."""
    if record is None:
        return None
    return MachineSize(name, dx.read_cpu(tree), dx.read_memory(tree), record["spec"].get("machine_class"),
                       machine_disks(record), record["spec"].get("tolerations") or [], record["spec"].get("server_group"))


def current_sizes(conn, known):
    """``machine_sizes`` as of now, for the check made under the admission lock, in one bulk call: every domain's
    vcpus and memory come from libvirt's domain stats; its record (class, disks) is read from its XML only for a
    domain not in ``known`` ({uuid: record or None}, kept by the caller for the run) yet."""
    flags = lv.libvirt.VIR_DOMAIN_STATS_VCPU | lv.libvirt.VIR_DOMAIN_STATS_BALLOON
    sizes = []
    for dom, stats in conn.getAllDomainStats(flags, 0):
        uuid = dom.UUIDString()
        cpu, memory = stats.get("vcpu.current"), stats.get("balloon.maximum")
        if uuid not in known or cpu is None or memory is None:
            try:
                tree = dx.parse(dom.XMLDesc(lv.libvirt.VIR_DOMAIN_XML_INACTIVE))
            except lv.libvirt.libvirtError as exc:
                if exc.get_error_code() == lv.libvirt.VIR_ERR_NO_DOMAIN:
                    continue  # undefined since the stats call
                raise
            known[uuid] = dx.read_record(tree)
            cpu, memory = dx.read_cpu(tree), dx.read_memory(tree) // 1024
        record = known[uuid]
        if record is None:
            continue
        if isinstance(record["spec"].get("cpu"), float):
            cpu = record["spec"]["cpu"]  # a fraction of its vCPUs (its CFS quota): counted as the fraction it is
        sizes.append(MachineSize(dom.name(), cpu, memory * 1024, record["spec"].get("machine_class"),
                                 machine_disks(record), record["spec"].get("tolerations") or [],
                                 record["spec"].get("server_group")))
    return sizes


class Tally(list):
    """MachineSizes that keep their sums as they grow. The room checks of a run take the cpu, memory and storage
    of every machine on the pool but one, once per create; summed anew each time, a pool of n machines cost O(n)
    a create, under the admission lock (0.3 ms at 100 machines, ten times that at 1,000). It grows by
    ``append`` only (``admitted``); nothing takes a size out of it."""

    def __init__(self, sizes=()):
        super().__init__()
        self.cpu = 0
        self.memory = 0
        self.disk_bytes = 0  # as disks_allocated counts them: a volume of several machines once, its last size
        self._disks = {}
        self._named = {}
        for size in sizes:
            self.append(size)

    def append(self, size):  # pylint: disable=arguments-renamed
        super().append(size)
        self.cpu += size.cpu or 0
        self.memory += size.memory or 0
        for volume, virtual in size.disks.items():
            self.disk_bytes += virtual - self._disks.get(volume, 0)
            self._disks[volume] = virtual
        self._named.setdefault(size.name, []).append(size)

    def extend(self, sizes):
        for size in sizes:
            self.append(size)

    def _refuse(self, *_args, **_kwargs):
        raise TypeError("a Tally of machine sizes only grows")

    insert = remove = pop = clear = __setitem__ = __delitem__ = __iadd__ = _refuse

    def used_except(self, name):
        """(cpu, memory bytes) the machines other than ``name`` take."""
        own = self._named.get(name, ())
        return (self.cpu - sum(size.cpu or 0 for size in own),
                self.memory - sum(size.memory or 0 for size in own))


def disks_allocated(sizes, except_machine=None):
    """The virtual size of every machine disk on the pool, a volume shared by several machines counted once."""
    if isinstance(sizes, Tally) and except_machine is None:
        return sizes.disk_bytes
    disks = {}
    for size in sizes:
        if size.name != except_machine:
            disks.update(size.disks)
    return sum(disks.values())


def storage_of(conn):
    """{capacity, available} of the pool's machine storage in bytes (zero when it has none)."""
    pool = lv.lookup_storage_pool(conn, STORAGE_POOL)
    if pool is None or not pool.isActive():
        return {"capacity": 0, "available": 0}
    info = pool.info()
    return {"capacity": int(info[1]), "available": int(info[3])}


def storage_allocatable(storage, registration):
    """Virtual bytes the pool offers to thin disks: its storage less the reservation, times the overcommit."""
    reserved = (registration.get("reserved") or {}).get("storage") or 0
    ratio = (registration.get("overcommit") or {}).get("storage") or 1.0
    return max(0, int((storage["capacity"] - reserved) * ratio))


def capacity_of(conn):
    info = conn.getInfo()
    return {"cpu": int(info[2]), "memory": int(info[1]) * 2 ** 20}


def allocatable_for(capacity, registration):
    """What a registered pool offers: ``capacity`` less its reservations, times its overcommit."""
    return allocatable_of(capacity, registration.get("reserved") or {"cpu": 0, "memory": 0},
                          registration.get("overcommit") or {"cpu": 1.0, "memory": 1.0})


def registered_allocatable(conn, registration):
    """What the pool offers now: the host's capacity is read live (it is not stored)."""
    return allocatable_for(capacity_of(conn), registration)


def allocatable_of(capacity, reserved, overcommit):
    return {"cpu": int((capacity["cpu"] - reserved["cpu"]) * overcommit["cpu"]),
            "memory": int((capacity["memory"] - reserved["memory"]) * overcommit["memory"])}


def class_count(resources, body):
    """How many machines of a class (``body``: cpu, memory) ``resources`` hold: of an empty pool, its capacity; of
    what is free, how many more fit."""
    if not body.get("cpu") or not body.get("memory"):
        return 0
    millis = int(round(resources["cpu"] * 1000)) // int(round(body["cpu"] * 1000))  # 1 // 0.1 is 9 in floats
    return max(0, int(min(millis, resources["memory"] // body["memory"])))


def pool_status(ctx, registration=None, sizes=None, capacity=None):
    """The public ``pool`` return: registration plus live capacity, allocation and class fit."""
    conn = ctx.conn
    registration = registration or ctx.registration or {}
    if sizes is None:  # from the run's reading of the pool when it read one (the inventory)
        sizes = ctx.streamed_sizes if getattr(ctx, "streamed_sizes", None) is not None else ctx.machine_sizes()
    capacity = capacity_of(conn) if capacity is None else capacity
    allocatable = allocatable_for(capacity, registration)
    allocated = {"cpu": round(sum(size.cpu or 0 for size in sizes), 3),
                 "memory": sum(size.memory or 0 for size in sizes)}
    free = {"cpu": round(allocatable["cpu"] - allocated["cpu"], 3),
            "memory": allocatable["memory"] - allocated["memory"]}
    problems = []
    storage_pool = lv.lookup_storage_pool(conn, STORAGE_POOL)
    if storage_pool is None or not storage_pool.isActive():
        problems.append("storage pool %s is not active" % STORAGE_POOL)
    for name in registration.get("networks") or []:
        net = lv.lookup_network(conn, name)
        if net is None or not net.isActive():
            problems.append("network %s is not active" % name)
    classes = []
    for body in published_classes(ctx.registry).values():
        classes.append({"name": body["name"], "cpu": body["cpu"], "memory": format_quantity(body["memory"]),
                        "capacity": class_count(allocatable, body), "allocatable": class_count(free, body)})
    classes.sort(key=lambda item: item["name"])

    def show(resources):
        return {"cpu": resources["cpu"], "memory": format_quantity(max(resources["memory"], 0))}

    storage = storage_of(conn)

    return {
        "name": registration.get("name"),
        "uri": ctx.uri,
        "labels": registration.get("labels") or {},
        "taints": registration.get("taints") or [],
        # what the registration keeps for an option a task leaves out, so that a task can see it
        "overcommit": dict(registration.get("overcommit") or {}),
        "reserved": {key: value if key == "cpu" else format_quantity(value or 0)
                     for key, value in (registration.get("reserved") or {}).items()},
        "storage_path": registration.get("storage_path"),
        "networks": list(registration.get("networks") or []),
        "state": "Error" if problems else "Ready",
        "problems": problems,
        "virt_type": registration.get("virt_type"),
        "capacity": show(capacity),
        "allocated": show(allocated),
        "allocatable": show(allocatable),
        "storage": {"capacity": format_quantity(storage["capacity"]),
                    "available": format_quantity(storage["available"]),
                    "allocated": format_quantity(disks_allocated(sizes)),
                    "allocatable": format_quantity(storage_allocatable(storage, registration))},
        "available_machine_classes": classes,
        "machine_count": len(sizes),
        # machines that tolerate no NoExecute taint of the pool: the drain role moves exactly these
        "must_leave": sorted(size.name for size in sizes
                             if scheduler.must_leave(registration.get("taints"), size.tolerations)),
        "hypervisor": {"libvirt": _version(conn.getLibVersion()), "qemu": _version(conn.getVersion()),
                       "hostname": conn.getHostname()},
    }


def check_room(ctx, spec, disks=None, locked=False, epoch=None, elsewhere=None):
    """Refuse a machine the pool has no room for: the machines already defined there (other than this one)
    plus ``spec`` must fit in what the pool's registration makes allocatable, and so must the new ``disks``
    ([(field, virtual bytes)]) in its storage; a machine of a hard anti-affinity server group is refused where
    a member of its group is defined, and one of an affinity group where none is while some are ``elsewhere``
    (coordination/admission.py, Admission.group_members).

    A plan checks against the pool as this run listed it (when it did); under the admission lock (``locked``)
    the sizes are read as they are now: once in the lock's ``epoch`` (Admission.epoch), then kept with the
    machines this process admitted since (``admitted``), as no other run creates on the pool meanwhile (one
    deleting there only leaves more room than counted)."""
    registration = ctx.registration
    if not registration:
        return
    if locked and epoch is not None and ctx.locked_sizes[0] == epoch:
        sizes = ctx.locked_sizes[1]
    elif locked:
        sizes = Tally(current_sizes(ctx.conn, ctx.known_records()))
        if epoch is not None:
            ctx.locked_sizes = (epoch, sizes)
    else:
        sizes = ctx.machine_sizes()
    allocatable = allocatable_for(ctx.host_capacity(), registration)
    used_cpu, used_memory = sizes.used_except(spec["name"])  # a Tally: no pass over the pool's machines per create
    # cpu in millicores' steps (a fractional machine counts as its fraction): sums rounded to them, not to floats'
    if round(used_cpu + spec["cpu"], 3) > allocatable["cpu"] or used_memory + spec["memory"] > allocatable["memory"]:
        raise PoolFull("pool %s is full: %s/%d cpu and %s/%s memory are allocated, %s needs %s cpu and %s"
                       % (ctx.name, check.cpu_text(round(used_cpu, 3)), allocatable["cpu"],
                          format_quantity(used_memory),
                          format_quantity(allocatable["memory"]), spec["name"], check.cpu_text(spec["cpu"]),
                          format_quantity(spec["memory"])), "machine_pool")
    # a hard anti-affinity rule is re-checked here as capacity is: a concurrent run may have placed a member
    if spec.get("server_group"):
        refused = rules.admission_refusal(spec["server_group"], ctx.name, [
            (size.name, size.server_group) for size in sizes if size.name != spec["name"]], elsewhere)
        if refused:
            raise PoolFull(refused, "server_group")
    check_storage(ctx, disks or [], sizes)


def admitted(ctx, epoch, record):
    """Count a machine just created under the lock in ``epoch`` in the sizes the next check of the epoch uses."""
    if epoch is not None and ctx.locked_sizes[0] == epoch:
        spec = record["spec"]
        ctx.locked_sizes[1].append(MachineSize(spec["name"], spec["cpu"], spec["memory"],
                                               spec.get("machine_class"), machine_disks(record),
                                               spec.get("tolerations") or [], spec.get("server_group")))


@contextlib.contextmanager
def storage_room(ctx, disks):
    """Hold the pool's admission lock while new or grown ``disks`` ([(field, virtual bytes)]) are checked against
    the storage's room (the machines' disks read again now) and made: two runs adding disks at once are counted
    one after the other, as two creates are. Nothing is held for a pool without a registration (nothing is
    counted there) or when there is no disk to add."""
    if not ctx.registration or not [size for _field, size in disks if size > 0]:
        yield
        return
    with locks.admission_lock(ctx.conn, ctx.registry.pool, ctx.coordination.identity):
        check_storage(ctx, disks)
        yield


def check_storage(ctx, disks, sizes=None):
    """Refuse new disks ([(field, virtual bytes)]) that do not fit in the storage the pool's registration
    makes allocatable (thin disks count their virtual size); the error names the field of the disk that
    does not fit."""
    registration = ctx.registration
    if not registration or not disks:
        return
    sizes = machine_sizes(ctx.conn) if sizes is None else sizes
    allocatable = storage_allocatable(ctx.storage_size(), registration)
    used = disks_allocated(sizes)
    for field, size in disks:
        if used + size > allocatable:
            raise PoolFull("does not fit in the storage of pool %s: %s of %s are allocated (storage overcommit %s), "
                           "this disk needs %s more" % (ctx.name, format_quantity(used), format_quantity(allocatable),
                                                        (registration.get("overcommit") or {}).get("storage", 1.0),
                                                        format_quantity(size)), field)
        used += size

# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Pool registration: storage, registry, networks, the measured virt type, capacity and what is allocated."""

from __future__ import annotations

import ipaddress
import time
from xml.sax.saxutils import escape

from ansible_collections.machinery.compute.plugins.module_utils import connection as lv
from ansible_collections.machinery.compute.plugins.module_utils import domain as dx
from ansible_collections.machinery.compute.plugins.module_utils import registry as reg
from ansible_collections.machinery.compute.plugins.module_utils import storage
from ansible_collections.machinery.compute.plugins.module_utils import validation as check
from ansible_collections.machinery.compute.plugins.module_utils.errors import (
    ConflictError, MachineryError, ValidationError)
from ansible_collections.machinery.compute.plugins.module_utils.quantity import format_quantity

EFFECTS = ("NoSchedule", "NoExecute")
PROBE_SECONDS = 8.0


def normalize_taints(items):
    taints = []
    for index, item in enumerate(items or []):
        where = "taints[%d]" % index
        if not isinstance(item, dict) or not item.get("key"):
            raise ValidationError("a taint needs a key", where + ".key")
        taints.append({"key": str(item["key"]), "value": str(item.get("value") or ""),
                       "effect": check.one_of(item.get("effect") or "NoSchedule", EFFECTS, where + ".effect")})
    return taints


def _ratio(value, field):
    try:
        ratio = float(value)
    except (TypeError, ValueError):
        raise ValidationError("must be a number such as 1.0 or 4", field) from None
    if not 0 < ratio <= 64:
        raise ValidationError("must be above 0 and at most 64, got %s" % value, field)
    return ratio


def normalize_networks(items):
    networks = []
    for index, item in enumerate(items or []):
        where = "networks[%d]" % index
        if isinstance(item, str):
            item = {"name": item}
        if not isinstance(item, dict):
            raise ValidationError("must be a network name or a mapping with name, cidr, mode", where)
        entry = {"name": check.dns_label(item.get("name"), where + ".name"),
                 "mode": check.one_of(item.get("mode") or "nat", ("nat", "isolated"), where + ".mode"),
                 "cidr": None}
        if item.get("cidr"):
            try:
                net = ipaddress.IPv4Network(str(item["cidr"]), strict=True)
            except ValueError as exc:
                raise ValidationError(str(exc), where + ".cidr") from None
            if net.num_addresses < 16:
                raise ValidationError("needs at least a /28", where + ".cidr")
            entry["cidr"] = str(net)
        networks.append(entry)
    return networks


def network_xml(entry):
    net = ipaddress.IPv4Network(entry["cidr"])
    hosts = list(net.hosts())
    gateway, first, last = hosts[0], hosts[min(9, len(hosts) - 2)], hosts[-1]
    forward = "<forward mode='nat'/>" if entry["mode"] == "nat" else ""
    return ("<network><name>%s</name>%s<ip address='%s' netmask='%s'><dhcp><range start='%s' end='%s'/></dhcp>"
            "</ip></network>" % (escape(entry["name"]), forward, gateway, net.netmask, first, last))


def ensure_network(conn, entry, check_mode):
    net = lv.lookup_network(conn, entry["name"])
    changed = False
    if net is None:
        if not entry["cidr"]:
            raise ValidationError("network %s does not exist on the host; give its cidr to create it"
                                  % entry["name"], "networks")
        if check_mode:
            return True
        net = conn.networkDefineXML(network_xml(entry))
        changed = True
    if not net.isActive():
        if check_mode:
            return True
        net.create()
        changed = True
    if not net.autostart():
        if check_mode:
            return True
        net.setAutostart(1)
        changed = True
    return changed


PROBE_KERNELS = ("/boot/vmlinuz", "/vmlinuz")
PROBE_NAME = "machinery-kvm-probe"


def probe_virt_type(conn, storage_pool):
    """'kvm' only when a KVM guest really runs here, else 'qemu' (TCG).

    A /dev/kvm can exist, pass libvirt's checks and even run the firmware, yet fail a real guest (a nested or
    emulated KVM). So the probe boots the host's own kernel under KVM, with its serial port logged to a file in
    the pool's storage, and keeps KVM only if the kernel prints its banner within PROBE_SECONDS. Everything goes
    through the libvirt connection, so it works over any URI.
    """
    try:
        conn.getDomainCapabilities(None, "x86_64", "q35", "kvm", 0)
    except lv.libvirt.libvirtError:
        return "qemu"
    log_name = PROBE_NAME + ".log"
    log_path = "%s/%s" % (storage.pool_path(storage_pool).rstrip("/"), log_name)
    for kernel in PROBE_KERNELS:
        xml = ("<domain type='kvm'><name>%s</name><memory unit='MiB'>128</memory><vcpu>1</vcpu>"
               "<os><type arch='x86_64' machine='q35'>hvm</type><kernel>%s</kernel>"
               "<cmdline>console=ttyS0 panic=-1</cmdline></os><features><acpi/></features>"
               "<on_reboot>destroy</on_reboot><devices><serial type='file'><source path='%s'/></serial>"
               "<memballoon model='none'/></devices></domain>" % (PROBE_NAME, kernel, escape(log_path)))
        try:
            dom = conn.createXML(xml, 0)
        except lv.libvirt.libvirtError:
            continue  # no such kernel on this host: try the next one
        try:
            deadline = time.monotonic() + PROBE_SECONDS
            while time.monotonic() < deadline:
                storage_pool.refresh(0)
                vol = lv.lookup_volume(storage_pool, log_name)
                if vol is not None and b"Linux version" in storage.download_bytes(conn, vol):
                    return "kvm"
                time.sleep(0.5)
        finally:
            try:
                dom.destroy()
            except lv.libvirt.libvirtError:
                pass
            storage_pool.refresh(0)
            storage.delete_volume(storage_pool, log_name)
        return "qemu"
    return "qemu"


def _version(number):
    return "%d.%d.%d" % (number // 1000000, (number // 1000) % 1000, number % 1000)


def machine_sizes(conn):
    """[(name, cpu, memory bytes, machine_class)] of the machines (domains with our record) on the host."""
    sizes = []
    for dom in conn.listAllDomains(0):
        tree = dx.parse(dom.XMLDesc(lv.libvirt.VIR_DOMAIN_XML_INACTIVE))
        record = dx.read_record(tree)
        if record is None:
            continue
        sizes.append((dom.name(), dx.FIELD_BY_NAME["cpu"].read(tree, record),
                      dx.FIELD_BY_NAME["memory"].read(tree, record), record["spec"].get("machine_class")))
    return sizes


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


def pool_status(ctx, registration=None, sizes=None, capacity=None):
    """The public ``pool`` return: registration plus live capacity, allocation and class fit."""
    conn = ctx.conn
    registration = registration or ctx.registration or {}
    sizes = machine_sizes(conn) if sizes is None else sizes
    capacity = capacity_of(conn) if capacity is None else capacity
    allocatable = allocatable_for(capacity, registration)
    allocated = {"cpu": sum(size[1] or 0 for size in sizes), "memory": sum(size[2] or 0 for size in sizes)}
    free = {"cpu": allocatable["cpu"] - allocated["cpu"], "memory": allocatable["memory"] - allocated["memory"]}
    problems = []
    storage_pool = lv.lookup_storage_pool(conn, reg.STORAGE_POOL)
    if storage_pool is None or not storage_pool.isActive():
        problems.append("storage pool %s is not active" % reg.STORAGE_POOL)
    for name in registration.get("networks") or []:
        net = lv.lookup_network(conn, name)
        if net is None or not net.isActive():
            problems.append("network %s is not active" % name)
    classes = []
    for body in ctx.registry.machine_classes().values():
        fits = min(free["cpu"] // body["cpu"], free["memory"] // body["memory"]) if body["cpu"] and body["memory"] \
            else 0
        classes.append({"name": body["name"], "cpu": body["cpu"], "memory": format_quantity(body["memory"]),
                        "allocatable": max(0, int(fits))})
    classes.sort(key=lambda item: item["name"])

    def show(resources):
        return {"cpu": resources["cpu"], "memory": format_quantity(max(resources["memory"], 0))}

    return {
        "name": registration.get("name"),
        "uri": ctx.uri,
        "labels": registration.get("labels") or {},
        "taints": registration.get("taints") or [],
        "state": "Error" if problems else "Ready",
        "problems": problems,
        "virt_type": registration.get("virt_type"),
        "capacity": show(capacity),
        "allocated": show(allocated),
        "allocatable": show(allocatable),
        "available_machine_classes": classes,
        "machine_count": len(sizes),
        "hypervisor": {"libvirt": _version(conn.getLibVersion()), "qemu": _version(conn.getVersion()),
                       "hostname": conn.getHostname()},
    }


def ensure_pool(ctx, params, check_mode):
    """Register (or unregister) the host as a pool; returns (changed, before, after, status)."""
    name = check.dns_label(params.get("name"), "name")
    state = check.one_of(params.get("state") or "present", ("present", "absent"), "state")
    conn = ctx.conn
    current = ctx.registry.pool_registration()
    if state == "absent":
        if current is None:
            return False, None, None, None
        machines = [size[0] for size in machine_sizes(conn)]
        if machines and not params.get("force"):
            raise ConflictError("pool %s still has %d machine(s): %s; delete them first or set force: true"
                                % (name, len(machines), ", ".join(sorted(machines))), "state")
        if not check_mode:
            for key in ctx.registry.keys():
                ctx.registry.delete(key)
        return True, current, None, None
    storage_path = params.get("storage_path") or reg.DEFAULT_STORAGE_PATH
    if not storage_path.startswith("/"):
        raise ValidationError("must be an absolute path on the pool host", "storage_path")
    reserved = params.get("reserved") or {}
    overcommit = params.get("overcommit") or {}
    networks = normalize_networks(params.get("networks"))
    desired = {
        "name": name,
        "labels": check.labels(params.get("labels"), "labels"),
        "taints": normalize_taints(params.get("taints")),
        "overcommit": {"cpu": _ratio(overcommit.get("cpu", 1.0), "overcommit.cpu"),
                       "memory": _ratio(overcommit.get("memory", 1.0), "overcommit.memory")},
        "reserved": {"cpu": int(reserved.get("cpu") or 0),
                     "memory": check.disk_bytes(reserved["memory"], "reserved.memory") if reserved.get("memory")
                     else 0},
        "storage_path": storage_path,
        "networks": [entry["name"] for entry in networks],
    }
    if desired["reserved"]["cpu"] < 0:
        raise ValidationError("must not be negative", "reserved.cpu")
    virt_type = check.one_of(params.get("virt_type") or "auto", ("auto", "kvm", "qemu"), "virt_type")
    if virt_type != "auto":
        desired["virt_type"] = virt_type
    elif current and current.get("virt_type"):
        desired["virt_type"] = current["virt_type"]
    capacity = capacity_of(conn)
    if desired["reserved"]["cpu"] >= capacity["cpu"] or desired["reserved"]["memory"] >= capacity["memory"]:
        raise ValidationError("reserves all of the host (%d cpu, %s)"
                              % (capacity["cpu"], format_quantity(capacity["memory"])), "reserved")
    changed = False
    _pool, made = storage.ensure_dir_pool(conn, reg.REGISTRY_POOL, reg.registry_path(storage_path), check_mode)
    changed |= made
    machines_pool, made = storage.ensure_dir_pool(conn, reg.STORAGE_POOL, storage_path, check_mode)
    changed |= made
    if "virt_type" not in desired and not check_mode:
        desired["virt_type"] = probe_virt_type(conn, machines_pool)
    for entry in networks:
        changed |= ensure_network(conn, entry, check_mode)
    if current != desired:
        changed = True
        if not check_mode:
            ctx.registry.pool = lv.lookup_storage_pool(conn, reg.REGISTRY_POOL)
            ctx.registry.put(reg.POOL_KEY, desired)
    status = None
    if not check_mode or current is not None:
        ctx._registration = desired if not check_mode else current
        status = pool_status(ctx, desired)
    return changed, current, desired, status


# --- snapshots for the scheduler and the inventory ------------------------------------------------------------

def pool_entries(items, field="pools"):
    """Normalize ``pools``: URIs or {name, uri} mappings -> [{name or None, uri}]."""
    if not isinstance(items, list) or not items:
        raise ValidationError("give a list of libvirt URIs or of mappings with name and uri", field)
    entries = []
    for index, item in enumerate(items):
        if isinstance(item, str):
            item = {"uri": item}
        if not isinstance(item, dict) or not item.get("uri"):
            raise ValidationError("needs a uri", "%s[%d]" % (field, index))
        entries.append({"name": item.get("name"), "uri": lv.validate_uri(item["uri"], "%s[%d].uri" % (field,
                                                                                                      index))})
    return entries


def snapshot_of(ctx, given_name=None):
    """What the scheduler needs of one connected pool, in raw numbers."""
    registration = ctx.registration
    sizes = machine_sizes(ctx.conn)
    snapshot = {"name": (registration or {}).get("name") or given_name or ctx.uri, "uri": ctx.uri,
                "labels": {}, "taints": [], "classes": {}, "machines": [size[0] for size in sizes],
                "allocated": {"cpu": sum(s[1] or 0 for s in sizes), "memory": sum(s[2] or 0 for s in sizes)},
                "allocatable": {"cpu": 0, "memory": 0}, "state": "Error", "problem": None}
    if not registration:
        snapshot["problem"] = "not registered (run machinery.compute.machine_pool)"
        return snapshot
    capacity = capacity_of(ctx.conn)
    status = pool_status(ctx, registration, sizes, capacity)
    snapshot.update(labels=registration.get("labels") or {}, taints=registration.get("taints") or [],
                    classes={name: {"cpu": body["cpu"], "memory": body["memory"]}
                             for name, body in ctx.registry.machine_classes().items()},
                    allocatable=allocatable_for(capacity, registration),
                    state=status["state"], problem="; ".join(status["problems"]) or None, status=status)
    return snapshot


def offline_snapshot(entry, problem):
    """A pool that could not be read: Offline, with nothing to offer."""
    return {"name": entry.get("name") or entry["uri"], "uri": entry["uri"], "state": "Offline",
            "problem": problem, "labels": {}, "taints": [], "classes": {}, "machines": [],
            "allocated": {"cpu": 0, "memory": 0}, "allocatable": {"cpu": 0, "memory": 0}}


def read_snapshot(entry):
    """Connect to one pool and take its snapshot; an unreachable pool is Offline, not an exception."""
    from ansible_collections.machinery.compute.plugins.module_utils.pool import PoolContext
    try:
        with lv.Connection(entry["uri"]) as conn:
            return snapshot_of(PoolContext(conn, entry["uri"]), entry.get("name"))
    except lv.libvirt.libvirtError as exc:
        return offline_snapshot(entry, lv.describe(exc))
    except MachineryError as exc:
        return offline_snapshot(entry, str(exc))


def read_snapshots(entries, workers=16):
    """Snapshots of every pool, read in parallel with one connection each, in the order given."""
    from concurrent.futures import ThreadPoolExecutor
    lv.require_libvirt()
    with ThreadPoolExecutor(max_workers=max(1, min(workers, len(entries)))) as executor:
        return list(executor.map(read_snapshot, entries))

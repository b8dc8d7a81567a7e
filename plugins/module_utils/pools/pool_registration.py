# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Registering a host as a pool: its storage, registry, networks and measured virt type, converged through
observe -> plan -> apply like every resource."""

from __future__ import annotations

import copy
import ipaddress
import time

from ansible_collections.machinery.compute.plugins.module_utils.pools import capacity
from ansible_collections.machinery.compute.plugins.module_utils.core import connection as lv
from ansible_collections.machinery.compute.plugins.module_utils.core import domain as dx
from ansible_collections.machinery.compute.plugins.module_utils.core import elements
from ansible_collections.machinery.compute.plugins.module_utils.core import options
from ansible_collections.machinery.compute.plugins.module_utils.coordination import documents
from ansible_collections.machinery.compute.plugins.module_utils.coordination import keys
from ansible_collections.machinery.compute.plugins.module_utils.coordination import locks
from ansible_collections.machinery.compute.plugins.module_utils.core import storage
from ansible_collections.machinery.compute.plugins.module_utils.core import validation as check
from ansible_collections.machinery.compute.plugins.module_utils.core.convergence import (
    Action, Plan, Resource, converge, step)
from ansible_collections.machinery.compute.plugins.module_utils.core.errors import ConflictError, ValidationError
from ansible_collections.machinery.compute.plugins.module_utils.core.quantity import format_quantity
from ansible_collections.machinery.compute.plugins.module_utils.coordination import writer

PROBE_SECONDS = 8.0


def registration_in(registry):
    """The pool's registration in its ``registry`` (documents.Registry), or None when machine_pool never
    registered the host."""
    return registry.get(keys.POOL_KEY, expected=True)


def normalize_taints(items):
    """Taints as Kubernetes has them: key and value by the label rules, one taint per key and effect."""
    taints = []
    for index, item in enumerate(items or []):
        where = "taints[%d]" % index
        if not isinstance(item, dict) or not item.get("key"):
            raise ValidationError("a taint needs a key", where + ".key")
        taint = {"key": check.label_key(item["key"], where + ".key"),
                 "value": check.label_value(item.get("value"), where + ".value"),
                 "effect": check.one_of(item.get("effect") or "NoSchedule", options.TAINT_EFFECTS, where + ".effect")}
        if any(other["key"] == taint["key"] and other["effect"] == taint["effect"] for other in taints):
            raise ValidationError("a taint %s with effect %s is given twice" % (taint["key"], taint["effect"]),
                                  where + ".key")
        taints.append(taint)
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
                 "mode": check.one_of(item.get("mode") or "nat", options.NETWORK_MODES, where + ".mode"),
                 "cidr": None}
        if any(other["name"] == entry["name"] for other in networks):
            raise ValidationError("network %s is listed twice" % entry["name"], where + ".name")
        if item.get("cidr"):
            net = check.network_cidr(item["cidr"], where + ".cidr")
            for position, other in enumerate(networks):
                if other["cidr"] and net.overlaps(ipaddress.IPv4Network(other["cidr"])):
                    raise ValidationError("%s overlaps networks[%d] (%s, %s)"
                                          % (net, position, other["name"], other["cidr"]), where + ".cidr")
            entry["cidr"] = str(net)
        networks.append(entry)
    return networks


def check_host_overlaps(networks, host_networks):
    """A network to be created must not overlap one the host has already (libvirt would refuse it only after
    defining it, or start it and break the routing of both). ``host_networks`` is {name: cidr or None}."""
    for index, entry in enumerate(networks):
        if not entry["cidr"] or entry["name"] in host_networks:
            continue
        net = ipaddress.IPv4Network(entry["cidr"])
        for name, cidr in sorted(host_networks.items()):
            if cidr and net.overlaps(ipaddress.IPv4Network(cidr)):
                raise ConflictError("%s overlaps %s of the host's network %s; choose a free subnet"
                                    % (entry["cidr"], cidr, name), "networks[%d].cidr" % index)


def host_network_cidrs(conn):
    """{name: IPv4 subnet or None} of every libvirt network the host has."""
    return {net.name(): elements.read_network(elements.parse(net.XMLDesc(0)))["cidr"]
            for net in conn.listAllNetworks(0)}


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
    try:
        for kernel in PROBE_KERNELS:
            try:
                dom = writer.write(conn, "createXML", elements.to_string(elements.probe_domain(PROBE_NAME, kernel, log_path)), 0)
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
                    writer.write(dom, "destroy")
                except lv.libvirt.libvirtError:
                    pass
            return "qemu"
        return "qemu"
    finally:
        # QEMU may open the log even for a kernel it then fails to load: it goes whatever happened
        storage_pool.refresh(0)
        storage.delete_volume(storage_pool, log_name)


# --- the pool as a resource ------------------------------------------------------------------------------------

# What a first registration gets for an option (or a sub-option of overcommit and reserved) left out; a pool
# registered already keeps what it has instead, as Ansible modules leave alone what a task does not name.
FIRST_REGISTRATION = {"labels": {}, "taints": [], "overcommit": {"cpu": 1.0, "memory": 1.0, "storage": 1.0},
                      "reserved": {"cpu": 0, "memory": 0, "storage": 0},
                      "storage_path": options.DEFAULT_STORAGE_PATH, "networks": []}


def _kept(params, current, key):
    """The value an option left out keeps: the registered one, else the first registration's."""
    if params.get(key) is not None:
        return None
    return copy.deepcopy((current or {}).get(key, FIRST_REGISTRATION[key]))


def _sub(params, current, key, sub):
    """A sub-option of ``overcommit`` or ``reserved``: given, or the value it keeps."""
    given = params.get(key) or {}
    if given.get(sub) is not None:
        return given[sub], True
    kept = ((current or {}).get(key) or {}).get(sub)
    return (FIRST_REGISTRATION[key][sub] if kept is None else kept), False


def desired_registration(params, current, host_capacity):
    """The registration document params ask for (validated; the measured virt type is kept from ``current``).

    An option left out (None) keeps the registered value, so re-registering a pool with fewer options never
    resets its taints, overcommit or reservations; a given option sets exactly what it says."""
    name = check.dns_label(params.get("name"), "name")
    storage_path = params.get("storage_path") or _kept(params, current, "storage_path")
    if not storage_path.startswith("/"):
        raise ValidationError("must be an absolute path on the pool host", "storage_path")
    overcommit = {}
    for sub in ("cpu", "memory", "storage"):
        value, given = _sub(params, current, "overcommit", sub)
        overcommit[sub] = _ratio(value, "overcommit." + sub) if given else value
    reserved = {}
    value, given = _sub(params, current, "reserved", "cpu")
    reserved["cpu"] = check.whole_number(value, "reserved.cpu") if given else value
    for sub in ("memory", "storage"):
        value, given = _sub(params, current, "reserved", sub)
        if given:  # 0 reserves nothing, as before; anything else is a quantity of at least 1Mi
            value = 0 if value in (0, "0") else check.disk_bytes(value, "reserved." + sub)
        reserved[sub] = value
    labels = _kept(params, current, "labels")
    taints = _kept(params, current, "taints")
    networks = _kept(params, current, "networks")
    desired = {
        "name": name,
        "labels": check.labels(params["labels"], "labels") if labels is None else labels,
        "taints": normalize_taints(params["taints"]) if taints is None else taints,
        "overcommit": overcommit,
        "reserved": reserved,
        "storage_path": storage_path,
        "networks": ([entry["name"] for entry in normalize_networks(params["networks"])] if networks is None
                     else networks),
    }
    if desired["reserved"]["cpu"] < 0:
        raise ValidationError("must not be negative", "reserved.cpu")
    if desired["reserved"]["cpu"] >= host_capacity["cpu"]:
        raise ValidationError("cpu %d reserves all of the host's %d CPUs"
                              % (desired["reserved"]["cpu"], host_capacity["cpu"]), "reserved")
    if desired["reserved"]["memory"] >= host_capacity["memory"]:
        raise ValidationError("memory %s reserves all of the host's %s"
                              % (format_quantity(desired["reserved"]["memory"]), format_quantity(host_capacity["memory"])),
                              "reserved")
    virt_type = check.one_of(params.get("virt_type") or "auto", options.VIRT_TYPES, "virt_type")
    if virt_type != "auto":
        desired["virt_type"] = virt_type
    elif current and current.get("virt_type"):
        desired["virt_type"] = current["virt_type"]
    return desired


def _object_actions(kind, name, seen, definition):
    """Actions that bring a storage pool or network to defined, active and autostarted."""
    if seen is None:
        return [Action("define_" + kind, name, steps=[step("define_" + kind, name), step("start_" + kind, name),
                                                      step("autostart_" + kind, name)], definition=definition)]
    actions = []
    if not seen["active"]:
        actions.append(Action("start_" + kind, name))
    if not seen["autostart"]:
        actions.append(Action("autostart_" + kind, name))
    return actions


def plan_pool(params, observed):
    """The pool's plan: a pure function of the parameters and the observation (``PoolResource.observe``)."""
    name = check.dns_label(params.get("name"), "name")
    state = check.one_of(params.get("state") or "present", options.PRESENCE, "state")
    current = observed["registration"]
    if state == "absent":
        steps = [step("delete_document", key) for key in observed["documents"]]
        steps.append(step("undefine_storage_pool", keys.REGISTRY_POOL))
        if current is None:
            # an empty registry with no registration in it (left by an older release) goes too
            leftover = observed["storage_pools"][keys.REGISTRY_POOL] is not None and not observed["documents"]
            return Plan([Action("unregister", name, steps=steps)] if leftover else [])
        if observed["machines"] and not params.get("force"):
            raise ConflictError("pool %s still has %d machine(s): %s; delete them first or set force: true"
                                % (name, len(observed["machines"]), ", ".join(sorted(observed["machines"]))),
                                "state")
        return Plan([Action("unregister", name, before=current, after=None, steps=steps)])
    networks = normalize_networks(params.get("networks"))
    desired = desired_registration(params, current, observed["capacity"])
    if current and current.get("name") != desired["name"] and observed["machines"]:
        raise ConflictError("this host is registered as pool %s and holds %d machine(s) (%s); it cannot be "
                            "renamed to %s while machines are on it"
                            % (current.get("name"), len(observed["machines"]),
                               ", ".join(sorted(observed["machines"])[:5]), desired["name"]), "name")
    check_host_overlaps(networks, observed.get("host_networks") or {})
    actions = _object_actions("storage_pool", keys.REGISTRY_POOL, observed["storage_pools"][keys.REGISTRY_POOL],
                              documents.registry_path(desired["storage_path"]))
    actions += _object_actions("storage_pool", storage.STORAGE_POOL, observed["storage_pools"][storage.STORAGE_POOL],
                               desired["storage_path"])
    for entry in networks:
        seen = observed["networks"].get(entry["name"])
        if seen is None and not entry["cidr"]:
            raise ValidationError("network %s does not exist on the host; give its cidr to create it"
                                  % entry["name"], "networks")
        actions += _object_actions("network", entry["name"], seen, entry)
    if current != desired:
        steps = [] if "virt_type" in desired else [step("probe_virt_type", name)]
        actions.append(Action("register", name, before=current, after=desired,
                              steps=steps + [step("write_document", keys.POOL_KEY)], registration=desired))
    elif observed.get("superseded"):
        # a generation beside the registration: a writer killed midway left it unreadable, or a prune missed it
        # (the write above would prune it; with nothing to write, it goes on its own)
        actions.append(Action("prune_registration", name, before={"generations": observed["superseded"]},
                              after={"generations": []},
                              steps=[step("delete_document", found) for found in observed["superseded"]]))
    for image in observed.get("unused_images") or []:
        actions.append(Action("prune_image", image, {"image": image}, {},
                              [step("delete_volume", image), step("delete_volume", image + ".complete")]))
    return Plan(actions, registration=desired)


class PoolResource(Resource):
    """One host registered as a pool (or unregistered)."""

    def __init__(self, ctx, params):
        self.ctx = ctx
        self.params = params
        self.conn = ctx.conn

    def describe(self):
        return "pool %s" % self.params.get("name")

    def holds(self, plan, observed):
        """A pool's registration, storage and networks change no machine; the probe of the host's virtualization
        (a transient domain of the collection's own, ``probe_virt_type``) is held as a machine is, so two runs
        registering one host probe it in turn."""
        probing = any(found["action"] == "probe_virt_type" for action in plan.actions for found in action.steps or ())
        return [self.ctx.coordination.of(self.ctx, PROBE_NAME, field="name")] if probing else []

    def observe(self):
        conn = self.conn
        self.ctx.forget_reads()
        registry = self.ctx.registry

        def seen(found):
            return None if found is None else {"active": bool(found.isActive()), "autostart": bool(found.autostart())}
        names = [entry.get("name") if isinstance(entry, dict) else entry for entry in self.params.get("networks") or []]
        return {
            "registration": registration_in(registry),
            "superseded": registry.superseded(keys.POOL_KEY),
            "documents": registry.keys(),
            "storage_pools": {name: seen(lv.lookup_storage_pool(conn, name))
                              for name in (keys.REGISTRY_POOL, storage.STORAGE_POOL)},
            "networks": {name: seen(lv.lookup_network(conn, name)) for name in names if isinstance(name, str)},
            "host_networks": host_network_cidrs(conn),
            "capacity": capacity.capacity_of(conn),
            "machines": [size.name for size in capacity.machine_sizes(conn)],
            "unused_images": unused_images(conn) if self.params.get("prune_images") else [],
        }

    def plan(self, observed):
        return plan_pool(self.params, observed)

    def apply(self, action, observed):
        super().apply(action, observed)
        self.ctx.forget_reads()  # the next action (and the observation after the last) reads the pool afresh

    def _define_storage_pool(self, action, _observed):
        storage.define_dir_pool(self.conn, action.target, action.data["definition"])

    def _start_storage_pool(self, action, _observed):
        storage.start_dir_pool(self.conn, action.target, True)

    def _autostart_storage_pool(self, action, _observed):
        storage.start_dir_pool(self.conn, action.target, False)

    def _define_network(self, action, _observed):
        define_network(self.conn, action.data["definition"])

    def _start_network(self, action, _observed):
        writer.write(lv.lookup_network(self.conn, action.target), "create")

    def _autostart_network(self, action, _observed):
        writer.write(lv.lookup_network(self.conn, action.target), "setAutostart", 1)

    def _register(self, action, _observed):
        registration = dict(action.data["registration"])
        if "virt_type" not in registration:
            registration["virt_type"] = probe_virt_type(self.conn, lv.lookup_storage_pool(self.conn, storage.STORAGE_POOL))
        self.ctx.forget_reads()
        self.ctx.registry.put(keys.POOL_KEY, registration)

    def _prune_registration(self, _action, _observed):
        self.ctx.registry.prune_superseded(keys.POOL_KEY)

    def _unregister(self, _action, _observed):
        for key in self.ctx.registry.keys():
            self.ctx.registry.remove(key)
        storage.remove_pool(self.conn, keys.REGISTRY_POOL)

    def _prune_image(self, action, _observed):
        conn, name = self.conn, action.target
        machines = lv.lookup_storage_pool(conn, storage.STORAGE_POOL)
        # under the admission lock, where creates make their overlays: still unused now that it is to go
        with locks.admission_lock(conn, lv.lookup_storage_pool(conn, keys.REGISTRY_POOL)):
            if name in unused_images(conn):
                storage.delete_volume(machines, name + ".complete")
                storage.delete_volume(machines, name)

    APPLY = {"define_storage_pool": _define_storage_pool, "start_storage_pool": _start_storage_pool,
             "autostart_storage_pool": _autostart_storage_pool, "define_network": _define_network,
             "start_network": _start_network, "autostart_network": _autostart_network, "register": _register,
             "unregister": _unregister, "prune_image": _prune_image, "prune_registration": _prune_registration}


def unused_images(conn):
    """The image caches of the pool's storage that no volume has as its backing file and no domain uses."""
    machines = lv.lookup_storage_pool(conn, storage.STORAGE_POOL)
    if machines is None or not machines.isActive():
        return []
    storage.refresh(machines)
    images, backing = {}, set()
    for vol in machines.listAllVolumes(0):
        name = vol.name()
        if name.startswith("image-") and not name.endswith(".complete"):
            images[vol.path()] = name
        elif name.endswith(".qcow2"):
            backing.add(elements.read_volume(elements.parse(vol.XMLDesc(0)))["backing"])
    for _dom, tree in dx.defined_domains(conn):
        backing.update(disk["path"] for disk in elements.read_disks(tree))
    return sorted(name for path, name in images.items() if path not in backing)


def define_network(conn, entry):
    """Define, start and autostart a network; a definition libvirt refuses is not left behind half made."""
    try:
        net = writer.write(conn, "networkDefineXML", elements.to_string(elements.network(entry["name"], entry["cidr"], entry["mode"])))
    except lv.libvirt.libvirtError as exc:
        raise ConflictError("cannot create network %s: %s" % (entry["name"], lv.describe(exc)), "networks") from None
    try:
        lv.start_or_undefine(net, net.create, lambda: writer.write(net, "setAutostart", 1))
    except lv.libvirt.libvirtError as exc:
        raise ConflictError("cannot start network %s (%s): %s" % (entry["name"], entry["cidr"], lv.describe(exc)),
                            "networks") from None


def ensure_pool(ctx, params, check_mode):
    """Register (or unregister) the host as a pool: (plan, status or None)."""
    resource = PoolResource(ctx, params)
    plan, observed = converge(resource, check_mode)
    registry_pool = lv.lookup_storage_pool(ctx.conn, keys.REGISTRY_POOL)
    if not check_mode and registry_pool is not None and registry_pool.isActive():
        locks.admission_lock(ctx.conn, registry_pool, ctx.coordination.identity).clear_abandoned()
    if observed["registration"] is None or (check_mode and params.get("state") == "absent"):
        return plan, None
    registration = observed["registration"] if not check_mode else observed["registration"]
    return plan, capacity.pool_status(ctx, registration)

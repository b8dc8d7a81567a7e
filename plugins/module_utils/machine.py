# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Machines: desired spec -> plan -> libvirt, and libvirt -> status.

``normalize`` validates the whole request before anything is written; ``MachineService.ensure`` then creates,
updates, starts, stops or deletes, and every step that writes is skipped in check mode.
"""

from __future__ import annotations

import datetime
import threading
import time

from ansible_collections.machinery.compute.plugins.module_utils import connection as lv
from ansible_collections.machinery.compute.plugins.module_utils import domain as dx
from ansible_collections.machinery.compute.plugins.module_utils import images
from ansible_collections.machinery.compute.plugins.module_utils import pools
from ansible_collections.machinery.compute.plugins.module_utils import registry as reg
from ansible_collections.machinery.compute.plugins.module_utils import seed
from ansible_collections.machinery.compute.plugins.module_utils import storage
from ansible_collections.machinery.compute.plugins.module_utils import validation as check
from ansible_collections.machinery.compute.plugins.module_utils.errors import (
    ConflictError, LibvirtFailure, MachineryError, NameTaken, NotFoundError, PoolFull, ValidationError)
from ansible_collections.machinery.compute.plugins.module_utils.quantity import format_quantity

STATES = ("running", "stopped", "present", "absent")
WAITS = ("none", "running", "address")
FIRMWARES = ("bios", "uefi")
VIRT_TYPES = ("auto", "kvm", "qemu")
NIC_MODELS = ("virtio", "e1000e", "rtl8139")
BUSES = ("virtio", "scsi", "sata")
POLL = 0.5


def now():
    return datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0)


# --- request -> normalized spec -------------------------------------------------------------------------------

def _size_from_class(params, ctx, recorded=None):
    """(machine_class, cpu, memory): a class from the pool's registry, explicit cpu/memory, or both (explicit
    values override the class). For an existing machine, what the user leaves out keeps its recorded value."""
    recorded = recorded or {}
    name = params.get("machine_class")
    cpu = check.cpu_count(params["cpu"], "cpu") if params.get("cpu") is not None else None
    memory = check.memory_bytes(params["memory"], "memory") if params.get("memory") is not None else None
    if name:
        check.dns_label(name, "machine_class")
        published = ctx.registry.machine_class(name)
        if published is None:
            raise NotFoundError("class %r is not published on pool %s" % (name, ctx.name or ctx.uri),
                                "machine_class")
        return name, published["cpu"] if cpu is None else cpu, published["memory"] if memory is None else memory
    if recorded:
        return (recorded.get("machine_class"), recorded.get("cpu") if cpu is None else cpu,
                recorded.get("memory") if memory is None else memory)
    if cpu is None or memory is None:
        raise ValidationError("give machine_class, or both cpu and memory", "machine_class")
    return None, cpu, memory


def _volumes(name, items, ctx, taken_devices):
    """Normalized volume entries; device names assigned stably after the root disk (vda)."""
    result = []
    seen = set()
    for index, item in enumerate(items or []):
        where = "volumes[%d]" % index
        if not isinstance(item, dict):
            raise ValidationError("must be a mapping", where)
        vol_name = check.dns_label(item.get("name"), where + ".name")
        if vol_name in seen or vol_name == "root":
            raise ValidationError("volume name %r is used twice (root is the image disk)" % vol_name,
                                  where + ".name")
        seen.add(vol_name)
        sources = [key for key in ("size", "volume", "image") if item.get(key) is not None]
        if len(sources) != 1:
            raise ValidationError("give exactly one of size, volume or image", where)
        entry = {"name": vol_name, "bus": check.one_of(item.get("bus") or "virtio", BUSES, where + ".bus"),
                 "device": item.get("device")}
        ephemeral = item.get("ephemeral")  # None when unset: new volumes are ephemeral, existing ones are not
        if item.get("volume") is not None:
            existing = storage.find_volume(ctx.storage, str(item["volume"]), where + ".volume")
            entry.update(source="volume", volume=existing.name(), size=existing.info()[1],
                         ephemeral=bool(ephemeral))
        else:
            entry.update(volume="%s-%s.qcow2" % (name, vol_name), ephemeral=ephemeral is not False)
            if lv.lookup_volume(ctx.storage, entry["volume"]) is not None:
                raise ConflictError("volume %s already exists in storage pool %s (left by an earlier machine?); "
                                    "delete it, or attach it with volume: %s"
                                    % (entry["volume"], ctx.storage.name(), entry["volume"]), where + ".name")
            if item.get("size") is not None:
                entry.update(source="empty", size=check.disk_bytes(item["size"], where + ".size"))
            else:
                entry.update(source="image", image=images.resolve(item["image"], item.get("image_checksum"),
                                                                  where + ".image"))
        result.append(entry)
    explicit = [entry["device"] for entry in result if entry["device"]]
    for index, entry in enumerate(result):
        if entry["device"] and (entry["device"] in taken_devices or explicit.count(entry["device"]) > 1):
            raise ValidationError("device %s is already taken" % entry["device"], "volumes[%d].device" % index)
    free = iter(dx.device_names(len(result), set(taken_devices) | set(explicit)))
    for entry in result:
        entry["device"] = entry["device"] or next(free)
    return result


def _nics(name, items, ctx):
    if items is None:
        default = (ctx.registration or {}).get("networks") or []
        items = [{"name": "eth0", "network": default[0]}] if default else []
    result = []
    seen = set()
    for index, item in enumerate(items):
        where = "network_interfaces[%d]" % index
        if not isinstance(item, dict):
            raise ValidationError("must be a mapping", where)
        nic_name = check.dns_label(item.get("name"), where + ".name")
        if nic_name in seen:
            raise ValidationError("interface name %r is used twice" % nic_name, where + ".name")
        seen.add(nic_name)
        if bool(item.get("network")) == bool(item.get("bridge")):
            raise ValidationError("give exactly one of network or bridge", where)
        if item.get("network") and ctx.network(item["network"]) is None:
            raise NotFoundError("no network %r on pool %s" % (item["network"], ctx.name or ctx.uri),
                                where + ".network")
        mac = check.mac_address(item["mac"], where + ".mac") if item.get("mac") else dx.derive_mac(name, nic_name)
        result.append({"name": nic_name, "network": item.get("network"), "bridge": item.get("bridge"), "mac": mac,
                       "model": check.one_of(item.get("model") or "virtio", NIC_MODELS, where + ".model"),
                       "ephemeral": bool(item.get("ephemeral", True))})
    macs = [nic["mac"] for nic in result]
    for index, mac in enumerate(macs):
        if macs.count(mac) > 1:
            raise ValidationError("MAC %s is used twice" % mac, "network_interfaces[%d].mac" % index)
    return result


def normalize(params, ctx, existing_record=None, current=None):
    """The desired spec of a machine, validated field by field; reads libvirt, writes nothing.

    For a machine that exists, options the user left out keep their current values: ``current`` holds the
    owned fields as read from the domain (the truth), the record the rest.
    """
    name = check.dns_label(params.get("name"), "name")
    state = check.one_of(params.get("state") or "running", STATES, "state")
    spec = {"name": name, "state": state}
    if state == "absent":
        return spec
    recorded = dict((existing_record or {}).get("spec", {}), **(current or {}))
    spec["labels"] = check.labels(params.get("labels"), "labels") if params.get("labels") is not None \
        else recorded.get("labels", {})
    spec["machine_class"], spec["cpu"], spec["memory"] = _size_from_class(params, ctx, recorded)
    spec["firmware"] = check.one_of(params.get("firmware") or recorded.get("firmware") or "bios", FIRMWARES,
                                    "firmware")
    virt_type = check.one_of(params.get("virt_type") or "auto", VIRT_TYPES, "virt_type")
    spec["virt_type"] = ctx.virt_type() if virt_type == "auto" else virt_type
    ssh_keys = [str(key) for key in (params.get("ssh_authorized_keys") or [])]
    ignition = params.get("ignition")
    cloud_init = params.get("cloud_init")
    if ignition is not None:
        spec["ignition_data"] = seed.ignition_document(ignition, None if cloud_init else ssh_keys)
    if cloud_init is not None or (ssh_keys and ignition is None):
        if cloud_init is not None and not isinstance(cloud_init, dict):
            raise ValidationError("must be a mapping with user_data, meta_data, network_config", "cloud_init")
        spec["seed_files"] = seed.nocloud_files(name, cloud_init, ssh_keys)
    if ignition is None and cloud_init is None and not ssh_keys and existing_record is not None:
        spec["boot_config"] = recorded.get("boot_config")
    else:
        spec["boot_config"] = dx.boot_config_hash(
            spec["ignition_data"].decode() if "ignition_data" in spec else None,
            {key: value.decode() for key, value in spec.get("seed_files", {}).items()} or None, None)
    if existing_record is not None:
        if params.get("image") is not None and params["image"] != recorded.get("image", {}).get("source"):
            raise ConflictError("the image of an existing machine cannot change (it is %s); delete and recreate "
                                "the machine to use %s" % (recorded.get("image", {}).get("source"), params["image"]),
                                "image")
        checksum = params.get("image_checksum")
        if checksum and check.sha256_checksum(checksum) != recorded.get("image", {}).get("checksum"):
            raise ConflictError("the image of an existing machine cannot change (its checksum is %s)"
                                % recorded.get("image", {}).get("checksum"), "image_checksum")
        if params.get("firmware") and params["firmware"] != recorded.get("firmware"):
            raise ConflictError("firmware is fixed at creation (it is %s)" % recorded.get("firmware"), "firmware")
        for key in ("image", "root_size", "volumes", "network_interfaces"):
            spec[key] = recorded.get(key)
        spec["requested_volumes"] = params.get("volumes")
        spec["requested_network_interfaces"] = params.get("network_interfaces")
        return spec
    if not params.get("image"):
        raise ValidationError("is required to create a machine", "image")
    spec["image"] = images.resolve(params["image"], params.get("image_checksum"), "image")
    spec["root_size"] = check.disk_bytes(params["root_size"], "root_size") if params.get("root_size") else None
    spec["volumes"] = _volumes(name, params.get("volumes"), ctx, {"vda"})
    spec["network_interfaces"] = _nics(name, params.get("network_interfaces"), ctx)
    return spec


# --- status ---------------------------------------------------------------------------------------------------

def _is_active(state):
    return state not in (lv.libvirt.VIR_DOMAIN_SHUTOFF, lv.libvirt.VIR_DOMAIN_CRASHED, lv.libvirt.VIR_DOMAIN_NOSTATE)


def _phase(state, reason, record):
    if state in (lv.libvirt.VIR_DOMAIN_RUNNING, lv.libvirt.VIR_DOMAIN_BLOCKED, lv.libvirt.VIR_DOMAIN_PMSUSPENDED):
        return "Running"
    if state == lv.libvirt.VIR_DOMAIN_PAUSED:
        failed = (lv.libvirt.VIR_DOMAIN_PAUSED_CRASHED, lv.libvirt.VIR_DOMAIN_PAUSED_IOERROR,
                  lv.libvirt.VIR_DOMAIN_PAUSED_UNKNOWN)
        return "Failed" if reason in failed else "Running"
    if state == lv.libvirt.VIR_DOMAIN_SHUTDOWN:
        return "Terminating"
    if state == lv.libvirt.VIR_DOMAIN_CRASHED:
        return "Failed"
    if state == lv.libvirt.VIR_DOMAIN_SHUTOFF and reason == lv.libvirt.VIR_DOMAIN_SHUTOFF_CRASHED:
        return "Failed"
    return "Shutdown" if (record or {}).get("boots") else "Pending"


def _age(created, moment):
    if not created:
        return "<unknown>"
    try:
        then = datetime.datetime.fromisoformat(created)
    except ValueError:
        return "<unknown>"
    seconds = max(0, int((moment - then).total_seconds()))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size * (2 if unit != "m" else 1):
            return "%d%s" % (seconds // size, unit)
    return "%ds" % seconds


class AddressBook:
    """DHCP leases of a pool's networks, read once per network per run: {mac: [ip, ...]}."""

    def __init__(self, ctx):
        self.ctx = ctx
        self._leases = {}

    def refresh(self):
        self._leases = {}

    def addresses(self, network, mac):
        if network not in self._leases:
            table = {}
            net = self.ctx.network(network)
            if net is not None and net.isActive():
                try:
                    for lease in net.DHCPLeases():
                        table.setdefault((lease.get("mac") or "").lower(), []).append(lease["ipaddr"])
                except lv.libvirt.libvirtError:
                    table = {}
            self._leases[network] = table
        return list(self._leases[network].get(mac.lower(), []))


def machine_status(dom, ctx, book=None, tree=None, moment=None, state=None):
    """The public ``machine`` return for a domain (the same shape for the module, info and inventory).

    ``tree`` (the persistent XML) and ``state`` ((state, reason)) may be passed when already read."""
    tree = tree if tree is not None else dx.parse(dom.XMLDesc(lv.libvirt.VIR_DOMAIN_XML_INACTIVE))
    record = dx.read_record(tree) or {}
    spec = record.get("spec", {})
    book = book or AddressBook(ctx)
    state, reason = state or dom.state()
    active = _is_active(state)
    phase = _phase(state, reason, record)
    # a device counts as attached once the guest has it: the live XML of a running machine, else the persistent
    shown = dx.parse(dom.XMLDesc(0)) if active else tree
    attached_aliases = {disk["alias"] for disk in dx.disks(shown)} | {nic["alias"] for nic in dx.interfaces(shown)}
    nics = []
    ips = []
    macs = {nic["mac"] for nic in dx.interfaces(shown)}
    for nic in spec.get("network_interfaces") or []:
        found = nic["mac"] in macs
        addresses = book.addresses(nic["network"], nic["mac"]) if (active and nic.get("network")) else []
        ips.extend(addresses)
        nics.append({"name": nic["name"], "mac": nic["mac"], "network": nic.get("network") or nic.get("bridge"),
                     "ip_addresses": addresses, "ephemeral": nic.get("ephemeral", True),
                     "state": "Attached" if found else "Pending"})
    volumes = [{"name": "root", "device": "vda", "size": format_quantity(spec.get("root_size") or 0),
                "ephemeral": True, "state": "Attached" if dx.volume_alias("root") in attached_aliases else "Pending"}]
    for vol in spec.get("volumes") or []:
        volumes.append({"name": vol["name"], "device": vol["device"], "size": format_quantity(vol.get("size") or 0),
                        "ephemeral": vol.get("ephemeral", True),
                        "state": "Attached" if dx.volume_alias(vol["name"]) in attached_aliases else "Pending"})
    cpu = dx.FIELD_BY_NAME["cpu"].read(tree, record)
    memory = dx.FIELD_BY_NAME["memory"].read(tree, record)

    def condition(kind, ok, reason, message=""):
        return {"type": kind, "status": "True" if ok else "False", "reason": reason, "message": message}

    volumes_ready = all(vol["state"] == "Attached" for vol in volumes)
    nics_ready = all(nic["state"] == "Attached" for nic in nics)
    return {
        "name": dom.name(),
        "uuid": dom.UUIDString(),
        "pool": ctx.name,
        "uri": ctx.uri,
        "phase": phase,
        "machine_class": spec.get("machine_class"),
        "cpu": cpu,
        "memory": format_quantity(memory) if memory else None,
        "image": (spec.get("image") or {}).get("source"),
        "labels": spec.get("labels") or {},
        "ip_addresses": ips,
        "network_interfaces": nics,
        "volumes": volumes,
        "conditions": [
            condition("Ready", phase == "Running", phase),
            condition("VolumesReady", volumes_ready, "Attached" if volumes_ready else "Pending"),
            condition("NetworkInterfacesReady", nics_ready, "Attached" if nics_ready else "Pending"),
        ],
        "restart_count": max(0, int(record.get("boots") or 0) - 1),
        "created": record.get("created"),
        "age": _age(record.get("created"), moment or now()),
        "last_error": record.get("last_error"),
        "managed": bool(record),
    }


def console_tail(ctx, names, lines):
    """{name: last ``lines`` lines of the machine's serial console log}, read through a libvirt stream."""
    storage_pool = ctx.storage
    storage_pool.refresh(0)
    tails = {}
    for name in names:
        vol = lv.lookup_volume(storage_pool, "%s-console.log" % name)
        if vol is None:
            tails[name] = []
            continue
        text = storage.download_bytes(ctx.conn, vol).decode("utf-8", errors="replace")
        tails[name] = [line.rstrip("\r") for line in text.splitlines()[-lines:]]
    return tails


TABLE_COLUMNS = ("NAME", "POOL", "CLASS", "PHASE", "RESTARTS", "AGE", "IPS")


def table(machines):
    """Lines like ``kubectl get machines -o wide``."""
    rows = [TABLE_COLUMNS]
    for machine in machines:
        rows.append((machine["name"], machine.get("pool") or "-", machine.get("machine_class") or "-",
                     machine["phase"], str(machine.get("restart_count", 0)), machine.get("age") or "-",
                     ",".join(machine.get("ip_addresses") or []) or "<none>"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(TABLE_COLUMNS))]
    return ["   ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows]


def list_machines(ctx, include_unmanaged=False):
    """Status of every machine of the pool (domains the collection created, unless include_unmanaged)."""
    book = AddressBook(ctx)
    moment = now()
    result = []
    # one call for every domain's state instead of one per domain
    for dom, stats in ctx.conn.getAllDomainStats(lv.libvirt.VIR_DOMAIN_STATS_STATE, 0):
        tree = dx.parse(dom.XMLDesc(lv.libvirt.VIR_DOMAIN_XML_INACTIVE))
        if dx.read_record(tree) is None and not include_unmanaged:
            continue
        state = (stats.get("state.state"), stats.get("state.reason"))
        result.append(machine_status(dom, ctx, book, tree, moment, state if state[0] is not None else None))
    result.sort(key=lambda machine: machine["name"])
    return result


class Admission:
    """The admission locks of this pool and of the peer pools a name must be unique across.

    Locks are taken in the order of their URIs, so concurrent runs never wait on each other in a circle. Under
    them, a name found on a peer pool means another run created it there first."""

    _process_locks = {}
    _process_locks_guard = threading.Lock()

    def __init__(self, ctx, peer_uris):
        self.ctx = ctx
        self.peers = []
        self.opened = []
        for uri in sorted(set(peer_uris) - {ctx.uri}):
            conn = ctx.peer_connections.get(uri)
            if conn is None:
                conn = lv.open_connection(uri, "unique_across")
                self.opened.append(conn)
            self.peers.append((uri, conn))
        self.locks = []
        self.held = []

    @classmethod
    def process_lock(cls, uri):
        """Threads of one run queue here before taking the pool's volume lock, instead of polling it."""
        with cls._process_locks_guard:
            return cls._process_locks.setdefault(uri, threading.Lock())

    def __enter__(self):
        holders = [(self.ctx.uri, self.ctx.conn)] + self.peers
        try:
            for uri, conn in sorted(holders, key=lambda holder: holder[0]):
                local = self.process_lock(uri)
                local.acquire()
                self.held.append(local)
                registry_pool = lv.lookup_storage_pool(conn, reg.REGISTRY_POOL)
                if registry_pool is not None:
                    self.locks.append(reg.AdmissionLock(conn, registry_pool).acquire())
        except BaseException:
            self.__exit__()
            raise
        return self

    def check_unique(self, name):
        for uri, conn in self.peers:
            if lv.lookup_domain(conn, name) is not None:
                raise NameTaken("a machine named %s already exists on pool %s" % (name, uri), "name")

    def __exit__(self, *exc_info):
        for lock in reversed(self.locks):
            lock.release()
        self.locks = []
        for local in reversed(self.held):
            local.release()
        self.held = []
        for conn in self.opened:
            try:
                conn.close()
            except lv.libvirt.libvirtError:
                pass
        self.opened = []
        self.peers = []
        return False


# --- the service ----------------------------------------------------------------------------------------------

class Outcome:
    """What a run did: changed, diff before/after, warnings, and the final status."""

    def __init__(self):
        self.changed = False
        self.before = {}
        self.after = {}
        self.warnings = []
        self.actions = []
        self.machine = {}
        self.restart_required = False

    def did(self, action):
        self.changed = True
        self.actions.append(action)


class MachineService:
    def __init__(self, ctx, check_mode=False):
        self.ctx = ctx
        self.conn = ctx.conn
        self.check_mode = check_mode

    # reading

    def find(self, name):
        dom = lv.lookup_domain(self.conn, name)
        if dom is None:
            return None, None, None
        tree = dx.parse(dom.XMLDesc(lv.libvirt.VIR_DOMAIN_XML_INACTIVE))
        return dom, tree, dx.read_record(tree)

    def status(self, name):
        dom = lv.lookup_domain(self.conn, name)
        if dom is None:
            return {"name": name, "pool": self.ctx.name, "uri": self.ctx.uri, "phase": "Terminated"}
        return machine_status(dom, self.ctx)

    # the entry point

    def ensure(self, params):
        outcome = Outcome()
        name = check.dns_label(params.get("name"), "name")
        state = check.one_of(params.get("state") or "running", STATES, "state")
        dom, tree, record = self.find(name)
        if dom is not None and record is None:
            if not params.get("adopt"):
                raise ConflictError("a domain named %s exists on %s but was not created by machinery.compute; "
                                    "set adopt: true to take it over" % (name, self.ctx.name or self.ctx.uri),
                                    "name")
        if state == "absent":
            if dom is not None:
                self.delete(dom, tree, record or {}, params, outcome)
            outcome.machine = {"name": name, "pool": self.ctx.name, "uri": self.ctx.uri, "phase": "Terminated"}
            return outcome
        if dom is not None and record is None:
            record = self.adopt(dom, tree, params, outcome)
        spec = normalize(params, self.ctx, record, dx.owned_values(tree, record) if dom is not None else None)
        if dom is None:
            dom = self.create(spec, params, outcome)
        else:
            self.update(dom, tree, record, spec, params, outcome)
        if dom is not None:
            self.converge_power(dom, spec, params, outcome)
            outcome.machine = self.status(name)
        else:  # check mode: nothing was created
            outcome.machine = {"name": name, "pool": self.ctx.name, "uri": self.ctx.uri, "phase": "Pending",
                               "machine_class": spec.get("machine_class"), "cpu": spec.get("cpu"),
                               "memory": format_quantity(spec["memory"]), "labels": spec.get("labels")}
        return outcome

    # create

    def _volume_path(self, volume_name):
        return self.ctx.storage_file(volume_name)

    def create(self, spec, params, outcome):
        name = spec["name"]
        outcome.before = {}
        outcome.after = dx.shown({key: spec.get(key) for key in ("cpu", "memory", "machine_class", "labels")})
        outcome.after.update(state=spec["state"], image=spec["image"]["source"])
        self.admit(spec)
        if self.check_mode:
            outcome.did("create")
            return None
        pool = self.ctx.storage
        # the image upload can take long: it happens before the pool's admission lock is taken
        image_vol, fmt = images.ensure_cached(self.conn, pool, spec["image"], self.ctx.url_opener)
        with Admission(self.ctx, params.get("unique_across") or []) as admission:
            admission.check_unique(name)
            self.admit(spec)
            dom = self._create_locked(spec, pool, image_vol, fmt)
        outcome.did("create")
        return dom

    def _create_locked(self, spec, pool, image_vol, fmt):
        name = spec["name"]
        created = []
        try:
            spec["image"]["format"] = fmt
            image_size = image_vol.info()[1]
            root_size = spec["root_size"] or image_size
            if root_size < image_size:
                raise ValidationError("%s is smaller than the image (%s)"
                                      % (format_quantity(root_size), format_quantity(image_size)), "root_size")
            spec["root_size"] = root_size
            root_name = "%s-root.qcow2" % name
            storage.delete_volume(pool, root_name)
            root = storage.create_volume(pool, root_name, root_size, "qcow2", backing=(image_vol.path(), fmt))
            created.append(root_name)
            disks = [{"name": "root", "path": root.path(), "format": "qcow2", "device": "vda", "boot": True}]
            for vol in spec["volumes"]:
                if vol["source"] == "volume":
                    existing = pool.storageVolLookupByName(vol["volume"])
                    disks.append({"name": vol["name"], "path": existing.path(), "device": vol["device"],
                                  "bus": vol["bus"], "format": storage.volume_format(existing)})
                    continue
                if vol["source"] == "image":
                    backing_vol, backing_fmt = images.ensure_cached(self.conn, pool, vol["image"], self.ctx.url_opener)
                    size = max(backing_vol.info()[1], vol.get("size") or 0)
                    new = storage.create_volume(pool, vol["volume"], size, "qcow2",
                                                backing=(backing_vol.path(), backing_fmt))
                    vol["size"] = size
                else:
                    new = storage.create_volume(pool, vol["volume"], vol["size"], "qcow2")
                created.append(vol["volume"])
                disks.append({"name": vol["name"], "path": new.path(), "device": vol["device"], "bus": vol["bus"],
                              "format": "qcow2"})
            files = {"console": "%s-console.log" % name}
            ignition_path = seed_path = None
            if "ignition_data" in spec:
                files["ignition"] = "%s-ignition.json" % name
                ignition_path = storage.write_secret_volume(self.conn, pool, files["ignition"],
                                                            spec["ignition_data"]).path()
                created.append(files["ignition"])
            if "seed_files" in spec:
                files["seed"] = "%s-cidata.iso" % name
                seed_path = storage.write_secret_volume(self.conn, pool, files["seed"],
                                                        seed.nocloud_iso(spec["seed_files"])).path()
                created.append(files["seed"])
            record = {"version": dx.RECORD_VERSION, "created": now().isoformat(), "boots": 0, "last_error": None,
                      "spec": _recorded_spec(spec, files)}
            plan = {"name": name, "virt_type": spec["virt_type"], "cpu": spec["cpu"], "memory": spec["memory"],
                    "firmware": spec["firmware"], "record": record, "disks": disks, "nics": spec["network_interfaces"],
                    "ignition_path": ignition_path, "seed_path": seed_path,
                    "console_path": self._volume_path(files["console"])}
            try:
                return self.conn.defineXML(dx.tostring(dx.build_domain(plan)))
            except lv.libvirt.libvirtError as exc:
                raise LibvirtFailure("cannot define machine %s: %s" % (name, lv.describe(exc))) from None
        except BaseException:
            for volume_name in created:
                try:
                    storage.delete_volume(pool, volume_name)
                except MachineryError:
                    pass
            raise

    def admit(self, spec):
        """Admission on the pool itself: refuse when the machines already defined leave no room."""
        registration = self.ctx.registration
        if not registration:
            return
        allocatable = pools.registered_allocatable(self.conn, registration)
        others = [size for size in pools.machine_sizes(self.conn) if size[0] != spec["name"]]
        used_cpu = sum(size[1] or 0 for size in others)
        used_memory = sum(size[2] or 0 for size in others)
        if used_cpu + spec["cpu"] > allocatable["cpu"] or used_memory + spec["memory"] > allocatable["memory"]:
            raise PoolFull("pool %s is full: %d/%d cpu and %s/%s memory are allocated, %s needs %d cpu and %s"
                           % (self.ctx.name, used_cpu, allocatable["cpu"], format_quantity(used_memory),
                              format_quantity(allocatable["memory"]), spec["name"], spec["cpu"],
                              format_quantity(spec["memory"])), "machine_pool")

    # adopt

    def adopt(self, dom, tree, params, outcome):
        """Take over a domain the collection did not create: record it as it is, change nothing else."""
        info = dom.info()
        record = {"version": dx.RECORD_VERSION, "created": now().isoformat(), "boots": 1 if dom.isActive() else 0,
                  "last_error": None, "adopted": True,
                  "spec": {"name": dom.name(), "machine_class": None, "cpu": info[3], "memory": info[1] * 1024,
                           "labels": {}, "firmware": "uefi" if tree.find("os[@firmware='efi']") is not None
                           else "bios", "image": {"source": params.get("image")}, "volumes": [],
                           "network_interfaces": [], "root_size": None, "boot_config": None, "files": {}}}
        outcome.did("adopt")
        if not self.check_mode:
            dx.write_record(tree, record)
            self._define(tree)
        return record

    # update

    def update(self, dom, tree, record, spec, params, outcome):
        names = dx.changed_fields(tree, record, spec)
        self._note_device_requests(spec, record, outcome)
        if not names:
            return
        current = dx.owned_values(tree, record)
        outcome.before = dx.shown({name: current[name] for name in names})
        outcome.after = dx.shown({name: spec[name] for name in names})
        if "boot_config" in names:
            self._check_boot_files(spec, record)
        outcome.did("update " + ", ".join(names))
        if ("cpu" in names and spec["cpu"] > (current["cpu"] or 0)) or \
                ("memory" in names and spec["memory"] > (current["memory"] or 0)):
            self.admit(spec)
        if self.check_mode:
            return
        if "boot_config" in names:
            self._rewrite_boot_files(spec, record)
        record = dict(record)
        record["spec"] = dict(record["spec"])
        dx.apply_fields(tree, record, spec, names)
        self._define(tree)
        if dom.isActive():
            self._apply_live(dom, record, names, spec, current, outcome)

    def _note_device_requests(self, spec, record, outcome):
        recorded_volumes = [vol["name"] for vol in record["spec"].get("volumes") or []]
        requested_volumes = [item.get("name") for item in spec.get("requested_volumes") or []]
        if spec.get("requested_volumes") is not None and requested_volumes != recorded_volumes:
            outcome.warnings.append("volumes of an existing machine are changed with machinery.compute."
                                    "volume_attach; the volumes option was not applied")
        recorded_nics = [nic["name"] for nic in record["spec"].get("network_interfaces") or []]
        requested_nics = [item.get("name") for item in spec.get("requested_network_interfaces") or []]
        if spec.get("requested_network_interfaces") is not None and requested_nics != recorded_nics:
            outcome.warnings.append("network interfaces of an existing machine are changed with machinery.compute."
                                    "nic_attach; the network_interfaces option was not applied")

    def _check_boot_files(self, spec, record):
        """A new boot configuration reuses the machine's Ignition file or seed ISO; it cannot add a device."""
        files = record["spec"].get("files") or {}
        if "ignition_data" in spec and not files.get("ignition"):
            raise ConflictError("%s was created without Ignition; the fw_cfg entry can only be added by recreating "
                                "the machine" % spec["name"], "ignition")
        if "seed_files" in spec and not files.get("seed"):
            raise ConflictError("%s was created without a cloud-init seed; the cdrom can only be added by "
                                "recreating the machine" % spec["name"], "cloud_init")

    def _rewrite_boot_files(self, spec, record):
        files = record["spec"].setdefault("files", {})
        pool = self.ctx.storage
        if "ignition_data" in spec and files.get("ignition"):
            storage.write_secret_volume(self.conn, pool, files["ignition"], spec["ignition_data"])
        if "seed_files" in spec and files.get("seed"):
            storage.write_secret_volume(self.conn, pool, files["seed"], seed.nocloud_iso(spec["seed_files"]))

    def _define(self, tree):
        try:
            return self.conn.defineXML(dx.tostring(tree))
        except lv.libvirt.libvirtError as exc:
            raise LibvirtFailure("cannot redefine %s: %s" % (tree.findtext("name"), lv.describe(exc))) from None

    def _apply_live(self, dom, record, names, spec, current, outcome):
        """Carry the change into the running guest where libvirt can; otherwise say a restart is needed."""
        live = lv.libvirt.VIR_DOMAIN_AFFECT_LIVE
        try:
            dom.setMetadata(lv.libvirt.VIR_DOMAIN_METADATA_ELEMENT, dx.record_xml(record), dx.PREFIX, dx.NAMESPACE,
                            live)
        except lv.libvirt.libvirtError:
            pass
        pending = []
        if "cpu" in names:
            pending.append("cpu")
        if "memory" in names:
            max_kib = dom.maxMemory()
            if spec["memory"] // 1024 <= max_kib:
                try:
                    dom.setMemoryFlags(spec["memory"] // 1024, live)
                except lv.libvirt.libvirtError:
                    pending.append("memory")
            else:
                pending.append("memory")
        if "boot_config" in names:
            outcome.warnings.append("the new boot configuration is read by the guest at its next first boot")
        if pending:
            outcome.restart_required = True
            outcome.warnings.append("%s of the running machine %s take effect at its next restart"
                                    % (" and ".join(pending), spec["name"]))

    # power

    def converge_power(self, dom, spec, params, outcome):
        state = spec["state"]
        active = dom.isActive()
        if state == "running":
            if not active:
                outcome.did("start")
                if not self.check_mode:
                    self.start(dom)
            if not self.check_mode:
                self.wait(dom, spec, params)
        elif state == "stopped" and active:
            outcome.did("stop")
            if not self.check_mode:
                forced = self.shutdown(dom, params.get("shutdown_timeout", 60))
                if forced:
                    outcome.warnings.append("%s did not power off within %ss of the ACPI request and was forced off"
                                            % (spec["name"], params.get("shutdown_timeout", 60)))

    def start(self, dom):
        state, reason = dom.state()
        try:
            if state == lv.libvirt.VIR_DOMAIN_PAUSED and reason != lv.libvirt.VIR_DOMAIN_PAUSED_CRASHED:
                dom.resume()
            else:
                if state != lv.libvirt.VIR_DOMAIN_SHUTOFF:
                    dom.destroy()
                dom.create()
        except lv.libvirt.libvirtError as exc:
            self._record_error(dom, "start failed: %s" % lv.describe(exc))
            raise LibvirtFailure("cannot start %s: %s" % (dom.name(), lv.describe(exc))) from None
        self._bump_boots(dom)

    def _update_record(self, dom, change):
        tree = dx.parse(dom.XMLDesc(lv.libvirt.VIR_DOMAIN_XML_INACTIVE))
        record = dx.read_record(tree)
        if record is None:
            return
        change(record)
        flags = lv.libvirt.VIR_DOMAIN_AFFECT_CONFIG
        if dom.isActive():
            flags |= lv.libvirt.VIR_DOMAIN_AFFECT_LIVE
        dom.setMetadata(lv.libvirt.VIR_DOMAIN_METADATA_ELEMENT, dx.record_xml(record), dx.PREFIX, dx.NAMESPACE,
                        flags)

    def _bump_boots(self, dom):
        def bump(record):
            record["boots"] = int(record.get("boots") or 0) + 1
            record["last_error"] = None
        self._update_record(dom, bump)

    def _record_error(self, dom, message):
        def note(record):
            record["last_error"] = message
        try:
            self._update_record(dom, note)
        except lv.libvirt.libvirtError:
            pass

    def wait(self, dom, spec, params):
        wait = check.one_of(params.get("wait") or "running", WAITS, "wait")
        if wait != "address":
            return
        timeout = float(params.get("wait_timeout") or 300)
        nics = [nic for nic in spec.get("network_interfaces") or [] if nic.get("network")]
        if not nics:
            raise ValidationError("wait: address needs a network interface on a libvirt network", "wait")
        deadline = time.monotonic() + timeout
        book = AddressBook(self.ctx)
        while True:
            if any(book.addresses(nic["network"], nic["mac"]) for nic in nics):
                return
            if not dom.isActive():
                raise MachineryError("%s stopped while waiting for an address" % spec["name"], "wait")
            if time.monotonic() > deadline:
                raise MachineryError("%s got no DHCP address within %ss" % (spec["name"], timeout), "wait_timeout")
            time.sleep(POLL)
            book.refresh()

    def shutdown(self, dom, timeout):
        """ACPI power button, repeated every few seconds; destroy after ``timeout``. True when forced."""
        deadline = time.monotonic() + float(timeout)
        last_request = 0.0
        while dom.isActive():
            if time.monotonic() > deadline:
                try:
                    dom.destroy()
                except lv.libvirt.libvirtError:
                    if dom.isActive():
                        raise
                return True
            if time.monotonic() - last_request > 5:
                try:
                    dom.shutdownFlags(lv.libvirt.VIR_DOMAIN_SHUTDOWN_ACPI_POWER_BTN)
                except lv.libvirt.libvirtError:
                    if not dom.isActive():
                        break
                last_request = time.monotonic()
            time.sleep(0.2)
        return False

    # delete

    def delete(self, dom, tree, record, params, outcome):
        outcome.before = {"state": "present"}
        outcome.after = {"state": "absent"}
        outcome.did("delete")
        if self.check_mode:
            return
        if dom.isActive():
            forced = self.shutdown(dom, params.get("shutdown_timeout", 60))
            if forced:
                outcome.warnings.append("%s did not power off within %ss and was forced off"
                                        % (dom.name(), params.get("shutdown_timeout", 60)))
        flags = (lv.libvirt.VIR_DOMAIN_UNDEFINE_MANAGED_SAVE | lv.libvirt.VIR_DOMAIN_UNDEFINE_SNAPSHOTS_METADATA |
                 lv.libvirt.VIR_DOMAIN_UNDEFINE_NVRAM | lv.libvirt.VIR_DOMAIN_UNDEFINE_CHECKPOINTS_METADATA)
        try:
            dom.undefineFlags(flags)
        except lv.libvirt.libvirtError as exc:
            if exc.get_error_code() != lv.libvirt.VIR_ERR_NO_DOMAIN:
                raise LibvirtFailure("cannot undefine %s: %s" % (dom.name(), lv.describe(exc))) from None
        for volume_name in ephemeral_volumes(record):
            pool = self.ctx.storage
            if volume_name.endswith("-console.log"):
                pool.refresh(0)
            storage.delete_volume(pool, volume_name)


def ephemeral_volumes(record):
    """Every volume that lives and dies with the machine: root, ephemeral disks, seed, Ignition, console log."""
    spec = record.get("spec", {})
    if record.get("adopted") or not spec.get("name"):
        return []  # not ours to delete: only the domain goes
    names = ["%s-root.qcow2" % spec.get("name")]
    names.extend(vol["volume"] for vol in spec.get("volumes") or [] if vol.get("ephemeral"))
    names.extend(spec.get("files", {}).values())
    return names


def _recorded_spec(spec, files):
    """The normalized spec as the record keeps it: sizes and references, no boot configuration content."""
    kept = {key: spec.get(key) for key in ("name", "machine_class", "cpu", "memory", "labels", "firmware",
                                           "virt_type", "root_size", "boot_config")}
    kept["image"] = {key: spec["image"].get(key) for key in ("source", "checksum", "format")}
    kept["volumes"] = [{key: value for key, value in vol.items() if key != "image"} for vol in spec["volumes"]]
    for vol, source in zip(kept["volumes"], spec["volumes"]):
        if source.get("image"):
            vol["image"] = {"source": source["image"]["source"], "checksum": source["image"]["checksum"]}
    kept["network_interfaces"] = spec["network_interfaces"]
    kept["files"] = files
    return kept

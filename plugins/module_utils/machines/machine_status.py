# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A machine as the modules, info and the inventory return it: phase, conditions, addresses, the table."""

from __future__ import annotations

import datetime
import threading
from concurrent.futures import ThreadPoolExecutor

from ansible_collections.machinery.compute.plugins.module_utils.core import capabilities
from ansible_collections.machinery.compute.plugins.module_utils.core import connection as lv
from ansible_collections.machinery.compute.plugins.module_utils.core import domain as dx
from ansible_collections.machinery.compute.plugins.module_utils.core import elements
from ansible_collections.machinery.compute.plugins.module_utils.machines import guest as agent
from ansible_collections.machinery.compute.plugins.module_utils.core import storage
from ansible_collections.machinery.compute.plugins.module_utils.core.errors import MachineryError
from ansible_collections.machinery.compute.plugins.module_utils.core.quantity import format_quantity


def now():
    return datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0)


def is_active(state):
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


def _power_state(dom, state, reason, active, saved=None):
    """running, paused, suspended (memory saved by libvirt), off or crashed; ``saved``: whether the domain has a
    managed save image, when already read."""
    errors = (lv.libvirt.VIR_DOMAIN_PAUSED_CRASHED, lv.libvirt.VIR_DOMAIN_PAUSED_IOERROR)
    if state == lv.libvirt.VIR_DOMAIN_PAUSED and reason not in errors:
        return "paused"
    if active:
        return "running"
    if state == lv.libvirt.VIR_DOMAIN_CRASHED or reason == lv.libvirt.VIR_DOMAIN_SHUTOFF_CRASHED:
        return "crashed"
    if saved is None:
        saved = dom.hasManagedSaveImage(0)
    return "suspended" if saved else "off"


def age(created, moment=None):
    """How long ago ``created`` (an ISO time) was, as kubectl shows it: 45s, 12m, 3h, 2d."""
    return _age(created, moment or now())


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


class PoolView:
    """What statuses need of a pool beyond each domain, read at most once per run: the DHCP leases of its
    networks ({mac: [ip, ...]} per network) and the names of the volumes in its storage."""

    def __init__(self, ctx, volumes_of=None):
        self.ctx = ctx
        self._leases = {}
        self._volumes = None
        # a view whose listing of volumes this one shares (the statuses of changed machines take fresh leases,
        # but not a listing of the whole storage each: that grows with the pool)
        self._volumes_of = volumes_of
        self._relisted = False
        self._guard = threading.Lock()

    def refresh(self):
        self._leases = {}
        self._volumes = None

    def note_volumes(self, names):
        """Volumes this run created after the listing was read (a listing read later has them anyway)."""
        with self._guard:
            if self._volumes is not None:
                self._volumes[1].update(names)

    def _list_volumes(self):
        try:
            return (self.ctx.storage_path.rstrip("/") + "/", set(self.ctx.storage.listVolumes()))
        except MachineryError:
            return ("", set())

    def _leases_of(self, network, mac):
        """[(address, expiry time)] of the DHCP leases ``network`` lists for ``mac`` (expiry 0: a lease that
        never expires)."""
        if network not in self._leases:
            table = {}
            net = self.ctx.network(network)
            if net is not None and net.isActive():
                try:
                    for lease in net.DHCPLeases():
                        table.setdefault((lease.get("mac") or "").lower(), []).append(
                            (lease["ipaddr"], int(lease.get("expirytime") or 0)))
                except lv.libvirt.libvirtError:
                    table = {}
            self._leases[network] = table
        return self._leases[network].get(mac.lower(), [])

    def addresses(self, network, mac, renewed_after=None):
        """The addresses leased to ``mac`` on ``network``. With ``renewed_after`` (an expiry time read before the
        guest booted, see ``lease_expiry``) only leases that expire later: leases the booting guest itself was
        granted or renewed, not one dnsmasq still keeps for an earlier guest with the same MAC."""
        return [address for address, expiry in self._leases_of(network, mac)
                if not renewed_after or expiry > renewed_after]

    def lease_expiry(self, network, mac):
        """The latest expiry time of the leases ``network`` lists for ``mac``, or None when it lists none, or
        only leases that never expire (which a renewal leaves unchanged, so they cannot tell old from new)."""
        expiries = [expiry for _address, expiry in self._leases_of(network, mac)]
        return max(expiries) if expiries and min(expiries) > 0 else None

    def missing(self, path):
        """True when ``path`` lies in the pool's storage but no volume of the storage pool has it."""
        if self._volumes_of is not None:
            if not self._volumes_of.missing(path):
                return False
            if self._relisted:
                return True
            self._relisted = True  # made since the listing by another way than a create: list again, once
            self._volumes_of.refresh_volumes()
            return self._volumes_of.missing(path)
        with self._guard:
            if self._volumes is None:
                self._volumes = self._list_volumes()
            prefix, names = self._volumes
        return bool(prefix and path and path.startswith(prefix) and path[len(prefix):] not in names)

    def refresh_volumes(self):
        with self._guard:
            self._volumes = self._list_volumes()


def _condition(kind, ok, reason, message=""):
    return {"type": kind, "status": "True" if ok else "False", "reason": reason, "message": message}


def _nic_states(spec, shown, view, active):
    macs = elements.interface_macs(shown)
    nics = []
    for nic in spec.get("network_interfaces") or []:
        addresses = view.addresses(nic["network"], nic["mac"]) if (active and nic.get("network")) else []
        nics.append({"name": nic["name"], "mac": nic["mac"], "network": nic.get("network") or nic.get("bridge"),
                     "ip_addresses": addresses, "ephemeral": nic.get("ephemeral", True),
                     "ip_address": nic.get("ip_address"),
                     "state": "Attached" if nic["mac"] in macs else "Pending"})
    return nics


def _volume_states(spec, tree, shown, view):
    """Each volume of the record: Attached when the guest has it, Pending when not yet, Missing when the volume
    it uses is gone from the pool's storage (a machine that cannot start again)."""
    paths = elements.disk_files(tree)
    attached = paths if shown is tree else elements.disk_files(shown)
    entries = [{"name": "root", "device": "vda", "size": spec.get("root_size"), "ephemeral": True}] \
        if spec.get("image", {}) is not None else []  # a machine booted from a volume has no root disk
    entries += [{"name": vol["name"], "device": vol["device"], "size": vol.get("size"),
                 "ephemeral": vol.get("ephemeral", True), "iops": vol.get("iops"),
                 "throughput": vol.get("throughput"), "encrypted": bool(vol.get("encrypted"))}
                for vol in spec.get("volumes") or []]
    volumes = []
    for entry in entries:
        alias = dx.volume_alias(entry["name"])
        state = "Attached" if alias in attached else "Pending"
        if view.missing(paths.get(alias)):
            state = "Missing"
        volumes.append(dict(entry, size=format_quantity(entry["size"] or 0), state=state))
    return volumes


# The conditions that make a machine available (machine sets count those); BootstrapReady only reports.
AVAILABILITY_CONDITIONS = ("Ready", "VolumesReady", "NetworkInterfacesReady")
# Machines whose agents a listing asks at the same time (each answer is a few round trips into a guest).
GUEST_WORKERS = 8


def _bootstrap_condition(active, connected, facts, asked):
    """vitistack's BootstrapReady: the guest runs an agent (it opened the agent's channel, or answered)."""
    if facts is not None:
        return _condition("BootstrapReady", True, "GuestAgentAnswered")
    if not active:
        return _condition("BootstrapReady", False, "NotRunning")
    if connected and not asked:
        return _condition("BootstrapReady", True, "GuestAgentConnected")
    if connected:
        return _condition("BootstrapReady", False, "GuestAgentSilent",
                          "the guest agent's channel is open but the agent did not answer")
    return dict(_condition("BootstrapReady", False, "NoGuestAgent", "no guest agent has connected"),
                status="Unknown")


def _base_status(dom, ctx, view, tree, moment, state, record=None, flags=(None, None)):
    """The status without the guest's facts, and whether the machine runs and its agent's channel is connected.
    ``record`` (read from ``tree``) and ``flags`` (autostart, managed save; see pool_context.Reading) may be
    passed when already read."""
    if tree is None:
        tree = dx.parse(dom.XMLDesc(lv.libvirt.VIR_DOMAIN_XML_INACTIVE))
        record = None
    record = (record if record is not None else dx.read_record(tree)) or {}
    spec = record.get("spec", {})
    view = view or PoolView(ctx)
    state, reason = state or dom.state()
    active = is_active(state)
    phase = _phase(state, reason, record)
    # a device counts as attached once the guest has it: the live XML of a running machine, else the persistent
    shown = dx.parse(dom.XMLDesc(0)) if active else tree
    nics = _nic_states(spec, shown, view, active)
    volumes = _volume_states(spec, tree, shown, view)
    missing = [vol["name"] for vol in volumes if vol["state"] == "Missing"]
    volumes_ready = all(vol["state"] == "Attached" for vol in volumes)
    nics_ready = all(nic["state"] == "Attached" for nic in nics)
    memory = dx.read_memory(tree)
    status = {
        "name": dom.name(),
        "uuid": dom.UUIDString(),
        "pool": ctx.name,
        "uri": ctx.uri,
        "phase": phase,
        "machine_class": spec.get("machine_class"),
        "cpu": dx.read_cpu(tree),
        "topology": capabilities.read_topology(tree),
        "swap": format_quantity(spec["swap"]) if spec.get("swap") else None,
        "memory": format_quantity(memory) if memory else None,
        "image": (spec.get("image") or {}).get("source"),
        "labels": spec.get("labels") or {},
        "server_group": spec.get("server_group"),
        "ip_addresses": [address for nic in nics for address in nic["ip_addresses"]],
        "network_interfaces": nics,
        "volumes": volumes,
        "conditions": [
            _condition("Ready", phase == "Running" and state != lv.libvirt.VIR_DOMAIN_PAUSED,
                       "Paused" if phase == "Running" and state == lv.libvirt.VIR_DOMAIN_PAUSED else phase),
            _condition("VolumesReady", volumes_ready, "Missing" if missing else
                       "Attached" if volumes_ready else "Pending",
                       "volume(s) gone from the pool's storage: %s" % ", ".join(missing) if missing else ""),
            _condition("NetworkInterfacesReady", nics_ready, "Attached" if nics_ready else "Pending"),
        ],
        "guest": None,
        "restart_count": max(0, int(record.get("boots") or 0) - 1),
        "run_strategy": spec.get("run_strategy"),
        "power_state": _power_state(dom, state, reason, active, flags[1]),
        "autostart": bool(dom.autostart() if flags[0] is None else flags[0]),
        "created": record.get("created"),
        "age": _age(record.get("created"), moment or now()),
        "last_error": record.get("last_error"),
        "managed": bool(record),
    }
    return status, active, active and agent.agent_connected(shown)


def _with_guest(status, active, connected, facts, asked):
    """Add what the agent said: ``guest``, BootstrapReady, and the guest's own addresses when no lease has one
    (a NIC on a host bridge, or with a static address)."""
    status["guest"] = facts
    status["conditions"].append(_bootstrap_condition(active, connected, facts, asked))
    if not status["ip_addresses"] and facts and facts.get("interfaces"):
        status["ip_addresses"] = agent.routable_addresses(facts["interfaces"])
    return status


def machine_status(dom, ctx, view=None, tree=None, moment=None, state=None, guest=True, record=None,
                   flags=(None, None)):
    """The public ``machine`` return for a domain (the same shape for the module, info and inventory).

    ``tree`` (the persistent XML), ``state`` ((state, reason)), ``record`` (read from that tree) and ``flags``
    ((autostart, managed save)) may be passed when already read. With
    ``guest``, a running machine whose agent channel is connected is asked for its facts (``guest``); a
    machine without one costs nothing more."""
    status, active, connected = _base_status(dom, ctx, view, tree, moment, state, record, flags)
    facts = agent.guest_facts(dom) if (guest and connected) else None
    return _with_guest(status, active, connected, facts, guest)


def console_tail(ctx, names, lines):
    """{name: last ``lines`` lines of the machine's serial console log}, read through a libvirt stream."""
    storage_pool = ctx.storage
    storage.refresh(storage_pool)
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


def list_machines(ctx, include_unmanaged=False, guest=True, keep=True):
    """Status of every machine of the pool (domains the collection created, unless include_unmanaged).

    With ``guest``, the agents of the machines whose agent channel is connected are asked for their facts, up to
    GUEST_WORKERS at a time; the rest of the reading stays one pass over the domains. Without ``keep`` (a reader
    that needs only the statuses: machine_info, the inventory), the parsed domains are not kept for the run."""
    view = ctx.view()
    moment = now()
    entries = []
    # the pool's listing: one call for every domain's state, each domain's XML read once per run
    for reading in ctx.readings(keep):
        if reading.record is None and not include_unmanaged:
            continue
        try:
            entries.append((reading.dom,) + _base_status(reading.dom, ctx, view, reading.tree, moment,
                                                         reading.state, reading.record,
                                                         (reading.autostart, reading.saved)))
        except lv.libvirt.libvirtError as exc:
            # gone since the listing (a live move that ended, a run's delete): as a listing made now would be
            if exc.get_error_code() != lv.libvirt.VIR_ERR_NO_DOMAIN:
                raise
    asking = [dom for dom, _status, _active, connected in entries if guest and connected]
    facts = {}
    if asking:
        with ThreadPoolExecutor(max_workers=min(GUEST_WORKERS, len(asking))) as executor:
            facts = dict(zip((dom.UUIDString() for dom in asking), executor.map(agent.guest_facts, asking)))
    result = [_with_guest(status, active, connected, facts.get(dom.UUIDString()), guest)
              for dom, status, active, connected in entries]
    result.sort(key=lambda machine: machine["name"])
    return result

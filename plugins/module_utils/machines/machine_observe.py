# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A machine's observation: ``observe_machine`` reads its domain once (its XML, state, record, reservations and
security groups), and ``Observed`` is what the planner (machine_plan.py) takes. The machine resource
(machine.py) completes it with what its plan needs from the pool (``spec``, ``current``, ``snapshots``,
``efi_vars``, ``moment``), so that planning reads nothing: a unit test plans from a recorded one.
"""

from __future__ import annotations

from ansible_collections.machinery.compute.plugins.module_utils.core import connection as lv
from ansible_collections.machinery.compute.plugins.module_utils.core import domain as dx
from ansible_collections.machinery.compute.plugins.module_utils.core import elements
from ansible_collections.machinery.compute.plugins.module_utils.coordination import documents
from ansible_collections.machinery.compute.plugins.module_utils.coordination.journals import journal_of
from ansible_collections.machinery.compute.plugins.module_utils.pools import security_groups as sgs
from ansible_collections.machinery.compute.plugins.module_utils.machines.addresses import observe_reservations
from ansible_collections.machinery.compute.plugins.module_utils.machines.machine_status import is_active


class Observed:
    """One reading of a machine's domain. ``dom`` is None when there is no domain of that name."""

    def __init__(self, name, dom=None, tree=None, record=None, state=None, live_max_memory=None, autostart=None,
                 saved=None):
        self.name = name
        self.dom = dom
        self.tree = tree
        self.record = record
        self.state = state  # (state, reason)
        self.live_max_memory = live_max_memory  # bytes the running guest can balloon up to
        self.journal = None  # of a dead run, for a machine that does not exist
        self.snapshots = 0  # how many snapshots it has: read only when a rebuild is wanted (they refuse it)
        self.security_groups = {}  # NIC name -> the groups guarding it, read from its nwfilter
        # {(guid, name): varstore.Variable} of its UEFI variables store (None: none yet); read only when a run
        # gives efi_vars (MachineResource.plan)
        self.efi_vars = None
        # what the machine resource adds before planning (machine.MachineResource._complete)
        self.pool = None  # the pool's name, for messages
        self.spec = None  # the spec normalized against the pool
        self.current = None  # the owned values, when normalizing read them
        self.moment = None  # when an adoption is recorded
        self.adopted = None  # the record an adoption writes
        self._autostart = autostart
        self._saved = saved

    @property
    def exists(self):
        return self.dom is not None

    @property
    def managed(self):
        return self.record is not None

    @property
    def active(self):
        return self.exists and is_active(self.state[0])

    @property
    def autostart(self):
        """Whether the host starts the machine when its daemon starts (read once, when a plan asks)."""
        if not self.exists:
            return False
        if self._autostart is None:
            self._autostart = bool(self.dom.autostart())
        return self._autostart

    @property
    def paused(self):
        """Paused by a request (pause, or started paused), not by an error."""
        return self.exists and self.state[0] == lv.libvirt.VIR_DOMAIN_PAUSED and self.state[1] not in (
            lv.libvirt.VIR_DOMAIN_PAUSED_CRASHED, lv.libvirt.VIR_DOMAIN_PAUSED_IOERROR)

    @property
    def saved(self):
        """Off with its memory saved by libvirt (managed save): a start resumes it."""
        if not self.exists or self.active:
            return False
        if self._saved is None:
            self._saved = bool(self.dom.hasManagedSaveImage(0))
        return self._saved

    @property
    def power(self):
        """The power state a diff shows."""
        if not self.exists:
            return None
        if self.paused:
            return "paused"
        if self.active:
            return "running"
        return "suspended" if self.saved else "off"

    @property
    def failed(self):
        """Off because it crashed or failed, not because it was shut down."""
        if not self.exists:
            return False
        state, reason = self.state
        failures = (lv.libvirt.VIR_DOMAIN_SHUTOFF_CRASHED, lv.libvirt.VIR_DOMAIN_SHUTOFF_FAILED)
        return state == lv.libvirt.VIR_DOMAIN_CRASHED or (
            state == lv.libvirt.VIR_DOMAIN_SHUTOFF and reason in failures)


def observe_machine(conn, name, journal=False, listing=None, registry=None, dom=None):
    """One read of the machine; with ``journal``, a missing machine also brings the journal a dead run of that
    name left in the pool's registry (the volumes it created or was deleting). With ``listing`` (the pool's
    domains as this run read them, pool_context.read_domains) the machine is taken from it, no round trip, and a
    missing one's journal from ``registry`` (the run's). ``dom``: the domain's handle, when the run has it (the
    one its define returned), so it is not looked up."""
    if listing is not None:
        reading = listing.get(name)
        if reading is not None:
            return Observed(name, reading.dom, reading.tree, reading.record, reading.state,
                            reading.live_max_memory, reading.autostart, reading.saved)
        dom = None
    elif dom is None:
        dom = lv.lookup_domain(conn, name)
    if dom is None:
        observed = Observed(name)
        if journal:
            observed.journal = journal_of(registry or documents.Registry.open(conn), name)
        return observed
    try:
        tree = dx.parse(dom.XMLDesc(lv.libvirt.VIR_DOMAIN_XML_INACTIVE))
    except lv.libvirt.libvirtError as exc:
        if listing is not None or exc.get_error_code() != lv.libvirt.VIR_ERR_NO_DOMAIN:
            raise
        return observe_machine(conn, name, journal, registry=registry)  # undefined since: as it is now
    state = tuple(dom.state())
    live_max = dom.maxMemory() * 1024 if is_active(state[0]) else None
    record = dx.read_record(tree)
    if record is not None and any(nic.get("ip_address") for nic in record.get("spec", {}).get("network_interfaces")
                                  or []):
        observe_reservations(conn, record)  # only machines with fixed addresses pay for the network's XML
    observed = Observed(name, dom, tree, record, state, live_max)
    for interface in elements.read_interfaces(tree):
        if (interface["alias"] or "").startswith("ua-nic-"):
            observed.security_groups[interface["alias"][len("ua-nic-"):]] = sgs.nic_groups(conn, interface)
    return observed

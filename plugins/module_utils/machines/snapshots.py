# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Snapshots of a machine, converged through observe -> plan -> apply (see convergence.py).

A snapshot is a libvirt internal snapshot (virDomainSnapshotCreateXML): each of the machine's qcow2 disks keeps it
inside its own file, so the disk chain the collection owns (a thin overlay on the cached image) never changes.
- a running machine: a full checkpoint, disks plus the guest's memory and device state (QEMU's savevm); reverting
  brings the guest back running at that instant. libvirt refuses internal disk-only snapshots of a running
  domain, so ``memory: false`` on a running machine is refused;
- a stopped machine: the disks alone; reverting leaves the machine stopped with its disks as they were.
Disks that cannot hold an internal snapshot (encrypted LUKS and shareable raw volumes) make the machine refused,
naming them. libvirt keeps the list of snapshots with the domain, so nothing is written to the pool's registry;
the collection marks its own snapshots through their description, and retention prunes only those.
"""

from __future__ import annotations

import datetime
import re

from ansible_collections.machinery.compute.plugins.module_utils.coordination.holds import missing_machine
from ansible_collections.machinery.compute.plugins.module_utils.core import connection as lv
from ansible_collections.machinery.compute.plugins.module_utils.core import elements
from ansible_collections.machinery.compute.plugins.module_utils.core import options
from ansible_collections.machinery.compute.plugins.module_utils.core import validation as check
from ansible_collections.machinery.compute.plugins.module_utils.core.convergence import Action, Plan, Resource, step
from ansible_collections.machinery.compute.plugins.module_utils.core.errors import (
    ConflictError, LibvirtFailure, NotFoundError, ValidationError)
from ansible_collections.machinery.compute.plugins.module_utils.machines.machine_observe import observe_machine
from ansible_collections.machinery.compute.plugins.module_utils.machines.power import update_record
from ansible_collections.machinery.compute.plugins.module_utils.coordination import writer

MARK = "machinery.compute snapshot, created "
_MARKED = re.compile(re.escape(MARK) + r"(\S+)")


def default_name(moment):
    """The name of a snapshot taken without one: its UTC time, so names sort as the snapshots were taken."""
    return moment.strftime("s%Y%m%d-%H%M%S")


def check_retention(retention):
    """{count} (at least 1), or None when no retention is asked for."""
    if retention is None:
        return None
    if not isinstance(retention, dict):
        raise ValidationError("must be a mapping with count", "retention")
    if retention.get("count") is None:
        raise ValidationError("give count", "retention")
    return {"count": check.whole_number(retention["count"], "retention.count", minimum=1)}


def description(moment):
    return MARK + moment.isoformat()


def snapshot_entry(node, current=False):
    """A snapshot as observed and returned: name, created (UTC, ISO 8601), memory, state of the machine at the
    snapshot, disks, whether it is libvirt's current one and whether the collection took it (``ours``)."""
    read = elements.read_snapshot(node)
    marked = _MARKED.match(read["description"])
    if marked:
        created = marked.group(1)
    elif read["created"] is not None:
        created = datetime.datetime.fromtimestamp(read["created"], datetime.timezone.utc).isoformat()
    else:
        created = None
    return {"name": read["name"], "created": created, "memory": read["memory"], "state": read["state"],
            "disks": read["disks"], "current": bool(current), "ours": bool(marked)}


def snapshot_disks(disks):
    """(devices that take an internal snapshot, devices left out, refusals [(device, why)]) of a domain's disks
    (elements.read_disks): cdroms and read-only disks are left out; a writable disk must be a plain qcow2 file."""
    internal, skipped, refused = [], [], []
    for disk in disks:
        if disk["type"] != "disk" or disk["readonly"]:
            skipped.append(disk["device"])
        elif disk["secret"]:
            refused.append((disk["device"], "an encrypted (LUKS) volume"))
        elif disk["format"] != "qcow2":
            kind = "shareable " if disk["shareable"] else ""
            refused.append((disk["device"], "a %s%s volume" % (kind, disk["format"] or "raw")))
        else:
            internal.append(disk["device"])
    return internal, skipped, refused


def with_memory(wanted, active, machine):
    """Whether the snapshot saves the guest's memory: ``wanted`` (the ``memory`` option, None for the default:
    with memory when the machine runs). Raises naming ``memory`` what libvirt cannot do."""
    if wanted is None:
        return bool(active)
    if wanted and not active:
        raise ConflictError("%s is not running: there is no memory to save; leave memory out or set it to false for "
                            "a snapshot of its disks" % machine, "memory")
    if not wanted and active:
        raise ConflictError("%s is running and libvirt takes internal snapshots of a running machine only with its "
                            "memory: set memory to true, or stop the machine for a snapshot of its disks alone"
                            % machine, "memory")
    return bool(wanted)


def expired(snapshots, retention):
    """The names of the collection's snapshots beyond the newest ``count`` (pure); the newest is always kept and
    snapshots the collection did not take are never pruned."""
    if not retention:
        return []
    ours = sorted((entry for entry in snapshots if entry.get("ours")),
                  key=lambda entry: (entry["created"] or "", entry["name"]), reverse=True)
    return sorted(entry["name"] for entry in ours[max(retention["count"], 1):])


def at_snapshot(seen, entry):
    """Whether the machine is still at snapshot ``entry`` (so reverting is no change): reverted to it by this
    run, or, for a snapshot of a stopped machine, reverted to it by an earlier run and not started since. A
    machine that runs has moved on from any instant, so reverting it to a snapshot with memory is an action."""
    if seen.get("reverted_now") == entry["name"]:
        return True
    if entry["memory"] or seen["active"]:
        return False
    return seen.get("last_revert") == {"snapshot": entry["name"], "boots": seen.get("boots")}


def plan_snapshots(params, seen):
    """The snapshot run's plan (pure): ``params`` validated (with ``moment``), ``seen`` what observe read:
    {machine, exists, active, disks {internal, skipped, refused}, snapshots, boots, last_revert, reverted_now}."""
    machine = seen["machine"]
    name = params["name"]
    state = params["state"]
    retention = check_retention(params.get("retention"))
    snapshots = list(seen["snapshots"])
    existing = next((entry for entry in snapshots if entry["name"] == name), None)
    if not seen["exists"]:
        if state == "absent":  # the machine's delete took its snapshots along
            return Plan([], remaining=[])
        raise NotFoundError("no machine %s on pool %s" % (machine, seen.get("pool")), "machine")
    actions = []
    if state == "absent":
        if existing is not None:
            actions.append(Action("delete", name, {"snapshot": name}, {}, [step("snapshot_delete", name)],
                                  entry=existing))
            snapshots.remove(existing)
    elif state == "reverted":
        if existing is None:
            raise NotFoundError("%s has no snapshot %r to revert to" % (machine, name), "name")
        if not at_snapshot(seen, existing):
            after = {"reverted": name, "state": existing["state"]}
            actions.append(Action("revert", name, {"state": "running" if seen["active"] else "shutoff"}, after,
                                  [step("snapshot_revert", name), step("write_record", machine)], entry=existing))
    elif existing is None:
        disks = seen["disks"]
        if disks["refused"]:
            raise ConflictError("%s cannot be snapshotted: internal snapshots live inside qcow2 files, and %s" % (
                machine, "; ".join("%s is %s" % item for item in disks["refused"])), "machine")
        memory = with_memory(params.get("memory"), seen["active"], machine)
        after = {"snapshot": name, "memory": memory, "state": "running" if seen["active"] else "shutoff",
                 "disks": list(disks["internal"])}
        actions.append(Action("create", name, {}, after, [step("snapshot_create", name, memory=memory)],
                              memory=memory))
        snapshots = [dict(entry, current=False) for entry in snapshots]
        snapshots.append({"name": name, "created": params["moment"].isoformat(), "memory": memory,
                          "state": after["state"], "disks": list(disks["internal"]), "current": True, "ours": True})
    gone = expired(snapshots, retention)
    if gone:
        actions.append(Action("prune", machine, {"snapshots": gone}, {},
                              [step("snapshot_delete", each) for each in gone], fields=["retention"], names=gone))
    return Plan(actions, remaining=[entry for entry in snapshots if entry["name"] not in gone])


class SnapshotResource(Resource):
    """The snapshots of one machine on one pool, for ``converge``."""

    def __init__(self, ctx, params, moment=None):
        self.ctx = ctx
        self.conn = ctx.conn
        self.machine = check.dns_label(params.get("machine"), "machine")
        moment = moment or datetime.datetime.now(datetime.timezone.utc)
        self.params = dict(options.defaulted(options.MACHINE_SNAPSHOT, params), moment=moment)
        self.params["name"] = check.dns_label(params["name"], "name") if params.get("name") else None
        if self.params["name"] is None:
            if self.params["state"] != "present":
                what = "delete" if self.params["state"] == "absent" else "revert to"
                raise ValidationError("name the snapshot to %s" % what, "name")
            self.params["name"] = default_name(moment)
        check_retention(params.get("retention"))
        self.reverted = None

    def describe(self):
        return "the snapshots of machine %s" % self.machine

    def holds(self, plan, observed):
        """The machine: a snapshot is taken of, reverted on or deleted from its disks."""
        return [self.ctx.coordination.of(self.ctx, self.machine)]

    def missing(self, exc):
        """No such machine on the pool: a move taking it away names itself (holds.missing_machine)."""
        return missing_machine(self.ctx, self.machine, exc)

    def observe(self):
        observed = observe_machine(self.conn, self.machine)
        seen = {"machine": self.machine, "exists": observed.exists, "active": observed.active, "snapshots": [],
                "disks": {"internal": [], "skipped": [], "refused": []}, "boots": None, "last_revert": None,
                "reverted_now": self.reverted, "dom": observed.dom, "pool": self.ctx.name or self.ctx.uri}
        if not observed.exists:
            return seen
        if not observed.managed:
            raise ConflictError("%s was not created by machinery.compute" % self.machine, "machine")
        internal, skipped, refused = snapshot_disks(elements.read_disks(observed.tree))
        seen["disks"] = {"internal": internal, "skipped": skipped, "refused": refused}
        seen.update(boots=observed.record.get("boots"), last_revert=observed.record.get("last_revert"))
        seen["snapshots"] = read_snapshots(observed.dom)
        return seen

    def plan(self, observed):
        return plan_snapshots(self.params, observed)

    # the actions

    def _create(self, action, seen):
        disks = seen["disks"]
        xml = elements.to_string(elements.domain_snapshot(action.target, description(self.params["moment"]),
                                                          disks["internal"], disks["skipped"],
                                                          memory=action.data["memory"]))
        try:
            writer.write(seen["dom"], "snapshotCreateXML", xml, 0)
        except lv.libvirt.libvirtError as exc:
            raise LibvirtFailure("cannot snapshot %s: %s" % (self.machine, lv.describe(exc))) from None

    def _delete(self, action, seen):
        self._drop(seen["dom"], [action.target])

    def _prune(self, action, seen):
        self._drop(seen["dom"], action.data["names"])

    def _drop(self, dom, names):
        for name in names:
            try:
                writer.write(dom.snapshotLookupByName(name, 0), "delete", 0)
            except lv.libvirt.libvirtError as exc:
                if exc.get_error_code() == lv.libvirt.VIR_ERR_NO_DOMAIN_SNAPSHOT:
                    continue
                raise LibvirtFailure("cannot delete snapshot %s of %s: %s"
                                     % (name, self.machine, lv.describe(exc))) from None

    def _revert(self, action, seen):
        dom = seen["dom"]
        try:
            writer.write(dom, "revertToSnapshot", dom.snapshotLookupByName(action.target, 0), 0)
        except lv.libvirt.libvirtError as exc:
            raise LibvirtFailure("cannot revert %s to snapshot %s: %s"
                                 % (self.machine, action.target, lv.describe(exc))) from None
        self.reverted = action.target

        def note(record):  # the definition came back with the snapshot: note the revert in that record
            record["last_revert"] = {"snapshot": action.target, "boots": record.get("boots")}
        update_record(dom, note)

    APPLY = {"create": _create, "delete": _delete, "prune": _prune, "revert": _revert}


def read_snapshots(dom):
    """Every snapshot of ``dom`` (snapshot_entry), oldest first."""
    current = None
    try:
        if dom.hasCurrentSnapshot(0):
            current = dom.snapshotCurrent(0).getName()
    except lv.libvirt.libvirtError:
        pass
    entries = [snapshot_entry(elements.parse(snap.getXMLDesc(0)), snap.getName() == current)
               for snap in dom.listAllSnapshots(0)]
    return sorted(entries, key=lambda entry: (entry["created"] or "", entry["name"]))


def snapshot_names(dom):
    """The names of the snapshots of ``dom`` (none when it is gone)."""
    try:
        return sorted(dom.snapshotListNames(0))
    except lv.libvirt.libvirtError:
        return []


def shown(entry):
    return {key: entry.get(key) for key in ("name", "created", "memory", "state", "disks", "current")}

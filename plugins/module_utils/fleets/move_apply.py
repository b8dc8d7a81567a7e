# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What a move (migrate.py) does, step by step: the journal in both registries, the files copied to the target,
the cold move (shutdown, define, start) and the live one (overlays prepared, peer-to-peer migration), the removal
of what is left on the other side, and the rollback of a move that fails, which removes only what its own run
made. A step is applied as (the step, the side it works on, the run) by the method ``MoveExecutor`` names for
its kind."""

from __future__ import annotations

import time

from ansible_collections.machinery.compute.plugins.module_utils.core import connection as lv
from ansible_collections.machinery.compute.plugins.module_utils.core import domain as dx
from ansible_collections.machinery.compute.plugins.module_utils.coordination import documents
from ansible_collections.machinery.compute.plugins.module_utils.coordination import keys
from ansible_collections.machinery.compute.plugins.module_utils.core import storage
from ansible_collections.machinery.compute.plugins.module_utils.coordination.admission import Admission
from ansible_collections.machinery.compute.plugins.module_utils.pools.capacity import check_room
from ansible_collections.machinery.compute.plugins.module_utils.core.convergence import (
    dispatch, step_to_stop_before, stop_here)
from ansible_collections.machinery.compute.plugins.module_utils.core.errors import (
    ConflictError, HoldLost, LibvirtFailure, MachineryError, PoolFull)
from ansible_collections.machinery.compute.plugins.module_utils.machines.power import shutdown
from ansible_collections.machinery.compute.plugins.module_utils.fleets import move_policy
from ansible_collections.machinery.compute.plugins.module_utils.machines import tpm_state
from ansible_collections.machinery.compute.plugins.module_utils.fleets.move_plan import (
    live_transport, move_key, relocate)
from ansible_collections.machinery.compute.plugins.module_utils.fleets.volume_stream import (
    refresh, stream_volume, volume_facts)
from ansible_collections.machinery.compute.plugins.module_utils.coordination import writer


class Run:
    """One action being applied: its two sides, its journal, what it made and how far it got."""

    def __init__(self, source, target, journal, facts=None):
        self.source = source
        self.target = target
        self.journal = journal
        self.facts = facts or {}
        self.files = {item["volume"]: item for item in self.facts.get("files", [])}
        self.images = {image["volume"]: image for image in self.facts.get("missing_images", [])}
        self.made = []  # volumes of the target this run made
        self.defined = False  # the target may hold the machine
        self.deleting = False  # the source is being deleted: from here the move is only ever finished
        self.stopped_at = None  # when the cold move asked the guest to power off

    def side(self, pool):
        return {self.source.pool: self.source, self.target.pool: self.target}.get(pool)


class Report:
    """What the moves of a run tell beyond their plan: warnings, and how long the guest was down."""

    def __init__(self):
        self.warnings = []
        self.downtime = None
        self.migration = None  # a live move's last progress, its duration, what its timeout did


# how long a move waits for a slot among the policy's max_parallel moves of its pools
SLOT_WAIT_SECONDS = 900


def wait_for_slot(machine, run, policy, clock=time.monotonic, sleep=time.sleep):
    """With ``max_parallel``, wait until fewer than that many other moves are journaled on either pool."""
    limit = (policy or {}).get("max_parallel")
    if not limit:
        return
    deadline = clock() + SLOT_WAIT_SECONDS
    while True:
        others = set()
        for side in (run.source, run.target):
            others.update(key for key in documents.Registry.open(side.ctx.conn).keys(keys.MOVE_PREFIX) if key != move_key(machine))
        if len(others) < limit:
            return
        if clock() > deadline:
            raise LibvirtFailure("%d moves of pools %s and %s are under way (policy.max_parallel %d) and none ended "
                                 "within %ds" % (len(others), run.source.pool, run.target.pool, limit,
                                                 SLOT_WAIT_SECONDS), "policy.max_parallel")
        sleep(1)


class Steps:
    """What every kind of step needs: the machine's name and the run's report."""

    def __init__(self, machine, report):
        self.machine = machine
        self.report = report


def domain_xml(source, target, flags):
    """The source's domain with its files pointed at the target's storage, in libvirt's migratable form: without
    the devices a libvirt adds by itself, which another release may not know (libvirt 11's implicit iTCO
    watchdog of q35, which libvirt 9 refuses to define)."""
    tree = dx.parse(source.dom.XMLDesc(flags | lv.libvirt.VIR_DOMAIN_XML_MIGRATABLE))
    return dx.tostring(relocate(tree, source.ctx.storage_path, target.ctx.storage_path))


def carry_autostart(machine, source, target):
    """libvirt keeps autostart per host: the copy on the target gets the source's (the run strategy's)."""
    try:
        if not source.dom.autostart():
            return
        dom = lv.lookup_domain(target.ctx.conn, machine)
        if dom is not None:
            writer.write(dom, "setAutostart", 1)
    except lv.libvirt.libvirtError as exc:
        raise LibvirtFailure("cannot mark %s autostarted on %s: %s" % (machine, target.pool, lv.describe(exc)),
                             "target") from None


def check_room_locked(machine, source, target):
    """Under the target's admission lock: no machine of that name came meanwhile, and the machine still fits."""
    spec = {"name": machine, "cpu": dx.read_cpu(source.tree), "memory": dx.read_memory(source.tree)}
    if lv.lookup_domain(target.ctx.conn, machine) is not None:
        raise ConflictError("a machine named %s was created on %s meanwhile" % (machine, target.pool), "target")
    try:
        check_room(target.ctx, spec)
    except PoolFull as exc:
        raise PoolFull(exc.message, "target") from None


def replace_unused(side, name, machine):
    """Make room for a copy of volume ``name`` on ``side``: a volume of that name that no domain uses (a partial
    copy a dead run journaled) goes; one that a domain uses is never touched, and the move stops."""
    vol = lv.lookup_volume(side.ctx.storage, name)
    if vol is None:
        return
    users = storage.users_of(side.ctx.conn, vol.path(), None)
    if users:
        raise ConflictError("pool %s already has a volume %s, used by %s: the move of %s stopped there"
                            % (side.pool, name, ", ".join(users), machine), "target")
    storage.delete_volume(side.ctx.storage, name)


# --- the steps --------------------------------------------------------------------------------------------------

class JournalSteps(Steps):
    """The move's journal in both registries: written before the first change, cleared after the last."""

    def write(self, _entry, _side, run):
        for index, side in enumerate((run.source, run.target)):  # the source first: a re-run always looks there
            if index:  # a run paused between the two writes must not write the second one for a taker
                getattr(run, "fence", lambda _before: None)("write_journal on %s" % side.pool)
            documents.Registry.open(side.ctx.conn).put(move_key(self.machine), run.journal)

    def clear(self, _entry, _side, run):
        for side in (run.target, run.source):  # the source last: a journal left there is seen by a re-run
            documents.Registry.open(side.ctx.conn).remove(move_key(self.machine))


class CopySteps(Steps):
    """Files streamed from the source's storage into the target's, for both modes: missing image caches, and
    every file of the machine a cold move takes (a live one: the read-only ones)."""

    def cache_image(self, entry, _side, run):
        image = run.images[entry["target"]]
        there = run.target.ctx.storage
        if lv.lookup_volume(there, image["volume"]) is not None and \
                lv.lookup_volume(there, image["volume"] + ".complete") is not None:
            return  # cached meanwhile by another run
        storage.delete_volume(there, image["volume"])  # an upload cut off by a run that died
        vol = storage.create_volume(there, image["volume"], max(image["bytes"], 1), "raw", mode="0644")
        digest = stream_volume(run.source.ctx.conn, run.source.ctx.storage.storageVolLookupByName(image["volume"]),
                               run.target.ctx.conn, vol)
        if not digest.startswith(image["checksum"]):
            storage.delete_volume(there, image["volume"])
            raise ConflictError("the cache of image %s on %s does not match its checksum (its sha256 is %s): it was "
                                "not copied" % (image["volume"], run.source.pool, digest), "machine")
        storage.create_volume(there, image["volume"] + ".complete", 1, "raw", mode="0644")

    def copy_volume(self, entry, _side, run):
        source, target, item = run.source, run.target, run.files[entry["target"]]
        there = target.ctx.storage
        original = source.ctx.storage.storageVolLookupByName(item["volume"])
        now_there = volume_facts(original)  # read again: a console log grows until the guest is off
        replace_unused(target, item["volume"], self.machine)  # a partial copy of a run that died (journaled)
        vol = storage.create_volume(there, item["volume"], max(now_there["bytes"], 1), "raw",
                                    mode=now_there["mode"] or "0600")
        run.made.append(entry["target"])
        stream_volume(source.ctx.conn, original, target.ctx.conn, vol,
                      backing=item["backing"] if item.get("rebase") else None)
        refresh(there)
        copied = volume_facts(there.storageVolLookupByName(item["volume"]))
        expected = {"capacity": max(now_there["capacity"], 1) if item["format"] != "qcow2" else now_there["capacity"],
                    "backing": item.get("backing")}
        if item["format"] == "qcow2":
            expected["format"] = "qcow2"
        found = {key: copied[key] for key in expected}
        if found != expected:
            raise LibvirtFailure("the copy of volume %s on %s reads back as %s, not %s"
                                 % (item["volume"], target.pool, found, expected))


class ColdSteps(Steps):
    """The cold move: the guest powered off, the copy defined on the target and started there if it ran (start
    is also how a resolved move brings the guest back up, on either side)."""

    def __init__(self, machine, report, policy=None):
        super().__init__(machine, report)
        self.policy = policy

    def shutdown(self, entry, _side, run):
        wait_for_slot(self.machine, run, self.policy)
        run.stopped_at = time.monotonic()
        if shutdown(run.source.dom, entry["timeout"]):
            self.report.warnings.append("%s did not power off within %ss of the ACPI request and was forced off"
                                        % (self.machine, entry["timeout"]))

    def define(self, _entry, _side, run):
        source, target = run.source, run.target
        xml = domain_xml(source, target, lv.libvirt.VIR_DOMAIN_XML_INACTIVE)
        with Admission(target.ctx, []):
            check_room_locked(self.machine, source, target)
            try:
                writer.write(target.ctx.conn, "defineXML", xml)
            except lv.libvirt.libvirtError as exc:
                raise LibvirtFailure("cannot define %s on %s: %s" % (self.machine, target.pool, lv.describe(exc)),
                                     "target") from None
        run.defined = True
        carry_autostart(self.machine, source, target)
        if tpm_state.has_emulated_tpm(dx.parse(xml)):  # before its first start there makes it a new TPM
            tpm_state.carry(source.ctx.conn, target.ctx.conn, run.journal["uuid"])

    def start(self, _entry, side, run):
        field = "target" if side is run.target else "machine"
        dom = lv.lookup_domain(side.ctx.conn, self.machine)
        if dom.isActive():
            return
        try:
            writer.write(dom, "create")
        except lv.libvirt.libvirtError as exc:
            raise LibvirtFailure("cannot start %s on %s: %s" % (self.machine, side.pool, lv.describe(exc)),
                                 field) from None
        if run.stopped_at is not None:
            self.report.downtime = round(time.monotonic() - run.stopped_at, 3)


class LiveSteps(Steps):
    """The live move: empty disks on the target for the guest's writes, then libvirt's peer-to-peer migration
    under the move's policy (move_policy.py)."""

    def __init__(self, machine, report, policy=None):
        super().__init__(machine, report)
        self.policy = policy or {}

    def prepare_volume(self, entry, _side, run):
        """The empty disk a live move copies the guest's writes into: an overlay on the target's image cache, or
        a blank volume of the same format and size."""
        item = run.files[entry["target"]]
        there = run.target.ctx.storage
        replace_unused(run.target, item["volume"], self.machine)
        backing = (item["backing"], item["image_format"]) if item.get("backing") else None
        storage.create_volume(there, item["volume"], item["capacity"], item["format"], mode=item["mode"] or "0600",
                              backing=backing)
        run.made.append(entry["target"])

    def migrate(self, _entry, _side, run):
        source, target = run.source, run.target
        params = {lv.libvirt.VIR_MIGRATE_PARAM_PERSIST_XML:
                  domain_xml(source, target, lv.libvirt.VIR_DOMAIN_XML_INACTIVE),
                  lv.libvirt.VIR_MIGRATE_PARAM_MIGRATE_DISKS:
                  [item["device"] for item in run.facts["files"] if item["kind"] == "disk"]}
        transport = live_transport(self.machine, source.uri, target.uri)
        if transport:
            params[lv.libvirt.VIR_MIGRATE_PARAM_URI] = transport["uri"]
            params[lv.libvirt.VIR_MIGRATE_PARAM_DISKS_URI] = transport["disks_uri"]
        if source.ctx.storage_path != target.ctx.storage_path:
            params[lv.libvirt.VIR_MIGRATE_PARAM_DEST_XML] = domain_xml(
                source, target, lv.libvirt.VIR_DOMAIN_XML_MIGRATABLE)
        flags = (lv.libvirt.VIR_MIGRATE_LIVE | lv.libvirt.VIR_MIGRATE_PEER2PEER |
                 lv.libvirt.VIR_MIGRATE_NON_SHARED_INC | lv.libvirt.VIR_MIGRATE_PERSIST_DEST)
        params.update(move_policy.params(self.policy))
        flags |= move_policy.flags(self.policy)
        wait_for_slot(self.machine, run, self.policy)
        with Admission(target.ctx, []):
            check_room_locked(self.machine, source, target)
        if self.policy.get("max_downtime"):
            try:
                writer.write(source.dom, "migrateSetMaxDowntime", self.policy["max_downtime"], 0)
            except lv.libvirt.libvirtError as exc:
                raise LibvirtFailure("cannot set the maximum downtime of %s: %s" % (self.machine, lv.describe(exc)),
                                     "policy.max_downtime") from None
        run.defined = True  # from here the target may hold the guest: a failure makes sure it does not
        watch = move_policy.Watch(source.dom, self.machine, self.policy, dx.read_memory(source.tree))
        try:
            with watch:
                writer.write(source.dom, "migrateToURI3", target.uri, params, flags)
        except lv.libvirt.libvirtError as exc:
            self._note(watch)
            if watch.timed_out == "abort":
                raise LibvirtFailure("the live migration of %s to %s did not complete within %ds (%ds per GiB of "
                                     "memory) and was aborted; the machine runs on on %s" % (
                                         self.machine, target.pool, watch.timeout,
                                         self.policy["completion_timeout_per_gib"], source.pool),
                                     "policy.completion_timeout_per_gib") from None
            raise LibvirtFailure("the live migration of %s to %s failed, the machine still runs on %s: %s"
                                 % (self.machine, target.pool, source.pool, lv.describe(exc)), "mode") from None
        self._note(watch)
        carry_autostart(self.machine, source, target)
        try:
            stats = source.dom.jobStats(lv.libvirt.VIR_DOMAIN_JOB_STATS_COMPLETED)
            self.report.downtime = round(stats["downtime"] / 1000.0, 3) if "downtime" in stats else None
            self.report.migration["iterations"] = stats.get("memory_iteration")
        except lv.libvirt.libvirtError:
            self.report.downtime = None

    def _note(self, watch):
        self.report.migration = {"seconds": round(watch.clock() - watch.started, 1), "timeout": watch.timeout,
                                 "timed_out": watch.timed_out, "progress": dict(watch.last),
                                 "samples": watch.samples}


class RemovalSteps(Steps):
    """What is left on the side a move leaves (or of a copy it discards): volumes, image caches, the domain of
    the journal's UUID (never another machine of that name)."""

    def delete_volume(self, entry, side, _run):
        storage.delete_volume(side.ctx.storage, entry["target"])

    def undefine(self, _entry, side, run):
        dom = lv.lookup_domain(side.ctx.conn, self.machine)
        if dom is not None and dom.UUIDString() == run.journal["uuid"]:
            if dom.isActive():
                writer.write(dom, "destroy")
            lv.undefine_domain(dom, self.machine)


class Rollback(Steps):
    """Undo a move that failed before the source was touched beyond its shutdown: the copy goes, the guest runs on
    the source again. What cannot be undone stays journaled for the next run."""

    def undo(self, run):
        source, target, journal = run.source, run.target, run.journal
        try:
            if run.defined:
                dom = lv.lookup_domain(target.ctx.conn, self.machine)
                if dom is not None and dom.UUIDString() == journal["uuid"]:
                    if dom.isActive():
                        writer.write(dom, "destroy")
                    lv.undefine_domain(dom, self.machine)
            # a live move's target QEMU opens the console log itself (outside libvirt's storage: refreshed first)
            logs = [name for name in journal.get("volumes") or [] if name.endswith("-console.log")
                    and name not in run.made] if run.defined else []
            if logs:
                storage.refresh(target.ctx.storage)
            for name in list(run.made) + logs:
                vol = lv.lookup_volume(target.ctx.storage, name)
                if vol is not None and not storage.users_of(target.ctx.conn, vol.path(), None):
                    storage.delete_volume(target.ctx.storage, name)
            dom = lv.lookup_domain(source.ctx.conn, self.machine)
            if journal["was_running"] and dom is not None and not dom.isActive():
                writer.write(dom, "create")
            for side in (target, source):
                documents.Registry.open(side.ctx.conn).remove(move_key(self.machine))
        except (MachineryError, lv.libvirt.libvirtError) as exc:
            self.report.warnings.append("rolling the move back failed (%s); its journal stays for the next run" % exc)


# --- the executor -----------------------------------------------------------------------------------------------

class MoveExecutor:
    """Carries out the steps of a plan's actions for one machine, each through the method ``methods`` names for
    its kind (a kind it does not name is a bug: UnknownAction)."""

    def __init__(self, machine, report, policy=None):
        self.machine = machine
        journal, copy = JournalSteps(machine, report), CopySteps(machine, report)
        cold, live = ColdSteps(machine, report, policy), LiveSteps(machine, report, policy)
        removal = RemovalSteps(machine, report)
        self.rollback = Rollback(machine, report)
        # fence(step): raises HoldLost when the run's holds were taken over (MoveResource sets it)
        self.fence = lambda _step: None
        self.methods = {
            "write_journal": journal.write, "clear_journal": journal.clear,
            "cache_image": copy.cache_image, "copy_volume": copy.copy_volume,
            "shutdown": cold.shutdown, "define": cold.define, "start": cold.start,
            "prepare_volume": live.prepare_volume, "migrate": live.migrate,
            "delete_volume": removal.delete_volume, "delete_image": removal.delete_volume,
            "undefine": removal.undefine}

    def execute(self, steps, run):
        run.fence = self.fence
        stop_before = step_to_stop_before()  # a race test's point to freeze the move at (convergence.py)
        for entry in steps:
            if entry["action"] == stop_before:
                stop_before = None
                stop_here()
            self.fence("%s %s" % (entry["action"], entry.get("target", "")))
            side = run.side(entry.get("pool"))
            if entry["action"] in ("delete_volume", "undefine") and side is run.source:
                run.deleting = True  # from here on the move is only ever finished
            dispatch(self.methods, entry["action"], "the move of machine %s" % self.machine)(entry, side, run)

    def move(self, steps, run):
        """The steps of a new move; one that fails before the source is deleted is rolled back at once."""
        try:
            self.execute(steps, run)
        except HoldLost:
            raise  # the run holding the machine now owns the journal and what it lists: nothing is undone here
        except BaseException as exc:
            if not run.deleting:
                try:
                    self.fence("the rollback")
                except HoldLost as lost:  # a step failed because the run that took over changed things
                    raise lost from exc
                self.rollback.undo(run)
            raise

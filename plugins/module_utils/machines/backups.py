# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Backups of a machine's disks, converged through observe -> plan -> apply (see convergence.py).

A backup is a full, standalone qcow2 copy of each of the machine's own disks, a volume in the pool's storage
named ``<machine>.backup.<backup>.<device>.qcow2``, made through libvirt alone (so over any URI):
- a running machine: a push-mode backup job (virDomainBackupBegin), which copies each disk as it was when the job
  began while the guest runs on. The guest's file systems are frozen through the guest agent around the start
  of the job when the agent answers, else the copy is crash-consistent and the return says why;
- a stopped machine: each disk volume is cloned through the storage driver (virStorageVolCreateXMLFrom, which
  flattens the root's backing image into the copy).
A UEFI machine's variables, when the pool's storage keeps them, are copied beside its disks
(``<machine>.backup.<backup>.nvram.fd``) and restored with them, and so is an emulated TPM's state (each file of
its swtpm directory as ``<machine>.backup.<backup>.tpm.<file>``, tpm_state.py). The list of a machine's backups
(names, times, disks, how consistent) is one document of the pool's registry, ``backups-<machine>``; restoring
copies the backup volumes back over the (stopped) machine's disks.
"""

from __future__ import annotations

import datetime
import re
import time

from ansible_collections.machinery.compute.plugins.module_utils.coordination.holds import missing_machine
from ansible_collections.machinery.compute.plugins.module_utils.core import connection as lv
from ansible_collections.machinery.compute.plugins.module_utils.core import elements
from ansible_collections.machinery.compute.plugins.module_utils.machines import tpm_state
from ansible_collections.machinery.compute.plugins.module_utils.core import storage
from ansible_collections.machinery.compute.plugins.module_utils.core import options
from ansible_collections.machinery.compute.plugins.module_utils.core import validation as check
from ansible_collections.machinery.compute.plugins.module_utils.coordination import keys
from ansible_collections.machinery.compute.plugins.module_utils.core.convergence import Action, Plan, Resource, step
from ansible_collections.machinery.compute.plugins.module_utils.core.errors import (
    ConflictError, LibvirtFailure, MachineryError, NotFoundError, ValidationError)
from ansible_collections.machinery.compute.plugins.module_utils.machines.machine_observe import observe_machine
from ansible_collections.machinery.compute.plugins.module_utils.machines.power import update_record
from ansible_collections.machinery.compute.plugins.module_utils.machines.machine_status import now
from ansible_collections.machinery.compute.plugins.module_utils.core.firmware import stored_nvram
from ansible_collections.machinery.compute.plugins.module_utils.coordination import writer

POLL = 0.5
AGENT_TIMEOUT = 5


def backup_key(machine):
    return keys.backups_key(machine)


def volume_name(machine, backup, device):
    return "%s.backup.%s.%s.qcow2" % (machine, backup, device)


# what volume_name makes (a machine name has no dot)
# a backup's volumes: a disk's copy, the UEFI variables', a TPM state file's
BACKUP_VOLUME = re.compile(r"^(?P<machine>[^.]+)\.backup\.[^.]+\.(?:[^.]+\.qcow2|nvram\.fd|tpm\..+)$")


def default_name(moment):
    """The name of a backup taken without one: its UTC time, so names sort as the backups were taken."""
    return moment.strftime("b%Y%m%d-%H%M%S")


def check_retention(retention):
    """{count, days} (each None when not given), each at least 1; None when no retention is asked for."""
    if retention is None:
        return None
    if not isinstance(retention, dict):
        raise ValidationError("must be a mapping with count and/or days", "retention")
    kept = {}
    for key in ("count", "days"):
        value = retention.get(key)
        kept[key] = None if value is None else check.whole_number(value, "retention." + key, minimum=1)
    if kept["count"] is None and kept["days"] is None:
        raise ValidationError("give count, days or both", "retention")
    return kept


def _created(entry):
    return datetime.datetime.fromisoformat(entry["created"])


def expired(backups, retention, moment):
    """The names of the backups retention removes (pure): beyond the newest ``count``, or older than ``days``.
    The newest backup is always kept."""
    if not retention or not backups:
        return []
    ordered = sorted(backups, key=lambda entry: (entry["created"], entry["name"]), reverse=True)
    gone = []
    for index, entry in enumerate(ordered[1:], start=1):
        if retention["count"] is not None and index >= retention["count"]:
            gone.append(entry["name"])
        elif retention["days"] is not None and moment - _created(entry) > datetime.timedelta(days=retention["days"]):
            gone.append(entry["name"])
    return sorted(gone)


def own_disks(tree):
    """(the disks a backup copies [{device, path}], the devices it leaves out): the machine's writable,
    unshared disks; cdroms (seeds) and shareable disks are not the machine's alone."""
    disks, skipped = [], []
    for disk in elements.read_disks(tree):
        if disk["type"] == "disk" and not disk["readonly"] and not disk["shareable"] and disk["path"]:
            disks.append({"device": disk["device"], "path": disk["path"]})
        else:
            skipped.append(disk["device"])
    return disks, skipped


def nvram_backup(machine, backup):
    return "%s.backup.%s.nvram.fd" % (machine, backup)


def tpm_backup(machine, backup, name):
    """The volume of TPM state file ``name`` in backup ``backup``."""
    return "%s.backup.%s.tpm.%s" % (machine, backup, name)


def plan_backups(params, seen):
    """The backup run's plan (pure): ``params`` validated, ``seen`` what observe read: {machine, active, disks,
    backups, boots, last_restore}."""
    machine = seen["machine"]
    name = params["name"]
    retention = check_retention(params.get("retention"))
    backups = list(seen["backups"])
    existing = next((entry for entry in backups if entry["name"] == name), None)
    actions = []
    if not seen.get("exists", True) and params.get("state") != "absent" and (params.get("restore") or existing is None):
        # backups outlive their machine: they can still be listed, pruned and deleted, not taken or restored
        raise NotFoundError("no machine %s on pool %s" % (machine, seen.get("pool")), "machine")
    if params.get("state") == "absent":
        if params.get("restore"):
            raise ValidationError("restore needs state: present", "restore")
        if existing is not None:
            actions.append(Action("delete", name, {"backup": name}, {},
                                  [step("delete_volume", disk["volume"]) for disk in existing["disks"]] +
                                  [step("write_document", backup_key(machine))], entry=existing))
            backups.remove(existing)
    elif params.get("restore"):
        if existing is None:
            raise NotFoundError("%s has no backup %r to restore" % (machine, name), "name")
        if seen["active"]:
            raise ConflictError("%s is running; stop it (machine state: stopped) before restoring a backup over its "
                                "disks" % machine, "restore")
        devices = {disk["device"] for disk in seen["disks"]}
        missing = [disk["device"] for disk in existing["disks"] if disk["device"] not in devices]
        if missing:
            raise ConflictError("%s no longer has the disk(s) %s of backup %s" % (machine, ", ".join(missing), name),
                                "restore")
        if seen["last_restore"] != {"backup": name, "boots": seen["boots"]}:
            steps = []
            for disk in existing["disks"]:
                steps += [step("delete_volume", disk["device"]), step("copy_volume", disk["volume"], to=disk["device"])]
            actions.append(Action("restore", name, {}, {"restored": name}, steps, entry=existing))
    elif existing is None:
        method = "push" if seen["active"] else "copy"
        after = {"backup": name, "devices": [disk["device"] for disk in seen["disks"]], "method": method}
        if method == "push":
            steps = [step("fs_freeze", machine), step("backup_begin", machine), step("fs_thaw", machine),
                     step("wait_job", machine)]
        else:
            steps = [step("copy_volume", disk["path"], to=volume_name(machine, name, disk["device"]))
                     for disk in seen["disks"]]
        actions.append(Action("backup", name, {}, after, steps + [step("write_document", backup_key(machine))],
                              method=method))
        backups.append({"name": name, "created": params["moment"].isoformat()})
    gone = expired(backups, retention, params["moment"])
    if gone:
        entries = [entry for entry in seen["backups"] if entry["name"] in gone]
        actions.append(Action("prune", machine, {"backups": gone}, {},
                              [step("delete_volume", disk["volume"]) for entry in entries for disk in entry["disks"]] +
                              [step("write_document", backup_key(machine))], fields=["retention"], entries=entries))
    return Plan(actions, remaining=[entry for entry in backups if entry["name"] not in gone])


class BackupResource(Resource):
    """The backups of one machine on one pool, for ``converge``."""

    def __init__(self, ctx, params, moment=None):
        self.ctx = ctx
        self.conn = ctx.conn
        self.machine = check.dns_label(params.get("machine"), "machine")
        self.params = dict(options.defaulted(options.MACHINE_BACKUP, params), moment=moment or now())
        self.params["name"] = check.dns_label(params["name"], "name") if params.get("name") else None
        if self.params["name"] is None:
            if params.get("state") == "absent" or params.get("restore"):
                what = "delete" if params.get("state") == "absent" else "restore"
                raise ValidationError("name the backup to %s" % what, "name")
            self.params["name"] = default_name(self.params["moment"])
        check.timeout_seconds(self.params["timeout"], "timeout")
        check_retention(params.get("retention"))
        self.report = {}

    def describe(self):
        return "the backups of machine %s" % self.machine

    def holds(self, plan, observed):
        """The machine, for a backup (a job on its disks) and a restore (its disks replaced); deleting or
        pruning backup files leaves it alone."""
        if any(action.kind in ("backup", "restore") for action in plan.actions):
            return [self.ctx.coordination.of(self.ctx, self.machine)]
        return ()

    def missing(self, exc):
        """No such machine on the pool: a move taking it away names itself (holds.missing_machine)."""
        return missing_machine(self.ctx, self.machine, exc)

    def observe(self):
        self.ctx.forget_reads()
        observed = observe_machine(self.conn, self.machine)
        document = self.ctx.registry.get(backup_key(self.machine)) or {}
        seen = {"machine": self.machine, "exists": observed.exists, "active": observed.active, "disks": [],
                "skipped": [], "backups": document.get("backups") or [], "boots": None, "last_restore": None,
                "dom": observed.dom, "pool": self.ctx.name or self.ctx.uri, "nvram": None}
        if observed.exists:
            if not observed.managed:
                raise ConflictError("%s was not created by machinery.compute" % self.machine, "machine")
            seen["disks"], seen["skipped"] = own_disks(observed.tree)
            seen["nvram"] = stored_nvram(observed.tree, self.ctx.storage_path)
            seen["tpm_uuid"] = observed.dom.UUIDString() if tpm_state.has_emulated_tpm(observed.tree) else None
            seen.update(boots=observed.record.get("boots"), last_restore=observed.record.get("last_restore"))
        return seen

    def plan(self, observed):
        return plan_backups(self.params, observed)

    # the actions

    def _save(self, change):
        key = backup_key(self.machine)
        document = self.ctx.registry.get(key) or {"machine": self.machine, "backups": []}
        backups = change(list(document.get("backups") or []))
        if backups:
            # compare and swap over the document just read (the machine is held: only a run that broke the
            # hold could have written since)
            self.ctx.registry.put(key, {"machine": self.machine, "backups": backups},
                                  expect=self.ctx.registry.read_generation(key))
        else:
            self.ctx.registry.remove(key)

    def _backup(self, action, seen):
        name = action.target
        pool = self.ctx.storage
        targets = {disk["device"]: volume_name(self.machine, name, disk["device"]) for disk in seen["disks"]}
        if action.data["method"] == "push":
            self._end_dead_job(seen["dom"])
        # a copy a dead run left: QEMU made its stores behind the storage pool's back, so it is read again first
        storage.refresh(pool)
        for volume in targets.values():
            storage.delete_volume(pool, volume)
        try:
            if action.data["method"] == "push":
                quiesced, reason = self._push(seen, targets)
            else:
                quiesced, reason = False, "the machine was shut off: its disks were copied as it left them"
                for disk in seen["disks"]:
                    source = self.conn.storageVolLookupByPath(disk["path"])
                    xml = storage.volume_xml(targets[disk["device"]], source.info()[1], "qcow2", mode="0600")
                    try:
                        writer.write(pool, "createXMLFrom", xml, source, 0)
                    except lv.libvirt.libvirtError as exc:
                        raise LibvirtFailure("cannot copy %s: %s" % (disk["device"], lv.describe(exc))) from None
        except BaseException:
            storage.refresh(pool)
            for volume in targets.values():
                try:
                    storage.delete_volume(pool, volume)
                except MachineryError:
                    pass
            raise
        storage.refresh(pool)
        disks = []
        for disk in seen["disks"]:
            vol = pool.storageVolLookupByName(targets[disk["device"]])
            disks.append({"device": disk["device"], "volume": vol.name(), "size": vol.info()[1]})
        entry = {"name": name, "created": self.params["moment"].isoformat(), "method": action.data["method"],
                 "quiesced": quiesced, "reason": reason, "disks": disks}
        variables = self._copy_nvram(seen.get("nvram"), nvram_backup(self.machine, name))
        if variables:
            entry["nvram"] = variables
        if seen.get("tpm_uuid"):
            entry["tpm"] = self._save_tpm(seen["tpm_uuid"], name)
        self.report = entry
        self._save(lambda backups: [item for item in backups if item["name"] != name] + [entry])

    def _copy_nvram(self, source_name, target_name):
        """A copy of the UEFI variables volume ``source_name`` as ``target_name``; None when there is none yet (a
        machine never started). The firmware writes its variables seldom: the copy is taken as the file is."""
        pool = self.ctx.storage
        source = lv.lookup_volume(pool, source_name) if source_name else None
        if source is None:
            return None
        storage.delete_volume(pool, target_name)
        try:
            writer.write(pool, "createXMLFrom", storage.volume_xml(target_name, source.info()[1], "raw", mode="0600"), source, 0)
        except lv.libvirt.libvirtError as exc:
            raise LibvirtFailure("cannot copy the UEFI variables of %s: %s" % (self.machine, lv.describe(exc))) \
                from None
        return target_name

    def _save_tpm(self, uuid, backup):
        """The TPM state files of the machine copied into the pool's storage, {file: volume}. swtpm writes its
        state file whole; a running machine's is copied as it stands when the backup is taken."""
        pool = self.ctx.storage
        saved = {}
        for name, data in sorted(tpm_state.read(self.conn, uuid).items()):
            volume = tpm_backup(self.machine, backup, name)
            storage.delete_volume(pool, volume)
            vol = storage.create_volume(pool, volume, max(len(data), 1), "raw", mode="0600")
            storage.upload_bytes(self.conn, vol, data)
            saved[name] = volume
        return saved

    def _end_dead_job(self, dom):
        """A backup job a killed run began is still running in libvirt: it is aborted and waited for, or the new
        one could not begin."""
        try:
            dom.backupGetXMLDesc(0)
        except lv.libvirt.libvirtError:
            return  # no backup job
        try:
            writer.write(dom, "abortJob")
        except lv.libvirt.libvirtError:
            pass  # it ended meanwhile
        deadline = time.monotonic() + float(self.params["timeout"])
        while time.monotonic() < deadline:
            try:
                dom.backupGetXMLDesc(0)
            except lv.libvirt.libvirtError:
                return
            time.sleep(POLL)
        raise MachineryError("the backup job a dead run of %s began did not end within %ss"
                             % (self.machine, int(float(self.params["timeout"]))), "timeout")

    def _freeze(self, dom):
        """(frozen, why not): freeze the guest's file systems through its agent, if it answers."""
        try:
            dom.agentSetResponseTimeout(AGENT_TIMEOUT, 0)
        except (lv.libvirt.libvirtError, AttributeError):
            pass
        try:
            dom.fsFreeze(None, 0)
        except lv.libvirt.libvirtError as exc:
            return False, "the guest agent did not freeze the file systems (%s): the backup is crash-consistent" \
                % lv.describe(exc)
        return True, "file systems frozen through the guest agent while the backup began"

    def _push(self, seen, targets):
        dom = seen["dom"]
        paths = {device: self.ctx.storage_file(volume) for device, volume in targets.items()}
        xml = elements.to_string(elements.domain_backup(paths, seen["skipped"]))
        frozen, reason = self._freeze(dom)
        try:
            writer.write(dom, "backupBegin", xml, None, 0)
        except lv.libvirt.libvirtError as exc:
            raise LibvirtFailure("cannot begin the backup of %s: %s" % (self.machine, lv.describe(exc))) from None
        finally:
            if frozen:
                try:
                    dom.fsThaw(None, 0)
                except lv.libvirt.libvirtError:
                    pass
        self._wait_job(dom)
        return frozen, reason

    def _wait_job(self, dom):
        timeout = float(self.params["timeout"])
        deadline = time.monotonic() + timeout
        while dom.jobInfo()[0] != lv.libvirt.VIR_DOMAIN_JOB_NONE:
            if time.monotonic() > deadline:
                try:
                    writer.write(dom, "abortJob")
                except lv.libvirt.libvirtError:
                    pass
                raise MachineryError("the backup of %s did not finish within %ss and was cancelled"
                                     % (self.machine, int(timeout)), "timeout")
            time.sleep(POLL)
        stats = dom.jobStats(lv.libvirt.VIR_DOMAIN_JOB_STATS_COMPLETED)
        if stats.get("type") != lv.libvirt.VIR_DOMAIN_JOB_COMPLETED:
            raise LibvirtFailure("the backup job of %s failed: %s"
                                 % (self.machine, stats.get("errmsg") or "libvirt reports no cause"))

    def _delete(self, action, _seen):
        self._drop([action.data["entry"]])

    def _prune(self, action, _seen):
        self._drop(action.data["entries"])

    def _drop(self, entries):
        pool = self.ctx.storage
        for entry in entries:
            for disk in entry["disks"]:
                storage.delete_volume(pool, disk["volume"])
            if entry.get("nvram"):
                storage.delete_volume(pool, entry["nvram"])
            for volume in (entry.get("tpm") or {}).values():
                storage.delete_volume(pool, volume)
        names = {entry["name"] for entry in entries}
        self._save(lambda backups: [item for item in backups if item["name"] not in names])

    def _restore(self, action, seen):
        pool = self.ctx.storage
        paths = {disk["device"]: disk["path"] for disk in seen["disks"]}
        for disk in action.data["entry"]["disks"]:
            backup = lv.lookup_volume(pool, disk["volume"])
            if backup is None:
                raise NotFoundError("backup volume %s is gone" % disk["volume"], "name")
            target = self.conn.storageVolLookupByPath(paths[disk["device"]])
            target_name = target.name()
            target_pool = target.storagePoolLookupByVolume()
            fmt = storage.volume_format(target)
            xml = storage.volume_xml(target_name, backup.info()[1], fmt)
            try:
                writer.write(target, "delete", 0)
                writer.write(target_pool, "createXMLFrom", xml, backup, 0)
            except lv.libvirt.libvirtError as exc:
                raise LibvirtFailure("cannot restore %s of %s: %s" % (disk["device"], self.machine,
                                                                      lv.describe(exc))) from None
        saved = action.data["entry"].get("nvram")
        if saved and seen.get("nvram"):  # the variables as they were, over the ones the firmware wrote since
            if lv.lookup_volume(pool, saved) is None:
                raise NotFoundError("backup volume %s is gone" % saved, "name")
            storage.delete_volume(pool, seen["nvram"])
            self._copy_nvram(saved, seen["nvram"])
        saved_tpm = action.data["entry"].get("tpm")
        if saved_tpm and seen.get("tpm_uuid"):  # the TPM as it was: its seeds, keys and NV memory
            files = {}
            for name, volume in saved_tpm.items():
                vol = lv.lookup_volume(pool, volume)
                if vol is None:
                    raise NotFoundError("backup volume %s is gone" % volume, "name")
                files[name] = storage.download_bytes(self.conn, vol)
            tpm_state.write(self.conn, seen["tpm_uuid"], files)
        boots = seen["boots"]

        def note(record):
            record["last_restore"] = {"backup": action.target, "boots": boots}
        update_record(seen["dom"], note)

    APPLY = {"backup": _backup, "delete": _delete, "prune": _prune, "restore": _restore}


def shown(entry):
    return {key: entry.get(key) for key in ("name", "created", "method", "quiesced", "reason", "disks")}

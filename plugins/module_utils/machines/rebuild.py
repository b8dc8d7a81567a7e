# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Rebuilding a machine: a new root disk from a new image, with the same name, UUID, MACs, data volumes, labels and
record (``rebuild: true`` and a changed ``image``).

``rebuild_action`` is the pure part of the plan. ``Rebuild._rebuild`` carries it out in an order that never loses
the machine: the image is cached and the boot files are made while the guest still runs; then the guest is shut
down, the new root is made under a new volume name, the domain is redefined to use it and started again; only
then are the old root and boot files deleted. A failure up to the start deletes what this run made and puts the
machine back as it was, running if it ran.
"""

from __future__ import annotations

from ansible_collections.machinery.compute.plugins.module_utils.core import connection as lv
from ansible_collections.machinery.compute.plugins.module_utils.core import domain as dx
from ansible_collections.machinery.compute.plugins.module_utils.core.convergence import Action, step
from ansible_collections.machinery.compute.plugins.module_utils.core.errors import (
    ConflictError, LibvirtFailure, MachineryError)
from ansible_collections.machinery.compute.plugins.module_utils.machines import images
from ansible_collections.machinery.compute.plugins.module_utils.machines import seed
from ansible_collections.machinery.compute.plugins.module_utils.machines.addresses import lease_expiries
from ansible_collections.machinery.compute.plugins.module_utils.machines.machine_status import now
from ansible_collections.machinery.compute.plugins.module_utils.machines.power import (
    bump_boots, shutdown, update_record)
from ansible_collections.machinery.compute.plugins.module_utils.core import storage
from ansible_collections.machinery.compute.plugins.module_utils.coordination import writer

ROOT_ALIAS = dx.volume_alias("root")
SEED_ALIAS = "ua-cidata"


# --- plan (pure) ------------------------------------------------------------------------------------------------

def image_of(image):
    """(source, checksum) of an image entry, spec's or record's: what makes two roots the same."""
    image = image or {}
    return image.get("source"), image.get("checksum")


def wants_rebuild(spec, record):
    """Whether ``spec`` gives the machine of ``record`` another root disk: normalize marks a spec ``rebuild``
    for rebuild: true and a changed image; the image must differ from the record's still (a re-run)."""
    if not spec.get("rebuild") or not spec.get("image") or not (record or {}).get("spec", {}).get("image"):
        return False
    return image_of(spec["image"]) != image_of(record["spec"]["image"])


def new_volumes(spec, record):
    """{kind: volume name} of what a rebuild makes: the root, and the boot files given again (the seed always,
    with a new instance id; Ignition when this run gives a new one: an unchanged one is read again as it is)."""
    generation = int(record.get("rebuilds") or 0) + 1
    files = record["spec"].get("files") or {}
    made = {"root": dx.generation_volume(spec["name"], generation, "root.qcow2")}
    if files.get("seed"):
        made["seed"] = dx.generation_volume(spec["name"], generation, "cidata.iso")
    if files.get("ignition") and "ignition_data" in spec:
        made["ignition"] = dx.generation_volume(spec["name"], generation, "ignition.json")
    return made


def replaced_volumes(record, made):
    """{kind: volume name} of the old volumes the ones a rebuild ``made`` replace (deleted once it is done)."""
    files = record["spec"].get("files") or {}
    old = {"root": dx.root_volume(record["spec"])}
    old.update({kind: files[kind] for kind in ("seed", "ignition") if kind in made})
    return old


def rebuild_action(spec, record, active, snapshots=0):
    """The ``rebuild`` action of a machine whose spec names another image than its record, or None. A running
    machine is shut down for it and started again unless ``stopped`` is wanted; ``snapshots`` (how many the
    machine has) refuse it: they live in the old root's qcow2 and would be lost with it."""
    if not wants_rebuild(spec, record):
        return None
    name = spec["name"]
    if snapshots:
        raise ConflictError("%s has %d snapshot%s, kept inside its root disk, which a rebuild replaces; nothing was "
                            "changed; delete them with machinery.compute.machine_snapshot first"
                            % (name, snapshots, "" if snapshots == 1 else "s"), "rebuild")
    made = new_volumes(spec, record)
    old = replaced_volumes(record, made)
    restart = bool(active) and spec["state"] != "stopped"
    steps = [step("cache_image", spec["image"]["source"])]
    steps += [step("shutdown", name)] if active else []
    steps.append(step("create_volume", made["root"], size=spec.get("root_size"), backing=spec["image"]["source"]))
    steps += [step("write_volume", made[kind]) for kind in ("seed", "ignition") if kind in made]
    steps.append(step("define", name))
    steps += [step("start", name)] if restart else []
    steps += [step("delete_volume", old[kind]) for kind in ("root", "seed", "ignition") if kind in old]
    before_source, before_checksum = image_of(record["spec"]["image"])
    after_source, after_checksum = image_of(spec["image"])
    return Action("rebuild", name, {"image": before_source, "image_checksum": before_checksum},
                  {"image": after_source, "image_checksum": after_checksum}, steps, made=made, old=old,
                  restart=restart, generation=int(record.get("rebuilds") or 0) + 1)


# --- apply ------------------------------------------------------------------------------------------------------

def point_disks(tree, paths):
    """Point the root disk, the seed cdrom and the Ignition entry of a parsed domain at new files (``paths``:
    {kind: path} for the kinds that change), in place."""
    for node in tree.findall("devices/disk"):
        alias = node.find("alias")
        kind = {ROOT_ALIAS: "root", SEED_ALIAS: "seed"}.get(alias.get("name") if alias is not None else None)
        if kind in paths:
            node.find("source").set("file", paths[kind])
            for stale in node.findall("backingStore"):  # the new overlay has its own chain; libvirt reads it
                node.remove(stale)
    if "ignition" in paths:
        for entry in tree.findall("sysinfo/entry"):
            if entry.get("name") == dx.IGNITION_FWCFG:
                entry.set("file", paths["ignition"])


class Rebuild:
    """How MachineResource rebuilds a machine. It uses the resource's ctx, conn, name, params, spec, warnings,
    earlier_leases and _define."""

    def _rebuild(self, action, observed):
        spec, pool, data = self.spec, self.ctx.storage, action.data
        dom = observed.dom
        # what can fail without touching the machine comes first, while it still runs: the image (an upload or
        # a download can take minutes) and the boot files' content
        image_vol, fmt = images.ensure_cached(self.conn, pool, spec["image"], self.ctx.url_opener, self.ctx.images,
                                              self.ctx.coordination)
        root_size = max(spec.get("root_size") or 0, self._virtual_size(pool, image_vol, spec["image"]))
        original = dom.XMLDesc(lv.libvirt.VIR_DOMAIN_XML_INACTIVE)
        tree = dx.parse(original)
        record = dx.read_record(tree)
        contents = self._boot_file_contents(record, data)
        ran = bool(dom.isActive())
        if ran:
            timeout = self.params["shutdown_timeout"]
            try:
                forced = shutdown(dom, timeout)
            except lv.libvirt.libvirtError as exc:
                raise LibvirtFailure("cannot rebuild %s: it could not be shut down: %s; nothing was changed"
                                     % (self.name, lv.describe(exc)), "rebuild") from None
            if forced:
                self.warnings.append("%s did not power off within %ss of the ACPI request and was forced off to "
                                     "be rebuilt" % (self.name, timeout))
        made = []
        try:
            paths = {"root": self._new_root(pool, made, data["made"]["root"], root_size, image_vol, fmt)}
            for kind, content in contents.items():
                self._claim(data["made"][kind])
                paths[kind] = storage.write_secret_volume(self.conn, pool, data["made"][kind], content).path()
                made.append(data["made"][kind])
            point_disks(tree, paths)
            self._rebuilt_record(record, data, fmt, root_size)
            dx.write_record(tree, record)
            self._define(tree, "redefine rebuilt machine")
            self.write_efi_vars(dom, action)  # while it is off (efi_vars_plan gives the rebuild them)
        except BaseException as exc:
            self._undo_rebuild(dom, None, made, ran, exc)
            raise
        if data["restart"]:
            try:
                self.earlier_leases = lease_expiries(self.ctx, spec.get("network_interfaces"))
                writer.write(dom, "create")
            except lv.libvirt.libvirtError as exc:
                self._undo_rebuild(dom, original, made, ran, exc)
                raise LibvirtFailure("cannot rebuild %s: it did not start from its new root: %s; it was put back as "
                                     "it was%s" % (self.name, lv.describe(exc), ", running" if ran else ""),
                                     "image") from None
            update_record(dom, bump_boots)
        for kind, volume_name in sorted(data["old"].items()):
            try:
                storage.delete_volume(pool, volume_name)
            except MachineryError as exc:
                self.warnings.append("the old %s volume %s of %s was left in the pool: %s"
                                     % (kind, volume_name, self.name, exc))

    def _claim(self, volume_name):
        """Refuse a new volume's name that a domain uses. One that none uses is the leftover of a rebuild cut off
        midway (the names are the collection's own, see domain.generation_volume), and is replaced."""
        users = storage.users_of(self.conn, self.ctx.storage_file(volume_name), None)
        if users:
            raise ConflictError("volume %s, which the rebuild of %s makes, is used by %s"
                                % (volume_name, self.name, ", ".join(users)), "rebuild")

    def _new_root(self, pool, made, volume_name, size, image_vol, fmt):
        """The new root: an overlay on the cached image, as a create makes it."""
        self._claim(volume_name)
        vol = storage.create_volume(pool, volume_name, size, "qcow2", backing=(image_vol.path(), fmt), replace=True)
        made.append(volume_name)
        return vol.path()

    def _boot_file_contents(self, record, data):
        """{kind: bytes} of the boot files the rebuild writes: the seed with the new instance id (from this run's
        cloud-init, else the seed the machine has, read back), and a new Ignition file when one is given."""
        contents = {}
        files = record["spec"].get("files") or {}
        if "seed" in data["made"]:
            if "seed_files" in self.spec:
                given = dict(self.spec["seed_files"])
            else:
                vol = lv.lookup_volume(self.ctx.storage, files["seed"])
                if vol is None:
                    raise LibvirtFailure("cannot rebuild %s: its cloud-init seed %s is gone; give cloud_init again"
                                         % (self.name, files["seed"]), "cloud_init")
                given = seed.read_nocloud_iso(storage.download_bytes(self.conn, vol))
            contents["seed"] = seed.nocloud_iso(seed.with_generation(given, self.name, data["generation"]))
        if "ignition" in data["made"]:
            contents["ignition"] = self.spec["ignition_data"]
        return contents

    def _rebuilt_record(self, record, data, fmt, root_size):
        spec = record["spec"] = dict(record["spec"])
        spec["image"] = {"source": self.spec["image"]["source"], "checksum": self.spec["image"]["checksum"],
                         "format": fmt}
        spec["root_size"] = root_size
        spec["root_volume"] = data["made"]["root"]
        spec["files"] = dict(spec.get("files") or {}, **{kind: data["made"][kind] for kind in ("seed", "ignition")
                                                         if kind in data["made"]})
        spec["boot_config"] = self.spec.get("boot_config")
        record["rebuilds"] = data["generation"]
        record["rebuilt"] = now().isoformat()
        record["last_error"] = None

    def _undo_rebuild(self, dom, original, made, ran, cause):
        """Put the machine back as it was: its old definition (when it was replaced), what this run made deleted,
        and started again if it ran. The cause is the caller's to raise."""
        problems = []
        try:
            if original is not None:
                writer.write(self.conn, "defineXML", original)
            if ran and not dom.isActive():
                writer.write(dom, "create")
        except lv.libvirt.libvirtError as exc:
            problems.append("putting it back failed: %s" % lv.describe(exc))
        for volume_name in made:
            try:
                storage.delete_volume(self.ctx.storage, volume_name)
            except MachineryError as exc:
                problems.append(str(exc))

        def note(record):
            if ran and dom.isActive():
                bump_boots(record)  # it booted again from its old root
            record["last_error"] = "rebuild failed: %s" % cause
        try:
            update_record(dom, note)
        except lv.libvirt.libvirtError:
            pass
        if problems:
            raise LibvirtFailure("cannot rebuild %s: %s; %s" % (self.name, cause, "; ".join(problems)),
                                 "rebuild") from None

# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Standalone volumes of a pool's storage (``volume``, ``volume_info``, IronCore ``Volume``), converged through
observe -> plan -> apply.

A volume is a libvirt storage volume of the pool's ``machinery`` storage pool. Its size and format are what
libvirt says; its labels and the image it was made from live in the pool's registry (document
``volume-<digest of the name>``: volume names may hold characters a registry key may not). A volume made from
an image is a full copy of the pool's cached image (libvirt copies it on the host), not an overlay on it, so it
outlives the image and boots a machine by itself. The collection's own volumes (image caches, boot material,
console logs, upload locks: ``storage.reserved_volume``) are never a volume of this module.

The file lives with the machines because a volume is made from the images they resolve (``named_images``).
"""

from __future__ import annotations

import re

from ansible_collections.machinery.compute.plugins.module_utils.core import connection as lv
from ansible_collections.machinery.compute.plugins.module_utils.core import domain as dx
from ansible_collections.machinery.compute.plugins.module_utils.core import elements
from ansible_collections.machinery.compute.plugins.module_utils.core import options
from ansible_collections.machinery.compute.plugins.module_utils.core import validation as check
from ansible_collections.machinery.compute.plugins.module_utils.coordination import keys
from ansible_collections.machinery.compute.plugins.module_utils.core.convergence import (
    Action, Plan, Resource, converge, step)
from ansible_collections.machinery.compute.plugins.module_utils.core.errors import (
    ConflictError, LibvirtFailure, ValidationError)
from ansible_collections.machinery.compute.plugins.module_utils.core.quantity import format_quantity
from ansible_collections.machinery.compute.plugins.module_utils.machines import images, machine_spec, named_images
from ansible_collections.machinery.compute.plugins.module_utils.machines.backups import BACKUP_VOLUME
from ansible_collections.machinery.compute.plugins.module_utils.machines.power import update_record
from ansible_collections.machinery.compute.plugins.module_utils.core import storage
from ansible_collections.machinery.compute.plugins.module_utils.pools.capacity import check_storage, storage_room
from ansible_collections.machinery.compute.plugins.module_utils.coordination import writer

VOLUME_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
SECTOR = 512
NEW_FORMAT = "qcow2"


def volume_key(name):
    """The registry key of a volume's document: a digest, since a volume name may hold '.', '_' and capitals."""
    return keys.volume_key(name)


def volume_name(value, field="name"):
    """A name of a volume this module may manage: the pattern of volume names, and none of the collection's own."""
    if not isinstance(value, str) or not VOLUME_NAME.match(value):
        raise ValidationError("%r is not a volume name (up to 128 letters, digits, '.', '_' and '-', starting with "
                              "a letter or digit)" % (value,), field)
    reason = storage.reserved_volume(value)
    if reason:
        raise ConflictError("volume %s is not managed by this module: %s" % (value, reason), field)
    return value


def sectors(size):
    """``size`` rounded up to whole 512-byte sectors, as qemu sizes a disk."""
    return -(-size // SECTOR) * SECTOR


# --- the desired volume ------------------------------------------------------------------------------------------

def validated(params, resolve_image):
    """The module's parameters checked and normalized: sizes in bytes, labels checked, ``image`` resolved by
    ``resolve_image(source, field)`` (a published name or a local path; reads, never writes). Pure but for that."""
    params = options.defaulted(options.STANDALONE_VOLUME, params)
    want = {"name": volume_name(params.get("name")),
            "state": check.one_of(params["state"], options.PRESENCE, "state"),
            "force": bool(params.get("force"))}
    if want["state"] == "absent":
        return want
    want["size"] = sectors(check.disk_bytes(params["size"], "size")) if params.get("size") is not None else None
    want["format"] = check.one_of(params["format"], options.VOLUME_FORMATS, "format") \
        if params.get("format") is not None else None
    want["labels"] = check.labels(params["labels"], "labels") if params.get("labels") is not None else None
    want["image"] = None
    source = params.get("image")
    if source is not None:
        if not isinstance(source, str) or not source:
            raise ValidationError("must be the name of an image published on the pool or a local path", "image")
        if "://" in source and not source.startswith("oci://"):
            raise ValidationError("%r: a volume is made from a published image, a local file or an oci:// "
                                  "image; publish a URL with machinery.compute.machine_image and give its name"
                                  % source, "image")
        want["image"] = resolve_image(source, "image")
    return want


class Seen:
    """One observation of a volume: ``volume`` {path, capacity, format} or None, its registry document
    ``record`` {name, labels, image} or None, the domains using it ``users`` [{machine, active, device, managed}],
    the pool's name, and ``owner`` (machine, what the volume is to it) when it is a machine's own volume."""

    def __init__(self, pool, volume=None, record=None, users=(), owner=None):
        self.pool = pool
        self.volume = volume
        self.record = record
        self.users = list(users)
        self.owner = owner


def shown(name, seen, state=None):
    """The volume as the module returns it."""
    if seen.volume is None:
        return {"name": name, "pool": seen.pool, "size": None, "format": None, "labels": {}, "image": None,
                "attached_to": [], "state": state or "Absent"}
    record = seen.record or {}
    return {"name": name, "pool": seen.pool, "size": format_quantity(seen.volume["capacity"]),
            "format": seen.volume["format"], "labels": dict(record.get("labels") or {}),
            "image": (record.get("image") or {}).get("source"),
            "attached_to": sorted({user["machine"] for user in seen.users}), "state": state or "Available"}


def owned(volume):
    """The fields a diff shows."""
    return {key: volume[key] for key in ("name", "size", "format", "labels", "image")}


def plan_volume(want, seen):
    """Create, grow, relabel or delete: pure, from the validated parameters and the observation. The plan's
    ``volume`` fact is the volume as the run leaves it (what a check-mode run returns)."""
    name = want["name"]
    if seen.owner is not None and seen.volume is not None:
        machine, what, remedy = seen.owner
        # force is for a standalone volume that machines use, never for a disk the machine itself made
        raise ConflictError("volume %s is not managed by this module: it is %s of machine %s; %s"
                            % (name, what, machine, remedy), "name")
    key = volume_key(name)
    if want["state"] == "absent":
        return _plan_delete(want, seen, key)
    if seen.volume is None:
        return _plan_create(want, seen, key)
    current = shown(name, seen)
    actions = []
    fmt = seen.volume["format"]
    if want["format"] is not None and want["format"] != fmt:
        raise ConflictError("volume %s is %s; a volume's format is fixed when it is made" % (name, fmt), "format")
    recorded_image = (seen.record or {}).get("image")
    if want["image"] is not None and want["image"]["source"] != (recorded_image or {}).get("source"):
        made = "from image %s" % recorded_image["source"] if recorded_image else "without an image"
        raise ConflictError("volume %s was made %s; a volume's image is fixed when it is made" % (name, made),
                            "image")
    capacity = seen.volume["capacity"]
    after = dict(current)
    if want["size"] is not None and want["size"] != sectors(capacity):
        if want["size"] < capacity:
            raise ValidationError("volume %s is %s; volumes are never shrunk (asked for %s)"
                                  % (name, format_quantity(capacity), format_quantity(want["size"])), "size")
        users = [user for user in seen.users if user["active"]]
        actions.append(Action("grow", name, {"size": current["size"]}, {"size": format_quantity(want["size"])},
                              [step("resize", name, size=want["size"])] +
                              [step("write_record", user["machine"]) for user in seen.users if user["managed"]],
                              size=want["size"], through=users[0] if users else None, users=seen.users))
        after["size"] = format_quantity(want["size"])
    if want["labels"] is not None and want["labels"] != current["labels"]:
        body = {"name": name, "labels": want["labels"], "image": recorded_image}
        actions.append(Action("update", name, {"labels": current["labels"]}, {"labels": want["labels"]},
                              [step("write_document", key)], fields=["labels"], body=body))
        after["labels"] = dict(want["labels"])
    return Plan(actions, volume=after)


def _plan_create(want, seen, key):
    name = want["name"]
    image = want["image"]
    fmt = want["format"] or NEW_FORMAT
    size = want["size"]
    if image is None and size is None:
        raise ValidationError("is required to make volume %s (or give an image to copy)" % name, "size")
    if image is not None:
        needed = sectors(image["virtual_size"] or 0)
        if size is not None and size < needed:
            raise ValidationError("%s is smaller than image %s (%s)" % (format_quantity(size), image["source"],
                                                                        format_quantity(needed)), "size")
        size = max(size or 0, needed)
    labels = want["labels"] or {}
    body = {"name": name, "labels": labels,
            "image": {"source": image["source"], "checksum": image["checksum"]} if image else None}
    if image:
        steps = [step("cache_image", image["source"]),
                 step("copy_volume", name, image=image["source"], size=size, format=fmt)]
    else:
        steps = [step("create_volume", name, size=size, format=fmt)]
    steps.append(step("write_document", key))
    after = {"name": name, "pool": seen.pool, "size": format_quantity(size), "format": fmt, "labels": labels,
             "image": image["source"] if image else None, "attached_to": [], "state": "Pending"}
    return Plan([Action("create", name, {}, owned(after), steps, size=size, fmt=fmt, image=image, body=body)],
                volume=after)


def _plan_delete(want, seen, key):
    name = want["name"]
    gone = shown(name, Seen(seen.pool))
    if seen.volume is None:
        if seen.record is None:
            return Plan(volume=gone)
        # the volume went another way (an ephemeral disk deleted with its machine): its labels go too
        return Plan([Action("forget", name, steps=[step("delete_document", key)])], volume=gone)
    users = sorted({user["machine"] for user in seen.users})
    if users and not want["force"]:
        raise ConflictError("volume %s is attached to %s; detach it first, or set force: true to detach it from "
                            "them and delete it" % (name, ", ".join(users)), "name")
    steps = [step("detach_device", user["machine"], device=user["device"]) for user in seen.users]
    steps.append(step("delete_volume", name))
    if seen.record is not None:
        steps.append(step("delete_document", key))
    return Plan([Action("delete", name, owned(shown(name, seen)), {}, steps, users=seen.users)], volume=gone)


# --- libvirt ----------------------------------------------------------------------------------------------------

def disk_users(conn):
    """{path: [{machine, active, device, managed}]} of every disk of every domain of the host: the persistent
    configuration, and the running guest's (a disk it has not let go of yet)."""
    users = {}
    for dom in conn.listAllDomains(0):
        try:
            inactive = dx.parse(dom.XMLDesc(lv.libvirt.VIR_DOMAIN_XML_INACTIVE))
            active = bool(dom.isActive())
            trees = [inactive, dx.parse(dom.XMLDesc(0))] if active else [inactive]
        except lv.libvirt.libvirtError as exc:
            if exc.get_error_code() == lv.libvirt.VIR_ERR_NO_DOMAIN:
                continue  # undefined meanwhile
            raise
        managed = dx.read_record(inactive) is not None
        seen = set()
        for tree in trees:
            for disk in elements.read_disks(tree):
                if disk["path"] and disk["path"] not in seen:
                    seen.add(disk["path"])
                    users.setdefault(disk["path"], []).append(
                        {"machine": dom.name(), "active": active, "device": disk["device"], "managed": managed})
    return users


def read_volume(vol):
    """{path, capacity, format} of a libvirt volume."""
    info = elements.read_volume(elements.parse(vol.XMLDesc(0)))
    return {"path": info["path"] or vol.path(), "capacity": info["capacity"], "format": info["format"] or "raw"}


def refreshed(pool):
    """The storage pool after a refresh, so sizes changed by a running guest's resize are seen. A refresh
    refused while an upload runs there is skipped: that upload refreshes the pool when it ends."""
    try:
        pool.refresh(0)
    except lv.libvirt.libvirtError:
        pass
    return pool


def pool_label(ctx):
    return ctx.name or ctx.uri


def image_resolver(ctx, registry=None):
    """``resolve_image(source, field)`` on the pool of ``ctx``: a published name, a local file (its sha256 and
    its virtual size, read from its header), or an oci:// image (its size known once pulled; ``registry``:
    {ca_file, credentials})."""
    def resolve(source, field):
        image = named_images.resolve(source, None, ctx, field, registry)
        if image.get("path"):
            machine_spec.image_format(image, field)  # a bootable disk image, or refused before anything is made
            image["virtual_size"] = storage.virtual_size(image["path"])
        return image
    return resolve


GENERATION_VOLUME = re.compile(r"^(?P<machine>[^.]+)\.r[0-9]+-(root\.qcow2|cidata\.iso|ignition\.json)$")
OWN_REMEDY = "machinery.compute.machine with state: absent deletes it with the machine"


def machine_owner(conn, name, users):
    """(machine, what the volume is to it, how it goes) when the volume ``name`` is a machine's own: its root disk,
    an ephemeral disk or boot file of its record, a root or boot file of one of its rebuilds, or a backup copy of
    it; None for a standalone volume (one a machine was given with ``volumes[].volume``, or none uses). The
    machines looked at are those using the volume and those its name derives from (every machine volume's name
    starts with its machine's name, which has no dot)."""
    backup = BACKUP_VOLUME.match(name)
    generation = GENERATION_VOLUME.match(name)
    candidates = [user["machine"] for user in users if user["managed"]]
    stem = name.split(".", 1)[0]
    candidates += [stem[:index] for index, char in enumerate(stem) if char == "-"] + [stem]
    for machine in dict.fromkeys(candidates):
        dom = lv.lookup_domain(conn, machine)
        if dom is None:
            continue
        try:
            record = dx.read_record(dx.parse(dom.XMLDesc(lv.libvirt.VIR_DOMAIN_XML_INACTIVE)))
        except lv.libvirt.libvirtError as exc:
            if exc.get_error_code() == lv.libvirt.VIR_ERR_NO_DOMAIN:
                continue  # undefined meanwhile
            raise
        if record is None or record.get("adopted"):
            continue
        if backup and backup.group("machine") == machine:
            return (machine, "a backup copy", "machinery.compute.machine_backup deletes it (state: absent, or "
                    "its retention)")
        if generation and generation.group("machine") == machine:
            return machine, "a root disk or boot file of one of its rebuilds", OWN_REMEDY
        if name in machine_spec.ephemeral_volumes(record):
            spec = record["spec"]
            if name == dx.root_volume(spec):
                what = "the root disk"
            elif name in (spec.get("files") or {}).values():
                what = "a boot file"
            else:
                what = "an ephemeral volume"
            return machine, what, OWN_REMEDY
    return None


class VolumeResource(Resource):
    """One volume of one pool, for ``converge``."""

    def __init__(self, ctx, params, check_mode=False):
        self.ctx = ctx
        self.check_mode = check_mode
        ctx.require_registration()
        self.want = validated(params, image_resolver(ctx, {"ca_file": params.get("image_ca_file"),
                                                           "credentials": params.get("image_pull_secret")}))
        self.name = self.want["name"]
        self.warnings = []

    def describe(self):
        return "volume %s on pool %s" % (self.name, pool_label(self.ctx))

    def holds(self, plan, observed):
        """The machines the volume is a disk of, when the plan grows it or deletes it from under them."""
        users = sorted({user["machine"] for action in plan.actions if action.kind in ("grow", "delete")
                        for user in action.data.get("users") or []})
        return [self.ctx.coordination.of(self.ctx, machine) for machine in users]

    def observe(self):
        self.ctx.forget_reads()
        pool = refreshed(self.ctx.storage)
        vol = lv.lookup_volume(pool, self.name)
        volume = read_volume(vol) if vol is not None else None
        users = disk_users(self.ctx.conn).get(volume["path"], []) if volume is not None else []
        owner = machine_owner(self.ctx.conn, self.name, users) if volume is not None else None
        return Seen(pool_label(self.ctx), volume, self.ctx.registry.get(volume_key(self.name)), users, owner)

    def plan(self, observed):
        plan = plan_volume(self.want, observed)
        for action in plan.actions:  # refused in check mode too
            if action.kind == "create":
                check_storage(self.ctx, [("size", action.data["size"])])
            elif action.kind == "grow":
                check_storage(self.ctx, [("size", action.data["size"] - observed.volume["capacity"])])
        recorded = ((observed.record or {}).get("image") or {}).get("checksum")
        image = self.want.get("image")
        if observed.volume is not None and image and recorded and image["checksum"] != recorded:
            warning = ("volume %s was copied from image %s with sha256 %s; the image is now %s and the volume keeps "
                       "its copy" % (self.name, image["source"], recorded, image["checksum"]))
            if warning not in self.warnings:  # planned again after the apply
                self.warnings.append(warning)
        return plan

    def _create(self, action, _seen):
        pool = self.ctx.storage
        data = action.data
        if data["image"] is None:
            storage.create_volume(pool, self.name, data["size"], data["fmt"])
        else:
            cached, fmt = images.ensure_cached(self.ctx.conn, pool, data["image"], self.ctx.url_opener,
                                               run=self.ctx.coordination)
            # the cache was written as bytes: libvirt knows it as a qcow2 (and its virtual size) once it looked
            source = lv.lookup_volume(refreshed(pool), cached.name())
            if source is None or storage.volume_format(source) != fmt:
                raise LibvirtFailure("the cached image %s is not the %s libvirt should see; run "
                                     "machinery.compute.machine_image again" % (cached.name(), fmt), "image")
            try:  # an OCI image's size is known once it is pulled: the copy is at least that large
                storage.copy_volume(pool, self.name, max(data["size"] or 0, source.info()[1]), data["fmt"], source)
            except BaseException:
                storage.delete_volume(pool, self.name)  # a copy cut off is no volume
                raise
        try:
            self.ctx.registry.put(volume_key(self.name), data["body"])
        except BaseException:
            storage.delete_volume(pool, self.name)
            raise

    def _grow(self, action, seen):
        size = action.data["size"]
        through = action.data["through"]
        # counted against the storage's room under the pool's admission lock until the machines using it count it
        with storage_room(self.ctx, [("size", size - seen.volume["capacity"])] if action.data["users"] else []):
            try:
                if through is not None:  # a running guest holds the file: qemu grows it and tells the guest
                    dom = self.ctx.conn.lookupByName(through["machine"])
                    writer.write(dom, "blockResize", through["device"], size, lv.libvirt.VIR_DOMAIN_BLOCK_RESIZE_BYTES)
                else:
                    writer.write(lv.lookup_volume(self.ctx.storage, self.name), "resize", size, 0)
            except lv.libvirt.libvirtError as exc:
                raise LibvirtFailure("cannot grow %s to %s: %s"
                                     % (self.name, format_quantity(size), lv.describe(exc)), "size") from None
            for user in action.data["users"]:
                if user["managed"]:
                    _edit_entries(self.ctx.conn, user["machine"], self.name, lambda entry: dict(entry, size=size))

    def _update(self, action, _seen):
        self.ctx.registry.put(volume_key(self.name), action.data["body"])

    def _delete(self, action, seen):
        path = seen.volume["path"]
        for user in action.data["users"]:
            _detach(self.ctx.conn, user["machine"], path, self.name)
        storage.delete_volume_secret(self.ctx.conn, path)
        storage.delete_volume(self.ctx.storage, self.name)
        self._forget(action, seen)

    def _forget(self, _action, seen):
        if seen.record is not None:
            self.ctx.registry.remove(volume_key(self.name))

    APPLY = {"create": _create, "grow": _grow, "update": _update, "delete": _delete, "forget": _forget}

    def ensure(self):
        """(plan, the volume as the run leaves it, warnings)."""
        plan, seen = converge(self, self.check_mode)
        volume = plan.facts["volume"] if self.check_mode else shown(self.name, seen)
        return plan, volume, plan.warnings + self.warnings


def _edit_entries(conn, machine, name, change):
    """Change (or, ``change`` None, drop) the entries of the machine's record that are the volume ``name``."""
    dom = lv.lookup_domain(conn, machine)
    if dom is None:
        return

    def edit(record):
        entries = record["spec"].get("volumes") or []
        record["spec"]["volumes"] = [change(entry) if entry.get("volume") == name else entry
                                     for entry in entries if change is not None or entry.get("volume") != name]
    update_record(dom, edit)


def _detach(conn, machine, path, name):
    """Take the disk at ``path`` out of the machine: from its persistent configuration, and from the running
    guest by a request that is not waited for (force: the guest may hold the disk until it lets go), and out of
    its record."""
    dom = lv.lookup_domain(conn, machine)
    if dom is None:
        return
    flags_trees = [(lv.libvirt.VIR_DOMAIN_AFFECT_CONFIG, dom.XMLDesc(lv.libvirt.VIR_DOMAIN_XML_INACTIVE))]
    if dom.isActive():
        flags_trees.append((lv.libvirt.VIR_DOMAIN_AFFECT_LIVE, dom.XMLDesc(0)))
    for flags, xml in flags_trees:
        node = next((node for node in dx.parse(xml).iter("disk")
                     if elements.read_disk(node)["path"] == path), None)
        if node is None:
            continue
        try:
            writer.write(dom, "detachDeviceFlags", elements.to_string(node), flags)
        except lv.libvirt.libvirtError as exc:
            if flags == lv.libvirt.VIR_DOMAIN_AFFECT_CONFIG:
                raise LibvirtFailure("cannot detach volume %s from %s: %s" % (path, machine, lv.describe(exc)),
                                     "force") from None
            # the running guest was asked; a guest that does not answer keeps it until it stops
    _edit_entries(conn, machine, name, None)


# --- listing ----------------------------------------------------------------------------------------------------

def list_volumes(ctx):
    """Every volume of the pool's storage but the collection's own, as the module returns a volume, by name."""
    pool = refreshed(ctx.storage)
    registry = ctx.registry
    records = {}
    for key in registry.keys(keys.VOLUME_PREFIX):
        body = registry.get(key)
        if body and body.get("name"):
            records[body["name"]] = body
    users = disk_users(ctx.conn)
    listed = []
    for vol in pool.listAllVolumes(0):
        name = vol.name()
        if storage.reserved_volume(name) or not VOLUME_NAME.match(name):
            continue
        try:
            volume = read_volume(vol)
        except lv.libvirt.libvirtError:
            continue  # deleted since the listing
        listed.append(shown(name, Seen(pool_label(ctx), volume, records.get(name), users.get(volume["path"], []))))
    return sorted(listed, key=lambda item: item["name"])


def selected(volume, names, labels):
    """Whether a listed volume passes the info module's filters (names, and every one of the labels)."""
    if names and volume["name"] not in names:
        return False
    return all(volume["labels"].get(key) == value for key, value in labels.items())

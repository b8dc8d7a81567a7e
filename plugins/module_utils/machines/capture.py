# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Capture: a machine's root disk (or the disk of one of its snapshots) becomes a named image of its pool.

The root disk is a thin overlay on a cached image; libvirt copies it whole on the pool host (virStorageVolCreateXMLFrom,
which runs ``qemu-img convert`` there), so the copy is flat: no backing file, nothing shared with the machine. Its
sha256 is read back through a libvirt stream, and the copy goes into the pool's image cache under that checksum,
exactly as an image published from a file: ``machine: image: <name>`` and every other pool take it from there.

Generalizing happens inside the guest, through its agent, before the machine is stopped: cloud-init's instance
data, the machine-id and the SSH host keys are removed, then the guest is shut down and its disk captured. Editing
the copy offline would need a second channel to the pool host (qemu-nbd, libguestfs) that the collection never
uses: everything goes through the libvirt connection. The machine captured that way stays stopped and sealed:
started again, it takes a new identity just as a machine made from the image does.

A snapshot is captured by a short detour on the stopped machine: its present disks are kept in a temporary
snapshot, the machine reverted to the one asked for, its root disk copied, and the temporary snapshot reverted to
and deleted, so the machine ends as it was.
"""

from __future__ import annotations

import hashlib
import time

from ansible_collections.machinery.compute.plugins.module_utils.core import connection as lv
from ansible_collections.machinery.compute.plugins.module_utils.core import domain as dx
from ansible_collections.machinery.compute.plugins.module_utils.core import elements
from ansible_collections.machinery.compute.plugins.module_utils.core import validation as check
from ansible_collections.machinery.compute.plugins.module_utils.core.convergence import Action, Plan, Resource, step
from ansible_collections.machinery.compute.plugins.module_utils.core.errors import (
    ConflictError, LibvirtFailure, MachineryError, NotFoundError, ValidationError)
from ansible_collections.machinery.compute.plugins.module_utils.machines import guest
from ansible_collections.machinery.compute.plugins.module_utils.machines import images
from ansible_collections.machinery.compute.plugins.module_utils.machines import named_images
from ansible_collections.machinery.compute.plugins.module_utils.machines.power import shutdown
from ansible_collections.machinery.compute.plugins.module_utils.coordination import locks
from ansible_collections.machinery.compute.plugins.module_utils.core import storage
from ansible_collections.machinery.compute.plugins.module_utils.coordination import writer

# What generalizing does inside the guest. cloud-init's own ``clean`` removes its instance data (so the next boot
# is a first boot, which makes new SSH host keys); older releases lack it and the directory goes by hand. An empty
# /etc/machine-id makes systemd draw a new one at the next boot; dbus's copy goes unless it is the usual link. The
# DHCP clients' saved leases go too: a copy would ask for the source's address (released at its shutdown) and get it.
GENERALIZE_SCRIPT = (
    "set -e; "
    "if command -v cloud-init >/dev/null 2>&1; then cloud-init clean --logs --seed >/dev/null 2>&1 "
    "|| rm -rf /var/lib/cloud; fi; "
    "rm -f /etc/ssh/ssh_host_*_key /etc/ssh/ssh_host_*_key.pub; "
    "rm -f /var/lib/dhcp/dhclient*.leases /var/lib/dhclient/*.lease* /var/lib/NetworkManager/*.lease; "
    "if [ -e /etc/machine-id ]; then : > /etc/machine-id; fi; "
    "if [ -f /var/lib/dbus/machine-id ] && [ ! -L /var/lib/dbus/machine-id ]; then rm -f /var/lib/dbus/machine-id; fi; "
    "sync"
)
GENERALIZE_TIMEOUT = 300
SHUTDOWN_TIMEOUT = 300
TEMPORARY_SNAPSHOT = "machinery-capture-keep"


def source_of(pool, machine, snapshot=None):
    """The ``source`` a captured image records: ``machine:<pool>/<machine>`` (``@<snapshot>``)."""
    return "machine:%s/%s%s" % (pool, machine, "@%s" % snapshot if snapshot else "")


def from_machine(value, default_uri):
    """The ``from_machine`` option checked: {uri, machine, snapshot}."""
    if not isinstance(value, dict):
        raise ValidationError("must be a mapping with machine (and uri, snapshot)", "from_machine")
    unknown = sorted(str(key) for key in value if key not in ("uri", "machine", "snapshot"))
    if unknown:
        raise ValidationError("unknown key %s; it takes uri, machine, snapshot" % ", ".join(unknown),
                              "from_machine")
    uri = value.get("uri") or default_uri
    if not uri:
        raise ValidationError("give the uri of the machine's pool", "from_machine.uri")
    snapshot = value.get("snapshot")
    return {"uri": uri, "machine": check.dns_label(value.get("machine"), "from_machine.machine"),
            "snapshot": check.dns_label(snapshot, "from_machine.snapshot") if snapshot else None}


def root_disk(tree, record):
    """The root disk of a machine's domain (elements.read_disk), or None: the disk of its root volume, else (a
    machine booted from a volume) its first bootable disk."""
    disks = [disk for disk in elements.read_disks(tree) if disk["type"] == "disk"]
    spec = (record or {}).get("spec") or {}
    if spec.get("image") is not None and spec.get("name"):
        wanted = dx.root_volume(spec)
        for disk in disks:
            if (disk["path"] or "").rsplit("/", 1)[-1] == wanted:
                return disk
    booted = sorted((disk for disk in disks if disk["boot_order"]), key=lambda disk: disk["boot_order"])
    return (booted or disks or [None])[0]


def refusal(seen, source, generalize, option="from_machine"):
    """Why the machine cannot be captured (or cloned, ``option`` clone_from) as asked (a MachineryError), or
    None."""
    machine, snapshot = source["machine"], source["snapshot"]
    field = option + ".machine"
    if not seen["exists"]:
        return NotFoundError("no machine %s on pool %s" % (machine, seen["pool"]), field)
    if not seen["managed"]:
        return ConflictError("%s was not created by machinery.compute" % machine, field)
    root = seen["root"]
    if root is None:
        return ValidationError("%s has no root disk to copy" % machine, field)
    if root["secret"]:
        return ValidationError("the root disk of %s (%s) is encrypted (LUKS): its copy would be published to every "
                               "user of the image, and it cannot be read without the passphrase; capture a "
                               "machine whose root is not encrypted" % (machine, root["device"]), field)
    if snapshot and snapshot not in seen["snapshots"]:
        return NotFoundError("%s has no snapshot %s (it has %s)" % (machine, snapshot,
                                                                    ", ".join(seen["snapshots"]) or "none"),
                             option + ".snapshot")
    if generalize:
        if snapshot:
            return ValidationError("a snapshot is captured as it was taken; generalizing edits the running guest: "
                                   "leave out generalize or from_machine.snapshot", "generalize")
        if not seen["active"] or not seen["agent"]:
            return ConflictError("generalizing is done inside %s through its guest agent before it is stopped, and "
                                 "%s: start it (its guest agent must answer) or leave out generalize"
                                 % (machine, "its agent does not answer" if seen["active"] else "it is stopped"),
                                 "generalize")
        return None
    if seen["active"]:
        return ConflictError("%s is running: its disk is copied quiet; stop it first (state: stopped)%s"
                             % (machine, ", or set generalize: true to seal and stop it" if option == "from_machine"
                                else ""), field)
    return None


def plan_capture(params, seen):
    """The capture on the machine's own pool: pure, from the validated parameters and ``seen`` (CaptureResource
    observe). A name already captured from the same source is left alone (its os description aside)."""
    source = params["from_machine"]
    recorded = seen["record"]
    wanted_source = source_of(seen["pool"], source["machine"], source["snapshot"])
    key = named_images.image_key(params["name"])
    if recorded is not None and recorded.get("source") == wanted_source and seen["cached"]:
        desired = dict(recorded, os=named_images.os_info(params["os"]) if params.get("os") is not None
                       else recorded.get("os") or {})
        if desired.get("os") == (recorded.get("os") or {}):
            return Plan(published=recorded)
        return Plan([Action("publish", params["name"], named_images.shown(recorded), named_images.shown(desired),
                            [step("write_document", key)], body=desired)], published=desired)
    problem = refusal(seen, source, params["generalize"])
    if problem is not None:
        raise problem
    os_description = named_images.os_info(params["os"]) if params.get("os") is not None else seen["image_os"]
    desired = {"name": params["name"], "source": wanted_source, "checksum": None, "os": os_description,
               "generalized": bool(params["generalize"])}
    actions = []
    if params["generalize"]:
        actions.append(Action("generalize", source["machine"], {"state": "running"}, {"state": "stopped"},
                              [step("guest_exec", source["machine"], script="generalize"),
                               step("shutdown", source["machine"])]))
    copy_steps = [step("copy_volume", seen["root"]["path"], flatten=True), step("sha256", params["name"]),
                  step("cache_image", params["name"])]
    if source["snapshot"]:
        copy_steps = ([step("snapshot_create", TEMPORARY_SNAPSHOT), step("snapshot_revert", source["snapshot"])] +
                      copy_steps + [step("snapshot_revert", TEMPORARY_SNAPSHOT),
                                    step("snapshot_delete", TEMPORARY_SNAPSHOT)])
    actions.append(Action("capture", params["name"], steps=copy_steps))
    actions.append(Action("publish", params["name"], named_images.shown(recorded), named_images.shown(desired),
                          [step("write_document", key)], body=desired))
    return Plan(actions, published=desired)


def plan_replica(params, recorded, cached, origin):
    """Publishing a captured image on another pool: its bits copied there by checksum (when that pool's cache
    lacks them) and its record written. ``origin`` is the record on the machine's pool (None in a check-mode run
    that has not captured it yet)."""
    key = named_images.image_key(params["name"])
    if origin is None:
        desired = {"name": params["name"], "source": None, "checksum": None, "os": {}}
        return Plan([Action("copy", params["name"], steps=[step("stream_volume", params["name"])]),
                     Action("publish", params["name"], named_images.shown(recorded), named_images.shown(desired),
                            [step("write_document", key)], body=desired)], published=desired)
    desired = {key_: origin.get(key_) for key_ in ("name", "source", "checksum", "os", "generalized")}
    actions = []
    if not cached:
        actions.append(Action("copy", params["name"], steps=[step("stream_volume", origin["checksum"])]))
    comparable = {k: v for k, v in (recorded or {}).items() if k in desired}
    if comparable != desired:
        actions.append(Action("publish", params["name"], named_images.shown(recorded), named_images.shown(desired),
                              [step("write_document", key)], body=desired))
    return Plan(actions, published=desired)


def stream_copy(source_conn, source_vol, target_conn=None, target_vol=None):
    """sha256 of a volume's bytes (holes read as zeros), read through a sparse libvirt stream; with a target, the
    bytes are written into ``target_vol`` on the way, holes kept as holes."""
    down = source_conn.newStream(0)
    up = target_conn.newStream(0) if target_vol is not None else None
    digest = hashlib.sha256()
    zeros = bytes(storage.CHUNK)
    try:
        source_vol.download(down, 0, 0, lv.libvirt.VIR_STORAGE_VOL_DOWNLOAD_SPARSE_STREAM)
        if up is not None:
            writer.write(target_vol, "upload", up, 0, 0, lv.libvirt.VIR_STORAGE_VOL_UPLOAD_SPARSE_STREAM)
        while True:
            data = down.recvFlags(storage.CHUNK, lv.libvirt.VIR_STREAM_RECV_STOP_AT_HOLE)
            if data == -3:
                hole = left = down.recvHole(0)
                while left:
                    digest.update(zeros[:min(left, len(zeros))])
                    left -= min(left, len(zeros))
                if up is not None:
                    up.sendHole(hole, 0)
            elif data == -2:
                time.sleep(0.01)
            elif not data:
                break
            else:
                digest.update(data)
                if up is not None:
                    storage.send_chunks(up, [data])
        down.finish()
        if up is not None:
            up.finish()
    except BaseException as exc:
        for stream in (down, up):
            try:
                if stream is not None:
                    stream.abort()
            except Exception:  # closed by the daemon already
                pass
        if isinstance(exc, lv.libvirt.libvirtError):
            raise LibvirtFailure("reading volume %s failed: %s" % (source_vol.name(), lv.describe(exc))) from None
        raise
    return digest.hexdigest()


def cache_copy(source_conn, source_vol, conn, pool, checksum):
    """Put the bytes of ``source_vol`` into the image cache of ``pool`` as image ``checksum`` (qcow2) unless it has
    it, under the pool's upload lock of that checksum; the copy is verified against the checksum before its
    completion marker is written. Returns the cached volume."""
    vol, _fmt = images.cached_volume(pool, checksum)
    if vol is not None:
        return vol
    with locks.image_upload_lock(conn, pool, checksum):
        vol, _fmt = images.cached_volume(pool, checksum)
        if vol is not None:
            return vol
        name = storage.image_volume_name(checksum, "qcow2")
        storage.delete_volume(pool, name)
        length = source_vol.infoFlags(lv.libvirt.VIR_STORAGE_VOL_GET_PHYSICAL)[2]
        vol = storage.create_volume(pool, name, max(length, 1), "raw", mode="0644")
        try:
            copied = stream_copy(source_conn, source_vol, conn, vol)
            if copied != checksum:
                raise LibvirtFailure("the copy of image %s read back as sha256 %s" % (checksum, copied))
        except BaseException:
            storage.delete_volume(pool, name)
            raise
        storage.create_volume(pool, name + ".complete", 1, "raw", mode="0644")
        storage.refresh(pool)
        return pool.storageVolLookupByName(name)


def write_record(ctx, body, expect=None):
    """The image's record with the cached volume's format and virtual size; ``expect``: the generation of the
    record the change was made from (compare and swap, Registry.put)."""
    body = dict(body)
    vol, fmt = images.cached_volume(ctx.storage, body["checksum"])
    storage.refresh(ctx.storage)
    body.update(format=fmt, virtual_size=ctx.storage.storageVolLookupByName(vol.name()).info()[1])
    ctx.registry.put(named_images.image_key(body["name"]), body, expect=expect)
    return body


def observe_source(ctx, machine):
    """What a capture or a clone needs to know of ``machine`` on the pool of ``ctx``: read only."""
    seen = {"pool": ctx.name or ctx.uri, "record": None, "cached": False, "exists": False, "managed": False,
            "active": False, "agent": False, "root": None, "snapshots": [], "image_os": {}, "dom": None,
            "root_size": None}
    dom = lv.lookup_domain(ctx.conn, machine)
    if dom is None:
        return seen
    tree = dx.parse(dom.XMLDesc(lv.libvirt.VIR_DOMAIN_XML_INACTIVE))
    record = dx.read_record(tree)
    seen.update(exists=True, managed=record is not None, active=bool(dom.isActive()), dom=dom)
    if record is None:
        return seen
    seen["root"] = root_disk(tree, record)
    if seen["root"] is not None and seen["root"]["path"]:
        seen["root_size"] = ctx.conn.storageVolLookupByPath(seen["root"]["path"]).info()[1]
    seen["snapshots"] = sorted(dom.snapshotListNames(0))
    if seen["active"]:
        seen["agent"] = guest.agent_connected(dx.parse(dom.XMLDesc(0)))
    image = (record.get("spec") or {}).get("image") or {}
    if image.get("name") or image.get("source"):
        published = ctx.registry.get(named_images.image_key(image.get("name") or image["source"])) \
            if named_images.is_reference(image.get("name") or image["source"]) else None
        seen["image_os"] = (published or {}).get("os") or {}
    return seen


def scratch_name(name, machine):
    """The scratch volume a copy of ``machine``'s disk goes through: the machine is held while it exists, so no
    other run makes one of the same name, and one left there is a dead run's."""
    return "capture-%s-%s.part" % (name, machine)


def copy_root(conn, pool, machine, root_path, snapshot, name, capacity=0):
    """A flat qcow2 copy of a machine's root disk (of its ``snapshot``, when given) as volume ``name`` of the
    storage ``pool`` the disk is in: libvirt runs qemu-img convert on the host. For a snapshot, the stopped machine
    is reverted to it for the copy and back to its present disks at once."""
    dom = lv.lookup_domain(conn, machine)
    keep = keep_present(dom, machine) if snapshot else None
    try:
        if snapshot:
            try:
                wanted = dom.snapshotLookupByName(snapshot, 0)
                memory = elements.read_snapshot(elements.parse(wanted.getXMLDesc(0)))["memory"]
                # a snapshot with memory comes back running: paused, then stopped, its disks are the snapshot's
                writer.write(dom, "revertToSnapshot", wanted, lv.libvirt.VIR_DOMAIN_SNAPSHOT_REVERT_PAUSED if memory else 0)
                if dom.isActive():
                    writer.write(dom, "destroy")
            except lv.libvirt.libvirtError as exc:
                raise LibvirtFailure("cannot copy snapshot %s of %s: %s" % (snapshot, machine, lv.describe(exc))) \
                    from None
        root = conn.storageVolLookupByPath(root_path)
        storage.delete_volume(pool, name)  # a scratch copy left by a run that died while copying
        return storage.copy_volume(pool, name, max(capacity, root.info()[1]), "qcow2", root)
    finally:
        if keep is not None:
            writer.write(dom, "revertToSnapshot", keep, 0)
            writer.write(keep, "delete", 0)


def keep_present(dom, machine):
    """A disk-only snapshot of the stopped machine's present disks, to come back to."""
    disks = elements.read_disks(dx.parse(dom.XMLDesc(0)))
    internal = [disk["device"] for disk in disks
                if disk["type"] == "disk" and not disk["readonly"] and disk["format"] == "qcow2"]
    skipped = [disk["device"] for disk in disks if disk["device"] not in internal]
    xml = elements.to_string(elements.domain_snapshot(TEMPORARY_SNAPSHOT, "machinery.compute copy", internal,
                                                      skipped))
    try:
        return writer.write(dom, "snapshotCreateXML", xml, 0)
    except lv.libvirt.libvirtError as exc:
        raise LibvirtFailure("cannot keep the present disks of %s: %s" % (machine, lv.describe(exc))) from None


def captured_base(source_ctx, target_ctx, machine, root_path, snapshot, scratch):
    """The flat copy of a machine's root disk in the image cache of ``target_ctx``'s pool (streamed there from the
    machine's pool when that is another one): (cached volume, checksum)."""
    flat = copy_root(source_ctx.conn, source_ctx.storage, machine, root_path, snapshot, scratch)
    try:
        checksum = stream_copy(source_ctx.conn, flat)
        vol = cache_copy(source_ctx.conn, flat, target_ctx.conn, target_ctx.storage, checksum)
    finally:
        storage.delete_volume(source_ctx.storage, scratch)
    return vol, checksum


class CaptureResource(Resource):
    """A named image captured from a machine of this pool, for ``converge``."""

    def __init__(self, ctx, params):
        self.ctx = ctx
        self.params = params
        self.source = params["from_machine"]
        self.checksum = None
        self.published = None

    def describe(self):
        return "image %s captured from machine %s" % (self.params["name"], self.source["machine"])

    def holds(self, plan, observed):
        """The machine: its disk is read (and reverted to a snapshot and back), and generalizing stops it."""
        if plan.kinds() == ["publish"]:
            return ()
        return [self.ctx.coordination.of(self.ctx, self.source["machine"], field="from_machine.machine")]

    def observe(self):
        self.ctx.forget_reads()
        seen = observe_source(self.ctx, self.source["machine"])
        seen["record"] = record = self.ctx.registry.get(named_images.image_key(self.params["name"]))
        seen["generation"] = self.ctx.registry.read_generation(named_images.image_key(self.params["name"]))
        seen["cached"] = bool(record and record.get("checksum")
                              and images.cached_volume(self.ctx.storage, record["checksum"])[0] is not None)
        return seen

    def plan(self, observed):
        return plan_capture(self.params, observed)

    def _generalize(self, _action, seen):
        dom = seen["dom"]
        agent = guest.Agent(dom)
        try:
            code, _out, err = agent.run("/bin/sh", ["-c", GENERALIZE_SCRIPT], timeout=GENERALIZE_TIMEOUT)
        except guest.AgentError as exc:
            raise MachineryError("cannot generalize %s through its guest agent: %s" % (self.source["machine"], exc),
                                 "generalize") from None
        if code != 0:
            raise MachineryError("generalizing %s failed in the guest (exit %d): %s"
                                 % (self.source["machine"], code, err.decode("utf-8", "replace").strip()),
                                 "generalize")
        shutdown(dom, SHUTDOWN_TIMEOUT)

    def _capture(self, _action, seen):
        scratch = scratch_name(self.params["name"], self.source["machine"])
        _vol, self.checksum = captured_base(self.ctx, self.ctx, self.source["machine"], seen["root"]["path"],
                                            self.source["snapshot"], scratch)

    def _publish(self, action, seen):
        body = dict(action.data["body"])
        if body.get("checksum") is None:
            body["checksum"] = self.checksum
        self.published = write_record(self.ctx, body, seen.get("generation"))

    APPLY = {"generalize": _generalize, "capture": _capture, "publish": _publish}


class ReplicaResource(Resource):
    """A captured image published on another pool: the bits streamed from the machine's pool by checksum."""

    def __init__(self, ctx, params, origin_ctx, origin):
        self.ctx = ctx
        self.params = params
        self.origin_ctx = origin_ctx
        self.origin = origin
        self.generation = None  # of the record observed (compare and swap)

    def describe(self):
        return "image %s on pool %s" % (self.params["name"], self.ctx.name or self.ctx.uri)

    def holds(self, plan, observed):
        """None: the copy reads the image cache of the machine's pool, not the machine."""
        return ()

    def observe(self):
        self.ctx.forget_reads()
        record = self.ctx.registry.get(named_images.image_key(self.params["name"]))
        self.generation = self.ctx.registry.read_generation(named_images.image_key(self.params["name"]))
        cached = bool(self.origin) and images.cached_volume(self.ctx.storage, self.origin["checksum"])[0] is not None
        return record, cached

    def plan(self, observed):
        return plan_replica(self.params, observed[0], observed[1], self.origin)

    def _copy(self, _action, _observed):
        source_vol, _fmt = images.cached_volume(self.origin_ctx.storage, self.origin["checksum"])
        if source_vol is None:
            raise NotFoundError("image %s lost its cached volume on pool %s"
                                % (self.params["name"], self.origin_ctx.name), "from_machine")
        cache_copy(self.origin_ctx.conn, source_vol, self.ctx.conn, self.ctx.storage, self.origin["checksum"])

    def _publish(self, action, _observed):
        write_record(self.ctx, action.data["body"], self.generation)

    APPLY = {"copy": _copy, "publish": _publish}

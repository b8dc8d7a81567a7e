# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Moving a machine to another pool, converged through observe -> plan -> apply (see convergence.py).

cold (any two pools, over any URI): the guest is shut down; every file the machine has in its pool's storage
(disks, seed ISO, Ignition file, console log) is streamed through libvirt into the target's storage with its
holes kept, so a thin qcow2 overlay stays thin; the base image is cached on the target by its checksum first
(streamed from the source's cache when the target lacks it, its sha256 checked on the way); the domain is
defined on the target with the same name, UUID, MACs and record, started if it ran, and only then deleted from
the source.
live (where the two daemons reach each other): libvirt's peer-to-peer migration with an incremental copy of
the writable disks onto overlays prepared on the target, the read-only files streamed beforehand.

A move is journaled: before its first write it puts ``move-<machine>`` (what it moves where, whether the guest
ran, the volumes it makes) into the registry of both pools, and removes it last. A run that dies leaves the
machine whole on one pool and the journal behind; the next run resolves it (``resolve_interrupted``): before
the copy was defined on the target, the partial copy is discarded and the move made again; after that, the move
is finished. A move that fails (rather than dies) before the source is deleted is rolled back at once.
"""

from __future__ import annotations

import hashlib
import re
import struct
import time
from urllib.parse import parse_qs, urlsplit

from ansible_collections.machinery.compute.plugins.module_utils import connection as lv
from ansible_collections.machinery.compute.plugins.module_utils import domain as dx
from ansible_collections.machinery.compute.plugins.module_utils import elements
from ansible_collections.machinery.compute.plugins.module_utils import options
from ansible_collections.machinery.compute.plugins.module_utils import registry as reg
from ansible_collections.machinery.compute.plugins.module_utils import storage
from ansible_collections.machinery.compute.plugins.module_utils import validation as check
from ansible_collections.machinery.compute.plugins.module_utils.admission import Admission, check_room
from ansible_collections.machinery.compute.plugins.module_utils.convergence import Action, Plan, converge, step
from ansible_collections.machinery.compute.plugins.module_utils.errors import (
    ConflictError, LibvirtFailure, MachineryError, NotFoundError, PoolFull, ValidationError)
from ansible_collections.machinery.compute.plugins.module_utils.fleet import in_parallel, offline_snapshot, snapshot_of
from ansible_collections.machinery.compute.plugins.module_utils.machine import shutdown, wait_for_address
from ansible_collections.machinery.compute.plugins.module_utils.machine_spec import host_bridge
from ansible_collections.machinery.compute.plugins.module_utils.machine_status import is_active, machine_status, now
from ansible_collections.machinery.compute.plugins.module_utils.pool_context import PoolContext
from ansible_collections.machinery.compute.plugins.module_utils.scheduler import Ledger, Unschedulable, place_one

MODES = options.MIGRATION_MODES
QCOW2_MAGIC = b"QFI\xfb"
MAX_BACKING_NAME = 1023  # qemu refuses longer backing file names
_IMAGE_CACHE = re.compile(r"^image-(?P<prefix>[0-9a-f]{32})\.(?P<format>qcow2|raw)$")


def move_key(machine):
    """The journal of a move in both pools' registries."""
    return "move-%s" % machine


# --- pure pieces ------------------------------------------------------------------------------------------------

def backing_reference(head):
    """(offset, length, cluster size) of the backing file name in the first bytes of a qcow2 file."""
    if len(head) < 24 or head[:4] != QCOW2_MAGIC:
        raise ValueError("not a qcow2 header")
    offset, length, cluster_bits = struct.unpack(">QII", head[8:24])
    return offset, length, 1 << cluster_bits


def rebase_header(head, backing):
    """What ``qemu-img rebase -u`` does, on the first bytes of a qcow2 file: the backing file name replaced in
    place, nothing else. The name lives in the header cluster after the header extensions, so a new name fits
    when it ends inside that cluster (qemu's own rule). ``head`` must reach past the old and the new name."""
    offset, length, cluster = backing_reference(head)
    new = backing.encode()
    if not offset:
        raise ValueError("the image has no backing file to point elsewhere")
    if len(new) > MAX_BACKING_NAME or offset + len(new) > cluster:
        raise ValueError("the backing file name %s does not fit in the qcow2 header" % backing)
    span = max(length, len(new))
    if len(head) < offset + span:
        raise ValueError("the header given is too short")
    patched = bytearray(head)
    patched[offset:offset + span] = new.ljust(span, b"\0")
    patched[16:20] = struct.pack(">I", len(new))
    return bytes(patched)


def header_bytes_needed(head, backing):
    """How many first bytes ``rebase_header`` needs, once ``head`` holds the fixed header (24 bytes)."""
    offset, length, _cluster = backing_reference(head)
    return offset + max(length, len(backing.encode()))


def relocate(tree, source_dir, target_dir):
    """The domain ``tree`` with every file in the source pool's storage pointed at the same name in the
    target's (disks, seed, Ignition, console log), edited in place; the emulator path goes, so the target's
    libvirt picks its own."""
    old, new = source_dir.rstrip("/") + "/", target_dir.rstrip("/") + "/"
    for node in tree.iter():
        for attribute in ("file", "path"):
            value = node.get(attribute)
            if value and value.startswith(old):
                node.set(attribute, new + value[len(old):])
    emulator = tree.find("devices/emulator")
    if emulator is not None:
        emulator.getparent().remove(emulator)
    return tree


def machine_files(tree, storage_dir):
    """[{volume, kind, device}] of every file of a machine's domain in its pool's storage, in document order:
    ``disk`` (written by the guest), ``readonly`` (seed cdrom), ``file`` (the Ignition file) and ``log`` (the
    console). A disk outside the storage cannot be moved through the pool's volumes: ConflictError."""
    prefix = storage_dir.rstrip("/") + "/"
    found = []
    seen = set()

    def add(path, kind, device=None):
        if not path or path in seen:
            return
        seen.add(path)
        if not path.startswith(prefix) or "/" in path[len(prefix):]:
            raise ConflictError("%s of the machine is %s, outside its pool's storage %s: only machines whose "
                                "files are volumes of that storage can move" % (device or kind, path, storage_dir),
                                "machine")
        found.append({"volume": path[len(prefix):], "kind": kind, "device": device})
    for disk in elements.read_disks(tree):
        add(disk["path"], "readonly" if disk["readonly"] or disk["type"] == "cdrom" else "disk", disk["device"])
    for entry in tree.findall("sysinfo/entry"):
        add(entry.get("file"), "file")
    for log in tree.findall("devices/serial/log") + tree.findall("devices/console/log"):
        add(log.get("file"), "log")
    return found


def image_of(backing_volume, record):
    """{volume, checksum, format} of the image cache a disk is an overlay of: the full sha256 from the record
    when it has it, else the 32 characters the cache's name carries. Another backing file: ConflictError."""
    match = _IMAGE_CACHE.match(backing_volume or "")
    if not match:
        raise ConflictError("a disk of the machine is an overlay of %s, which is not an image cache of the pool"
                            % backing_volume, "machine")
    spec = (record or {}).get("spec", {})
    sums = [(spec.get("image") or {}).get("checksum")]
    sums += [(vol.get("image") or {}).get("checksum") for vol in spec.get("volumes") or []]
    full = next((value for value in sums if value and value.startswith(match.group("prefix"))), None)
    return {"volume": backing_volume, "checksum": full or match.group("prefix"), "format": match.group("format")}


def unix_socket_dir(uri):
    """The directory of a qemu+unix URI's socket, or None for any other URI."""
    parts = urlsplit(uri or "")
    if parts.scheme != "qemu+unix":
        return None
    socket = (parse_qs(parts.query).get("socket") or [None])[0]
    return socket.rsplit("/", 1)[0] or "/" if socket and socket.startswith("/") else None


def choose_mode(mode, active, source_uri, target_uri):
    """cold or live for the move of a machine that runs (``active``) or not.

    live needs a running guest. auto goes live only where the collection can tell that the two daemons reach
    each other: both behind unix sockets of this controller, which share its file system (the lab); between
    real hosts (ssh, tls, tcp) it cannot know that beforehand, so auto is cold there and live must be asked for."""
    mode = check.one_of(mode or "auto", MODES, "mode")
    if mode == "cold":
        return "cold"
    if not active:
        if mode == "live":
            raise ValidationError("a live move needs a running machine; this one is stopped, so move it cold",
                                  "mode")
        return "cold"
    if mode == "auto":
        return "live" if unix_socket_dir(source_uri) and unix_socket_dir(target_uri) else "cold"
    return "live"


def live_transport(machine, source_uri, target_uri):
    """Where QEMU sends the memory and the disks in a live move. Two daemons behind unix sockets of one file
    system use unix sockets beside the target's (libvirt >= 6.6); otherwise libvirt's default, a TCP
    connection from the source host to the target host."""
    if unix_socket_dir(source_uri) and unix_socket_dir(target_uri):
        where = unix_socket_dir(target_uri)
        return {"uri": "unix://%s/machinery-migrate-%s.sock" % (where, machine),
                "disks_uri": "unix://%s/machinery-nbd-%s.sock" % (where, machine)}
    return {}


def ours(side, journal):
    """The machine of the journal is defined there (the same UUID), not another machine of that name."""
    return bool(side["exists"]) and side.get("uuid") == journal.get("uuid")


def resolve_interrupted(journal, source, target):
    """What to do with a move a dead run left (its ``journal``), seeing the two pools now: {exists, active,
    uuid} of the domain of that name on the journal's source and target.

    finish: the copy was defined on the target and the source was not started since: start the copy if the
    guest ran, delete what is left on the source. discard: the copy was never defined: its partial volumes go and
    the move is made again. discard_copy: the copy was defined but the source was started again since (so it
    holds the newer data): the copy goes and the move is made again."""
    if ours(target, journal):
        if ours(source, journal) and source["active"]:
            if target["active"]:
                raise ConflictError("%s runs on both %s and %s after an interrupted move (a live migration may "
                                    "still be under way): stop the one that must not run, then run again"
                                    % (journal["machine"], journal["source"]["pool"], journal["target"]["pool"]),
                                    "machine")
            return "discard_copy"
        return "finish"
    if ours(source, journal):
        return "discard"
    raise ConflictError("%s is on neither %s nor %s, but their registries hold the journal of its move (volumes %s);"
                        " nothing was deleted" % (journal["machine"], journal["source"]["pool"],
                                                  journal["target"]["pool"], ", ".join(journal.get("volumes") or [])),
                        "machine")


def scheduling_spec(name, record, cpu, memory):
    """The machine as the scheduler sees it: its own size (the one it runs with), no selector, no tolerations
    (the record keeps none, so every taint repels it)."""
    return {"name": name, "machine_class": (record or {}).get("spec", {}).get("machine_class"),
            "size": {"cpu": cpu, "memory": memory}, "machine_pool_selector": {}, "tolerations": [],
            "machine_pool": None}


def unmovable(machine, record):
    """A LUKS volume's passphrase secret and a fixed address live on the source pool only (issue 13): a move does
    not carry them yet, so such a machine is refused before anything is written."""
    spec = (record or {}).get("spec", {})
    encrypted = [vol["name"] for vol in spec.get("volumes") or [] if vol.get("encrypted")]
    if encrypted:
        raise ConflictError("%s has encrypted volumes (%s) whose passphrase secret stays on its pool; moving it is "
                            "not supported" % (machine, ", ".join(encrypted)), "machine")
    fixed = [nic["name"] for nic in spec.get("network_interfaces") or [] if nic.get("ip_address")]
    if fixed:
        raise ConflictError("%s has fixed addresses (network interfaces %s) reserved on its pool's network; moving "
                            "it is not supported" % (machine, ", ".join(fixed)), "machine")


def pick_target(machine, snapshots, source_uri, strategy="spread", wanted=None):
    """The pool a machine moves to: ``wanted`` (a pool name) or the scheduler's choice among the pools other
    than its own that publish its class, with the filters and score of scheduler.py. Raises Unschedulable."""
    candidates = []
    skipped = {}
    for snapshot in snapshots:
        if snapshot["uri"] == source_uri:
            continue
        if machine["machine_class"] and snapshot.get("state") == "Ready" and \
                machine["machine_class"] not in (snapshot.get("classes") or {}):
            skipped[snapshot["name"]] = "class %s not published" % machine["machine_class"]
            continue
        candidates.append(dict(snapshot, machines=[]))
    if wanted is not None and wanted in skipped:
        raise Unschedulable("%s cannot move to %s: %s" % (machine["name"], wanted, skipped[wanted]), "target")
    spec = dict(machine, machine_pool=wanted)
    try:
        chosen, reason = place_one(spec, candidates, Ledger(candidates), strategy)
    except Unschedulable as exc:
        detail = "".join("; %s: %s" % item for item in sorted(skipped.items()))
        raise Unschedulable(exc.message + detail, "target") from None
    return chosen, reason


def journal_body(machine, uuid, mode, was_running, source, target, volumes, images):
    return {"machine": machine, "uuid": uuid, "mode": mode, "was_running": bool(was_running),
            "source": dict(source), "target": dict(target), "volumes": list(volumes), "images": list(images),
            "started": now().isoformat()}


def move_steps(facts, mode, was_running, shutdown_timeout):
    """The steps of one move (pure): ``facts`` is what observe found ({machine, source, target, files, images
    missing on the target}); the order is the contract the journal's recovery relies on."""
    name = facts["machine"]
    target = facts["target"]["pool"]
    steps = [step("write_journal", name, pools=[target, facts["source"]["pool"]])]
    if mode == "cold" and facts["active"]:
        steps.append(step("shutdown", name, timeout=shutdown_timeout))
    for image in facts["missing_images"]:
        steps.append(step("cache_image", image["volume"], pool=target, checksum=image["checksum"]))
    for item in facts["files"]:
        if mode == "live" and item["kind"] == "log":
            continue  # QEMU on the target opens its own console log
        operation = "prepare_volume" if mode == "live" and item["kind"] == "disk" else "copy_volume"
        steps.append(step(operation, item["volume"], pool=target, format=item["format"],
                          capacity=item["capacity"], backing=item.get("backing")))
    if mode == "live":
        steps.append(step("migrate", name, pool=target))
    else:
        steps.append(step("define", name, pool=target))
        if was_running:
            steps.append(step("start", name, pool=target))
    steps += [step("delete_volume", item["volume"], pool=facts["source"]["pool"]) for item in facts["files"]]
    steps.append(step("undefine", name, pool=facts["source"]["pool"]))
    steps.append(step("clear_journal", name))
    return steps


def recovery_steps(kind, journal, source, target, present):
    """The steps that resolve an interrupted move (see resolve_interrupted); ``present`` are the journal's volumes
    that still exist and no other machine uses: {"source": [...], "target": [...], "images": [...]} (images: the
    target's image caches whose upload was cut off)."""
    name = journal["machine"]
    there, here = journal["target"]["pool"], journal["source"]["pool"]
    if kind == "finish":
        steps = []
        if journal.get("was_running") and not target["active"]:
            steps.append(step("start", name, pool=there))
        steps += [step("delete_volume", volume, pool=here) for volume in present["source"]]
        if ours(source, journal):
            steps.append(step("undefine", name, pool=here))
        return steps + [step("clear_journal", name)]
    steps = [step("undefine", name, pool=there)] if kind == "discard_copy" else []
    steps += [step("delete_volume", volume, pool=there) for volume in present["target"]]
    steps += [step("delete_image", image, pool=there) for image in present.get("images", [])]
    return steps + [step("clear_journal", name)]


# --- libvirt pieces ---------------------------------------------------------------------------------------------

def refresh(pool, attempts=50):
    """Rescan a storage pool; libvirt refuses while a volume is being created in it, so try again briefly."""
    for attempt in range(attempts):
        try:
            pool.refresh(0)
            return
        except lv.libvirt.libvirtError as exc:
            if attempt == attempts - 1:
                raise LibvirtFailure("cannot refresh storage pool %s: %s" % (pool.name(), lv.describe(exc))) from None
            time.sleep(0.1)


def volume_facts(vol):
    """{format, capacity, bytes (the file's length), mode, backing (path)} of a volume."""
    info = elements.read_volume(elements.parse(vol.XMLDesc(0)))
    length = vol.infoFlags(lv.libvirt.VIR_STORAGE_VOL_GET_PHYSICAL)[2]
    return {"format": info["format"] or "raw", "capacity": info["capacity"], "bytes": length,
            "mode": info["mode"], "backing": info["backing"]}


def _sparse_chunks(stream):
    """(data bytes | hole length) pieces of a sparse download stream, in order."""
    while True:
        data = stream.recvFlags(storage.CHUNK, lv.libvirt.VIR_STREAM_RECV_STOP_AT_HOLE)
        if data == -3:
            yield stream.recvHole(0)
        elif data == -2:
            time.sleep(0.01)
        elif not data:
            return
        else:
            yield data


def stream_volume(source_conn, source_vol, target_conn, target_vol, backing=None):
    """Copy the bytes of ``source_vol`` into ``target_vol`` through two libvirt streams, holes kept as holes.
    With ``backing``, the qcow2 header's backing file name is rewritten on the way (``rebase_header``).
    Returns the sha256 of the bytes the source holds (holes read as zeros)."""
    down = source_conn.newStream(0)
    up = target_conn.newStream(0)
    digest = hashlib.sha256()
    zeros = bytes(storage.CHUNK)
    head = b"" if backing else None
    try:
        source_vol.download(down, 0, 0, lv.libvirt.VIR_STORAGE_VOL_DOWNLOAD_SPARSE_STREAM)
        target_vol.upload(up, 0, 0, lv.libvirt.VIR_STORAGE_VOL_UPLOAD_SPARSE_STREAM)
        for piece in _sparse_chunks(down):
            if isinstance(piece, int):
                if head:
                    raise LibvirtFailure("the qcow2 header of %s is cut by a hole" % source_vol.name())
                left = piece
                while left:
                    digest.update(zeros[:min(left, len(zeros))])
                    left -= min(left, len(zeros))
                up.sendHole(piece, 0)
                continue
            digest.update(piece)
            if head is not None:
                head += piece
                if len(head) < 24 or len(head) < header_bytes_needed(head, backing):
                    continue
                piece, head = rebase_header(head, backing), None
            storage.send_chunks(up, [piece])
        if head:
            raise LibvirtFailure("the qcow2 header of %s is cut short" % source_vol.name())
        down.finish()
        up.finish()
    except BaseException as exc:
        for stream in (down, up):
            try:
                stream.abort()
            except Exception:  # closed by the daemon already
                pass
        if isinstance(exc, lv.libvirt.libvirtError):
            raise LibvirtFailure("copying volume %s failed: %s" % (source_vol.name(), lv.describe(exc))) from None
        if isinstance(exc, ValueError):
            raise LibvirtFailure("copying volume %s failed: %s" % (source_vol.name(), exc)) from None
        raise
    return digest.hexdigest()


UNDEFINE_FLAGS = ("VIR_DOMAIN_UNDEFINE_MANAGED_SAVE", "VIR_DOMAIN_UNDEFINE_SNAPSHOTS_METADATA",
                  "VIR_DOMAIN_UNDEFINE_NVRAM", "VIR_DOMAIN_UNDEFINE_CHECKPOINTS_METADATA")


def undefine(dom, name):
    flags = 0
    for flag in UNDEFINE_FLAGS:
        flags |= getattr(lv.libvirt, flag)
    try:
        dom.undefineFlags(flags)
    except lv.libvirt.libvirtError as exc:
        if exc.get_error_code() != lv.libvirt.VIR_ERR_NO_DOMAIN:
            raise LibvirtFailure("cannot undefine %s: %s" % (name, lv.describe(exc))) from None


# --- observe ----------------------------------------------------------------------------------------------------

class Side:
    """The machine as one pool holds it: its domain (or none) and the move journal in the pool's registry."""

    def __init__(self, ctx, name, label):
        self.ctx = ctx
        self.uri = ctx.uri
        self.pool = ctx.name or label or ctx.uri
        self.dom = lv.lookup_domain(ctx.conn, name)
        self.tree = self.record = self.state = None
        if self.dom is not None:
            self.tree = dx.parse(self.dom.XMLDesc(lv.libvirt.VIR_DOMAIN_XML_INACTIVE))
            self.record = dx.read_record(self.tree)
            self.state = tuple(self.dom.state())
        self.journal = reg.Registry.open(ctx.conn).get(move_key(name)) if ctx.registration else None

    @property
    def exists(self):
        return self.dom is not None

    @property
    def active(self):
        return self.exists and is_active(self.state[0])

    def facts(self):
        return {"exists": self.exists, "active": self.active,
                "uuid": self.dom.UUIDString() if self.exists else None}

    def where(self):
        return {"pool": self.pool, "uri": self.uri}


class Observation:
    """What a move run read: the sides it looked at (by URI), a journal left by a dead run and how to resolve
    it, and for a new move its source and target sides and the facts the plan needs."""

    def __init__(self, machine):
        self.machine = machine
        self.sides = {}
        self.journal = None
        self.recovery = None  # (kind, source side, target side, present volumes)
        self.source = None
        self.target = None
        self.facts = None  # of a new move
        self.reason = None  # why the target was chosen
        self.problem = None  # a new move that cannot be made after a recovery: raised once that is done
        self.done = None  # where the machine already is when nothing needs to move
        self.cleared = {}  # uri: volumes and domain the resolution of an interrupted move deletes there first


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

    def side(self, pool):
        return {self.source.pool: self.source, self.target.pool: self.target}.get(pool)


class Pools:
    """One PoolContext per URI, opened when first needed; names given in ``pools`` are kept for pools that are
    not registered (their registration's name wins)."""

    def __init__(self, entries, opener=None):
        self.entries = entries
        self.labels = {entry["uri"]: entry.get("name") for entry in entries}
        self.opener = opener
        self.contexts = {}

    def get(self, uri, field="pools"):
        if uri not in self.contexts:
            ctx = PoolContext(lv.open_connection(uri, field), uri)
            ctx.url_opener = self.opener
            self.contexts[uri] = ctx
        return self.contexts[uri]

    def side(self, uri, name, field="pools"):
        ctx = self.get(uri, field)
        return Side(ctx, name, self.labels.get(uri))

    def close(self):
        for ctx in self.contexts.values():
            try:
                ctx.conn.close()
            except lv.libvirt.libvirtError:
                pass
        self.contexts = {}


# --- the resource -----------------------------------------------------------------------------------------------

class MoveResource:
    """One machine's move, for ``converge``: ``params`` are the module's (machine, uri, target, mode, strategy,
    shutdown_timeout), ``pools`` the fleet's PoolContexts."""

    def __init__(self, pools, params, check_mode=False):
        self.pools = pools
        self.params = params
        self.check_mode = check_mode
        self.machine = check.dns_label(params.get("machine"), "machine")
        self.mode = check.one_of(params.get("mode") or "auto", MODES, "mode")
        self.strategy = params.get("strategy") or "spread"
        self.shutdown_timeout = check.timeout_seconds(params.get("shutdown_timeout", 60), "shutdown_timeout", True)
        self.source_uri = lv.validate_uri(params["uri"], "uri") if params.get("uri") else None
        self.target_uri = self._target(params.get("target"))
        if self.source_uri and self.source_uri == self.target_uri:
            raise ValidationError("%s is the pool the machine is moved off (uri); name another pool"
                                  % params["target"], "target")
        if not self.source_uri and not params.get("target"):
            raise ValidationError("give the pool to move the machine off (uri) or the pool to move it to (target)",
                                  "uri")
        self.warnings = []
        self.stopped_at = None  # when the cold move asked the guest to power off
        self.downtime = None
        self.chosen_mode = None

    def _target(self, target):
        """The URI of the requested target: as given, or of the pool of ``pools`` with that name."""
        if target in (None, ""):
            return None
        if not isinstance(target, str):
            raise ValidationError("must be a pool name or a libvirt URI", "target")
        if "://" in target:
            return lv.validate_uri(target, "target")
        for entry in self.pools.entries:
            if entry.get("name") == target:
                return entry["uri"]
        for entry in self.pools.entries:  # registered names, for pools given by URI alone
            try:
                if self.pools.get(entry["uri"]).name == target:
                    return entry["uri"]
            except MachineryError:
                continue
        raise NotFoundError("no pool named %s among pools (%s)" % (target, ", ".join(
            entry.get("name") or entry["uri"] for entry in self.pools.entries) or "none given"), "target")

    def describe(self):
        return "the move of machine %s" % self.machine

    # observe

    def observe(self):
        obs = Observation(self.machine)
        scope = [entry["uri"] for entry in self.pools.entries] + [self.source_uri, self.target_uri]
        for uri in scope:
            if uri and uri not in obs.sides:
                field = "uri" if uri == self.source_uri else "target" if uri == self.target_uri else "pools"
                try:
                    obs.sides[uri] = self.pools.side(uri, self.machine, field)
                except MachineryError:
                    if field != "pools":
                        raise
                    self.warnings.append("pool %s could not be read" % uri)
        journals = [side.journal for side in sorted(obs.sides.values(), key=lambda side: side.uri != self.source_uri)
                    if side.journal]
        preferred = None
        if journals:
            home, active, was_running, preferred = self._observe_interrupted(obs, journals[0])
        else:
            home = self._home(obs)
            active = was_running = home.active
        if (self.target_uri and home.uri == self.target_uri) or (self.source_uri and home.uri != self.source_uri):
            obs.done = home
            if self.target_uri and home.uri != self.target_uri:
                self.warnings.append("%s is neither on %s nor on %s but on %s; nothing was moved"
                                     % (self.machine, self.source_uri, self.params["target"], home.pool))
            return obs
        try:
            self._plan_new_move(obs, home, self.target_uri or preferred, active, was_running)
        except MachineryError as exc:
            if not obs.recovery or (isinstance(exc, ValidationError) and exc.field == "mode"):
                raise
            obs.problem = exc  # raised once the interrupted move is resolved
        return obs

    def _side(self, obs, uri, field="machine"):
        if uri not in obs.sides:
            obs.sides[uri] = self.pools.side(uri, self.machine, field)
        return obs.sides[uri]

    def _home(self, obs):
        """The side where the machine is: on ``uri`` when it is there, else the one pool that has it."""
        source = obs.sides.get(self.source_uri)
        if source is not None and source.exists:
            return source
        homes = [side for side in obs.sides.values() if side.exists]
        if len(homes) > 1:
            raise ConflictError("a machine named %s is on %s; give uri, the pool to move it off"
                                % (self.machine, " and ".join(side.pool for side in homes)), "machine")
        if not homes:
            raise NotFoundError("no machine %s on %s" % (self.machine, ", ".join(
                side.pool for side in obs.sides.values())), "machine")
        return homes[0]

    def _unused(self, side, names, journal):
        """Of ``names``, the volumes ``side`` has that no domain uses but the journal's machine."""
        refresh(side.ctx.storage)
        used = set()
        for dom in side.ctx.conn.listAllDomains(0):
            if dom.name() == self.machine and dom.UUIDString() == journal.get("uuid"):
                continue
            used.update(disk["path"] for disk in elements.read_disks(dx.parse(
                dom.XMLDesc(lv.libvirt.VIR_DOMAIN_XML_INACTIVE))))
        return [name for name in names if lv.lookup_volume(side.ctx.storage, name) is not None
                and side.ctx.storage_file(name) not in used]

    def _observe_interrupted(self, obs, journal):
        """Resolve the move a dead run left: (the side the machine is on once that is done, whether its guest runs
        then, whether it ran before the move, the target a move made again goes to)."""
        obs.journal = journal
        source = self._side(obs, journal["source"]["uri"])
        target = self._side(obs, journal["target"]["uri"])
        kind = resolve_interrupted(journal, source.facts(), target.facts())
        volumes = journal.get("volumes") or []
        images = [name for name in self._unused(target, journal.get("images") or [], journal)
                  if lv.lookup_volume(target.ctx.storage, name + ".complete") is None]
        present = {"source": self._unused(source, volumes, journal) if kind == "finish" else [],
                   "target": self._unused(target, volumes, journal) if kind != "finish" else [], "images": images}
        obs.recovery = (kind, source, target, present)
        if kind == "finish":  # which starts the copy if the guest ran
            domain = {"domain"} if ours(source.facts(), journal) else set()
            obs.cleared = {source.uri: set(present["source"]) | domain}
            running = bool(journal.get("was_running") or target.active)
            return target, running, running, None
        obs.cleared = {target.uri: set(present["target"]) | ({"domain"} if kind == "discard_copy" else set())}
        return source, source.active, bool(journal.get("was_running") or source.active), target.uri

    def _plan_new_move(self, obs, home, target_uri, active, was_running):
        if home.record is None:
            raise ConflictError("%s on %s was not created by machinery.compute (adopt it with the machine module "
                                "first)" % (self.machine, home.pool), "machine")
        unmovable(self.machine, home.record)
        spec = scheduling_spec(self.machine, home.record, dx.read_cpu(home.tree), dx.read_memory(home.tree))
        uris = [entry["uri"] for entry in self.pools.entries if entry["uri"] != home.uri]
        if target_uri and target_uri not in uris:
            uris.append(target_uri)
        snapshots = self._snapshots(uris)
        wanted = None
        if target_uri:
            wanted = next(snapshot["name"] for snapshot in snapshots if snapshot["uri"] == target_uri)
        chosen, obs.reason = pick_target(spec, snapshots, home.uri, self.strategy, wanted)
        target = self._side(obs, chosen["uri"], "target")
        cleared = obs.cleared.get(target.uri, set())
        if target.exists and "domain" not in cleared:
            raise ConflictError("pool %s already has a machine named %s" % (target.pool, self.machine), "target")
        obs.source, obs.target = home, target
        obs.facts = self._facts(home, target, cleared)
        obs.facts.update(active=bool(active), was_running=bool(was_running))
        self.chosen_mode = choose_mode(self.mode, active, home.uri, target.uri)

    def _snapshots(self, uris):
        def read(uri):
            try:
                ctx = self.pools.get(uri)
                return snapshot_of(ctx, self.pools.labels.get(uri))
            except MachineryError as exc:
                return offline_snapshot({"uri": uri, "name": self.pools.labels.get(uri)}, str(exc))
            except lv.libvirt.libvirtError as exc:
                return offline_snapshot({"uri": uri, "name": self.pools.labels.get(uri)}, lv.describe(exc))
        for uri in uris:  # connect first, one thread: PoolContext is not shared before it is primed
            try:
                self.pools.get(uri)
            except MachineryError:
                pass
        return in_parallel(uris, read, len(uris) or 1)

    def _facts(self, home, target, reuse):
        """What the plan of a new move needs of its two pools (reads only)."""
        ctx, there = home.ctx, target.ctx
        if not there.registration:
            raise NotFoundError("%s is not a registered pool: run machinery.compute.machine_pool against it first"
                                % target.uri, "target")
        source_dir, target_dir = ctx.storage_path, there.storage_path
        refresh(ctx.storage)
        refresh(there.storage)
        files = []
        images = {}
        for item in machine_files(home.tree, source_dir):
            vol = lv.lookup_volume(ctx.storage, item["volume"])
            if vol is None:
                if item["kind"] == "log":
                    continue  # never started, or its log was removed: QEMU makes a new one
                raise ConflictError("volume %s of %s is missing from pool %s: the machine is not whole"
                                    % (item["volume"], self.machine, home.pool), "machine")
            facts = volume_facts(vol)
            item.update(format=facts["format"], capacity=facts["capacity"], bytes=facts["bytes"],
                        mode=facts["mode"])
            if facts["backing"]:
                prefix = source_dir.rstrip("/") + "/"
                name = facts["backing"][len(prefix):] if facts["backing"].startswith(prefix) else facts["backing"]
                image = image_of(name, home.record)
                images[image["volume"]] = image
                item["image"] = image["volume"]
                item["image_format"] = image["format"]
                item["backing"] = there.storage_file(image["volume"])
                item["rebase"] = facts["backing"] != item["backing"]
            users = storage.users_of(ctx.conn, vol.path(), self.machine)
            if users:
                raise ConflictError("volume %s of %s is also attached to %s on %s; a shared volume cannot move with "
                                    "one of its machines" % (item["volume"], self.machine, ", ".join(users), home.pool),
                                    "machine")
            if item["volume"] not in reuse and lv.lookup_volume(there.storage, item["volume"]) is not None:
                raise ConflictError("pool %s already has a volume %s" % (target.pool, item["volume"]), "target")
            files.append(item)
        for image in images.values():
            source_image = lv.lookup_volume(ctx.storage, image["volume"])
            if source_image is None:
                raise ConflictError("the image cache %s of %s is missing from pool %s"
                                    % (image["volume"], self.machine, home.pool), "machine")
            image["bytes"] = volume_facts(source_image)["bytes"]
        missing = [image for image in images.values() if lv.lookup_volume(there.storage, image["volume"]) is None
                   or lv.lookup_volume(there.storage, image["volume"] + ".complete") is None]
        self._check_target(home, target, files)
        return {"machine": self.machine, "uuid": home.dom.UUIDString(), "active": home.active,
                "source": home.where(), "target": target.where(), "files": files,
                "images": sorted(images), "missing_images": missing}

    def _check_target(self, home, target, files):
        """The target can run the machine: its networks and bridges, its virt type, room for it."""
        there = target.ctx
        for nic in elements.read_interfaces(home.tree):
            if nic["network"] and there.network(nic["network"]) is None:
                raise NotFoundError("pool %s has no network %s, which interface %s of %s uses"
                                    % (target.pool, nic["network"], nic["mac"], self.machine), "target")
            if nic["bridge"]:
                host_bridge(there, nic["bridge"], "target")
        if home.tree.get("type") == "kvm" and there.virt_type() != "kvm":
            raise ConflictError("%s runs on KVM and pool %s has no KVM" % (self.machine, target.pool), "target")
        spec = {"name": self.machine, "cpu": dx.read_cpu(home.tree), "memory": dx.read_memory(home.tree)}
        try:
            check_room(there, spec, [("target", item["capacity"]) for item in files if item["kind"] == "disk"])
        except PoolFull as exc:
            raise PoolFull(exc.message, "target") from None

    # plan

    def plan(self, obs):
        actions = []
        if obs.recovery:
            actions.append(self._recovery_action(obs))
        if obs.facts is not None and obs.problem is None:
            facts = obs.facts
            journal = journal_body(self.machine, facts["uuid"], self.chosen_mode, facts["was_running"],
                                   facts["source"], facts["target"], [item["volume"] for item in facts["files"]],
                                   [image["volume"] for image in facts["missing_images"]])
            steps = move_steps(facts, self.chosen_mode, facts["was_running"], self.shutdown_timeout)
            actions.append(Action("move", self.machine, {"pool": facts["source"]["pool"]},
                                  {"pool": facts["target"]["pool"], "mode": self.chosen_mode}, steps,
                                  journal=journal, reason=obs.reason, origin=facts["source"],
                                  destination=facts["target"]))
        return Plan(actions, list(self.warnings))

    def _recovery_action(self, obs):
        kind, source, target, present = obs.recovery
        steps = recovery_steps(kind, obs.journal, source.facts(), target.facts(), present)
        if obs.problem is not None and kind != "finish":
            kind = "roll_back"  # the move cannot be made again: the guest goes back to where it was
            if obs.journal.get("was_running") and not source.active:
                steps.insert(-1, step("start", self.machine, pool=source.pool))
        end = target if kind == "finish" else source
        return Action(kind, self.machine, {"pool": source.pool, "interrupted": "move to %s" % target.pool},
                      {"pool": end.pool}, steps, origin=source.where(), destination=end.where())

    # apply

    def apply(self, action, obs):
        if action.kind == "move":
            self._move(action, obs)
            return
        _kind, source, target, _present = obs.recovery
        self._execute(action.steps, Run(source, target, obs.journal))
        if obs.problem is not None:
            what = "finished" if action.kind == "finish" else "rolled back"
            end = target if action.kind == "finish" else source
            raise type(obs.problem)("the interrupted move of %s to %s was %s, the machine is on %s; %s"
                                    % (self.machine, target.pool, what, end.pool, obs.problem.message),
                                    obs.problem.field)

    def _move(self, action, obs):
        run = Run(obs.source, obs.target, action.data["journal"], obs.facts)
        try:
            self._execute(action.steps, run)
        except BaseException:
            if not run.deleting:
                self._roll_back(run)
            raise

    def _roll_back(self, run):
        """Undo a move that failed before the source was touched beyond its shutdown: the copy goes, the guest
        runs on the source again. What cannot be undone stays journaled for the next run."""
        source, target, journal = run.source, run.target, run.journal
        try:
            if run.defined:
                dom = lv.lookup_domain(target.ctx.conn, self.machine)
                if dom is not None and dom.UUIDString() == journal["uuid"]:
                    if dom.isActive():
                        dom.destroy()
                    undefine(dom, self.machine)
            for name in run.made:
                storage.delete_volume(target.ctx.storage, name)
            dom = lv.lookup_domain(source.ctx.conn, self.machine)
            if journal["was_running"] and dom is not None and not dom.isActive():
                dom.create()
            for side in (target, source):
                reg.Registry.open(side.ctx.conn).delete(move_key(self.machine))
        except (MachineryError, lv.libvirt.libvirtError) as exc:
            self.warnings.append("rolling the move back failed (%s); its journal stays for the next run" % exc)

    def _execute(self, steps, run):
        for entry in steps:
            side = run.side(entry.get("pool"))
            if entry["action"] in ("delete_volume", "undefine") and side is run.source:
                run.deleting = True  # from here on the move is only ever finished
            getattr(self, "_step_" + entry["action"])(entry, side, run)

    # the steps, each (step, the side it works on, the run)

    def _step_write_journal(self, _entry, _side, run):
        for side in (run.source, run.target):  # the source first: a re-run always looks there
            reg.Registry.open(side.ctx.conn).put(move_key(self.machine), run.journal)

    def _step_clear_journal(self, _entry, _side, run):
        for side in (run.target, run.source):  # the source last: a journal left there is seen by a re-run
            reg.Registry.open(side.ctx.conn).delete(move_key(self.machine))

    def _step_shutdown(self, entry, _side, run):
        self.stopped_at = time.monotonic()
        if shutdown(run.source.dom, entry["timeout"]):
            self.warnings.append("%s did not power off within %ss of the ACPI request and was forced off"
                                 % (self.machine, entry["timeout"]))

    def _step_cache_image(self, entry, _side, run):
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

    def _step_copy_volume(self, entry, _side, run):
        run.made.append(entry["target"])
        self._copy_volume(run.source, run.target, run.files[entry["target"]])

    def _step_prepare_volume(self, entry, _side, run):
        run.made.append(entry["target"])
        self._prepare_volume(run.target, run.files[entry["target"]])

    def _step_define(self, _entry, _side, run):
        self._define(run.source, run.target)
        run.defined = True

    def _step_start(self, _entry, side, run):
        self._start(side, "target" if side is run.target else "machine")

    def _step_migrate(self, _entry, _side, run):
        run.defined = True  # from here the target may hold the guest: a failure makes sure it does not
        self._migrate(run.source, run.target, run.facts)

    def _step_delete_volume(self, entry, side, _run):
        storage.delete_volume(side.ctx.storage, entry["target"])

    _step_delete_image = _step_delete_volume

    def _step_undefine(self, _entry, side, run):
        dom = lv.lookup_domain(side.ctx.conn, self.machine)
        if dom is not None and dom.UUIDString() == run.journal["uuid"]:
            if dom.isActive():
                dom.destroy()
            undefine(dom, self.machine)

    def _copy_volume(self, source, target, item):
        there = target.ctx.storage
        original = source.ctx.storage.storageVolLookupByName(item["volume"])
        now_there = volume_facts(original)  # read again: a console log grows until the guest is off
        storage.delete_volume(there, item["volume"])  # a partial copy of a run that died (journaled)
        vol = storage.create_volume(there, item["volume"], max(now_there["bytes"], 1), "raw",
                                    mode=now_there["mode"] or "0600")
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

    def _prepare_volume(self, target, item):
        """The empty disk a live move copies the guest's writes into: an overlay on the target's image cache, or
        a blank volume of the same format and size."""
        there = target.ctx.storage
        storage.delete_volume(there, item["volume"])
        backing = (item["backing"], item["image_format"]) if item.get("backing") else None
        storage.create_volume(there, item["volume"], item["capacity"], item["format"], mode=item["mode"] or "0600",
                              backing=backing)

    def _domain_xml(self, source, target, flags):
        tree = dx.parse(source.dom.XMLDesc(flags))
        return dx.tostring(relocate(tree, source.ctx.storage_path, target.ctx.storage_path))

    def _check_room_locked(self, source, target):
        spec = {"name": self.machine, "cpu": dx.read_cpu(source.tree), "memory": dx.read_memory(source.tree)}
        if lv.lookup_domain(target.ctx.conn, self.machine) is not None:
            raise ConflictError("a machine named %s was created on %s meanwhile" % (self.machine, target.pool),
                                "target")
        try:
            check_room(target.ctx, spec)
        except PoolFull as exc:
            raise PoolFull(exc.message, "target") from None

    def _define(self, source, target):
        xml = self._domain_xml(source, target, lv.libvirt.VIR_DOMAIN_XML_INACTIVE)
        with Admission(target.ctx, []):
            self._check_room_locked(source, target)
            try:
                target.ctx.conn.defineXML(xml)
            except lv.libvirt.libvirtError as exc:
                raise LibvirtFailure("cannot define %s on %s: %s" % (self.machine, target.pool, lv.describe(exc)),
                                     "target") from None

    def _start(self, side, field):
        dom = lv.lookup_domain(side.ctx.conn, self.machine)
        if dom.isActive():
            return
        try:
            dom.create()
        except lv.libvirt.libvirtError as exc:
            raise LibvirtFailure("cannot start %s on %s: %s" % (self.machine, side.pool, lv.describe(exc)),
                                 field) from None
        if self.stopped_at is not None:
            self.downtime = round(time.monotonic() - self.stopped_at, 3)

    def _migrate(self, source, target, facts):
        params = {lv.libvirt.VIR_MIGRATE_PARAM_PERSIST_XML:
                  self._domain_xml(source, target, lv.libvirt.VIR_DOMAIN_XML_INACTIVE),
                  lv.libvirt.VIR_MIGRATE_PARAM_MIGRATE_DISKS:
                  [item["device"] for item in facts["files"] if item["kind"] == "disk"]}
        transport = live_transport(self.machine, source.uri, target.uri)
        if transport:
            params[lv.libvirt.VIR_MIGRATE_PARAM_URI] = transport["uri"]
            params[lv.libvirt.VIR_MIGRATE_PARAM_DISKS_URI] = transport["disks_uri"]
        if source.ctx.storage_path != target.ctx.storage_path:
            params[lv.libvirt.VIR_MIGRATE_PARAM_DEST_XML] = self._domain_xml(
                source, target, lv.libvirt.VIR_DOMAIN_XML_MIGRATABLE)
        flags = (lv.libvirt.VIR_MIGRATE_LIVE | lv.libvirt.VIR_MIGRATE_PEER2PEER |
                 lv.libvirt.VIR_MIGRATE_NON_SHARED_INC | lv.libvirt.VIR_MIGRATE_PERSIST_DEST)
        with Admission(target.ctx, []):
            self._check_room_locked(source, target)
        try:
            source.dom.migrateToURI3(target.uri, params, flags)
        except lv.libvirt.libvirtError as exc:
            raise LibvirtFailure("the live migration of %s to %s failed, the machine still runs on %s: %s"
                                 % (self.machine, target.pool, source.pool, lv.describe(exc)), "mode") from None
        try:
            stats = source.dom.jobStats(lv.libvirt.VIR_DOMAIN_JOB_STATS_COMPLETED)
            self.downtime = round(stats["downtime"] / 1000.0, 3) if "downtime" in stats else None
        except lv.libvirt.libvirtError:
            self.downtime = None


# --- the service the module calls -------------------------------------------------------------------------------

def run(entries, params, check_mode=False, opener=None):
    """Move one machine as ``params`` say: (plan, the module's return beyond what the plan gives)."""
    pools = Pools(entries, opener)
    try:
        resource = MoveResource(pools, params, check_mode)
        plan, obs = converge(resource, check_mode)
        side = obs.done or obs.source  # after a move its target; in check mode where the machine is now
        machine = machine_status(side.dom, side.ctx) if side is not None and side.exists else None
        if not check_mode and machine and side.active and params.get("wait") == "address":
            nics = (side.record or {}).get("spec", {}).get("network_interfaces")
            wait_for_address(side.ctx, side.dom, resource.machine, nics, float(params.get("wait_timeout") or 300))
            machine = machine_status(side.dom, side.ctx)
        move = plan.find("move")
        ends = [action.data for action in plan.actions]
        return plan, {"machine": machine,
                      "source": ends[0]["origin"] if ends else None,
                      "target": ends[-1]["destination"] if ends else None,
                      "mode": move.after["mode"] if move is not None else None,
                      "reason": move.data["reason"] if move is not None else None,
                      "downtime": resource.downtime,
                      "warnings": sorted(set(resource.warnings))}
    finally:
        pools.close()

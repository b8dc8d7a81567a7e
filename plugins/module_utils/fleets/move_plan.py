# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The pure half of a move (machine_migrate, the drain role): which mode, which target, which files and steps,
how an interrupted move resumes, and the qcow2 header edits that keep a thin overlay thin on another pool. No
libvirt calls here; migrate.py observes and applies (see its docstring for the whole story)."""

from __future__ import annotations

import re
import struct
from urllib.parse import parse_qs, urlsplit

from ansible_collections.machinery.compute.plugins.module_utils.core import elements
from ansible_collections.machinery.compute.plugins.module_utils.core import options
from ansible_collections.machinery.compute.plugins.module_utils.core import validation as check
from ansible_collections.machinery.compute.plugins.module_utils.core.convergence import step
from ansible_collections.machinery.compute.plugins.module_utils.core.errors import ConflictError, ValidationError
from ansible_collections.machinery.compute.plugins.module_utils.machines.machine_status import now
from ansible_collections.machinery.compute.plugins.module_utils.pools import capacity
from ansible_collections.machinery.compute.plugins.module_utils.coordination import keys
from ansible_collections.machinery.compute.plugins.module_utils.pools.scheduler import Ledger, Unschedulable, place_one

MODES = options.MIGRATION_MODES
QCOW2_MAGIC = b"QFI\xfb"
MAX_BACKING_NAME = 1023  # qemu refuses longer backing file names
_IMAGE_CACHE = re.compile(r"^image-(?P<prefix>[0-9a-f]{32})\.(?P<format>qcow2|raw)$")


def move_key(machine):
    """The journal of a move in both pools' registries."""
    return keys.move_key(machine)


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
    nvram = tree.find("os/nvram")
    if nvram is not None and (nvram.text or "").startswith(old):
        nvram.text = new + nvram.text[len(old):]
    emulator = tree.find("devices/emulator")
    if emulator is not None:
        emulator.getparent().remove(emulator)
    return tree


def machine_files(tree, storage_dir):
    """[{volume, kind, device}] of every file of a machine's domain in its pool's storage, in document order:
    ``disk`` (written by the guest), ``readonly`` (seed cdrom), ``file`` (the Ignition file) and ``log`` (the
    console), ``nvram`` (UEFI variables kept in the storage). A disk outside the storage cannot be moved through the
    pool's volumes: ConflictError."""
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
    nvram = (tree.findtext("os/nvram") or "").strip()
    if nvram.startswith(prefix):  # UEFI variables kept in the storage (firmware.place_nvram) move with the machine
        add(nvram, "nvram")
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
    """The machine as the scheduler sees it: its own size (the one it runs with), no selector, the tolerations
    its record keeps (none for machines made before records kept them: every taint repels those), the virtual
    size of the disks it takes along, and its server group."""
    spec = (record or {}).get("spec", {})
    return {"name": name, "machine_class": spec.get("machine_class"),
            "size": {"cpu": cpu, "memory": memory}, "machine_pool_selector": {},
            "tolerations": spec.get("tolerations") or [], "machine_pool": None,
            "storage": sum(capacity.machine_disks(record or {}).values()), "server_group": spec.get("server_group")}


def unmovable(machine, record, snapshots=()):
    """A LUKS volume's passphrase secret and a fixed address live on the source pool only (issue 13): a move does
    not carry them yet, so such a machine is refused before anything is written. So is one with snapshots: their
    list lives in the source libvirtd, not in the disk files a move copies (and a live move of a domain with
    snapshots is refused by libvirt itself)."""
    spec = (record or {}).get("spec", {})
    if snapshots:
        raise ConflictError("%s has snapshots (%s) that libvirt keeps on its pool; delete them "
                            "(machine_snapshot state: absent) before moving it" % (machine, ", ".join(snapshots)),
                            "machine")
    encrypted = [vol["name"] for vol in spec.get("volumes") or [] if vol.get("encrypted")]
    if encrypted:
        raise ConflictError("%s has encrypted volumes (%s) whose passphrase secret stays on its pool; moving it is "
                            "not supported" % (machine, ", ".join(encrypted)), "machine")
    fixed = [nic["name"] for nic in spec.get("network_interfaces") or [] if nic.get("ip_address")]
    if fixed:
        raise ConflictError("%s has fixed addresses (network interfaces %s) reserved on its pool's network; moving "
                            "it is not supported" % (machine, ", ".join(fixed)), "machine")


def missing_hardware(machine, tree, target, capabilities, cpu_models):
    """Refuse a move to a pool whose QEMU lacks the machine's virtual hardware: its machine type (libvirt writes
    the creating host's newest, pc-q35-10.0 on QEMU 10, which QEMU 7.2 does not have) or its named CPU model.
    ``capabilities`` is the target's capabilities XML (its machine types), ``cpu_models`` the names of the
    custom CPU models its domain capabilities list; both are parsed trees."""
    os_type = tree.find("os/type")
    wanted = os_type.get("machine") if os_type is not None else None
    arch = os_type.get("arch") if os_type is not None else None
    if wanted:
        offered = set()
        for node in capabilities.iterfind("guest/arch[@name='%s']//machine" % (arch or "x86_64")):
            offered.update(name for name in (node.text, node.get("canonical")) if name)
        if wanted not in offered:
            raise ConflictError("%s has machine type %s, which the QEMU of pool %s does not have: a machine moves "
                                "only to hosts whose QEMU offers its machine type (a mixed fleet: "
                                "docs/migrate.md)" % (machine, wanted, target), "target")
    cpu = tree.find("cpu")
    model = cpu.findtext("model") if cpu is not None and cpu.get("mode", "custom") == "custom" else None
    if model and model not in cpu_models:
        raise ConflictError("%s has CPU model %s, which the QEMU of pool %s does not have: a machine moves only to "
                            "hosts that offer its CPU model (a mixed fleet: docs/migrate.md)"
                            % (machine, model, target), "target")


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

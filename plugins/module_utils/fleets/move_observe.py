# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What a move (migrate.py) observes, reading only: the machine as each pool of the run holds it, the journal a
dead run left and how it resolves, and for a new move the home pool, the target and the facts its plan needs
(files, image caches, whether the target can run the machine)."""

from __future__ import annotations

from ansible_collections.machinery.compute.plugins.module_utils.core import connection as lv
from ansible_collections.machinery.compute.plugins.module_utils.core import domain as dx
from ansible_collections.machinery.compute.plugins.module_utils.core import elements
from ansible_collections.machinery.compute.plugins.module_utils.coordination import documents
from ansible_collections.machinery.compute.plugins.module_utils.core import storage
from ansible_collections.machinery.compute.plugins.module_utils.pools.capacity import check_room
from ansible_collections.machinery.compute.plugins.module_utils.core.errors import (
    ConflictError, MachineryError, NotFoundError, PoolFull, ValidationError)
from ansible_collections.machinery.compute.plugins.module_utils.fleets.fleet import in_parallel, offline_snapshot, snapshot_of
from ansible_collections.machinery.compute.plugins.module_utils.machines.machine_spec import host_bridge
from ansible_collections.machinery.compute.plugins.module_utils.machines.machine_status import is_active
from ansible_collections.machinery.compute.plugins.module_utils.machines.pool_context import PoolContext
from ansible_collections.machinery.compute.plugins.module_utils.coordination.holds import Coordination
from ansible_collections.machinery.compute.plugins.module_utils.machines.snapshots import snapshot_names
from ansible_collections.machinery.compute.plugins.module_utils.fleets.move_plan import (
    choose_mode, image_of, machine_files, missing_hardware, move_key, ours, pick_target, resolve_interrupted,
    scheduling_spec, unmovable)
from ansible_collections.machinery.compute.plugins.module_utils.fleets.volume_stream import refresh, volume_facts


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
        self.journal = documents.Registry.open(ctx.conn).get(move_key(name)) if ctx.registration else None

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
        self.mode = None  # cold or live, of a new move
        self.reason = None  # why the target was chosen
        self.problem = None  # a new move that cannot be made after a recovery: raised once that is done
        self.done = None  # where the machine already is when nothing needs to move
        self.cleared = {}  # uri: volumes and domain the resolution of an interrupted move deletes there first

    def side(self, pools, uri, field="machine"):
        """The side of ``uri``, read once per observation."""
        if uri not in self.sides:
            self.sides[uri] = pools.side(uri, self.machine, field)
        return self.sides[uri]


class Pools:
    """One PoolContext per URI, opened when first needed; names given in ``pools`` are kept for pools that are
    not registered (their registration's name wins)."""

    def __init__(self, entries, opener=None, coordination=None):
        self.entries = entries
        self.labels = {entry["uri"]: entry.get("name") for entry in entries}
        self.opener = opener
        self.contexts = {}
        self.coordination = coordination if coordination is not None else Coordination()

    def get(self, uri, field="pools"):
        if uri not in self.contexts:
            ctx = PoolContext(lv.open_connection(uri, field), uri, self.coordination)
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


class MoveObserver:
    """Observes the move ``request`` asks for (migrate.MoveRequest: the machine, the pools to move it off and to,
    mode and strategy) over ``pools``: where the machine is, a journal left behind and how it resolves, and
    through ``NewMove`` the move still to make. What it cannot read but can do without goes to ``warnings``."""

    def __init__(self, pools, request, warnings):
        self.pools = pools
        self.request = request
        self.machine = request.machine
        self.source_uri = request.source_uri
        self.target_uri = request.target_uri
        self.warnings = warnings
        self.new_move = NewMove(pools, request)

    def observe(self):
        """The sides of every pool of the run; a journal left behind, resolved; the new move, if one is due."""
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
                                     % (self.machine, self.source_uri, self.request.target_name, home.pool))
            return obs
        try:
            self.new_move.observe(obs, home, self.target_uri or preferred, active, was_running)
        except MachineryError as exc:
            if not obs.recovery or (isinstance(exc, ValidationError) and exc.field == "mode"):
                raise
            obs.problem = exc  # raised once the interrupted move is resolved
        return obs

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
        for dom, tree in dx.defined_domains(side.ctx.conn):
            if dom.name() == self.machine and dom.UUIDString() == journal.get("uuid"):
                continue
            used.update(disk["path"] for disk in elements.read_disks(tree))
        return [name for name in names if lv.lookup_volume(side.ctx.storage, name) is not None
                and side.ctx.storage_file(name) not in used]

    def _observe_interrupted(self, obs, journal):
        """Resolve the move a dead run left: (the side the machine is on once that is done, whether its guest runs
        then, whether it ran before the move, the target a move made again goes to)."""
        obs.journal = journal
        source = obs.side(self.pools, journal["source"]["uri"])
        target = obs.side(self.pools, journal["target"]["uri"])
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


class NewMove:
    """What a new move from the machine's home pool needs, reading only: its target (given, or the scheduler's
    choice), the files and image caches it copies, whether the target can run the machine, the mode."""

    def __init__(self, pools, request):
        self.pools = pools
        self.request = request
        self.machine = request.machine

    def observe(self, obs, home, target_uri, active, was_running):
        """Fill ``obs`` in for a move from ``home`` (to ``target_uri`` if given)."""
        if home.record is None:
            raise ConflictError("%s on %s was not created by machinery.compute (adopt it with the machine module "
                                "first)" % (self.machine, home.pool), "machine")
        unmovable(self.machine, home.record, snapshot_names(home.dom))
        spec = scheduling_spec(self.machine, home.record, dx.read_cpu(home.tree), dx.read_memory(home.tree))
        if self.request.resize_to:
            spec.update(self.request.resize_to)
        uris = [entry["uri"] for entry in self.pools.entries if entry["uri"] != home.uri]
        if target_uri and target_uri not in uris:
            uris.append(target_uri)
        snapshots = self._snapshots(uris)
        wanted = None
        if target_uri:
            wanted = next(snapshot["name"] for snapshot in snapshots if snapshot["uri"] == target_uri)
        chosen, obs.reason = pick_target(spec, snapshots, home.uri, self.request.strategy, wanted)
        target = obs.side(self.pools, chosen["uri"], "target")
        cleared = obs.cleared.get(target.uri, set())
        if target.exists and "domain" not in cleared:
            raise ConflictError("pool %s already has a machine named %s" % (target.pool, self.machine), "target")
        obs.source, obs.target = home, target
        obs.facts = self._facts(home, target, cleared)
        obs.facts.update(active=bool(active), was_running=bool(was_running))
        obs.mode = choose_mode(self.request.mode, active, home.uri, target.uri)

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
        refresh(ctx.storage)
        refresh(there.storage)
        files, images = self._files(home, target, reuse)
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

    def _files(self, home, target, reuse):
        """([{volume, kind, device, format, capacity, bytes, mode, image...}] of the files the move copies,
        {volume: image cache} of the caches their disks are overlays of); a volume of the target that is in the
        way and not in ``reuse`` (cleared by the resolution of an interrupted move) is a conflict."""
        ctx, there = home.ctx, target.ctx
        source_dir = ctx.storage_path
        files = []
        images = {}
        for item in machine_files(home.tree, source_dir):
            vol = lv.lookup_volume(ctx.storage, item["volume"])
            if vol is None and item["kind"] == "nvram":  # libvirt made it at a start, behind the pool's back
                storage.refresh(ctx.storage)
                vol = lv.lookup_volume(ctx.storage, item["volume"])
            if vol is None:
                if item["kind"] in ("log", "nvram"):
                    continue  # never started, or its log was removed: QEMU (libvirt) makes a new one
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
            found = lv.lookup_volume(there.storage, item["volume"]) if item["volume"] not in reuse else None
            # a console log no domain uses is the collection's own leftover: the move replaces it
            leftover_log = found is not None and item["kind"] == "log" and not storage.users_of(
                there.conn, found.path(), None)
            if found is not None and not leftover_log:
                raise ConflictError("pool %s already has a volume %s" % (target.pool, item["volume"]), "target")
            files.append(item)
        return files, images

    @staticmethod
    def _cpu_models(tree, there):
        """The custom CPU models the target's QEMU offers for the machine's type, when the machine names one."""
        cpu = tree.find("cpu")
        if cpu is None or cpu.get("mode", "custom") != "custom" or not cpu.findtext("model"):
            return set()
        os_type = tree.find("os/type")
        try:
            caps = dx.parse(there.conn.getDomainCapabilities(None, os_type.get("arch"), os_type.get("machine"),
                                                             tree.get("type"), 0))
        except lv.libvirt.libvirtError:
            return set()  # a machine type the target lacks: missing_hardware names it
        return {node.text for node in caps.iterfind("cpu/mode[@name='custom']/model")}

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
        missing_hardware(self.machine, home.tree, target.pool, dx.parse(there.conn.getCapabilities()),
                         self._cpu_models(home.tree, there))
        spec = {"name": self.machine, "cpu": dx.read_cpu(home.tree), "memory": dx.read_memory(home.tree)}
        try:
            check_room(there, spec, [("target", item["capacity"]) for item in files if item["kind"] == "disk"])
        except PoolFull as exc:
            raise PoolFull(exc.message, "target") from None

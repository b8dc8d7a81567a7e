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

import time

from ansible_collections.machinery.compute.plugins.module_utils.core import connection as lv
from ansible_collections.machinery.compute.plugins.module_utils.core import domain as dx
from ansible_collections.machinery.compute.plugins.module_utils.core import elements
from ansible_collections.machinery.compute.plugins.module_utils.pools import registry as reg
from ansible_collections.machinery.compute.plugins.module_utils.pools import storage
from ansible_collections.machinery.compute.plugins.module_utils.core import validation as check
from ansible_collections.machinery.compute.plugins.module_utils.pools.admission import Admission, check_room
from ansible_collections.machinery.compute.plugins.module_utils.core.convergence import Action, Plan, converge, step
from ansible_collections.machinery.compute.plugins.module_utils.core.errors import (
    ConflictError, LibvirtFailure, MachineryError, NotFoundError, PoolFull, ValidationError)
from ansible_collections.machinery.compute.plugins.module_utils.fleets.fleet import in_parallel, offline_snapshot, snapshot_of
from ansible_collections.machinery.compute.plugins.module_utils.machines.addresses import wait_for_address
from ansible_collections.machinery.compute.plugins.module_utils.machines.power import shutdown
from ansible_collections.machinery.compute.plugins.module_utils.machines.machine_spec import host_bridge
from ansible_collections.machinery.compute.plugins.module_utils.machines.machine_status import is_active, machine_status
from ansible_collections.machinery.compute.plugins.module_utils.machines.pool_context import PoolContext
from ansible_collections.machinery.compute.plugins.module_utils.fleets.move_plan import (
    MODES, choose_mode, image_of, journal_body, live_transport, machine_files, move_key, move_steps, ours,
    pick_target, recovery_steps, relocate, resolve_interrupted, scheduling_spec, unmovable)
from ansible_collections.machinery.compute.plugins.module_utils.fleets.volume_stream import (
    refresh, stream_volume, undefine, volume_facts)


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

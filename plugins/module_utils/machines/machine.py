# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A machine, converged through observe -> plan -> apply (see convergence.py).

``observe_machine`` reads the domain once; ``plan_machine`` is a pure function of the normalized spec
(machine_spec.py) and that observation; ``MachineResource.apply`` carries out one action. ``MachineService`` is
what the modules and machine_batch call: it converges, waits, and returns the outcome.
"""

from __future__ import annotations

import json

from ansible_collections.machinery.compute.plugins.module_utils.core import capabilities as cap
from ansible_collections.machinery.compute.plugins.module_utils.core import connection as lv
from ansible_collections.machinery.compute.plugins.module_utils.core import domain as dx
from ansible_collections.machinery.compute.plugins.module_utils.core import elements
from ansible_collections.machinery.compute.plugins.module_utils.machines import images
from ansible_collections.machinery.compute.plugins.module_utils.core import options
from ansible_collections.machinery.compute.plugins.module_utils.pools import registry as reg
from ansible_collections.machinery.compute.plugins.module_utils.pools import security_groups as sgs
from ansible_collections.machinery.compute.plugins.module_utils.machines import seed
from ansible_collections.machinery.compute.plugins.module_utils.pools import storage
from ansible_collections.machinery.compute.plugins.module_utils.pools.admission import Admission, admitted, check_room
from ansible_collections.machinery.compute.plugins.module_utils.core.convergence import Action, Plan, Resource, converge, step
from ansible_collections.machinery.compute.plugins.module_utils.core.errors import (
    ConflictError, LibvirtFailure, MachineryError, NameTaken, ValidationError)
from ansible_collections.machinery.compute.plugins.module_utils.core.frozen import FrozenDict
from ansible_collections.machinery.compute.plugins.module_utils.machines import machine_spec
from ansible_collections.machinery.compute.plugins.module_utils.machines.addresses import (
    lease_expiries, observe_reservations, release_address, reserve_address, reserved_nics, wait_for_address)
from ansible_collections.machinery.compute.plugins.module_utils.machines.power import bump_boots, shutdown, update_record
from ansible_collections.machinery.compute.plugins.module_utils.machines.machine_spec import ephemeral_volumes, recorded_spec
from ansible_collections.machinery.compute.plugins.module_utils.machines.machine_status import (
    PoolView, is_active, machine_status, now)
from ansible_collections.machinery.compute.plugins.module_utils.core.quantity import format_quantity

SHOWN_AT_CREATION = ("cpu", "memory", "machine_class", "labels")
CAPABILITIES_SHOWN = ("topology", "disk_qos", "ip_reservations")


# --- observe ----------------------------------------------------------------------------------------------------

class Observed:
    """One reading of a machine's domain. ``dom`` is None when there is no domain of that name."""

    def __init__(self, name, dom=None, tree=None, record=None, state=None, live_max_memory=None):
        self.name = name
        self.dom = dom
        self.tree = tree
        self.record = record
        self.state = state  # (state, reason)
        self.live_max_memory = live_max_memory  # bytes the running guest can balloon up to
        self.journal = None  # of a dead run, for a machine that does not exist
        self.security_groups = {}  # NIC name -> the groups guarding it, read from its nwfilter

    @property
    def exists(self):
        return self.dom is not None

    @property
    def managed(self):
        return self.record is not None

    @property
    def active(self):
        return self.exists and is_active(self.state[0])


def observe_machine(conn, name, journal=False, listing=None, registry=None):
    """One read of the machine; with ``journal``, a missing machine also brings the journal a dead run of that
    name left in the pool's registry (the volumes it created or was deleting). With ``listing`` (the pool's
    domains as this run read them, pool_context.read_domains) the machine is taken from it, no round trip, and a
    missing one's journal from ``registry`` (the run's)."""
    if listing is not None:
        reading = listing.get(name)
        if reading is not None:
            return Observed(name, reading.dom, reading.tree, reading.record, reading.state,
                            reading.live_max_memory)
        dom = None
    else:
        dom = lv.lookup_domain(conn, name)
    if dom is None:
        observed = Observed(name)
        observed.journal = (registry or reg.Registry.open(conn)).get(reg.pending_key(name)) if journal else None
        return observed
    tree = dx.parse(dom.XMLDesc(lv.libvirt.VIR_DOMAIN_XML_INACTIVE))
    state = tuple(dom.state())
    live_max = dom.maxMemory() * 1024 if is_active(state[0]) else None
    record = dx.read_record(tree)
    if record is not None and any(nic.get("ip_address") for nic in record.get("spec", {}).get("network_interfaces")
                                  or []):
        observe_reservations(conn, record)  # only machines with fixed addresses pay for the network's XML
    observed = Observed(name, dom, tree, record, state, live_max)
    for interface in elements.read_interfaces(tree):
        if (interface["alias"] or "").startswith("ua-nic-"):
            observed.security_groups[interface["alias"][len("ua-nic-"):]] = sgs.nic_groups(conn, interface)
    return observed


# --- plan (pure) ------------------------------------------------------------------------------------------------

def adoption_record(observed, image, moment):
    """The record of a domain the collection takes over as it is: its size and firmware, nothing else."""
    found = options.read_created(observed.tree)
    return {"version": dx.RECORD_VERSION, "created": moment, "boots": 1 if observed.active else 0,
            "last_error": None, "adopted": True,
            "spec": {"name": observed.name, "machine_class": None, "cpu": found["cpu"], "memory": found["memory"],
                     "labels": {}, "firmware": found["firmware"], "image": {"source": image}, "volumes": [],
                     "network_interfaces": [], "root_size": None, "boot_config": None, "files": {}}}


def create_steps(spec):
    name = spec["name"]
    steps = [step("cache_image", spec["image"]["source"]),
             step("create_volume", "%s-root.qcow2" % name, size=spec.get("root_size"))] if spec.get("image") else []
    for vol in spec.get("volumes") or []:
        if vol["source"] == "volume":
            steps.append(step("use_volume", vol["volume"]))
        else:
            if vol.get("encrypted"):
                steps.append(step("define_secret", vol["volume"]))
            steps.append(step("create_volume", vol["volume"], size=vol.get("size"),
                              **({"encryption": "luks"} if vol.get("encrypted") else {})))
    for nic in spec.get("network_interfaces") or []:
        if nic.get("ip_address"):
            steps.append(step("reserve_address", nic["network"], mac=nic["mac"], ip=nic["ip_address"]))
    if "ignition_data" in spec:
        steps.append(step("write_volume", "%s-ignition.json" % name))
    if "seed_files" in spec:
        steps.append(step("write_volume", "%s-cidata.iso" % name))
    return steps + [step("define", name)]


def planned_volumes(spec):
    """Every volume a create of ``spec`` makes (what its journal lists)."""
    name = spec["name"]
    names = ["%s-root.qcow2" % name] if spec.get("image") else []
    names += [vol["volume"] for vol in spec.get("volumes") or [] if vol["source"] != "volume"]
    boot_files = (("ignition.json", "ignition_data"), ("cidata.iso", "seed_files"))
    names += ["%s-%s" % (name, suffix) for suffix, key in boot_files if key in spec]
    return names + ["%s-console.log" % name]


def _image_size(image):
    """The virtual size of a local image (its qcow2 header or file size); 0 for one still to be downloaded."""
    if image.get("path"):
        return storage.virtual_size(image["path"])
    return image.get("virtual_size") or 0  # a published image knows its size; a URL is only read on download


def new_disks(spec):
    """[(field, virtual bytes)] of the disks a create of ``spec`` makes, for the storage check."""
    disks = [("root_size", max(spec.get("root_size") or 0, _image_size(spec["image"])))] if spec.get("image") else []
    for index, vol in enumerate(spec.get("volumes") or []):
        if vol["source"] == "empty":
            disks.append(("volumes[%d].size" % index, vol["size"]))
        elif vol["source"] == "image":
            disks.append(("volumes[%d].image" % index, max(vol.get("size") or 0, _image_size(vol["image"]))))
    return disks


def device_request_warnings(spec, record):
    """Volumes and NICs of an existing machine change through volume_attach and nic_attach, not here."""
    warnings = []
    for key, module in (("volumes", "volume_attach"), ("network_interfaces", "nic_attach")):
        requested = spec.get("requested_" + key)
        recorded = [item["name"] for item in record["spec"].get(key) or [] if not item.get("swap")]
        if requested is not None and [item.get("name") for item in requested] != recorded:
            warnings.append("%s of an existing machine are changed with machinery.compute.%s; the %s option was "
                            "not applied" % (key.replace("_", " "), module, key))
    return warnings


def boot_files_conflict(spec, record):
    """A new boot configuration rewrites the machine's Ignition file or seed ISO; it cannot add the device."""
    files = record["spec"].get("files") or {}
    if "ignition_data" in spec and not files.get("ignition"):
        raise ConflictError("%s was created without Ignition; the fw_cfg entry can only be added by recreating "
                            "the machine" % spec["name"], "ignition")
    if "seed_files" in spec and not files.get("seed"):
        raise ConflictError("%s was created without a cloud-init seed; the cdrom can only be added by recreating "
                            "the machine" % spec["name"], "cloud_init")


def live_effects(names, spec, observed):
    """(fields a running guest only takes at its next start, warnings) for an update of ``names``."""
    pending, warnings = [], []
    for name in names:
        live = options.OWNED_BY_NAME[name].live
        if live == "restart":
            pending.append(name)
        elif live == "balloon" and spec[name] > (observed.live_max_memory or 0):
            pending.append(name)
        elif live == "boot":
            warnings.append("the new boot configuration is read by the guest at its next first boot")
        elif live == "network":
            # the reservation changes at once; the guest asks for an address again when it starts
            pending.append(name)
    if pending:
        warnings.append("%s of the running machine %s take effect at its next restart"
                        % (" and ".join(pending), spec["name"]))
    return pending, warnings


def security_group_changes(spec, observed):
    """{nic: (groups now, groups wanted)} of the NICs whose requested security groups differ from the ones
    their nwfilter holds."""
    changes = {}
    for nic, wanted in sorted((spec.get("requested_security_groups") or {}).items()):
        if nic in observed.security_groups and observed.security_groups[nic] != wanted:
            changes[nic] = (observed.security_groups[nic], wanted)
    return changes


def security_groups_action(name, changes, active):
    steps = []
    for nic, (before, after) in changes.items():
        filter_name = sgs.nic_filter(name, nic)
        if after:
            steps.append(step("define_nwfilter", filter_name, security_groups=after))
        if bool(before) != bool(after):
            steps.append(step("update_device", dx.nic_alias(nic), live=active,
                              filterref=filter_name if after else None))
        if not after:
            steps.append(step("undefine_nwfilter", filter_name))
    return Action("update", name, {"security_groups": {nic: pair[0] for nic, pair in changes.items()}},
                  {"security_groups": {nic: pair[1] for nic, pair in changes.items()}}, steps,
                  fields=["security_groups"], handler="update_security_groups", changes=changes, grows=[])


def plan_machine(spec, observed, record=None):
    """The actions that take the machine from ``observed`` to ``spec``; ``record`` is the machine's record
    (the one about to be written when the plan adopts the domain)."""
    name = spec["name"]
    if spec["state"] == "absent":
        if not observed.exists:
            if observed.journal:
                # a run of this name died midway: what it listed goes, as the machine would have
                steps = [step("delete_volume", volume) for volume in observed.journal.get("volumes") or []]
                return Plan([Action("clean_up", name, steps=steps, journal=observed.journal)])
            return Plan()
        steps = ([step("shutdown", name)] if observed.active else []) + [step("undefine", name)]
        steps += [step("delete_volume", volume) for volume in ephemeral_volumes(observed.record or {})]
        steps += [step("release_address", nic["network"], mac=nic["mac"], ip=nic["ip_address"])
                  for nic in reserved_nics(observed.record)]
        return Plan([Action("delete", name, {"state": "present"}, {"state": "absent"}, steps)])
    if not observed.exists:
        after = options.shown({key: spec.get(key) for key in SHOWN_AT_CREATION})
        after.update({key: spec[key] for key in CAPABILITIES_SHOWN if spec.get(key)})
        if spec.get("swap"):
            after["swap"] = format_quantity(spec["swap"])
        after.update(state=spec["state"], image=(spec.get("image") or {}).get("source"))
        actions = [Action("create", name, {}, after, create_steps(spec))]
        if spec["state"] == "running":
            actions.append(Action("start", name, steps=[step("start", name)]))
        return Plan(actions, restart_required=False)
    actions = []
    record = record or observed.record
    if not observed.managed:
        actions.append(Action("adopt", name, steps=[step("write_record", name), step("define", name)],
                              record=record))
    warnings = device_request_warnings(spec, record)
    current = options.owned_values(observed.tree, record)
    names = options.changed_fields(current, spec)
    pending = []
    if names:
        if "boot_config" in names:
            boot_files_conflict(spec, record)
        if observed.active:
            pending, notes = live_effects(names, spec, observed)
            warnings.extend(notes)
        grows = [key for key in ("cpu", "memory") if key in names and spec[key] > (current[key] or 0)]
        actions.append(Action("update", name, options.shown({key: current[key] for key in names}),
                              options.shown({key: spec[key] for key in names}),
                              [step("define", name)] + ([step("set_live", name)] if observed.active else []),
                              fields=names, grows=grows))
    changes = security_group_changes(spec, observed)
    if changes:
        actions.append(security_groups_action(name, changes, observed.active))
    if spec["state"] == "running" and not observed.active:
        actions.append(Action("start", name, steps=[step("start", name)]))
    elif spec["state"] == "stopped" and observed.active:
        actions.append(Action("stop", name, steps=[step("shutdown", name)]))
    return Plan(actions, warnings, restart_required=bool(pending))


# --- apply ------------------------------------------------------------------------------------------------------

class Created:
    """What the creation of a machine learned that its spec could not say: the cached image's format, the
    root disk's and image-backed volumes' sizes (an image given by URL is only read when it is downloaded) and
    the secrets' uuids. The record is built from the spec plus this; the spec itself never changes."""

    def __init__(self):
        self.image_format = None
        self.root_size = None
        self.volume_sizes = {}
        self.secrets = {}


class Prepared:
    """A spec normalized against one observation (a batch's check-mode preflight), for the real run to reuse
    while its own observation says the same."""

    def __init__(self, spec, observed):
        self.spec = spec
        self.key = observation_key(observed)


def observation_key(observed):
    """What a spec was normalized from, of an observation: whether the machine exists, its record, its owned
    fields, and a dead run's journal."""
    return (observed.exists, json.dumps(observed.record, sort_keys=True, default=str),
            json.dumps((observed.journal or {}).get("volumes"), default=str),
            json.dumps(options.owned_values(observed.tree, observed.record) if observed.exists else None,
                       sort_keys=True, default=str))


class MachineResource(Resource):
    """One machine on one pool, for ``converge``. ``params`` are machine_spec.params' (validated once, frozen)."""

    def __init__(self, ctx, params, check_mode=False, prepared=None):
        if not isinstance(params, FrozenDict):
            raise TypeError("MachineResource takes machine_spec.params(), not raw options")
        self.ctx = ctx
        self.conn = ctx.conn
        self.params = params
        self.check_mode = check_mode
        self.name = params["name"]
        self.state = params["state"]
        self.prepared = prepared
        self.spec = None
        self.warnings = []
        self.restart_required = False
        self.observations = 0
        # the leases listed for the machine's NICs when this run booted it (lease_expiries)
        self.earlier_leases = None

    def describe(self):
        return "machine %s on pool %s" % (self.name, self.ctx.name or self.ctx.uri)

    def apply_plan(self, plan, observed):
        """Apply while holding the machine on its pool: another run changing it waits its turn, and a move of it
        (which holds it from before it stops the guest until the copy has taken over) refuses this run."""
        with reg.machine_hold(self.conn, self.name, reg.LOCK_WAIT_SECONDS, refuse=self._being_moved):
            super().apply_plan(plan, observed)

    def _being_moved(self, marker):
        """Why this run must not wait for ``marker``: it is a move of the machine (its journal names it)."""
        journal = reg.Registry.open(self.conn).get(reg.move_key(self.name))
        if not journal or journal.get("holder") != marker:
            return None
        return ("machine %s is being moved from %s to %s by another run (%s): nothing was changed; run again once "
                "the move is done" % (self.name, journal["source"]["pool"], journal["target"]["pool"],
                                      reg.holder_description(marker, reg.hold_prefix(self.name))))

    def interference(self, plan, leftover):
        """Who changed the machine after this run applied ``plan`` (see convergence.converge)."""
        found = super().interference(plan, leftover)
        if found is None:
            return None
        journal = reg.Registry.open(self.conn).get(reg.move_key(self.name))
        if journal:
            return "%s; a move of it from %s to %s is under way" % (found, journal["source"]["pool"],
                                                                    journal["target"]["pool"])
        return found

    def observe(self):
        # the first observation may come from the pool's listing of this run; the one after apply is fresh
        listing = self.ctx.listed() if not self.observations else None
        self.observations += 1
        observed = observe_machine(self.conn, self.name, journal=bool(self.ctx.registration), listing=listing,
                                   registry=self.ctx.registry if listing is not None else None)
        if not observed.exists and not observed.journal and self.ctx.registration:
            observed.journal = self._orphan_log()
        return observed

    def _orphan_log(self):
        """A journal for the console log of this name that no domain uses and no journal lists (a run that died
        left it): the log is the collection's own file, so a create replaces it and ``absent`` removes it."""
        log = "%s-console.log" % self.name
        vol = lv.lookup_volume(self.ctx.storage, log)
        if vol is None or storage.users_of(self.conn, vol.path(), None):
            return None
        if self.ctx.registry.get("move-%s" % self.name) is not None:
            return None  # a move of that name is under way or was cut off: its own resolution owns the file
        return {"machine": self.name, "volumes": [log]}

    def plan(self, observed):
        if observed.exists and not observed.managed and not self.params["adopt"]:
            raise ConflictError("a domain named %s exists on %s but was not created by machinery.compute; set "
                                "adopt: true to take it over" % (self.name, self.ctx.name or self.ctx.uri), "name")
        record = observed.record
        if observed.exists and record is None:
            record = adoption_record(observed, self.params["image"], now().isoformat())
        if self.spec is None:
            if self.prepared is not None and self.prepared.key == observation_key(observed):
                self.spec = self.prepared.spec  # the preflight normalized against what this run observes too
            else:
                if not observed.exists and self.state != "absent":
                    self.ctx.require_registration()
                current = options.owned_values(observed.tree, record) if observed.exists else None
                facts = machine_spec.resolve(self.params, self.ctx, record)
                # the volumes a dead run of this name listed in its journal are replaced by the create
                facts.taken_volumes -= set((observed.journal or {}).get("volumes") or [])
                self.spec = machine_spec.normalize(self.params, facts, record, current)
        plan = plan_machine(self.spec, observed, record)
        for action in plan.actions:
            if action.kind == "create":  # a plan that needs room is refused in check mode too
                check_room(self.ctx, self.spec, new_disks(self.spec))
            elif action.kind == "update" and action.data["grows"]:
                check_room(self.ctx, self.spec)
        return plan

    # the actions

    def _create(self, _action, _observed):
        spec = self.spec
        pool = self.ctx.storage
        # the image upload can take long: it happens before the pool's admission lock is taken
        image_vol, fmt = images.ensure_cached(self.conn, pool, spec["image"], self.ctx.url_opener, self.ctx.images) \
            if spec.get("image") else (None, None)
        with Admission(self.ctx, self.params["unique_across"] or [], spec["name"]) as admission:
            # under the lock: a domain of this name defined meanwhile belongs to another run, whose volumes
            # (of the same names) must not be touched
            if lv.lookup_domain(self.conn, spec["name"]) is not None:
                raise NameTaken("another run created a machine named %s on this pool meanwhile" % spec["name"],
                                "name")
            admission.check_unique(spec["name"])
            check_room(self.ctx, spec, new_disks(spec), locked=True, epoch=admission.epoch)
            registry = self.ctx.registry
            key = reg.pending_key(spec["name"])
            self._remove_orphans(registry.get(key))
            registry.put(key, {"machine": spec["name"], "volumes": planned_volumes(spec)}, locked=True,
                         epoch=admission.epoch)
            try:
                record = self._create_locked(spec, pool, image_vol, fmt)
                admitted(self.ctx, admission.epoch, record)
            finally:
                registry.delete(key, locked=True, epoch=admission.epoch)

    def _remove_orphans(self, journal):
        """Delete the volumes a dead run of this name listed in its journal, and the passphrase secret an
        encrypted one got (defined before its volume, so it may be there without it), unless a domain uses them."""
        if not journal:
            return
        pool = self.ctx.storage
        pool.refresh(0)
        for volume_name in journal.get("volumes") or []:
            vol = lv.lookup_volume(pool, volume_name)
            path = vol.path() if vol is not None else self.ctx.storage_file(volume_name)
            if storage.users_of(self.conn, path, None):
                continue
            if vol is not None:
                storage.delete_volume(pool, volume_name)
            storage.delete_volume_secret(self.conn, path)

    def _clean_up(self, action, _observed):
        with Admission(self.ctx, [], self.name) as admission:
            if lv.lookup_domain(self.conn, self.name) is not None:
                return  # created meanwhile by another run: its volumes are in use
            self._remove_orphans(action.data["journal"])
            self.ctx.registry.delete(reg.pending_key(self.name), locked=True, epoch=admission.epoch)

    def _create_locked(self, spec, pool, image_vol, fmt):
        name = spec["name"]
        created = []
        filters = []
        reserved = []
        learned = Created()
        try:
            disks = []
            if spec.get("image"):
                learned.image_format = fmt
                image_size = self._virtual_size(pool, image_vol, spec["image"])
                root_size = spec["root_size"] or image_size
                if root_size < image_size:
                    raise ValidationError("%s is smaller than the image (%s)"
                                          % (format_quantity(root_size), format_quantity(image_size)), "root_size")
                learned.root_size = root_size
                root = {"name": "root", "device": "vda", "boot": True}
                disks.append(self._new_volume(pool, created, "%s-root.qcow2" % name, root_size,
                                              (image_vol.path(), fmt), root))
            for vol in spec["volumes"]:
                disks.append(self._volume_disk(pool, created, vol, learned))
            files = {"console": "%s-console.log" % name}
            paths = {}
            if "ignition_data" in spec:
                files["ignition"] = "%s-ignition.json" % name
                paths["ignition_path"] = self._secret(pool, created, files["ignition"], spec["ignition_data"])
            if "seed_files" in spec:
                files["seed"] = "%s-cidata.iso" % name
                paths["seed_path"] = self._secret(pool, created, files["seed"], seed.nocloud_iso(spec["seed_files"]))
            record = {"version": dx.RECORD_VERSION, "created": now().isoformat(), "boots": 0, "last_error": None,
                      "spec": recorded_spec(spec, files, learned)}
            nics = []
            for nic in spec["network_interfaces"]:
                if nic.get("security_groups"):
                    filters.append(sgs.nic_filter(name, nic["name"]))
                    sgs.define_nic_filter(self.conn, name, nic["name"], nic["security_groups"])
                    nic = dict(nic, filter=filters[-1])
                nics.append(nic)
            inputs = dict(paths, name=name, virt_type=spec["virt_type"], record=record, disks=disks, nics=nics,
                          console_path=self.ctx.storage_file(files["console"]))
            self._define(options.build(inputs, spec), "define machine")
            for nic in reserved_nics(record):
                reserve_address(self.ctx, nic, name)
                reserved.append(nic)
            self.ctx.view().note_volumes(created)
        except BaseException:
            for filter_name in filters:
                try:
                    sgs.undefine_filter(self.conn, filter_name)
                except MachineryError:
                    pass
            for volume_name in created:  # only what this run created
                try:
                    storage.delete_volume(pool, volume_name)
                    storage.delete_volume_secret(self.conn, self.ctx.storage_file(volume_name))
                except MachineryError:
                    pass
            for nic in reserved:
                try:
                    release_address(self.ctx, nic)
                except MachineryError:
                    pass
            if reserved or any(vol.get("encrypted") for vol in spec["volumes"]):
                # the domain may have been defined before the failure: it must not outlive what it uses
                dom = lv.lookup_domain(self.conn, name)
                if dom is not None:
                    dom.undefineFlags(lv.libvirt.VIR_DOMAIN_UNDEFINE_NVRAM)
            raise
        return record

    @staticmethod
    def _new_volume(pool, created, volume_name, size, backing, disk):
        # a volume of this name with no domain is an orphan of a run that died (the caller holds the lock and
        # found no domain): it is replaced
        new = storage.create_volume(pool, volume_name, size, "qcow2", backing=backing, replace=True)
        created.append(volume_name)
        return dict(disk, path=new.path(), format="qcow2")

    def _volume_disk(self, pool, created, vol, learned):
        disk = {"name": vol["name"], "device": vol["device"], "bus": vol["bus"], "boot": vol.get("boot", False),
                "serial": vol.get("serial"), "iotune": cap.iotune_values(cap.qos_of(vol))}
        if vol.get("encrypted"):
            return self._encrypted_volume(pool, created, vol, disk, learned)
        if vol["source"] == "volume":
            existing = pool.storageVolLookupByName(vol["volume"])
            return dict(disk, path=existing.path(), format=storage.volume_format(existing),
                        shareable=vol.get("shareable", False))
        backing = None
        size = vol["size"]
        if vol["source"] == "image":
            backing_vol, backing_fmt = images.ensure_cached(self.conn, pool, vol["image"], self.ctx.url_opener,
                                                            self.ctx.images)
            size = learned.volume_sizes[vol["name"]] = max(self._virtual_size(pool, backing_vol, vol["image"]),
                                                           vol.get("size") or 0)
            backing = (backing_vol.path(), backing_fmt)
        return self._new_volume(pool, created, vol["volume"], size, backing, disk)

    def _encrypted_volume(self, pool, created, vol, disk, learned):
        """A LUKS volume (raw inside): its passphrase goes into a private secret on the pool first, and only the
        secret's uuid into the volume's and the domain's XML."""
        path = self.ctx.storage_file(vol["volume"])
        storage.delete_volume(pool, vol["volume"])
        created.append(vol["volume"])  # from here on, a failure removes the secret too
        uuid = learned.secrets[vol["name"]] = storage.define_volume_secret(self.conn, path, self.name,
                                                                           vol["passphrase"])
        new = storage.create_volume(pool, vol["volume"], vol["size"], "raw", secret=uuid)
        return dict(disk, path=new.path(), format="raw", secret=uuid)

    @staticmethod
    def _virtual_size(pool, image_vol, image):
        """The disk size a guest sees of a cached image. A volume just uploaded reports its file size until the
        pool is refreshed (libvirt reads the qcow2 header then), so a local image's own header is read first."""
        if image.get("path"):
            return storage.virtual_size(image["path"])
        if image.get("virtual_size"):
            return image["virtual_size"]
        pool.refresh(0)
        return pool.storageVolLookupByName(image_vol.name()).info()[1]

    def _secret(self, pool, created, volume_name, data):
        path = storage.write_secret_volume(self.conn, pool, volume_name, data).path()
        created.append(volume_name)
        return path

    def _adopt(self, action, observed):
        tree = dx.parse(observed.dom.XMLDesc(lv.libvirt.VIR_DOMAIN_XML_INACTIVE))
        dx.write_record(tree, action.data["record"])
        self._define(tree, "adopt")

    def _update(self, action, observed):
        spec = self.spec
        dom = observed.dom
        tree = dx.parse(dom.XMLDesc(lv.libvirt.VIR_DOMAIN_XML_INACTIVE))  # fresh: an adopt may precede
        record = dx.read_record(tree)
        record["spec"] = dict(record["spec"])
        if "boot_config" in action.fields:
            self._rewrite_boot_files(record)
        qos_before = cap.read_disk_qos(tree, record)
        options.apply_fields(tree, record, spec, action.fields)
        if "ip_reservations" in action.fields:
            observe_reservations(self.conn, record)  # what the networks hold now
            self._reserve(record, spec["ip_reservations"])
        self._define(tree, "redefine")
        if dom.isActive():
            self._set_live(dom, record, action.fields, observed)
            if "disk_qos" in action.fields:
                self._set_iotune(dom, record, cap.changed_disks(qos_before, spec["disk_qos"]))

    def _reserve(self, record, wanted):
        """Make the networks hold exactly ``wanted`` ({nic: address}) for the machine's NICs."""
        for nic in record["spec"].get("network_interfaces") or []:
            if nic.get("network") and wanted.get(nic["name"]) != nic.get("ip_address"):
                if nic.get("ip_address"):
                    release_address(self.ctx, nic)
                nic["ip_address"] = wanted.get(nic["name"])
                if nic["ip_address"]:
                    reserve_address(self.ctx, nic, self.name)

    def _set_iotune(self, dom, record, names):
        """QoS limits of a running machine's disks, live (the persistent XML was defined already)."""
        devices = {vol["name"]: vol["device"] for vol in record["spec"].get("volumes") or []}
        for name in names:
            try:
                dom.setBlockIoTune(devices[name], cap.iotune_values(self.spec["disk_qos"].get(name)),
                                   lv.libvirt.VIR_DOMAIN_AFFECT_LIVE)
            except lv.libvirt.libvirtError as exc:
                raise LibvirtFailure("cannot set the QoS of volume %s of %s live: %s"
                                     % (name, self.name, lv.describe(exc)), "volumes") from None

    def _update_security_groups(self, action, observed):
        """Groups change live: a NIC that keeps a filter gets it redefined (libvirt re-applies it to the running
        guest); one that gains or loses its filter has its interface updated, live and persistent."""
        dom = observed.dom
        for nic, (before, after) in action.data["changes"].items():
            filter_name = sgs.nic_filter(self.name, nic)
            if after:
                sgs.define_nic_filter(self.conn, self.name, nic, after)
            if bool(before) != bool(after):
                self._set_filterref(dom, nic, filter_name if after else None)
            if not after:
                sgs.undefine_filter(self.conn, filter_name)

        def record_groups(record):
            for entry in record["spec"].get("network_interfaces") or []:
                if entry["name"] in action.data["changes"]:
                    entry["security_groups"] = action.data["changes"][entry["name"]][1]
        update_record(dom, record_groups)

    def _set_filterref(self, dom, nic, filter_name):
        alias = dx.nic_alias(nic)
        views = [(lv.libvirt.VIR_DOMAIN_XML_INACTIVE, lv.libvirt.VIR_DOMAIN_AFFECT_CONFIG)]
        if dom.isActive():
            views.append((0, lv.libvirt.VIR_DOMAIN_AFFECT_LIVE))
        for xml_flags, affect in views:
            tree = dx.parse(dom.XMLDesc(xml_flags))
            node = next((node for node in tree.findall("devices/interface")
                         if node.find("alias") is not None and node.find("alias").get("name") == alias), None)
            if node is None:
                continue
            elements.set_filterref(node, filter_name)
            try:
                dom.updateDeviceFlags(elements.to_string(node), affect)
            except lv.libvirt.libvirtError as exc:
                raise LibvirtFailure("cannot update the security groups of NIC %s of %s: %s"
                                     % (nic, self.name, lv.describe(exc)),
                                     "network_interfaces") from None

    def _rewrite_boot_files(self, record):
        files = record["spec"].get("files") or {}
        pool = self.ctx.storage
        if "ignition_data" in self.spec and files.get("ignition"):
            storage.write_secret_volume(self.conn, pool, files["ignition"], self.spec["ignition_data"])
        if "seed_files" in self.spec and files.get("seed"):
            storage.write_secret_volume(self.conn, pool, files["seed"], seed.nocloud_iso(self.spec["seed_files"]))

    def _define(self, tree, what):
        try:
            return self.conn.defineXML(dx.tostring(tree))
        except lv.libvirt.libvirtError as exc:
            raise LibvirtFailure("cannot %s %s: %s" % (what, tree.findtext("name"), lv.describe(exc))) from None

    def _set_live(self, dom, record, names, observed):
        """Carry the change into the running guest where libvirt can; the rest waits for a restart."""
        live = lv.libvirt.VIR_DOMAIN_AFFECT_LIVE
        try:
            dom.setMetadata(lv.libvirt.VIR_DOMAIN_METADATA_ELEMENT, dx.record_xml(record), dx.PREFIX, dx.NAMESPACE,
                            live)
        except lv.libvirt.libvirtError:
            pass
        pending, _notes = live_effects(names, self.spec, observed)
        if "memory" in names and "memory" not in pending:
            try:
                dom.setMemoryFlags(self.spec["memory"] // 1024, live)
            except lv.libvirt.libvirtError:
                pending.append("memory")
                self.warnings.append("memory of the running machine %s takes effect at its next restart"
                                     % self.name)
        self.restart_required = self.restart_required or bool(pending)

    def _start(self, _action, _observed):
        dom = lv.lookup_domain(self.conn, self.name)
        state, reason = dom.state()
        try:
            if state == lv.libvirt.VIR_DOMAIN_PAUSED and reason != lv.libvirt.VIR_DOMAIN_PAUSED_CRASHED:
                dom.resume()
            else:
                if state != lv.libvirt.VIR_DOMAIN_SHUTOFF:
                    dom.destroy()
                self.earlier_leases = lease_expiries(self.ctx, self.spec.get("network_interfaces"))
                dom.create()
        except lv.libvirt.libvirtError as exc:
            self._record_error(dom, "start failed: %s" % lv.describe(exc))
            raise LibvirtFailure("cannot start %s: %s" % (self.name, lv.describe(exc))) from None
        self._update_record(dom, bump_boots)

    def _stop(self, _action, observed):
        timeout = self.params["shutdown_timeout"]
        if shutdown(observed.dom, timeout):
            self.warnings.append("%s did not power off within %ss of the ACPI request and was forced off"
                                 % (self.name, timeout))

    def _delete(self, _action, observed):
        dom = observed.dom
        volumes = ephemeral_volumes(observed.record or {})
        if volumes:
            # a run killed between the undefine and the last volume leaves the journal for the next run
            self.ctx.registry.put(reg.pending_key(self.name), {"machine": self.name, "volumes": volumes})
        timeout = self.params["shutdown_timeout"]
        if dom.isActive() and shutdown(dom, timeout):
            self.warnings.append("%s did not power off within %ss and was forced off" % (self.name, timeout))
        flags = (lv.libvirt.VIR_DOMAIN_UNDEFINE_MANAGED_SAVE | lv.libvirt.VIR_DOMAIN_UNDEFINE_SNAPSHOTS_METADATA |
                 lv.libvirt.VIR_DOMAIN_UNDEFINE_NVRAM | lv.libvirt.VIR_DOMAIN_UNDEFINE_CHECKPOINTS_METADATA)
        try:
            dom.undefineFlags(flags)
        except lv.libvirt.libvirtError as exc:
            if exc.get_error_code() != lv.libvirt.VIR_ERR_NO_DOMAIN:
                raise LibvirtFailure("cannot undefine %s: %s" % (self.name, lv.describe(exc))) from None
        for interface in elements.read_interfaces(observed.tree):
            if (interface["filterref"] or "").startswith(sgs.NIC_PREFIX):
                sgs.undefine_filter(self.conn, interface["filterref"])
        pool = self.ctx.storage
        for volume_name in volumes:
            if volume_name.endswith("-console.log"):
                pool.refresh(0)
            storage.delete_volume(pool, volume_name)
        for vol in (observed.record or {}).get("spec", {}).get("volumes") or []:
            if vol.get("encrypted") and vol.get("ephemeral"):
                storage.delete_volume_secret(self.conn, self.ctx.storage_file(vol["volume"]))
        for nic in reserved_nics(observed.record):
            release_address(self.ctx, nic)
        if volumes:
            self.ctx.registry.delete(reg.pending_key(self.name))

    # the record of a running machine

    def _update_record(self, dom, change):
        update_record(dom, change)

    def _record_error(self, dom, message):
        def note(record):
            record["last_error"] = message
        try:
            update_record(dom, note)
        except lv.libvirt.libvirtError:
            pass

    APPLY = {"create": _create, "clean_up": _clean_up, "adopt": _adopt, "update": _update,
             "update_security_groups": _update_security_groups, "start": _start, "stop": _stop, "delete": _delete}


# --- the service the modules call -------------------------------------------------------------------------------

class Outcome:
    """What a run did (or would do in check mode): the plan, the final status, warnings."""

    def __init__(self, plan, machine, warnings=(), restart_required=False):
        self.plan = plan
        self.machine = machine
        self.warnings = list(plan.warnings) + list(warnings)
        self.restart_required = restart_required
        self.changed = plan.changed
        self.actions = plan.summaries()
        self.before, self.after = plan.diff() if plan.changed else ({}, {})


class MachineService:
    def __init__(self, ctx, check_mode=False):
        self.ctx = ctx
        self.conn = ctx.conn
        self.check_mode = check_mode

    def status(self, name):
        dom = lv.lookup_domain(self.conn, name)
        if dom is None:
            return {"name": name, "pool": self.ctx.name, "uri": self.ctx.uri, "phase": "Terminated"}
        return machine_status(dom, self.ctx)

    def ensure(self, params, prepared=None):
        """Converge the machine of ``params`` (machine_spec.params); ``prepared`` is a preflight's Prepared."""
        resource = MachineResource(self.ctx, params, self.check_mode, prepared)
        plan, observed = converge(resource, self.check_mode)
        if not self.check_mode:
            self.ctx.clear_abandoned_lock()
        spec = resource.spec or {"name": resource.name, "state": resource.state}
        if resource.state == "absent":
            machine = {"name": resource.name, "pool": self.ctx.name, "uri": self.ctx.uri, "phase": "Terminated"}
        elif not observed.exists:  # check mode: nothing was created
            machine = {"name": resource.name, "pool": self.ctx.name, "uri": self.ctx.uri, "phase": "Pending",
                       "machine_class": spec.get("machine_class"), "cpu": spec.get("cpu"),
                       "memory": format_quantity(spec["memory"]), "labels": spec.get("labels")}
        else:
            if not self.check_mode and resource.state == "running":
                self.wait(observed.dom, spec, params, resource.earlier_leases)
            if plan.actions or params["wait"] == "address":
                machine = machine_status(observed.dom, self.ctx, PoolView(self.ctx, volumes_of=self.ctx.view()))
            else:  # as observed: the pool's leases and volumes as this run read them
                machine = machine_status(observed.dom, self.ctx, self.ctx.view(), observed.tree, state=observed.state,
                                         record=observed.record)
        restart_required = resource.restart_required or (self.check_mode and plan.facts.get("restart_required"))
        outcome = Outcome(plan, machine, resource.warnings, bool(restart_required))
        outcome.prepared = Prepared(resource.spec, observed) if resource.spec is not None else None
        return outcome

    def wait(self, dom, spec, params, earlier_leases=None):
        if params["wait"] == "address":
            wait_for_address(self.ctx, dom, spec["name"], spec.get("network_interfaces"),
                             float(params["wait_timeout"]), earlier_leases)

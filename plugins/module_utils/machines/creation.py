# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Creating a machine: its disks, boot files, secrets, reservations and domain, made under the pool's admission lock
and journaled, so a run killed midway leaves exactly what the next run removes."""

from __future__ import annotations

from ansible_collections.machinery.compute.plugins.module_utils.core import capabilities as cap
from ansible_collections.machinery.compute.plugins.module_utils.core import connection as lv
from ansible_collections.machinery.compute.plugins.module_utils.core import domain as dx
from ansible_collections.machinery.compute.plugins.module_utils.core import firmware as fw
from ansible_collections.machinery.compute.plugins.module_utils.machines import clone
from ansible_collections.machinery.compute.plugins.module_utils.machines import images
from ansible_collections.machinery.compute.plugins.module_utils.core import options
from ansible_collections.machinery.compute.plugins.module_utils.coordination import journals as journal
from ansible_collections.machinery.compute.plugins.module_utils.coordination import keys
from ansible_collections.machinery.compute.plugins.module_utils.pools import security_groups as sgs
from ansible_collections.machinery.compute.plugins.module_utils.machines import seed
from ansible_collections.machinery.compute.plugins.module_utils.core import storage
from ansible_collections.machinery.compute.plugins.module_utils.coordination.admission import Admission
from ansible_collections.machinery.compute.plugins.module_utils.pools.capacity import admitted, check_room
from ansible_collections.machinery.compute.plugins.module_utils.core.convergence import step
from ansible_collections.machinery.compute.plugins.module_utils.core.errors import (
    MachineryError, NameTaken, ValidationError)
from ansible_collections.machinery.compute.plugins.module_utils.machines.addresses import (
    release_address, reserve_address, reserved_nics)
from ansible_collections.machinery.compute.plugins.module_utils.machines.machine_spec import recorded_spec
from ansible_collections.machinery.compute.plugins.module_utils.machines.machine_status import now
from ansible_collections.machinery.compute.plugins.module_utils.core.quantity import format_quantity
from ansible_collections.machinery.compute.plugins.module_utils.coordination import writer


def create_steps(spec):
    name = spec["name"]
    steps = [step("cache_image", spec["image"]["source"]),
             step("create_volume", "%s-root.qcow2" % name, size=spec.get("root_size"))] if spec.get("image") else []
    for vol in spec.get("volumes") or []:
        if vol["source"] == "volume":
            steps.append(step("use_volume", vol["volume"]))
        else:
            if vol["source"] == "image":
                steps.append(step("cache_image", vol["image"]["source"]))
            if vol.get("encrypted"):
                steps.append(step("define_secret", vol["volume"]))
            # of an image: an overlay over the cached image, or encrypted a full LUKS copy of it
            steps.append(step("create_volume", vol["volume"], size=vol.get("size"),
                              **({"encryption": "luks"} if vol.get("encrypted") else {}),
                              **({"image": vol["image"]["source"]} if vol["source"] == "image" else {})))
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


class Created:
    """What the creation of a machine learned that its spec could not say: the cached image's format, the
    root disk's and image-backed volumes' sizes (an image given by URL is only read when it is downloaded) and
    the secrets' uuids. The record is built from the spec plus this; the spec itself never changes."""

    def __init__(self):
        self.image_format = None
        self.root_size = None
        self.volume_sizes = {}
        self.secrets = {}
        self.image_checksum = None  # the base a linked clone is made on (clone.py)


class Creation:
    """How MachineResource creates a machine (and cleans up after a dead run of its name). It uses the resource's ctx, conn, params, spec and _define."""

    def _create(self, _action, _observed):
        if self.admission is not None:
            # admitted already, the machine held through the wave (MachineResource.apply_plan): what follows the
            # create (its start) lets the process's next create onto the pool in
            self._create_admitted(self.admission, self.cached)
            self.admission.step_aside()
            return
        cached = self.cache_image()
        with Admission(self.ctx, self.params["unique_across"] or [], self.spec["name"]) as admission:
            self._create_admitted(admission, cached)

    def cache_image(self):
        """(volume, format) of the machine's image in the pool's cache, uploaded when it is not there yet: an upload
        can take long, so it happens before the pool's admission lock is taken."""
        spec = self.spec
        if not spec.get("image"):
            return None, None
        source = spec["image"].get("clone")
        if source is not None:  # a clone: its base is captured now (linked), or its root copied later (full)
            if source["mode"] != "linked":
                return None, "qcow2"
            vol, self.clone_base = clone.linked_base(self.ctx, source, spec["name"])
            return vol, "qcow2"
        return images.ensure_cached(self.conn, self.ctx.storage, spec["image"], self.ctx.url_opener, self.ctx.images,
                                    self.ctx.coordination)

    def _create_admitted(self, admission, cached):
        spec = self.spec
        # under the lock: a domain of this name defined meanwhile belongs to another run, whose volumes (of the
        # same names) must not be touched
        if admission.may_exist(spec["name"]) and lv.lookup_domain(self.conn, spec["name"]) is not None:
            raise NameTaken("another run created a machine named %s on this pool meanwhile" % spec["name"], "name")
        admission.check_unique(spec["name"])
        check_room(self.ctx, spec, new_disks(spec), locked=True, epoch=admission.epoch,
                   elsewhere=admission.group_members(spec.get("server_group")))
        # a journal of this name alone: a deletion killed midway (or a create of an earlier version)
        registry = self.ctx.registry
        key = keys.pending_key(spec["name"])
        if key in registry.keys(key, admission.epoch):
            left = registry.get(key)
            journal.remove_orphans(self.ctx, left)
            registry.remove(key, locked=True, epoch=admission.epoch, expected=True)
        # what this create makes is listed before it is made, in the wave of the pool's lock (coordination/journals.py)
        admission.journal(spec["name"], planned_volumes(spec))
        record = self._create_locked(spec, self.ctx.storage, *cached)
        admitted(self.ctx, admission.epoch, record)

    def _clean_up(self, action, _observed):
        with Admission(self.ctx, [], self.name) as admission:
            if lv.lookup_domain(self.conn, self.name) is not None:
                return  # created meanwhile by another run: its volumes are in use
            journal.remove_orphans(self.ctx, action.data["journal"])
            if action.data["journal"].get("wave"):
                admission.clean_dead_waves()  # the whole wave: under the lock, it is a dead run's
            else:
                self.ctx.registry.remove(keys.pending_key(self.name), locked=True, epoch=admission.epoch,
                                         expected=True)

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
                source = spec["image"].get("clone")
                if source is not None and source["mode"] == "full":
                    created.append("%s-root.qcow2" % name)
                    clone.full_root(self.ctx, source, "%s-root.qcow2" % name, root_size)
                    disks.append(dict(root, path=self.ctx.storage_file("%s-root.qcow2" % name), format="qcow2"))
                else:
                    learned.image_checksum = getattr(self, "clone_base", None)
                    # the cached image is in the same storage pool: its path is the pool's path and its name
                    disks.append(self._new_volume(pool, created, "%s-root.qcow2" % name, root_size,
                                                  (images.backing_path(self.ctx, image_vol, spec["image"]), fmt), root))
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
            tree = options.build_tree(inputs, spec)
            fw.place_nvram(tree, self.ctx.storage_file(fw.nvram_volume(name)))
            self.defined = self._define(tree, "define machine")
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
                    writer.write(dom, "undefineFlags", lv.libvirt.VIR_DOMAIN_UNDEFINE_NVRAM)
            raise
        return record

    def _new_volume(self, pool, created, volume_name, size, backing, disk):
        # a volume of this name with no domain is an orphan of a run that died (the caller holds the lock and
        # found no domain): it is replaced
        storage.create_volume(pool, volume_name, size, "qcow2", backing=backing, replace=True)
        created.append(volume_name)
        # a volume of a directory pool is at the pool's path and its name, as libvirt itself makes it: no round trip
        return dict(disk, path=self.ctx.storage_file(volume_name), format="qcow2")

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
                                                            self.ctx.images, self.ctx.coordination)
            size = learned.volume_sizes[vol["name"]] = max(self._virtual_size(pool, backing_vol, vol["image"]),
                                                           vol.get("size") or 0)
            backing = (images.backing_path(self.ctx, backing_vol, vol["image"]), backing_fmt)
        return self._new_volume(pool, created, vol["volume"], size, backing, disk)

    def _encrypted_volume(self, pool, created, vol, disk, learned):
        """A LUKS volume (raw inside): its passphrase goes into a private secret on the pool first, and only the
        secret's uuid into the volume's and the domain's XML."""
        path = self.ctx.storage_file(vol["volume"])
        storage.delete_volume(pool, vol["volume"])
        created.append(vol["volume"])  # from here on, a failure removes the secret too
        uuid = learned.secrets[vol["name"]] = storage.define_volume_secret(self.conn, path, self.name,
                                                                           vol["passphrase"])
        if vol["source"] == "image":
            # a full encrypted copy of the image (an overlay would leave the image's blocks, and every block the
            # guest does not rewrite, in the clear in the shared cache): the image's size, or the size asked if larger
            image_vol, _fmt = images.ensure_cached(self.conn, pool, vol["image"], self.ctx.url_opener, self.ctx.images,
                                                   self.ctx.coordination)
            size = learned.volume_sizes[vol["name"]] = max(self._virtual_size(pool, image_vol, vol["image"]),
                                                           vol.get("size") or 0)
            new = storage.copy_volume(pool, vol["volume"], size, "raw", image_vol, secret=uuid)
        else:
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
        storage.refresh(pool)
        return pool.storageVolLookupByName(image_vol.name()).info()[1]

    def _secret(self, pool, created, volume_name, data):
        path = storage.write_secret_volume(self.conn, pool, volume_name, data).path()
        created.append(volume_name)
        return path

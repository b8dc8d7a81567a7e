# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A machine's desired state, on one path from what the user wrote to what the plan converges.

1. ``params(raw, field)``: the one entry point. The option table of options.py (types, choices, defaults,
   unknown keys) and every check that needs nothing but the value, applied once; the result is frozen. The
   ``machine`` module, ``machine_batch``, the ``machines`` role, ``machine_set`` templates and the manifest
   dialects all pass through it.
2. ``resolve(params, ctx, record)``: what the pool and the controller's files say that the spec depends on
   (the class, the image, existing volumes, networks, bridges, security groups), read and never written.
3. ``normalize(params, facts, record, current)``: pure. The spec the plan converges to, every error naming its
   field; for an existing machine, options left out keep their current values. The result is frozen: applying
   it never changes it, and what creation learns comes back beside it (creation.Created).
"""

from __future__ import annotations

import os

from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible.module_utils.errors import UnsupportedError

from ansible_collections.machinery.compute.plugins.module_utils.core import capabilities as cap
from ansible_collections.machinery.compute.plugins.module_utils.core import connection as lv
from ansible_collections.machinery.compute.plugins.module_utils.core import domain as dx
from ansible_collections.machinery.compute.plugins.module_utils.core import elements
from ansible_collections.machinery.compute.plugins.module_utils.core import firmware as fw
from ansible_collections.machinery.compute.plugins.module_utils.core import options
from ansible_collections.machinery.compute.plugins.module_utils.core import validation as check
from ansible_collections.machinery.compute.plugins.module_utils.core.errors import (
    ConflictError, NotFoundError, ValidationError)
from ansible_collections.machinery.compute.plugins.module_utils.core.frozen import freeze, thaw
from ansible_collections.machinery.compute.plugins.module_utils.core.quantity import format_quantity
from ansible_collections.machinery.compute.plugins.module_utils.machines import clone
from ansible_collections.machinery.compute.plugins.module_utils.machines import named_images
from ansible_collections.machinery.compute.plugins.module_utils.machines import seed
from ansible_collections.machinery.compute.plugins.module_utils.pools import scheduler
from ansible_collections.machinery.compute.plugins.module_utils.pools.classes import published_class, published_classes
from ansible_collections.machinery.compute.plugins.module_utils.pools import security_groups as sgs
from ansible_collections.machinery.compute.plugins.module_utils.core import storage

MACHINE_ARGUMENTS = options.argument_spec(options.MACHINE)
SCHEDULED_ARGUMENTS = options.argument_spec(options.MACHINE + options.SCHEDULING)
SCHEDULING_KEYS = tuple(item.name for item in options.SCHEDULING)
CHECKED = tuple(item for item in options.MACHINE if item.argument and item.check is not None)
# what a scheduled machine takes (a batch's machines, a set's template): the machine's options but those the
# caller sets itself, allow_move (only the machine module moves a machine it resizes) and rebuild (a batch or a
# set rebuilding its machines at once would take them all down together: only the machine module rebuilds)
SCHEDULED_KEYS = tuple(key for key in SCHEDULED_ARGUMENTS if key not in ("unique_across", "allow_move", "rebuild"))


def _at(field, key):
    return "%s.%s" % (field, key) if field else key


# --- 1. params: the option table, once ------------------------------------------------------------------------

def params(raw, field=None, scheduling=False, defaults=None, defaults_field="defaults"):
    """The options of one machine, validated against the option table and checked value by value, with the
    table's defaults; frozen. ``field`` names the machine in errors (``machines[3]``); ``scheduling`` admits
    machine_pool_selector and machine_pool; ``defaults`` are options every machine takes unless it sets them
    (machine_batch's ``defaults``), reported under ``defaults_field`` when they are bad themselves."""
    arguments = SCHEDULED_ARGUMENTS if scheduling else MACHINE_ARGUMENTS
    if not isinstance(raw, dict):
        raise ValidationError("must be a mapping of machine options", field or "machine")
    if defaults:
        unknown = sorted(set(defaults) - set(arguments) - {"name"})
        if unknown or "name" in defaults:
            raise ValidationError("unknown option %s" % ", ".join(unknown) if unknown else "a name is not a default",
                                  defaults_field)
        raw = dict(defaults, **raw)
    if scheduling:
        unknown = sorted(str(key) for key in raw if key not in SCHEDULED_KEYS)
        if unknown:
            raise ValidationError("unknown option%s %s" % ("s" if len(unknown) > 1 else "", ", ".join(unknown)),
                                  field or "machine")
    _check_shapes(raw, field)
    result = ArgumentSpecValidator(arguments).validate(raw)
    if result.error_messages:
        # an unknown key (a misspelt tolerations, say) comes as the bare key: say what it is
        raise ValidationError("; ".join("unknown option %s" % error.msg if isinstance(error, UnsupportedError)
                                        else error.msg for error in result.errors), field or "machine")
    given = result.validated_parameters
    checked = dict(given)
    checked["name"] = check.dns_label(given["name"], _at(field, "name"))
    for key, allow_zero in (("wait_timeout", False), ("shutdown_timeout", True)):
        check.timeout_seconds(given[key], _at(field, key), allow_zero)
    if given["labels"] is not None:
        checked["labels"] = check.labels(given["labels"], _at(field, "labels"))
    if given["tolerations"] is not None:  # [] is kept apart from None: it clears the recorded tolerations
        checked["tolerations"] = scheduler.normalize_tolerations(given["tolerations"],
                                                                 _at(field, "tolerations")) or []
    if given["machine_class"]:
        check.class_name(given["machine_class"], _at(field, "machine_class"))
    if given["cpu"] is not None:
        checked["cpu"] = check.cpu_amount(given["cpu"], _at(field, "cpu"))
    if given["memory"] is not None:
        checked["memory"] = check.memory_bytes(given["memory"], _at(field, "memory"))
    if given["root_size"]:
        checked["root_size"] = check.disk_bytes(given["root_size"], _at(field, "root_size"))
    for item in CHECKED:  # the options whose declaration carries their check
        if given[item.name] is not None:
            checked[item.name] = item.check(given[item.name], _at(field, item.name))
    if given["cloud_init"] is not None and not isinstance(given["cloud_init"], dict):
        raise ValidationError("must be a mapping with user_data, meta_data, network_config", _at(field, "cloud_init"))
    checked["ssh_authorized_keys"] = [str(key) for key in given["ssh_authorized_keys"] or []]
    if given["volumes"] is not None:
        checked["volumes"] = _volume_params(given["volumes"], _at(field, "volumes"))
    if given["network_interfaces"] is not None:
        checked["network_interfaces"] = _nic_params(given["network_interfaces"], _at(field, "network_interfaces"))
    if scheduling:
        checked["machine_pool_selector"] = check.labels(given["machine_pool_selector"] or {},
                                                        _at(field, "machine_pool_selector"))
        if given["machine_pool"] is not None:
            check.dns_label(given["machine_pool"], _at(field, "machine_pool"))
    return freeze(checked)


def _check_shapes(raw, field):
    """Mappings and lists where the table declares them, refused naming the field (Ansible's own message for a
    string where a mapping belongs names neither the machine nor the element)."""
    for item in options.MACHINE + options.SCHEDULING:
        value = raw.get(item.name)
        if value is None:
            continue
        where = _at(field, item.name)
        if item.type == "dict" and not isinstance(value, dict):
            raise ValidationError("must be a mapping, got %s" % type(value).__name__, where)
        if item.type == "list" and item.elements == "dict":
            if not isinstance(value, list):
                raise ValidationError("must be a list, got %s" % type(value).__name__, where)
            for index, element in enumerate(value):
                if not isinstance(element, dict):
                    raise ValidationError("must be a mapping, got %s" % type(element).__name__,
                                          "%s[%d]" % (where, index))


def machine_params(raw, field=None):
    """``params`` of the options of the machine module among ``raw`` (a module's parameters carry the common
    options too)."""
    return params({key: _given(value) for key, value in raw.items() if key in MACHINE_ARGUMENTS and value is not None},
                  field)


def _given(value):
    """A value without the None Ansible fills in for the sub-options left out."""
    if isinstance(value, dict):
        return {key: _given(item) for key, item in value.items() if item is not None}
    if isinstance(value, list):
        return [_given(item) for item in value]
    return value


def _named_items(items, field, what, reserved=None):
    """(where, item, entry) of a list option whose items are named uniquely (volumes, NICs): the entry is a copy
    of the item with its name checked; ``reserved`` names are refused with their reason."""
    seen = set()
    for index, item in enumerate(items):
        where = "%s[%d]" % (field, index)
        entry = dict(item)
        name = entry["name"] = check.dns_label(item.get("name"), where + ".name")
        if name in seen:
            raise ValidationError("%s name %r is used twice" % (what, name), where + ".name")
        if name in (reserved or {}):
            raise ValidationError(reserved[name], where + ".name")
        seen.add(name)
        yield where, item, entry


def _volume_params(items, field):
    result = []
    reserved = {"root": "volume name root is the image disk's",
                cap.SWAP_VOLUME: "volume name swap is the swap disk's; give the machine swap: <size> instead"}
    for where, item, entry in _named_items(items, field, "volume", reserved):
        given = [key for key in ("size", "volume", "image") if item.get(key) is not None]
        # a size with an image is the disk's least size (IronCore's volumeTemplate: 10Gi filled from an OS image)
        if len(given) != 1 and given != ["size", "image"]:
            raise ValidationError("give exactly one of size, volume or image (or an image with its size)", where)
        if item.get("volume") is not None:
            entry["volume"] = str(item["volume"])
            storage.check_attachable(entry["volume"], where + ".volume")
        if item.get("size") is not None:
            entry["size"] = check.disk_bytes(item["size"], where + ".size")
        for key in ("iops", "throughput"):
            if item.get(key) is not None:
                entry[key] = options.option(options.VOLUME, key).check(item[key], "%s.%s" % (where, key))
        if item.get("encrypted"):
            if item.get("volume") is not None:
                raise ValidationError("only a new volume (empty of size, or a full copy of an image) can be "
                                      "encrypted, not an existing one", where + ".encrypted")
            entry["passphrase"] = options.option(options.VOLUME, "passphrase").check(item.get("passphrase"),
                                                                                     where + ".passphrase")
        elif item.get("passphrase") not in (None, ""):
            raise ValidationError("is only used with encrypted: true", where + ".passphrase")
        if item.get("device"):
            check.device_name(item["device"], item["bus"], where + ".device")
        result.append(entry)
    explicit = [entry["device"] for entry in result if entry.get("device")]
    for index, entry in enumerate(result):
        if entry.get("device") and explicit.count(entry["device"]) > 1:
            raise ValidationError("device %s is already taken" % entry["device"], "%s[%d].device" % (field, index))
    return result


def _nic_params(items, field):
    result = []
    for where, item, entry in _named_items(items, field, "interface"):
        if bool(item.get("network")) == bool(item.get("bridge")):
            raise ValidationError("give exactly one of network or bridge", where)
        if item.get("bridge"):
            check.interface_name(item["bridge"], where + ".bridge")
        if item.get("mac"):
            entry["mac"] = check.mac_address(item["mac"], where + ".mac")
        if item.get("security_groups") is not None:
            groups = []
            for position, group in enumerate(item["security_groups"]):
                check.dns_label(group, "%s.security_groups[%d]" % (where, position))
                if group not in groups:
                    groups.append(group)
            entry["security_groups"] = sorted(groups)
        if cap.is_address_range(item.get("ip_address")):
            entry["ip_address"] = str(cap.address_range(item["ip_address"], where + ".ip_address"))
        elif item.get("ip_address") not in (None, ""):
            entry["ip_address"] = str(cap.address(item["ip_address"], where + ".ip_address"))
        else:
            entry["ip_address"] = None
        result.append(entry)
    return result


def local_image_sizes(specs):
    """{image source: virtual bytes} of the local image files the machine params name (root and volume images),
    for the scheduler's storage count; a URL, a published name or a file that cannot be read is left out (the
    machine's own resolve reports what is wrong with it)."""
    sizes = {}
    for prm in specs:
        sources = [prm.get("image")] + [vol.get("image") for vol in prm.get("volumes") or ()]
        for source in sources:
            if not isinstance(source, str) or source in sizes or "://" in source or \
                    named_images.is_reference(source) or not os.path.isfile(source):
                continue
            try:
                sizes[source] = storage.virtual_size(source)
            except OSError:
                continue
    return sizes


def scheduling_request(prm):
    """What the scheduler reads of a machine's params (see scheduler.machine_request)."""
    return scheduler.machine_request(prm)


# --- 2. resolve: what the pool and the files say ----------------------------------------------------------------

class Facts:
    """What ``normalize`` needs to know that the parameters do not say: read once by ``resolve`` (or built by
    hand in a unit test)."""

    def __init__(self, pool="pool", storage_pool="machinery", virt_type="qemu", classes=None, networks=None,
                 default_network=None, bridges=None, security_groups=None, volumes=None, images=None,
                 taken_volumes=(), published_classes=()):
        self.pool = pool  # its name, for messages
        self.storage_pool = storage_pool
        self.virt_type = virt_type  # kvm or qemu, as the pool measured it
        self.classes = classes or {}  # name -> {cpu, memory} of the classes the params name that are published
        self.published_classes = list(published_classes)  # every class name of the pool, read for a refusal
        self.networks = networks or {}  # name -> None (missing) or {info (elements.read_network), leases}
        self.default_network = default_network
        self.bridges = bridges or {}  # name -> (kind, answered) as host_interface reads it
        self.security_groups = security_groups or {}  # name -> whether the pool has it
        self.volumes = volumes or {}  # existing volume name -> None (missing) or {size, format, users}
        self.images = images or {}  # field -> {image (images.resolve), format, size}
        self.taken_volumes = set(taken_volumes)  # names the machine's new volumes would have that exist already
        self.secure_boot = False  # whether the pool's firmware can do Secure Boot (read when a machine asks)


def new_volume_name(machine, item):
    """The volume a new disk of a machine gets (an encrypted one is LUKS with raw data inside, not qcow2)."""
    return "%s-%s.%s" % (machine, item["name"], "luks" if item.get("encrypted") else "qcow2")


def registry_of(prm):
    """How an oci:// image's registry is reached: {ca_file, credentials} of the machine's options."""
    return {"ca_file": prm.get("image_ca_file"), "credentials": prm.get("image_pull_secret")}


def _image_facts(source, checksum, ctx, field, registry=None):
    image = named_images.resolve(source, checksum, ctx, field, registry)
    return {"image": image, "format": image_format(image, field),
            "size": storage.virtual_size(image["path"]) if image.get("path") else None}


def resolve(prm, ctx, record=None):
    """The Facts for ``normalize``: reads the pool and the controller's files, writes nothing."""
    facts = Facts(pool=ctx.name or ctx.uri, virt_type=ctx.virt_type())
    if prm["state"] == "absent":
        return facts
    if prm["machine_class"]:
        facts.classes[prm["machine_class"]] = published_class(ctx.registry, prm["machine_class"])
        if facts.classes[prm["machine_class"]] is None:  # for the refusal: what the pool does publish
            facts.published_classes = sorted(published_classes(ctx.registry))
    nics = prm["network_interfaces"]
    if nics is None and record is None:
        facts.default_network = ((ctx.registration or {}).get("networks") or [None])[0]
        nics = [{"name": "eth0", "network": facts.default_network}] if facts.default_network else []
    for nic in nics or []:
        network = nic.get("network")
        if network and network not in facts.networks:
            net = ctx.network(network)
            facts.networks[network] = None if net is None else {"info": None, "leases": []}
        if network and nic.get("ip_address") and facts.networks[network] and facts.networks[network]["info"] is None:
            facts.networks[network] = network_facts(ctx.network(network))
        if nic.get("bridge") and nic["bridge"] not in facts.bridges:
            facts.bridges[nic["bridge"]] = host_interface(ctx.conn, nic["bridge"])
        for group in nic.get("security_groups") or []:
            if group not in facts.security_groups:
                facts.security_groups[group] = sgs.read_group(ctx.conn, group, "security_groups") is not None
    if record is not None:
        if rebuild_requested(prm, record.get("spec", {})):  # the image of its new root disk
            facts.images["image"] = _image_facts(prm["image"] or record["spec"]["image"]["source"],
                                                 prm["image_checksum"], ctx, "image", registry_of(prm))
        # an existing machine keeps its image, disks and NICs; the volumes it was given must still be there
        kept = [item["volume"] for item in prm["volumes"] or [] if item.get("volume") is not None]
        if kept:
            facts.storage_pool = ctx.storage.name()
            facts.volumes = {name: {} if lv.lookup_volume(ctx.storage, name) is not None else None for name in kept}
        return facts
    facts.storage_pool = ctx.storage.name()
    if prm.get("secure_boot"):
        facts.secure_boot = fw.secure_boot_firmware(ctx.conn.getDomainCapabilities(
            None, "x86_64", "q35", facts.virt_type, 0))
    if prm["image"] and prm.get("clone_from"):
        raise ValidationError("a clone's root disk is copied from its source machine; give image or clone_from",
                              "clone_from")
    if prm["image"]:
        facts.images["image"] = _image_facts(prm["image"], prm["image_checksum"], ctx, "image", registry_of(prm))
    elif prm.get("clone_from"):
        facts.images["image"] = clone.image_facts(ctx, thaw(prm["clone_from"]), prm["name"])
    names = []
    for index, item in enumerate(prm["volumes"] or []):
        if item.get("volume") is not None:
            vol = lv.lookup_volume(ctx.storage, item["volume"])
            facts.volumes[item["volume"]] = None if vol is None else {
                "size": vol.info()[1], "format": storage.volume_format(vol),
                "users": storage.users_of(ctx.conn, vol.path(), prm["name"])}
            continue
        names.append(new_volume_name(prm["name"], item))
        if item.get("image") is not None:
            where = "volumes[%d].image" % index
            facts.images[where] = _image_facts(item["image"], item.get("image_checksum"), ctx, where,
                                               registry_of(prm))
    if prm["swap"]:
        names.append(cap.swap_volume(prm["name"], prm["swap"])["volume"])
    facts.taken_volumes = {name for name in names if lv.lookup_volume(ctx.storage, name) is not None}
    return facts


def network_facts(net):
    """{info, leases} of a libvirt network for fixed addresses: its ranges and host entries, its leases."""
    info = elements.read_network(elements.parse(net.XMLDesc(lv.libvirt.VIR_NETWORK_XML_INACTIVE)))
    leases = []
    if net.isActive():
        try:
            leases = [(lease.get("mac"), lease.get("ipaddr"), lease.get("expirytime")) for lease in net.DHCPLeases()]
        except lv.libvirt.libvirtError:
            leases = []
    return {"info": info, "leases": leases}


def host_interface(conn, name):
    """What the host's libvirt says of interface ``name``: (its type such as 'bridge', 'unknown' when only its
    node device was found, or None when it is not listed; whether libvirt could answer at all).

    The host's interfaces are read through libvirt alone (so over any URI). Its interface driver lists every
    interface of the host with the udev backend (libvirt 9 as Debian builds it) but only configured ones with
    the older netcf backend, so a name it does not list is also looked for among the node devices of class net."""
    answered = False
    try:
        for iface in conn.listAllInterfaces(0):
            answered = True
            if iface.name() == name:
                return elements.parse(iface.XMLDesc(0)).get("type"), True
    except lv.libvirt.libvirtError:
        pass  # no interface driver on this host (or not allowed): the node devices may still tell
    try:
        devices = conn.listAllDevices(lv.libvirt.VIR_CONNECT_LIST_NODE_DEVICES_CAP_NET)
        answered = answered or bool(devices)
        for device in devices:
            # node devices of network interfaces are named net_<interface>_<mac>: only candidates are read
            if device.name().startswith("net_%s_" % name) and \
                    elements.parse(device.XMLDesc(0)).findtext("capability/interface") == name:
                return "unknown", True
    except lv.libvirt.libvirtError:
        pass
    return None, answered


def check_bridge(pool, name, found, field):
    """Refuse a host bridge the pool does not have, or an interface that is no bridge, before anything is
    created: libvirt defines a domain with any bridge name and only fails when it starts ('Cannot get interface
    MTU'), after the machine's disks were made. When the host's libvirt can answer neither (``found`` is
    host_interface's), the check is left to libvirt."""
    kind, answered = found
    if kind is None and answered:
        raise NotFoundError("pool %s has no host interface %r; create the bridge on the host first, or use a "
                            "libvirt network" % (pool, name), field)
    if kind not in (None, "unknown", "bridge"):
        raise ValidationError("%s is an interface of type %s on pool %s, not a bridge" % (name, kind, pool), field)
    return name


def host_bridge(ctx, name, field):
    """``check_bridge`` of interface ``name`` on the pool of ``ctx`` (nic_attach, a move's target)."""
    return check_bridge(ctx.name or ctx.uri, check.interface_name(name, field), host_interface(ctx.conn, name), field)


def image_format(image, field):
    """The format of a local image ('qcow2' or 'raw'), checked as a bootable disk before anything is uploaded
    (validation.disk_image has the rule). An image given by URL is only downloaded when the machine is created."""
    path = image.get("path")
    if not path:
        return None
    try:
        key = storage.file_key(path)
        if key in _IMAGE_FORMATS:
            return _IMAGE_FORMATS[key]
        with open(path, "rb") as handle:
            header = handle.read(check.IMAGE_HEADER_BYTES)
            size = os.fstat(handle.fileno()).st_size
    except OSError as exc:
        raise NotFoundError("cannot read image %s: %s" % (path, exc.strerror), field) from None
    _IMAGE_FORMATS[key] = check.disk_image(header, size, field)  # a refused image raises: not remembered
    return _IMAGE_FORMATS[key]


_IMAGE_FORMATS = {}  # storage.file_key -> format of a local image that passed the check, for this process


# --- 3. normalize: pure ----------------------------------------------------------------------------------------

def _size(prm, facts, recorded):
    """(machine_class, cpu, memory): a class published on the pool, explicit cpu/memory, or both (explicit
    values override the class). For an existing machine, what the user leaves out keeps its recorded value."""
    name, cpu, memory = prm["machine_class"], prm["cpu"], prm["memory"]
    if name:
        published = facts.classes.get(name)
        if published is None:
            offered = ", ".join(facts.published_classes) if facts.published_classes else "none"
            raise NotFoundError("class %r is not published on pool %s; it publishes: %s"
                                % (name, facts.pool, offered), "machine_class")
        return name, published["cpu"] if cpu is None else cpu, published["memory"] if memory is None else memory
    if recorded:
        return (recorded.get("machine_class"), recorded.get("cpu") if cpu is None else cpu,
                recorded.get("memory") if memory is None else memory)
    if cpu is None or memory is None:
        # no record: no machine of that name on this pool (one that just moved away, a task aimed at the wrong pool)
        error = ValidationError("there is no machine %s on pool %s; to create it there, give machine_class, or both "
                                "cpu and memory" % (prm["name"], facts.pool), "machine_class")
        error.absent_machine = prm["name"]
        raise error
    return None, cpu, memory


def _boot_config(prm, spec, recorded, existing):
    ssh_keys, ignition, cloud_init = list(prm["ssh_authorized_keys"]), thaw(prm["ignition"]), thaw(prm["cloud_init"])
    hostname = prm["hostname"]
    if ignition is not None:
        spec["ignition_data"] = seed.ignition_document(ignition, None if cloud_init else ssh_keys, hostname=hostname)
    if cloud_init is not None or ((ssh_keys or hostname) and ignition is None):
        spec["seed_files"] = seed.nocloud_files(prm["name"], cloud_init, ssh_keys, hostname)
    if ignition is None and cloud_init is None and not ssh_keys and not hostname and existing:
        spec["boot_config"] = recorded.get("boot_config")
    else:
        spec["boot_config"] = dx.boot_config_hash(
            spec["ignition_data"].decode() if "ignition_data" in spec else None,
            {key: value.decode() for key, value in spec.get("seed_files", {}).items()} or None, None)


def _volumes(prm, facts, taken_devices):
    """Normalized volume entries; device names assigned stably after the root disk (vda)."""
    name = prm["name"]
    result = []
    for index, item in enumerate(prm["volumes"] or []):
        where = "volumes[%d]" % index
        entry = {"name": item["name"], "bus": item["bus"], "device": item.get("device")}
        if item.get("volume") is not None:
            existing = facts.volumes.get(item["volume"])
            if existing is None:
                raise NotFoundError("no volume %r in storage pool %s" % (item["volume"], facts.storage_pool),
                                    where + ".volume")
            shareable = bool(item.get("shareable"))
            if shareable and existing["format"] != "raw":
                raise ValidationError("a shareable volume must be raw (qcow2 cannot be written by two guests)",
                                      where + ".shareable")
            if existing["users"] and not shareable:
                raise ConflictError("volume %s is attached to %s; set shareable: true (raw volumes only) to attach "
                                    "it to more than one machine" % (item["volume"], ", ".join(existing["users"])),
                                    where + ".volume")
            # an existing volume is not the machine's unless it says so
            entry.update(source="volume", volume=item["volume"], size=existing["size"],
                         ephemeral=bool(item.get("ephemeral")), shareable=shareable)
        else:
            entry.update(volume=new_volume_name(name, item), ephemeral=item.get("ephemeral") is not False)
            if entry["volume"] in facts.taken_volumes:
                raise ConflictError("volume %s already exists in storage pool %s (left by an earlier machine?); "
                                    "delete it, or attach it with volume: %s"
                                    % (entry["volume"], facts.storage_pool, entry["volume"]), where + ".name")
            if item.get("image") is not None:
                image = facts.images[where + ".image"]
                size = max(item.get("size") or 0, image["size"] or 0) or None
                entry.update(source="image", image=image["image"], size=size)
            else:
                entry.update(source="empty", size=item["size"])
        for key in ("iops", "throughput"):
            if item.get(key) is not None:
                entry[key] = item[key]
        if item.get("encrypted"):
            entry.update(encrypted=True, passphrase=item["passphrase"])
        result.append(entry)
    for index, entry in enumerate(result):
        if entry["device"] and entry["device"] in taken_devices:
            raise ValidationError("device %s is already taken" % entry["device"], "volumes[%d].device" % index)
    free = iter(dx.device_names(len(result), set(taken_devices) | {vol["device"] for vol in result if vol["device"]}))
    for entry in result:
        entry["device"] = entry["device"] or next(free)
    return result


def _swap(prm, facts, volumes):
    """The swap size, and its disk appended to ``volumes`` on the next free device."""
    size = prm["swap"]
    if size:
        entry = cap.swap_volume(prm["name"], size)
        if entry["volume"] in facts.taken_volumes:
            raise ConflictError("volume %s already exists in storage pool %s (left by an earlier machine?)"
                                % (entry["volume"], facts.storage_pool), "swap")
        entry["device"] = dx.device_names(1, {"vda"} | {vol["device"] for vol in volumes})[0]
        volumes.append(entry)
    return size


def _network(facts, name, field):
    if facts.networks.get(name) is None:
        raise NotFoundError("no network %r on pool %s" % (name, facts.pool), field)
    return facts.networks[name]


def _groups(facts, nic, field):
    for position, group in enumerate(nic.get("security_groups") or []):
        if not facts.security_groups.get(group):
            raise NotFoundError("no security group %r on this pool (create it with machinery.compute.security_group)"
                                % group, "%s.security_groups[%d]" % (field, position))
    return list(nic.get("security_groups") or [])


def _reservation(facts, nic, ip, field):
    """A NIC's fixed address, checked against its network (range, other reservations, leases)."""
    if not nic.get("network"):
        raise ValidationError("needs an interface on a libvirt network (a host bridge has no libvirt DHCP)", field)
    network = _network(facts, nic["network"], field)
    if cap.is_address_range(ip):
        return cap.allocate_address(ip, nic["mac"], nic["network"], network["info"], network["leases"], field,
                                    facts.pool)
    return cap.check_reservation(ip, nic["mac"], nic["network"], network["info"], network["leases"], field)


def _nics(prm, facts):
    items = prm["network_interfaces"]
    if items is None:
        items = [{"name": "eth0", "network": facts.default_network, "bridge": None, "mac": None, "model": "virtio",
                  "ephemeral": True, "security_groups": None, "ip_address": None}] if facts.default_network else []
    result = []
    for index, item in enumerate(items):
        where = "network_interfaces[%d]" % index
        if item.get("network"):
            _network(facts, item["network"], where + ".network")
        if item.get("bridge"):
            check_bridge(facts.pool, item["bridge"], facts.bridges.get(item["bridge"], (None, False)),
                         where + ".bridge")
        nic = {"name": item["name"], "network": item.get("network"), "bridge": item.get("bridge"),
               "mac": item.get("mac") or dx.derive_mac(prm["name"], item["name"]), "model": item["model"],
               "ephemeral": bool(item.get("ephemeral", True)), "security_groups": _groups(facts, item, where)}
        result.append(nic)
    macs = [nic["mac"] for nic in result]
    for index, mac in enumerate(macs):
        if macs.count(mac) > 1:
            raise ValidationError("MAC %s is used twice" % mac, "network_interfaces[%d].mac" % index)
    seen = {}
    for index, (nic, item) in enumerate(zip(result, items)):
        if item.get("ip_address"):
            field = "network_interfaces[%d].ip_address" % index
            nic["ip_address"] = _reservation(facts, nic, item["ip_address"], field)
            key = (nic["network"], nic["ip_address"])
            if key in seen:
                raise ValidationError("%s is given to interface %s as well" % (nic["ip_address"], seen[key]), field)
            seen[key] = nic["name"]
    return result


def _existing_capabilities(prm, facts, spec, recorded):
    """Topology, QoS and fixed addresses of an existing machine: what the user gives again over what it has."""
    volumes, nics = spec["volumes"] or [], spec["network_interfaces"] or []
    spec["disk_qos"] = cap.desired_disk_qos(volumes, prm["volumes"], recorded.get("disk_qos") or {})
    by_name = {nic["name"]: nic for nic in nics}
    seen = {}
    requested = []
    for index, item in enumerate(prm["network_interfaces"] or []):
        if item["name"] in by_name and item.get("ip_address"):
            field = "network_interfaces[%d].ip_address" % index
            ip = _reservation(facts, by_name[item["name"]], item["ip_address"], field)
            if ip in seen:
                raise ValidationError("%s is given to interface %s as well" % (ip, seen[ip]), field)
            seen[ip] = item["name"]
            item = dict(item, ip_address=ip)  # a network to allocate from: the address it gave
        requested.append(item)
    spec["ip_reservations"] = cap.desired_reservations(nics, requested if prm["network_interfaces"] is not None
                                                       else None, recorded.get("ip_reservations") or {})
    spec["requested_volumes"] = prm["volumes"]
    spec["requested_network_interfaces"] = prm["network_interfaces"]
    spec["requested_security_groups"] = {
        item["name"]: _groups(facts, item, "network_interfaces[%d]" % index)
        for index, item in enumerate(prm["network_interfaces"] or []) if item.get("security_groups") is not None}


def check_wait(prm, spec):
    """wait: address needs a NIC on a libvirt network (its DHCP lease is the address): refused before the
    machine is created rather than after it was started."""
    if spec["state"] == "running" and prm["wait"] == "address" and \
            not any(nic.get("network") for nic in spec.get("network_interfaces") or []):
        raise ValidationError("address needs a network interface on a libvirt network (its DHCP lease is the "
                              "address); this machine has none", "wait")


def _comparable(item, value):
    """A fixed option's value as the record keeps it (a checksum without its 'sha256:' prefix, a size in bytes)."""
    if item.name == "image_checksum":
        return check.sha256_checksum(value, item.name)
    return item.check(value, item.name) if item.check else value


# the fixed options that belong to the root disk: rebuild: true makes a new root disk for a change of them
ROOT_DISK_FIELDS = ("image", "image_checksum")


def fixed_changes(prm, recorded):
    """[(option, current, wanted)] of the options fixed at creation (declared ``fixed`` in options.MACHINE) that
    ``prm`` gives with another value than the machine's record."""
    changes = []
    for item in options.FIXED:
        wanted = prm[item.name]
        if wanted is None or wanted == "":
            continue
        current = item.fixed(recorded)
        if _comparable(item, wanted) != current:
            changes.append((item, current, wanted))
    return changes


def rebuild_requested(prm, recorded):
    """Whether ``prm`` rebuilds the machine of ``recorded`` (its record's spec): rebuild: true and a root disk
    option (ROOT_DISK_FIELDS) that differs from the record. rebuild: true with the same image asks nothing."""
    return bool(prm.get("rebuild")) and any(item.name in ROOT_DISK_FIELDS for item, _current, _wanted
                                            in fixed_changes(prm, recorded))


def check_fixed(prm, recorded):
    """Options fixed at creation may be repeated, never changed; a root disk option changes with rebuild: true."""
    for item, current, wanted in fixed_changes(prm, recorded):
        if item.name in ROOT_DISK_FIELDS:
            if prm.get("rebuild"):
                continue
            hint = "set rebuild: true to give the machine a new root disk from %s (same name, UUID, MACs and " \
                   "data volumes), or delete and recreate it" % shown_fixed(item, wanted)
        else:
            hint = "delete and recreate the machine to use %s" % shown_fixed(item, wanted)
        raise ConflictError("the %s of an existing machine is fixed at creation and cannot change (it is %s); %s"
                            % (item.name.replace("_", " "), shown_fixed(item, current), hint), item.name)


def _check_kept_volumes(prm, facts):
    """An existing machine whose volume given with ``volumes[].volume`` was deleted has lost that disk: refused,
    never reported converged."""
    for index, item in enumerate(prm["volumes"] or []):
        if item.get("volume") is not None and facts.volumes.get(item["volume"], {}) is None:
            raise NotFoundError("no volume %r in storage pool %s: it was deleted and machine %s has lost that disk; "
                                "make the volume again and attach it with machinery.compute.volume_attach, or leave "
                                "this entry out" % (item["volume"], facts.storage_pool, prm["name"]),
                                "volumes[%d].volume" % index)


def shown_fixed(item, value):
    return format_quantity(value) if item.name == "swap" and isinstance(value, int) else value


def normalize(prm, facts, record=None, current=None):
    """The desired spec of a machine from its ``params`` and the ``Facts`` resolved for it: pure, frozen.

    For a machine that exists (``record``), options the user left out keep their current values: ``current``
    holds the owned fields as read from the domain (the truth), the record the rest."""
    spec = {"name": prm["name"], "state": prm["state"]}
    if prm["state"] == "absent":
        return freeze(spec)
    existing = record is not None
    recorded = dict((record or {}).get("spec", {}), **(current or {}))
    spec["labels"] = prm["labels"] if prm["labels"] is not None else recorded.get("labels", {})
    spec["tolerations"] = (prm["tolerations"] or None) if prm["tolerations"] is not None \
        else recorded.get("tolerations")
    spec["machine_class"], spec["cpu"], spec["memory"] = _size(prm, facts, recorded)
    spec["topology"] = cap.topology(thaw(prm["topology"]) if prm["topology"] is not None
                                    else recorded.get("topology"), check.vcpus(spec["cpu"]))
    spec["firmware"] = prm["firmware"] or recorded.get("firmware") or options.initial(options.MACHINE, "firmware")
    spec["tpm"] = prm["tpm"] if prm["tpm"] is not None \
        else bool(recorded.get("tpm") or options.initial(options.MACHINE, "tpm"))
    spec["secure_boot"] = bool(recorded.get("secure_boot")) if existing else bool(prm["secure_boot"])
    if spec["secure_boot"] and not existing:
        if spec["firmware"] != "uefi":
            raise ValidationError("Secure Boot is a UEFI feature: set firmware: uefi with it", "secure_boot")
        if not facts.secure_boot:
            raise ValidationError("pool %s offers no UEFI firmware that can do Secure Boot (install OVMF, Debian's "
                                  "ovmf package, on the pool host)" % facts.pool, "secure_boot")
    # compared with the firmware's store only when given: a variable the firmware or the OS changed since is
    # left alone by a run that does not name it
    spec["efi_vars"] = thaw(prm["efi_vars"])
    if spec["efi_vars"] and spec["firmware"] != "uefi":
        raise ValidationError("UEFI variables need UEFI firmware: set firmware: uefi with them (it is %s)"
                              % spec["firmware"], "efi_vars")
    spec["virt_type"] = facts.virt_type if prm["virt_type"] == "auto" else prm["virt_type"]
    spec["run_strategy"] = run_strategy(prm["run_strategy"], prm["state"], recorded.get("run_strategy"), existing)
    power_request(prm, spec)
    # fixed at creation (check_fixed refuses a change): an existing machine keeps the group it was placed by
    spec["server_group"] = recorded.get("server_group") if existing else thaw(prm["server_group"])
    _boot_config(prm, spec, recorded, existing)
    if existing:
        check_fixed(prm, record.get("spec", {}))
        _check_kept_volumes(prm, facts)
        for key in ("image", "root_size", "volumes", "network_interfaces", "swap"):
            spec[key] = recorded.get(key)
        if rebuild_requested(prm, record.get("spec", {})):
            _rebuilt_root(prm, facts, record, spec)
        _existing_capabilities(prm, facts, spec, recorded)
        check_wait(prm, spec)
        return freeze(spec)
    if prm["image"] or prm.get("clone_from"):
        image = facts.images["image"]
        spec["image"] = image["image"]
        spec["root_size"] = prm["root_size"]
        if spec["root_size"] and image["size"] and spec["root_size"] < image["size"]:
            raise ValidationError("%s is smaller than the image (%s)" % (format_quantity(spec["root_size"]),
                                                                         format_quantity(image["size"])), "root_size")
        taken = {"vda"}
    else:
        # no image: the machine boots from the first existing volume attached (as KupenStack's machines do), or
        # from the first volume made from an image (IronCore's ephemeral root volume filled from its OS image; a
        # vitistack boot disk with limits of its own), else from its first empty one (as vitistack's kubevirt
        # machines do)
        if not any(item.get("volume") or item.get("image") or item.get("size") is not None
                   for item in prm["volumes"] or []):
            raise ValidationError("is required to create a machine, unless it boots from a volume (an existing one, "
                                  "one made from an image, or an empty one)", "image")
        if prm["root_size"]:
            raise ValidationError("a machine without an image has no root disk to size", "root_size")
        spec.update(image=None, root_size=None)
        taken = set()
    spec["volumes"] = _volumes(prm, facts, taken)
    if not spec["image"]:
        booted = [vol for vol in spec["volumes"] if vol["source"] in ("volume", "image")] or \
            [vol for vol in spec["volumes"] if vol["source"] == "empty"]
        booted[0]["boot"] = True
    spec["swap"] = _swap(prm, facts, spec["volumes"])
    spec["disk_qos"] = cap.desired_disk_qos(spec["volumes"])
    spec["network_interfaces"] = _nics(prm, facts)
    spec["ip_reservations"] = cap.desired_reservations(spec["network_interfaces"])
    check_wait(prm, spec)
    return freeze(spec)


# what a state implies when the task gives no run strategy and the machine has none that agrees with it
STATE_STRATEGY = {"running": "always", "stopped": "halted", "present": "manual", "restarted": "always",
                  "paused": "always", "suspended": "always"}
# the states a halted machine contradicts, and the one an always machine does
RUNS = ("running", "restarted", "paused")


def run_strategy(given, state, recorded, existing):
    """The run strategy of a machine: the one given; else the recorded one while the state agrees with it (an
    ``always`` machine asked to stop becomes ``halted``, a ``halted`` one asked to run ``always``, as KubeVirt's
    stop and start do); else what the state implies (a running machine is ``always``). A machine made before run
    strategies existed converges to the one its state implies, except under ``present``, which leaves it alone."""
    if given == "always" and state == "stopped":
        raise ValidationError("always keeps the machine running: with state stopped use halted, manual or "
                              "on_failure", "run_strategy")
    if given == "halted" and state in RUNS:
        raise ValidationError("halted keeps the machine off: with state running use always, on_failure or "
                              "manual (or set state: stopped)", "run_strategy")
    if given:
        return given
    if recorded and (recorded, state) != ("always", "stopped") and not (recorded == "halted" and state in RUNS):
        return recorded
    if state == "present" and existing:
        return recorded
    return STATE_STRATEGY[state]


def power_request(prm, spec):
    """What a power action needs of the task beyond the state (how state=restarted restarts)."""
    if prm["state"] == "restarted":
        spec["restart"] = prm["restart"]


def _rebuilt_root(prm, facts, record, spec):
    """The image and size of the new root disk of a rebuild: the size given, else the one the machine had, but
    never smaller than the new image."""
    if record.get("adopted") or record["spec"].get("image") is None:
        raise ConflictError("%s has no root disk of the collection's to rebuild (it %s)"
                            % (prm["name"], "was adopted" if record.get("adopted") else "boots from a volume"),
                            "rebuild")
    image = facts.images["image"]
    spec["image"], spec["rebuild"] = image["image"], True
    size = prm["root_size"] or record["spec"].get("root_size")
    if prm["root_size"] and image["size"] and prm["root_size"] < image["size"]:
        raise ValidationError("%s is smaller than the image (%s)" % (format_quantity(prm["root_size"]),
                                                                     format_quantity(image["size"])), "root_size")
    spec["root_size"] = max(size or 0, image["size"] or 0) or None


def desired(prm, ctx, record=None, current=None):
    """``normalize`` of what ``resolve`` reads for ``prm`` on the pool of ``ctx``."""
    return normalize(prm, resolve(prm, ctx, record), record, current)


# --- the record ------------------------------------------------------------------------------------------------

def ephemeral_volumes(record):
    """Every volume that lives and dies with the machine: root, ephemeral disks, seed, Ignition, console log."""
    spec = record.get("spec", {})
    if record.get("adopted") or not spec.get("name"):
        return []  # not ours to delete: only the domain goes
    # a machine booted from an existing volume records image None: it has no root disk of its own
    names = [dx.root_volume(spec)] if spec.get("image", {}) is not None else []
    names.extend(vol["volume"] for vol in spec.get("volumes") or [] if vol.get("ephemeral"))
    names.extend(spec.get("files", {}).values())
    return names


def recorded_spec(spec, files, created=None):
    """The normalized spec as the record keeps it: sizes and references, no boot configuration content, never
    a passphrase. ``created`` (creation.Created) is what the creation learned: the image's format, the root's
    and image-backed volumes' sizes."""
    kept = {key: thaw(spec.get(key)) for key in options.RECORDED}
    if created is not None:
        kept["root_size"] = created.root_size if spec.get("image") else None
    kept["image"] = {key: spec["image"].get(key) for key in ("source", "checksum")} if spec.get("image") else None
    if kept["image"] is not None and getattr(created, "image_checksum", None):  # a linked clone's base
        kept["image"]["checksum"] = created.image_checksum
    if kept["image"] is not None:
        kept["image"]["format"] = created.image_format if created is not None else spec["image"].get("format")
    kept["volumes"] = []
    for vol in spec["volumes"]:
        entry = {key: thaw(value) for key, value in vol.items() if key not in ("image", "passphrase")}
        if vol.get("image"):
            entry["image"] = {"source": vol["image"]["source"], "checksum": vol["image"]["checksum"]}
        if created is not None and vol["name"] in created.volume_sizes:
            entry["size"] = created.volume_sizes[vol["name"]]
        kept["volumes"].append(entry)
    kept["network_interfaces"] = thaw(spec["network_interfaces"])
    kept["files"] = files
    return kept

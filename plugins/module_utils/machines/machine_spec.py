# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A machine's desired spec: the module's parameters validated field by field and normalized.

Validation reads the pool (its classes, networks and volumes) and the controller's image files, and writes
nothing: every error names the option it is about, and a run that fails here has changed nothing.
"""

from __future__ import annotations

import os

from ansible_collections.machinery.compute.plugins.module_utils.core import capabilities as cap
from ansible_collections.machinery.compute.plugins.module_utils.core import connection as lv
from ansible_collections.machinery.compute.plugins.module_utils.core import domain as dx
from ansible_collections.machinery.compute.plugins.module_utils.core import elements
from ansible_collections.machinery.compute.plugins.module_utils.machines import named_images
from ansible_collections.machinery.compute.plugins.module_utils.core import options
from ansible_collections.machinery.compute.plugins.module_utils.pools import scheduler
from ansible_collections.machinery.compute.plugins.module_utils.pools import security_groups as sgs
from ansible_collections.machinery.compute.plugins.module_utils.machines import seed
from ansible_collections.machinery.compute.plugins.module_utils.pools import storage
from ansible_collections.machinery.compute.plugins.module_utils.core import validation as check
from ansible_collections.machinery.compute.plugins.module_utils.core.errors import (
    ConflictError, NotFoundError, ValidationError)
from ansible_collections.machinery.compute.plugins.module_utils.core.quantity import format_quantity


def _size_from_class(params, ctx, recorded=None):
    """(machine_class, cpu, memory): a class from the pool's registry, explicit cpu/memory, or both (explicit
    values override the class). For an existing machine, what the user leaves out keeps its recorded value."""
    recorded = recorded or {}
    name = params.get("machine_class")
    cpu = check.cpu_count(params["cpu"], "cpu") if params.get("cpu") is not None else None
    memory = check.memory_bytes(params["memory"], "memory") if params.get("memory") is not None else None
    if name:
        check.dns_label(name, "machine_class")
        published = ctx.registry.machine_class(name)
        if published is None:
            raise NotFoundError("class %r is not published on pool %s" % (name, ctx.name or ctx.uri),
                                "machine_class")
        return name, published["cpu"] if cpu is None else cpu, published["memory"] if memory is None else memory
    if recorded:
        return (recorded.get("machine_class"), recorded.get("cpu") if cpu is None else cpu,
                recorded.get("memory") if memory is None else memory)
    if cpu is None or memory is None:
        raise ValidationError("give machine_class, or both cpu and memory", "machine_class")
    return None, cpu, memory


def _volumes(name, items, ctx, taken_devices, leftovers=()):
    """Normalized volume entries; device names assigned stably after the root disk (vda). ``leftovers`` are
    volumes a dead run of this name listed in its journal: the create replaces them."""
    result = []
    seen = set()
    for index, item in enumerate(items or []):
        where = "volumes[%d]" % index
        if not isinstance(item, dict):
            raise ValidationError("must be a mapping", where)
        vol_name = check.dns_label(item.get("name"), where + ".name")
        if vol_name in seen or vol_name == "root":
            raise ValidationError("volume name %r is used twice (root is the image disk)" % vol_name,
                                  where + ".name")
        if vol_name == cap.SWAP_VOLUME:
            raise ValidationError("volume name swap is the swap disk's; give the machine swap: <size> instead",
                                  where + ".name")
        seen.add(vol_name)
        sources = [key for key in ("size", "volume", "image") if item.get(key) is not None]
        if len(sources) != 1:
            raise ValidationError("give exactly one of size, volume or image", where)
        entry = {"name": vol_name, "bus": check.one_of(item.get("bus") or "virtio", options.DISK_BUSES, where + ".bus"),
                 "device": item.get("device")}
        ephemeral = item.get("ephemeral")  # None when unset: new volumes are ephemeral, existing ones are not
        if item.get("volume") is not None:
            storage.check_attachable(str(item["volume"]), where + ".volume")
            existing = storage.find_volume(ctx.storage, str(item["volume"]), where + ".volume")
            entry.update(source="volume", volume=existing.name(), size=existing.info()[1],
                         ephemeral=bool(ephemeral), shareable=_shareable(item, existing, ctx, name, where))
        else:
            # an encrypted volume is LUKS with raw data inside, not qcow2
            entry.update(volume="%s-%s.%s" % (name, vol_name, "luks" if item.get("encrypted") else "qcow2"),
                         ephemeral=ephemeral is not False)
            if entry["volume"] not in leftovers and lv.lookup_volume(ctx.storage, entry["volume"]) is not None:
                raise ConflictError("volume %s already exists in storage pool %s (left by an earlier machine?); "
                                    "delete it, or attach it with volume: %s"
                                    % (entry["volume"], ctx.storage.name(), entry["volume"]), where + ".name")
            if item.get("size") is not None:
                entry.update(source="empty", size=check.disk_bytes(item["size"], where + ".size"))
            else:
                entry.update(source="image", image=named_images.resolve(item["image"], item.get("image_checksum"),
                                                                        ctx, where + ".image"))
                image_format(entry["image"], where + ".image")
        _volume_capabilities(item, entry, where)
        result.append(entry)
    for index, entry in enumerate(result):
        if entry["device"]:
            check.device_name(entry["device"], entry["bus"], "volumes[%d].device" % index)
    explicit = [entry["device"] for entry in result if entry["device"]]
    for index, entry in enumerate(result):
        if entry["device"] and (entry["device"] in taken_devices or explicit.count(entry["device"]) > 1):
            raise ValidationError("device %s is already taken" % entry["device"], "volumes[%d].device" % index)
    free = iter(dx.device_names(len(result), set(taken_devices) | set(explicit)))
    for entry in result:
        entry["device"] = entry["device"] or next(free)
    return result


def checked(table, key, value, field):
    """``value`` of option ``key`` of ``table`` through the check options.py declares for it."""
    return options.option(table, key).check(value, field)


def _volume_capabilities(item, entry, where):
    """QoS limits and encryption of a volume entry (issue 13)."""
    for key in ("iops", "throughput"):
        if item.get(key) is not None:
            entry[key] = checked(options.VOLUME, key, item[key], "%s.%s" % (where, key))
    if item.get("encrypted"):
        if entry["source"] != "empty":
            raise ValidationError("only a new empty volume (size) can be encrypted", where + ".encrypted")
        entry["encrypted"] = True
        entry["passphrase"] = checked(options.VOLUME, "passphrase", item.get("passphrase"), where + ".passphrase")
    elif item.get("passphrase") not in (None, ""):
        raise ValidationError("is only used with encrypted: true", where + ".passphrase")


def _swap(name, params, ctx, volumes, leftovers):
    """The swap size, and its disk appended to ``volumes`` on the next free device."""
    size = checked(options.MACHINE, "swap", params.get("swap"), "swap")
    if size:
        entry = cap.swap_volume(name, size)
        if entry["volume"] not in leftovers and lv.lookup_volume(ctx.storage, entry["volume"]) is not None:
            raise ConflictError("volume %s already exists in storage pool %s (left by an earlier machine?)"
                                % (entry["volume"], ctx.storage.name()), "swap")
        entry["device"] = dx.device_names(1, {"vda"} | {vol["device"] for vol in volumes})[0]
        volumes.append(entry)
    return size


def reservation(ctx, nic, ip, field):
    """A NIC's fixed address, checked against its network (range, other reservations, leases)."""
    if not nic.get("network"):
        raise ValidationError("needs an interface on a libvirt network (a host bridge has no libvirt DHCP)", field)
    net = ctx.network(nic["network"])
    info = elements.read_network(elements.parse(net.XMLDesc(lv.libvirt.VIR_NETWORK_XML_INACTIVE)))
    leases = []
    if net.isActive():
        try:
            leases = [(lease.get("mac"), lease.get("ipaddr")) for lease in net.DHCPLeases()]
        except lv.libvirt.libvirtError:
            leases = []
    return cap.check_reservation(ip, nic["mac"], nic["network"], info, leases, field)


def _reservations(ctx, nics, items):
    seen = {}
    for index, (nic, item) in enumerate(zip(nics, items or [])):
        if isinstance(item, dict) and item.get("ip_address") not in (None, ""):
            field = "network_interfaces[%d].ip_address" % index
            nic["ip_address"] = reservation(ctx, nic, item["ip_address"], field)
            key = (nic["network"], nic["ip_address"])
            if key in seen:
                raise ValidationError("%s is given to interface %s as well" % (nic["ip_address"], seen[key]), field)
            seen[key] = nic["name"]


def _existing_capabilities(params, ctx, spec, recorded):
    """Topology, QoS and fixed addresses of an existing machine: what the user gives again over what it has."""
    volumes, nics = spec["volumes"] or [], spec["network_interfaces"] or []
    names = {vol["name"]: index for index, vol in enumerate(volumes)}
    for index, item in enumerate(params.get("volumes") or []):
        if isinstance(item, dict) and item.get("name") in names:
            _volume_capabilities(item, dict(volumes[names[item["name"]]]), "volumes[%d]" % index)
    spec["disk_qos"] = cap.desired_disk_qos(volumes, params.get("volumes"), recorded.get("disk_qos") or {})
    by_name = {nic["name"]: nic for nic in nics}
    seen = {}
    for index, item in enumerate(params.get("network_interfaces") or []):
        if isinstance(item, dict) and item.get("name") in by_name and item.get("ip_address") not in (None, ""):
            field = "network_interfaces[%d].ip_address" % index
            ip = reservation(ctx, by_name[item["name"]], item["ip_address"], field)
            if ip in seen:
                raise ValidationError("%s is given to interface %s as well" % (ip, seen[ip]), field)
            seen[ip] = item["name"]
    spec["ip_reservations"] = cap.desired_reservations(nics, params.get("network_interfaces"),
                                                       recorded.get("ip_reservations") or {})


def _shareable(item, existing, ctx, machine, where):
    """An existing volume another machine uses is attached only as a shareable raw disk (as volume_attach)."""
    shareable = bool(item.get("shareable"))
    if shareable and storage.volume_format(existing) != "raw":
        raise ValidationError("a shareable volume must be raw (qcow2 cannot be written by two guests)",
                              where + ".shareable")
    users = storage.users_of(ctx.conn, existing.path(), machine)
    if users and not shareable:
        raise ConflictError("volume %s is attached to %s; set shareable: true (raw volumes only) to attach it to "
                            "more than one machine" % (existing.name(), ", ".join(users)), where + ".volume")
    return shareable


def _nics(name, items, ctx):
    if items is None:
        default = (ctx.registration or {}).get("networks") or []
        items = [{"name": "eth0", "network": default[0]}] if default else []
    result = []
    seen = set()
    for index, item in enumerate(items):
        where = "network_interfaces[%d]" % index
        if not isinstance(item, dict):
            raise ValidationError("must be a mapping", where)
        nic_name = check.dns_label(item.get("name"), where + ".name")
        if nic_name in seen:
            raise ValidationError("interface name %r is used twice" % nic_name, where + ".name")
        seen.add(nic_name)
        if bool(item.get("network")) == bool(item.get("bridge")):
            raise ValidationError("give exactly one of network or bridge", where)
        if item.get("network") and ctx.network(item["network"]) is None:
            raise NotFoundError("no network %r on pool %s" % (item["network"], ctx.name or ctx.uri),
                                where + ".network")
        if item.get("bridge"):
            host_bridge(ctx, check.interface_name(item["bridge"], where + ".bridge"), where + ".bridge")
        mac = check.mac_address(item["mac"], where + ".mac") if item.get("mac") else dx.derive_mac(name, nic_name)
        result.append({"name": nic_name, "network": item.get("network"), "bridge": item.get("bridge"), "mac": mac,
                       "model": check.one_of(item.get("model") or "virtio", options.NIC_MODELS, where + ".model"),
                       "ephemeral": bool(item.get("ephemeral", True)),
                       "security_groups": sgs.check_group_names(ctx.conn, item.get("security_groups"),
                                                                where + ".security_groups") or []})
    macs = [nic["mac"] for nic in result]
    for index, mac in enumerate(macs):
        if macs.count(mac) > 1:
            raise ValidationError("MAC %s is used twice" % mac, "network_interfaces[%d].mac" % index)
    return result


def requested_security_groups(items, ctx):
    """{nic: [groups]} of an existing machine's NICs that name their security_groups (validated; a NIC that
    leaves the option out keeps its groups)."""
    requested = {}
    for index, item in enumerate(items or []):
        if isinstance(item, dict) and item.get("security_groups") is not None and item.get("name"):
            requested[item["name"]] = sgs.check_group_names(
                ctx.conn, item["security_groups"], "network_interfaces[%d].security_groups" % index)
    return requested


def _host_interface(conn, name):
    """What the host's libvirt says of interface ``name``: (its type such as 'bridge', 'unknown' when only its
    node device was found, or None when it is not listed; whether libvirt could answer at all)."""
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


def host_bridge(ctx, name, field):
    """Refuse a host bridge the pool does not have, or an interface that is no bridge, before anything is
    created: libvirt defines a domain with any bridge name and only fails when it starts ('Cannot get interface
    MTU'), after the machine's disks were made.

    The host's interfaces are read through libvirt alone (so over any URI). Its interface driver lists every
    interface of the host with the udev backend (libvirt 9 as Debian builds it) but only configured ones with
    the older netcf backend, so a name it does not list is also looked for among the node devices of class net.
    When the host's libvirt can answer neither, the check is left to libvirt."""
    kind, answered = _host_interface(ctx.conn, name)
    if kind is None and answered:
        raise NotFoundError("pool %s has no host interface %r; create the bridge on the host first, or use a "
                            "libvirt network" % (ctx.name or ctx.uri, name), field)
    if kind not in (None, "unknown", "bridge"):
        raise ValidationError("%s is an interface of type %s on pool %s, not a bridge"
                              % (name, kind, ctx.name or ctx.uri), field)
    return name


def image_format(image, field):
    """The format of a local image ('qcow2' or 'raw'), checked as a bootable disk before anything is uploaded
    (validation.disk_image has the rule). An image given by URL is only downloaded when the machine is created."""
    path = image.get("path")
    if not path:
        return None
    try:
        with open(path, "rb") as handle:
            header = handle.read(check.IMAGE_HEADER_BYTES)
            size = os.fstat(handle.fileno()).st_size
    except OSError as exc:
        raise NotFoundError("cannot read image %s: %s" % (path, exc.strerror), field) from None
    return check.disk_image(header, size, field)


def check_timeouts(params):
    """A timeout is a number of seconds, never 0 meaning 'the default': wait_timeout must be positive;
    shutdown_timeout may be 0 (power off without waiting for the guest)."""
    for key, allow_zero in (("wait_timeout", False), ("shutdown_timeout", True)):
        if params.get(key) is not None:
            check.timeout_seconds(params[key], key, allow_zero)


def check_wait(params, spec):
    """wait: address needs a NIC on a libvirt network (its DHCP lease is the address): refused before the
    machine is created rather than after it was started."""
    if spec["state"] == "running" and params.get("wait") == "address" and \
            not any(nic.get("network") for nic in spec.get("network_interfaces") or []):
        raise ValidationError("address needs a network interface on a libvirt network (its DHCP lease is the "
                              "address); this machine has none", "wait")


def _comparable(item, value):
    """A fixed option's value as the record keeps it (a checksum without its 'sha256:' prefix, a size in bytes)."""
    if item.name == "image_checksum":
        return check.sha256_checksum(value, item.name)
    return item.check(value, item.name) if item.check else value


def check_fixed(params, recorded):
    """Options fixed at creation (declared ``fixed`` in options.MACHINE) may be repeated, never changed."""
    for item in options.FIXED:
        wanted = params.get(item.name)
        if wanted is None or wanted == "":
            continue
        current = item.fixed(recorded)
        if _comparable(item, wanted) != current:
            raise ConflictError("the %s of an existing machine is fixed at creation and cannot change (it is %s); "
                                "delete and recreate the machine to use %s" % (item.name.replace("_", " "), current, wanted), item.name)


def normalize(params, ctx, existing_record=None, current=None, leftovers=()):
    """The desired spec of a machine, validated field by field; reads libvirt, writes nothing.

    For a machine that exists, options the user left out keep their current values: ``current`` holds the
    owned fields as read from the domain (the truth), the record the rest.
    """
    name = check.dns_label(params.get("name"), "name")
    state = check.one_of(params.get("state") or "running", options.MACHINE_STATES, "state")
    check_timeouts(params)
    spec = {"name": name, "state": state}
    if state == "absent":
        return spec
    recorded = dict((existing_record or {}).get("spec", {}), **(current or {}))
    spec["labels"] = check.labels(params.get("labels"), "labels") if params.get("labels") is not None \
        else recorded.get("labels", {})
    spec["tolerations"] = scheduler.normalize_tolerations(params["tolerations"], "tolerations") \
        if params.get("tolerations") is not None else recorded.get("tolerations")
    spec["machine_class"], spec["cpu"], spec["memory"] = _size_from_class(params, ctx, recorded)
    spec["topology"] = cap.topology(params["topology"] if params.get("topology") is not None
                                    else recorded.get("topology"), spec["cpu"])
    spec["firmware"] = check.one_of(params.get("firmware") or recorded.get("firmware") or "bios", options.FIRMWARES,
                                    "firmware")
    virt_type = check.one_of(params.get("virt_type") or "auto", options.VIRT_TYPES, "virt_type")
    spec["virt_type"] = ctx.virt_type() if virt_type == "auto" else virt_type
    ssh_keys = [str(key) for key in (params.get("ssh_authorized_keys") or [])]
    ignition = params.get("ignition")
    cloud_init = params.get("cloud_init")
    if ignition is not None:
        spec["ignition_data"] = seed.ignition_document(ignition, None if cloud_init else ssh_keys)
    if cloud_init is not None or (ssh_keys and ignition is None):
        if cloud_init is not None and not isinstance(cloud_init, dict):
            raise ValidationError("must be a mapping with user_data, meta_data, network_config", "cloud_init")
        spec["seed_files"] = seed.nocloud_files(name, cloud_init, ssh_keys)
    if ignition is None and cloud_init is None and not ssh_keys and existing_record is not None:
        spec["boot_config"] = recorded.get("boot_config")
    else:
        spec["boot_config"] = dx.boot_config_hash(
            spec["ignition_data"].decode() if "ignition_data" in spec else None,
            {key: value.decode() for key, value in spec.get("seed_files", {}).items()} or None, None)
    if existing_record is not None:
        check_fixed(params, existing_record.get("spec", {}))
        for key in ("image", "root_size", "volumes", "network_interfaces", "swap"):
            spec[key] = recorded.get(key)
        _existing_capabilities(params, ctx, spec, recorded)
        spec["requested_volumes"] = params.get("volumes")
        spec["requested_network_interfaces"] = params.get("network_interfaces")
        spec["requested_security_groups"] = requested_security_groups(params.get("network_interfaces"), ctx)
        check_wait(params, spec)
        return spec
    if not params.get("image"):
        # no image: the machine boots from the first existing volume attached (as KupenStack's machines do)
        if not any(isinstance(item, dict) and item.get("volume") for item in params.get("volumes") or []):
            raise ValidationError("is required to create a machine, unless it boots from an existing volume "
                                  "(a volumes entry with volume set)", "image")
        if params.get("root_size"):
            raise ValidationError("a machine without an image has no root disk to size", "root_size")
        spec.update(image=None, root_size=None)
        spec["volumes"] = _volumes(name, params.get("volumes"), ctx, set(), leftovers)
        boot = next(vol for vol in spec["volumes"] if vol["source"] == "volume")
        boot["boot"] = True
        spec["network_interfaces"] = _nics(name, params.get("network_interfaces"), ctx)
        check_wait(params, spec)
        return spec
    spec["image"] = named_images.resolve(params["image"], params.get("image_checksum"), ctx, "image")
    image_format(spec["image"], "image")
    spec["root_size"] = check.disk_bytes(params["root_size"], "root_size") if params.get("root_size") else None
    if spec["root_size"] and spec["image"].get("path"):
        image_size = storage.virtual_size(spec["image"]["path"])
        if spec["root_size"] < image_size:
            raise ValidationError("%s is smaller than the image (%s)" % (format_quantity(spec["root_size"]),
                                                                         format_quantity(image_size)), "root_size")
    spec["volumes"] = _volumes(name, params.get("volumes"), ctx, {"vda"}, leftovers)
    spec["swap"] = _swap(name, params, ctx, spec["volumes"], leftovers)
    spec["disk_qos"] = cap.desired_disk_qos(spec["volumes"])
    spec["network_interfaces"] = _nics(name, params.get("network_interfaces"), ctx)
    _reservations(ctx, spec["network_interfaces"], params.get("network_interfaces"))
    spec["ip_reservations"] = cap.desired_reservations(spec["network_interfaces"])
    check_wait(params, spec)
    return spec


def ephemeral_volumes(record):
    """Every volume that lives and dies with the machine: root, ephemeral disks, seed, Ignition, console log."""
    spec = record.get("spec", {})
    if record.get("adopted") or not spec.get("name"):
        return []  # not ours to delete: only the domain goes
    # a machine booted from an existing volume records image None: it has no root disk of its own
    names = ["%s-root.qcow2" % spec.get("name")] if spec.get("image", {}) is not None else []
    names.extend(vol["volume"] for vol in spec.get("volumes") or [] if vol.get("ephemeral"))
    names.extend(spec.get("files", {}).values())
    return names


def recorded_spec(spec, files):
    """The normalized spec as the record keeps it: sizes and references, no boot configuration content."""
    kept = {key: spec.get(key) for key in ("name", "machine_class", "cpu", "memory", "labels", "tolerations",
                                           "firmware", "virt_type", "root_size", "boot_config", "topology", "swap")}
    kept["image"] = {key: spec["image"].get(key) for key in ("source", "checksum", "format")} \
        if spec.get("image") else None
    # never the passphrase of an encrypted volume
    kept["volumes"] = [{key: value for key, value in vol.items() if key not in ("image", "passphrase")}
                       for vol in spec["volumes"]]
    for vol, source in zip(kept["volumes"], spec["volumes"]):
        if source.get("image"):
            vol["image"] = {"source": source["image"]["source"], "checksum": source["image"]["checksum"]}
    kept["network_interfaces"] = spec["network_interfaces"]
    kept["files"] = files
    return kept

# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""OpenShift's own libvirt providerSpec: ``LibvirtMachineProviderConfig`` of openshift/cluster-api-provider-libvirt
(``libvirtproviderconfig.openshift.io/v1beta1``), the one openshift/installer writes, read with the provider's
meaning field by field (docs/manifests.md has the table).

The provider makes a machine as follows, and so does this reader: a root volume named after the machine, a
qcow2 overlay of ``volume.baseVolumeID`` (a volume of the libvirt storage pool ``volume.poolName``) at least
``volume.volumeSize`` large (17706254336 bytes when not given); ``domainMemory`` MiB and ``domainVcpu`` vCPUs,
both required; one virtio NIC on the libvirt network ``networkInterfaceName``, with an address allocated from
``networkInterfaceAddress`` (a CIDR, from its 51st host, skipping held addresses) and made a DHCP host entry;
boot configuration from ``ignition.userDataSecret`` (the Secret's ``userData``: Ignition), else ``ignKey`` (a
volume holding the Ignition config), else ``cloudInit`` (``userDataSecret``: a script; ``sshAccess``); libvirt
autostart as ``autostart`` says; on the libvirt host ``uri``.
"""

from __future__ import annotations

import json

from ansible_collections.machinery.compute.plugins.module_utils.core import connection as lv
from ansible_collections.machinery.compute.plugins.module_utils.core.errors import MachineryError
from ansible_collections.machinery.compute.plugins.module_utils.core.quantity import format_quantity
from ansible_collections.machinery.compute.plugins.module_utils.manifests.conformance import APPLIED, warned
from ansible_collections.machinery.compute.plugins.module_utils.manifests.documents import (
    kube_quantity, secret_value)

KIND = "LibvirtMachineProviderConfig"
API_VERSION = "libvirtproviderconfig.openshift.io/v1beta1"
# the provider's codec decodes by kind; its own examples carry these older group names
OLD_API_VERSIONS = ("libvirtproviderconfig.k8s.io/v1alpha1", "libvirtproviderconfig/v1alpha1")
STATUS_KIND = "LibvirtMachineProviderStatus"
DEFAULT_VOLUME_SIZE = 17706254336  # the provider's defaultSize
SECRET_KEY = "userData"  # the provider reads this key of every user-data Secret
NIC_NAME = "eth0"
KEYS = ("apiVersion", "kind", "domainMemory", "domainVcpu", "ignKey", "ignition", "cloudInit", "volume",
        "networkInterfaceName", "networkInterfaceHostname", "networkInterfaceAddress", "networkUUID", "autostart",
        "uri")
VOLUME_KEYS = ("poolName", "baseVolumeID", "volumeName", "volumeSize")

NOT_PASSED = "the provider's actuator never passes it on (%s); it is not applied here either"
VERDICTS = {
    "apiVersion": APPLIED, "kind": APPLIED, "domainMemory": APPLIED, "domainVcpu": APPLIED, "ignKey": APPLIED,
    "ignition.userDataSecret": APPLIED, "cloudInit.userDataSecret": APPLIED, "cloudInit.sshAccess": APPLIED,
    "volume.poolName": APPLIED, "volume.baseVolumeID": APPLIED, "volume.volumeSize": APPLIED,
    "volume.volumeName": warned(NOT_PASSED % "the root volume is named after the machine"),
    "networkInterfaceName": APPLIED, "networkInterfaceAddress": APPLIED,
    "networkInterfaceHostname": warned(NOT_PASSED % "the DHCP host entry is named after the machine"),
    "networkUUID": warned(NOT_PASSED % "the network is found by networkInterfaceName"),
    "autostart": APPLIED, "uri": APPLIED,
}


def fields_table(prefix):
    """The verdicts of the providerSpec's fields under ``prefix`` (``spec.providerSpec.value``)."""
    return {"%s.%s" % (prefix, key): verdict for key, verdict in VERDICTS.items()}


def is_upstream(value):
    return isinstance(value, dict) and value.get("kind") == KIND


def read(fields, value, path, labels, member_of_set=False):
    """(machine params, refs) of a LibvirtMachineProviderConfig at ``path``; refs["libvirt"] carries what only the
    pools can resolve (the base volume, ignKey, uri) for ``link``."""
    fields.known(value, KEYS, path)
    if value.get("apiVersion") not in (None, API_VERSION) + OLD_API_VERSIONS:
        fields.error(path + ".apiVersion", "must be %s (the provider's group; %s are read too)"
                     % (API_VERSION, ", ".join(OLD_API_VERSIONS)))
    params = {"labels": labels}
    memory = fields.integer(value.get("domainMemory"), path + ".domainMemory", minimum=1, required=True)
    if memory:
        params["memory"] = "%dMi" % memory
    params["cpu"] = fields.integer(value.get("domainVcpu"), path + ".domainVcpu", minimum=1, maximum=256,
                                   required=True)
    volume = fields.mapping(value.get("volume"), path + ".volume", required=True) or {}
    fields.known(volume, VOLUME_KEYS, path + ".volume")
    pool_name = fields.string(volume.get("poolName"), path + ".volume.poolName", required=bool(volume))
    base = fields.string(volume.get("baseVolumeID"), path + ".volume.baseVolumeID")
    if volume and base is None and volume.get("baseVolumeID") is None:
        fields.error(path + ".volume.baseVolumeID", "required value: the provider would make an empty root volume "
                     "that nothing boots from")
    size = DEFAULT_VOLUME_SIZE
    if volume.get("volumeSize") is not None:
        size = kube_quantity(fields, volume["volumeSize"], path + ".volume.volumeSize")
    libvirt = {"path": path, "uri": None, "ign_key": None, "volume_size_given": volume.get("volumeSize") is not None,
               "autostart": bool(fields.boolean(value.get("autostart"), path + ".autostart"))}
    # the provider sets libvirt autostart on every domain it defines, true or false: a run strategy here, so
    # that the machine module keeps it (always: autostart on, started when found off; manual: neither)
    params["run_strategy"] = "always" if libvirt["autostart"] else "manual"
    if base and pool_name:
        params["image"] = "volume:" + (base if base.startswith("/") else "%s/%s" % (pool_name, base))
        params["root_size"] = size
    network = fields.string(value.get("networkInterfaceName"), path + ".networkInterfaceName")
    address = fields.string(value.get("networkInterfaceAddress"), path + ".networkInterfaceAddress")
    if address and not network:
        fields.error(path + ".networkInterfaceAddress", "needs networkInterfaceName: the address is a DHCP host "
                     "entry on that libvirt network")
    if network:
        nic = {"name": NIC_NAME, "network": network}
        if address:
            if "/" not in address and member_of_set:
                fields.error(path + ".networkInterfaceAddress", "must be a network in CIDR form (192.168.126.0/24) "
                             "that each member gets its own address from; one address cannot serve every member")
            nic["ip_address"] = address
        params["network_interfaces"] = [nic]
    uri = fields.string(value.get("uri"), path + ".uri")
    libvirt["uri"] = uri
    refs = {"class": None, "volumes": [], "secret": None, "libvirt": libvirt}
    ignition = fields.mapping(value.get("ignition"), path + ".ignition")
    cloud_init = fields.mapping(value.get("cloudInit"), path + ".cloudInit")
    ign_key = fields.string(value.get("ignKey"), path + ".ignKey")
    given = []
    if ignition is not None:
        fields.known(ignition, ("userDataSecret",), path + ".ignition")
        name = None
        if ignition.get("userDataSecret") is None:
            fields.error(path + ".ignition.userDataSecret", "required value: the provider refuses an ignition "
                         "without the Secret that holds the config")
        else:
            name = fields.name(ignition["userDataSecret"], path + ".ignition.userDataSecret")
        given.append("ignition")
        refs["secret"] = (path + ".ignition.userDataSecret", name, SECRET_KEY, "ignition")
    if ign_key:
        given.append("ignKey")
        if ignition is None:
            libvirt["ign_key"] = ign_key
    if cloud_init is not None:
        fields.known(cloud_init, ("userDataSecret", "sshAccess"), path + ".cloudInit")
        name = fields.string(cloud_init.get("userDataSecret"), path + ".cloudInit.userDataSecret")
        ssh = bool(fields.boolean(cloud_init.get("sshAccess"), path + ".cloudInit.sshAccess"))
        given.append("cloudInit")
        if not name and not ssh:
            fields.error(path + ".cloudInit", "give userDataSecret or sshAccess: true (the provider refuses an "
                         "empty cloudInit)")
        if ssh:
            fields.warn(path + ".cloudInit.sshAccess", "the provider also installs its own fixed 'Libvirt guest "
                        "key' public key, whose private half nobody here holds: not installed; host keys are "
                        "generated and SSH enabled, give your keys in the user data")
        if len(given) == 1:
            libvirt["cloud_init"] = {"ssh": ssh}
            if name:
                fields.name(name, path + ".cloudInit.userDataSecret")
                refs["secret"] = (path + ".cloudInit.userDataSecret", name, SECRET_KEY, "cloudInit")
            elif ssh:
                params["cloud_init"] = {"user_data": cloud_config_script(":", True)}
    if not given:
        fields.error(path, "give ignition, ignKey or cloudInit: the provider makes no machine without boot "
                     "configuration")
    for loser in given[1:]:
        fields.warn("%s.%s" % (path, loser), "%s is given too, and the provider boots from it first: not applied"
                    % given[0])
    return params, refs


def cloud_config_script(script, ssh):
    """The cloud-init user-data of a cloudInit: the Secret's userData is a script the provider runs with bash at
    first boot; with sshAccess a cloud-config part enables SSH with new host keys (a MIME multipart, as
    cloud-init reads two parts). A userData that is already cloud-init's (``#cloud-config``, ``#!``, MIME) is
    handed over as it is."""
    if not script.startswith(("#!", "#cloud-config", "Content-Type:")):
        script = "#!/bin/bash\n" + script
    if not ssh:
        return script
    boundary = "==machinery-compute-cloudinit=="
    config = "#cloud-config\nssh_deletekeys: true\nssh_genkeytypes: [rsa, ecdsa]\n"
    kind = "text/cloud-config" if script.startswith("#cloud-config") else "text/x-shellscript"
    parts = [("text/cloud-config", config), (kind, script)]
    body = "".join("--%s\nContent-Type: %s; charset=\"utf-8\"\nMIME-Version: 1.0\n\n%s\n" % (boundary, part, text)
                   for part, text in parts)
    head = "Content-Type: multipart/mixed; boundary=\"%s\"\nMIME-Version: 1.0\n\n" % boundary
    return "%s%s--%s--\n" % (head, body, boundary)


def link(obj, target, fields, pools, secrets):
    """Resolve what only the pools and the other documents know: the pool of ``uri``, the base volume (it must
    exist, and sizes the root volume), ignKey's Ignition, and the user-data Secret."""
    libvirt = obj.refs["libvirt"]
    path = libvirt["path"]
    if libvirt["uri"] and pools is not None:
        found = [snapshot["name"] for snapshot in pools.snapshots if snapshot.get("uri") == libvirt["uri"]]
        if not found:
            fields.error(path + ".uri", "no pool of this run has the URI %r (its pools: %s)" % (
                libvirt["uri"], ", ".join("%s=%s" % (s["name"], s.get("uri")) for s in pools.snapshots) or "none"))
            return
        target["machine_pool"] = found[0]
    if obj.refs.get("secret"):
        where, name, key, kind = obj.refs["secret"]
        secret = secrets.get(name)
        if secret is None:
            fields.error(where, "Secret %r is not among the documents" % name)
        else:
            text = secret_value(fields, secret.doc, key, where)
            if text is not None and kind == "ignition":
                target["ignition"] = _ignition(fields, text, where)
            elif text is not None:
                target["cloud_init"] = {"user_data": cloud_config_script(text, libvirt["cloud_init"]["ssh"])}
    if pools is None or not target.get("image"):
        return
    where = [target["machine_pool"]] if target.get("machine_pool") else sorted(pools.by_name)
    base_path = path + ".volume.baseVolumeID"
    from ansible_collections.machinery.compute.plugins.module_utils.machines import images
    having, problems = [], []
    for pool in where:
        ctx = pools.context(pool)
        if ctx is None:
            continue
        try:
            image = images.resolve_base_volume(ctx.conn, target["image"], "image")
        except MachineryError as exc:
            problems.append("pool %s: %s" % (pool, exc.message))
            continue
        having.append((pool, image, ctx))
    if not having:
        fields.error(base_path, "; ".join(problems) or "no pool of this run to look for it on")
        return
    if len(having) < len(where):
        target["machine_pool"] = having[0][0]
        fields.warn(path + ".uri", "not given, and only pool%s %s of this run hold%s the base volume: the machine "
                    "goes to %s" % ("s" if len(having) > 1 else "", ", ".join(p for p, _i, _c in having),
                                    "" if len(having) > 1 else "s", having[0][0]))
    capacity = max(image["virtual_size"] for _pool, image, _ctx in having)
    if capacity > target["root_size"]:
        if libvirt["volume_size_given"]:
            sizes = (format_quantity(target["root_size"]), format_quantity(capacity))
            fields.warn(path + ".volume.volumeSize", "%s is smaller than the base volume (%s): the root volume is "
                        "the base volume's size, as the provider makes it" % sizes)
        target["root_size"] = capacity
    if libvirt.get("ign_key"):
        target["ignition"] = _ign_key(fields, libvirt["ign_key"], target["image"], having[0][2], path + ".ignKey")


def _ignition(fields, text, where):
    try:
        document = json.loads(text)
    except ValueError as exc:
        fields.error(where, "the secret's %s is not an Ignition config (JSON): %s" % (SECRET_KEY, exc))
        return None
    if not isinstance(document, dict) or "ignition" not in document:
        fields.error(where, "the secret's %s is JSON but no Ignition config (no 'ignition' key)" % SECRET_KEY)
        return None
    return document


def _ign_key(fields, key, image, ctx, where):
    """The Ignition config held by volume ``key``: a volume of the base volume's storage pool by name, else a
    volume key (its path), as the provider looks it up."""
    from ansible_collections.machinery.compute.plugins.module_utils.core import storage
    vol = None
    pool_name = image[len("volume:"):].partition("/")[0] if not image.startswith("volume:/") else None
    if pool_name and not key.startswith("/"):
        try:
            vol = lv.lookup_volume(ctx.conn.storagePoolLookupByName(pool_name), key)
        except lv.libvirt.libvirtError:
            vol = None
    if vol is None:
        try:
            vol = ctx.conn.storageVolLookupByKey(key)
        except lv.libvirt.libvirtError:
            fields.error(where, "no volume %r on pool %s (by name in storage pool %s, or by key)"
                         % (key, ctx.name, pool_name))
            return None
    try:
        text = storage.download_bytes(ctx.conn, vol, limit=4 * 1024 * 1024).decode()
    except (MachineryError, lv.libvirt.libvirtError, UnicodeDecodeError) as exc:
        fields.error(where, "cannot read volume %s: %s" % (key, exc))
        return None
    return _ignition(fields, text, where)


# --- status as the provider reports it -------------------------------------------------------------------------

INSTANCE_STATES = {"Running": "Running", "Pending": "Running", "Shutdown": "Shutoff", "Failed": "Crashed",
                   "Terminating": "Shutdown", "Terminated": "Shutoff"}


def provider_status(machine):
    """``status.providerStatus`` as the provider writes it: the domain's UUID and state (its DomainStateString),
    and the MachineCreated condition."""
    return {"apiVersion": API_VERSION, "kind": STATUS_KIND, "instanceID": machine.get("uuid"),
            "instanceState": INSTANCE_STATES.get(machine.get("phase"), "Unknown"),
            "conditions": [{"type": "MachineCreated", "status": "True", "reason": "MachineCreationSucceeded",
                            "message": "machine successfully created"}]}


def addresses(machine, network):
    """``status.addresses`` as the provider reports them: each leased address, and with a network its DHCP host
    name as Hostname and InternalDNS."""
    shown = []
    for address in machine.get("ip_addresses") or []:
        shown.append({"type": "InternalIP", "address": address})
        if network:
            shown += [{"type": "Hostname", "address": machine["name"]},
                      {"type": "InternalDNS", "address": machine["name"]}]
    return shown

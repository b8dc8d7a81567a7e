# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
name: machines
short_description: Every machine of every pool as an Ansible host
version_added: 0.1.0
author: machinery.compute contributors (@machinery)
description:
  - Reads the machines of a fleet of libvirt pools, in parallel with one connection per pool, and makes each
    machine created by machinery.compute a host.
  - The source file's name must end with C(machinery.yml) or C(machinery.yaml).
  - Each host gets C(ansible_host) (its first address, when it has one) and the hostvar C(machinery), the same
    shape as RV(machinery.compute.machine#module:machine), documented key by key there
    (C(ansible-doc machinery.compute.machine)).
  - Each host also gets C(machinery_uri) (its pool's libvirt URI) and C(machinery_domain) (its domain's name), so
    C(ansible_connection=machinery.compute.guest_agent) reaches it through its guest agent with no other setting. Hosts are put in the groups
    C(machinery_pool_<pool>), C(machinery_class_<class>) and C(machinery_phase_<phase>).
  - A pool that cannot be read is a warning naming the pool and the cause, and the rest of the inventory is still
    produced; with O(strict=true) it fails instead.
  - Every string read from libvirt is marked unsafe, so a label such as C({{ lookup('pipe', 'id') }}) is never
    templated.
  - With O(cache=true) a run within O(cache_timeout) reads no pool at all (it does not even load libvirt), and
    gives the same hosts, groups and hostvars as the run that filled the cache. Large fleets and AWX inventory
    sources should turn it on; see C(docs/inventory.md) in the collection for measured costs.
extends_documentation_fragment:
  - constructed
  - inventory_cache
requirements:
  - libvirt-python
  - lxml
options:
  plugin:
    description: Marks the file as a source for this plugin.
    required: true
    choices: [machinery.compute.machines]
  pools:
    description:
      - The pools, as libvirt URIs or mappings with C(uri) and an optional C(name).
      - When the source file does not give them, the comma-separated URIs of E(MACHINERY_POOLS), which the AWX
        credential type of the collection's source tree sets (see C(docs/awx.md)).
    type: list
    elements: raw
    required: true
    env:
      - name: MACHINERY_POOLS
  hostname:
    description: What names a host.
    type: str
    choices: [name, uuid]
    default: name
  address_source:
    description:
      - Where C(ansible_host) comes from, in order of preference; the first source that knows an address wins.
      - C(lease) reads the libvirt networks' DHCP leases, C(agent) asks the QEMU guest agent, C(arp) the host's
        ARP table.
    type: list
    elements: str
    choices: [lease, agent, arp]
    default: [lease, agent, arp]
  guest_facts:
    description:
      - Ask the QEMU guest agent of every running machine whose agent is connected for its facts (hostname, OS,
        kernel, boot time, addresses), returned in C(machinery.guest). A machine without a connected agent costs
        nothing more; one with an agent costs a few agent round trips.
      - With V(false) the hostvar's C(guest) is V(null) and the C(agent) address source asks the agent for the
        addresses alone.
    type: bool
    default: true
  include_unmanaged:
    description: Also make hosts of domains this collection did not create.
    type: bool
    default: false
  include_pools:
    description: Add the pools themselves as hosts of the group C(machine_pools), with their status in C(machinery_pool).
    type: bool
    default: false
  workers:
    description: Pools read at the same time.
    type: int
    default: 16
"""

EXAMPLES = r"""
# fleet.machinery.yml
plugin: machinery.compute.machines
pools:
  - qemu+ssh://root@hv1/system
  - {name: hv2, uri: qemu+ssh://root@hv2/system}
include_pools: true
keyed_groups:
  - key: machinery.labels.app | default('none')
    prefix: app
compose:
  ansible_user: "'core'"
groups:
  big: machinery.cpu >= 4
cache: true
cache_plugin: ansible.builtin.jsonfile
cache_connection: ~/.cache/machinery-inventory
"""

import json
import os
import re

from ansible.errors import AnsibleError, AnsibleParserError
from ansible.module_utils.common.text.converters import to_native
from ansible.plugins.inventory import BaseInventoryPlugin, Cacheable, Constructable
from ansible.utils.unsafe_proxy import AnsibleUnsafeText, wrap_var

# ansible-core 2.19 and later treat every value an inventory plugin sets as untrusted unless the plugin says
# otherwise (``trusted_by_default``), so wrapping would only repeat that work; older releases need wrap_var.
UNTRUSTED_BY_DEFAULT = getattr(BaseInventoryPlugin, "trusted_by_default", None) is False

# The cache holds the whole reading as one compact JSON string: the cache plugins' JSON profiles run hooks on
# every object they encode or decode, which for 1,000 machines cost more than reading the pools again.
CACHE_FORMAT = "machinery.compute.machines/2"

_UNSAFE_GROUP_CHARS = re.compile(r"[^A-Za-z0-9_]")


def group_name(prefix, value):
    return "%s_%s" % (prefix, _UNSAFE_GROUP_CHARS.sub("_", str(value)))


def fallback_addresses(lv, conn, name, sources, problems):
    """Addresses of a running domain from the guest agent or the ARP table, in the order asked.

    A source that fails for a reason other than the guest having no agent running is noted in ``problems``
    ({source: libvirt's message}), so the run can say once per pool why that source gave nothing."""
    dom = lv.lookup_domain(conn, name)
    if dom is None:
        return []
    flags = {"agent": lv.libvirt.VIR_DOMAIN_INTERFACE_ADDRESSES_SRC_AGENT,
             "arp": lv.libvirt.VIR_DOMAIN_INTERFACE_ADDRESSES_SRC_ARP}
    for source in sources:
        if source not in flags:
            continue
        try:
            interfaces = dom.interfaceAddresses(flags[source], 0)
        except lv.libvirt.libvirtError as exc:
            if exc.get_error_code() != lv.libvirt.VIR_ERR_AGENT_UNRESPONSIVE:
                problems.setdefault(source, lv.describe(exc))
            continue
        found = [address["addr"] for nic in interfaces.values() for address in nic.get("addrs") or []
                 if address.get("addr") and not address["addr"].startswith(("127.", "::1", "fe80"))]
        if found:
            return found
    return []


def unread_pool(entry, cause):
    """A pool that could not be read: its entry and the cause."""
    return {"name": entry.get("name") or entry["uri"], "uri": entry["uri"], "error": cause, "machines": [],
            "status": None, "address_problems": {}}


def read_pool(ctx, entry, include_unmanaged, include_pools, sources, guest_facts=True):
    """One connected pool's machines (and status) as a JSON-serializable dict."""
    # imported here, so a run served from the cache never loads libvirt, lxml or the image tooling
    from ansible_collections.machinery.compute.plugins.module_utils.pools import capacity
    from ansible_collections.machinery.compute.plugins.module_utils.core import connection as lv
    from ansible_collections.machinery.compute.plugins.module_utils.machines import guest
    from ansible_collections.machinery.compute.plugins.module_utils.machines.machine_status import list_machines

    result = unread_pool(entry, None)
    if ctx.name:
        result["name"] = ctx.name
    machines = list_machines(ctx, include_unmanaged, guest=guest_facts, keep=False)
    for machine in machines:
        if machine["pool"] is None:
            machine["pool"] = result["name"]
        machine["ip_addresses"] = addresses_of(machine, sources, lambda source, machine=machine: fallback_addresses(
            lv, ctx.conn, machine["name"], [source], result["address_problems"]), guest.routable_addresses,
            guest_facts)
    result["machines"] = machines
    if include_pools and ctx.registration:
        result["status"] = capacity.pool_status(ctx)
    return result


def addresses_of(machine, sources, ask, routable, facts_read):
    """A machine's addresses from the first of ``sources`` that knows one: the DHCP leases of its NICs, the guest
    agent's facts already in its status (asked again through ``ask`` only when the status was read without
    them), or ``ask(source)`` for the other sources of a running machine.

    A machine without a network interface has no address any source could find: none is asked. (The lab's
    libvirt 9.0 cannot read its hosts' ARP tables at all, "wrong nlmsg len": asking for such a machine made every
    run warn about a source nothing needed.)"""
    if not machine.get("network_interfaces"):
        return []
    running = machine["phase"] == "Running"
    for source in sources:
        if source == "lease":
            found = [address for nic in machine.get("network_interfaces") or [] for address in nic["ip_addresses"]]
        elif source == "agent" and facts_read:
            # None: the agent's channel is closed or the agent did not answer; asking again would only cost time
            found = routable((machine.get("guest") or {}).get("interfaces") or [])
        else:
            found = ask(source) if running else []
        if found:
            return found
    return []


class InventoryModule(BaseInventoryPlugin, Constructable, Cacheable):
    NAME = "machinery.compute.machines"

    def verify_file(self, path):
        return super().verify_file(path) and path.endswith(("machinery.yml", "machinery.yaml"))

    def parse(self, inventory, loader, path, cache=True):
        super().parse(inventory, loader, path, cache)
        self._read_config_data(path)
        cache_key = self._cache_key = self.get_cache_key(path)
        use_cache = self.get_option("cache") and cache
        update_cache = self.get_option("cache") and not cache
        data = None
        if use_cache:
            try:
                data = self.from_cache(self._cache[cache_key])
            except KeyError:
                pass
            update_cache = data is None
        if data is None:
            # through JSON either way, so a fresh reading and a cached one give identical hosts (down to which
            # strings are plain: every string of a reading is untrusted, even a URI echoed from this file)
            text = json.dumps(self.fetch()["pools"], separators=(",", ":"))
            data = {"pools": json.loads(text)}
            if update_cache:
                self._cache[cache_key] = {"format": CACHE_FORMAT, "pools": text}
        self.populate(data)

    def update_cache_if_changed(self):
        super().update_cache_if_changed()
        self.private_cache_file()

    def set_cache_plugin(self):
        super().set_cache_plugin()
        self.private_cache_file()

    def private_cache_file(self):
        """The reading names every machine, address and label of the fleet: a file cache plugin writes it mode
        0644, so it is made readable by its owner alone. (ansible-core 2.19 puts a profile tag before the key
        in the file's name, so the file is the one of the plugin's directory whose name ends with the key.)"""
        name_of = getattr(getattr(self._cache, "_plugin", None), "_get_cache_file_name", None)
        key = getattr(self, "_cache_key", None)
        if name_of is None or key is None:
            return
        directory = os.path.dirname(name_of(key))
        try:
            names = os.listdir(directory)
        except FileNotFoundError:
            return
        for name in names:
            if name.endswith(key):
                try:
                    os.chmod(os.path.join(directory, name), 0o600)
                except FileNotFoundError:
                    pass

    @staticmethod
    def from_cache(entry):
        """The reading kept in the cache, or None when it was written in another format (an older release)."""
        if not isinstance(entry, dict) or entry.get("format") != CACHE_FORMAT:
            return None
        try:
            return {"pools": json.loads(str(entry["pools"]))}
        except (KeyError, TypeError, ValueError):
            return None

    def fetch(self):
        from ansible_collections.machinery.compute.plugins.module_utils.core import connection as lv
        from ansible_collections.machinery.compute.plugins.module_utils.fleets import fleet
        from ansible_collections.machinery.compute.plugins.module_utils.core.errors import MachineryError

        if not lv.HAS_LIBVIRT:
            raise AnsibleError("the machinery.compute.machines inventory needs libvirt-python: %s"
                               % lv.LIBVIRT_IMPORT_ERROR)
        try:
            entries = fleet.pool_entries(self.get_option("pools"))
        except MachineryError as exc:
            raise AnsibleParserError("machinery.compute.machines: %s" % to_native(exc)) from None
        options = (self.get_option("include_unmanaged"), self.get_option("include_pools"),
                   self.get_option("address_source"), self.get_option("guest_facts"))
        workers = self.get_option("workers")
        if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
            raise AnsibleParserError("machinery.compute.machines: workers: must be a whole number of at least 1, "
                                     "got %r" % (workers,))
        pools = fleet.read_each(entries, lambda ctx, entry: read_pool(ctx, entry, *options), unread_pool, workers)
        return {"pools": pools}

    def populate(self, data):
        strict = self.get_option("strict")
        by_uuid = self.get_option("hostname") == "uuid"
        compose, groups, keyed = self.get_option("compose"), self.get_option("groups"), self.get_option("keyed_groups")
        constructed = bool(compose or groups or keyed)
        inventory = self.inventory
        made = set()
        seen = {}
        for pool in data["pools"]:
            if pool["error"]:
                where = pool["name"] if pool["name"] == pool["uri"] else "%s (%s)" % (pool["name"], pool["uri"])
                message = "machinery.compute.machines: pool %s was not read: %s" % (where, pool["error"])
                if strict:
                    raise AnsibleParserError(message)
                self.display.warning(message)
                continue
            for source, problem in sorted((pool.get("address_problems") or {}).items()):
                self.display.warning("machinery.compute.machines: pool %s: the %s address source failed, so "
                                     "machines it should have found have no ansible_host: %s"
                                     % (pool["name"], source, problem))
            if pool.get("status"):
                inventory.add_group("machine_pools")
                host = inventory.add_host(pool["status"]["name"], group="machine_pools")
                inventory.set_variable(host, "machinery_pool", self.unsafe(pool["status"]))
            for machine in pool["machines"]:
                name = machine["uuid"] if by_uuid else machine["name"]
                if name in seen:
                    self.display.warning("machinery.compute.machines: %s exists on pools %s and %s; the second is "
                                         "named %s@%s" % (name, seen[name], pool["name"], name, pool["name"]))
                    name = "%s@%s" % (name, pool["name"])
                seen[name] = pool["name"]
                host = inventory.add_host(name)
                for prefix, key in (("machinery_pool", "pool"), ("machinery_class", "machine_class"),
                                    ("machinery_phase", "phase")):
                    if machine.get(key):
                        group = group_name(prefix, machine[key])
                        if group not in made:
                            inventory.add_group(group)
                            made.add(group)
                        inventory.add_child(group, host)
                inventory.set_variable(host, "machinery", self.unsafe(machine))
                # what the guest_agent connection plugin needs to reach the machine with no network path
                inventory.set_variable(host, "machinery_uri", self.unsafe(machine.get("uri") or pool["uri"]))
                inventory.set_variable(host, "machinery_domain", self.unsafe(machine["name"]))
                if machine.get("ip_addresses"):
                    inventory.set_variable(host, "ansible_host", self.unsafe(machine["ip_addresses"][0]))
                if constructed:
                    hostvars = inventory.get_host(host).get_vars()
                    self._set_composite_vars(compose, hostvars, host, strict=strict)
                    self._add_host_to_composed_groups(groups, hostvars, host, strict=strict)
                    self._add_host_to_keyed_groups(keyed, hostvars, host, strict=strict)

    @staticmethod
    def unsafe(value):
        """Strings from libvirt are never templated: wrapped here, or already untrusted by ansible-core."""
        return value if UNTRUSTED_BY_DEFAULT else unsafe_json(value)


def unsafe_json(value):
    """wrap_var for data decoded from JSON (dict, list, str and scalars only), without its generic type checks."""
    kind = type(value)
    if kind is str:
        return AnsibleUnsafeText(value)
    if kind is dict:
        return {AnsibleUnsafeText(key): unsafe_json(item) for key, item in value.items()}
    if kind is list:
        return [unsafe_json(item) for item in value]
    return wrap_var(value)

# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Every option of every module, declared once.

An ``Option`` holds what Ansible needs (type, choices, default, required, sub-options, no_log) and what the core
needs (the validation that normalizes the value and names the field). Options that are owned fields of a
machine's domain also say how they are read from and written to the domain, how they are shown in a diff,
whether a running guest takes a change live and whether they are fixed at creation: see ``machine_fields``.

Modules build their argument specs from the tables here (``argument_spec(TABLE)``) and a unit test checks
that each module's documentation says the same.
"""

from __future__ import annotations

from ansible_collections.machinery.compute.plugins.module_utils.core import capabilities as cap
from ansible_collections.machinery.compute.plugins.module_utils.core import domain as dx
from ansible_collections.machinery.compute.plugins.module_utils.core import efi_vars as efi
from ansible_collections.machinery.compute.plugins.module_utils.core import firmware as fw
from ansible_collections.machinery.compute.plugins.module_utils.core import validation as check
from ansible_collections.machinery.compute.plugins.module_utils.core.errors import ValidationError
from ansible_collections.machinery.compute.plugins.module_utils.core.quantity import format_quantity

# Choices, each typed out once.
MACHINE_STATES = ("running", "stopped", "present", "absent", "restarted", "paused", "suspended")
RESTARTS = ("soft", "hard")
# KubeVirt's run strategies (Always, RerunOnFailure, Manual, Halted); machine_spec.run_strategy derives the one
# a task leaves out from its state
RUN_STRATEGIES = ("always", "on_failure", "manual", "halted")
PRESENCE = ("present", "absent")
ATTACH_STATES = ("attached", "detached")
WAITS = ("none", "running", "address")
FIRMWARES = ("bios", "uefi")
VIRT_TYPES = ("auto", "kvm", "qemu")
NIC_MODELS = ("virtio", "e1000e", "rtl8139")
DISK_BUSES = ("virtio", "scsi", "sata")
VOLUME_FORMATS = ("qcow2", "raw")
TAINT_EFFECTS = ("NoSchedule", "NoExecute")
NETWORK_MODES = ("nat", "isolated")
STRATEGIES = ("spread", "binpack")
SERVER_GROUP_POLICIES = ("affinity", "anti-affinity", "soft-affinity", "soft-anti-affinity")
SPREAD_WHEN = ("refuse", "schedule_anyway")
PHASES = ("Pending", "Running", "Shutdown", "Terminating", "Terminated", "Failed")
DEFAULT_STORAGE_PATH = "/var/lib/libvirt/machinery"


class Owned:
    """How an owned field of a machine lives in its domain.

    ``read(tree, record)`` and ``write(tree, record, value)`` map it to the persistent XML and the record,
    ``show`` formats it for a diff, and ``live`` says how a running guest takes a change: ``metadata`` (at
    once, it is only recorded), ``balloon`` (memory, at once up to the boot-time maximum), ``restart`` (at
    the next start), ``boot`` (read by the guest at its next first boot) or ``lifecycle`` (the run strategy:
    the running guest's crash action is set at once)."""

    def __init__(self, read, write, show=None, live="metadata", compared=True):
        self.read = read
        self.write = write
        self.show = show or (lambda value: value)
        self.live = live
        # False for a field fixed at creation: written and read by its declaration, never converged after
        self.compared = compared


def _recorded(key, live="metadata"):
    """A field kept in the machine's record only (the domain XML does not carry it)."""
    def read(_tree, record):
        return (record or {}).get("spec", {}).get(key)

    def write(_tree, record, value):
        record["spec"][key] = value
    return Owned(read, write, live=live)


class Option:
    """One module option: its Ansible argument spec and its meaning to the core.

    ``owned`` (an Owned) marks a field of the machine that the collection converges in place; ``fixed`` a
    value that is set at creation and compared afterwards (``fixed`` reads it from the record's spec);
    ``argument=False`` a field that is no module option (it is derived from others); ``check(value, field)``
    the core's validation and normalization of a value (its range), where it has one of its own."""

    def __init__(self, name, type="str", choices=None, default=None, required=False, elements=None, options=None,
                 no_log=None, aliases=None, owned=None, fixed=None, argument=True, check=None, initial=None,
                 recorded=False):
        self.name = name
        # a machine created without this option gets ``initial``; an existing one keeps what it has (so it is no
        # Ansible default, which would overwrite it)
        self.initial = initial
        # kept in the machine's record as normalized (recorded_spec)
        self.recorded = recorded or owned is not None or fixed is not None
        self.check = check
        self.owned = owned
        self.fixed = fixed
        self.argument = argument
        self.type = type
        self.choices = tuple(choices) if choices else None
        self.default = default
        self.required = required
        self.elements = elements
        self.options = options  # a table (tuple of Option) for dict and list-of-dict options
        self.no_log = no_log
        self.aliases = aliases

    def spec(self):
        entry = {"type": self.type}
        if self.choices:
            entry["choices"] = list(self.choices)
        if self.default is not None:
            entry["default"] = list(self.default) if isinstance(self.default, tuple) else self.default
        if self.required:
            entry["required"] = True
        if self.elements:
            entry["elements"] = self.elements
        if self.options is not None:
            entry["options"] = argument_spec(self.options)
        if self.no_log is not None:
            entry["no_log"] = self.no_log
        if self.aliases:
            entry["aliases"] = list(self.aliases)
        return entry


def argument_spec(table, without=()):
    """The Ansible argument spec of a table of options."""
    return {option.name: option.spec() for option in table if option.argument and option.name not in without}


def option(table, name):
    return next(item for item in table if item.name == name)


def initial(table, name):
    """What a new machine gets for an option left out (see Option.initial)."""
    return option(table, name).initial


def default(table, path):
    """The declared default of an option by its dotted path (``rollout.max_surge``)."""
    item = None
    for name in path.split("."):
        item = option(table if item is None else item.options, name)
    return item.default


def defaulted(table, params):
    """``params`` with the table's defaults for the options they leave out or set to None, as Ansible fills
    them for a module; for parameters that reach the core another way (a manifest's, a role's element)."""
    result = dict(params)
    for item in table:
        if result.get(item.name) is None and item.default is not None:
            result[item.name] = list(item.default) if isinstance(item.default, tuple) else item.default
    return result


def secret_paths(table, prefix=()):
    """The paths (tuples of option names) of every no_log option of a table, sub-options included."""
    paths = []
    for item in table:
        if item.no_log:
            paths.append(prefix + (item.name,))
        elif item.options is not None:
            paths.extend(secret_paths(item.options, prefix + (item.name,)))
    return paths


# --- the connection, common to every module of the action group -----------------------------------------------

# hold_timeout: how long a run waits for a machine another run holds (coordination/holds.py, docs/concurrency.md);
# 0 fails at once. Every member takes it, read-only ones too (they never wait), so module_defaults can set it.
HOLD_TIMEOUT = Option("hold_timeout", "int", default=900, check=lambda value, field: check.whole_number(
    value, field, minimum=0))
COMMON = (Option("uri", default="qemu:///system"), HOLD_TIMEOUT)
# A module over several pools takes the group's uri as its one pool when no pools are given, so it has no default.
MULTI_POOL = (Option("uri"), Option("pools", "list", elements="raw"), HOLD_TIMEOUT)

# --- machine capabilities (issue 13: topology, swap, disk QoS, encrypted volumes, static addresses) -----------
# Ranges from the vitistack Machine CRD; the XML mapping and the pure checks are in capabilities.py. Owned fields
# derived from list items (disk_qos from volumes[], ip_reservations from network_interfaces[]) are compared as
# a whole; ``live`` says how a running guest takes them (iotune: at once through virDomainSetBlockIoTune;
# network: the reservation changes at once, the guest takes it at its next DHCP request, so at its restart).

TOPOLOGY = tuple(Option(key, "int", default=1, check=cap.ranged(low, high)) for key, low, high in cap.TOPOLOGY_RANGES)

VOLUME_CAPABILITIES = (
    Option("iops", "int", check=cap.iops),
    Option("throughput", "int", check=cap.throughput),
    Option("encrypted", "bool", default=False),
    Option("passphrase", no_log=True, check=cap.passphrase),
)

NETWORK_INTERFACE_CAPABILITIES = (
    Option("ip_address"),
)

MACHINE_CAPABILITIES = (
    Option("topology", "dict", options=TOPOLOGY, owned=Owned(cap.read_topology, cap.write_topology, live="restart")),
    Option("swap", "raw", check=cap.swap_bytes, fixed=lambda spec: spec.get("swap")),
    Option("disk_qos", argument=False, owned=Owned(cap.read_disk_qos, cap.write_disk_qos, live="iotune")),
    Option("ip_reservations", argument=False,
           owned=Owned(cap.read_reservations, cap.write_reservations, live="network")),
)

# --- machine ----------------------------------------------------------------------------------------------------

VOLUME = (
    Option("name", required=True),
    Option("size", "raw"),
    Option("volume"),
    Option("image"),
    Option("image_checksum"),
    Option("device"),
    Option("bus", choices=DISK_BUSES, default="virtio"),
    Option("ephemeral", "bool"),
    Option("shareable", "bool", default=False),
) + VOLUME_CAPABILITIES

NETWORK_INTERFACE = (
    Option("name", required=True),
    Option("network"),
    Option("bridge"),
    Option("mac"),
    Option("model", choices=NIC_MODELS, default="virtio"),
    Option("ephemeral", "bool", default=True),
    # --- security groups (issue 13): nwfilters of the pool, see security_groups.py ---
    Option("security_groups", "list", elements="str"),
) + NETWORK_INTERFACE_CAPABILITIES

CLOUD_INIT = (
    Option("user_data", "raw", no_log=True),
    Option("meta_data", "raw"),
    Option("network_config", "raw"),
)


def _server_group(value, field):
    """A server group as the record keeps it: its name (a DNS label) and policy (Ansible checked the choice)."""
    if not isinstance(value, dict):
        raise ValidationError("must be a mapping with name and policy", field)
    policy = check.one_of(value.get("policy"), SERVER_GROUP_POLICIES, field + ".policy")
    return {"name": check.dns_label(value.get("name"), field + ".name"), "policy": policy}


# The scheduler places a machine by its group's policy (placement_rules.py); the group is fixed at creation, as a
# machine joins a group by being placed with it.
SERVER_GROUP = (
    Option("name", required=True),
    Option("policy", required=True, choices=SERVER_GROUP_POLICIES),
)

# a UEFI variable written into the machine's firmware store (efi_vars.py; machines/efi_store.py writes it)
EFI_VAR = (
    Option("name", required=True),
    Option("guid", required=True),
    Option("value", required=True, no_log=False),
    Option("runtime_access", "bool", default=True),
)

IMAGE_PULL_SECRET = (Option("username", required=True), Option("password", required=True, no_log=True))
# the machine a clone's root disk is copied from (clone.py)
CLONE_SOURCE = (
    Option("uri"),
    Option("machine", required=True),
    Option("snapshot"),
    Option("mode", choices=("full", "linked"), default="full"),
)

MACHINE = (
    Option("name", required=True),
    Option("state", choices=MACHINE_STATES, default="running"),
    Option("machine_class", owned=_recorded("machine_class")),
    Option("cpu", "raw", owned=Owned(dx.read_cpu, dx.write_cpu, live="restart")),
    Option("memory", "raw", owned=Owned(dx.read_memory, dx.write_memory, live="balloon",
                                        show=lambda value: None if value is None else format_quantity(value))),
    Option("image", fixed=lambda spec: (spec.get("image") or {}).get("source")),
    Option("image_checksum", fixed=lambda spec: (spec.get("image") or {}).get("checksum")),
    # an OCI registry's CA and credentials, for an image (or a volume's) given as oci://...; read, never recorded
    Option("image_ca_file", "path"),
    Option("image_pull_secret", "dict", no_log=False, options=IMAGE_PULL_SECRET),
    Option("clone_from", "dict", options=CLONE_SOURCE),
    Option("root_size", "raw", recorded=True),
    Option("volumes", "list", elements="dict", options=VOLUME),
    Option("network_interfaces", "list", elements="dict", options=NETWORK_INTERFACE),
    Option("ignition", "raw", no_log=True),
    Option("cloud_init", "dict", options=CLOUD_INIT),
    Option("ssh_authorized_keys", "list", elements="str", no_log=False),
    # the guest's host name, handed over with the boot configuration (so part of its hash)
    Option("hostname", check=check.hostname),
    Option("labels", "dict", owned=_recorded("labels")),
    # kept in the record so that a NoExecute taint added later knows which machines may stay (pool must_leave)
    Option("tolerations", "list", elements="dict", owned=_recorded("tolerations")),
    Option("firmware", choices=FIRMWARES, fixed=lambda spec: spec.get("firmware"), initial="bios",
           owned=Owned(dx.read_firmware, dx.write_firmware, compared=False)),
    Option("tpm", "bool", initial=False, owned=Owned(fw.read_tpm, fw.write_tpm, live="restart")),
    Option("secure_boot", "bool", fixed=lambda spec: spec.get("secure_boot", False), initial=False,
           owned=Owned(fw.read_secure_boot, fw.write_secure_boot, compared=False)),
    # written into the firmware's variable store while the machine is off; recorded as last written (for export)
    Option("efi_vars", "list", elements="dict", options=EFI_VAR, check=efi.check, recorded=True),
    Option("virt_type", choices=VIRT_TYPES, default="auto", recorded=True),
    # the hash of ignition, cloud_init and ssh_authorized_keys (never the configuration itself)
    Option("boot_config", argument=False, owned=_recorded("boot_config", live="boot")),
    # on_crash in the domain, the strategy in the record; autostart and starts follow from it in plan_machine
    # how state=restarted restarts: soft (ACPI, forced after shutdown_timeout) or hard (a power cycle)
    Option("restart", choices=RESTARTS, default="soft"),
    Option("run_strategy", choices=RUN_STRATEGIES,
           owned=Owned(dx.read_run_strategy, dx.write_run_strategy, live="lifecycle")),
    Option("wait", choices=WAITS, default="running"),
    Option("wait_timeout", "int", default=300),
    Option("shutdown_timeout", "int", default=60),
    Option("adopt", "bool", default=False),
    Option("unique_across", "list", elements="str"),
    # what this run may do to resize a machine its pool has no room for (a run's instruction, never recorded)
    Option("allow_move", "bool", default=False),
    # whether a changed image gives the machine a new root disk (machines/rebuild.py); a run's instruction as well
    Option("rebuild", "bool", default=False),
    Option("server_group", "dict", options=SERVER_GROUP, check=_server_group,
           fixed=lambda spec: spec.get("server_group")),
) + MACHINE_CAPABILITIES

# What the machine module takes beyond a machine's own options: where allow_move may move it (as machine_migrate's
# pools: libvirt URIs or {name, uri})
MACHINE_MOVE = (
    Option("pools", "list", elements="raw"),
)

# What each machine of a batch (and the template of a set) takes beyond the machine's own options (tolerations
# are the machine's own: they are recorded).
SCHEDULING = (
    Option("machine_pool_selector", "dict"),
    Option("machine_pool"),
)

# A batch's or a set's own machines spread over the values of a pool label (placement_rules.spread_constraints
# checks them; Kubernetes' topologySpreadConstraints).
TOPOLOGY_SPREAD = (
    Option("topology_key", required=True, no_log=False),
    Option("max_skew", "int", default=1),
    Option("when_unsatisfiable", choices=SPREAD_WHEN, default="refuse"),
)

MACHINE_BATCH = (
    Option("machines", "list", elements="dict", required=True),
    Option("topology_spread", "list", elements="dict", options=TOPOLOGY_SPREAD),
    Option("defaults", "dict"),
    Option("strategy", choices=STRATEGIES, default="spread"),
    Option("retries", "int", default=3),
    Option("workers", "int", default=16),
    Option("return_machines", choices=("all", "changed", "none"), default="all"),
)

MACHINE_INFO = (
    Option("name", "list", elements="str"),
    Option("labels", "dict"),
    Option("phase", "list", elements="str", choices=tuple(p for p in PHASES if p != "Terminated")),
    Option("include_unmanaged", "bool", default=False),
    Option("console_lines", "int", default=0),
)

MACHINE_POOL_INFO = (
    Option("name", "list", elements="str"),
    Option("labels", "dict"),
)

MACHINE_CLASS_INFO = (
    Option("name", "list", elements="str"),
)

# --- fleets ---------------------------------------------------------------------------------------------------

DELETE_POLICIES = ("Random", "Newest", "Oldest")

MACHINE_SET = (
    Option("name", required=True),
    Option("state", choices=PRESENCE, default="present"),
    Option("replicas", "int"),
    Option("selector", "dict", options=(Option("match_labels", "dict", required=True),)),
    Option("template", "dict"),
    Option("delete_policy", choices=DELETE_POLICIES, default="Random"),
    Option("strategy", choices=STRATEGIES, default="spread"),
    Option("topology_spread", "list", elements="dict", options=TOPOLOGY_SPREAD),
    Option("rollout", "dict", options=(Option("max_surge", "raw", default=1),
                                       Option("max_unavailable", "raw", default=0))),
    Option("wait", choices=WAITS, default="running"),
    Option("wait_timeout", "int", default=300),
    Option("shutdown_timeout", "int", default=60),
    Option("workers", "int", default=16),
    Option("unreachable_timeout"),
)

MACHINE_SET_INFO = (
    Option("name", "list", elements="str"),
)

CONDITION_TYPES = ("Ready", "VolumesReady", "NetworkInterfacesReady", "Failed", "AddressAssigned", "Booted",
                   "GuestAgentConnected", "BootstrapReady", "NodeReady")
REMEDIATIONS = ("delete", "restart")

MACHINE_HEALTH_CHECK = (
    Option("name", required=True),
    Option("selector", "dict", required=True, options=(Option("match_labels", "dict", required=True),)),
    Option("unhealthy_conditions", "list", elements="dict", options=(
        Option("type", required=True, choices=CONDITION_TYPES),
        Option("status", required=True, choices=("True", "False", "Unknown")),
        Option("timeout", required=True))),
    Option("node_startup_timeout", default="10m"),
    # which condition ends the startup check: the domain running (Ready), or the guest ready (NodeReady, for
    # OpenShift's documents, whose nodeStartupTimeout waits for the Node)
    Option("startup_condition", argument=False, choices=("Ready", "NodeReady"), default="Ready"),
    Option("boot_marker"),
    Option("max_unhealthy", "raw", default="100%"),
    Option("remediation", choices=REMEDIATIONS, default="delete"),
    Option("shutdown_timeout", "int", default=10),
    Option("unreachable_timeout"),
)

# --- pools and classes ------------------------------------------------------------------------------------------

TAINT = (
    Option("key", required=True, no_log=False),
    Option("value", "raw"),
    Option("effect", choices=TAINT_EFFECTS, default="NoSchedule"),
)

NETWORK = (
    Option("name", required=True),
    Option("cidr"),
    Option("mode", choices=NETWORK_MODES, default="nat"),
)

MACHINE_POOL = (
    Option("name", required=True),
    Option("state", choices=PRESENCE, default="present"),
    Option("labels", "dict"),
    Option("taints", "list", elements="dict", options=TAINT),
    # no Ansible defaults here: an option or sub-option left out keeps the pool's registered value
    # (pool_registration.FIRST_REGISTRATION says what a new pool gets)
    Option("overcommit", "dict", options=(Option("cpu", "float"), Option("memory", "float"),
                                          Option("storage", "float"))),
    Option("reserved", "dict", options=(Option("cpu", "int"), Option("memory", "raw"), Option("storage", "raw"))),
    Option("storage_path"),
    Option("networks", "list", elements="dict", options=NETWORK),
    Option("virt_type", choices=VIRT_TYPES, default="auto"),
    Option("force", "bool", default=False),
    Option("prune_images", "bool", default=False),
)

MACHINE_CLASS = (
    Option("name", required=True),
    Option("cpu", "raw"),
    Option("memory", "raw"),
    Option("state", choices=PRESENCE, default="present"),
    Option("force", "bool", default=False),
)

IMAGE_OS = (
    Option("family", choices=("linux", "windows")),
    Option("distribution"),
    Option("version"),
    Option("architecture", choices=("amd64", "arm64", "x86_64")),
)

# the machine a captured image is taken from (capture.py)
CAPTURE_SOURCE = (
    Option("uri"),
    Option("machine", required=True),
    Option("snapshot"),
)

MACHINE_IMAGE = (
    Option("name", required=True),
    Option("url"),
    Option("path"),
    Option("checksum"),
    Option("image_ca_file", "path"),
    Option("image_pull_secret", "dict", no_log=False, options=IMAGE_PULL_SECRET),
    Option("from_machine", "dict", options=CAPTURE_SOURCE),
    Option("generalize", "bool", default=False),
    Option("os", "dict", options=IMAGE_OS),
    Option("state", choices=PRESENCE, default="present"),
    Option("force", "bool", default=False),
)

# --- manifests --------------------------------------------------------------------------------------------------

MANIFEST_DIALECTS = ("ironcore", "openshift", "kupenstack", "vitistack")

MANIFEST = (
    Option("src", "raw"),
    Option("definition", "raw", no_log=False),
    Option("state", choices=PRESENCE, default="present"),
    Option("prune", "bool", default=False),
    Option("wait", choices=WAITS, default="running"),
    Option("wait_timeout", "int", default=300),
    Option("shutdown_timeout", "int", default=60),
    Option("image_ca_file", "path"),
    Option("image_pull_secret", "dict", no_log=False, options=IMAGE_PULL_SECRET),
    Option("providers", "list", elements="str"),  # left out: libvirt alone (engine.DEFAULT_PROVIDERS)
)

MANIFEST_INFO = (
    Option("dialect", choices=MANIFEST_DIALECTS, default="ironcore"),
    Option("name", "list", elements="str"),
    Option("labels", "dict"),
)

# --- attachments ------------------------------------------------------------------------------------------------

VOLUME_ATTACH = (
    Option("machine", required=True),
    Option("volume", required=True),
    Option("size", "raw"),
    Option("format", choices=VOLUME_FORMATS, default="qcow2"),
    Option("device"),
    # left out: the attached disk's bus, so no default that would differ from it
    Option("bus", choices=DISK_BUSES, initial="virtio"),
    Option("state", choices=ATTACH_STATES, default="attached"),
    Option("ephemeral", "bool"),
    Option("shareable", "bool", default=False),
    Option("timeout", "int", default=30),
)

# --- standalone volumes (the conformance issue) ------------------------------------------------------------------
# format has no Ansible default: a new volume is qcow2 (volumes.NEW_FORMAT), an existing one keeps its own.

STANDALONE_VOLUME = (
    Option("name", required=True),
    Option("size", "raw"),
    Option("image"),
    Option("image_ca_file", "path"),
    Option("image_pull_secret", "dict", no_log=False, options=IMAGE_PULL_SECRET),
    Option("format", choices=VOLUME_FORMATS),
    Option("labels", "dict"),
    Option("state", choices=PRESENCE, default="present"),
    Option("force", "bool", default=False),
)

VOLUME_INFO = (
    Option("name", "list", elements="str"),
    Option("labels", "dict"),
)

NIC_ATTACH = (
    Option("machine", required=True),
    Option("name", required=True),
    Option("network"),
    Option("bridge"),
    Option("mac"),
    # left out: the attached NIC's model, so no default that would differ from it
    Option("model", choices=NIC_MODELS, initial="virtio"),
    Option("state", choices=ATTACH_STATES, default="attached"),
    Option("wait", choices=("none", "address"), default="none"),
    Option("wait_timeout", "int", default=300),
    Option("timeout", "int", default=30),
)


# --- the owned fields of a machine ------------------------------------------------------------------------------

OWNED = tuple(item for item in MACHINE if item.owned is not None and item.owned.compared)
# the owned fields a new domain gets from their declarations (the skeleton of domain.build_domain leaves them out)
CREATED = tuple(item for item in MACHINE if item.owned is not None)
OWNED_BY_NAME = {item.name: item.owned for item in OWNED}
FIXED = tuple(item for item in MACHINE if item.fixed is not None)
# the scalar and mapping keys of the record's spec (image, volumes, NICs and files are written by recorded_spec)
RECORDED = ("name",) + tuple(item.name for item in MACHINE if item.recorded and item.name not in
                             ("image", "image_checksum", "volumes", "network_interfaces", "disk_qos", "ip_reservations"))


def owned_values(tree, record):
    return {item.name: item.owned.read(tree, record) for item in OWNED}


def changed_fields(current, desired):
    """Names of owned fields whose desired value differs from the current one (only the fields desired sets)."""
    return [item.name for item in OWNED if item.name in desired and desired[item.name] != current.get(item.name)]


def apply_fields(tree, record, desired, names):
    """Write the desired values of ``names`` into the parsed domain and its record, in place."""
    for name in names:
        OWNED_BY_NAME[name].write(tree, record, desired[name])
    dx.write_record(tree, record)


def build_tree(inputs, spec):
    """A new machine's domain: the skeleton of domain.build_domain with every owned field of ``spec`` written
    by its declaration."""
    tree = dx.build_domain(inputs)
    write_created(tree, inputs["record"], spec)
    return tree


def write_created(tree, record, spec):
    """Write every owned field of a new machine into its skeleton (and record) by its declaration."""
    for item in CREATED:
        item.owned.write(tree, record, spec.get(item.name))
    dx.write_record(tree, record)


def read_created(tree, record=None):
    """The owned fields as a domain holds them, fixed ones included (adopting a domain)."""
    return {item.name: item.owned.read(tree, record) for item in CREATED}


def shown(values):
    """Owned values as a diff shows them (memory as a quantity)."""
    return {name: OWNED_BY_NAME[name].show(value) if name in OWNED_BY_NAME else value
            for name, value in values.items()}


# --- security groups (issue 13) ----------------------------------------------------------------------------------

SG_DIRECTIONS = ("ingress", "egress")
SG_PROTOCOLS = ("tcp", "udp", "icmp", "all")

SECURITY_GROUP_RULE = (
    Option("direction", choices=SG_DIRECTIONS, default="ingress"),
    Option("protocol", choices=SG_PROTOCOLS, default="tcp"),
    Option("port", "int"),
    Option("port_end", "int"),
    Option("remote_cidr", default="0.0.0.0/0"),
)

SECURITY_GROUP = (
    Option("name", required=True),
    Option("rules", "list", elements="dict", options=SECURITY_GROUP_RULE),
    Option("state", choices=PRESENCE, default="present"),
    Option("force", "bool", default=False),
)

# --- backups (issue 13) -------------------------------------------------------------------------------------------

MACHINE_BACKUP = (
    Option("machine", required=True),
    Option("name"),
    Option("state", choices=PRESENCE, default="present"),
    Option("restore", "bool", default=False),
    Option("retention", "dict", options=(Option("count", "int"), Option("days", "int"))),
    Option("timeout", "int", default=600),
)

SNAPSHOT_STATES = ("present", "absent", "reverted")

MACHINE_SNAPSHOT = (
    Option("machine", required=True),
    Option("name"),
    Option("memory", "bool"),
    Option("state", choices=SNAPSHOT_STATES, default="present"),
    Option("retention", "dict", options=(Option("count", "int"),)),
)


# --- moving a machine -------------------------------------------------------------------------------------------

MIGRATION_MODES = ("cold", "live", "auto")

# a live move under control (fleets/move_policy.py checks the values; KubeVirt's MigrationPolicy, Nova's timeout)
MOVE_POLICY = (
    Option("bandwidth", "raw"),
    Option("max_downtime", "int"),
    Option("completion_timeout_per_gib", "int"),
    Option("on_timeout", choices=("abort", "postcopy"), default="abort"),
    Option("auto_converge", "bool", default=False),
    Option("max_parallel", "int"),
)

MACHINE_MIGRATE = (
    Option("machine", required=True),
    Option("target"),
    Option("mode", choices=MIGRATION_MODES, default="auto"),
    Option("policy", "dict", options=MOVE_POLICY),
    Option("strategy", choices=STRATEGIES, default="spread"),
    Option("shutdown_timeout", "int", default=60),
    Option("wait", choices=WAITS, default="running"),
    Option("wait_timeout", "int", default=300),
)

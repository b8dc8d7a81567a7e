# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Applying manifests: read every document, check them all (every problem at once, nothing written), then
hand each object to the core its kind maps onto, in dependency order.

Order when present: MachineClasses (classes.py) on every pool, Volumes (storage of one pool), Machines
(batch.py: scheduled, converged in parallel), MachineSets (machine_set.py), MachineHealthChecks
(health_check.py), then the prune. When absent, the reverse. No object kind has a converge path of its own
here: an IronCore Volume is the ``volume`` module's volume (volumes.py).
"""

from __future__ import annotations

import os

from ansible_collections.machinery.compute.plugins.module_utils.fleets import batch
from ansible_collections.machinery.compute.plugins.module_utils.core import connection as lv
from ansible_collections.machinery.compute.plugins.module_utils.core import options
from ansible_collections.machinery.compute.plugins.module_utils.core import validation as check
from ansible_collections.machinery.compute.plugins.module_utils.pools import scheduler
from ansible_collections.machinery.compute.plugins.module_utils.pools.classes import ensure_class
from ansible_collections.machinery.compute.plugins.module_utils.core.convergence import converge, with_done
from ansible_collections.machinery.compute.plugins.module_utils.core.errors import MachineryError
from ansible_collections.machinery.compute.plugins.module_utils.core.frozen import freeze
from ansible_collections.machinery.compute.plugins.module_utils.machines import machine_spec
from ansible_collections.machinery.compute.plugins.module_utils.machines.backups import backup_key
from ansible_collections.machinery.compute.plugins.module_utils.machines import oci
from ansible_collections.machinery.compute.plugins.module_utils.machines.named_images import is_reference
from ansible_collections.machinery.compute.plugins.module_utils.machines.volumes import VolumeResource
from ansible_collections.machinery.compute.plugins.module_utils.fleets.fleet import Fleet
from ansible_collections.machinery.compute.plugins.module_utils.fleets.health_check import HealthCheckResource
from ansible_collections.machinery.compute.plugins.module_utils.fleets.machine_set import (
    OWNER_LABEL, MachineSetResource, read_fleet, set_status)
from ansible_collections.machinery.compute.plugins.module_utils.manifests import conformance, ironcore, openshift
from ansible_collections.machinery.compute.plugins.module_utils.manifests.documents import Fields, Problems
from ansible_collections.machinery.compute.plugins.module_utils.manifests.objects import (
    ManifestObject, columns, document_path)

DIALECTS = [ironcore, openshift]
try:  # the later dialects; each registers the same way
    from ansible_collections.machinery.compute.plugins.module_utils.manifests import kupenstack, vitistack
    DIALECTS += [kupenstack, vitistack]
except ImportError:  # pragma: no cover
    pass

PRUNE_LABEL = "app"
DEFAULT_PROVIDERS = ("libvirt",)  # the vitistack providers a run serves when the providers option is left out
CLASS_KINDS = ("MachineClass", "Flavor")  # the kinds that become machine classes
# the metadata keys a document may carry: what users write, and what an export from a cluster carries (each
# warned by conformance.METADATA)
SERVER_METADATA = ("name", "namespace", "labels", "annotations", "uid", "resourceVersion", "generation",
                   "creationTimestamp", "managedFields", "finalizers", "ownerReferences", "generateName",
                   "deletionTimestamp", "deletionGracePeriodSeconds", "selfLink")
WAITS = ("none", "running", "address")


def _kinds():
    index = {}
    for dialect in DIALECTS:
        for api, kinds in dialect.KINDS.items():
            for kind in kinds:
                index.setdefault((api, kind), dialect)  # v1 Secret: the first dialect's reader (all read it alike)
    return index


def parse(documents, problems):
    """ManifestObjects of the documents, each checked on its own; problems recorded, never raised."""
    index = _kinds()
    apis = sorted({api for api, _kind in index})
    objects, seen = [], {}
    for origin, doc in documents:
        if not isinstance(doc, dict):
            problems.error(origin, "", "must be a mapping (a Kubernetes object)")
            continue
        api, kind = doc.get("apiVersion"), doc.get("kind")
        metadata = doc.get("metadata") if isinstance(doc.get("metadata"), dict) else {}
        name = metadata.get("name")
        ref = "%s/%s" % (kind or "<no kind>", name if isinstance(name, str) and name else origin)
        fields = Fields(problems, ref)
        if not isinstance(api, str) or not api:
            fields.error("apiVersion", "required value")
            continue
        if not isinstance(kind, str) or not kind:
            fields.error("kind", "required value")
            continue
        if not any(known == api for known in apis):
            fields.error("apiVersion", "unknown apiVersion %r; known: %s" % (api, ", ".join(apis)))
            continue
        if (api, kind) not in index:
            fields.error("kind", "no kind %r in %s; it has %s" % (kind, api, ", ".join(
                sorted(k for a, k in index if a == api))))
            continue
        if not isinstance(doc.get("metadata"), dict):
            fields.error("metadata", "required value")
            continue
        fields.known(metadata, SERVER_METADATA, "metadata")
        # a class is named as Kubernetes names objects (a DNS-1123 subdomain: t3.medium); the rest name domains
        named = fields.class_name if kind in CLASS_KINDS else fields.name
        if named(name, "metadata.name") is None:
            continue
        labels = fields.run(check.labels, metadata.get("labels") or {}, "metadata.labels") or {}
        dialect = index[(api, kind)]
        if hasattr(dialect, "unset_zero_values"):  # a document as Go writes it: its zero values are unset
            doc = dialect.unset_zero_values(kind, doc)
        obj = ManifestObject(origin, doc, dialect, api, kind, name, labels)
        if obj.key in seen:
            fields.error("metadata.name", "duplicate %s %r (also in %s)" % (kind, name, seen[obj.key]))
            continue
        seen[obj.key] = origin
        dialect.read(obj, fields)
        if kind in getattr(dialect, "FIELDS", {}):
            conformance.act(fields, doc, dialect.FIELDS[kind])
        objects.append(obj)
    return objects


class Pools:
    """What the documents' references are checked against: the pools of the run, read once (a fleet)."""

    def __init__(self, fleet):
        self.fleet = fleet
        self.snapshots, self.contexts, self.machines = read_fleet(fleet)
        self.by_name = {snapshot["name"]: snapshot for snapshot in self.snapshots}
        self.volumes = {}
        for ctx in self.contexts:
            try:
                ctx.storage.refresh(0)
                self.volumes[ctx.name or ctx.uri] = set(ctx.storage.listVolumes())
            except (MachineryError, lv.libvirt.libvirtError):
                self.volumes[ctx.name or ctx.uri] = set()
        self.networks = {}
        for ctx in self.contexts:
            try:
                self.networks[ctx.name or ctx.uri] = set(ctx.conn.listNetworks()) | set(ctx.conn.listDefinedNetworks())
            except lv.libvirt.libvirtError:
                self.networks[ctx.name or ctx.uri] = set()
        self.images = {}
        for ctx in self.contexts:
            self.images[ctx.name or ctx.uri] = {key[len("image-"):]: ctx.registry.get(key) or {}
                                                for key in ctx.registry.keys("image-")}

    def context(self, pool_name):
        snapshot = self.by_name.get(pool_name)
        return self.fleet.contexts.get(snapshot["uri"]) if snapshot else None

    def class_on(self, name):
        return [s["name"] for s in self.snapshots if name in (s.get("classes") or {})]

    def volume_on(self, name):
        return sorted(pool for pool, names in self.volumes.items() if name in names)

    def networks_of(self, pool_name):
        return self.networks.get(pool_name, set())


def link(objects, problems, pools):
    """Cross-document checks: references resolve, in the documents or on the pools; Volumes get their pool and
    the machines using them are pinned to it."""
    by_key = {obj.key: obj for obj in objects}
    first_pool = pools.snapshots[0]["name"] if pools.snapshots else None
    for obj in objects:
        fields = Fields(problems, obj.ref)
        if obj.role in ("volume", "image") and hasattr(obj.dialect, "link_" + obj.role):
            # a dialect's own sources of images: a URL with no checksum (KupenStack's Image and Volume)
            getattr(obj.dialect, "link_" + obj.role)(obj, by_key, fields, pools)
        if obj.role == "pool" and obj.name not in pools.by_name:
            fields.error("metadata.name", "no pool named %r in this run (pools: %s)"
                         % (obj.name, ", ".join(sorted(pools.by_name)) or "none"))
        if obj.role not in ("machine", "set"):
            continue
        if hasattr(obj.dialect, "link"):
            obj.dialect.link(obj, by_key, fields, pools)
        params = obj.params["template"] if obj.role == "set" else obj.params
        cls = obj.refs.get("class")
        if cls and not any(other.role == "class" and other.name == cls for other in objects) \
                and not pools.class_on(cls):
            fields.error(_class_path(obj), "%s %r is neither among the documents nor published on a pool"
                         % ("Flavor" if obj.kind == "VirtualMachine" else "MachineClass", cls))
        pool = params.get("machine_pool")
        if pool and pool not in pools.by_name:
            fields.error(_pool_path(obj), "no pool named %r in this run" % pool)
        for path, name in obj.refs.get("volumes") or []:
            volume = by_key.get(("Volume", name))
            where = [volume.data.get("pool") or pool or first_pool] if volume else pools.volume_on(name)
            if not where:
                fields.error(path, "Volume %r is neither among the documents nor in a pool's storage" % name)
                continue
            if pool and pool not in where:
                fields.error(path, "Volume %r is on pool %s, the machine on %s" % (name, ", ".join(where), pool))
                continue
            if volume is not None:
                volume.data["pool"] = where[0]
            if obj.role == "machine":
                params["machine_pool"] = pool = where[0]
    link_volume_images(objects, problems, pools)


def volume_pool(obj, pools):
    """The pool of a Volume: its volumePoolRef, the pool of the machine that uses it (``link``), else the first."""
    return obj.data.get("pool") or (pools.snapshots[0]["name"] if pools.snapshots else None)


def link_volume_images(objects, problems, pools):
    """A Volume's image is published on its pool, or a file here: checked before anything is written."""
    for obj in objects:
        image = obj.data.get("image") if obj.role == "volume" else None
        if not image:
            continue
        pool = volume_pool(obj, pools)
        if image.startswith("oci://"):
            continue  # read from its registry when the volume is made
        if is_reference(image):
            if image not in pools.images.get(pool, {}) and ("Image", image) not in {o.key for o in objects}:
                Fields(problems, obj.ref).error(obj.data["image_path"], "no image named %r is published on pool %s "
                                                "(publish it with machinery.compute.machine_image)" % (image, pool))
        elif not os.path.isfile(image):
            Fields(problems, obj.ref).error(obj.data["image_path"], "%r is neither an image published on pool %s "
                                            "nor a file" % (image, pool))


def _class_path(obj):
    if obj.dialect is ironcore:
        return "spec.machineClassRef.name"
    if obj.dialect is openshift:
        return ("spec.template.spec" if obj.role == "set" else "spec") + ".providerSpec.value.machineClass"
    return obj.data.get("class_path") or getattr(obj.dialect, "CLASS_PATH", "spec")


def _pool_path(obj):
    default = "spec.machinePoolRef.name" if obj.dialect is ironcore else "spec.providerSpec.value.machinePool"
    return obj.where.get("machine_pool") if obj.dialect is ironcore else getattr(obj.dialect, "POOL_PATH", default)


def core_problem(obj, fields, exc, prefix=""):
    """A core's problem under the document's own path: ``spec.volumes[0].emptyDisk.sizeLimit``, never the core's
    ``volumes[0].size`` (an unmapped field keeps its option name after the nearest path the dialect knows)."""
    field = exc.field or ""
    if field == "machine":  # the option table's own check of the whole machine: the message names the option
        field = ""
    if prefix and field.startswith(prefix):
        field = field[len(prefix):].lstrip(".")
    shown = document_path(obj, field)
    if shown is None:
        shown = "spec" if not field else "spec (%s)" % field
    fields.error(shown, exc.message)


def spoken(obj, field, text):
    """A core's failure text (``field: message``) with the field in the document's language."""
    shown = document_path(obj, field) if field else None
    if shown and text.startswith(field + ": "):
        return "%s: %s" % (shown, text[len(field) + 2:])
    return text


def core_checks(obj, fields, pools):
    """Each object's parameters through its core's own checks, before anything is written: a machine's (and a
    set's template) through machine_spec.params, a health check's through normalize_check."""
    from ansible_collections.machinery.compute.plugins.module_utils.fleets.health_check import normalize_check
    try:
        if obj.role == "machine":
            # the machine's options through the one path every machine takes
            obj.machine = machine_spec.params({key: value for key, value in obj.params.items() if value is not None},
                                              scheduling=True)
        elif obj.role == "set":
            machine_spec.params(dict({key: value for key, value in obj.params["template"].items()
                                      if value is not None}, name=obj.name), scheduling=True)
        elif obj.role == "check":
            normalize_check(obj.params)
    except MachineryError as exc:
        core_problem(obj, fields, exc)


def _networks_exist(obj, params, fields, pools, made):
    """A NIC's libvirt network exists on the machine's pool (or, unplaced, on some pool of the run): what the
    apply would refuse, refused by check mode too."""
    pinned = params.get("machine_pool")
    if pinned and pinned not in pools.by_name:
        return  # reported as no such pool
    for index, nic in enumerate(params.get("network_interfaces") or []):
        network = nic.get("network") if isinstance(nic, dict) else None
        if not network:
            continue
        where = [pinned] if pinned else sorted(pools.by_name)
        if network in made.get("network", ()):
            continue  # a network of the documents, made on every pool before the machines
        if not any(network in pools.networks_of(pool) for pool in where):
            shown = obj.where.get("network_interfaces[%d].network" % index) or \
                obj.where.get("network_interfaces[%d]" % index) or "spec"
            fields.error(shown, "no libvirt network %r on %s" % (
                network, "pool %s" % pinned if pinned else "any pool of this run (%s)" % ", ".join(where)))


def _image_exists(obj, params, fields, pools, made):
    """A machine's image is published on its pool (or, unplaced, on some pool of the run), or is a file here or a
    URL: what the apply would refuse, refused by check mode too, under the document's own path."""
    pinned = params.get("machine_pool")
    if pinned and pinned not in pools.by_name:
        return
    # the root image, and each volume's (an IronCore volumeTemplate filled from an OS image)
    given = [("image", params.get("image"))] + [("volumes[%d].image" % index, vol.get("image"))
                                                for index, vol in enumerate(params.get("volumes") or [])
                                                if isinstance(vol, dict)]
    for option, image in given:
        if isinstance(image, str) and image:
            _one_image_exists(obj, image, obj.where.get(option) or "spec", pinned, fields, pools, made)


def _one_image_exists(obj, image, shown, pinned, fields, pools, made):
    where = [pinned] if pinned else sorted(pools.by_name)
    if is_reference(image):
        if image in made.get("image", ()):
            return  # an image of the documents, published on every pool before the machines
        if not any(image in pools.images.get(pool, {}) for pool in where):
            place = "pool %s" % pinned if pinned else "any pool of this run (%s)" % ", ".join(where)
            fields.error(shown, "no image named %r is published on %s (publish it with "
                                "machinery.compute.machine_image)" % (image, place))
    elif "://" not in image and not image.startswith("volume:") and not os.path.isfile(image):
        # (a base volume on the pool host, volume:<storage pool>/<volume>, is checked by its dialect's link)
        fields.error(shown, "%r is neither an image published on a pool of this run nor a file" % image)


def _oci_resolves(obj, fields, registry, resolved):
    """Each OCI image of a machine, a set's template or a Volume is read from its registry (its manifest: what
    check mode may read) before anything is written, so a reference that cannot be resolved is refused here,
    under the document's own path and in the normalized form that was looked up, never later at the pull.
    ``resolved`` keeps each answer for the run (many machines name one image)."""
    if obj.role == "volume":
        params = dict(registry)
        given = [(obj.data.get("image_path") or "spec", obj.data.get("image"))]
    else:
        params = obj.params["template"] if obj.role == "set" else obj.params
        given = [(obj.where.get("image") or "spec", params.get("image"))] + [
            (obj.where.get("volumes[%d].image" % index) or "spec", vol.get("image"))
            for index, vol in enumerate(params.get("volumes") or []) if isinstance(vol, dict)]
    credentials = params.get("image_pull_secret")
    for shown, image in given:
        if not oci.is_oci(image):
            continue
        key = (image, params.get("image_ca_file"), (credentials or {}).get("username"))
        if key not in resolved:
            try:
                oci.resolve(image, params.get("image_ca_file"), credentials, shown)
                resolved[key] = None
            except MachineryError as exc:
                resolved[key] = exc.message
        if resolved[key] is not None:
            fields.error(shown, "the OCI image %s cannot be resolved: %s" % (image[len(oci.SCHEME):], resolved[key]))


def made_by(objects):
    """{role: names} of the networks and images the documents make (KupenStack's Network, VirtualNetwork and
    Image), which the machines of the same documents may name before they exist on the pools."""
    made = {}
    for obj in objects:
        if obj.role in ("network", "image"):
            made.setdefault(obj.role, set()).add(obj.name)
    return made


def served(objects, problems, providers):
    """A machine whose document names a provider (vitistack's ``spec.provider``) runs here only when the run
    serves that provider (the ``providers`` option): any other is refused, naming the field and the option."""
    for obj in objects:
        provider = obj.data.get("provider")
        if provider and provider not in providers:
            Fields(problems, obj.ref).error(obj.data.get("provider_path") or "spec", (
                "provider %r is not served by this run (the manifest option providers is [%s]); add %s to providers "
                "to run this machine as a QEMU machine on these pools" % (provider, ", ".join(providers), provider)))


def registry_options(params):
    """The module's image_ca_file and image_pull_secret: how OCI images' registries are reached."""
    return {key: params.get(key) for key in ("image_ca_file", "image_pull_secret") if params.get(key)}


def _with_registry(objects, registry):
    """Each machine (and set template) with an OCI image gets the module's registry options it does not set."""
    for obj in objects:
        if obj.role not in ("machine", "set"):
            continue
        params = obj.params["template"] if obj.role == "set" else obj.params
        images = [params.get("image")] + [vol.get("image") for vol in params.get("volumes") or []]
        if any(isinstance(image, str) and image.startswith("oci://") for image in images):
            for key, value in registry.items():
                params.setdefault(key, value)


def check_documents(documents, pools, load_problems=(), registry=None, providers=DEFAULT_PROVIDERS, resolve=True):
    """Every document parsed and linked; raises ManifestError with every problem. Returns (objects, warnings).
    ``resolve``: OCI images are looked up in their registries (an apply; a delete pulls nothing)."""
    problems = Problems()
    problems.errors.extend(load_problems)
    objects = parse(documents, problems)
    served(objects, problems, list(providers))
    made = made_by(objects)
    if pools is not None:
        link(objects, problems, pools)
        _with_registry(objects, registry or {})
        resolved = {}
        for obj in objects:
            if obj.role in ("machine", "set"):
                params = obj.params["template"] if obj.role == "set" else obj.params
                _networks_exist(obj, params, Fields(problems, obj.ref), pools, made)
                _image_exists(obj, params, Fields(problems, obj.ref), pools, made)
            if resolve and obj.role in ("machine", "set", "volume") and not problems.of(obj.ref):
                _oci_resolves(obj, Fields(problems, obj.ref), registry or {}, resolved)
            if not problems.of(obj.ref):
                core_checks(obj, Fields(problems, obj.ref), pools)
    problems.raise_if_any()
    return objects, problems.warnings


# --- the run ---------------------------------------------------------------------------------------------------

class Run:
    """One apply (or delete) of a set of documents over the pools of ``fleet``."""

    def __init__(self, fleet, objects, params, check_mode):
        self.fleet = fleet
        self.objects = objects
        self.params = options.defaulted(options.MANIFEST, params)
        self.check_mode = check_mode
        self.actions = []
        self.before, self.after = {}, {}
        self.observed = {obj.key: {} for obj in objects}
        self.warnings = []
        self.failures = []

    def of(self, role):
        return [obj for obj in self.objects if obj.role == role]

    def note(self, obj_ref, plan, pool=None):
        where = " on %s" % pool if pool else ""
        name = obj_ref.split("/", 1)[1]
        for action in plan.actions:
            target = "" if action.target == name else " " + str(action.target)
            self.actions.append("%s: %s%s%s" % (obj_ref, action.summary, target, where))
        if plan.actions:
            before, after = plan.diff()
            key = obj_ref + where
            self.before.setdefault(key, before)  # converged twice in one apply (a set after remediation): first seen
            self.after[key] = after
        self.warnings.extend("%s: %s" % (obj_ref, warning) for warning in plan.warnings)

    def present(self, pools):
        self.networks(pools, "present")
        self.images(pools, "present")
        self.classes(pools, "present")
        self.volumes(pools, "present")
        self.machines(pools, "present")
        self.sets("present")
        if self.checks() and not self.check_mode:
            # as OpenShift's controllers do in one pass: the sets replace what the checks deleted, in this same
            # apply, and the checks then count what runs now
            self.sets("present")
            self.checks(count_only=True)
        if self.params["prune"]:
            self.prune(pools)

    def absent(self, pools):
        self.sets("absent")
        self.machines(pools, "absent")
        self.volumes(pools, "absent")
        self.classes(pools, "absent")
        self.images(pools, "absent")
        self.networks(pools, "absent")

    def classes(self, pools, state):
        for obj in self.of("class"):
            published = []
            for ctx in pools.contexts:
                try:
                    plan, shown = ensure_class(ctx, dict(obj.data, state=state, force=False), self.check_mode)
                except MachineryError as exc:  # the other pools still get theirs; the failure is reported
                    self.failures.append("%s on %s: %s" % (obj.ref, ctx.name, exc))
                    continue
                self.note(obj.ref, plan, ctx.name)
                if shown:
                    published.append(ctx.name)
            self.observed[obj.key]["pools"] = published

    def networks(self, pools, state):
        """KupenStack's Networks and VirtualNetworks: a libvirt network of that name on every pool of the run
        (pools/networks.py)."""
        from ansible_collections.machinery.compute.plugins.module_utils.pools.networks import NetworkResource
        for obj in self.of("network"):
            made = []
            for ctx in pools.contexts:
                try:
                    plan, _observed = converge(NetworkResource(ctx, dict(obj.data, state=state)), self.check_mode)
                except MachineryError as exc:
                    self.failures.append("%s on %s: %s" % (obj.ref, ctx.name, spoken(obj, exc.field, str(exc))))
                    continue
                self.note(obj.ref, plan, ctx.name)
                made.append(ctx.name)
            self.observed[obj.key]["pools"] = made if state == "present" else []

    def images(self, pools, state):
        """KupenStack's Images: published on every pool of the run, as machine_image publishes them."""
        from ansible_collections.machinery.compute.plugins.module_utils.machines import named_images
        for obj in self.of("image"):
            published = []
            for ctx in pools.contexts:
                params = {"name": obj.name, "url": obj.data["url"], "checksum": obj.data.get("checksum"),
                          "state": state, "force": False}
                try:
                    resource = named_images.ImageResource(ctx, named_images.validated(params))
                    plan, _observed = converge(resource, self.check_mode)
                except MachineryError as exc:
                    self.failures.append("%s on %s: %s" % (obj.ref, ctx.name, exc))
                    continue
                self.note(obj.ref, plan, ctx.name)
                published.append(ctx.name)
            self.observed[obj.key]["pools"] = published if state == "present" else []

    def volumes(self, pools, state):
        """Volumes through the volume module's core; one a machine still uses is not deleted (no force)."""
        for obj in self.of("volume"):
            pool = volume_pool(obj, pools)
            ctx = pools.context(pool)
            if ctx is None:
                continue
            params = {"name": obj.name, "size": obj.data["size"], "image": obj.data.get("image"),
                      "image_ca_file": self.params.get("image_ca_file"),
                      "image_pull_secret": self.params.get("image_pull_secret"),
                      "labels": obj.labels, "state": state, "force": False}
            paths = {"size": obj.data.get("size_path") or "spec.resources.storage",
                     "image": obj.data.get("image_path") or "spec.image",
                     "name": "metadata.name"}
            try:
                plan, volume, warnings = VolumeResource(ctx, params, self.check_mode).ensure()
            except MachineryError as exc:
                self.failures.append("%s: %s: %s" % (obj.ref, paths.get(exc.field, exc.field or "spec"), exc.message))
                continue
            self.note(obj.ref, plan, pool)
            self.warnings.extend("%s: %s" % (obj.ref, warning) for warning in warnings if warning not in plan.warnings)
            self.observed[obj.key]["pools"] = [pool] if volume["state"] != "Absent" else []
            self.observed[obj.key]["volume"] = volume

    def machines(self, pools, state):
        objs = self.of("machine")
        if not objs:
            return
        specs, planned = [], []
        for obj in objs:
            spec = freeze(dict(obj.machine, state=state if state == "absent" else obj.machine["state"],
                               wait=self.params["wait"], wait_timeout=self.params["wait_timeout"],
                               shutdown_timeout=self.params["shutdown_timeout"]))
            if self.check_mode and state == "present" and not self._ready_for_check(obj, pools):
                planned.append(obj)  # its class or volume is made by this run: the core cannot plan it yet
                continue
            specs.append(spec)
        for obj, refusal in zip(planned, self._placeable(planned, pools)):
            if refusal:  # what the apply would find: no pool has room for it, with the run's classes published
                self.failures.append("%s: %s" % (obj.ref, refusal))
                continue
            self.actions.append("%s: create" % obj.ref)
            self.after[obj.ref] = {"state": obj.machine["state"]}
            self.observed[obj.key]["machine"] = None
        if not specs:
            return
        opener = self.fleet.contexts and next(iter(self.fleet.contexts.values())).url_opener
        outcome = batch.converge(self.fleet.entries, specs, check_mode=self.check_mode, opener=opener,
                                 coordination=self.fleet.coordination)
        by_name = {obj.name: obj for obj in objs}
        for name, actions in outcome.actions.items():
            for summary in actions:
                self.actions.append("Machine/%s: %s" % (name, summary) if by_name[name].kind == "Machine"
                                    else "%s: %s" % (by_name[name].ref, summary))
        for name in outcome.before:
            self.before[by_name[name].ref] = outcome.before[name]
            self.after[by_name[name].ref] = outcome.after[name]
        self.warnings.extend(outcome.warnings)
        for failure in outcome.failures:
            obj = by_name[failure["name"]]
            self.failures.append("%s: %s" % (obj.ref, spoken(obj, failure.get("field"), failure["msg"])))
            self.actions.extend("%s: %s" % (obj.ref, step) for step in failure.get("done") or [])
        for name, machine in outcome.machines.items():
            self.observed[by_name[name].key]["machine"] = machine if machine.get("phase") != "Terminated" else None
            if getattr(by_name[name].dialect, "BACKUPS_IN_STATUS", False) and machine.get("phase") != "Terminated":
                ctx = pools.context(machine.get("pool"))
                self.observed[by_name[name].key]["backups"] = ctx.registry.get(backup_key(name)) if ctx else None
        if state == "absent":
            # the dialects report their own deletion: the run that deletes a machine, then "gone"
            for obj in objs:
                self.observed[obj.key].update(machine=None, deletion="deleting" if outcome.actions.get(obj.name)
                                              else "gone")

    def _placeable(self, planned, pools):
        """For check mode, the scheduler's refusal (or None) of each machine whose class or volume this run makes:
        placed on the pools as read, with the documents' classes published where they would be (every Ready
        pool)."""
        if not planned:
            return []
        classes = {cls.name: {"cpu": cls.data["cpu"], "memory": cls.data["memory"]} for cls in self.of("class")}
        snapshots = [dict(snapshot, classes=dict(snapshot.get("classes") or {}, **classes))
                     if snapshot.get("state") == "Ready" else snapshot for snapshot in pools.snapshots]
        try:
            placements = scheduler.schedule([obj.machine for obj in planned], snapshots, strict=False)
        except MachineryError:
            return [None] * len(planned)  # what the scheduler cannot read here, the apply reports
        return [None if placement["uri"] else placement["reason"] for placement in placements]

    def _ready_for_check(self, obj, pools):
        cls = obj.params.get("machine_class")
        if cls and not pools.class_on(cls):
            return False
        made = made_by(self.objects)
        if obj.params.get("image") in made.get("image", ()) and not any(
                obj.params["image"] in images for images in pools.images.values()):
            return False
        for nic in obj.params.get("network_interfaces") or []:
            if nic.get("network") in made.get("network", ()) and not all(
                    nic["network"] in pools.networks_of(pool) for pool in pools.by_name):
                return False
        for vol in obj.params.get("volumes") or []:
            if vol.get("volume") and not pools.volume_on(vol["volume"]):
                return False
        return True

    def sets(self, state):
        for obj in self.of("set"):
            params = dict(obj.params, state=state, wait=self.params["wait"], wait_timeout=self.params["wait_timeout"],
                          shutdown_timeout=self.params["shutdown_timeout"], rollout=None)
            params["template"] = {key: value for key, value in obj.params["template"].items() if value is not None}
            resource = MachineSetResource(self.fleet, params, self.check_mode)
            try:
                plan, observed = converge(resource, self.check_mode)
            except MachineryError as exc:
                self.failures.append("%s: %s" % (obj.ref, spoken(obj, exc.field, str(exc))))
                self.actions.extend("%s: %s" % (obj.ref, step) for step in exc.done)
                continue
            self.note(obj.ref, plan)
            self.observed[obj.key]["set"] = shown = set_status(resource.desired, observed, plan)
            names = {member["name"] for member in shown.get("members") or []}
            self.observed[obj.key]["members"] = [machine for machine in observed["machines"]
                                                 if machine["name"] in names]

    def checks(self, count_only=False):
        """Converge each health check; returns how many machines they deleted. ``count_only``: observe and count,
        remediate nothing (after the sets replaced what was deleted)."""
        deleted = 0
        for obj in self.of("check"):
            params = {item.name: item.default for item in options.MACHINE_HEALTH_CHECK}
            params.update(obj.params)
            resource = HealthCheckResource(self.fleet, params, self.check_mode)
            try:
                if count_only:
                    self.observed[obj.key]["check"] = resource.plan(resource.observe()).facts
                    continue
                plan, _observed = converge(resource, self.check_mode)
            except MachineryError as exc:
                self.failures.append("%s: %s" % (obj.ref, spoken(obj, exc.field, str(exc))))
                continue
            self.note(obj.ref, plan)
            self.observed[obj.key]["check"] = resource.plan_facts
            deleted += sum(1 for action in plan.actions if action.kind == "delete")
        return deleted

    def prune(self, pools):
        """Machines and sets that carry an ``app`` label of these documents but are no longer in them go."""
        apps = {obj.labels.get(PRUNE_LABEL) for obj in self.objects if obj.labels.get(PRUNE_LABEL)}
        apps |= {(obj.params["template"].get("labels") or {}).get(PRUNE_LABEL) for obj in self.of("set")}
        apps.discard(None)
        if not apps:
            return
        wanted = {obj.name for obj in self.of("machine")}
        sets = {obj.name for obj in self.of("set")}
        for ctx in pools.contexts:
            for key in ctx.registry.keys("set-"):
                document = ctx.registry.get(key) or {}
                labels = (document.get("template") or {}).get("labels") or {}
                if labels.get(PRUNE_LABEL) in apps and document.get("name") not in sets:
                    sets.add(document["name"])  # once, over every pool
                    params = {"name": document["name"], "state": "absent",
                              "shutdown_timeout": self.params["shutdown_timeout"]}
                    plan, _observed = converge(MachineSetResource(self.fleet, params, self.check_mode),
                                               self.check_mode)
                    self.note("MachineSet/%s" % document["name"], plan)
                    self.actions = [line + " (prune)" if line.startswith("MachineSet/%s:" % document["name"])
                                    else line for line in self.actions]
        doomed = sorted({machine["name"] for machine in pools.machines
                         if (machine.get("labels") or {}).get(PRUNE_LABEL) in apps
                         and OWNER_LABEL not in (machine.get("labels") or {}) and machine["name"] not in wanted})
        if not doomed:
            return
        specs = [machine_spec.params({"name": name, "state": "absent",
                                      "shutdown_timeout": self.params["shutdown_timeout"]}, scheduling=True)
                 for name in doomed]
        outcome = batch.converge(self.fleet.entries, specs, check_mode=self.check_mode,
                                 coordination=self.fleet.coordination)
        for name, actions in outcome.actions.items():
            self.actions.extend("Machine/%s: %s (prune)" % (name, summary) for summary in actions)
        for failure in outcome.failures:
            self.failures.append("Machine/%s: prune: %s" % (failure["name"], failure["msg"]))

    def result(self):
        """Every object with its status in its own dialect, and a kubectl get style table per kind."""
        shown_objects, rows = [], {}
        for obj in self.objects:
            observed = self.observed[obj.key]
            if obj.kind == "MachinePool":
                observed["pool"] = (self._pool(obj.name) or {}).get("status")
            if obj.kind == "NetworkInterface":
                observed["machine"] = self._user_of(obj.name)
            if obj.role in ("class", "image", "keypair", "network"):
                observed["users"] = self._referrers(obj)
            status = obj.dialect.status(obj, observed)
            metadata = {"name": obj.name}
            if obj.labels:
                metadata["labels"] = obj.labels
            shown_objects.append({"apiVersion": obj.api_version, "kind": obj.kind, "metadata": metadata,
                                  "status": status})
            group = obj.api_version.split("/")[0] if "/" in obj.api_version else ""
            rows.setdefault((obj.kind, group), (obj.dialect.TABLES.get(obj.kind), []))[1].append(
                obj.dialect.row(obj, status, observed))
            if obj.role == "set" and hasattr(obj.dialect, "member_row"):  # a set's members, as its Machines
                for machine in sorted(observed.get("members") or [], key=lambda item: item["name"]):
                    rows.setdefault(("Machine", group), (obj.dialect.TABLES.get("Machine"), []))[1].append(
                        obj.dialect.member_row(machine))
        return shown_objects, tables_of(rows)

    def _referrers(self, obj):
        """The machines of the documents naming ``obj`` (a class, image, key pair or network), as
        ``Kind/name``."""
        found = []
        for machine in self.of("machine"):
            named = {"class": machine.params.get("machine_class"), "image": machine.params.get("image"),
                     "keypair": machine.refs.get("keypair")}.get(obj.role)
            networks = {nic.get("network") for nic in machine.params.get("network_interfaces") or []}
            if named == obj.name or (obj.role == "network" and obj.name in networks):
                found.append(machine.ref)
        return found

    def _user_of(self, nic):
        """The machine status of the Machine whose networkInterfaceRef names ``nic``."""
        for obj in self.of("machine"):
            if any(target == nic for _path, target, _name in obj.refs.get("nics") or []):
                return self.observed[obj.key].get("machine")
        return None

    def _pool(self, name):
        for snapshot in self._snapshots():
            if snapshot["name"] == name:
                return snapshot
        return None

    def _snapshots(self):
        if not hasattr(self, "_fresh"):
            self._fresh = self.fleet.snapshots()
        return self._fresh


def tables_of(rows):
    """{table name: lines} of ``rows`` {(kind, API group): (header, rows)}. A kind that more than one project's
    documents share in one run (IronCore's, OpenShift's and vitistack's Machine have columns of their own) gets a
    table per group, named as kubectl names the resource in full (``Machine.machine.openshift.io``); otherwise the
    kind names it."""
    groups = {}
    for kind, group in rows:
        groups.setdefault(kind, set()).add(group)
    return {kind if len(groups[kind]) == 1 else "%s.%s" % (kind, group): columns(header, lines)
            for (kind, group), (header, lines) in rows.items() if header}


def apply(entries, documents, params, check_mode=False, opener=None, load_problems=(), coordination=None):
    """Apply (state present) or delete (absent) the documents over the pools ``entries``; returns the module's
    result without ``changed`` handling of its own: changed is whether any action was planned."""
    params = options.defaulted(options.MANIFEST, params)
    state = check.one_of(params["state"], options.PRESENCE, "state")
    check.one_of(params["wait"], WAITS, "wait")
    fleet = Fleet(entries, opener, coordination)
    try:
        pools = Pools(fleet)
        objects, warnings = check_documents(documents, pools, load_problems, registry_options(params),
                                            params.get("providers") or DEFAULT_PROVIDERS, resolve=state == "present")
        run = Run(fleet, objects, params, check_mode)
        run.warnings.extend(warnings)
        if state == "present":
            run.present(pools)
        else:
            run.absent(pools)
        shown, tables = run.result()
    finally:
        fleet.close()
    result = {"changed": bool(run.actions), "actions": run.actions, "objects": shown, "tables": tables,
              "warnings": run.warnings, "before": run.before, "after": run.after}
    if run.failures:
        message = "%d object(s) failed: %s" % (len(run.failures), "; ".join(run.failures))
        if not check_mode:
            result["done"] = list(run.actions)
            message = with_done(message, run.actions)
        result.update(failed=True, msg=message)
    return result

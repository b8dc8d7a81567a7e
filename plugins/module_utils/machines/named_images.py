# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Named OS images published on a pool, converged through observe -> plan -> apply.

A named image is a record in the pool's registry (document ``image-<name>``): where the image came from, its
sha256, its format and virtual size, and what it is (os family, distribution, version, architecture). Its
bits are the pool's image cache (images.py): one volume per checksum, uploaded once. A machine given
``image: <name>`` resolves the name on its pool and is built on that cached volume, so a name is a stable
handle that manifests (IronCore ``image: my-image``, vitistack ``os``) use.
"""

from __future__ import annotations

import os

from ansible_collections.machinery.compute.plugins.module_utils.core import domain as dx
from ansible_collections.machinery.compute.plugins.module_utils.core import storage
from ansible_collections.machinery.compute.plugins.module_utils.machines import images
from ansible_collections.machinery.compute.plugins.module_utils.core import options
from ansible_collections.machinery.compute.plugins.module_utils.core import validation as check
from ansible_collections.machinery.compute.plugins.module_utils.coordination import keys
from ansible_collections.machinery.compute.plugins.module_utils.core.convergence import Action, Plan, Resource, step
from ansible_collections.machinery.compute.plugins.module_utils.core.errors import ConflictError, NotFoundError, ValidationError
from ansible_collections.machinery.compute.plugins.module_utils.core.quantity import format_quantity

OS_FAMILIES = ("linux", "windows")
ARCHITECTURES = ("amd64", "arm64", "x86_64")
OS_KEYS = ("family", "distribution", "version", "architecture")


def image_key(name):
    return keys.image_key(name)


def is_reference(source):
    """True when an image option names a published image rather than a file or URL: no '/' and no '://',
    and no local file of that name (a file in the current directory is given as ./name)."""
    return (isinstance(source, str) and "/" not in source and not os.path.isfile(source)
            and bool(check._DNS1123_LABEL.match(source)))  # pylint: disable=protected-access


def os_info(value, field="os"):
    """The os description of an image, every key optional; family and architecture from fixed lists."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ValidationError("must be a mapping with %s" % ", ".join(OS_KEYS), field)
    unknown = sorted(str(key) for key in value if key not in OS_KEYS)
    if unknown:
        raise ValidationError("unknown key %s; os takes %s" % (", ".join(unknown), ", ".join(OS_KEYS)), field)
    shown = {}
    for key in OS_KEYS:
        item = value.get(key)
        if item is None:
            continue
        if not isinstance(item, (str, int, float)) or isinstance(item, bool) or str(item) == "":
            raise ValidationError("must be a non-empty string", "%s.%s" % (field, key))
        shown[key] = str(item)
    if "family" in shown:
        check.one_of(shown["family"], OS_FAMILIES, field + ".family")
    if "architecture" in shown:
        check.one_of(shown["architecture"], ARCHITECTURES, field + ".architecture")
    return shown


def desired_image(params, resolved, current=None):
    """The document a pool keeps of the image; ``resolved`` is images.resolve() of its url or path. ``os`` left
    out keeps the published description (none for a new image)."""
    kept = (current or {}).get("os") or {}
    return {"name": params["name"], "source": resolved["source"], "checksum": resolved["checksum"],
            "os": dict(kept) if params.get("os") is None else os_info(params["os"])}


def plan_image(params, current, cached, users=()):
    """Publish (cache the bits, write the record) or withdraw: pure, from the validated parameters (with
    ``resolved`` for state present), the published record, whether the cache has the checksum and the
    machines built on the image."""
    name = params["name"]
    key = image_key(name)
    if params.get("state") == "absent":
        if current is None:
            return Plan()
        if users and not params.get("force"):
            raise ConflictError("image %s is used by %s; set force: true to withdraw the name anyway (the machines "
                                "keep their disks)" % (name, ", ".join(users)), "name")
        return Plan([Action("withdraw", name, shown(current), None, [step("delete_document", key)])])
    desired = desired_image(params, params["resolved"], current)
    actions = []
    if not cached:
        actions.append(Action("cache", name, steps=[step("cache_image", desired["source"])]))
    comparable = {k: v for k, v in (current or {}).items() if k in desired}
    if comparable != desired:
        actions.append(Action("publish", name, shown(current), shown(desired), [step("write_document", key)],
                              body=desired))
    return Plan(actions, published=desired)


def shown(body):
    if body is None:
        return None
    result = {key: body.get(key) for key in ("name", "source", "checksum", "os")}
    for key in ("format", "virtual_size"):
        if body.get(key) is not None:
            result[key] = format_quantity(body[key]) if key == "virtual_size" else body[key]
    return result


def machines_using(conn, name):
    users = []
    for dom, tree in dx.defined_domains(conn):
        record = dx.read_record(tree)
        if record and ((record.get("spec") or {}).get("image") or {}).get("source") == name:
            users.append(dom.name())
    return sorted(users)


class ImageResource(Resource):
    """One named image on one pool, for ``converge``."""

    def __init__(self, ctx, params):
        self.ctx = ctx
        self.params = params
        self.name = params["name"]
        self.generation = None  # of the record observed (compare and swap)

    def describe(self):
        return "image %s on pool %s" % (self.name, self.ctx.name or self.ctx.uri)

    def holds(self, plan, observed):
        """None: a named image changes no machine."""
        return ()

    def observe(self):
        self.ctx.forget_reads()
        current = self.ctx.registry.get(image_key(self.name))
        self.generation = self.ctx.registry.read_generation(image_key(self.name))
        cached = False
        if self.params.get("state") != "absent":
            vol, _fmt = images.cached_volume(self.ctx.storage, self.params["resolved"]["checksum"])
            cached = vol is not None
        users = machines_using(self.ctx.conn, self.name) if self.params.get("state") == "absent" and current else []
        return current, cached, users

    def plan(self, observed):
        return plan_image(self.params, *observed)

    def _cache(self, _action, _observed):
        images.ensure_cached(self.ctx.conn, self.ctx.storage, self.params["resolved"], self.ctx.url_opener,
                             run=self.ctx.coordination)

    def _publish(self, action, _observed):
        body = dict(action.data["body"])
        vol, fmt = images.cached_volume(self.ctx.storage, body["checksum"])
        storage.refresh(self.ctx.storage)
        body.update(format=fmt, virtual_size=self.ctx.storage.storageVolLookupByName(vol.name()).info()[1])
        # compare and swap: written only over the record the plan was made from
        self.ctx.registry.put(image_key(self.name), body, expect=self.generation)

    def _withdraw(self, _action, _observed):
        self.ctx.registry.remove(image_key(self.name))

    APPLY = {"cache": _cache, "publish": _publish, "withdraw": _withdraw}


def validated(params):
    """The module's parameters checked, with the image source resolved (reads the controller's file or trusts
    the URL's checksum; writes nothing)."""
    params = options.defaulted(options.MACHINE_IMAGE, params)
    params["name"] = check.dns_label(params.get("name"), "name")
    params["state"] = check.one_of(params["state"], options.PRESENCE, "state")
    if params["state"] == "absent":
        return params
    url, path = params.get("url"), params.get("path")
    if params.get("from_machine") is not None:
        for field in ("url", "path", "checksum"):
            if params.get(field):
                raise ValidationError("a captured image takes its bits and checksum from the machine; leave %s "
                                      "out" % field, field)
        os_info(params.get("os"))
        return params
    if params.get("generalize"):
        raise ValidationError("only a captured image (from_machine) is generalized", "generalize")
    if bool(url) == bool(path):
        raise ValidationError("give exactly one of url or path", "url" if url else "path")
    if url and not url.startswith(("http://", "https://", "oci://")):
        raise ValidationError("%r is not an http(s) URL or an oci:// reference" % url, "url")
    os_info(params.get("os"))
    registry = {"ca_file": params.get("image_ca_file"), "credentials": params.get("image_pull_secret")}
    try:
        params["resolved"] = images.resolve(url or path, params.get("checksum"), "image", registry)
    except ValidationError as exc:
        if exc.field == "image_checksum":  # this module's option is checksum
            raise ValidationError(exc.message, "checksum") from None
        raise
    return params


def published(ctx, name, field):
    """The image published as ``name`` on the pool of ``ctx``, as machine_spec takes an image: {source (the
    name), checksum, url?, virtual_size, name}. Refused when the pool has no such name or lost its bits."""
    record = ctx.registry.get(image_key(name))
    if record is None:
        raise NotFoundError("no image named %r is published on pool %s; publish it with "
                            "machinery.compute.machine_image, or give a path or URL" % (name, ctx.name or ctx.uri),
                            field)
    image = {"source": name, "checksum": record["checksum"], "name": name,
             "virtual_size": record.get("virtual_size") or 0}
    if str(record.get("source", "")).startswith(("http://", "https://")):
        image["url"] = record["source"]
    else:
        vol, _fmt = images.cached_volume(ctx.storage, record["checksum"])
        if vol is None:
            raise NotFoundError("image %s is published on pool %s but its cached volume is gone; run "
                                "machinery.compute.machine_image again" % (name, ctx.name or ctx.uri), field)
    return image


def resolve(source, checksum, ctx, field, registry=None):
    """An image option of a machine or volume: a published name, a base volume on the pool host
    (``volume:<storage pool>/<volume>``), else a path or URL (images.resolve)."""
    if images.is_base_volume(source):
        if checksum:
            raise ValidationError("a base volume is used as it is; leave the checksum out", field + "_checksum")
        return images.resolve_base_volume(ctx.conn, source, field)
    if is_reference(source):
        if checksum:
            raise ValidationError("a published image is verified by its own checksum; leave it out",
                                  field + "_checksum")
        return published(ctx, source, field)
    return images.resolve(source, checksum, field, registry)

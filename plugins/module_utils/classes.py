# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Machine classes published on a pool: named sizes kept in the pool's registry."""

from __future__ import annotations

from ansible_collections.machinery.compute.plugins.module_utils import connection as lv
from ansible_collections.machinery.compute.plugins.module_utils import domain as dx
from ansible_collections.machinery.compute.plugins.module_utils import registry as reg
from ansible_collections.machinery.compute.plugins.module_utils import validation as check
from ansible_collections.machinery.compute.plugins.module_utils.errors import ConflictError, ValidationError
from ansible_collections.machinery.compute.plugins.module_utils.quantity import format_quantity


def shown(body):
    return None if body is None else {"name": body["name"], "cpu": body["cpu"],
                                      "memory": format_quantity(body["memory"])}


def machines_using(conn, name):
    users = []
    for dom in conn.listAllDomains(0):
        record = dx.read_record(dx.parse(dom.XMLDesc(lv.libvirt.VIR_DOMAIN_XML_INACTIVE)))
        if record and record.get("spec", {}).get("machine_class") == name:
            users.append(dom.name())
    return sorted(users)


def ensure_class(ctx, params, check_mode):
    """Publish or withdraw a class; returns (changed, before, after)."""
    name = check.dns_label(params.get("name"), "name")
    state = check.one_of(params.get("state") or "present", ("present", "absent"), "state")
    ctx.require_registration()
    registry = ctx.registry
    current = registry.machine_class(name)
    if state == "absent":
        if current is None:
            return False, None, None
        users = machines_using(ctx.conn, name)
        if users and not params.get("force"):
            raise ConflictError("class %s is still used by %d machine(s) on this pool: %s; set force: true to "
                                "delete it anyway" % (name, len(users), ", ".join(users)), "name")
        if not check_mode:
            registry.delete(reg.class_key(name))
        return True, shown(current), None
    if params.get("cpu") is None or params.get("memory") is None:
        raise ValidationError("cpu and memory are required to publish a class", "cpu" if params.get("cpu") is None
                              else "memory")
    desired = {"name": name, "cpu": check.cpu_count(params["cpu"], "cpu"),
               "memory": check.memory_bytes(params["memory"], "memory")}
    if current == desired:
        return False, shown(current), shown(current)
    if not check_mode:
        registry.put(reg.class_key(name), desired)
    return True, shown(current), shown(desired)

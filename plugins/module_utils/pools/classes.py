# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Machine classes published on a pool: named sizes kept in the pool's registry, converged through
observe -> plan -> apply."""

from __future__ import annotations

from ansible_collections.machinery.compute.plugins.module_utils.core import domain as dx
from ansible_collections.machinery.compute.plugins.module_utils.core import options
from ansible_collections.machinery.compute.plugins.module_utils.coordination import keys
from ansible_collections.machinery.compute.plugins.module_utils.core import validation as check
from ansible_collections.machinery.compute.plugins.module_utils.core.convergence import (
    Action, Plan, Resource, converge, step)
from ansible_collections.machinery.compute.plugins.module_utils.core.errors import ConflictError, ValidationError
from ansible_collections.machinery.compute.plugins.module_utils.core.quantity import format_quantity


def published_class(registry, name):
    """The class ``name`` published in ``registry`` (documents.Registry), or None."""
    return registry.get(keys.class_key(name), expected=True)


def published_classes(registry):
    """{name: body} of every class published in ``registry``."""
    found = {}
    for key in registry.keys(keys.CLASS_PREFIX):
        body = registry.get(key)
        if body is not None:
            found[body["name"]] = body
    return found


def shown(body):
    return None if body is None else {"name": body["name"], "cpu": body["cpu"],
                                      "memory": format_quantity(body["memory"])}


def machines_using(conn, name):
    users = []
    for dom, tree in dx.defined_domains(conn):
        record = dx.read_record(tree)
        if record and record.get("spec", {}).get("machine_class") == name:
            users.append(dom.name())
    return sorted(users)


def plan_class(params, current, users):
    """Publish or withdraw: pure, from the parameters, the published body and the machines using the class."""
    name = check.class_name(params.get("name"), "name")
    state = check.one_of(params.get("state") or "present", options.PRESENCE, "state")
    key = keys.class_key(name)
    if state == "absent":
        if current is None:
            return Plan()
        if users and not params.get("force"):
            raise ConflictError("class %s is still used by %d machine(s) on this pool: %s; set force: true to "
                                "delete it anyway" % (name, len(users), ", ".join(users)), "name")
        return Plan([Action("withdraw", name, shown(current), None, [step("delete_document", key)])])
    # cpu or memory left out keeps what the published class has; a new class needs both
    if current is None and (params.get("cpu") is None or params.get("memory") is None):
        raise ValidationError("cpu and memory are required to publish a new class",
                              "cpu" if params.get("cpu") is None else "memory")
    desired = {"name": name,
               "cpu": current["cpu"] if params.get("cpu") is None else check.cpu_amount(params["cpu"], "cpu"),
               "memory": current["memory"] if params.get("memory") is None
               else check.memory_bytes(params["memory"], "memory")}
    if current == desired:
        return Plan(published=desired)
    return Plan([Action("publish", name, shown(current), shown(desired), [step("write_document", key)],
                        body=desired)], published=desired)


class ClassResource(Resource):
    def __init__(self, ctx, params):
        self.ctx = ctx
        self.params = params
        self.name = check.class_name(params.get("name"), "name")
        self.generation = None  # of the class observed (compare and swap)

    def describe(self):
        return "machine class %s" % self.name

    def holds(self, plan, observed):
        """None: a class changes no machine."""
        return ()

    def observe(self):
        self.ctx.forget_reads()
        current = published_class(self.ctx.registry, self.name)
        self.generation = self.ctx.registry.read_generation(keys.class_key(self.name))
        absent = self.params.get("state") == "absent"
        return current, machines_using(self.ctx.conn, self.name) if absent and current is not None else []

    def plan(self, observed):
        return plan_class(self.params, *observed)

    def _publish(self, action, _observed):
        # compare and swap: written only over the class the plan was made from
        self.ctx.registry.put(keys.class_key(self.name), action.data["body"], expect=self.generation)

    def _withdraw(self, _action, _observed):
        self.ctx.registry.remove(keys.class_key(self.name))

    APPLY = {"publish": _publish, "withdraw": _withdraw}


def ensure_class(ctx, params, check_mode):
    """Publish or withdraw a class: (plan, the class as published after the run, or None)."""
    ctx.require_registration()
    plan, (current, _users) = converge(ClassResource(ctx, params), check_mode)
    if check_mode:
        current = plan.facts.get("published") if params.get("state") != "absent" else None
    return plan, shown(current)

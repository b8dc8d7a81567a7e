# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The one base class of the collection's modules: common options, one connection, errors as fail_json."""

from __future__ import annotations

import sys
import traceback

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.machinery.compute.plugins.module_utils.core import connection as lv
from ansible_collections.machinery.compute.plugins.module_utils.core import domain as dx
from ansible_collections.machinery.compute.plugins.module_utils.core import options
from ansible_collections.machinery.compute.plugins.module_utils.core.convergence import with_done
from ansible_collections.machinery.compute.plugins.module_utils.core.errors import MachineryError, ValidationError
from ansible_collections.machinery.compute.plugins.module_utils.core.frozen import thaw
from ansible_collections.machinery.compute.plugins.module_utils.machines.pool_context import PoolContext
from ansible_collections.machinery.compute.plugins.module_utils.coordination import writer
from ansible_collections.machinery.compute.plugins.module_utils.coordination.documents import DocumentChanged
from ansible_collections.machinery.compute.plugins.module_utils.coordination.holds import Coordination
from ansible_collections.machinery.compute.plugins.module_utils.fleets.fleet import pool_entries


def open_url(*args, **kwargs):
    """ansible-core's open_url, imported on the first download: ansible.module_utils.urls pulls in http, email and
    cryptography, a sixth of a module's start-up, and most runs download nothing."""
    from ansible.module_utils.urls import open_url as opener

    return opener(*args, **kwargs)


# The common options of the action group machinery.compute.machinery. Every member takes them, because
# module_defaults of the group gives them to every member and a module fails on an option it does not know.
COMMON_ARGS = options.argument_spec(options.COMMON)
MULTI_POOL_ARGS = options.argument_spec(options.MULTI_POOL)


# how many times a run converges when registry documents keep changing under its compare-and-swap writes
CONFLICT_ATTEMPTS = 3


def done_before(exc):
    """The return keys of a failure that had changed things first: ``changed`` and ``done`` (what it did)."""
    done = list(getattr(exc, "done", None) or [])
    return {"changed": True, "done": done} if done else {}


class MachineryModule:
    """Subclasses set ``argument_spec`` (and ``module_kwargs``) and implement ``run(ctx)`` returning a dict.

    A module that talks to several pools itself sets ``multi_pool = True``: it takes ``pools`` beside ``uri`` and
    implements ``run_pools(entries)`` instead, the pools as [{name, uri}] (the one at ``uri`` when ``pools`` is not
    given).
    A result with ``failed`` set is returned through fail_json, data included."""

    argument_spec = {}
    module_kwargs = {}
    multi_pool = False

    def __init__(self):
        spec = dict(MULTI_POOL_ARGS if self.multi_pool else COMMON_ARGS)
        spec.update(self.argument_spec)
        self.module = AnsibleModule(argument_spec=spec, supports_check_mode=True, **self.module_kwargs)
        self.params = self.module.params
        self.check_mode = self.module.check_mode
        self.coordination = None  # the run's holds on machines (coordination/holds.py), built in __call__

    def operation(self):
        """The name a hold of this run shows its waiters: the module's short name (machine_snapshot). Ansible
        names the module to AnsibleModule; a module run without Ansible (python -m, as the lab tests do) keeps
        AnsibleModule's placeholder ("basic.py") and is named by the Python module it was run as."""
        name = getattr(self.module, "_name", None) or ""
        if not name or name.endswith(".py"):
            spec = getattr(sys.modules.get(type(self).__module__), "__spec__", None)
            name = spec.name if spec is not None else type(self).__module__
        return name.rsplit(".", 1)[-1]

    def pool_entries(self):
        """The pools of a multi-pool module: ``pools``, else the one at ``uri``, else an error naming ``pools``."""
        if self.params["pools"] is not None:
            return pool_entries(self.params["pools"])
        if self.params["uri"]:
            return [{"name": None, "uri": lv.validate_uri(self.params["uri"], "uri")}]
        raise ValidationError("give the pools as libvirt URIs or mappings with name and uri, or uri for one pool "
                              "(for example with module_defaults of group/machinery.compute.machinery)", "pools")

    @staticmethod
    def url_opener():
        return open_url

    def diff(self, before, after):
        return {"before": before, "after": after} if self.module._diff else None

    def __call__(self):
        if not lv.HAS_LIBVIRT:
            self.module.fail_json(msg=missing_required_lib("libvirt-python"), exception=str(lv.LIBVIRT_IMPORT_ERROR))
        if not dx.HAS_LXML:
            self.module.fail_json(msg=missing_required_lib("lxml"))
        where = "the pools" if self.multi_pool else self.params["uri"]
        try:
            lv.require_libvirt()
            lv.remember_failed_opens()  # this process is one run: a pool that failed to open is not tried again
            option = options.option(options.COMMON, "hold_timeout")
            self.coordination = Coordination(self.operation(),
                                             option.check(self.params["hold_timeout"], "hold_timeout"))
            writer.bind(self.coordination)  # every write of this run checks its holds first
            result, retried = self.run_retrying_conflicts()
        except MachineryError as exc:
            self.module.fail_json(msg=with_done(str(exc), exc.done), field=exc.field, reason=exc.reason,
                                  **dict(getattr(exc, "details", None) or {}, **done_before(exc)))
        except lv.libvirt.libvirtError as exc:
            self.module.fail_json(msg=with_done("libvirt error on %s: %s" % (where, lv.describe(exc)),
                                                getattr(exc, "done", None)),
                                  reason="LibvirtError", exception=traceback.format_exc(), **done_before(exc))
        # what leaves the module is plain: ansible-core before 2.17 rebuilds each container of the result as an
        # empty one of its own type and fills it, which a frozen spec inside a status or plan refuses
        result = outgoing(result)
        if result.get("diff") is None:
            result.pop("diff", None)
        for warning in retried + result.pop("warnings", []):
            self.module.warn(warning)
        if result.pop("failed", False):
            self.module.fail_json(**result)
        self.module.exit_json(**result)

    def run_once(self):
        if self.multi_pool:
            return self.run_pools(self.pool_entries())
        with lv.Connection(self.params["uri"]) as conn:
            ctx = PoolContext(conn, self.params["uri"], self.coordination)
            ctx.url_opener = open_url
            return self.run(ctx)

    def run_retrying_conflicts(self):
        """The run's result, and a warning for each time it ran again: a registry document that changed under a
        compare-and-swap write (DocumentChanged) before the run changed anything else is read again and the whole
        run converges afresh from it, up to CONFLICT_ATTEMPTS times (Kubernetes' RetryOnConflict). A conflict after
        the run changed something is reported, with what it did."""
        retried = []
        while True:
            try:
                return self.run_once(), retried
            except DocumentChanged as exc:
                if getattr(exc, "done", None) or len(retried) + 1 == CONFLICT_ATTEMPTS:
                    raise
                retried.append("%s; ran again from the new document (attempt %d of %d)"
                               % (exc.message, len(retried) + 2, CONFLICT_ATTEMPTS))

    def hide_secrets(self, machine):
        """Mask the secrets of a machine's options given inside another option (a batch's machines, a set's
        template), as Ansible masks a no_log option of the machine module: each string of them is hidden
        wherever it would appear in the output. Strings under 4 characters are not: masking every '1' or
        'yes' would hide far more than it protects."""
        for path in options.secret_paths(options.MACHINE):
            values = [machine]
            for key in path:  # a list on the way (volumes[].passphrase) is walked item by item
                values = [item for value in values for item in (value if isinstance(value, list) else [value])]
                values = [value.get(key) for value in values if isinstance(value, dict)]
            for value in values:
                if value is not None:
                    self.module.no_log_values.update(text for text in _strings(value) if len(text) >= 4)

    def converged(self, plan, **returned):
        """The return of a converging module: ``changed``, ``actions`` (short forms such as ``create``),
        ``plan`` (each action with its target, fields before and after, and libvirt steps) and ``diff`` all come
        from the plan, so a check-mode run returns exactly what the real run will do."""
        before, after = plan.diff()
        warnings = returned.pop("warnings", None)
        result = dict(returned, changed=plan.changed, actions=plan.summaries(), plan=plan.as_list(),
                      diff=self.diff(before, after) if plan.changed else None)
        result["warnings"] = list(plan.warnings) if warnings is None else list(warnings)
        return result

    def attachment_result(self, result, key):
        """The return of volume_attach and nic_attach: the attachment under ``key`` and the machine."""
        return {"changed": result["changed"], key: result[key], "machine": result["machine"],
                "warnings": result["warnings"], "actions": result["actions"], "plan": result["plan"],
                "diff": self.diff(result["before"], result["after"]) if result["changed"] else None}

    def run(self, ctx):
        """The work of a module on one pool, ``ctx`` its PoolContext."""
        raise NotImplementedError

    def run_pools(self, entries):
        """The work of a ``multi_pool`` module, ``entries`` its pools as [{name, uri}]."""
        raise NotImplementedError


def _strings(value):
    """Every string leaf of a value (dicts, lists, scalars)."""
    if isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)
    elif value is not None:
        yield str(value)


def outgoing(result):
    """A module's result as Ansible takes it: plain dicts and lists all the way down, nothing frozen."""
    return thaw(result)

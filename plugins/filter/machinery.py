# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

from ansible.errors import AnsibleFilterError

from ansible_collections.machinery.compute.plugins.module_utils.core.errors import MachineryError
from ansible_collections.machinery.compute.plugins.module_utils.fleets import drivers
from ansible_collections.machinery.compute.plugins.module_utils.machines.machine_status import table
from ansible_collections.machinery.compute.plugins.module_utils.core.quantity import format_quantity, parse_quantity


def to_bytes_quantity(value):
    try:
        return parse_quantity(value, field="value", minimum=0)
    except MachineryError as exc:
        raise AnsibleFilterError("quantity: %s" % exc) from None


def to_quantity(value):
    try:
        return format_quantity(int(value))
    except (TypeError, ValueError) as exc:
        raise AnsibleFilterError("to_quantity: %s" % exc) from None


def pool_uri(pool):
    if isinstance(pool, str):
        return pool
    if isinstance(pool, dict) and pool.get("uri"):
        return pool["uri"]
    raise AnsibleFilterError("pool_uri expects a libvirt URI or a mapping with uri, got %r" % (pool,))


def driven_by(machines, pool, pools):
    try:
        return drivers.driven_by(machines, pool, pools)
    except MachineryError as exc:
        raise AnsibleFilterError("driven_by: %s" % exc) from None


def machine_table(machines):
    if not isinstance(machines, list):
        raise AnsibleFilterError("machine_table expects a list of machines")
    return table(sorted(machines, key=lambda machine: (machine.get("pool") or "", machine["name"])))


class FilterModule:
    def filters(self):
        return {"quantity": to_bytes_quantity, "to_quantity": to_quantity, "machine_table": machine_table,
                "pool_uri": pool_uri, "driven_by": driven_by}

# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The one switch for manifest fields whose machine option may not exist yet.

The capabilities issue adds options to ``machine`` (topology, swap, per-NIC ip_address and security_groups,
per-volume iops, throughput, encrypted and passphrase). The dialects check those fields in full and translate
them to exactly those option names; here a translated value is refused while options.py does not declare its
option, naming the document's field. Once the option is declared, the same documents pass untouched.
"""

from __future__ import annotations

from ansible_collections.machinery.compute.plugins.module_utils.core import options

LIST_OPTIONS = ("volumes", "network_interfaces")


def machine_accepts(path):
    """True when options.MACHINE declares the option at ``path`` (("topology",), ("volumes", "iops"), ...)."""
    table = options.MACHINE
    for name in path:
        found = next((item for item in table if item.name == name), None)
        if found is None:
            return False
        table = found.options or ()
    return True


def _is_set(params, path):
    head, rest = path[0], path[1:]
    value = params.get(head)
    if not rest:
        return value not in (None, False, [], {}, 0)
    if head in LIST_OPTIONS:
        return any(_is_set(item, rest) for item in value or [] if isinstance(item, dict))
    return isinstance(value, dict) and _is_set(value, rest)


def refuse_pending(fields, params, paths):
    """Record a problem for each field of ``paths`` ({option path: the document's field}) that is set while the
    machine module lacks its option."""
    for path, shown in paths.items():
        if _is_set(params, path) and not machine_accepts(path):
            fields.error(shown, "not supported yet: machinery.compute.machine has no option %s in this version"
                         % ".".join(path))

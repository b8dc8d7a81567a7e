# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A machine's power and its record while it runs: graceful shutdown with a deadline, boots counted in the record."""

from __future__ import annotations

import time

from ansible_collections.machinery.compute.plugins.module_utils.core import connection as lv
from ansible_collections.machinery.compute.plugins.module_utils.core import domain as dx
from ansible_collections.machinery.compute.plugins.module_utils.coordination import writer


def bump_boots(record):
    record["boots"] = int(record.get("boots") or 0) + 1
    record["last_error"] = None


def update_record(dom, change):
    """Change the record of ``dom`` in its persistent and (when it runs) live metadata."""
    tree = dx.parse(dom.XMLDesc(lv.libvirt.VIR_DOMAIN_XML_INACTIVE))
    record = dx.read_record(tree)
    if record is None:
        return
    change(record)
    flags = lv.libvirt.VIR_DOMAIN_AFFECT_CONFIG
    if dom.isActive():
        flags |= lv.libvirt.VIR_DOMAIN_AFFECT_LIVE
    writer.write(dom, "setMetadata", lv.libvirt.VIR_DOMAIN_METADATA_ELEMENT, dx.record_xml(record), dx.PREFIX, dx.NAMESPACE, flags)


def shutdown(dom, timeout):
    """ACPI power button, repeated every few seconds; destroy after ``timeout``. True when forced."""
    deadline = time.monotonic() + float(timeout)
    last_request = 0.0
    while dom.isActive():
        if time.monotonic() > deadline:
            try:
                writer.write(dom, "destroy")
            except lv.libvirt.libvirtError:
                if dom.isActive():
                    raise
            return True
        if time.monotonic() - last_request > 5:
            try:
                writer.write(dom, "shutdownFlags", lv.libvirt.VIR_DOMAIN_SHUTDOWN_ACPI_POWER_BTN)
            except lv.libvirt.libvirtError:
                if not dom.isActive():
                    break
            last_request = time.monotonic()
        time.sleep(0.2)
    return False

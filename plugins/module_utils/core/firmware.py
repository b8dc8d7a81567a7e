# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Devices a machine's firmware and OS trust: the emulated TPM 2.0, read from and written to the domain XML.

The TPM is QEMU's CRB interface (the one q35 guests and Windows 11 expect) backed by swtpm, which libvirt starts
with the domain and whose state libvirt keeps with the domain (per UUID on the pool host): it lives as long as the
domain is defined, a live migration carries it in QEMU's migration stream, and undefining removes it.
"""

from __future__ import annotations

from lxml import etree

TPM_MODEL = "tpm-crb"
TPM_VERSION = "2.0"


def read_tpm(tree, _record=None):
    """True when the domain has an emulated TPM."""
    return tree.find("devices/tpm/backend[@type='emulator']") is not None


def write_tpm(tree, record, value):
    """Add (an emulated TPM 2.0 on CRB) or remove the TPM; one already there is left as libvirt completed it."""
    if value:
        record["spec"]["tpm"] = True
    else:  # the record of a machine without one stays as it always was
        record["spec"].pop("tpm", None)
    devices = tree.find("devices")
    present = devices.findall("tpm")
    if value and not any(node.find("backend[@type='emulator']") is not None for node in present):
        node = etree.SubElement(devices, "tpm", model=TPM_MODEL)
        etree.SubElement(node, "backend", type="emulator", version=TPM_VERSION)
    elif not value:
        for node in present:
            devices.remove(node)

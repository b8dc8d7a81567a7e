# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What a machine's firmware and OS trust: the emulated TPM 2.0 and UEFI Secure Boot, read from and written to the
domain XML.

The TPM is QEMU's CRB interface (the one q35 guests and Windows 11 expect) backed by swtpm, which libvirt starts
with the domain and whose state libvirt keeps with the domain (per UUID on the pool host): it lives as long as the
domain is defined, a live migration carries it in QEMU's migration stream, and undefining removes it.

Secure Boot goes through libvirt's firmware auto-selection: the features ``secure-boot`` and ``enrolled-keys``
make it pick the distribution's OVMF build with Microsoft's and the distribution's keys enrolled (on Debian
OVMF_CODE_4M.ms.fd, its variables from OVMF_VARS_4M.ms.fd); it needs SMM, which is turned on with it.
"""

from __future__ import annotations

try:
    from lxml import etree
except ImportError:  # reported by the module base with a pointer to the package
    etree = None

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


def start_failure_option(tree, libvirt_message):
    """The option behind a failed start, when libvirt's message shows it: ``tpm`` when the domain has an emulated
    TPM and swtpm (or its setup) failed, with what to check on the pool host; else (None, "")."""
    if read_tpm(tree) and "swtpm" in libvirt_message:
        return "tpm", (" (the pool host's swtpm could not set up or run the machine's TPM: swtpm and swtpm-tools "
                       "installed, and the local CA of /etc/swtpm-localca.conf writable by libvirt's swtpm_user? "
                       "swtpm's log is named above)")
    return None, ""


def read_secure_boot(tree, _record=None):
    """True when the domain asks its firmware for Secure Boot."""
    return tree.find("os/firmware/feature[@name='secure-boot'][@enabled='yes']") is not None


def write_secure_boot(tree, record, value):
    """Ask the UEFI firmware for Secure Boot with enrolled keys (and SMM), or leave the firmware's choice alone."""
    os_node = tree.find("os")
    if not value:
        record["spec"].pop("secure_boot", None)
        return
    record["spec"]["secure_boot"] = True
    node = os_node.find("firmware")
    if node is None:
        node = etree.SubElement(os_node, "firmware")
    for name in ("secure-boot", "enrolled-keys"):
        feature = node.find("feature[@name='%s']" % name)
        if feature is None:
            feature = etree.SubElement(node, "feature", name=name)
        feature.set("enabled", "yes")
    features = tree.find("features")
    if features is None:
        features = etree.SubElement(tree, "features")
    smm = features.find("smm")
    if smm is None:
        smm = etree.SubElement(features, "smm")
    smm.set("state", "on")


def secure_boot_firmware(domain_capabilities_xml):
    """Whether a pool's domain capabilities offer UEFI firmware that can do Secure Boot."""
    tree = etree.fromstring(domain_capabilities_xml.encode() if isinstance(domain_capabilities_xml, str)
                            else domain_capabilities_xml)
    efi = "efi" in [value.text for value in tree.findall("os/enum[@name='firmware']/value")]
    secure = "yes" in [value.text for value in tree.findall("os/loader/enum[@name='secure']/value")]
    return efi and secure


def nvram_volume(machine):
    """The volume of the pool's storage that keeps a UEFI machine's variables."""
    return "%s-nvram.fd" % machine


def place_nvram(tree, path):
    """Keep a UEFI machine's variables at ``path`` (a volume of the pool's storage) instead of libvirt's own
    directory, so that moving the machine's volumes moves them too; libvirt fills it from the firmware's
    variables template at the first start. A BIOS machine is left alone."""
    os_node = tree.find("os")
    if os_node.get("firmware") != "efi":
        return
    node = os_node.find("nvram")
    if node is None:
        node = etree.SubElement(os_node, "nvram")
    node.text = path


def stored_nvram(tree, storage_dir):
    """The volume name of a UEFI machine's variables when they are kept in the pool's storage (place_nvram)."""
    path = (tree.findtext("os/nvram") or "").strip()
    prefix = (storage_dir or "").rstrip("/") + "/"
    return path[len(prefix):] if path.startswith(prefix) and "/" not in path[len(prefix):] else None

# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The emulated TPM in the domain XML, and a failed start blamed on it only when libvirt's message says swtpm."""

from __future__ import annotations

from lxml import etree

from ansible_collections.machinery.compute.plugins.module_utils.core import firmware as fw

SWTPM_FAILED = ("internal error: Could not run '/usr/bin/swtpm_setup'. exitstatus: 1; Check error log "
                "'/var/log/swtpm/libvirt/qemu/web-1-swtpm.log' for details.")


def domain(tpm):
    tree = etree.fromstring("<domain type='kvm'><name>web-1</name><devices/></domain>")
    fw.write_tpm(tree, {"spec": {}}, tpm)
    return tree


def test_tpm_written_and_read():
    tree = domain(True)
    assert fw.read_tpm(tree)
    node = tree.find("devices/tpm")
    assert (node.get("model"), node.find("backend").get("type"), node.find("backend").get("version")) == (
        "tpm-crb", "emulator", "2.0")
    fw.write_tpm(tree, {"spec": {"tpm": True}}, False)
    assert not fw.read_tpm(tree) and tree.find("devices/tpm") is None


def test_a_failed_swtpm_names_the_tpm_option():
    field, hint = fw.start_failure_option(domain(True), SWTPM_FAILED)
    assert field == "tpm"
    assert "swtpm-tools" in hint and "swtpm_user" in hint


def test_other_failures_name_no_option():
    assert fw.start_failure_option(domain(True), "internal error: process exited while connecting to monitor") == (
        None, "")
    assert fw.start_failure_option(domain(False), SWTPM_FAILED) == (None, "")

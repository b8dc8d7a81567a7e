# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The options of one machine, shared by the machine module and each element of machine_batch's machines."""

from __future__ import annotations

MACHINE_ARGUMENT_SPEC = dict(
    name=dict(type="str", required=True),
    state=dict(type="str", choices=["running", "stopped", "present", "absent"], default="running"),
    machine_class=dict(type="str"),
    cpu=dict(type="int"),
    memory=dict(type="raw"),
    image=dict(type="str"),
    image_checksum=dict(type="str"),
    root_size=dict(type="raw"),
    volumes=dict(type="list", elements="dict", options=dict(
        name=dict(type="str", required=True),
        size=dict(type="raw"),
        volume=dict(type="str"),
        image=dict(type="str"),
        image_checksum=dict(type="str"),
        device=dict(type="str"),
        bus=dict(type="str", choices=["virtio", "scsi", "sata"], default="virtio"),
        ephemeral=dict(type="bool"),
    )),
    network_interfaces=dict(type="list", elements="dict", options=dict(
        name=dict(type="str", required=True),
        network=dict(type="str"),
        bridge=dict(type="str"),
        mac=dict(type="str"),
        model=dict(type="str", choices=["virtio", "e1000e", "rtl8139"], default="virtio"),
        ephemeral=dict(type="bool", default=True),
    )),
    ignition=dict(type="raw", no_log=True),
    cloud_init=dict(type="dict", options=dict(
        user_data=dict(type="raw", no_log=True),
        meta_data=dict(type="raw"),
        network_config=dict(type="raw"),
    )),
    ssh_authorized_keys=dict(type="list", elements="str", no_log=False),
    labels=dict(type="dict"),
    firmware=dict(type="str", choices=["bios", "uefi"]),
    virt_type=dict(type="str", choices=["auto", "kvm", "qemu"], default="auto"),
    wait=dict(type="str", choices=["none", "running", "address"], default="running"),
    wait_timeout=dict(type="int", default=300),
    shutdown_timeout=dict(type="int", default=60),
    adopt=dict(type="bool", default=False),
    unique_across=dict(type="list", elements="str"),
)

# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
name: guest_agent
short_description: Run tasks inside a machine through its QEMU guest agent
version_added: 0.2.0
author: machinery.compute contributors (@machinery)
description:
  - Runs commands and moves files inside a libvirt domain through the QEMU guest agent (C(guest-exec),
    C(guest-file-*)), over the libvirt connection of the machine's pool. The machine needs no network path from
    the controller, no SSH server and no account, only a running guest agent.
  - The pool and the domain come from the host's variables. The P(machinery.compute.machines#inventory) inventory sets them
    for every machine (C(machinery_uri), C(machinery_domain)), so C(ansible_connection=machinery.compute.guest_agent)
    is the only setting a play needs.
  - Commands run as the user the agent runs as (root on common distributions) through C(/bin/sh -c). Modules need a
    Python in the guest like with any other connection (cloud images of Debian, Ubuntu, Fedora and RHEL have one);
    C(ansible.builtin.raw) needs only a shell, and is all that works on an image without Python such as the lab's
    busybox test image.
  - Every libvirt URI works (C(qemu+ssh://), C(qemu+tls://), a local socket); the agent's channel is the only path
    into the guest.
extends_documentation_fragment:
  - connection_pipelining
requirements:
  - libvirt-python on the controller
  - a running QEMU guest agent in the machine, on the channel C(org.qemu.guest_agent.0), with C(guest-exec) and the
    C(guest-file-*) commands allowed
options:
  uri:
    description:
      - The libvirt URI of the machine's pool.
    type: str
    default: qemu:///system
    vars:
      - name: machinery_uri
      - name: ansible_machinery_uri
    env:
      - name: MACHINERY_URI
  domain:
    description:
      - The name (or UUID) of the machine's libvirt domain. Without C(machinery_domain), the inventory hostname.
    type: str
    vars:
      - name: inventory_hostname
      - name: machinery_domain
      - name: ansible_machinery_domain
  agent_timeout:
    description:
      - Seconds one guest agent request may take before the machine counts as unreachable.
    type: int
    default: 30
    vars:
      - name: ansible_machinery_agent_timeout
  command_timeout:
    description:
      - Seconds a command may run in the guest before the task fails; V(0) waits as long as it takes.
      - The command is not stopped in the guest when the time is up.
    type: int
    default: 0
    vars:
      - name: ansible_machinery_command_timeout
notes:
  - The guest agent buffers a command's output in the guest's memory until the command ends and gives at most
    16 MiB of each stream; a longer output ends with a note that it was truncated.
  - Files are copied in chunks of 64 KiB, one agent request each.
  - C(become) works with methods that need no password (for example C(sudo) with NOPASSWD); the agent has no
    terminal to answer a password prompt.
"""

EXAMPLES = r"""
# inventory: fleet.machinery.yml
#   plugin: machinery.compute.machines
#   pools: [{name: hv1, uri: qemu+ssh://root@hv1/system}]

- name: Configure machines that have no address the controller can reach
  hosts: machinery_pool_hv1
  gather_facts: false
  vars:
    ansible_connection: machinery.compute.guest_agent
  tasks:
    - name: Ask the kernel
      ansible.builtin.command: uname -r
      changed_when: false

    - name: Put a file in place
      ansible.builtin.copy:
        content: "configured through the guest agent\n"
        dest: /etc/motd
        mode: "0644"

# ad hoc, one machine, without the inventory plugin:
#   ansible all -i web-1, -c machinery.compute.guest_agent -e machinery_uri=qemu+ssh://root@hv1/system -m ping
"""

import os

from ansible.errors import AnsibleConnectionFailure, AnsibleError, AnsibleFileNotFound
from ansible.module_utils.common.text.converters import to_bytes, to_native
from ansible.plugins.connection import ConnectionBase
from ansible.utils.display import Display

from ansible_collections.machinery.compute.plugins.module_utils.core import connection as lv
from ansible_collections.machinery.compute.plugins.module_utils.machines import guest

display = Display()

SHELL = "/bin/sh"
# The agent starts programs with its own environment, which under systemd has no HOME: Ansible's remote temporary
# directory (~/.ansible/tmp) would then be a relative path. Give the shell the home of the user it runs as.
HOME = '[ -n "$HOME" ] || HOME=$(awk -F: -v uid="$(id -u)" \'$3 == uid { print $6; exit }\' /etc/passwd); export HOME\n'


class Connection(ConnectionBase):
    """A connection into one machine through its guest agent, over its pool's libvirt connection."""

    transport = "machinery.compute.guest_agent"
    has_pipelining = True
    has_tty = False

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._conn = None
        self._agent = None

    def _connect(self):
        if self._connected:
            return self
        if not lv.HAS_LIBVIRT or guest.libvirt_qemu is None:
            raise AnsibleError("the machinery.compute.guest_agent connection needs libvirt-python on the "
                               "controller: %s" % lv.LIBVIRT_IMPORT_ERROR)
        uri = self.get_option("uri")
        name = self.get_option("domain")
        if not name:
            raise AnsibleConnectionFailure("machinery.compute.guest_agent: no domain name (set machinery_domain)")
        lv.require_libvirt()
        try:
            self._conn = lv.libvirt.open(uri)
        except lv.libvirt.libvirtError as exc:
            raise AnsibleConnectionFailure("machinery.compute.guest_agent: cannot connect to %s: %s"
                                           % (uri, lv.describe(exc))) from None
        dom = self._find(name)
        if not dom.isActive():
            self.close()
            raise AnsibleConnectionFailure("machinery.compute.guest_agent: machine %s on %s is not running"
                                           % (name, uri))
        self._agent = guest.Agent(dom, timeout=self.get_option("agent_timeout"))
        display.vvv("GUEST AGENT: machine %s on %s" % (name, uri), host=name)
        self._connected = True
        return self

    def _find(self, name):
        for lookup in (self._conn.lookupByName, self._conn.lookupByUUIDString):
            try:
                return lookup(name)
            except lv.libvirt.libvirtError:
                continue
        uri = self.get_option("uri")
        self.close()
        raise AnsibleConnectionFailure("machinery.compute.guest_agent: no machine %s on %s" % (name, uri))

    def _failure(self, exc):
        return AnsibleConnectionFailure("machinery.compute.guest_agent: machine %s: %s"
                                        % (self.get_option("domain"), to_native(exc)))

    def exec_command(self, cmd, in_data=None, sudoable=True):
        super().exec_command(cmd, in_data=in_data, sudoable=sudoable)
        self._connect()
        display.vvv("EXEC %s" % cmd, host=self.get_option("domain"))
        timeout = self.get_option("command_timeout") or None
        try:
            return self._agent.run(SHELL, ["-c", HOME + cmd], stdin=in_data, timeout=timeout)
        except guest.AgentError as exc:
            raise self._failure(exc) from None

    def put_file(self, in_path, out_path):
        super().put_file(in_path, out_path)
        self._connect()
        display.vvv("PUT %s TO %s" % (in_path, out_path), host=self.get_option("domain"))
        if not os.path.exists(to_bytes(in_path, errors="surrogate_or_strict")):
            raise AnsibleFileNotFound("file or module does not exist: %s" % in_path)
        with open(to_bytes(in_path, errors="surrogate_or_strict"), "rb") as handle:
            data = handle.read()
        try:
            self._agent.write_file(out_path, data)
        except guest.AgentError as exc:
            raise self._failure(exc) from None

    def fetch_file(self, in_path, out_path):
        super().fetch_file(in_path, out_path)
        self._connect()
        display.vvv("FETCH %s TO %s" % (in_path, out_path), host=self.get_option("domain"))
        try:
            data = self._agent.read_file(in_path)
        except guest.AgentError as exc:
            raise self._failure(exc) from None
        with open(to_bytes(out_path, errors="surrogate_or_strict"), "wb") as handle:
            handle.write(data)

    def reset(self):
        self.close()

    def close(self):
        self._agent = None
        if self._conn is not None:
            try:
                self._conn.close()
            except lv.libvirt.libvirtError:
                pass
            self._conn = None
        self._connected = False

# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What a machine says about itself through the QEMU guest agent, read over the pool's libvirt connection.

libvirt asks the agent itself (virDomainGetGuestInfo for hostname, OS and time zone, virDomainInterfaceAddresses
for the addresses); the boot time, which no libvirt call returns, is read from the guest's /proc/stat through
the agent's file commands. Everything here is cheap to skip: a machine whose agent channel is not connected
(the live domain XML says so) is never asked.

The same agent protocol runs commands and moves files for the guest_agent connection plugin (``Agent``).
"""

from __future__ import annotations

import base64
import datetime
import json
import time

from ansible_collections.machinery.compute.plugins.module_utils.core import connection as lv
from ansible_collections.machinery.compute.plugins.module_utils.core.domain import GUEST_AGENT

try:
    import libvirt_qemu
except ImportError:  # the callers check connection.HAS_LIBVIRT first; libvirt_qemu ships with it
    libvirt_qemu = None

# Seconds one agent command may take before it counts as unanswered (the agent of a busy TCG guest is slow).
COMMAND_TIMEOUT = 5
# Bytes moved per guest-file-read/guest-file-write: the agent's JSON messages carry them base64 encoded (a write
# of 256 KiB already makes libvirt give up on the agent of a lab guest; 128 KiB passed).
FILE_CHUNK = 64 * 1024
_PROC_STAT = "/proc/stat"


class AgentError(Exception):
    """The agent did not answer, or answered with an error: the message says which command and why."""


def agent_connected(live_tree):
    """True when the guest has opened the agent's virtio-serial port (libvirt marks the channel's target
    ``state='connected'`` in the live XML): an agent runs inside."""
    for target in live_tree.iterfind("devices/channel/target"):
        if target.get("name") == GUEST_AGENT:
            return target.get("state") == "connected"
    return False


class Agent:
    """The guest agent of one running domain, spoken to in its own JSON protocol through libvirt."""

    def __init__(self, dom, timeout=COMMAND_TIMEOUT):
        self.dom = dom
        self.timeout = timeout

    def command(self, execute, timeout=None, **arguments):
        request = {"execute": execute}
        if arguments:
            request["arguments"] = arguments
        if libvirt_qemu is None:
            raise AgentError("the libvirt_qemu module of libvirt-python is missing")
        try:
            reply = libvirt_qemu.qemuAgentCommand(self.dom, json.dumps(request), int(timeout or self.timeout), 0)
        except lv.libvirt.libvirtError as exc:
            raise AgentError("%s: %s" % (execute, lv.describe(exc))) from None
        try:
            answer = json.loads(reply)
        except (TypeError, ValueError):
            raise AgentError("%s: the agent's reply is not JSON: %r" % (execute, reply)) from None
        if "error" in answer:
            raise AgentError("%s: %s" % (execute, answer["error"].get("desc") or answer["error"]))
        return answer.get("return")

    # --- files ----------------------------------------------------------------------------------------------

    def read_file(self, path, limit=None):
        """The bytes of a file in the guest (at most ``limit`` bytes when given)."""
        handle = self.command("guest-file-open", path=path, mode="rb")
        chunks = []
        size = 0
        try:
            while limit is None or size < limit:
                count = FILE_CHUNK if limit is None else min(FILE_CHUNK, limit - size)
                part = self.command("guest-file-read", handle=handle, count=count)
                data = base64.b64decode(part.get("buf-b64") or "")
                chunks.append(data)
                size += len(data)
                if part.get("eof") or not data:
                    break
        finally:
            self.close(handle)
        return b"".join(chunks)

    def write_file(self, path, data):
        """Write ``data`` (bytes) to a file in the guest, replacing it."""
        handle = self.command("guest-file-open", path=path, mode="wb")
        try:
            for start in range(0, len(data), FILE_CHUNK):
                piece = data[start:start + FILE_CHUNK]
                written = self.command("guest-file-write", handle=handle,
                                       **{"buf-b64": base64.b64encode(piece).decode("ascii")})
                if (written or {}).get("count") != len(piece):
                    raise AgentError("guest-file-write: %s: wrote %s of %d bytes"
                                     % (path, (written or {}).get("count"), len(piece)))
            self.command("guest-file-flush", handle=handle)
        finally:
            self.close(handle)

    def close(self, handle):
        try:
            self.command("guest-file-close", handle=handle)
        except AgentError:
            pass

    # --- commands -------------------------------------------------------------------------------------------

    def run(self, path, args=(), stdin=None, timeout=None, poll=0.05):
        """Run a program in the guest and wait for it: (exit code, stdout bytes, stderr bytes).

        ``timeout`` (seconds, None for no limit) bounds the wait; the program is not killed when it passes."""
        arguments = {"path": path, "arg": list(args), "capture-output": True}
        if stdin is not None:
            arguments["input-data"] = base64.b64encode(stdin).decode("ascii")
        pid = self.command("guest-exec", **arguments)["pid"]
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            status = self.command("guest-exec-status", pid=pid)
            if status.get("exited"):
                break
            if deadline is not None and time.monotonic() > deadline:
                raise AgentError("guest-exec: %s did not finish within %s s (pid %s in the guest)"
                                 % (path, timeout, pid))
            time.sleep(poll)
            poll = min(poll * 2, 0.5)
        if "exitcode" in status:
            code = status["exitcode"]
        else:  # killed by a signal: the shell's convention
            code = 128 + int(status.get("signal") or 0)
        out = base64.b64decode(status.get("out-data") or "")
        err = base64.b64decode(status.get("err-data") or "")
        if status.get("out-truncated") or status.get("err-truncated"):
            err += b"\n[the guest agent truncated the output]"
        return code, out, err


# --- facts ----------------------------------------------------------------------------------------------------

def _boot_time(agent):
    """When the guest booted (UTC, ISO 8601), from btime in its /proc/stat; None when the agent will not say."""
    try:
        text = agent.read_file(_PROC_STAT, limit=64 * 1024).decode("ascii", errors="replace")
    except AgentError:
        return None
    for line in text.splitlines():
        if line.startswith("btime "):
            try:
                seconds = int(line.split()[1])
            except (IndexError, ValueError):
                return None
            return datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc).isoformat()
    return None


def _interfaces(dom):
    """[{name, mac, addresses: [{address, prefix, family}]}] as the guest sees its own interfaces."""
    found = dom.interfaceAddresses(lv.libvirt.VIR_DOMAIN_INTERFACE_ADDRESSES_SRC_AGENT, 0)
    families = {lv.libvirt.VIR_IP_ADDR_TYPE_IPV4: "ipv4", lv.libvirt.VIR_IP_ADDR_TYPE_IPV6: "ipv6"}
    interfaces = []
    for name in sorted(found):
        nic = found[name]
        interfaces.append({
            "name": name,
            "mac": (nic.get("hwaddr") or "").lower() or None,
            "addresses": [{"address": entry["addr"], "prefix": entry.get("prefix"),
                           "family": families.get(entry.get("type"), "unknown")}
                          for entry in nic.get("addrs") or [] if entry.get("addr")],
        })
    return interfaces


def routable_addresses(interfaces):
    """The guest's addresses that another host could use: no loopback, no link-local; IPv4 first."""
    addresses = [entry for nic in interfaces if nic["name"] != "lo" for entry in nic["addresses"]
                 if not entry["address"].startswith(("127.", "169.254.")) and entry["address"] != "::1"
                 and not entry["address"].lower().startswith("fe80")]
    addresses.sort(key=lambda entry: entry["family"] != "ipv4")
    return [entry["address"] for entry in addresses]


def guest_facts(dom):
    """The ``guest`` status of a running machine whose agent channel is connected, or None when the agent
    answers nothing. Parts the agent refuses (a command it disables) are None; ``agent_errors`` says why."""
    facts = {"hostname": None, "os": None, "kernel": None, "timezone": None, "boot_time": None,
             "interfaces": None}
    errors = []
    answered = False
    try:
        info = dom.guestInfo(lv.libvirt.VIR_DOMAIN_GUEST_INFO_OS | lv.libvirt.VIR_DOMAIN_GUEST_INFO_HOSTNAME
                             | lv.libvirt.VIR_DOMAIN_GUEST_INFO_TIMEZONE, 0)
    except lv.libvirt.libvirtError as exc:
        errors.append("guest info: %s" % lv.describe(exc))
        if exc.get_error_code() == lv.libvirt.VIR_ERR_AGENT_UNRESPONSIVE:
            return None
        info = None
    if info:
        answered = True
        facts["hostname"] = info.get("hostname")
        facts["os"] = {"name": info.get("os.name"), "pretty_name": info.get("os.pretty-name"),
                       "id": info.get("os.id"), "version": info.get("os.version"),
                       "version_id": info.get("os.version-id"), "machine": info.get("os.machine")}
        facts["kernel"] = {"release": info.get("os.kernel-release"), "version": info.get("os.kernel-version")}
        if "timezone.offset" in info:
            facts["timezone"] = {"name": info.get("timezone.name"), "offset": info.get("timezone.offset")}
    try:
        facts["interfaces"] = _interfaces(dom)
        answered = True
    except lv.libvirt.libvirtError as exc:
        errors.append("interfaces: %s" % lv.describe(exc))
    if not answered:
        return None
    facts["boot_time"] = _boot_time(Agent(dom))
    facts["agent_errors"] = errors
    return facts

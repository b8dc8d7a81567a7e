"""The guest agent's parts that need no libvirt daemon: the channel state, addresses, files and commands over a
fake agent that answers like qemu-ga."""

import base64
import json

import pytest

from ansible_collections.machinery.compute.plugins.module_utils.core import elements
from ansible_collections.machinery.compute.plugins.module_utils.machines import guest
from ansible_collections.machinery.compute.plugins.module_utils.machines import machine_status

CHANNEL = """<domain><devices>
  <channel type='unix'><target type='virtio' name='org.qemu.spice.0' state='connected'/></channel>
  <channel type='unix'><target type='virtio' name='org.qemu.guest_agent.0'%s/></channel>
</devices></domain>"""


@pytest.mark.parametrize("state, connected", [(" state='connected'", True), (" state='disconnected'", False),
                                              ("", False)])
def test_only_a_connected_agent_channel_counts(state, connected):
    assert guest.agent_connected(elements.parse(CHANNEL % state)) is connected


def test_no_agent_channel_is_not_connected():
    assert guest.agent_connected(elements.parse("<domain><devices/></domain>")) is False


def nic(name, *addresses):
    return {"name": name, "mac": None, "addresses": [
        {"address": address, "prefix": 24, "family": "ipv6" if ":" in address else "ipv4"} for address in addresses]}


def test_routable_addresses_leave_out_loopback_and_link_local_ipv4_first():
    interfaces = [nic("lo", "127.0.0.1", "::1"), nic("eth0", "fe80::1", "2001:db8::5", "10.0.0.5"),
                  nic("eth1", "169.254.3.3", "192.168.1.9")]
    assert guest.routable_addresses(interfaces) == ["10.0.0.5", "192.168.1.9", "2001:db8::5"]
    assert guest.routable_addresses([]) == []


class FakeAgent:
    """Answers guest-file-* and guest-exec* like qemu-ga, keeping files in a dict."""

    def __init__(self):
        self.files = {}
        self.handles = {}
        self.requests = []

    def __call__(self, _dom, request, _timeout, _flags):
        request = json.loads(request)
        self.requests.append(request["execute"])
        args = request.get("arguments") or {}
        name = request["execute"]
        if name == "guest-file-open":
            if "r" in args["mode"] and args["path"] not in self.files:
                return json.dumps({"error": {"class": "GenericError", "desc": "No such file or directory"}})
            if "w" in args["mode"]:
                self.files[args["path"]] = b""
            handle = 1000 + len(self.handles)
            self.handles[handle] = [args["path"], 0]
            return json.dumps({"return": handle})
        if name == "guest-file-write":
            data = base64.b64decode(args["buf-b64"])
            self.files[self.handles[args["handle"]][0]] += data
            return json.dumps({"return": {"count": len(data), "eof": False}})
        if name == "guest-file-read":
            path, offset = self.handles[args["handle"]]
            data = self.files[path][offset:offset + args["count"]]
            self.handles[args["handle"]][1] += len(data)
            eof = self.handles[args["handle"]][1] >= len(self.files[path])
            return json.dumps({"return": {"count": len(data), "buf-b64": base64.b64encode(data).decode(),
                                          "eof": eof}})
        if name in ("guest-file-close", "guest-file-flush"):
            return json.dumps({"return": {}})
        if name == "guest-exec":
            self.exec_args = args
            return json.dumps({"return": {"pid": 42}})
        if name == "guest-exec-status":
            if self.requests.count("guest-exec-status") < 3:
                return json.dumps({"return": {"exited": False}})
            return json.dumps({"return": {"exited": True, "exitcode": 3,
                                          "out-data": base64.b64encode(b"out").decode(),
                                          "err-data": base64.b64encode(b"err").decode()}})
        raise AssertionError(name)


@pytest.fixture
def fake(monkeypatch):
    agent = FakeAgent()

    class Qemu:
        qemuAgentCommand = agent

    monkeypatch.setattr(guest, "libvirt_qemu", Qemu)
    monkeypatch.setattr(guest, "FILE_CHUNK", 1000)
    return agent


def test_files_go_both_ways_in_chunks(fake):
    data = bytes(range(256)) * 10
    guest.Agent(object()).write_file("/tmp/x", data)
    assert fake.files["/tmp/x"] == data
    assert fake.requests.count("guest-file-write") == 3 and fake.requests[-1] == "guest-file-close"
    assert guest.Agent(object()).read_file("/tmp/x") == data
    assert guest.Agent(object()).read_file("/tmp/x", limit=10) == data[:10]


def test_a_refused_file_names_the_command(fake):
    with pytest.raises(guest.AgentError, match="guest-file-open: No such file"):
        guest.Agent(object()).read_file("/nope")


def test_a_command_is_polled_until_it_ends(fake):
    code, out, err = guest.Agent(object()).run("/bin/sh", ["-c", "exit 3"], stdin=b"in", poll=0)
    assert (code, out, err) == (3, b"out", b"err")
    assert fake.exec_args == {"path": "/bin/sh", "arg": ["-c", "exit 3"], "capture-output": True,
                              "input-data": base64.b64encode(b"in").decode()}
    assert fake.requests.count("guest-exec-status") == 3


def test_boot_time_from_proc_stat(fake):
    fake.files["/proc/stat"] = b"cpu  1 2 3\nbtime 1795359000\nprocesses 9\n"
    assert guest._boot_time(guest.Agent(object())) == "2026-11-22T14:50:00+00:00"
    del fake.files["/proc/stat"]
    assert guest._boot_time(guest.Agent(object())) is None


@pytest.mark.parametrize("active, connected, facts, asked, status, reason", [
    (True, True, {"hostname": "a"}, True, "True", "GuestAgentAnswered"),
    (False, False, None, True, "False", "NotRunning"),
    (True, True, None, True, "False", "GuestAgentSilent"),
    (True, True, None, False, "True", "GuestAgentConnected"),
    (True, False, None, True, "Unknown", "NoGuestAgent"),
    (True, False, None, False, "Unknown", "NoGuestAgent"),
])
def test_bootstrap_ready(active, connected, facts, asked, status, reason):
    condition = machine_status._bootstrap_condition(active, connected, facts, asked)
    assert (condition["type"], condition["status"], condition["reason"]) == ("BootstrapReady", status, reason)

"""The pools reached the ways remote hosts are: through the lab's sshd (qemu+libssh2 with the lab's key and
known_hosts, qemu+ssh through the OpenSSH client) and over TLS with the lab's certificates. Every effect is
checked through the unix socket; every refusal must be one line naming the pool and the cause, and change nothing.

Subset run per transport: machine lifecycle (ssh, tls, openssh); machine_batch over two pools, volume_attach and
the inventory plugin (ssh, tls); refusals (wrong CA, unknown host key, wrong key, nothing listening)."""

import importlib.util
import json
import os
import re
import socket
import subprocess
import sys
import time

import pytest

from conftest import REPO, load_lab


@pytest.fixture(name="image", scope="session")
def idle_guest_image(idle_image):
    """Nothing here looks inside a guest: its machines run the idle image (conftest.idle_image), at no CPU cost."""
    return idle_image


BIN = os.path.dirname(sys.executable)


def lab_library():
    """lab/lab.py, for its certificate helpers (a CA of another lab)."""
    spec = importlib.util.spec_from_file_location("machinery_lab", os.path.join(REPO, "lab", "lab.py"))
    library = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(library)
    return library


@pytest.fixture(scope="module")
def remote(registered):
    """The lab's transports: lab.json's ssh and tls sections and each registered pool's URIs."""
    data = load_lab()
    assert data.get("ssh") and data.get("tls"), "the lab has no sshd or TLS (lab/lab.py up of this version)"
    uris = {entry["name"]: entry["uris"] for entry in data["pools"]}
    for pool in registered:
        assert {"unix", "ssh", "openssh", "tls"} <= set(uris[pool.name]), uris[pool.name]
    return {"ssh": data["ssh"], "tls": data["tls"], "uris": uris}


@pytest.fixture
def client_path(remote, monkeypatch):
    """The lab's OpenSSH wrapper first in PATH (modules inherit it): qemu+ssh checks the lab's known_hosts."""
    monkeypatch.setenv("PATH", remote["ssh"]["client_path"] + os.pathsep + os.environ["PATH"])


def sessions(remote):
    """SSH sessions the lab's sshd let in so far."""
    with open(remote["ssh"]["log"]) as handle:
        return sum(1 for line in handle if "Accepted publickey" in line)


def everything(pools):
    """What a refused run must leave alone, read over the unix sockets."""
    return {pool.name: (pool.domain_names(), pool.volumes()) for pool in pools}


@pytest.mark.parametrize("transport", ["ssh", "tls", "openssh"])
def test_machine_lifecycle(registered, remote, module, image, transport, request):
    if transport == "openssh":
        request.getfixturevalue("client_path")
    pool = registered[0]
    uri = remote["uris"][pool.name][transport]
    name = "tr-life-%s" % transport
    args = dict(uri=uri, name=name, machine_class="small", image=image, state="present", network_interfaces=[])
    try:
        if transport != "openssh":  # the same code as qemu+libssh2 once connected: fewer steps for it
            planned = module("machine", check=True, **args)
            assert planned["changed"] is True and planned["actions"] == ["create"], planned
            assert pool.domain(name) is None
        made = module("machine", **args)
        assert made["changed"] is True, made
        assert pool.domain(name) is not None
        again = module("machine", **args)
        assert again["changed"] is False and again["actions"] == [], again
        gone = module("machine", uri=uri, name=name, state="absent")
        assert gone["changed"] is True, gone
        assert pool.domain(name) is None
        if transport != "openssh":
            assert module("machine", uri=uri, name=name, state="absent")["changed"] is False
    finally:
        module("machine", uri=pool.uri, name=name, state="absent")


def inventory_hosts(tmp_path, pools, **env):
    source = tmp_path / "remote.machinery.yml"
    source.write_text(json.dumps({"plugin": "machinery.compute.machines", "pools": pools, "strict": True}))
    proc = subprocess.run([os.path.join(BIN, "ansible-inventory"), "-i", str(source), "--list"], capture_output=True,
                          text=True, check=False, timeout=300, env=dict(os.environ, ANSIBLE_NOCOLOR="1", **env))
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.mark.parametrize("transport", ["ssh", "tls"])
def test_batch_attach_and_inventory(registered, remote, module, image, transport, tmp_path):
    pools = registered[:2]
    entries = [{"name": pool.name, "uri": remote["uris"][pool.name][transport]} for pool in pools]
    names = ["tr-%s-%d" % (transport, index) for index in range(2)]
    specs = [{"name": name, "machine_class": "small", "image": image, "state": "present", "network_interfaces": [],
              "machine_pool": pool.name} for name, pool in zip(names, pools)]
    absent = [{"name": name, "state": "absent"} for name in names]
    module("machine_batch", pools=[pool.uri for pool in pools], machines=absent)
    try:
        before = sessions(remote)
        made = module("machine_batch", pools=entries, machines=specs)
        assert made["changed"] is True and not made.get("failed"), made
        if transport == "ssh":  # one connection per pool per run
            assert sessions(remote) - before == len(pools)
        assert [pool.domain(name) is not None for pool, name in zip(pools, names)] == [True, True]
        assert module("machine_batch", pools=entries, machines=specs)["changed"] is False

        volume = "%s-data.qcow2" % names[0]
        attach = dict(uri=entries[0]["uri"], machine=names[0], volume=volume, size="16Mi", ephemeral=True)
        attached = module("volume_attach", **attach)
        assert attached["changed"] is True and attached["volume"]["state"] == "Attached", attached
        assert volume in pools[0].volumes() and volume in pools[0].domain(names[0]).XMLDesc(0)
        assert module("volume_attach", **attach)["changed"] is False

        listed = json.loads(inventory_hosts(tmp_path, entries))
        assert set(names) <= set(listed["_meta"]["hostvars"]), listed["_meta"]["hostvars"].keys()
        where = [json.dumps(listed["_meta"]["hostvars"][name]["machinery"]["pool"]) for name in names]
        assert all(pool.name in text for pool, text in zip(pools, where)), where
        if transport == "tls":  # as an AWX credential gives them: three files of any name, URIs with no pkipath
            pki = remote["tls"]["pkipath"]
            bare = [dict(entry, uri=re.sub(r"[?&]pkipath=[^&]*", "", entry["uri"])) for entry in entries]
            assert all("pkipath" not in entry["uri"] for entry in bare), bare
            again = json.loads(inventory_hosts(tmp_path, bare, **{
                "MACHINERY_TLS_CACERT": os.path.join(pki, "cacert.pem"),
                "MACHINERY_TLS_CLIENTCERT": os.path.join(pki, "clientcert.pem"),
                "MACHINERY_TLS_CLIENTKEY": os.path.join(pki, "clientkey.pem")}))
            assert set(names) <= set(again["_meta"]["hostvars"])

        gone = module("machine_batch", pools=entries, machines=absent)
        assert gone["changed"] is True, gone
        assert [pool.domain(name) for pool, name in zip(pools, names)] == [None, None]
        assert volume not in pools[0].volumes()
    finally:
        module("machine_batch", pools=[pool.uri for pool in pools], machines=absent)


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def refusing(remote, registered, tmp_path_factory):
    """URIs of pool1 that must be refused, each with the words its error has to contain."""
    scratch = tmp_path_factory.mktemp("refusals")
    pool = registered[0]
    socket_path = pool.uri.split("socket=", 1)[1]
    port = remote["ssh"]["port"]
    libssh = "qemu+libssh2://root@127.0.0.1:%d/system?socket=%s&sshauth=privkey&keyfile=%s&known_hosts=%s"

    # a client certificate of another CA; the lab CA is in the bundle too, so the client trusts the host and
    # offers its certificate: the host has to be the one that refuses
    lab = lab_library()
    lab.make_ca(scratch / "other-ca", "another lab CA")
    lab.make_leaf(scratch / "other-ca", scratch / "other", "client", "intruder", [])
    with open(remote["tls"]["ca"]) as ours, open(scratch / "other-ca" / "cacert.pem") as theirs:
        (scratch / "other" / "cacert.pem").write_text(ours.read() + theirs.read())
    tls = remote["uris"][pool.name]["tls"].split("?", 1)[0] + "?pkipath=%s" % (scratch / "other")

    (scratch / "known_hosts").write_text("")
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(scratch / "stranger")], check=True)
    return {
        "another-ca": (tls, ["did not accept the client certificate"]),
        "unknown-host-key": (libssh % (port, socket_path, remote["ssh"]["keyfile"], scratch / "known_hosts"),
                             ["host key", "not trusted"]),
        "wrong-key": (libssh % (port, socket_path, scratch / "stranger", remote["ssh"]["known_hosts"]),
                      ["refused the SSH key"]),
        "ssh-no-listener": (libssh % (free_port(), socket_path, remote["ssh"]["keyfile"],
                                      remote["ssh"]["known_hosts"]), ["Connection refused", "nothing listens"]),
        "tls-no-listener": ("qemu+tls://127.0.0.1:%d/system?pkipath=%s" % (free_port(), remote["tls"]["pkipath"]),
                            ["Connection refused", "nothing listens"]),
    }


@pytest.mark.parametrize("case", ["another-ca", "unknown-host-key", "wrong-key", "ssh-no-listener",
                                  "tls-no-listener"])
def test_refusals(registered, refusing, module, image, case):
    uri, words = refusing[case]
    before = everything(registered)
    started = time.monotonic()
    single = module("machine", uri=uri, name="tr-refused", machine_class="small", image=image, state="present",
                    network_interfaces=[])
    assert time.monotonic() - started < 60  # refused, not hung
    assert single.get("failed") and single["field"] == "uri" and single["reason"] == "Unreachable", single
    assert "\n" not in single["msg"] and uri in single["msg"], single["msg"]
    for word in words:
        assert word in single["msg"], single["msg"]

    if case not in ("another-ca", "wrong-key"):
        assert everything(registered) == before
        return
    # in a fleet the pool is named by its name
    batch = module("machine_batch", pools=[{"name": registered[0].name, "uri": uri}],
                   machines=[{"name": "tr-refused", "machine_class": "small", "image": image, "state": "present",
                              "network_interfaces": []}])
    assert batch.get("failed"), batch
    assert re.search(r"pool1 unreachable: .*cannot connect to pool pool1 \(", batch["msg"]), batch["msg"]
    assert "\n" not in batch["msg"] and words[-1] in batch["msg"], batch["msg"]
    assert everything(registered) == before

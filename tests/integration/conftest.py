"""Integration tests against the real lab: libvirtd pool hosts in their own namespaces, real QEMU guests.

Modules run as Ansible runs them on a host (their own process, arguments as JSON); every effect is checked
from libvirt itself.
"""

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time

import libvirt
import pytest

NS = "https://machinery.compute/xmlns/machine/1"
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CLASS_SMALL = {"name": "small", "cpu": 1, "memory": "128Mi"}
# The lab's hosts have few CPUs and its TCG test guests sit idle: overcommit CPUs so tests are not capped at 2.
OVERCOMMIT = {"cpu": 16.0, "memory": 1.0}

libvirt.registerErrorHandler(lambda _ctx, _err: None, None)


def lab_file():
    """The lab under test: $MACHINERY_LAB (make integration's own lab), else the development lab."""
    return os.path.abspath(os.environ.get("MACHINERY_LAB") or os.path.join(REPO, ".lab", "lab.json"))


def lab_pid(pool):
    """The pid of a lab pool's libvirtd (its network namespace is the pool host's network)."""
    with open(os.path.join(os.path.dirname(lab_file()), pool.name, "libvirtd.pid")) as handle:
        return int(handle.read().strip())


def load_lab():
    with open(lab_file()) as handle:
        return json.load(handle)


@pytest.fixture(scope="session")
def lab():
    data = load_lab()
    assert len(data["pools"]) >= 3, "the integration tests need a lab of 3 pools (make lab-up)"
    assert data["image"] and os.path.isfile(data["image"]), "the lab has no test image (make image)"
    return data


@pytest.fixture(scope="session")
def image(lab):
    return lab["image"]


def run_module(module_name, check=False, diff=True, **args):
    """Run machinery.compute.<name> in its own process, as Ansible does on a host; returns its JSON result."""
    args = dict(args, _ansible_check_mode=check, _ansible_diff=diff, _ansible_no_log=False)
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as handle:
        json.dump({"ANSIBLE_MODULE_ARGS": args}, handle)
    try:
        command = [sys.executable, "-m", "ansible_collections.machinery.compute.plugins.modules." + module_name,
                   handle.name]
        proc = subprocess.run(command, capture_output=True, text=True, timeout=900, check=False)
    finally:
        os.unlink(handle.name)
    try:
        return json.loads(proc.stdout[proc.stdout.index("{"):])
    except ValueError:
        raise AssertionError("module %s printed no JSON (rc %d): %s %s"
                             % (module_name, proc.returncode, proc.stdout, proc.stderr)) from None


@pytest.fixture(scope="session")
def module():
    return run_module


class Pool:
    """One lab pool: its name, URI and an open libvirt connection for checking what the modules did."""

    def __init__(self, name, uri):
        self.name = name
        self.uri = uri
        self.conn = libvirt.open(uri)

    def reconnect(self):
        """After the pool's daemon was restarted."""
        try:
            self.conn.close()
        except libvirt.libvirtError:
            pass
        self.conn = libvirt.open(self.uri)

    def domain(self, name):
        try:
            return self.conn.lookupByName(name)
        except libvirt.libvirtError:
            return None

    def domain_names(self):
        return sorted(dom.name() for dom in self.conn.listAllDomains(0))

    def volumes(self, pool="machinery"):
        storage = self.conn.storagePoolLookupByName(pool)
        storage.refresh(0)
        return sorted(storage.listVolumes())

    def download(self, volume, pool="machinery"):
        storage = self.conn.storagePoolLookupByName(pool)
        storage.refresh(0)
        vol = storage.storageVolLookupByName(volume)
        stream = self.conn.newStream(0)
        vol.download(stream, 0, 0, 0)
        chunks = []
        while True:
            data = stream.recv(1 << 20)
            if not data or data in (-2,):
                break
            chunks.append(data)
        stream.finish()
        return b"".join(chunks)

    def console(self, machine):
        return self.download("%s-console.log" % machine).decode(errors="replace")

    def wait_console(self, machine, marker, timeout=90):
        deadline = time.monotonic() + timeout
        text = ""
        while time.monotonic() < deadline:
            try:
                text = self.console(machine)
            except libvirt.libvirtError:
                text = ""
            if marker in text:
                return text
            time.sleep(1)
        raise AssertionError("%s never printed %s; console so far:\n%s" % (machine, marker, text[-3000:]))

    def leases(self, network="machinery"):
        return self.conn.networkLookupByName(network).DHCPLeases()


@pytest.fixture(scope="session")
def pools(lab):
    return [Pool(entry["name"], entry["uri"]) for entry in lab["pools"]]


def register(pool, **extra):
    extra.setdefault("overcommit", OVERCOMMIT)
    result = run_module("machine_pool", uri=pool.uri, name=pool.name, networks=[{"name": "machinery"}], **extra)
    assert not result.get("failed"), result
    result = run_module("machine_class", uri=pool.uri, **CLASS_SMALL)
    assert not result.get("failed"), result
    return result


@contextlib.contextmanager
def first_pool(clean=None):
    """The lab's first pool, registered with class small, and ``clean(pool)`` run before and after when given: for
    the module-scoped fixture of a test that needs one pool only (any lab will do, not only one of 3 pools)."""
    lab = load_lab()
    pool = Pool(lab["pools"][0]["name"], lab["pools"][0]["uri"])
    register(pool)
    if clean:
        clean(pool)
    try:
        yield pool
    finally:
        if clean:
            clean(pool)


@pytest.fixture(scope="session")
def registered(pools):
    """Every lab pool registered, with class small (1 cpu, 128Mi) published."""
    for pool in pools:
        register(pool)
    return pools


@pytest.fixture
def pool(registered):
    return registered[0]


def plain(value):
    """ansible-inventory shows strings marked unsafe as {"__ansible_unsafe": ...}; their values instead."""
    if isinstance(value, dict):
        if set(value) == {"__ansible_unsafe"}:
            return value["__ansible_unsafe"]
        return {key: plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [plain(item) for item in value]
    return value


def warnings_of(result):
    """Warning texts of a module result (ansible-core 2.19 returns them as structured events)."""
    texts = []
    for warning in result.get("warnings") or []:
        texts.append(warning["event"]["msg"] if isinstance(warning, dict) else str(warning))
    return texts


def assert_failed(result, field, *words):
    assert result.get("failed"), result
    assert result.get("field") == field, result
    for word in words:
        assert word in result["msg"], result["msg"]

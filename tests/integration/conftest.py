"""Integration tests against the real lab: libvirtd pool hosts in their own namespaces, real QEMU guests.

Modules run as Ansible runs them on a host (their own process, arguments as JSON); every effect is checked
from libvirt itself.
"""

import collections
import contextlib
import functools
import http.server
import ipaddress
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import xml.etree.ElementTree as ET

import libvirt
import pytest

NS = "https://machinery.compute/xmlns/machine/1"
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.path.dirname(sys.executable)
CLASS_SMALL = {"name": "small", "cpu": 1, "memory": "128Mi"}
# The lab's hosts have few CPUs and its TCG test guests sit idle: overcommit CPUs so tests are not capped at 2.
OVERCOMMIT = {"cpu": 16.0, "memory": 1.0}

libvirt.registerErrorHandler(lambda _ctx, _err: None, None)

# Seconds each test file took (MACHINERY_DURATIONS_UPDATE=1: a run of whole files that passed writes its files' times
# into it). A file not in it yet counts as this many.
DURATIONS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "durations.json")
NEW_FILE_SECONDS = 60
_spent = collections.Counter()
_failed = set()


def _file_of(nodeid):
    return nodeid.split("::")[0].rsplit("/", 1)[-1]


def pytest_collection_modifyitems(items):
    """The longest files first, each file's tests in their own order. make integration hands whole files to the
    labs in this order (pytest-xdist --dist loadfile --no-loadscope-reorder), so the files that boot real guests
    start first and the run ends with short files on both labs, not with one lab still booting a guest."""
    with open(DURATIONS, encoding="utf-8") as handle:
        seconds = json.load(handle)
    items.sort(key=lambda item: (-seconds.get(_file_of(item.nodeid), NEW_FILE_SECONDS), _file_of(item.nodeid)))


def pytest_runtest_logreport(report):
    _spent[_file_of(report.nodeid)] += report.duration
    if report.failed:
        _failed.add(_file_of(report.nodeid))


def pytest_sessionfinish(session, exitstatus):
    # the files' times as this process saw them: with pytest-xdist, the controller sees every worker's reports
    _write_measured(os.environ.get("MACHINERY_DURATIONS_OUT"))
    if exitstatus != 0 or not os.environ.get("MACHINERY_DURATIONS_UPDATE") or os.environ.get("PYTEST_XDIST_WORKER"):
        return
    if session.config.getoption("deselect") or session.config.getoption("keyword"):
        return
    with open(DURATIONS, encoding="utf-8") as handle:
        seconds = json.load(handle)
    seconds.update((name, round(spent)) for name, spent in _spent.items())
    with open(DURATIONS, "w", encoding="utf-8") as handle:
        json.dump(dict(sorted(seconds.items(), key=lambda kv: (-kv[1], kv[0]))), handle, indent=1)
        handle.write("\n")


def _write_measured(path):
    """Every file's seconds in this run (its tests' setup, call and teardown: with its module fixtures, the time its
    lab spent on it) and the files that had a failure, to ``path`` whatever the outcome (make integration's main run:
    make durations copies the times of the files that passed into durations.json)."""
    if not path or os.environ.get("PYTEST_XDIST_WORKER") or not _spent:
        return
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        json.dump({"seconds": dict(sorted(((name, round(spent, 1)) for name, spent in _spent.items()),
                                          key=lambda kv: (-kv[1], kv[0]))),
                   "failed": sorted(_failed)}, handle, indent=1)
        handle.write("\n")


def lab_file():
    """The lab under test: $MACHINERY_LAB (make integration's own lab), else the development lab. When the suite
    runs on several labs at once (pytest-xdist, $MACHINERY_LABS the lab files separated by ':'), worker gwN takes the
    Nth: each test file runs on one worker, so a file has one lab to itself."""
    labs = [path for path in os.environ.get("MACHINERY_LABS", "").split(":") if path]
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if labs and worker.startswith("gw"):
        return os.path.abspath(labs[int(worker[2:]) % len(labs)])
    return os.path.abspath(os.environ.get("MACHINERY_LAB") or os.path.join(REPO, ".lab", "lab.json"))


def labelled_domains(pools, key, value):
    """[(pool, domain, record)] of the collection's machines whose record has the label ``key``: ``value``, read
    from each domain's inactive XML."""
    found = []
    for pool in pools:
        for dom in pool.conn.listAllDomains(0):
            xml = dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE)
            if NS not in xml:
                continue
            record = json.loads(xml.split("<machinery:machine")[1].split(">", 1)[1].split("</machinery:machine")[0])
            if record["spec"]["labels"].get(key) == value:
                found.append((pool, dom, record))
    return found


def defined_on(pools, names):
    """{machine: [names of the pools it is defined on]} for the machines of ``names``, read from libvirt: a name on
    two pools shows twice."""
    found = {}
    for pool in pools:
        for name in pool.domain_names():
            if name in names:
                found.setdefault(name, []).append(pool.name)
    return found


def lab_pid(pool):
    """The pid of a lab pool's libvirtd (its network namespace is the pool host's network)."""
    with open(os.path.join(os.path.dirname(lab_file()), pool.name, "libvirtd.pid")) as handle:
        return int(handle.read().strip())


def process_running(pid):
    """True while ``pid`` runs (a zombie waiting for its parent to reap it is not running: a daemon whose parent
    is a shell that has not waited yet, as in a Debian 13 root's PID namespace, stays in /proc until then)."""
    try:
        with open("/proc/%d/stat" % pid) as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def qemu_pids(uuid):
    """The pids of the QEMU processes running the domain ``uuid`` (their command line names the UUID)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open("/proc/%s/cmdline" % entry, "rb") as handle:
                args = handle.read().split(b"\0")
        except OSError:
            continue
        if uuid.encode() in args and b"qemu" in args[0]:
            pids.append(int(entry))
    return pids


def stop_daemon(pool, timeout=30):
    """Stop a lab pool's libvirtd and wait until its process has ended."""
    pid = lab_pid(pool)
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while process_running(pid):
        assert time.monotonic() < deadline, "libvirtd of %s (pid %d) did not stop" % (pool.name, pid)
        time.sleep(0.1)


def start_daemons(pools):
    """Start the lab's stopped daemons again (lab.py up leaves running ones alone) and reconnect to every pool."""
    lab_up()
    for pool in pools:
        pool.reconnect()


def lab_up():
    """lab.py up on the lab under test: it starts the daemons of its pools that do not run, and only those."""
    proc = subprocess.run(["python3", os.path.join(REPO, "lab", "lab.py"), "up", "--pools",
                           str(len(load_lab()["pools"])), "--dir", os.path.dirname(lab_file())],
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, "lab.py up failed: %s" % (proc.stdout + proc.stderr)[-3000:]


def answers(uri):
    """Whether the daemon of ``uri`` answers a call on a new connection."""
    try:
        conn = libvirt.open(uri)
    except libvirt.libvirtError:
        return False
    try:
        conn.getLibVersion()
        return True
    except libvirt.libvirtError:
        return False
    finally:
        with contextlib.suppress(libvirt.libvirtError):
            conn.close()


def pools_down():
    """The names of the lab's pools whose daemon does not answer."""
    return [entry["name"] for entry in load_lab()["pools"] if not answers(entry["uri"])]


def restore_pools():
    """Start the daemons of the lab's pools that do not answer; the names of those that did not. Fails when one
    still does not answer afterwards."""
    down = pools_down()
    if down:
        lab_up()
        still = pools_down()
        assert not still, "the daemons of %s did not come back (lab.py up)" % ", ".join(still)
    return down


@pytest.fixture
def pools_kept_up():
    """For a test that restarts or reboots pools: whatever it does (passes, fails, raises, times out), every pool
    of the lab runs its daemon again when it ends, for the tests after it on that lab."""
    yield
    restore_pools()


@pytest.fixture(scope="module", autouse=True)
def lab_left_usable(request):
    """A file must leave the lab's daemons running: the next file on the lab needs them. One that did not fails
    here, naming the pools, after they were started again (so only that file fails, not every later one)."""
    yield
    if not os.path.exists(lab_file()):
        return
    down = restore_pools()
    assert not down, "%s left the daemons of %s stopped (started again)" % (request.module.__name__,
                                                                            ", ".join(down))


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


@pytest.fixture(scope="session")
def idle_image(lab):
    """The idle image beside the lab's busybox image (make image): a guest that runs, prints MACHINERY-IDLE and
    powers off at the ACPI power button, and does nothing else: no network, no agent, no hot-unplug. For tests
    that read a running machine from libvirt only, it saves the busybox boot's 7 CPU seconds."""
    path = os.path.join(os.path.dirname(lab["image"]), "machinery-idle.qcow2")
    assert os.path.isfile(path), "the lab has no idle image at %s (make image)" % path
    return path


class ModuleRun:
    """machinery.compute.<name> started in a process (and process group) of its own, its arguments as JSON in a
    file, as Ansible runs a module on a host. Its output goes to files, so a run nobody reads never blocks."""

    def __init__(self, module_name, check=False, diff=True, launcher=(), **args):
        """``launcher``: a command line the module's is appended to, which execs it in the same process (another
        controller: a UTS namespace, a clock; test_48), so its pid and process group are still the run's."""
        self.module_name = module_name
        self.work = tempfile.mkdtemp(prefix="machinery-module-")
        args_file = os.path.join(self.work, "args.json")
        with open(args_file, "w") as handle:
            json.dump({"ANSIBLE_MODULE_ARGS": dict(args, _ansible_check_mode=check, _ansible_diff=diff,
                                                   _ansible_no_log=False)}, handle)
        self.stdout = open(os.path.join(self.work, "stdout"), "w+")
        self.stderr = open(os.path.join(self.work, "stderr"), "w+")
        command = list(launcher) + [sys.executable, "-m",
                                    "ansible_collections.machinery.compute.plugins.modules." + module_name, args_file]
        self.proc = subprocess.Popen(command, stdout=self.stdout, stderr=self.stderr, start_new_session=True)

    def running(self):
        return self.proc.poll() is None

    def wait(self, timeout):
        """True when the run ended within ``timeout`` seconds."""
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return False
        return True

    def kill(self, sig=signal.SIGKILL, group=True):
        """Send ``sig`` to the run's whole process group (or its module process alone) and reap it; True only when
        the run was still running then and died of that signal (a run that ended just before was not killed)."""
        was_running = self.running()
        if was_running:
            with contextlib.suppress(ProcessLookupError):
                (os.killpg if group else os.kill)(self.proc.pid, sig)
        self.proc.wait()
        self.close()
        return was_running and self.proc.returncode == -sig

    def close(self):
        for handle in (self.stdout, self.stderr):
            handle.close()
        shutil.rmtree(self.work, ignore_errors=True)

    def finish(self, timeout=900):
        """Wait for the run's end; its JSON result."""
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.stdout.seek(0)
        self.stderr.seek(0)
        out, err = self.stdout.read(), self.stderr.read()
        self.close()
        try:
            return json.loads(out[out.index("{"):])
        except ValueError:
            raise AssertionError("module %s printed no JSON (rc %s): %s %s"
                                 % (self.module_name, self.proc.returncode, out, err)) from None


def run_module(module_name, check=False, diff=True, **args):
    """Run machinery.compute.<name> to its end (see ModuleRun); returns its JSON result."""
    return ModuleRun(module_name, check=check, diff=diff, **args).finish()


@pytest.fixture(scope="session")
def module():
    return run_module


class Pool:
    """One lab pool: its name, URI and a libvirt connection for checking what the modules did. The connection
    is checked on each use and opened again when its daemon was restarted (a reboot, a test that stops it), so
    no test inherits a dead one."""

    def __init__(self, name, uri):
        self.name = name
        self.uri = uri
        self._conn = None

    @property
    def conn(self):
        if self._conn is not None and not alive(self._conn):
            self.reconnect()
        if self._conn is None:
            self._conn = libvirt.open(self.uri)
        return self._conn

    def reconnect(self):
        """Drop the connection (the daemon was restarted); the next use opens a new one."""
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(libvirt.libvirtError):
                conn.close()

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


def alive(conn):
    """Whether a connection still reaches its daemon: not closed, and a call goes through."""
    try:
        return bool(conn.isAlive()) and conn.getLibVersion() > 0
    except libvirt.libvirtError:
        return False


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


def unheld_addresses(network, below, count):
    """The first ``count`` addresses of a libvirt network's DHCP range, from ``below`` down, that no host entry
    reserves and no lease holds. A lease outlives its guest (for its lease time) and dnsmasq picks a guest's
    address from a hash of its MAC, so a fixed address a test chose could be leased by a guest an earlier file on
    the same lab deleted; the module rightly refuses an address leased to another MAC."""
    tree = ET.fromstring(network.XMLDesc(0))
    held = {host.get("ip") for host in tree.findall("ip/dhcp/host")} | \
        {lease["ipaddr"] for lease in network.DHCPLeases()}
    start = ipaddress.IPv4Address(tree.find("ip/dhcp/range").get("start"))
    address, found = ipaddress.IPv4Address(below), []
    while len(found) < count and address >= start:
        if str(address) not in held:
            found.append(str(address))
        address -= 1
    assert len(found) == count, "no %d unheld addresses below %s" % (count, below)
    return found


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


# --- the ansible command line ---------------------------------------------------------------------------------

def ansible(tool, *args, env=None, timeout=300):
    """Run ansible's ``tool`` (ansible-inventory, ansible-playbook, ansible) of this Python; the finished process."""
    environment = dict(os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0")
    environment.update(env or {})
    return subprocess.run([os.path.join(BIN, tool)] + [str(arg) for arg in args], capture_output=True, text=True,
                          env=environment, check=False, timeout=timeout)


def run_playbook(playbook, variables_file, variables, env=None, timeout=1200):
    """ansible-playbook PLAYBOOK -e @VARIABLES_FILE (``variables`` written to it as JSON), on localhost; the
    process and the counts of its recap (ok, changed, unreachable, failed)."""
    variables_file.write_text(json.dumps(variables))
    env = dict({"ANSIBLE_LOCALHOST_WARNING": "false", "ANSIBLE_INVENTORY_UNPARSED_WARNING": "false"}, **(env or {}))
    proc = ansible("ansible-playbook", playbook, "-e", "@%s" % variables_file, env=env, timeout=timeout)
    recap = re.search(r"localhost\s*:\s*ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", proc.stdout)
    assert recap, proc.stdout + proc.stderr
    return proc, dict(zip(("ok", "changed", "unreachable", "failed"), map(int, recap.groups())))


def write_source(directory, pools, name="fleet", **options):
    """An inventory source of the machines plugin, ``<name>.machinery.yml`` in ``directory``; ``pools`` are lab
    pools, or entries as the source takes them (URIs or name and URI)."""
    entries = [{"name": pool.name, "uri": pool.uri} if isinstance(pool, Pool) else pool for pool in pools]
    source = directory / ("%s.machinery.yml" % name)
    source.write_text(json.dumps(dict({"plugin": "machinery.compute.machines", "pools": entries}, **options)))
    return source  # JSON is YAML


def inventory(source, *args, env=None):
    return ansible("ansible-inventory", "-i", source, *args, env=env)


def listing(source, env=None, raw=False):
    """ansible-inventory --list of a source: its inventory (strings marked unsafe shown as such when ``raw``)
    and its warnings on one line (ansible-core before 2.19 wraps them at the terminal width)."""
    proc = inventory(source, "--list", env=env)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    return (data if raw else plain(data)), " ".join(proc.stderr.split())


def hostvars(source, raw=False):
    return listing(source, raw=raw)[0]["_meta"]["hostvars"]


def adhoc(source, host, module_name, args, timeout=900):
    """``ansible HOST -m MODULE -a ARGS`` through the guest_agent connection plugin, with nothing but the inventory
    source: it sets the pool's URI and the domain for the plugin. (rc, the host's result as --tree wrote it)."""
    tree = source.parent / "tree"
    result_file = tree / host
    if result_file.exists():
        result_file.unlink()
    proc = ansible("ansible", host, "-i", source, "-c", "machinery.compute.guest_agent", "-m", module_name,
                   "-a", args, "--tree", tree, env={"ANSIBLE_LOCALHOST_WARNING": "false"}, timeout=timeout)
    assert result_file.exists(), "no result (rc %d): %s %s" % (proc.returncode, proc.stdout[-3000:],
                                                               proc.stderr[-3000:])
    return proc.returncode, json.loads(result_file.read_text())


def assert_failed(result, field, *words):
    assert result.get("failed"), result
    assert result.get("field") == field, result
    for word in words:
        assert word in result["msg"], result["msg"]


def guest_agent(pool, name, timeout=240, call_timeout=None, every=1):
    """The guest agent of machine ``name`` on ``pool``, once it answers (after a boot or a revert)."""
    from ansible_collections.machinery.compute.plugins.module_utils.machines import guest

    deadline = time.monotonic() + timeout
    while True:
        agent = guest.Agent(pool.domain(name)) if call_timeout is None else \
            guest.Agent(pool.domain(name), timeout=call_timeout)
        try:
            agent.command("guest-ping")
            return agent
        except guest.AgentError:
            if time.monotonic() > deadline:
                raise
            time.sleep(every)


def guest_shell(agent, command, timeout=60):
    """``command`` run by /bin/sh in the guest through its agent; its output. Fails the test on a non-zero exit."""
    code, out, err = agent.run("/bin/sh", ["-c", command], timeout=timeout)
    assert code == 0, (command, out, err)
    return out.decode()


def uptimes(pool, name):
    """The uptimes a guest of the lab image printed on its console (lines ``UPTIME <seconds>``), oldest first."""
    return [float(value) for value in re.findall(r"UPTIME (\d+\.\d+)", pool.console(name))]


def wait_uptime_above(pool, name, floor, timeout=120):
    """The uptimes above ``floor`` the guest has printed, once there is one (its console is read every half
    second until ``timeout``)."""
    deadline = time.monotonic() + timeout
    while not any(value > floor for value in uptimes(pool, name)):
        assert time.monotonic() < deadline, pool.console(name)[-2000:]
        time.sleep(0.5)
    return [value for value in uptimes(pool, name) if value > floor]


@contextlib.contextmanager
def served(directory):
    """An HTTP server on loopback for the files of ``directory`` while the block runs: its base URL."""
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=directory)
    handler.log_message = lambda *args: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield "http://127.0.0.1:%d" % server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


@contextlib.contextmanager
def served_file(path):
    """``path`` served over HTTP on loopback while the block runs: its URL."""
    with served(os.path.dirname(path)) as base:
        yield "%s/%s" % (base, os.path.basename(path))

"""The bad-input corpus (bad_input.yml, issue 10): every case fails with an error naming its field, and no lab pool
changes in any way libvirt can report: domains (inactive XML), the volumes of every storage pool, networks,
registry documents, nwfilters and secrets are read before and compared after each case.

Modules run as Ansible runs them on a host, each in its own process with its arguments as JSON; to run a few
hundred cases in a few minutes, the processes are forked from one server that has imported Ansible, libvirt and
the collection once (``serve``). The lookup runs in such a child too; the inventory cases run in one
ansible-inventory process with one bad source file each.
"""

import ipaddress
import json
import os
import random
import shutil
import string
import struct
import subprocess
import sys
import tempfile
import traceback
import xml.etree.ElementTree as ET

import libvirt
import pytest
import yaml

from conftest import run_module, unheld_addresses


@pytest.fixture(name="image", scope="session")
def idle_guest_image(idle_image):
    """Nothing here looks inside a guest: its machines run the idle image (conftest.idle_image), at no CPU cost."""
    return idle_image


HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS_FILE = os.path.join(HERE, "bad_input.yml")
MODULES = "ansible_collections.machinery.compute.plugins.modules."
ANSIBLE_INVENTORY = os.path.join(os.path.dirname(sys.executable), "ansible-inventory")
TARGET = "bad-target"
TARGET_EXT = "bad-target-ext"  # a standalone volume the target machine was given


def load_corpus():
    with open(CORPUS_FILE) as handle:
        return yaml.safe_load(handle)


CORPUS = load_corpus()
FORKED = [case for case in CORPUS["cases"] if case.get("plugin") != "inventory"]
INVENTORY = [case for case in CORPUS["cases"] if case.get("plugin") == "inventory"]


def kind_of(case):
    return case.get("module") or case["plugin"]


def substituted(value, values):
    if isinstance(value, str):
        return string.Template(value).substitute(values)
    if isinstance(value, list):
        return [substituted(item, values) for item in value]
    if isinstance(value, dict):
        return {key: substituted(item, values) for key, item in value.items()}
    return value


def arguments(case, values):
    """The case's arguments laid over its module's valid base; a key set to null is left out."""
    args = dict(CORPUS["bases"][kind_of(case)], **case["args"])
    return substituted({key: value for key, value in args.items() if value is not None}, values)


# --- the fork server ----------------------------------------------------------------------------------------------

def in_child(work):
    """Run ``work()`` in a child process and return what it printed on stdout (its stderr is dropped)."""
    with tempfile.TemporaryFile() as out:
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, 2)
                os.dup2(out.fileno(), 1)
                sys.stdout = open(1, "w", closefd=False)
                try:
                    work()
                    code = 0
                except SystemExit as exc:
                    code = exc.code if isinstance(exc.code, int) else 1
                sys.stdout.flush()
            except BaseException:  # pylint: disable=broad-except
                traceback.print_exc(file=sys.stdout)
                sys.stdout.flush()
            finally:
                os._exit(code)  # never return into the server's loop
        os.waitpid(pid, 0)
        out.seek(0)
        return out.read().decode(errors="replace")


def serve():
    """Read one request per line ({kind, args}) and answer each with the JSON result of a forked child."""
    import importlib

    from ansible.parsing.dataloader import DataLoader
    from ansible.plugins.loader import init_plugin_loader, lookup_loader

    init_plugin_loader()  # first: the collection is then imported through Ansible's collection finder
    # every module the corpus has a base for (so a module added to the corpus needs no change here)
    modules = {name: importlib.import_module(MODULES + name) for name in CORPUS["bases"]
               if name not in ("lookup", "inventory")}
    scheduler = lookup_loader.get("machinery.compute.scheduler", loader=DataLoader(), templar=None)

    def module_run(name, args):
        sys.argv = [name, json.dumps({"ANSIBLE_MODULE_ARGS": dict(args, _ansible_check_mode=False, _ansible_diff=True,
                                                                  _ansible_no_log=False)})]
        modules[name].main()

    def lookup_run(args):
        options = {key: value for key, value in args.items() if key != "terms"}
        try:
            print(json.dumps({"failed": False, "placements": scheduler.run(args["terms"], variables={}, **options)}))
        except Exception as exc:  # pylint: disable=broad-except
            print(json.dumps({"failed": True, "msg": str(exc)}))

    print("ready", flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        if request["kind"] == "lookup":
            output = in_child(lambda: lookup_run(request["args"]))
        else:
            output = in_child(lambda: module_run(request["kind"], request["args"]))
        try:
            reply = json.loads(output[output.index("{"):])
        except ValueError:
            reply = {"failed": None, "msg": "no JSON from the child: %s" % output[-2000:]}
        print(json.dumps(reply), flush=True)


class Runner:
    def __init__(self):
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--serve"], cwd=HERE,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout.readline().strip() == "ready"

    def run(self, kind, args):
        self.proc.stdin.write(json.dumps({"kind": kind, "args": args}) + "\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


# --- what a pool host holds, read from libvirt --------------------------------------------------------------------

def download(conn, vol):
    stream = conn.newStream(0)
    vol.download(stream, 0, 0, 0)
    chunks = []
    while True:
        data = stream.recv(1 << 20)
        if not data or data == -2:
            break
        chunks.append(data)
    stream.finish()
    return b"".join(chunks)


def volume_facts(vol):
    """Capacity, allocation, format and modification time: a volume rewritten or resized shows in one of them."""
    tree = ET.fromstring(vol.XMLDesc(0))
    return (tree.findtext("capacity"), tree.findtext("allocation"), tree.find("target/format").get("type")
            if tree.find("target/format") is not None else None, tree.findtext("target/timestamps/mtime"))


def footprint(conn):
    state = {"domains": {dom.name(): dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE)
                         for dom in conn.listAllDomains(0)},
             "networks": {net.name(): (net.isActive(), net.autostart(), net.XMLDesc(libvirt.VIR_NETWORK_XML_INACTIVE))
                          for net in conn.listAllNetworks(0)},
             "nwfilters": {item.name(): item.XMLDesc(0) for item in conn.listAllNWFilters(0)},
             "secrets": {item.UUIDString(): item.XMLDesc(0) for item in conn.listAllSecrets(0)},
             "storage_pools": {}, "volumes": {}, "registry": {}}
    for pool in conn.listAllStoragePools(0):
        state["storage_pools"][pool.name()] = (pool.isActive(), pool.autostart())
        if not pool.isActive():
            continue
        pool.refresh(0)
        for vol in pool.listAllVolumes(0):
            state["volumes"]["%s/%s" % (pool.name(), vol.name())] = volume_facts(vol)
            if pool.name() == "machinery-registry":
                state["registry"][vol.name()] = download(conn, vol)
    return state


def differences(before, after):
    lines = []
    for section in before:
        for key in sorted(set(before[section]) | set(after[section])):
            if key not in after[section]:
                lines.append("%s %s: gone" % (section, key))
            elif key not in before[section]:
                lines.append("%s %s: new" % (section, key))
            elif before[section][key] != after[section][key]:
                lines.append("%s %s: changed" % (section, key))
    return lines


class Watch:
    """Every lab pool's footprint; ``changes()`` compares them with the last reading and takes the new one."""

    def __init__(self, pools):
        self.pools = pools
        self.last = self.read()

    def read(self):
        return {pool.name: footprint(pool.conn) for pool in self.pools}

    def changes(self):
        now = self.read()
        found = ["%s: %s" % (name, line) for name in now for line in differences(self.last[name], now[name])]
        self.last = now
        return found


# --- fixtures -------------------------------------------------------------------------------------------------------

def qcow2_header(version=3, backing_offset=0):
    header = struct.pack(">4sIQIIQIIQQIIQ", b"QFI\xfb", version, backing_offset, 0, 16, 1 << 30, 0, 1, 0x30000,
                         0x10000, 1, 0, 0)
    return header.ljust(1 << 20, b"\0")


def bad_images(directory):
    """The bad images the corpus names under $tmp."""
    data = random.Random(11).randbytes(3 << 20)
    assert data[510:512] != b"\x55\xaa" and data[1080:1082] != b"\x53\xef"  # really no disk, for this seed
    files = {"random.img": data, "text.img": b"this is not a disk image\n" * 1000, "zeros.img": bytes(1 << 20),
             "empty.img": b"", "overlay.qcow2": qcow2_header(backing_offset=0x200), "v9.qcow2": qcow2_header(9),
             "disk.vmdk": b"KDMV".ljust(1 << 20, b"\0")}
    for name, content in files.items():
        with open(os.path.join(directory, name), "wb") as handle:
            handle.write(content)


@pytest.fixture(scope="module")
def home(registered):
    """The pool the cases are about ($uri)."""
    return registered[0]


@pytest.fixture(scope="module")
def target(home, image):
    """A stopped machine some cases point at (its volumes, its MAC, its class, its pool)."""
    run_module("machine", uri=home.uri, name=TARGET, state="absent", shutdown_timeout=5)
    result = run_module("volume", uri=home.uri, name=TARGET_EXT, size="16Mi")
    assert not result.get("failed"), result
    result = run_module("machine", uri=home.uri, name=TARGET, machine_class="small", image=image, state="present",
                        volumes=[{"name": "data", "size": "16Mi"}, {"name": "ext", "volume": TARGET_EXT}],
                        network_interfaces=[{"name": "eth0", "network": "machinery"}])
    assert not result.get("failed"), result
    yield result["machine"]
    result = run_module("machine", uri=home.uri, name=TARGET, state="absent", shutdown_timeout=5)
    assert not result.get("failed"), result
    result = run_module("volume", uri=home.uri, name=TARGET_EXT, state="absent")
    assert not result.get("failed"), result


@pytest.fixture(scope="module")
def values(registered, home, image, target):
    scratch = tempfile.mkdtemp(prefix="machinery-bad-input-")
    bad_images(scratch)
    dom = home.conn.lookupByName(TARGET)
    tree = ET.fromstring(dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE))
    network = home.conn.networkLookupByName("machinery")
    address = ET.fromstring(network.XMLDesc(0)).find("ip")
    subnet = ipaddress.IPv4Interface("%s/%s" % (address.get("address"), address.get("netmask"))).network
    caches = [name for name in home.volumes() if name.startswith("image-") and not name.endswith(".complete")]
    assert caches, home.volumes()
    yield {"uri": home.uri, "uri2": registered[1].uri, "pool": home.name, "image": image, "target": TARGET,
           "target_root": "%s-root.qcow2" % TARGET, "target_ext": TARGET_EXT,
           "target_mac": tree.find("devices/interface/mac").get("address"),
           "image_cache": caches[0], "bridge": network.bridgeName(), "cidr": str(subnet),
           "cidr_half": str(list(subnet.subnets(1))[0]), "unregistered": "test:///default",
           "gateway": address.get("address"), "dhcp_ip": unheld_addresses(network, subnet.broadcast_address - 30, 1)[0],
           "unreachable": "qemu+unix:///system?socket=%s/nothing/libvirt-sock" % scratch, "tmp": scratch}
    shutil.rmtree(scratch, ignore_errors=True)


@pytest.fixture(scope="module")
def runner():
    server = Runner()
    yield server
    server.close()


@pytest.fixture(scope="module")
def watch(registered, values):
    return Watch(registered)


def assert_refused(case, result, message, values):
    """Failed, naming the case's field (the result's field, a failure of machine_batch's, or the message)."""
    assert result.get("failed") is True, "%s was not refused: %s" % (case["id"], json.dumps(result)[:3000])
    field = substituted(case["field"], values)
    named = [result.get("field")] + [failure.get("field") for failure in result.get("failures") or []]
    assert field in named or field in message, "%s: the error does not name %s: %s (field %s)" % (
        case["id"], field, message, result.get("field"))
    for word in substituted([str(word) for word in case.get("words") or []], values):
        assert word in message, "%s: %r is not in the error: %s" % (case["id"], word, message)


def test_the_footprint_sees_what_a_run_could_leave(home, watch):
    """The control: a volume made and removed behind the modules' back, and a domain's record changed, show."""
    storage = home.conn.storagePoolLookupByName("machinery")
    vol = storage.createXML("<volume><name>bad-input-probe.raw</name><capacity>4096</capacity></volume>", 0)
    assert watch.changes() == ["%s: volumes machinery/bad-input-probe.raw: new" % home.name]
    vol.delete(0)
    assert watch.changes() == ["%s: volumes machinery/bad-input-probe.raw: gone" % home.name]
    dom = home.conn.lookupByName(TARGET)
    dom.setMetadata(libvirt.VIR_DOMAIN_METADATA_DESCRIPTION, "probe", None, None, libvirt.VIR_DOMAIN_AFFECT_CONFIG)
    assert watch.changes() == ["%s: domains %s: changed" % (home.name, TARGET)]
    dom.setMetadata(libvirt.VIR_DOMAIN_METADATA_DESCRIPTION, None, None, None, libvirt.VIR_DOMAIN_AFFECT_CONFIG)
    assert watch.changes() == ["%s: domains %s: changed" % (home.name, TARGET)]


@pytest.mark.parametrize("case", FORKED, ids=[case["id"] for case in FORKED])
def test_refused_and_nothing_changed(case, runner, watch, values):
    result = runner.run(kind_of(case), arguments(case, values))
    changes = watch.changes()
    assert_refused(case, result, result.get("msg") or "", values)
    assert not changes, "%s changed the pools: %s" % (case["id"], "; ".join(changes))


@pytest.fixture(scope="module")
def inventory_run(values, watch):
    """Every inventory case as its own source file, all read by one ansible-inventory run: each bad source is
    reported on its own (ansible-inventory goes on with the next) and gives no hosts."""
    directory = tempfile.mkdtemp(prefix="machinery-bad-inventory-")
    paths = {}
    for case in INVENTORY:
        paths[case["id"]] = os.path.join(directory, "%s.machinery.yml" % case["id"])
        with open(paths[case["id"]], "w") as handle:
            yaml.safe_dump(arguments(case, values), handle)
    watch.changes()
    command = [ANSIBLE_INVENTORY, "--list"]
    for path in paths.values():
        command += ["-i", path]
    env = dict(os.environ, ANSIBLE_INVENTORY_ENABLED="machinery.compute.machines", ANSIBLE_NOCOLOR="1")
    proc = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300, check=False)
    changes = watch.changes()
    yield proc, paths, changes
    shutil.rmtree(directory, ignore_errors=True)


@pytest.mark.parametrize("case", INVENTORY, ids=[case["id"] for case in INVENTORY])
def test_inventory_source_refused_and_nothing_changed(case, inventory_run, values):
    proc, paths, changes = inventory_run
    path = paths[case["id"]]
    hosts = json.loads(proc.stdout)["_meta"]["hostvars"]
    assert hosts == {}, hosts
    assert "Unable to parse %s" % path in proc.stderr, "%s was parsed: %s" % (case["id"], proc.stderr[-3000:])
    message = " ".join(block for block in proc.stderr.split("[WARNING]:") if path in block and "Unable to parse"
                       not in block)
    assert_refused(case, {"failed": True}, message, values)
    assert not changes, "ansible-inventory changed the pools: %s" % "; ".join(changes)


if __name__ == "__main__" and sys.argv[1:] == ["--serve"]:
    serve()

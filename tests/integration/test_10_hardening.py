"""Hardening, as an adversary would try it: runs racing for one name, runs killed at random points, a pool daemon
restarted under a batch, a detach right after boot, the pool's own volumes offered as disks.

Every effect is checked from libvirt itself. A run is killed once it has begun its work (it opened its first
socket: its imports and argument checks are behind it), after a delay drawn from a seeded generator
(MACHINERY_HARDENING_SEED); only a run still running then that died of the signal counts as killed, and each kind
of kill test needs a least number of those. The counts are written to tests/output/hardening.json.
"""

import hashlib
import json
import os
import random
import signal
import subprocess
import threading
import time

import libvirt
import pytest
from lxml import etree

from ansible_collections.machinery.compute.plugins.module_utils.coordination import documents
from ansible_collections.machinery.compute.plugins.module_utils.coordination import keys
from ansible_collections.machinery.compute.plugins.module_utils.coordination import locks
from ansible_collections.machinery.compute.plugins.module_utils.coordination import writer
from ansible_collections.machinery.compute.plugins.module_utils.pools.classes import published_class

from conftest import OVERCOMMIT, REPO, ModuleRun, assert_failed, run_module, start_daemons, stop_daemon

SEED = int(os.environ.get("MACHINERY_HARDENING_SEED", "20261122"))
REPORT = {"seed": SEED, "kills": {}, "kill_attempts": {}, "orphans_found": 0, "race_rounds": 0,
          "registry_race": {}, "max_rerun_seconds": 0.0}
STORAGE = "machinery"
REGISTRY = "machinery-registry"
# How long a run of each kind works once it has begun (on the lab: creates, attachments, batches and
# registrations some 40 to 120 ms; a delete of a running idle guest 1.7 to 2.1 s after it has begun on a quiet
# machine, where the guest still boots and sits out its 2 s to shut down, but well under a second on a loaded
# one, where the guest is up by then and powers off at once); a kill is drawn from within it, so that most kills
# land mid-run. Draws up to 2 s, then 1.2 s, landed after the delete's end in two or three of four attempts on
# CI at load 4 to 6.
WORK_SECONDS = {"create": 0.04, "delete": 0.6, "attach": 0.04, "batch": 0.06, "registration": 0.035}
# The least number of runs of each kind a test must really kill, three in four of its attempts (of 12 creates,
# 4 deletes, 6 attachments, 4 batches and 4 registrations; on the lab every attempt kills): fewer, and the test
# would prove little about a run killed midway.
LEAST_KILLS = {"create": 9, "delete": 3, "attach": 4, "batch": 3, "registration": 3}
# Documents written and deleted while two threads look for a class beside them (about 5 s on the lab).
RACE_WRITES = 150
RACE_READS = 300


def run(module_name, **args):
    """Run a module to its end; returns (result, seconds)."""
    started = time.monotonic()
    result = run_module(module_name, **args)
    return result, time.monotonic() - started


def has_begun(run_):
    """The run has opened a socket (its libvirt connection, or the log before it): it is past its imports and
    argument checks, at work. A run that has ended, or whose /proc entry is gone, has not."""
    try:
        fds = os.listdir("/proc/%d/fd" % run_.proc.pid)
        return run_.running() and any(os.readlink("/proc/%d/fd/%s" % (run_.proc.pid, fd)).startswith("socket:")
                                      for fd in fds)
    except OSError:
        return False


def killed(module_name, kind, rng, **args):
    """Run a module and SIGKILL its whole process group at a point drawn from the kind's working time after it
    has begun; records the attempt and returns whether the run was really killed mid-run."""
    run_ = ModuleRun(module_name, **args)
    deadline = time.monotonic() + 60
    while run_.running() and not has_begun(run_):
        assert time.monotonic() < deadline, "%s never began" % module_name
        time.sleep(0.002)
    run_.wait(rng.uniform(0.0, WORK_SECONDS[kind]))
    return count(kind, run_.kill())


def rerun(module_name, **args):
    result, seconds = run(module_name, **args)
    REPORT["max_rerun_seconds"] = max(REPORT["max_rerun_seconds"], round(seconds, 2))
    assert not result.get("failed"), result
    # the old lock waited 60 s for a dead holder; a re-run now never waits for one
    assert seconds < 15, "re-run took %.1fs" % seconds
    return result


def used_paths(pool):
    paths = set()
    for dom in pool.conn.listAllDomains(0):
        tree = etree.fromstring(dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE).encode())
        paths.update(node.get("file") for node in tree.iterfind("devices/disk/source") if node.get("file"))
        paths.update(node.get("file") for node in tree.iterfind("sysinfo/entry") if node.get("file"))
        paths.update(node.get("file") for node in tree.iterfind("devices/serial/log") if node.get("file"))
    return paths


def orphans(pool, prefix):
    """Volumes named like a machine's (``prefix``...) that no domain of the pool uses."""
    storage = pool.conn.storagePoolLookupByName(STORAGE)
    storage.refresh(0)
    used = used_paths(pool)
    found = sorted(name for name in storage.listVolumes() if name.startswith(prefix)
                   and storage.storageVolLookupByName(name).path() not in used)
    REPORT["orphans_found"] += len(found)
    return found


def registry_leftovers(pool):
    """An admission lock, a hold on a machine, a journal (a machine's, or a wave of creates) or a document a writer
    staged, left in the pool's registry."""
    registry = pool.conn.storagePoolLookupByName(REGISTRY)
    registry.refresh(0)
    return sorted(name for name in registry.listVolumes()
                  if name.startswith(("admission.", "pending-", "wave-", "hold-", keys.STAGE_PREFIX)))


def leftover_story(pool):
    """What a failure needs to say about a lock left in a pool's registry: each leftover, its age, and for a holder
    marker whether its process is known dead (True), alive (False) or cannot be told (None)."""
    registry = pool.conn.storagePoolLookupByName(REGISTRY)
    story = []
    for name in registry_leftovers(pool):
        mtime = etree.fromstring(registry.storageVolLookupByName(name).XMLDesc(0).encode()).findtext("target/timestamps/mtime")
        age = round(time.time() - float(mtime), 1) if mtime else None
        dead = locks.Identity().is_dead(name, keys.ADMISSION_HOLDER_PREFIX) if name.startswith(keys.ADMISSION_HOLDER_PREFIX) else "-"
        story.append("%s (age %ss, holder dead: %s)" % (name, age, dead))
    return "; ".join(story)


def count(kind, was_killed):
    """Record an attempt to kill a run of ``kind``: a kill only when the run really died of it mid-run."""
    REPORT["kill_attempts"][kind] = REPORT["kill_attempts"].get(kind, 0) + 1
    REPORT["kills"][kind] = REPORT["kills"].get(kind, 0) + int(was_killed)
    return was_killed


def assert_killed_enough(*kinds):
    for kind in kinds:
        assert REPORT["kills"].get(kind, 0) >= LEAST_KILLS[kind], \
            "only %d of %d %s runs were killed mid-run (at least %d must be)" % (
                REPORT["kills"].get(kind, 0), REPORT["kill_attempts"].get(kind, 0), kind, LEAST_KILLS[kind])


@pytest.fixture(scope="module", autouse=True)
def report():
    yield
    os.makedirs(os.path.join(REPO, "tests", "output"), exist_ok=True)
    with open(os.path.join(REPO, "tests", "output", "hardening.json"), "w") as handle:
        json.dump(dict(REPORT, total_kills=sum(REPORT["kills"].values())), handle, indent=1)
    print("\nhardening:", json.dumps(dict(REPORT, total_kills=sum(REPORT["kills"].values()))))


def machine_args(pool, image, name, **extra):
    args = {"uri": pool.uri, "name": name, "machine_class": "small", "image": image, "state": "present",
            "ignition": {"ignition": {"version": "3.4.0"}}, "volumes": [{"name": "data", "size": "32Mi"}],
            "network_interfaces": []}
    args.update(extra)
    return args


# --- races --------------------------------------------------------------------------------------------------

def race_outcome(result):
    """How a run racing others to create one machine ended: it made (or found) the machine, or it lost and says so
    clearly, naming the field; anything else is unclear."""
    if not result.get("failed"):
        return "made"
    if result.get("field") == "name" and "meanwhile" in result["msg"]:
        return "lost the name"
    if result.get("field") == "volumes[0].name" and "already exists" in result["msg"]:
        return "lost the volume"
    return "unclear"


@pytest.mark.parametrize("runs", [2, 3, 4])
def test_concurrent_creates_of_one_name(pool, image, runs):
    name = "race-%d" % runs
    run("machine", uri=pool.uri, name=name, state="absent")
    for _round in range(2):
        REPORT["race_rounds"] += 1
        results = [None] * runs

        def create(index):
            results[index] = run("machine", **machine_args(pool, image, name))[0]
        threads = [threading.Thread(target=create, args=(index,)) for index in range(runs)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        outcomes = [race_outcome(result) for result in results]
        assert "made" in outcomes, results
        assert set(outcomes) <= {"made", "lost the name", "lost the volume"}, results
        dom = pool.domain(name)
        assert dom is not None and [d.name() for d in pool.conn.listAllDomains(0)].count(name) == 1
        storage = pool.conn.storagePoolLookupByName(STORAGE)
        storage.refresh(0)
        existing = {storage.storageVolLookupByName(v).path() for v in storage.listVolumes()}
        tree = etree.fromstring(dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE).encode())
        disks = [node.get("file") for node in tree.iterfind("devices/disk/source")]
        assert disks and all(path in existing for path in disks), (disks, existing)
        assert orphans(pool, name + "-") == [] and registry_leftovers(pool) == []
        status = run("machine_info", uri=pool.uri, name=[name])[0]["machines"][0]
        assert {c["type"]: c["status"] for c in status["conditions"]}["VolumesReady"] in ("True", "False")
        assert all(vol["state"] != "Missing" for vol in status["volumes"]), status
        gone = run("machine", uri=pool.uri, name=name, state="absent")[0]
        assert gone["changed"] and pool.domain(name) is None and orphans(pool, name + "-") == []


def test_a_class_is_found_while_other_runs_write_the_registry(pool):
    """libvirt refreshes a dir pool's volume list after each upload into it, and a listing taken meanwhile can
    miss volumes that are there: a class must still be found while other runs write documents beside it."""
    stop = threading.Event()
    missed, reads, writes = [], [0], [0]

    def write():
        conn = libvirt.open(pool.uri)
        registry = documents.Registry.open(conn)
        while not stop.is_set():
            registry.put("pending-race-doc%d" % (writes[0] % 3), {"machine": "race", "volumes": []})
            registry.remove("pending-race-doc%d" % (writes[0] % 3))
            writes[0] += 1
        conn.close()

    def read():
        conn = libvirt.open(pool.uri)
        while not stop.is_set():
            reads[0] += 1
            if published_class(documents.Registry.open(conn), "small") is None:
                missed.append(time.monotonic())
        conn.close()
    threads = [threading.Thread(target=write), threading.Thread(target=read), threading.Thread(target=read)]
    for thread in threads:
        thread.start()
    # the race lasts until the documents were written (and the class read) often enough, not for a set time
    deadline = time.monotonic() + 120
    try:
        while writes[0] < RACE_WRITES or reads[0] < RACE_READS:
            assert all(thread.is_alive() for thread in threads), "a thread of the race died"
            assert time.monotonic() < deadline, "only %d writes and %d reads" % (writes[0], reads[0])
            time.sleep(0.05)
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    REPORT["registry_race"] = {"writes": writes[0], "reads": reads[0]}
    assert missed == [], "%d of %d reads missed the class" % (len(missed), reads[0])
    assert registry_leftovers(pool) == []


def test_a_disk_gone_from_storage_is_reported(pool, image):
    name = "lost-disk"
    run("machine", uri=pool.uri, name=name, state="absent")
    assert not run("machine", **machine_args(pool, image, name))[0].get("failed")
    storage = pool.conn.storagePoolLookupByName(STORAGE)
    storage.storageVolLookupByName(name + "-data.qcow2").delete(0)
    machine = run("machine_info", uri=pool.uri, name=[name])[0]["machines"][0]
    conditions = {c["type"]: c for c in machine["conditions"]}
    assert conditions["VolumesReady"]["status"] == "False" and conditions["VolumesReady"]["reason"] == "Missing"
    assert [vol["state"] for vol in machine["volumes"] if vol["name"] == "data"] == ["Missing"]
    run("machine", uri=pool.uri, name=name, state="absent")


# --- the pool's own volumes and other machines' disks -------------------------------------------------------

def test_own_and_foreign_volumes_are_refused_alike(pool, image):
    owner, other = "vol-owner", "vol-other"
    for name in (owner, other):
        run("machine", uri=pool.uri, name=name, state="absent")
    assert not run("machine", **machine_args(pool, image, owner))[0].get("failed")
    assert not run("machine", **machine_args(pool, image, other, volumes=[]))[0].get("failed")
    storage = pool.conn.storagePoolLookupByName(STORAGE)
    storage.refresh(0)
    cache = next(v for v in storage.listVolumes() if v.startswith("image-") and not v.endswith(".complete"))
    before = (sorted(storage.listVolumes()), pool.domain(other).XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE))
    for volume in (cache, owner + "-ignition.json", owner + "-console.log", owner + "-root.qcow2"):
        assert_failed(run("volume_attach", uri=pool.uri, machine=other, volume=volume)[0], "volume")
        refused = run("machine", uri=pool.uri, name="vol-new", machine_class="small", image=image,
                      state="present", network_interfaces=[], volumes=[{"name": "x", "volume": volume}])[0]
        assert_failed(refused, "volumes[0].volume")
        assert pool.domain("vol-new") is None
    storage.refresh(0)
    assert (sorted(storage.listVolumes()), pool.domain(other).XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE)) == before
    for name in (owner, other):
        run("machine", uri=pool.uri, name=name, state="absent")


# --- kills at random points ---------------------------------------------------------------------------------

def kill_a_create(pool, image, name, rng):
    killed("machine", "create", rng, **machine_args(pool, image, name))


def converge(pool, image, name, _rng):
    rerun("machine", **machine_args(pool, image, name))
    assert pool.domain(name) is not None


def delete(pool, _image, name, _rng):
    rerun("machine", uri=pool.uri, name=name, state="absent")


def kill_a_delete(pool, image, name, rng):
    assert not run("machine", **machine_args(pool, image, name, state="running"))[0].get("failed")
    killed("machine", "delete", rng, uri=pool.uri, name=name, state="absent", shutdown_timeout=2)
    rerun("machine", uri=pool.uri, name=name, state="absent", shutdown_timeout=2)


# four rounds of these: a create killed midway, then deleted or converged first; a delete killed midway
KILL_ROUNDS = [(kill_a_create, delete), (kill_a_create, converge, delete), (kill_a_create, delete), (kill_a_delete,)]


def test_killed_creates_and_deletes_leave_nothing_behind(pool, idle_image):
    rng = random.Random(SEED)
    for index in range(16):
        name = "kill-%d" % index
        run("machine", uri=pool.uri, name=name, state="absent")
        for step in KILL_ROUNDS[index % len(KILL_ROUNDS)]:
            step(pool, idle_image, name, rng)
        assert pool.domain(name) is None
        assert orphans(pool, name + "-") == [], name
        assert registry_leftovers(pool) == []
    assert_killed_enough("create", "delete")


def volume_secrets(pool, path):
    """How many volume secrets of the pool's daemon are for the volume at ``path``."""
    return sum(1 for secret in pool.conn.listAllSecrets(0)
               if secret.usageType() == libvirt.VIR_SECRET_USAGE_TYPE_VOLUME and secret.usageID() == path)


@pytest.mark.parametrize("when", ["before", "begun"])
def test_a_create_killed_at_its_encrypted_copy_is_made_once_by_the_next_run(pool, image, when, monkeypatch):
    """A machine whose data volume is an encrypted copy of an image (the step an encrypted boot disk takes too):
    its create stops itself right before libvirt copies that volume (writer.STOP_BEFORE_WRITE_ENV with the
    volume's name), and is killed there, or continued and killed once the daemon has begun the copy. The next
    run makes the machine with one volume of that name and one passphrase secret for it; the delete after it
    leaves neither."""
    name = "enckill-" + when
    volume = name + "-data.luks"
    args = dict(uri=pool.uri, name=name, machine_class="small", image=image, state="present",
                network_interfaces=[], volumes=[{"name": "data", "image": image, "encrypted": True,
                                                 "passphrase": "machinery hardening kill passphrase"}])
    run("machine", uri=pool.uri, name=name, state="absent")
    monkeypatch.setenv(writer.STOP_BEFORE_WRITE_ENV, "createXMLFrom:" + volume)
    first = ModuleRun("machine", **args)
    monkeypatch.delenv(writer.STOP_BEFORE_WRITE_ENV)
    _pid, status = os.waitpid(first.proc.pid, os.WUNTRACED)
    assert os.WIFSTOPPED(status), ("the create ended without stopping before its copy", first.finish())
    storage = pool.conn.storagePoolLookupByName(STORAGE)
    if when == "begun":
        os.kill(first.proc.pid, signal.SIGCONT)
        deadline = time.monotonic() + 60
        while volume not in storage.listVolumes():  # the daemon made the copy's volume: the copy has begun
            assert first.running(), "the create ended before its copy was seen begun"
            assert time.monotonic() < deadline, "the copy never began"
            time.sleep(0.002)
    else:
        storage.refresh(0)
        assert volume not in storage.listVolumes()
    assert count("encrypted copy", first.kill()), "the create was not killed mid-run"
    # not ``rerun``'s 15 s: besides its own copy, this run waits for the dead run's copy, which the daemon goes on
    # making (a LUKS copy spends about 2 s deriving its key), before it can delete it
    result, seconds = run("machine", **args)
    REPORT["encrypted_copy_rerun_seconds"] = max(REPORT.get("encrypted_copy_rerun_seconds", 0), round(seconds, 1))
    assert not result.get("failed"), result
    assert pool.domain(name) is not None
    storage.refresh(0)
    assert [found for found in storage.listVolumes() if found.startswith(name + "-data")] == [volume]
    assert volume_secrets(pool, storage.storageVolLookupByName(volume).path()) == 1
    assert orphans(pool, name + "-") == []
    assert registry_leftovers(pool) == [], leftover_story(pool)
    path = storage.storageVolLookupByName(volume).path()
    rerun("machine", uri=pool.uri, name=name, state="absent")
    storage.refresh(0)
    assert pool.domain(name) is None and volume not in storage.listVolumes() and volume_secrets(pool, path) == 0


def test_a_document_a_killed_writer_staged_goes_with_the_next_run(pool):
    """A writer killed between staging a document and its commit leaves its staged volume and no hold: the next run
    of this controller on the pool deletes it (its process is gone), even a run with nothing to do, and leaves a
    live writer's alone."""
    identity = locks.Identity()
    dead = keys.holder_marker(keys.STAGE_PREFIX, 7, identity.controller, 2 ** 22 + 11, "1", 1)  # no such process
    live = identity.marker(keys.STAGE_PREFIX, 8)  # this test's own process
    registry = pool.conn.storagePoolLookupByName(REGISTRY)
    for name in (dead, live):
        registry.createXML("<volume><name>%s</name><capacity>64</capacity><target><format type='raw'/></target>"
                           "</volume>" % name, 0)
    try:
        assert not run("machine", uri=pool.uri, name="staged-nobody", state="absent")[0].get("failed")
        registry.refresh(0)
        names = registry.listVolumes()
        assert dead not in names and live in names
    finally:
        for name in (dead, live):
            try:
                registry.storageVolLookupByName(name).delete(0)
            except libvirt.libvirtError:
                pass


def test_killed_attachments_converge(pool, image):
    rng = random.Random(SEED + 1)
    name = "kill-attach"
    run("machine", uri=pool.uri, name=name, state="absent")
    assert not run("machine", **machine_args(pool, image, name, volumes=[]))[0].get("failed")
    for index in range(6):
        volume = "%s-extra%d.qcow2" % (name, index)
        killed("volume_attach", "attach", rng, uri=pool.uri, machine=name, volume=volume, size="16Mi",
               ephemeral=True)
        result = rerun("volume_attach", uri=pool.uri, machine=name, volume=volume, size="16Mi", ephemeral=True)
        assert result["volume"]["state"] in ("Attached", "Pending")
        assert registry_leftovers(pool) == []
    rerun("machine", uri=pool.uri, name=name, state="absent")
    assert orphans(pool, name + "-") == []
    assert_killed_enough("attach")


def batch_converges_then_goes(pools, specs, prefix):
    """A re-run of the batch makes each machine once, on one pool; a batch deleting them leaves nothing named
    ``prefix``... on any pool, and no lock or journal."""
    rerun("machine_batch", pools=[p.uri for p in pools], machines=specs)
    for spec in specs:
        assert sum(1 for p in pools if p.domain(spec["name"]) is not None) == 1, spec["name"]
    rerun("machine_batch", pools=[p.uri for p in pools],
          machines=[{"name": spec["name"], "state": "absent"} for spec in specs])
    for p in pools:
        assert orphans(p, prefix) == [], p.name
        assert registry_leftovers(p) == [], "%s: %s" % (p.name, leftover_story(p))


def test_killed_batches_and_registrations_converge(registered, image):
    pools = registered
    rng = random.Random(SEED + 2)
    names = ["kill-batch-a", "kill-batch-b"]
    specs = [{"name": n, "machine_class": "small", "image": image, "state": "present", "network_interfaces": []}
             for n in names]
    for _round in range(4):
        run("machine_batch", pools=[p.uri for p in pools], machines=[{"name": n, "state": "absent"} for n in names])
        killed("machine_batch", "batch", rng, pools=[p.uri for p in pools], machines=specs)
        batch_converges_then_goes(pools, specs, "kill-batch-")
    pool = pools[1]
    registration = dict(uri=pool.uri, name=pool.name, networks=[{"name": "machinery"}],
                        overcommit={"cpu": 16.0, "memory": 1.0})
    for round_ in range(4):
        killed("machine_pool", "registration", rng, **dict(registration, labels={"round": str(round_)}))
        # labels given (empty) set them exactly, whatever the killed run wrote; left out they would be kept
        again = rerun("machine_pool", **dict(registration, labels={}))
        assert again["pool"]["state"] == "Ready" and again["pool"]["labels"] == {}
        assert registry_leftovers(pool) == []
        registry = pool.conn.storagePoolLookupByName(REGISTRY)
        registry.refresh(0)
        assert len([v for v in registry.listVolumes() if v.startswith("pool.")]) == 1
    assert_killed_enough("batch", "registration")


def registrations(pool):
    """The generations of the pool's registration in its registry, as libvirt lists them after a refresh."""
    registry = pool.conn.storagePoolLookupByName(REGISTRY)
    registry.refresh(0)
    return sorted(v for v in registry.listVolumes() if v.startswith("pool."))


def test_a_generation_a_killed_writer_left_unreadable_goes_with_the_next_run(registered):
    """A registration killed between creating its new generation's volume and the end of its upload leaves an
    unreadable pool.N+1.json beside pool.N.json. A re-run with nothing to change (the killed run's labels were
    the ones the pool had) must still leave one generation: it deletes the dead writer's volume and nothing else.
    The volume is made here as the killed writer leaves it (created, never uploaded), so the case is certain."""
    pool = registered[1]
    registration = dict(uri=pool.uri, name=pool.name, networks=[{"name": "machinery"}], overcommit=OVERCOMMIT)
    current = registrations(pool)
    assert len(current) == 1, current
    generation = int(current[0].split(".")[1])
    dead = "pool.%d.json" % (generation + 1)
    registry = pool.conn.storagePoolLookupByName(REGISTRY)
    registry.createXML("<volume><name>%s</name><capacity>200</capacity><target><format type='raw'/>"
                       "<permissions><mode>0600</mode></permissions></target></volume>" % dead, 0)
    try:
        planned = run_module("machine_pool", check=True, **registration)
        assert planned["changed"] is True and planned["actions"] == ["prune_registration"], planned
        assert registrations(pool) == sorted([current[0], dead])  # check mode wrote nothing
        done = run_module("machine_pool", **registration)
        assert done["changed"] is True and done["actions"] == ["prune_registration"], done
        assert registrations(pool) == current  # the dead writer's volume went, the registration stayed
        assert done["pool"]["state"] == "Ready" and done["pool"]["name"] == pool.name
        again = run_module("machine_pool", **registration)
        assert again["changed"] is False, again
    finally:
        if dead in registrations(pool):
            registry.storageVolLookupByName(dead).delete(0)


# --- a daemon restarted under a run -------------------------------------------------------------------------

def begun(pool, prefix):
    """Machines named ``<prefix>...`` whose creation on the pool has begun and not yet defined their domain: their
    root volume is in the storage pool (as its daemon lists it now: libvirt lists a volume made through it at once,
    and a refresh would race the run), their domain is not there."""
    try:
        volumes = pool.conn.storagePoolLookupByName(STORAGE).listVolumes()
    except libvirt.libvirtError:
        return []
    names = {volume[:-len("-root.qcow2")] for volume in volumes
             if volume.startswith(prefix) and volume.endswith("-root.qcow2")}
    return sorted(name for name in names if pool.domain(name) is None)


def restart_outcome(result, pool):
    """How a batch ended whose pool's daemon went away under it: converged (the daemon was gone only for work
    that tolerates it), or failed naming the pool; anything else is unclear."""
    if not result.get("failed"):
        return "converged"
    if pool.name in result["msg"] or pool.uri in result["msg"]:
        return "failed naming the pool"
    return "failed without naming the pool"


def test_daemon_restart_under_a_batch(registered, image, monkeypatch):
    """The batch stops itself right before its first domain definition (writer.STOP_BEFORE_WRITE_ENV): a machine's
    root volume is on its pool, its domain not yet. That pool's daemon is restarted meanwhile: the batch goes on
    over a connection that died under it."""
    pools = registered
    names = ["restart-%d" % index for index in range(4)]
    specs = [{"name": n, "machine_class": "small", "image": image, "state": "present", "network_interfaces": []}
             for n in names]
    run("machine_batch", pools=[p.uri for p in pools], machines=[{"name": n, "state": "absent"} for n in names])
    monkeypatch.setenv(writer.STOP_BEFORE_WRITE_ENV, "defineXML")
    batch = ModuleRun("machine_batch", pools=[p.uri for p in pools], machines=specs)
    monkeypatch.delenv(writer.STOP_BEFORE_WRITE_ENV)
    try:
        _pid, status = os.waitpid(batch.proc.pid, os.WUNTRACED)
        assert os.WIFSTOPPED(status), ("the batch ended without stopping before a definition", batch.finish())
        frozen = [pool for pool in pools if begun(pool, "restart-")]
        assert frozen, "no pool holds a create begun and not defined"
        stop_daemon(frozen[0])
        start_daemons(pools)
    finally:
        os.kill(batch.proc.pid, signal.SIGCONT)
    result = batch.finish()
    REPORT["restarted_batch"] = restart_outcome(result, frozen[0])
    # where it failed, the pool whose daemon went away is named, with the cause
    assert restart_outcome(result, frozen[0]) in ("converged", "failed naming the pool"), result
    batch_converges_then_goes(pools, specs, "restart-")


# --- the journal of a batch's creates (one wave per pool and hold of its lock) ----------------------------------

def waves(pool):
    """{key: body} of the waves in the pool's registry, read as a run reads them."""
    registry = documents.Registry.open(pool.conn)
    return {key: registry.get(key) for key in registry.keys(keys.WAVE_PREFIX)}


def test_a_batch_killed_within_a_wave_leaves_what_the_next_run_removes(registered, image):
    """The batch is frozen while it creates on the pool (a root volume is there, its domain not yet), then killed:
    its wave lists every create it had planned there, named before the first was made; the next run removes what
    the dead one made and makes each machine once."""
    pool = registered[0]
    names = ["wave-kill-%d" % index for index in range(4)]
    specs = [{"name": n, "machine_class": "small", "image": image, "state": "present", "network_interfaces": []}
             for n in names]
    run("machine_batch", pools=[pool.uri], machines=[{"name": n, "state": "absent"} for n in names])
    batch = ModuleRun("machine_batch", pools=[pool.uri], machines=specs)
    deadline = time.monotonic() + 60
    while not begun(pool, "wave-kill-"):
        assert batch.running(), "the batch ended before it was seen creating a machine"
        assert time.monotonic() < deadline, "the batch never began a machine"
        time.sleep(0.002)
    os.killpg(batch.proc.pid, signal.SIGSTOP)
    left = waves(pool)
    assert count("batch", batch.kill()), "the batch was not killed mid-run"
    assert len(left) == 1, left
    (key, body), = left.items()
    assert "-%d-" % batch.proc.pid in key  # it names the run that wrote it
    assert sorted(body["machines"]) == names  # every create planned there, not only those begun
    assert all("%s-root.qcow2" % n in body["machines"][n] for n in names)
    assert begun(pool, "wave-kill-")  # a create cut off midway: its root volume with no domain
    batch_converges_then_goes([pool], specs, "wave-kill-")


def test_a_wave_of_a_run_gone_after_its_creates_goes_with_the_next_run(pool, image):
    """A batch of this controller killed after its last create, before it deleted its wave, leaves a wave whose
    machines are there: the next run on the pool, a no-op, removes it, and of what it lists only a volume no domain
    uses."""
    name = "wave-kept"
    first = run("machine", **machine_args(pool, image, name, ignition=None, volumes=[]))[0]
    assert not first.get("failed"), first
    gone = subprocess.Popen(["true"])
    gone.wait()
    controller = locks.Identity().controller
    key = "%s%s-%d-1-1" % (keys.WAVE_PREFIX, controller, gone.pid)
    storage = pool.conn.storagePoolLookupByName(STORAGE)
    storage.createXML("<volume><name>wave-cut-root.qcow2</name><capacity>1048576</capacity>"
                      "<target><format type='qcow2'/></target></volume>", 0)
    documents.Registry.open(pool.conn).put(key, {"machines": {name: ["%s-root.qcow2" % name, "%s-console.log" % name],
                                                              "wave-cut": ["wave-cut-root.qcow2"]}})
    assert list(waves(pool)) == [key]
    again = run("machine", **machine_args(pool, image, name, ignition=None, volumes=[]))[0]
    assert again["changed"] is False, again
    assert waves(pool) == {}
    assert orphans(pool, "wave-cut") == []
    assert pool.domain(name) is not None and orphans(pool, name) == []
    storage.refresh(0)
    assert "%s-root.qcow2" % name in storage.listVolumes()
    assert registry_leftovers(pool) == []
    run("machine", uri=pool.uri, name=name, state="absent")


# --- detach right after boot --------------------------------------------------------------------------------

def test_detach_while_the_guest_boots(pool, image):
    name = "early-detach"
    run("machine", uri=pool.uri, name=name, state="absent")
    started = run("machine", **machine_args(pool, image, name, volumes=[], state="running", wait="running"))[0]
    assert not started.get("failed"), started
    attached = run("volume_attach", uri=pool.uri, machine=name, volume=name + "-hot.qcow2", size="16Mi")[0]
    assert not attached.get("failed"), attached
    # the detach is asked for before the guest has booted (and could have seen the disk come)
    assert "MACHINERY-READY" not in pool.console(name)
    detached = run("volume_attach", uri=pool.uri, machine=name, volume=name + "-hot.qcow2", state="detached",
                   timeout=90)[0]
    assert not detached.get("failed"), detached
    live = pool.domain(name).XMLDesc(0)
    assert "ua-vol-%s-hot-qcow2" % name not in live
    run("machine", uri=pool.uri, name=name, state="absent", shutdown_timeout=5)
    storage = pool.conn.storagePoolLookupByName(STORAGE)
    storage.storageVolLookupByName(name + "-hot.qcow2").delete(0)


# --- storage: accounted, refused with the field, caches pruned ----------------------------------------------

def test_disks_that_do_not_fit_are_refused(pool, image):
    storage = pool.conn.storagePoolLookupByName(STORAGE)
    before = (pool.domain_names(), pool.volumes())
    assert_failed(run("machine", uri=pool.uri, name="too-big", machine_class="small", image=image,
                      root_size="1Pi", network_interfaces=[])[0], "root_size", "does not fit")
    assert_failed(run("machine", uri=pool.uri, name="too-big", machine_class="small", image=image,
                      network_interfaces=[], volumes=[{"name": "a", "size": "1Mi"}, {"name": "b", "size": "1Pi"}])[0],
                  "volumes[1].size")
    name = "fits"
    run("machine", uri=pool.uri, name=name, state="absent")
    assert not run("machine", **machine_args(pool, image, name, volumes=[]))[0].get("failed")
    assert_failed(run("volume_attach", uri=pool.uri, machine=name, volume=name + "-huge.qcow2", size="1Pi")[0],
                  "size", "does not fit")
    status = run("machine_pool_info", uri=pool.uri)[0]["pools"][0]["storage"]
    assert set(status) == {"capacity", "available", "allocated", "allocatable"}
    run("machine", uri=pool.uri, name=name, state="absent")
    assert (pool.domain_names(), pool.volumes()) == before
    assert storage.isActive()


def test_unused_image_caches_are_pruned(pool, image, tmp_path):
    raw = str(tmp_path / "raw-copy.img")
    subprocess.run(["qemu-img", "convert", "-O", "raw", image, raw], check=True)
    with open(raw, "rb") as handle:
        cache = "image-%s.raw" % hashlib.sha256(handle.read()).hexdigest()[:32]
    name = "prune-me"
    run("machine", uri=pool.uri, name=name, state="absent")
    made = run("machine", uri=pool.uri, name=name, machine_class="small", image=raw, state="present",
               network_interfaces=[])[0]
    assert not made.get("failed"), made
    assert cache in pool.volumes()
    registration = dict(uri=pool.uri, name=pool.name, networks=[{"name": "machinery"}],
                        overcommit={"cpu": 16.0, "memory": 1.0}, prune_images=True)

    def pruned(result):
        return [action["target"] for action in result["plan"] if action["action"] == "prune_image"]
    in_use = run_module("machine_pool", check=True, **registration)
    assert cache not in pruned(in_use)
    run("machine", uri=pool.uri, name=name, state="absent")
    planned = run_module("machine_pool", check=True, **registration)
    assert cache in pruned(planned) and cache in pool.volumes()
    used = {v for v in pool.volumes() if v.startswith("image-") and not v.endswith(".complete")} - \
        set(pruned(planned))
    done = run("machine_pool", **registration)[0]
    assert pruned(done) == pruned(planned)
    assert cache not in pool.volumes() and cache + ".complete" not in pool.volumes()
    assert used <= set(pool.volumes())  # the caches machines still use are kept
    assert pruned(run("machine_pool", **registration)[0]) == []


def test_detach_a_disk_the_machine_module_made(pool, image):
    name = "made-disk"
    run("machine", uri=pool.uri, name=name, state="absent")
    assert not run("machine", **machine_args(pool, image, name))[0].get("failed")
    detached = run("volume_attach", uri=pool.uri, machine=name, volume=name + "-data.qcow2", state="detached")[0]
    assert detached["changed"] and not detached.get("failed"), detached
    assert "ua-vol-data" not in pool.domain(name).XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE)
    again = run("volume_attach", uri=pool.uri, machine=name, volume=name + "-data.qcow2", state="detached")[0]
    assert again["changed"] is False
    run("machine", uri=pool.uri, name=name, state="absent")
    assert orphans(pool, name + "-") == []

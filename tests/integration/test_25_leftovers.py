"""Issue 23's leftovers against the 3-pool lab: secrets kept out of the registries and the temp dir, what killed
runs leave (console logs, passphrase secrets, backup stores), a rollout that keeps its floor, failures that say
what they did, and an inventory that warns only when a warning is due."""

import json
import os
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time

import libvirt

from conftest import plain, run_module

BIN = os.path.dirname(sys.executable)
PASSPHRASE = "leftover-passphrase-0123"
OWNER = "machinery.compute/machine-set"


def entries(pools):
    return [{"name": pool.name, "uri": pool.uri} for pool in pools]


def registry_texts(pool):
    """Every document of the pool's registry, as text."""
    storage = pool.conn.storagePoolLookupByName("machinery-registry")
    storage.refresh(0)
    return {name: pool.download(name, "machinery-registry").decode() for name in storage.listVolumes()}


def start_module(module_name, env=None, **args):
    """The module in its own process, not waited for: (process, file of its arguments)."""
    handle = tempfile.NamedTemporaryFile("w", suffix=".json", delete=False)
    json.dump({"ANSIBLE_MODULE_ARGS": dict(args, _ansible_check_mode=False, _ansible_no_log=False)}, handle)
    handle.close()
    proc = subprocess.Popen([sys.executable, "-m", "ansible_collections.machinery.compute.plugins.modules."
                             + module_name, handle.name], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=dict(os.environ, **(env or {})))
    return proc, handle.name


def wait_for(condition, proc, what, timeout=120):
    """Poll ``condition`` until it holds while ``proc`` still runs; fails when the run ended first."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert proc.poll() is None, "the run ended before %s: %s" % (what, proc.communicate())
        assert time.monotonic() < deadline, "%s never happened" % what
        time.sleep(0.02)


def kill_mid_run(proc, args_file):
    """Stop the run where it is, then kill it; returns its return code (-9: killed, not finished)."""
    proc.send_signal(signal.SIGSTOP)
    still_running = proc.poll() is None
    proc.kill()
    proc.wait()
    os.unlink(args_file)
    assert still_running and proc.returncode == -signal.SIGKILL


# --- 1. secrets ---------------------------------------------------------------------------------------------

def test_a_sets_registry_document_keeps_no_passphrase(registered, idle_image):
    pools = registered
    args = dict(pools=entries(pools), name="lf-secret", replicas=0, selector={"match_labels": {"app": "lf-secret"}},
                template={"machine_class": "small", "image": idle_image, "labels": {"app": "lf-secret"},
                          "network_interfaces": [],
                          "volumes": [{"name": "secure", "size": "16Mi", "encrypted": True,
                                       "passphrase": PASSPHRASE}]})
    try:
        made = run_module("machine_set", **args)
        assert made["changed"] is True and not made.get("failed"), made
        for pool in pools:
            texts = registry_texts(pool)
            document = [text for name, text in texts.items() if name.startswith("set-lf-secret.")]
            assert len(document) == 1 and "<secret>" in document[0], texts.keys()
            assert not [name for name, text in texts.items() if PASSPHRASE in text]
        listed = run_module("machine_set_info", pools=entries(pools), name=["lf-secret"])
        assert listed["machine_sets"] and PASSPHRASE not in json.dumps(listed), listed
        assert listed["machine_sets"][0]["template"]["volumes"][0]["passphrase"] == "<secret>"
    finally:
        run_module("machine_set", pools=entries(pools), name="lf-secret", state="absent")


def test_the_inventory_cache_file_is_private(registered, tmp_path):
    cache = tmp_path / "cache"
    source = tmp_path / "lf.machinery.yml"
    source.write_text(json.dumps({"plugin": "machinery.compute.machines", "pools": entries(registered[:1]),
                                  "cache": True, "cache_plugin": "ansible.builtin.jsonfile",
                                  "cache_connection": str(cache), "cache_timeout": 3600}))
    proc = subprocess.run([os.path.join(BIN, "ansible-inventory"), "-i", str(source), "--list"], capture_output=True,
                          text=True, check=False, timeout=300)
    assert proc.returncode == 0, proc.stderr
    files = list(cache.iterdir())
    assert files and all(stat.S_IMODE(path.stat().st_mode) == 0o600 for path in files), \
        [(path.name, oct(path.stat().st_mode)) for path in files]


def test_a_killed_tls_run_leaves_nothing_to_orphan(lab, tmp_path):
    """A TLS host that accepts and never answers holds the run after its identity directory was made."""
    temp = tmp_path / "tmp"
    temp.mkdir()
    files, texts = {}, {}
    for variable, name, origin in (
            ("MACHINERY_TLS_CACERT", "ca", lab["tls"]["ca"]),
            ("MACHINERY_TLS_CLIENTCERT", "cert", os.path.join(lab["tls"]["pkipath"], "clientcert.pem")),
            ("MACHINERY_TLS_CLIENTKEY", "key", os.path.join(lab["tls"]["pkipath"], "clientkey.pem"))):
        path = tmp_path / ("job-%s.pem" % name)
        with open(origin) as handle:
            texts[str(path)] = handle.read()
        path.write_text(texts[str(path)])
        files[variable] = str(path)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    accepted = []

    def accept():
        while len(accepted) < 3:
            accepted.append(listener.accept()[0])

    threading.Thread(target=accept, daemon=True).start()
    uri = "qemu+tls://127.0.0.1:%d/system" % listener.getsockname()[1]
    env = dict(files, TMPDIR=str(temp), MACHINERY_CONNECT_TIMEOUT="600")
    try:
        left = []
        for run in range(2):
            proc, args_file = start_module("machine_info", env=env, uri=uri)
            wait_for(lambda run=run: len(accepted) > run, proc, "the run connected")
            kill_mid_run(proc, args_file)
            left.append(sorted(os.listdir(str(temp))))
        # one private directory per user, reused by the next run: killed runs add nothing
        assert left[0] == left[1] == ["machinery-pki-%d" % os.getuid()], left
        root = temp / left[0][0]
        assert stat.S_IMODE(root.stat().st_mode) == 0o700 and len(os.listdir(str(root))) == 1
        # the job's credential files are gone (AWX removes them): the next run removes their directory
        for path in files.values():
            os.unlink(path)
            with open(path.replace("job-", "next-"), "w") as handle:
                handle.write(texts[path])
        env.update({variable: path.replace("job-", "next-") for variable, path in files.items()})
        proc, args_file = start_module("machine_info", env=env, uri=uri)
        wait_for(lambda: len(accepted) > 2, proc, "the run connected")
        kill_mid_run(proc, args_file)
        (kept,) = os.listdir(str(root))
        assert os.readlink(os.path.join(str(root), kept, "clientkey.pem")) == files["MACHINERY_TLS_CLIENTKEY"].replace(
            "job-", "next-")
    finally:
        listener.close()
        for conn in accepted:
            conn.close()


# --- 2. what killed runs leave --------------------------------------------------------------------------------

def make_volume(pool, name, size=4096):
    storage = pool.conn.storagePoolLookupByName("machinery")
    storage.refresh(0)
    storage.createXML("<volume><name>%s</name><capacity>%d</capacity><target><format type='raw'/>"
                      "</target></volume>" % (name, size), 0)


def test_an_orphan_console_log_is_replaced_by_a_move_and_removed_by_absent(registered, idle_image):
    source, target = registered[0], registered[1]
    name = "lf-mover"
    try:
        made = run_module("machine", uri=source.uri, name=name, machine_class="small", image=idle_image,
                          network_interfaces=[])  # running: it has a console log the move takes along
        assert not made.get("failed"), made
        assert "%s-console.log" % name in source.volumes()
        make_volume(target, "%s-console.log" % name)  # listed by no journal, used by no domain
        moved = run_module("machine_migrate", uri=source.uri, pools=entries(registered), machine=name,
                           target=target.name, mode="cold", shutdown_timeout=2)
        assert moved["changed"] is True and not moved.get("failed"), moved
        assert target.domain(name) is not None and source.domain(name) is None

        make_volume(source, "lf-ghost-console.log")
        gone = run_module("machine", uri=source.uri, name="lf-ghost", state="absent")
        assert gone["changed"] is True and not gone.get("failed"), gone
        assert "lf-ghost-console.log" not in source.volumes()
        again = run_module("machine", uri=source.uri, name="lf-ghost", state="absent")
        assert again["changed"] is False, again
    finally:
        for pool in (source, target):
            run_module("machine", uri=pool.uri, name=name, state="absent", shutdown_timeout=2)
            if "lf-ghost-console.log" in pool.volumes():
                pool.conn.storagePoolLookupByName("machinery").storageVolLookupByName("lf-ghost-console.log").delete(0)


def volume_secrets(pool, machine):
    return [secret.usageID() for secret in pool.conn.listAllSecrets(0)
            if secret.usageType() == libvirt.VIR_SECRET_USAGE_TYPE_VOLUME and "/%s-" % machine in secret.usageID()]


def settled(pool, timeout=120):
    """Wait until libvirtd has finished building a volume the killed run asked for (it outlives its client):
    until then the storage pool refuses a refresh."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return pool.volumes()
        except libvirt.libvirtError as exc:
            assert "asynchronous jobs" in str(exc) and time.monotonic() < deadline, exc
        time.sleep(0.1)


def test_a_killed_create_leaves_no_passphrase_secret_after_absent(registered, idle_image):
    pool = registered[0]
    name = "lf-luks"
    proc, args_file = start_module("machine", uri=pool.uri, name=name, machine_class="small", image=idle_image,
                                   network_interfaces=[], state="present",
                                   volumes=[{"name": "secure", "size": "16Mi", "encrypted": True,
                                             "passphrase": PASSPHRASE}])
    try:
        wait_for(lambda: volume_secrets(pool, name), proc, "the passphrase secret was defined")
        kill_mid_run(proc, args_file)
        assert pool.domain(name) is None  # killed before the domain was defined
        assert volume_secrets(pool, name)
        settled(pool)
        cleaned = run_module("machine", uri=pool.uri, name=name, state="absent")
        assert cleaned["changed"] is True and not cleaned.get("failed"), cleaned
        assert volume_secrets(pool, name) == []
        assert not [volume for volume in pool.volumes() if volume.startswith(name + "-")]
    finally:
        run_module("machine", uri=pool.uri, name=name, state="absent")


def backup_active(dom):
    try:
        dom.backupGetXMLDesc(0)
    except libvirt.libvirtError:
        return False
    return True


def test_a_killed_backup_needs_one_rerun(registered, image):
    pool = registered[0]
    name = "lf-backup"
    try:
        made = run_module("machine", uri=pool.uri, name=name, machine_class="small", image=image,
                          network_interfaces=[], volumes=[{"name": "data", "size": "256Mi"}])
        assert not made.get("failed"), made
        dom = pool.domain(name)
        proc, args_file = start_module("machine_backup", uri=pool.uri, machine=name, name="first")
        wait_for(lambda: backup_active(dom), proc, "the backup job began")
        kill_mid_run(proc, args_file)
        rerun = run_module("machine_backup", uri=pool.uri, machine=name, name="first")
        assert rerun["changed"] is True and not rerun.get("failed"), rerun
        assert {"%s.backup.first.vda.qcow2" % name, "%s.backup.first.vdb.qcow2" % name} <= set(pool.volumes())
    finally:
        run_module("machine_backup", uri=pool.uri, machine=name, name="first", state="absent")
        run_module("machine", uri=pool.uri, name=name, state="absent", shutdown_timeout=2)


# --- 3. a rollout below its floor -------------------------------------------------------------------------------

def running_members(pools, set_name):
    count = 0
    for pool in pools:
        for dom in pool.conn.listAllDomains(libvirt.VIR_CONNECT_LIST_DOMAINS_ACTIVE):
            try:
                xml = dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE)
            except libvirt.libvirtError:
                continue  # deleted meanwhile
            if '"%s": "%s"' % (OWNER, set_name) in xml or '"%s":"%s"' % (OWNER, set_name) in xml:
                count += 1
    return count


def test_a_rollout_keeps_its_floor_and_finishes(registered, idle_image):
    pools = registered
    name = "lf-roll"
    args = dict(pools=entries(pools), name=name, replicas=3, selector={"match_labels": {"app": name}},
                template={"machine_class": "small", "image": idle_image, "labels": {"app": name},
                          "network_interfaces": []}, wait="running", shutdown_timeout=2)
    try:
        made = run_module("machine_set", **args)
        assert made["ready_replicas"] == 3, made
        args["template"] = dict(args["template"], labels={"app": name, "tier": "new"})
        args["rollout"] = {"max_surge": 1, "max_unavailable": 1}
        lowest, watching = [3], threading.Event()

        def watch():
            while not watching.is_set():
                lowest[0] = min(lowest[0], running_members(pools, name))

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        rolled = run_module("machine_set", **args)
        watching.set()
        watcher.join()
        assert not rolled.get("failed") and rolled["changed"] is True, rolled
        assert rolled["ready_replicas"] == 3 and rolled["out_of_date"] == [], rolled
        assert lowest[0] >= 2, lowest  # replicas - max_unavailable
    finally:
        run_module("machine_set", pools=entries(pools), name=name, state="absent", shutdown_timeout=2)


# --- 4. failures that say what they did ---------------------------------------------------------------------

CLASS_DOC = {"apiVersion": "compute.ironcore.dev/v1alpha1", "kind": "MachineClass", "metadata": {"name": "lf-cls"},
             "capabilities": {"cpu": 1, "memory": "128Mi"}}
VOLUME_DOC = {"apiVersion": "storage.ironcore.dev/v1alpha1", "kind": "Volume", "metadata": {"name": "lf-vol"},
              "spec": {"resources": {"storage": "16Mi"}}}


def test_a_failed_absent_says_what_it_did_and_a_rerun_finishes(registered, idle_image):
    pools = registered
    user = pools[2]
    try:
        applied = run_module("manifest", pools=entries(pools), definition=[CLASS_DOC, VOLUME_DOC])
        assert not applied.get("failed"), applied
        used = run_module("machine", uri=user.uri, name="lf-user", machine_class="lf-cls", image=idle_image,
                          network_interfaces=[], state="present")
        assert not used.get("failed"), used
        failed = run_module("manifest", pools=entries(pools), definition=[CLASS_DOC, VOLUME_DOC], state="absent")
        assert failed.get("failed") and failed["changed"] is True, failed
        for pool in pools[:2]:
            assert "MachineClass/lf-cls: withdraw on %s" % pool.name in failed["msg"], failed["msg"]
            assert "MachineClass/lf-cls: withdraw on %s" % pool.name in failed["done"]
        assert "Volume/lf-vol: delete" in failed["msg"] and "lf-vol" not in pools[0].volumes()
        run_module("machine", uri=user.uri, name="lf-user", state="absent")
        rerun = run_module("manifest", pools=entries(pools), definition=[CLASS_DOC, VOLUME_DOC], state="absent")
        assert not rerun.get("failed") and rerun["actions"] == ["MachineClass/lf-cls: withdraw on %s" % user.name], \
            rerun
    finally:
        run_module("machine", uri=user.uri, name="lf-user", state="absent")
        run_module("manifest", pools=entries(pools), definition=[CLASS_DOC, VOLUME_DOC], state="absent")


def test_a_failed_set_run_reports_changed_and_what_it_made(registered, idle_image):
    pools = registered
    name = "lf-half"
    args = dict(pools=entries(pools), name=name, replicas=2, selector={"match_labels": {"app": name}},
                template={"machine_class": "small", "image": idle_image, "labels": {"app": name},
                          "network_interfaces": [], "volumes": [{"name": "data", "size": "16Mi"}]},
                shutdown_timeout=2)
    try:
        planned = run_module("machine_set", check=True, **args)
        creates = [action for action in planned["plan"] if action["action"] == "create"]
        assert len(creates) == 2, planned
        blocked = creates[1]
        pool = next(pool for pool in pools if pool.name == blocked["after"]["pool"])
        make_volume(pool, "%s-data.qcow2" % blocked["target"])  # someone else's volume in the way
        failed = run_module("machine_set", **args)
        assert failed.get("failed") and failed["changed"] is True, failed
        made = creates[0]
        assert [step for step in failed["done"] if step.startswith("create")] == [
            "create %s on %s" % (made["target"], made["after"]["pool"])], failed
        assert made["target"] in failed["msg"], failed["msg"]
    finally:
        run_module("machine_set", pools=entries(pools), name=name, state="absent", shutdown_timeout=2)
        for pool in pools:
            volume = [vol for vol in pool.volumes() if vol.startswith(name) and vol.endswith("-data.qcow2")]
            for vol in volume:
                pool.conn.storagePoolLookupByName("machinery").storageVolLookupByName(vol).delete(0)


# --- 5. a warning on every run ------------------------------------------------------------------------------------

def test_no_address_warning_when_every_host_that_can_have_an_address_has_one(registered, image, tmp_path):
    pool = registered[0]
    try:
        with_nic = run_module("machine", uri=pool.uri, name="lf-addr", machine_class="small", image=image,
                              wait="address", wait_timeout=180)
        assert not with_nic.get("failed"), with_nic
        without = run_module("machine", uri=pool.uri, name="lf-quiet", machine_class="small", image=image,
                             network_interfaces=[])
        assert not without.get("failed"), without
        source = tmp_path / "lf.machinery.yml"
        source.write_text(json.dumps({"plugin": "machinery.compute.machines", "pools": entries([pool])}))
        proc = subprocess.run([os.path.join(BIN, "ansible-inventory"), "-i", str(source), "--list"],
                              capture_output=True, text=True, check=False, timeout=300,
                              env=dict(os.environ, ANSIBLE_NOCOLOR="1"))
        assert proc.returncode == 0, proc.stderr
        hostvars = plain(json.loads(proc.stdout))["_meta"]["hostvars"]
        assert hostvars["lf-addr"]["ansible_host"] == with_nic["machine"]["ip_addresses"][0]
        assert "ansible_host" not in hostvars["lf-quiet"]
        assert "address source failed" not in " ".join(proc.stderr.split()), proc.stderr
    finally:
        for machine in ("lf-addr", "lf-quiet"):
            run_module("machine", uri=pool.uri, name=machine, state="absent", shutdown_timeout=2)

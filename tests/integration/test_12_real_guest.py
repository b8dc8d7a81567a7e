"""The user story on a real Debian guest: the machines role creates machines from the real image (make image-real),
the inventory plugin hands them over, a play runs inside them over SSH, the guest agent answers, a rebuild gives
one of them a new root on which cloud-init runs again (issue 25), and a stop goes through ACPI to systemd.

The guests are reachable only inside the lab's network namespaces: ssh gets there through a ProxyCommand that
enters the namespace of the pool's libvirtd (see playbooks/real_guest.yml), the lab's way in.
"""

import glob
import json
import os
import subprocess
import sys
import time

import libvirt
import pytest

from conftest import REPO, Pool, load_lab, lab_file, register, run_module, warnings_of

from ansible_collections.machinery.compute.plugins.module_utils.machines import guest as guest_agent

BIN = os.path.dirname(sys.executable)
PLAYBOOK = os.path.join(REPO, "tests", "integration", "playbooks", "real_guest.yml")
NAMES = ["real-1", "real-2"]
# A real system needs more memory than the busybox guests; one CPU each keeps two TCG guests on two cores.
CLASS_REAL = {"name": "real", "cpu": 1, "memory": "512Mi"}
LABELS = {"suite": "real-guest"}
SHUTDOWN_TIMEOUT = 120
ROOT_SIZE = "3Gi"
# The guest the rebuild test gives a new root: it has a data volume, which the rebuild keeps.
REBUILT = NAMES[1]
REBUILT_IMAGE = "real-rebuild"
DATA_VOLUME = {"name": "data", "size": "64Mi"}
HANDMADE = "/root/written-by-hand"
RUNCMD_FILE = "/var/tmp/machinery-runcmd"


def real_image():
    """$MACHINERY_REAL_IMAGE, else machinery-real.qcow2 beside the lab's busybox image (make image-real)."""
    path = os.environ.get("MACHINERY_REAL_IMAGE")
    if not path:
        lab_image = load_lab().get("image") or ""
        path = os.path.join(os.path.dirname(lab_image), "machinery-real.qcow2")
    if not os.path.isfile(path):
        pytest.skip("no real test image at %s (make image-real)" % path)
    return path


def sha256(path):
    proc = subprocess.run(["sha256sum", path], capture_output=True, text=True, check=True)
    return proc.stdout.split()[0]


def delete_machines(pools):
    for pool in pools:
        for name in NAMES:
            if pool.domain(name) is not None:
                run_module("machine", uri=pool.uri, name=name, state="absent", shutdown_timeout=10)


def stop_ssh_masters(control_dir):
    """ansible's ssh keeps a master connection per guest (ControlPersist): close them, and their ProxyCommand."""
    for socket in glob.glob(os.path.join(control_dir, "*")):
        subprocess.run(["ssh", "-o", "ControlPath=%s" % socket, "-O", "exit", "guest"], capture_output=True,
                       check=False, timeout=30)


@pytest.fixture(scope="module")
def story(tmp_path_factory):
    """Every lab pool registered with class real; ssh key, inventory source and ssh control directory."""
    image = real_image()
    lab = load_lab()
    pools = [Pool(entry["name"], entry["uri"]) for entry in lab["pools"]]
    for pool in pools:
        register(pool)
        published = run_module("machine_class", uri=pool.uri, **CLASS_REAL)
        assert not published.get("failed"), published
    delete_machines(pools)
    work = tmp_path_factory.mktemp("real-guest")
    key = work / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "machinery-real-guest", "-f", str(key)],
                   check=True, timeout=60)
    source = work / "real.machinery.yml"
    source.write_text(json.dumps({
        "plugin": "machinery.compute.machines",
        "pools": [{"name": pool.name, "uri": pool.uri} for pool in pools],
        "groups": {"real_guests": "machinery.labels.suite | default('') == 'real-guest'"}}))
    control_dir = work / "cp"
    control_dir.mkdir()
    data = {"pools": pools, "image": image, "work": work, "key": key, "source": source,
            "public_key": (work / "id_ed25519.pub").read_text().strip(), "control_dir": str(control_dir)}
    yield data
    stop_ssh_masters(data["control_dir"])
    delete_machines(pools)
    checksum = sha256(image)
    for pool in pools:
        run_module("machine_class", uri=pool.uri, name=CLASS_REAL["name"], state="absent")
        run_module("machine_image", uri=pool.uri, name=REBUILT_IMAGE, state="absent", force=True)
        # the pool's cached copy of the image, unless a volume still has it as its backing file
        storage = pool.conn.storagePoolLookupByName("machinery")
        storage.refresh(0)
        volumes = storage.listAllVolumes(0)
        cached = [vol for vol in volumes if vol.name().startswith("image-%s." % checksum[:32])]
        others = [vol.XMLDesc(0) for vol in volumes if vol not in cached]
        if not any(vol.path() in xml for vol in cached for xml in others):
            for vol in cached:
                vol.delete(0)


def spec(name, public_key, image):
    # root_size beyond the image's 2 GiB: cloud-init's growpart grows the root partition and file system into it
    machine = {"name": name, "machine_class": CLASS_REAL["name"], "image": image, "root_size": ROOT_SIZE,
               "labels": LABELS, "ssh_authorized_keys": [public_key],
               "cloud_init": {"user_data": {
                   "users": ["default", {"name": "alice", "gecos": "Machinery test user", "shell": "/bin/bash",
                                         "ssh_authorized_keys": [public_key]}],
                   "write_files": [{"path": "/etc/machinery/cloud-init.txt",
                                    "content": "written by cloud-init on %s\n" % name}],
                   "runcmd": [["sh", "-c", 'echo "runcmd ran as $(id -un) on $(hostname)" >%s' % RUNCMD_FILE]],
               }}}
    if name == REBUILT:
        machine["volumes"] = [DATA_VOLUME]
    return machine


def playbook(story, **extra):
    variables = story["work"] / "vars.json"
    variables.write_text(json.dumps(dict(extra, lab_file=lab_file(), guest_key=str(story["key"]))))
    env = dict(os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0", ANSIBLE_HOST_KEY_CHECKING="false",
               ANSIBLE_PIPELINING="true", ANSIBLE_SSH_ARGS="-o ControlMaster=auto -o ControlPersist=30s",
               ANSIBLE_SSH_CONTROL_PATH_DIR=story["control_dir"], ANSIBLE_LOCALHOST_WARNING="false")
    proc = subprocess.run([os.path.join(BIN, "ansible-playbook"), "-i", str(story["source"]), PLAYBOOK,
                           "-e", "@%s" % variables], capture_output=True, text=True, env=env, timeout=1200,
                          check=False)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    return proc


def hostvars(story, **options):
    config = json.loads(story["source"].read_text())
    config.update(options)
    source = story["work"] / "agent.machinery.yml"
    source.write_text(json.dumps(config))
    proc = subprocess.run([os.path.join(BIN, "ansible-inventory"), "-i", str(source), "--list"],
                          capture_output=True, text=True, env=dict(os.environ, ANSIBLE_NOCOLOR="1"), check=True,
                          timeout=300)
    return json.loads(proc.stdout)["_meta"]["hostvars"]


def unwrap(value):
    """ansible-inventory shows strings marked unsafe as {"__ansible_unsafe": ...}."""
    return value["__ansible_unsafe"] if isinstance(value, dict) and "__ansible_unsafe" in value else value


def where(pools, name):
    return next(pool for pool in pools if pool.domain(name) is not None)


def test_play_inside_real_guests(story):
    results = story["work"] / "results.json"
    started = time.monotonic()
    playbook(story, machines=[spec(name, story["public_key"], story["image"]) for name in NAMES],
             results_file=str(results))
    print("\ncreate, boot, ssh and the play inside: %.0f s" % (time.monotonic() - started))
    summary = json.loads(results.read_text())
    assert sorted(summary) == NAMES, summary
    for name, guest in sorted(summary.items()):
        print("%s: up %.0f s at its first ssh session" % (name, float(guest["uptime_at_first_ssh"])))
    for name, guest in summary.items():
        pool = where(story["pools"], name)
        leases = {lease["hostname"]: lease["ipaddr"] for lease in pool.leases() if lease.get("hostname")}
        assert guest["hostname"] == name
        assert (guest["distribution"], guest["distribution_major_version"]) == ("Debian", "12")
        assert guest["kernel"].endswith("-cloud-amd64"), guest
        # the inventory's ansible_host is the DHCP lease, and the guest's own default address
        assert guest["ansible_host"] == guest["address"] == leases[name]
        assert guest["user"] == "debian"
        assert "status: done" in guest["cloud_init_status"]
        assert guest["write_files"] == "written by cloud-init on %s\n" % name
        assert guest["runcmd"] == "runcmd ran as root on %s\n" % name
        # getent's passwd entry: password, uid, gid, gecos, home, shell
        assert guest["alice"][3:] == ["Machinery test user", "/home/alice", "/bin/bash"], guest["alice"]
        assert guest["written"] == "%s %s\n" % (name, guest["address"])
        # the root file system grew from the image's 2 GiB towards the 3 GiB disk
        assert int(guest["root_bytes"]) > 2.5 * 2 ** 30, guest["root_bytes"]


def test_inventory_and_guest_agent(story):
    pools = story["pools"]
    listed = hostvars(story)
    by_agent = hostvars(story, address_source=["agent"])
    for name in NAMES:
        dom = where(pools, name).domain(name)
        address = unwrap(listed[name]["ansible_host"])
        # hostname, OS, kernel and addresses from the QEMU guest agent, through libvirt
        info = dom.guestInfo(libvirt.VIR_DOMAIN_GUEST_INFO_HOSTNAME | libvirt.VIR_DOMAIN_GUEST_INFO_OS, 0)
        assert info["hostname"] == name
        assert info["os.id"] == "debian" and info["os.version-id"] == "12"
        assert info["os.kernel-release"].endswith("-cloud-amd64")
        agent = dom.interfaceAddresses(libvirt.VIR_DOMAIN_INTERFACE_ADDRESSES_SRC_AGENT, 0)
        addresses = [entry["addr"] for nic in agent.values() for entry in nic["addrs"] or []]
        assert address in addresses, agent
        # the inventory asked only for the agent finds the same address
        assert unwrap(by_agent[name]["ansible_host"]) == address


def adhoc(story, host, module_name, args):
    """``ansible HOST -m MODULE -a ARGS`` through the guest_agent connection plugin, with nothing but the inventory
    source: it sets the pool's URI and the domain for the plugin. (rc, the result as --tree wrote it)."""
    tree = story["work"] / "tree"
    result_file = tree / host
    if result_file.exists():
        result_file.unlink()
    proc = subprocess.run([os.path.join(BIN, "ansible"), host, "-i", str(story["source"]), "-c",
                           "machinery.compute.guest_agent", "-m", module_name, "-a", args, "--tree", str(tree)],
                          capture_output=True, text=True, env=dict(os.environ, ANSIBLE_NOCOLOR="1"), check=False,
                          timeout=900)
    assert result_file.exists(), "no result (rc %d): %s %s" % (proc.returncode, proc.stdout[-3000:],
                                                               proc.stderr[-3000:])
    return proc.returncode, json.loads(result_file.read_text())


def test_tasks_through_the_guest_agent(story):
    """Modules and files inside a real guest through its QEMU guest agent, with no network path used."""
    name = NAMES[0]
    pool = where(story["pools"], name)
    status = run_module("machine_info", uri=pool.uri, name=name)["machines"][0]
    guest = status["guest"]
    assert guest["hostname"] == name and guest["os"]["id"] == "debian" and guest["os"]["version_id"] == "12"
    assert guest["kernel"]["release"].endswith("-cloud-amd64") and guest["boot_time"] >= status["created"]
    assert {"type": "BootstrapReady", "status": "True", "reason": "GuestAgentAnswered", "message": ""} \
        in status["conditions"]
    started = time.monotonic()
    rc, result = adhoc(story, name, "ansible.builtin.command", "cat /etc/hostname")
    assert rc == 0 and result["stdout"] == name, result
    content = "placed through the guest agent\n"
    args = "content=%r dest=/etc/machinery-agent.txt mode=0640" % content
    rc, result = adhoc(story, name, "ansible.builtin.copy", args)
    assert rc == 0 and result["changed"] is True, result
    rc, result = adhoc(story, name, "ansible.builtin.copy", args)
    assert rc == 0 and result["changed"] is False, result
    rc, result = adhoc(story, name, "ansible.builtin.fetch", "src=/etc/machinery-agent.txt dest=%s/ flat=true"
                       % story["work"])
    assert rc == 0, result
    assert (story["work"] / "machinery-agent.txt").read_text() == content
    rc, result = adhoc(story, name, "ansible.builtin.stat", "path=/etc/machinery-agent.txt")
    assert result["stat"]["mode"] == "0640" and result["stat"]["pw_name"] == "root", result
    print("\ncommand, copy twice, fetch and stat through the guest agent: %.0f s" % (time.monotonic() - started))


def in_guest(dom, script, timeout=120):
    """``script`` run with sh in the guest through its agent: (exit code, stdout and stderr)."""
    code, out, err = guest_agent.Agent(dom).run("/bin/sh", ["-c", script], timeout=timeout)
    return code, (out + err).decode(errors="replace")


def guest_file(pool, name, path, timeout=600):
    """The content of ``path`` in the guest once its agent answers and the file is there (cloud-init writes it
    late in the boot): asked again until the deadline, each answer is the guest's own."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            return guest_agent.Agent(pool.domain(name)).read_file(path).decode()
        except guest_agent.AgentError as exc:
            last = exc
        time.sleep(1)
    raise AssertionError("%s never had %s: %s" % (name, path, last))


def test_rebuild_runs_cloud_init_again_on_a_new_root(story, capsys):
    """A rebuild of a running real guest (rebuild: true and another image): the machine shuts down through ACPI and
    starts on a new root where cloud-init runs again for the new instance id; a file written by hand on the old
    root is gone; the data volume keeps its file system and its file."""
    pool = where(story["pools"], REBUILT)
    assert guest_file(pool, REBUILT, "/var/lib/cloud/data/instance-id").strip() == "iid-%s" % REBUILT
    code, out = in_guest(pool.domain(REBUILT), "mkfs.ext4 -q /dev/vdb && mount /dev/vdb /mnt && echo kept "
                         ">/mnt/data-file && umount /mnt && echo old-root >%s && rm %s && sync"
                         % (HANDMADE, RUNCMD_FILE))
    assert code == 0, out
    # the same file published under a name: another image for the machine, so a rebuild; its root is new
    published = run_module("machine_image", uri=pool.uri, name=REBUILT_IMAGE, path=story["image"])
    assert not published.get("failed"), published
    load = os.getloadavg()
    asked = time.monotonic()
    rebuilt = run_module("machine", uri=pool.uri, shutdown_timeout=SHUTDOWN_TIMEOUT, rebuild=True,
                         **spec(REBUILT, story["public_key"], REBUILT_IMAGE))
    ran = time.monotonic() - asked
    assert rebuilt["changed"] is True and rebuilt["actions"] == ["rebuild"], rebuilt
    assert not rebuilt.get("warnings"), rebuilt  # shut down through ACPI, not forced
    assert guest_file(pool, REBUILT, "/var/lib/cloud/data/instance-id").strip() == "iid-%s.r1" % REBUILT
    # runcmd ran again in the new root (the file was removed from the old one before the rebuild)
    assert guest_file(pool, REBUILT, RUNCMD_FILE) == "runcmd ran as root on %s\n" % REBUILT
    ready = time.monotonic() - asked
    code, out = in_guest(pool.domain(REBUILT), "test -e %s; echo gone=$?; mount /dev/vdb /mnt && cat /mnt/data-file; "
                         "umount /mnt" % HANDMADE)
    assert code == 0 and out.split() == ["gone=1", "kept"], out
    with capsys.disabled():
        print("\nreal guest rebuild: the run %.1f s (ACPI shutdown included), until cloud-init ran again %.1f s; "
              "load average before %.2f %.2f %.2f" % ((ran, ready) + load))


def test_graceful_stop_through_acpi(story):
    for name in NAMES:
        pool = where(story["pools"], name)
        started = time.monotonic()
        stopped = run_module("machine", uri=pool.uri, name=name, state="stopped",
                             shutdown_timeout=SHUTDOWN_TIMEOUT)
        took = time.monotonic() - started
        assert stopped["changed"] is True and stopped["actions"] == ["stop"], stopped
        assert stopped["machine"]["phase"] == "Shutdown"
        assert not any("forced" in warning for warning in warnings_of(stopped))
        assert not pool.domain(name).isActive()
        # systemd took the power button (logind) and powered the machine off itself
        console = pool.console(name)
        assert "systemd-shutdown" in console and "reboot: Power down" in console, console[-3000:]
        assert took < SHUTDOWN_TIMEOUT / 2, took
        print("%s: graceful stop in %.1f s" % (name, took))

"""machine_migrate and the drain role against the lab: cold moves with their data, moves killed midway and
resumed, a live move, draining a pool of three machines, bad input. Every effect is checked from libvirt."""

import hashlib
import json
import random
import re
import signal
import subprocess
import time

import libvirt

from conftest import ModuleRun, assert_failed, register, run_module, run_playbook

MIB = 2 ** 20
SEED = 1311


def fleet(pools):
    return [{"name": pool.name, "uri": pool.uri} for pool in pools]


def homes(pools, name):
    return [pool for pool in pools if pool.domain(name) is not None]


def listed(pool, storage_pool="machinery"):
    """The volumes of a storage pool, read afresh (libvirt refuses a refresh while a volume is being created)."""
    for _attempt in range(100):
        try:
            return pool.volumes(storage_pool)
        except libvirt.libvirtError:
            time.sleep(0.02)
    return pool.volumes(storage_pool)


def owned_volumes(pool, name):
    return [volume for volume in listed(pool) if volume.startswith(name + "-")]


def journals(pool, name):
    return [volume for volume in listed(pool, "machinery-registry") if volume.startswith("move-%s." % name)]


def half_cached_images(pool):
    names = listed(pool)
    return [name for name in names if name.startswith("image-") and not name.endswith(".complete")
            and name + ".complete" not in names]


def upload(pool, volume, data):
    storage = pool.conn.storagePoolLookupByName("machinery")
    stream = pool.conn.newStream(0)
    storage.storageVolLookupByName(volume).upload(stream, 0, len(data), 0)
    for offset in range(0, len(data), MIB):
        chunk = data[offset:offset + MIB]
        while chunk:
            chunk = chunk[stream.send(chunk):]
    stream.finish()


def disk_image(raw, tmp_path, tag):
    """``raw`` (what the guest reads from the disk) as the bytes of a qcow2 file, made with qemu-img."""
    (tmp_path / ("%s.raw" % tag)).write_bytes(raw)
    subprocess.run(["qemu-img", "convert", "-f", "raw", "-O", "qcow2", str(tmp_path / ("%s.raw" % tag)),
                    str(tmp_path / ("%s.qcow2" % tag))], check=True)
    return (tmp_path / ("%s.qcow2" % tag)).read_bytes()


def guest_bytes(pool, volume, tmp_path):
    """What a guest reads from the qcow2 ``volume`` of ``pool``: downloaded through libvirt, read by qemu-img."""
    (tmp_path / "copy.qcow2").write_bytes(pool.download(volume))
    subprocess.run(["qemu-img", "convert", "-f", "qcow2", "-O", "raw", str(tmp_path / "copy.qcow2"),
                    str(tmp_path / "copy.raw")], check=True)
    return (tmp_path / "copy.raw").read_bytes()


def volume_xml(pool, volume):
    storage = pool.conn.storagePoolLookupByName("machinery")
    storage.refresh(0)
    return storage.storageVolLookupByName(volume).XMLDesc(0)


def record(pool, name):
    xml = pool.domain(name).XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE)
    return json.loads(re.search(r"<machinery:machine[^>]*>(.*)</machinery:machine>", xml).group(1))


def macs(pool, name):
    return re.findall(r"<mac address='([^']+)'", pool.domain(name).XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE))


def snapshot(pools):
    """Everything a refused move must leave as it was: domains, their states, volumes, registry documents."""
    return {pool.name: (sorted((dom.name(), dom.isActive()) for dom in pool.conn.listAllDomains(0)), listed(pool),
                        listed(pool, "machinery-registry")) for pool in pools}


def make(pool, image, name, state="running", data="64Mi", marker=None):
    """A machine with a data volume ``<name>-data.qcow2`` that outlives it (attached with volume_attach, so that
    volume_attach can unplug and plug it again), its seed's user-data ``marker``."""
    run_module("machine", uri=pool.uri, name=name, state="absent", shutdown_timeout=1)
    result = run_module("machine", uri=pool.uri, name=name, machine_class="small", image=image, state="present",
                        cloud_init={"user_data": marker or "marker-%s" % name},
                        network_interfaces=[{"name": "eth0", "network": "machinery"}])
    assert result["changed"], result
    attached = run_module("volume_attach", uri=pool.uri, machine=name, volume="%s-data.qcow2" % name, size=data,
                          ephemeral=False)
    assert attached["changed"], attached
    if state == "running":
        assert run_module("machine", uri=pool.uri, name=name, state="running", wait="none")["changed"]


def remove(pools, name):
    for pool in pools:
        run_module("machine", uri=pool.uri, name=name, state="absent", shutdown_timeout=1)
        storage = pool.conn.storagePoolLookupByName("machinery")
        storage.refresh(0)
        for volume in owned_volumes(pool, name):
            storage.storageVolLookupByName(volume).delete(0)


def test_cold_move_keeps_the_data_and_the_identity(registered, image, tmp_path, capsys):
    pools = registered
    source, target = pools[0], pools[1]
    name = "mig-cold"
    marker = "moved-user-data-%d" % SEED
    data = random.Random(SEED).randbytes(64 * MIB)  # 64 MiB the guest reads from its data disk
    try:
        make(source, image, name, state="present", marker=marker)
        # the guest cannot write to a disk: its data is written from the host, through a libvirt upload
        upload(source, "%s-data.qcow2" % name, disk_image(data, tmp_path, "data"))
        assert run_module("machine", uri=source.uri, name=name, state="running")["changed"]
        source.wait_console(name, "MACHINERY-READY", 180)
        before = {"uuid": source.domain(name).UUIDString(), "macs": macs(source, name), "record": record(source, name)}
        args = dict(uri=source.uri, pools=fleet(pools), machine=name, target=target.name, mode="cold",
                    shutdown_timeout=60)

        unchanged = snapshot(pools)
        planned = run_module("machine_migrate", check=True, **args)
        assert planned["changed"] is True and planned["actions"] == ["move"], planned
        assert planned["diff"] == {"before": {"pool": source.name}, "after": {"pool": target.name, "mode": "cold"}}
        steps = [item["action"] for item in planned["plan"][0]["steps"]]
        assert steps[:2] == ["write_journal", "shutdown"] and steps[-2:] == ["undefine", "clear_journal"]
        assert steps.index("define") > max(index for index, item in enumerate(steps) if item == "copy_volume")
        assert snapshot(pools) == unchanged and source.domain(name).isActive()

        started = time.monotonic()
        moved = run_module("machine_migrate", **args)
        assert moved["changed"] is True and not moved.get("failed"), moved
        assert moved["source"]["pool"] == source.name and moved["target"]["pool"] == target.name
        assert moved["machine"]["pool"] == target.name and moved["machine"]["phase"] == "Running"
        assert [pool.name for pool in homes(pools, name)] == [target.name]
        text = target.wait_console(name, "MACHINERY-READY", 180)
        ready = time.monotonic() - started

        # the same machine: UUID, MACs, record (created, boots, labels, spec) and files
        assert target.domain(name).UUIDString() == before["uuid"]
        assert macs(target, name) == before["macs"]
        assert record(target, name) == before["record"]
        assert owned_volumes(source, name) == [] and journals(source, name) == journals(target, name) == []
        assert sorted(owned_volumes(target, name)) == ["%s-%s" % (name, suffix) for suffix in
                                                       ("cidata.iso", "console.log", "data.qcow2", "root.qcow2")]
        # the root disk is still a thin overlay, now on the target's cache of the image
        root = volume_xml(target, "%s-root.qcow2" % name)
        assert "<path>/var/lib/libvirt/machinery/image-" in root.split("<backingStore>")[1]
        assert int(re.search(r"<physical unit='bytes'>(\d+)<", root).group(1)) < 2 * MIB
        # every byte the guest reads from its data disk came along, and the guest read its moved seed
        assert hashlib.sha256(guest_bytes(target, "%s-data.qcow2" % name, tmp_path)).digest() == \
            hashlib.sha256(data).digest()
        assert marker in text
        # the guest on the target sees the 64 MiB data volume: unplugged and plugged again, it reports it
        volume = "%s-data.qcow2" % name
        assert run_module("volume_attach", uri=target.uri, machine=name, volume=volume, state="detached")["changed"]
        target.wait_console(name, "MACHINERY-BLOCK-REMOVED vdb", 60)
        assert run_module("volume_attach", uri=target.uri, machine=name, volume=volume)["changed"]
        assert "MACHINERY-BLOCK-ADDED vdb %d" % (64 * MIB // 512) in target.wait_console(
            name, "MACHINERY-BLOCK-ADDED vdb", 60)

        again = run_module("machine_migrate", **args)
        assert again["changed"] is False and again["actions"] == [], again
        with capsys.disabled():
            print("\n[measure] cold move of a machine with a 64 MiB data volume (64 MiB written): downtime %.2f s "
                  "(shutdown request -> domain running on the target), %.1f s until the guest printed "
                  "MACHINERY-READY there" % (moved["downtime"], ready))
    finally:
        remove(pools, name)


# The moments a move can be killed at, each seen from libvirt: the test waits for it, lets a seeded random few
# milliseconds pass, freezes the module (SIGSTOP), looks, and kills it (SIGKILL).
MOMENTS = {
    "journaled": lambda name, source, target: bool(journals(source, name)),
    "stopped": lambda name, source, target: source.domain(name) is None or not source.domain(name).isActive(),
    "copying": lambda name, source, target: bool(owned_volumes(target, name)),
    "defined": lambda name, source, target: target.domain(name) is not None,
    "started": lambda name, source, target: target.domain(name) is not None and target.domain(name).isActive(),
    "deleting": lambda name, source, target: source.domain(name) is None or len(owned_volumes(source, name)) < 4,
}


def seen_at(moment, name, source, target):
    while True:
        try:
            return MOMENTS[moment](name, source, target)
        except libvirt.libvirtError:  # a domain went between its lookup and the question: look again
            continue


def whole(pool, name):
    """The pool has the machine's domain and every file its domain names."""
    dom = pool.domain(name)
    if dom is None:
        return False
    files = set(re.findall(r"file='/var/lib/libvirt/machinery/([^']+)'", dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE)))
    return files - {"%s-console.log" % name} <= set(listed(pool))


def test_moves_killed_midway_are_finished_or_rolled_back_by_a_rerun(registered, idle_image, capsys):
    pools = registered
    name = "mig-kill"
    rng = random.Random(SEED)
    killed = 0
    try:
        make(pools[1], idle_image, name, data="8Mi")
        for round_number, moment in enumerate(rng.sample(sorted(MOMENTS), len(MOMENTS))):
            source = homes(pools, name)[0]
            target = pools[2] if source is pools[1] else pools[1]
            move = ModuleRun("machine_migrate", diff=False, pools=fleet(pools), machine=name, target=target.name,
                             mode="cold", shutdown_timeout=1)
            try:
                deadline = time.monotonic() + 60
                while move.running() and not seen_at(moment, name, source, target):
                    assert time.monotonic() < deadline, "never saw %s" % moment
                    time.sleep(0.003)
                time.sleep(rng.uniform(0, 0.02))
                frozen = move.running()
                if frozen:
                    move.proc.send_signal(signal.SIGSTOP)
                    killed += 1
                seen = [key for key in MOMENTS if seen_at(key, name, source, target)]
            finally:
                move.kill(group=False)
            # whatever the moment, the machine is whole on a pool
            assert any(whole(pool, name) for pool in (source, target)), (moment, seen)

            rerun = run_module("machine_migrate", pools=fleet(pools), machine=name, target=target.name, mode="cold",
                               shutdown_timeout=1)
            assert not rerun.get("failed"), rerun
            with capsys.disabled():
                print("\n[kill] round %d, %s -> %s: %s once %s; libvirt then showed %s; the re-run did %s"
                      % (round_number, source.name, target.name, "killed" if frozen else "finished before the kill",
                         moment, ", ".join(seen) or "nothing yet", rerun["actions"]))
            assert [pool.name for pool in homes(pools, name)] == [target.name], (moment, rerun)
            assert whole(target, name) and target.domain(name).isActive(), (moment, rerun)
            assert owned_volumes(source, name) == [], (moment, rerun)
            assert len(owned_volumes(target, name)) == 4, (moment, owned_volumes(target, name))
            for pool in pools:
                assert journals(pool, name) == [] and half_cached_images(pool) == [], (moment, pool.name)
            assert run_module("machine_migrate", pools=fleet(pools), machine=name, target=target.name)["changed"] \
                is False
        assert killed >= len(MOMENTS) - 2, "only %d of the moves were killed before they finished" % killed
    finally:
        remove(pools, name)


def test_live_move_keeps_the_guest_running(registered, image, capsys):
    pools = registered
    source, target = pools[2], pools[0]
    name = "mig-live"
    try:
        make(source, image, name, data="8Mi")
        source.wait_console(name, "MACHINERY-READY", 180)
        moved = run_module("machine_migrate", uri=source.uri, pools=fleet(pools), machine=name, target=target.name,
                           mode="live")
        assert moved["changed"] is True and moved["mode"] == "live", moved
        assert [pool.name for pool in homes(pools, name)] == [target.name]
        assert owned_volumes(source, name) == [] and journals(source, name) == journals(target, name) == []
        # the same guest, not a new boot: it answers the power button without booting again on the target
        target.domain(name).shutdownFlags(libvirt.VIR_DOMAIN_SHUTDOWN_ACPI_POWER_BTN)
        text = target.wait_console(name, "MACHINERY-POWEROFF", 60)
        assert "MACHINERY-TEST-BOOT" not in text
        with capsys.disabled():
            print("\n[measure] live move of a running machine with an 8 MiB data volume: downtime %s s (libvirt's "
                  "switch-over pause)" % moved["downtime"])
    finally:
        remove(pools, name)


def play(tmp_path, tag, **variables):
    playbook = tmp_path / "drain.yml"
    playbook.write_text("""---
- name: Drain a pool
  hosts: localhost
  connection: local
  gather_facts: false
  tasks:
    - name: Drain
      ansible.builtin.include_role:
        name: machinery.compute.drain
""")
    return run_playbook(playbook, tmp_path / ("vars-%s.json" % tag), variables)


def test_drain_moves_every_machine_off_a_pool_with_its_data(registered, image, tmp_path):
    pools = registered
    drained = pools[0]
    names = ["mig-drain-%d" % index for index in range(3)]
    stays = "mig-drain-tolerant"  # tolerates the taint: stays where it is
    blobs = {name: random.Random(name).randbytes(8 * MIB) for name in names}
    taint = [{"key": "maintenance", "value": "drain", "effect": "NoExecute"}]
    tolerations = [{"key": "maintenance", "operator": "Exists", "effect": "NoExecute"}]
    try:
        for name in names:
            make(drained, image, name, state="present", data="8Mi")
            upload(drained, "%s-data.qcow2" % name, disk_image(blobs[name], tmp_path, name))
            run_module("machine", uri=drained.uri, name=name, state="running", wait="none")
        tolerant = dict(uri=drained.uri, name=stays, machine_class="small", image=image, state="present",
                        tolerations=tolerations)
        assert run_module("machine", **tolerant)["changed"]
        again = run_module("machine", **tolerant)
        assert again["changed"] is False and again["actions"] == [], again  # recorded, compared, unchanged
        for name in names:
            drained.wait_console(name, "MACHINERY-READY", 240)
        register(drained, taints=taint)
        status = run_module("machine_pool_info", uri=drained.uri)["pools"][0]
        ours = [name for name in status["must_leave"] if name.startswith("mig-drain-")]
        assert ours == sorted(names), status  # by the tolerations each record keeps
        variables = {"drain_pool": drained.name, "drain_pools": fleet(pools), "drain_mode": "cold",
                     "drain_shutdown_timeout": 30}
        proc, recap = play(tmp_path, "first", **variables)
        assert recap["failed"] == 0, proc.stdout[-5000:]
        assert recap["changed"] == 1, proc.stdout[-5000:]  # the one task that moves, once per machine
        assert "NAME" in proc.stdout and "DOWNTIME" in proc.stdout and "no NoExecute taint" not in proc.stdout
        for name in names:
            found = homes(pools, name)
            assert len(found) == 1 and found[0] is not drained, name
            assert found[0].domain(name).isActive()
            assert found[0].wait_console(name, "marker-%s" % name, 180)  # the guest read its moved seed
            assert guest_bytes(found[0], "%s-data.qcow2" % name, tmp_path) == blobs[name]
            assert owned_volumes(drained, name) == []
        assert {homes(pools, name)[0].name for name in names} == {pools[1].name, pools[2].name}  # spread
        assert homes(pools, stays) == [drained]
        assert stays not in run_module("machine_pool_info", uri=drained.uri)["pools"][0]["must_leave"]

        proc, recap = play(tmp_path, "again", **variables)
        assert recap["failed"] == 0 and recap["changed"] == 0, proc.stdout[-5000:]
    finally:
        register(drained, taints=[])
        for name in names + [stays]:
            remove(pools, name)


def test_bad_input_names_the_field_and_changes_nothing(registered, image):
    pools = registered
    source = pools[1]
    name = "mig-bad"
    try:
        make(source, image, name, state="present", data="8Mi")
        unchanged = snapshot(pools)
        base = dict(uri=source.uri, pools=fleet(pools))
        assert_failed(run_module("machine_migrate", machine="no-such-machine", target=pools[2].name, **base),
                      "machine", "no machine no-such-machine")
        assert_failed(run_module("machine_migrate", machine=name, target=source.name, **base),
                      "target", "the pool the machine is moved off")
        assert_failed(run_module("machine_migrate", machine=name, target="pool-nowhere", **base),
                      "target", "no pool named pool-nowhere")
        assert_failed(run_module("machine_migrate", machine=name, target=pools[2].name, mode="live", **base),
                      "mode", "needs a running machine")
        assert_failed(run_module("machine_migrate", machine=name, target="qemu:///nowhere", **base),
                      "target")
        assert_failed(run_module("machine_migrate", machine=name, pools=fleet(pools)), "uri")
        assert snapshot(pools) == unchanged
    finally:
        remove(pools, name)

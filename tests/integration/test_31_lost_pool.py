"""Surviving a lost pool: a set whose pool's libvirtd dies with its guests running replaces the members there after
``unreachable_timeout``, and fences their stale copies when the daemon comes back, before anything else; exactly
``replicas`` members run. A pool back before the timeout keeps its member. A machine of that pool outside the set
is never touched. Every effect is read from libvirt and from the process table.

The daemon is the lab's own: stopped by its pid, and started again here in the namespaces its guests still run in
(``lab.py up`` would take them for a crashed pool's leftovers and kill them); the lab starts it in a finally when
a test fails midway."""

import datetime
import json
import os
import subprocess
import threading
import time

import libvirt
import pytest

from conftest import labelled_domains, lab_file, lab_pid, process_running, qemu_pids, start_daemons, stop_daemon


@pytest.fixture(name="image", scope="session")
def idle_guest_image(idle_image):
    """Nothing here looks inside a guest: its machines run the idle image (conftest.idle_image), at no CPU cost."""
    return idle_image


SET = "lostpool"
OWNER = "machinery.compute/machine-set"
BYSTANDER = "lostpool-bystander"
REGISTRY = "machinery-registry"
TIMINGS = {}
HOUR = 3600.5


def set_args(pools, image, timeout, replicas=3, **extra):
    args = dict(pools=[{"name": p.name, "uri": p.uri} for p in pools], name=SET, replicas=replicas,
                selector={"match_labels": {"app": SET}}, unreachable_timeout=timeout,
                template={"machine_class": "small", "image": image, "labels": {"app": SET},
                          "network_interfaces": []}, wait="running", shutdown_timeout=2)
    args.update(extra)
    return args


def members(pools):
    """{name: (pool, uuid, active)} of the set's members on the pools whose daemon answers."""
    return {dom.name(): (pool.name, dom.UUIDString(), bool(dom.isActive()))
            for pool, dom, _record in labelled_domains(pools, OWNER, SET)}


def qemu_pid(uuid):
    """The pid of the QEMU process running the domain ``uuid``, or None."""
    pids = qemu_pids(uuid)
    return pids[0] if pids else None


def wait_until(condition, timeout, what):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def daemon_command(pool):
    """The command line of the pool's running libvirtd."""
    with open("/proc/%d/cmdline" % lab_pid(pool), "rb") as handle:
        return [arg.decode() for arg in handle.read().split(b"\0") if arg]


def restart_daemon_keeping_guests(pool, command, guest_pid):
    """Start the pool's libvirtd again with ``command``, in the network and mount namespaces of a guest that
    outlived it (those of the pool host), so that it finds its running guests as a restarted daemon does; the
    lab's state file then names the new daemon, so ``lab.py`` takes it for its own."""
    state_file = os.path.join(os.path.dirname(lab_file()), pool.name, "daemon.json")
    with open(state_file) as handle:
        state = json.load(handle)
    log = open(os.path.join(os.path.dirname(lab_file()), pool.name, "log", "libvirtd.stdout.log"), "ab")
    # nsenter without --fork execs libvirtd in its own process: the pid is the daemon's. --root takes the guest's
    # root directory too: entering a mount namespace resets it to the namespace's own, which is not the guest's
    # when the lab runs in a chroot (make debian13), and libvirtd would be the machine's instead of the root's.
    proc = subprocess.Popen(["nsenter", "--target", str(guest_pid), "--net", "--mount", "--root", "--"] + command,
                            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                            close_fds=True, cwd="/")
    log.close()
    # reaped as soon as it ends, so a later stop of this daemon does not wait on a zombie of this process
    threading.Thread(target=proc.wait, daemon=True).start()
    wait_until(lambda: os.readlink("/proc/%d/ns/mnt" % proc.pid) == state["mntns"], 10,
               "libvirtd did not enter the pool's namespaces")
    with open("/proc/%d/stat" % proc.pid) as handle:
        started = int(handle.read().rsplit(")", 1)[1].split()[19])
    state.update(pid=proc.pid, starttime=started)
    with open(state_file, "w") as handle:
        json.dump(state, handle, indent=2)

    def answers():
        """A new connection opens and answers (Pool.reconnect only drops the old one: conn opens it)."""
        pool.reconnect()
        try:
            return pool.conn.getLibVersion() > 0
        except libvirt.libvirtError:
            return False
    wait_until(answers, 60, "the restarted libvirtd of %s never answered" % pool.name)


def set_documents(pool):
    return [name for name in pool.volumes(REGISTRY) if name.startswith("set-%s." % SET)]


@pytest.fixture
def lab_pools(registered, module):
    pools = registered

    def clean():
        module("machine_set", pools=[p.uri for p in pools], name=SET, state="absent", shutdown_timeout=2)
        module("machine", uri=pools[2].uri, name=BYSTANDER, state="absent", shutdown_timeout=2)
    clean()
    assert members(pools) == {}
    try:
        yield pools
    finally:
        # the lab's daemon is back whatever happened (lab.py up leaves running ones alone)
        start_daemons(pools)
        clean()


def test_a_lost_pool_is_replaced_then_fenced_when_it_comes_back(lab_pools, module, image):
    pools = lab_pools
    lost_pool, reachable = pools[2], pools[:2]
    bystander = module("machine", uri=lost_pool.uri, name=BYSTANDER, machine_class="small", image=image,
                       labels={"app": "bystander"}, network_interfaces=[], state="running")
    assert not bystander.get("failed"), bystander
    bystander_uuid = lost_pool.domain(BYSTANDER).UUIDString()

    made = module("machine_set", **set_args(pools, image, "3s"))
    assert made["changed"] and made["ready_replicas"] == 3, made
    before = members(pools)
    assert sorted(pool for pool, _uuid, _active in before.values()) == sorted(p.name for p in pools)
    assert module("machine_set", **set_args(pools, image, "3s"))["changed"] is False
    stranded = next(name for name, (pool, _u, _a) in before.items() if pool == lost_pool.name)
    stranded_pid = qemu_pid(before[stranded][1])
    bystander_pid = qemu_pid(bystander_uuid)
    assert stranded_pid and bystander_pid

    command = daemon_command(lost_pool)
    stop_daemon(lost_pool)  # SIGTERM to libvirtd: its guests keep running
    lost_at = time.monotonic()
    assert process_running(stranded_pid) and process_running(bystander_pid), "the guests died with their daemon"

    # check mode: the plan, and nothing written (not even the mark)
    documents = {pool.name: set_documents(pool) for pool in reachable}
    planned = module("machine_set", check=True, **set_args(pools, image, "3s"))
    assert planned["changed"] is True and planned["actions"] == ["record", "record"], planned
    assert {pool.name: set_documents(pool) for pool in reachable} == documents

    first = module("machine_set", **set_args(pools, image, "3s"))
    assert first["changed"] and first["planned_members"] == [] and first["replaced_members"] == [], first
    marks = {mark["name"]: mark["since"] for mark in first["unreachable_pools"]}
    assert list(marks) == [lost_pool.name], first
    shown = {member["name"]: member for member in first["members"]}
    assert shown[stranded]["phase"] == "Unknown" and first["replicas"] == 3 and first["ready_replicas"] == 2
    assert shown[stranded]["conditions"] == [{"type": "PoolReachable", "status": "False",
                                              "since": marks[lost_pool.name]}]
    assert all(m["conditions"][0]["status"] == "True" for name, m in shown.items() if name != stranded)

    # the timeout counts from the recorded mark: wait until the clock has passed it, then converge
    since = datetime.datetime.fromisoformat(marks[lost_pool.name])
    wait_until(lambda: datetime.datetime.now(since.tzinfo) >= since + datetime.timedelta(seconds=3), 30,
               "the clock never passed the mark")
    healed = module("machine_set", **set_args(pools, image, "3s"))
    TIMINGS["loss_to_healed_s"] = round(time.monotonic() - lost_at, 1)
    assert not healed.get("failed"), healed.get("msg")
    assert [entry["name"] for entry in healed["replaced_members"]] == [stranded], healed
    assert len(healed["planned_members"]) == 1 and healed["ready_replicas"] == 2 + 1, healed
    running = members(reachable)
    assert len(running) == 3 and all(active for _p, _u, active in running.values()), running
    assert stranded not in running and process_running(stranded_pid)  # its copy still runs on the unreachable host
    assert module("machine_set", **set_args(pools, image, "3s"))["changed"] is False

    restart_daemon_keeping_guests(lost_pool, command, stranded_pid)
    assert lost_pool.domain(stranded) is not None and lost_pool.domain(stranded).isActive()
    # check mode: the fence is planned first, and the stale member still runs after it
    planned = module("machine_set", check=True, **set_args(pools, image, "3s"))
    assert planned["fenced_members"] == [stranded] and planned["actions"][0] == "fence", planned
    assert planned["diff"]["before"]["replaced"] == [stranded] and planned["diff"]["after"]["replaced"] == []
    assert lost_pool.domain(stranded).isActive() and process_running(stranded_pid)
    back = module("machine_set", **set_args(pools, image, "3s"))
    assert not back.get("failed"), back
    assert back["fenced_members"] == [stranded] and back["actions"][:2] == ["fence", "reclaim"], back
    assert "create" not in back["actions"] and "delete" not in back["actions"], back
    assert lost_pool.domain(stranded) is None
    wait_until(lambda: not process_running(stranded_pid), 30, "the fenced guest's QEMU still runs")
    assert not any(name.startswith(stranded) for name in lost_pool.volumes())  # its own volumes went
    after = members(pools)
    assert len(after) == 3 and all(active for _p, _u, active in after.values()) and stranded not in after
    assert back["replicas"] == 3 and back["unreachable_pools"] == [], back
    # the machine outside the set: never touched
    assert lost_pool.domain(BYSTANDER).UUIDString() == bystander_uuid and lost_pool.domain(BYSTANDER).isActive()
    assert qemu_pid(bystander_uuid) == bystander_pid
    final = module("machine_set", **set_args(pools, image, "3s"))
    assert final["changed"] is False and final["actions"] == [], final
    load = open("/proc/loadavg").read().split()[:3]
    print("\nlost pool -> healed set: %ss (unreachable_timeout 3s; load average %s)"
          % (TIMINGS["loss_to_healed_s"], " ".join(load)))
    subprocess.run(["uptime"], check=False)


def test_a_pool_back_before_the_timeout_keeps_its_member(lab_pools, module, image):
    pools = lab_pools
    lost_pool = pools[2]
    # a number of seconds that is not whole, as YAML gives 3600.5 (Ansible hands it to the option as text)
    made = module("machine_set", **set_args(pools, image, HOUR))
    assert made["changed"] and made["ready_replicas"] == 3, made
    before = members(pools)
    stranded = next(name for name, (pool, _u, _a) in before.items() if pool == lost_pool.name)
    pid = qemu_pid(before[stranded][1])

    command = daemon_command(lost_pool)
    stop_daemon(lost_pool)
    away = module("machine_set", **set_args(pools, image, HOUR))
    assert away["planned_members"] == [] and away["replaced_members"] == [] and away["replicas"] == 3, away
    assert [mark["name"] for mark in away["unreachable_pools"]] == [lost_pool.name]
    assert len(members(pools[:2])) == 2

    restart_daemon_keeping_guests(lost_pool, command, pid)
    back = module("machine_set", **set_args(pools, image, HOUR))
    assert back["fenced_members"] == [] and back["planned_members"] == [] and back["unreachable_pools"] == [], back
    assert set(back["actions"]) == {"record"}, back  # the mark is cleared
    assert members(pools) == before and qemu_pid(before[stranded][1]) == pid and process_running(pid)
    again = module("machine_set", **set_args(pools, image, HOUR))
    assert again["changed"] is False, again


def test_a_health_check_replaces_within_max_unhealthy_and_the_set_fences(lab_pools, module, image):
    pools = lab_pools
    lost_pool = pools[2]
    assert module("machine_set", **set_args(pools, image, "1h"))["ready_replicas"] == 3
    before = members(pools)
    stranded = next(name for name, (pool, _u, _a) in before.items() if pool == lost_pool.name)
    pid = qemu_pid(before[stranded][1])
    check = dict(pools=[{"name": p.name, "uri": p.uri} for p in pools], name="lostpool-health",
                 selector={"match_labels": {"app": SET}}, unhealthy_conditions=[], node_startup_timeout="1h",
                 unreachable_timeout="0s")

    command = daemon_command(lost_pool)
    stop_daemon(lost_pool)
    held = module("machine_health_check", max_unhealthy=0, **check)
    assert held["remediation_allowed"] is False and held["actions"] == ["record"], held  # the mark only
    assert [u["name"] for u in held["unhealthy"]] == [stranded] and held["covered"] == 3
    reach = {item["name"]: item["condition"]["status"] for item in held["pool_reachable"]}
    assert reach[stranded] == "False" and sorted(reach.values()) == ["False", "True", "True"]
    assert module("machine_set", **set_args(pools, image, "1h"))["planned_members"] == []  # not replaced yet

    replaced = module("machine_health_check", **check)
    assert replaced["actions"] == ["replace"] and replaced["remediation_allowed"] is True, replaced
    assert module("machine_health_check", **check)["changed"] is False
    healed = module("machine_set", **set_args(pools, image, "1h"))
    assert len(healed["planned_members"]) == 1 and healed["ready_replicas"] == 3, healed
    assert len(members(pools[:2])) == 3 and process_running(pid)

    restart_daemon_keeping_guests(lost_pool, command, pid)
    back = module("machine_set", **set_args(pools, image, "1h"))
    assert back["fenced_members"] == [stranded], back
    assert lost_pool.domain(stranded) is None
    wait_until(lambda: not process_running(pid), 30, "the fenced guest's QEMU still runs")
    assert len(members(pools)) == 3 and module("machine_set", **set_args(pools, image, "1h"))["changed"] is False


def test_without_the_option_a_set_with_a_lost_pool_fails_and_replaces_nothing(lab_pools, module, image):
    """What a set does without unreachable_timeout, kept as it was: it does not see the members of the pool it
    cannot reach, tries to make others, and fails naming that pool; nothing is made."""
    pools = lab_pools
    lost_pool = pools[2]
    plain = set_args(pools, image, None)
    del plain["unreachable_timeout"]
    assert module("machine_set", **plain)["ready_replicas"] == 3
    before = members(pools)
    stranded = next(name for name, (pool, _u, _a) in before.items() if pool == lost_pool.name)
    pid = qemu_pid(before[stranded][1])
    command = daemon_command(lost_pool)
    stop_daemon(lost_pool)
    failed = module("machine_set", **plain)
    assert failed.get("failed") and lost_pool.uri in failed["msg"], failed
    assert sorted(members(pools[:2])) == sorted(name for name in before if name != stranded)
    restart_daemon_keeping_guests(lost_pool, command, pid)
    # the failed run counted the member name it handed out in the records it could write: the pool that was away
    # gets the record again, and no machine is made or deleted
    back = module("machine_set", **plain)
    assert members(pools) == before and back["actions"] == ["record"], back
    assert module("machine_set", **plain)["changed"] is False

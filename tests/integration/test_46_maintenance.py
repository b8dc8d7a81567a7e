"""The maintenance role against the lab: two pools of the 3-pool lab maintained in turn, each drained (live moves),
rebooted as its maintenance task (lab.py reboot: daemon stopped, guests of nothing, runtime state cleared), made
Ready, uncordoned, and its machines moved back; at the end every machine runs on the pool it started on, with its
UUID, and no taint or home label is left. The table says where each went. Idle guests: nothing looks inside."""

import json
import os
import signal
import subprocess
import sys
import time

from conftest import REPO, lab_file, register, run_module, run_playbook

NAMES = {"mt-a1": 0, "mt-a2": 0, "mt-b1": 1, "mt-c1": 2}
HOME = "machinery.compute/maintenance-home"


def fleet(pools):
    return [{"name": pool.name, "uri": pool.uri} for pool in pools]


def remove(pools, name):
    for pool in pools:
        if pool.domain(name) is not None:
            run_module("machine", uri=pool.uri, name=name, state="absent", shutdown_timeout=0)


def where(pools):
    """{machine: (pool, uuid, running)} of NAMES as libvirt shows them (a machine on two pools shows twice)."""
    found = {}
    for pool in pools:
        for name in NAMES:
            dom = pool.domain(name)
            if dom is not None:
                found.setdefault(name, []).append((pool.name, dom.UUIDString(), bool(dom.isActive())))
    return found


def test_two_pools_patched_and_rebooted_in_turn_and_every_machine_back_home(registered, idle_image, tmp_path,
                                                                            pools_kept_up):
    pools = registered
    for name in NAMES:
        remove(pools, name)
    tasks = tmp_path / "reboot.yml"
    tasks.write_text(json.dumps([
        {"name": "Reboot the pool's host",
         "ansible.builtin.command": {"argv": ["python3", os.path.join(REPO, "lab", "lab.py"), "reboot", "--dir",
                                              os.path.dirname(lab_file()), "--pool",
                                              "{{ maintenance_current.name }}"]},
         "changed_when": True},
        {"name": "Note the reboot",
         "ansible.builtin.set_fact": {"maintenance_rebooted": "{{ (maintenance_rebooted | default([])) + "
                                                              "[maintenance_current.name] }}"}}]))
    playbook = tmp_path / "maintenance.yml"
    playbook.write_text(json.dumps([{
        "name": "Maintain two pools", "hosts": "localhost", "connection": "local", "gather_facts": False,
        "tasks": [{"name": "Maintain", "ansible.builtin.include_role": {"name": "machinery.compute.maintenance"}},
                  {"name": "Show what was rebooted",
                   "ansible.builtin.debug": {"msg": "REBOOTED {{ maintenance_rebooted | join(',') }}"}}]}]))
    try:
        for name, index in NAMES.items():
            made = run_module("machine", uri=pools[index].uri, name=name, machine_class="small", image=idle_image,
                              network_interfaces=[], shutdown_timeout=0)
            assert not made.get("failed"), made
        before = where(pools)
        assert all(len(entries) == 1 and entries[0][2] for entries in before.values()), before

        proc, recap = run_playbook(playbook, tmp_path / "vars.json", {
            "maintenance_pools": fleet(pools), "maintenance_order": [pools[0].name, pools[1].name],
            "maintenance_tasks": str(tasks), "maintenance_mode": "live",
            "maintenance_policy": {"bandwidth": "200Mi", "completion_timeout_per_gib": 600}})
        assert recap["failed"] == 0, proc.stdout[-6000:]
        assert "REBOOTED %s,%s" % (pools[0].name, pools[1].name) in proc.stdout, proc.stdout[-3000:]

        after = where(pools)
        assert after == before, (before, after)  # each on its own pool, the same UUID, running
        for pool in pools:
            status = run_module("machine_pool_info", uri=pool.uri)["pools"][0]
            assert status["state"] == "Ready" and not [t for t in status["taints"]
                                                       if t["key"] == "machinery.compute/maintenance"], status
        for name, index in NAMES.items():
            machine = run_module("machine_info", uri=pools[index].uri, name=[name])["machines"][0]
            assert HOME not in machine["labels"] and machine["phase"] == "Running", machine
        # the table: each machine of a maintained pool went elsewhere and came back
        lines = [line for line in proc.stdout.splitlines() if line.strip().strip('",').startswith("mt-")]
        rows = {cells[0]: cells[1:] for cells in (line.strip().strip('",').split() for line in lines)}
        for name in ("mt-a1", "mt-a2", "mt-b1"):
            home = pools[NAMES[name]].name
            assert rows[name][0] == home and rows[name][1] != home and rows[name][2] == home, rows
        assert "mt-c1" not in rows
        assert pools[2].domain("mt-c1").isActive()
    finally:
        for name in NAMES:
            remove(pools, name)


def test_a_maintenance_killed_midway_is_finished_by_the_next_run(registered, idle_image, tmp_path, pools_kept_up):
    pools = registered
    names = {"mt-k1": 0, "mt-k2": 0}
    for name in names:
        remove(pools, name)
    playbook = tmp_path / "maintenance.yml"
    playbook.write_text(json.dumps([{
        "name": "Maintain one pool", "hosts": "localhost", "connection": "local", "gather_facts": False,
        "tasks": [{"name": "Maintain", "ansible.builtin.include_role": {"name": "machinery.compute.maintenance"}}]}]))
    variables = tmp_path / "vars.json"
    variables.write_text(json.dumps({"maintenance_pools": fleet(pools), "maintenance_order": [pools[0].name],
                                     "maintenance_mode": "live"}))
    command = [os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), str(playbook), "-e",
               "@%s" % variables]
    env = dict(os.environ, ANSIBLE_LOCALHOST_WARNING="false", ANSIBLE_INVENTORY_UNPARSED_WARNING="false")
    try:
        for name in names:
            made = run_module("machine", uri=pools[0].uri, name=name, machine_class="small", image=idle_image,
                              network_interfaces=[], shutdown_timeout=0)
            assert not made.get("failed"), made
        uuids = {name: pools[0].domain(name).UUIDString() for name in names}

        run = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
                               start_new_session=True)
        deadline = time.monotonic() + 300
        # killed once the first machine has left the pool and before the second has
        while not any(pool.domain(name) is not None for pool in pools[1:] for name in names):
            assert run.poll() is None and time.monotonic() < deadline, "the run ended before a machine moved"
            time.sleep(0.05)
        killed = run.poll() is None
        os.killpg(run.pid, signal.SIGKILL)
        run.wait()
        assert killed and run.returncode == -signal.SIGKILL
        status = run_module("machine_pool_info", uri=pools[0].uri)["pools"][0]
        assert [t for t in status["taints"] if t["key"] == "machinery.compute/maintenance"], status  # mid-run

        proc, recap = run_playbook(playbook, variables, json.loads(variables.read_text()))
        assert recap["failed"] == 0, proc.stdout[-6000:]
        for name in names:
            homes = [pool.name for pool in pools if pool.domain(name) is not None]
            assert homes == [pools[0].name], (name, homes)
            dom = pools[0].domain(name)
            assert dom.UUIDString() == uuids[name] and dom.isActive()
            machine = run_module("machine_info", uri=pools[0].uri, name=[name])["machines"][0]
            assert HOME not in machine["labels"], machine
        status = run_module("machine_pool_info", uri=pools[0].uri)["pools"][0]
        assert not [t for t in status["taints"] if t["key"] == "machinery.compute/maintenance"], status
    finally:
        for name in names:
            remove(pools, name)
        register(pools[0], taints=[])  # a failure midway leaves the maintenance taint

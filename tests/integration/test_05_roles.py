"""The pools and machines roles through ansible-playbook: converge, idempotence, deletion, concurrency."""

import json
import os
import re
import threading

from conftest import REPO, defined_on, lab_file, run_playbook

PLAYBOOK = os.path.join(REPO, "tests", "integration", "playbooks", "roles.yml")


def play(lab_file, tmp_path, tag, **extra):
    return run_playbook(PLAYBOOK, tmp_path / ("vars-%s.json" % tag), dict(extra, lab_file=lab_file))


def test_roles_converge_idempotent_and_delete(registered, image, idle_image, tmp_path):
    pools = registered
    names = ["role-%d" % index for index in range(6)]
    # only role-0 boots an operating system (the busybox image): it waits for its DHCP address; the others run the
    # idle image (conftest.idle_image)
    machines = [{"name": name, "machine_class": "small", "image": idle_image, "labels": {"suite": "roles"},
                 "network_interfaces": []} for name in names]
    machines[0].update(image=image, network_interfaces=[{"name": "eth0", "network": "machinery"}], wait="address")
    gone = [{"name": name, "state": "absent"} for name in names]
    play(lab_file(), tmp_path, "clean", machines=gone)
    assert defined_on(pools, names) == {}
    proc, recap = play(lab_file(), tmp_path, "create", machines=machines)
    assert recap["failed"] == 0, proc.stdout[-4000:]
    assert recap["changed"] > 0
    placed = defined_on(pools, names)
    assert sorted(placed) == names
    assert all(len(found) == 1 for found in placed.values())
    # spread: the six machines are shared out over all three pools
    per_pool = {pool.name: sum(1 for found in placed.values() if found == [pool.name]) for pool in pools}
    assert min(per_pool.values()) >= 1, per_pool
    assert "NAME" in proc.stdout and "role-0" in proc.stdout
    # role-0 waits for its address (a guest booting under TCG): the batch showed how far it had got meanwhile,
    # before its result
    shown = re.findall(r"machinery\.compute\.machine_batch on localhost: (\d+) of 6 machines done", proc.stdout)
    assert shown, proc.stdout[-4000:]
    assert proc.stdout.index("of 6 machines done") < proc.stdout.index("NAME"), proc.stdout[-4000:]
    assert all(pool.domain(name).isActive() for pool in pools for name in names if pool.domain(name))

    # the re-run returns no statuses (the play asserts it), and still shows the table
    proc, recap = play(lab_file(), tmp_path, "again", machines=machines, return_machines="none")
    assert recap["failed"] == 0, proc.stdout[-4000:]
    assert "NAME" in proc.stdout and "role-5" in proc.stdout
    assert recap["changed"] == 0, proc.stdout[-6000:]

    proc, recap = play(lab_file(), tmp_path, "delete", machines=gone)
    assert recap["failed"] == 0, proc.stdout[-4000:]
    assert defined_on(pools, names) == {}
    proc, recap = play(lab_file(), tmp_path, "delete-again", machines=gone)
    assert recap["failed"] == 0 and recap["changed"] == 0, proc.stdout[-4000:]


def test_concurrent_runs_on_nearly_full_pools(registered, image, tmp_path):
    pools = registered
    # 2 cpu per pool without overcommit: 6 machines of 1 cpu fit in all; two runs ask for 4 + 4 (one shared)
    first = ["race-a%d" % index for index in range(3)] + ["race-shared"]
    second = ["race-b%d" % index for index in range(3)] + ["race-shared"]
    every = set(first) | set(second)

    def spec(name):
        return {"name": name, "machine_class": "small", "image": image, "network_interfaces": [],
                "state": "present"}

    results = {}
    play(lab_file(), tmp_path, "clean", machines=[{"name": name, "state": "absent"} for name in every])

    def run(tag, names):
        results[tag] = play(lab_file(), tmp_path, tag, machines=[spec(name) for name in names], overcommit_cpu=1.0)

    try:
        threads = [threading.Thread(target=run, args=("first", first)),
                   threading.Thread(target=run, args=("second", second))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        placed = defined_on(pools, every)
        # no name on two pools
        assert all(len(found) == 1 for found in placed.values()), placed
        # no pool overcommitted: every pool's machines fit its 2 cpus (from libvirt itself)
        for pool in pools:
            cpus = sum(pool.conn.lookupByName(name).info()[3] for name in pool.domain_names())
            assert cpus <= 2, (pool.name, pool.domain_names())
        # 7 distinct machines asked for, room for 6: at least one run reports what it could not place
        assert len(placed) <= 6
        outcomes = [results["first"][1]["failed"], results["second"][1]["failed"]]
        assert len(placed) == 7 or sum(outcomes) >= 1, (placed, outcomes)
        stdout = results["first"][0].stdout + results["second"][0].stdout
        # the run that could not place a machine says why: nowhere to place it, or crowded out on every attempt
        failures = [failure["msg"] for line in re.findall(r"fatal: \[localhost\]: FAILED! => (.*)", stdout)
                    for failure in json.loads(line)["failures"]]
        assert failures and all("pools available" in msg or "crowded out" in msg for msg in failures), failures
    finally:
        play(lab_file(), tmp_path, "cleanup", machines=[{"name": name, "state": "absent"} for name in every])
        # put the overcommit the other tests expect back
        play(lab_file(), tmp_path, "restore", machines=[])

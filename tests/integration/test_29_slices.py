"""Scale-out: the pools are the hosts of a play, and the job is sliced as AWX slices it (each slice an
ansible-playbook run of extensions/awx/playbooks/machines_by_pool.yml on an inventory holding only its own hosts),
all slices started at once and competing for the same, nearly full pools."""

import json
import os
import re
import threading
import time

import pytest

from ansible_collections.machinery.compute.plugins.module_utils.fleets.drivers import driven_by

from conftest import OVERCOMMIT, REPO, ansible, defined_on, register


@pytest.fixture(name="image", scope="session")
def idle_guest_image(idle_image):
    """Nothing here looks inside a guest: its machines run the idle image (conftest.idle_image), at no CPU cost."""
    return idle_image


PLAYBOOK = os.path.join(REPO, "extensions", "awx", "playbooks", "machines_by_pool.yml")
NAMES = ["slice-%d" % index for index in range(9)]


def placed(pools):
    """{machine: [pools it is defined on]} for the machines of this test, from libvirt."""
    return defined_on(pools, NAMES)


def slice_run(tmp_path, tag, hosts, pools, machines, per_pool=False):
    """One slice: an inventory of ``hosts`` alone (AWX pares a slice's inventory down to its hosts), every pool of
    the fleet in the job's variables; one task for the slice, or one per pool. (start, end, process)."""
    inventory = tmp_path / ("inventory-%s.json" % tag)
    inventory.write_text(json.dumps({"machine_pools": {"hosts": {host: {} for host in hosts}}}))
    variables = tmp_path / ("vars-%s.json" % tag)
    variables.write_text(json.dumps({"machinery_pools": [{"name": p.name, "uri": p.uri} for p in pools],
                                     "machinery_machines": machines, "machinery_wait": "none",
                                     "machinery_task_per_pool": per_pool}))
    start = time.monotonic()
    proc = ansible("ansible-playbook", "-i", inventory, PLAYBOOK, "-e", "@%s" % variables,
                   env={"ANSIBLE_LOCALHOST_WARNING": "false"}, timeout=600)
    return start, time.monotonic(), proc


def task_hosts(stdout, title):
    """{host: ok|changed|fatal|skipping} of the task of a playbook's output whose name ends with ``title``; {} when
    the play ended before it."""
    sections = [section for section in stdout.split("TASK [") if section.split("]", 1)[0].endswith(title)]
    assert len(sections) <= 1, stdout[-4000:]
    return dict((host, status) for section in sections
                for status, host in re.findall(r"^(ok|changed|fatal|skipping): \[([^\]]+)\]", section, re.MULTILINE))


@pytest.fixture()
def two_cpus_each(registered):
    """Every pool offers 2 cpu (no overcommit): room for 6 machines of class small (1 cpu) in all."""
    for pool in registered:
        register(pool, overcommit={"cpu": 1.0, "memory": 1.0})
    yield registered
    for pool in registered:
        register(pool, overcommit=OVERCOMMIT)


def test_slices_competing_for_the_same_pools_never_over_admit(two_cpus_each, image, tmp_path):
    pools = two_cpus_each
    machines = [{"name": name, "machine_class": "small", "image": image, "network_interfaces": [],
                 "state": "present"} for name in NAMES]
    gone = [{"name": name, "state": "absent"} for name in NAMES]
    slice_run(tmp_path, "clean", [p.name for p in pools], pools, gone)
    assert placed(pools) == {}
    runs = {}
    try:
        threads = [threading.Thread(target=lambda pool=pool: runs.__setitem__(pool.name, slice_run(
            tmp_path, pool.name, [pool.name], pools, machines))) for pool in pools]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert sorted(runs) == sorted(p.name for p in pools)
        # the slices ran at the same time: each began before any other had ended
        assert max(start for start, _end, _proc in runs.values()) < min(end for _start, end, _proc in runs.values())
        found = placed(pools)
        # no machine twice, on one pool or on two
        assert all(len(where) == 1 for where in found.values()), found
        # no pool over-admitted: from libvirt, each pool's machines of this test fit its 2 cpus
        for pool in pools:
            cpus = sum(pool.conn.lookupByName(name).info()[3] for name in pool.domain_names() if name in NAMES)
            assert cpus <= 2, (pool.name, pool.domain_names())
        # 9 asked for, room for 6: every machine is either placed or named by a slice that could not place it
        output = "".join(proc.stdout for _start, _end, proc in runs.values())
        assert len(found) <= 6
        missing = [name for name in NAMES if name not in found]
        assert all(name in output for name in missing), output[-6000:]
        assert sum(1 for _start, _end, proc in runs.values() if proc.returncode != 0) >= (1 if missing else 0)
        # each slice drove its own share, and the shares cover every machine once
        fleet = [{"name": p.name, "uri": p.uri} for p in pools]
        shares = {pool.name: [m["name"] for m in driven_by(machines, pool.name, fleet)] for pool in pools}
        assert sorted(name for share in shares.values() for name in share) == sorted(NAMES)
        for pool in pools:
            assert all(name in runs[pool.name][2].stdout for name in shares[pool.name]), runs[pool.name][2].stdout[-4000:]

        # the job again, unsliced, one task: what was placed stays where it is
        _start, _end, again = slice_run(tmp_path, "again", [p.name for p in pools], pools, machines)
        assert placed(pools) == found, again.stdout[-4000:]
        names = [p.name for p in pools]
        ran = task_hosts(again.stdout, "what the slice's pools drive")
        assert len(ran) == 1 and set(ran.values()) <= {"ok", "changed", "fatal"}, again.stdout[-4000:]
        assert task_hosts(again.stdout, "what this pool drives") == dict.fromkeys(names, "skipping")
        # and with a task per pool (forks 5): each pool's task finds its machines where they are
        _start, _end, per_pool = slice_run(tmp_path, "per-pool", [p.name for p in pools], pools, machines,
                                           per_pool=True)
        assert placed(pools) == found, per_pool.stdout[-4000:]
        assert set(task_hosts(per_pool.stdout, "what the slice's pools drive").values()) <= {"skipping"}
        each = task_hosts(per_pool.stdout, "what this pool drives")
        assert sorted(each) == sorted(names) and "skipping" not in each.values(), per_pool.stdout[-4000:]
    finally:
        slice_run(tmp_path, "cleanup", [p.name for p in pools], pools, gone)
    assert placed(pools) == {}

"""Scale-out over processes: N machines converged on the lab's pools three ways, from nothing each time.

  one               machine_batch over every pool in one task of one ansible-playbook process (the machines
                    role's way);
  forks             extensions/awx/playbooks/machines_by_pool.yml with the pools as hosts and a task per pool
                    (machinery_task_per_pool), one process, --forks F;
  slices            the same playbook as S ansible-playbook processes started at once, each on an inventory
                    holding only its share of the pool hosts (as AWX runs a job sliced S ways), one task a slice
                    (the playbook's default);
  slices-per-pool   the same S slices with a task per pool and --forks F in each.

The machines are class small, the lab image, no NIC, state present (defined with their disks, not started), as in
the other fleet benchmarks. After each way, the fleet is read back from libvirt: every machine defined once, and no
pool's allocated cpu or memory over what it offers. Prints the wall times, the ratios to "one" and the load.

Beside each wall time, the CPU the whole machine spent meanwhile (every process: ansible, the modules, the
libvirtds and their qemu-img, from /proc/stat) and "cpu floor": that CPU spread over every core, the least wall
time that work could take here however it is split. For one process, cpu floor / wall is the best ratio any
split of the same work can reach on this machine.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

import libvirt

from common import busy_seconds, run_module

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
BIN = os.path.dirname(sys.executable)
BY_POOL = os.path.join(REPO, "extensions", "awx", "playbooks", "machines_by_pool.yml")
ONE = """
- hosts: localhost
  connection: local
  gather_facts: false
  tasks:
    - machinery.compute.machine_batch:
        pools: "{{ machinery_pools }}"
        machines: "{{ machinery_machines }}"
        defaults: {wait: none}
"""


def playbook(path, variables, inventory=None, forks=None, per_pool=False):
    env = dict(os.environ, ANSIBLE_LOCALHOST_WARNING="false", ANSIBLE_INVENTORY_UNPARSED_WARNING="false")
    args = [os.path.join(BIN, "ansible-playbook"), path, "-e", "@" + variables]
    if inventory:
        args += ["-i", inventory]
    if forks:
        args += ["--forks", str(forks)]
    if per_pool:
        args += ["-e", "machinery_task_per_pool=true"]
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)


def finish(procs):
    outputs = [proc.communicate()[0] for proc in procs]
    for proc, output in zip(procs, outputs):
        if proc.returncode != 0:
            with tempfile.NamedTemporaryFile("w", prefix="machinery-bench-failed-", suffix=".log", delete=False) as log:
                log.write(output)
            found = re.findall(r'"msg": "((?:[^"\\]|\\.){0,400})', output)
            raise SystemExit("a run failed (its output: %s):\n%s" % (log.name, "\n".join(found[:5])))


def inventory_of(directory, tag, hosts):
    path = os.path.join(directory, "inventory-%s.json" % tag)
    with open(path, "w") as handle:
        json.dump({"machine_pools": {"hosts": {host: {} for host in hosts}}}, handle)
    return path


def fleet_check(pools, names):
    """(machines found, problems) read from libvirt: a name on two pools, a pool over its cpus."""
    where, problems = {}, []
    for pool in pools:
        conn = libvirt.open(pool["uri"])
        try:
            for dom in conn.listAllDomains(0):
                if dom.name() in names:
                    where.setdefault(dom.name(), []).append(pool["name"])
        finally:
            conn.close()
    problems += ["%s on %s" % (name, ", ".join(found)) for name, found in where.items() if len(found) > 1]
    return len(where), problems


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lab", default=os.environ.get("MACHINERY_LAB", os.path.join(REPO, ".lab", "lab.json")))
    parser.add_argument("--machines", type=int, default=60)
    parser.add_argument("--forks", type=int, default=5)
    parser.add_argument("--slices", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--register", action="store_true",
                        help="register the lab's pools first (class small; cpu overcommit 32 so the fleet fits)")
    options = parser.parse_args()
    with open(options.lab) as handle:
        lab = json.load(handle)
    pools = [{"name": pool["name"], "uri": pool["uri"]} for pool in lab["pools"]]
    hosts = [pool["name"] for pool in pools]
    if options.register:
        for pool in pools:
            run_module("machine_pool", {"uri": pool["uri"], "name": pool["name"], "networks": [{"name": "machinery"}],
                                        "overcommit": {"cpu": 32.0, "memory": 1.0}})
            run_module("machine_class", {"uri": pool["uri"], "name": "small", "cpu": 1, "memory": "128Mi"})
    names = ["bench-slice-%04d" % index for index in range(options.machines)]
    machines = [{"name": name, "machine_class": "small", "image": lab["image"], "network_interfaces": [],
                 "state": "present"} for name in names]
    directory = tempfile.mkdtemp(prefix="machinery-bench-slices-")
    one_play = os.path.join(directory, "one.yml")
    with open(one_play, "w") as handle:
        handle.write(ONE)

    def variables(tag, items):
        path = os.path.join(directory, "vars-%s.json" % tag)
        with open(path, "w") as handle:
            json.dump({"machinery_pools": pools, "machinery_machines": items, "machinery_wait": "none"}, handle)
        return path
    present, absent = variables("present", machines), variables("absent", [{"name": n, "state": "absent"} for n in names])
    everyone = inventory_of(directory, "all", hosts)
    shares = [hosts[index::options.slices] for index in range(options.slices)]
    ways = {
        "one": lambda path: [playbook(one_play, path)],
        "forks": lambda path: [playbook(BY_POOL, path, everyone, options.forks, per_pool=True)],
        "slices": lambda path: [playbook(BY_POOL, path, inventory_of(directory, "slice%d" % index, share))
                                for index, share in enumerate(shares) if share],
        "slices-per-pool": lambda path: [
            playbook(BY_POOL, path, inventory_of(directory, "slice%d" % index, share), options.forks, per_pool=True)
            for index, share in enumerate(shares) if share],
    }
    finish(ways["one"](absent))
    times = {way: [] for way in ways}
    cpu = {way: [] for way in ways}
    for _round in range(options.rounds):
        for way, start_runs in ways.items():
            began, busy = time.monotonic(), busy_seconds()
            finish(start_runs(present))
            times[way].append(time.monotonic() - began)
            cpu[way].append(busy_seconds() - busy)
            found, problems = fleet_check(pools, set(names))
            if found != len(names) or problems:
                raise SystemExit("%s: %d of %d machines, %s" % (way, found, len(names), problems))
            finish(ways["one"](absent))
    best = {way: min(values) for way, values in times.items()}
    spent = {way: cpu[way][times[way].index(best[way])] for way in ways}
    cores = os.cpu_count()
    print("%d machines on %d pools, forks %d, %d slices, %d cores; load %s" % (
        options.machines, len(pools), options.forks, options.slices, cores,
        " ".join("%.2f" % v for v in os.getloadavg())))
    for way in ways:
        print("  %-16s %7.1f s   %.2fx one   cpu %6.1f s   cpu floor %5.1f s (%.2fx one)" % (
            way, best[way], best[way] / best["one"], spent[way], spent[way] / cores, spent[way] / cores / best["one"]))


if __name__ == "__main__":
    main()

"""A machine set scaled 0 -> N -> 0 (default 30) on the lab's pools, beside the machines role doing the same work.

Both sides go through ansible-playbook, from nothing, with the same machines (class small, the lab image, no
NIC, state present: defined with their disks, not started, so two cores are not booting 30 guests):
  set    machinery.compute.machine_set replicas N, the no-op re-run, then replicas 0;
  role   the machines role with N machines, the no-op re-run, then the same N with state absent.
Each round takes the two in turns; the medians and the ratios set / role are printed.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
BIN = os.path.dirname(sys.executable)
PLAY_SET = """
- hosts: localhost
  connection: local
  gather_facts: false
  tasks:
    - machinery.compute.machine_set:
        pools: "{{ pools }}"
        name: bench
        state: "{{ state | default('present') }}"
        replicas: "{{ replicas }}"
        selector: {match_labels: {bench: set}}
        template: {machine_class: small, image: "{{ image }}", labels: {bench: set}, network_interfaces: [],
                   state: present}
        wait: none
"""
PLAY_ROLE = """
- hosts: localhost
  connection: local
  gather_facts: false
  tasks:
    - ansible.builtin.include_role:
        name: machinery.compute.machines
      vars:
        machines_pools: "{{ pools }}"
        machines_wait: none
        machines_show_table: false
        machines_list: MACHINES
"""


def playbook(text, extra):
    env = dict(os.environ, ANSIBLE_LOCALHOST_WARNING="false", ANSIBLE_INVENTORY_UNPARSED_WARNING="false")
    with tempfile.NamedTemporaryFile("w", suffix=".yml", delete=False) as play, \
            tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as variables:
        play.write(text)
        json.dump(extra, variables)
    start = time.perf_counter()
    proc = subprocess.run([os.path.join(BIN, "ansible-playbook"), play.name, "-e", "@" + variables.name],
                          capture_output=True, text=True, env=env, check=False)
    elapsed = time.perf_counter() - start
    os.unlink(play.name)
    os.unlink(variables.name)
    if proc.returncode:
        raise SystemExit("playbook failed:\n%s\n%s" % (proc.stdout[-3000:], proc.stderr[-2000:]))
    return elapsed


def role_play(count, image, state):
    """The machines role with ``count`` machines, listed in the play itself (no filter of ours needed)."""
    machines = [{"name": "bench-role-%d" % index, "machine_class": "small", "image": image, "state": state,
                 "network_interfaces": []} for index in range(count)]
    return PLAY_ROLE.replace("MACHINES", json.dumps(machines))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lab", required=True)
    parser.add_argument("--count", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    with open(args.lab) as handle:
        lab = json.load(handle)
    pools = [{"name": pool["name"], "uri": pool["uri"]} for pool in lab["pools"]]
    extra = {"pools": pools, "image": lab["image"]}
    times = {key: [] for key in ("set up", "set no-op", "set down", "role up", "role no-op", "role down")}
    for _round in range(args.rounds):
        times["set up"].append(playbook(PLAY_SET, dict(extra, replicas=args.count)))
        times["set no-op"].append(playbook(PLAY_SET, dict(extra, replicas=args.count)))
        times["set down"].append(playbook(PLAY_SET, dict(extra, replicas=0)))
        times["role up"].append(playbook(role_play(args.count, lab["image"], "present"), extra))
        times["role no-op"].append(playbook(role_play(args.count, lab["image"], "present"), extra))
        times["role down"].append(playbook(role_play(args.count, lab["image"], "absent"), extra))
    playbook(PLAY_SET, dict(extra, replicas=0, state="absent"))  # the set's definition goes from the pools too
    median = {key: statistics.median(values) for key, values in times.items()}
    print("%d machines on %d pools, %d rounds, median seconds:" % (args.count, len(pools), args.rounds))
    for key, value in median.items():
        print("  %-11s %6.2f   (%s)" % (key, value, ", ".join("%.2f" % v for v in times[key])))
    for step in ("up", "no-op", "down"):
        print("  set / role %-6s %.2fx" % (step, median["set " + step] / median["role " + step]))


if __name__ == "__main__":
    main()

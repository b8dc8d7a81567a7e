"""What a server group rule (issue 25) adds to creating machines.

machine_batch creates N machines over the lab's pools (state present: defined, not started, so guest boots do
not blur the numbers) without a group, then with each policy: the members are placed under the rule and, for the
hard policies, admission checks the rule again under each pool's lock. Each round runs every variant in turn
(deleted after each); the median wall time of the module run is reported with its difference from the baseline,
per machine. The image is cached on the pools before timing starts.

Run by hand against a lab:  .venv/bin/python benchmarks/server_groups.py --lab .lab/<dir>/lab.json
"""

import argparse
import json
import statistics
import time

from common import run_module

NAME = "bench-group"
POLICIES = ("anti-affinity", "soft-anti-affinity", "affinity", "soft-affinity")


def machines(image, count, policy):
    group = {"server_group": {"name": NAME, "policy": policy}} if policy else {}
    return [dict({"name": "%s-%d" % (NAME, index), "machine_class": "small", "image": image, "state": "present",
                  "network_interfaces": []}, **group) for index in range(count)]


def timed(pools, items):
    start = time.monotonic()
    run_module("machine_batch", {"pools": pools, "machines": items})
    return time.monotonic() - start


def delete(pools, count):
    run_module("machine_batch", {"pools": pools, "machines": [{"name": "%s-%d" % (NAME, index), "state": "absent",
                                                               "shutdown_timeout": 0} for index in range(count)]})


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lab", required=True)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with open(args.lab, encoding="utf-8") as handle:
        lab = json.load(handle)
    pools = [{"name": pool["name"], "uri": pool["uri"]} for pool in lab["pools"]]
    for pool in pools:  # registered (the lab's TCG guests idle: cpu overcommitted), class small published
        run_module("machine_pool", dict(pool, networks=[{"name": "machinery"}], overcommit={"cpu": 16.0}))
        run_module("machine_class", {"uri": pool["uri"], "name": "small", "cpu": 1, "memory": "128Mi"})
    count = len(pools)  # anti-affinity holds one member per pool
    delete(pools, count)
    timed(pools, machines(lab["image"], count, None))  # caches the image on every pool
    delete(pools, count)
    times = {policy: [] for policy in (None,) + POLICIES}
    for _round in range(args.rounds):
        for policy in times:
            times[policy].append(timed(pools, machines(lab["image"], count, policy)))
            delete(pools, count)
    base = statistics.median(times[None])
    print("%d machines on %d pools, median of %d rounds" % (count, len(pools), args.rounds))
    print("%-20s %8s %14s" % ("policy", "run (s)", "added/machine"))
    for policy, values in times.items():
        median = statistics.median(values)
        print("%-20s %8.2f %+13.3fs" % (policy or "none", median, (median - base) / count))


if __name__ == "__main__":
    main()

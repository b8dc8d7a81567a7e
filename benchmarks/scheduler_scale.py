"""Scheduler at scale: 10,000 machines over 100 synthetic pools, one call, spread and binpack.

Reports wall time and peak memory (tracemalloc) of schedule() itself: the pool snapshots are built
beforehand, as the lookup does after reading the pools in parallel.
"""

import argparse
import json
import random
import time
import tracemalloc

from ansible_collections.machinery.compute.plugins.module_utils.machines import machine_spec
from ansible_collections.machinery.compute.plugins.module_utils.pools.scheduler import schedule

GI = 2 ** 30
CLASSES = {"small": {"cpu": 1, "memory": 2 * GI}, "medium": {"cpu": 2, "memory": 4 * GI},
           "large": {"cpu": 4, "memory": 16 * GI}}


def synthetic_pools(count, rng):
    pools = []
    for index in range(count):
        cpu = rng.choice([256, 384, 512])
        pools.append({
            "name": "pool-%03d" % index, "uri": "qemu+ssh://root@hv%03d/system" % index, "state": "Ready",
            "labels": {"zone": "zone-%d" % (index % 4), "disk": rng.choice(["ssd", "hdd"])},
            "taints": [{"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}] if index % 10 == 0 else [],
            "classes": dict(CLASSES) if index % 7 else {"small": CLASSES["small"]},
            "allocatable": {"cpu": cpu, "memory": cpu * 4 * GI},
            "allocated": {"cpu": rng.randrange(0, cpu // 4), "memory": rng.randrange(0, cpu * GI)},
            "machines": [],
        })
    return pools


def synthetic_machines(count, rng):
    machines = []
    for index in range(count):
        spec = {"name": "m-%05d" % index, "machine_class": rng.choice(list(CLASSES))}
        if index % 5 == 0:
            spec["machine_pool_selector"] = {"disk": "ssd"}
        if index % 50 == 0:
            spec["tolerations"] = [{"key": "dedicated", "operator": "Exists"}]
        # as the lookup, the batch and the sets hand them to the scheduler: through the one validation path
        machines.append(machine_spec.params(spec, "machines[%d]" % index, scheduling=True))
    return machines


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--machines", type=int, default=10000)
    parser.add_argument("--pools", type=int, default=100)
    options = parser.parse_args()
    rng = random.Random(42)
    pools = synthetic_pools(options.pools, rng)
    machines = synthetic_machines(options.machines, rng)
    report = {"machines": options.machines, "pools": options.pools}
    for strategy in ("spread", "binpack"):
        tracemalloc.start()
        start = time.perf_counter()
        placements = schedule(machines, pools, strategy=strategy, strict=False)
        elapsed = time.perf_counter() - start
        _current, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        start = time.perf_counter()
        schedule(machines, pools, strategy=strategy, strict=False)
        untraced = time.perf_counter() - start
        report[strategy] = {"seconds": round(untraced, 3), "seconds_traced": round(elapsed, 3),
                            "peak_mib": round(peak / 2 ** 20, 1),
                            "placed": sum(1 for p in placements if p["pool"]),
                            "unschedulable": sum(1 for p in placements if not p["pool"])}
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()

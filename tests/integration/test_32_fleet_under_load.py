"""Issue 23: the fleet sequence, over and over, with the machine's cores kept busy.

A set of 4 on two pools, scaled to 2; one member destroyed with virsh; a health check (Ready False for 0s,
max_unhealthy 1) and the set run again. Once in five runs at load 15 the destroyed member came back and the
healthy one was replaced. Here the sequence runs several rounds while processes this test started spin on every
core; each round checks, from libvirt, that exactly the destroyed member was remediated and that the healthy one
is the same domain (UUID), still running, never replaced.
"""

import contextlib
import os
import subprocess
import sys

import pytest

from conftest import labelled_domains, run_module


@pytest.fixture(name="image", scope="session")
def idle_guest_image(idle_image):
    """Nothing here looks inside a guest: its machines run the idle image (conftest.idle_image), at no CPU cost."""
    return idle_image


SET = "steady"
ROUNDS = 3
SPINNERS = 2 * (os.cpu_count() or 2)  # the load goes up by about this much while they run


@contextlib.contextmanager
def busy_cores(count):
    """``count`` processes that spin on the CPU, stopped by their pids when the block ends."""
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _index in range(count)]
    try:
        yield spinners
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()


def members(pools):
    """{name: (pool, uuid, active)} of the set's members, read from the domains' records."""
    return {dom.name(): (pool, dom.UUIDString(), bool(dom.isActive()))
            for pool, dom, _record in labelled_domains(pools, "app", SET)}


def test_the_fleet_sequence_remediates_exactly_the_destroyed_member_under_load(registered, image):
    pools = registered[:2]
    entries = [{"name": pool.name, "uri": pool.uri} for pool in pools]
    set_args = dict(pools=entries, name=SET, selector={"match_labels": {"app": SET}}, wait="running",
                    shutdown_timeout=2, template={"machine_class": "small", "image": image, "labels": {"app": SET},
                                                  "network_interfaces": []})
    check_args = dict(pools=entries, name=SET + "-health", selector={"match_labels": {"app": SET}},
                      unhealthy_conditions=[{"type": "Ready", "status": "False", "timeout": "0s"}],
                      max_unhealthy=1, node_startup_timeout="1h", shutdown_timeout=2)
    run_module("machine_set", pools=entries, name=SET, state="absent", shutdown_timeout=2)
    try:
        with busy_cores(SPINNERS) as spinners:
            for round_number in range(ROUNDS):
                made = run_module("machine_set", replicas=4, **set_args)
                assert not made.get("failed") and made["ready_replicas"] == 4, (round_number, made)
                assert sorted({pool.name for pool, _uuid, _active in members(pools).values()}) == sorted(
                    pool.name for pool in pools), members(pools)  # on both pools
                scaled = run_module("machine_set", replicas=2, **set_args)
                assert not scaled.get("failed") and scaled["replicas"] == 2, (round_number, scaled)
                before = members(pools)
                assert len(before) == 2 and all(active for _pool, _uuid, active in before.values()), before
                victim, healthy = sorted(before)
                before[victim][0].domain(victim).destroy()

                healed = run_module("machine_health_check", **check_args)
                assert not healed.get("failed") and [u["name"] for u in healed["unhealthy"]] == [victim], \
                    (round_number, healed)
                assert healed["actions"] == ["delete"] and victim not in members(pools), (round_number, healed)
                again = run_module("machine_set", replicas=2, **set_args)
                assert not again.get("failed") and again["ready_replicas"] == 2, (round_number, again)

                after = members(pools)
                assert victim not in after and len(after) == 2, (round_number, after)
                # the healthy member is the very domain it was: same pool, same UUID, running all along
                assert after[healthy][:2] == before[healthy][:2] and after[healthy][2], (round_number, after)
                assert run_module("machine_health_check", **check_args)["actions"] == []
                # the load was on for the whole round: every spinner still runs
                assert [spinner.poll() for spinner in spinners] == [None] * SPINNERS
                run_module("machine_set", pools=entries, name=SET, state="absent", shutdown_timeout=0)
                assert members(pools) == {}
    finally:
        run_module("machine_set", pools=entries, name=SET, state="absent", shutdown_timeout=0)

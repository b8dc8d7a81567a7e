"""Resizing a machine (issue 25): a new class for a running machine restarts it in place, a resize its pool has no
room for is refused with nothing changed, and a resize whose restart fails leaves the machine as it was, running.

Every effect is checked from libvirt, and what the guest got from inside it: the busybox test image runs the
user-data script at each boot, and the script prints the guest's CPU count and MemTotal to the console (whose log
starts over at each start of the domain).
"""

import json
import re
import xml.etree.ElementTree as ET

import libvirt
import pytest

from conftest import NS, OVERCOMMIT, first_pool, load_lab, register, run_module, warnings_of

from ansible_collections.machinery.compute.plugins.module_utils.core.quantity import parse_quantity

NAME = "rs-web"
BIG = {"name": "rs-big", "cpu": 2, "memory": "256Mi"}
# more memory than the pool can allocate with the lab's memory overcommit of 1.0 (a lab host has far less)
HUGE = {"name": "rs-huge", "cpu": 1, "memory": "64Ti"}
# sized in the test to the memory the pool has free once it overcommits memory 64 times: it fits the pool's
# accounting, yet QEMU cannot get 64 times the host's memory for one guest, so it does not start
UNBOOTABLE = "rs-unbootable"
SCRIPT = """#!/bin/sh
echo "RESIZE-CPUS $(grep -c ^processor /proc/cpuinfo)"
echo "RESIZE-MEMTOTAL-KB $(awk '/^MemTotal:/ {print $2}' /proc/meminfo)"
"""
BOOT_TIMEOUT = 300


def machine(pool, **extra):
    args = dict(uri=pool.uri, name=NAME, image=load_lab()["image"], cloud_init={"user_data": SCRIPT},
                shutdown_timeout=30)
    args.update(extra)
    return run_module("machine", **args)


def clean(pool):
    run_module("machine", uri=pool.uri, name=NAME, state="absent")


def size_in_libvirt(pool):
    """(vcpus, memory KiB, class) of the persistent definition, and (vcpus, max memory KiB) of the running guest."""
    dom = pool.domain(NAME)
    tree = ET.fromstring(dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE))
    record = json.loads(ET.fromstring(dom.metadata(libvirt.VIR_DOMAIN_METADATA_ELEMENT, NS,
                                                   libvirt.VIR_DOMAIN_AFFECT_CONFIG)).text)
    persistent = (int(tree.findtext("vcpu")), int(tree.findtext("memory")), record["spec"]["machine_class"])
    live = (dom.info()[3], dom.maxMemory()) if dom.isActive() else None
    return persistent, live


def guest_reports(pool):
    """(CPU count, MemTotal in KiB) the guest printed at its last boot."""
    console = pool.wait_console(NAME, "MACHINERY-SCRIPT-END", timeout=BOOT_TIMEOUT)
    cpus = re.findall(r"^RESIZE-CPUS (\d+)", console, re.M)
    memory = re.findall(r"^RESIZE-MEMTOTAL-KB (\d+)", console, re.M)
    assert len(cpus) == 1 and len(memory) == 1, console[-3000:]
    return int(cpus[0]), int(memory[0])


@pytest.fixture(scope="module")
def resized():
    """A running small machine on the lab's first pool, with the classes the tests resize it to published."""
    with first_pool(clean) as pool:
        for size in (BIG, HUGE):
            published = run_module("machine_class", uri=pool.uri, **size)
            assert not published.get("failed"), published
        created = machine(pool, machine_class="small")
        assert not created.get("failed"), created
        assert guest_reports(pool)[0] == 1
        try:
            yield pool
        finally:
            for size in (BIG["name"], HUGE["name"], UNBOOTABLE):
                run_module("machine_class", uri=pool.uri, name=size, state="absent", force=True)
            register(pool)  # the lab's overcommit again, whatever a test left


def test_check_mode_plans_the_restart_and_writes_nothing(resized):
    pool = resized
    before = pool.domain(NAME).XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE)
    running_id = pool.domain(NAME).ID()
    planned = machine(pool, check=True, machine_class="rs-big")
    assert planned["changed"] is True, planned
    assert planned["actions"] == ["update machine_class, cpu, memory", "restart"], planned
    assert [step["action"] for step in planned["plan"][1]["steps"]] == ["shutdown", "start"]
    assert planned["diff"]["before"]["cpu"] == 1 and planned["diff"]["after"]["cpu"] == 2
    assert planned["diff"]["after"]["memory"] == "256Mi" and planned["diff"]["after"]["machine_class"] == "rs-big"
    assert planned["diff"]["after"]["restart_count"] == planned["diff"]["before"]["restart_count"] + 1
    assert planned["restart_required"] is False
    dom = pool.domain(NAME)
    assert dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE) == before
    assert dom.isActive() and dom.ID() == running_id


def test_resize_restarts_the_running_machine_in_place(resized):
    pool = resized
    first_id = pool.domain(NAME).ID()
    result = machine(pool, machine_class="rs-big")
    assert result["changed"] is True and not result.get("failed"), result
    assert result["actions"] == ["update machine_class, cpu, memory", "restart"], result
    assert result["restart_required"] is False
    shown = result["machine"]
    assert (shown["machine_class"], shown["cpu"], shown["memory"], shown["phase"]) == ("rs-big", 2, "256Mi", "Running")
    assert shown["restart_count"] == 1
    persistent, live = size_in_libvirt(pool)
    assert persistent == (2, 256 * 1024, "rs-big")
    assert live == (2, 256 * 1024)
    assert pool.domain(NAME).ID() != first_id  # a new QEMU process: restarted
    cpus, mem_total = guest_reports(pool)
    assert cpus == 2
    assert 128 * 1024 < mem_total <= 256 * 1024, mem_total


def test_second_run_changes_nothing(resized):
    pool = resized
    running_id = pool.domain(NAME).ID()
    again = machine(pool, machine_class="rs-big")
    assert again["changed"] is False and again["actions"] == [], again
    assert pool.domain(NAME).ID() == running_id


@pytest.mark.parametrize("request_size,field", [
    ({"machine_class": "rs-huge"}, "machine_class"),
    ({"memory": "64Ti"}, "memory"),
    ({"cpu": 200}, "cpu"),
])
def test_a_resize_that_does_not_fit_is_refused_with_nothing_changed(resized, request_size, field):
    pool = resized
    before = pool.domain(NAME).XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE)
    running_id = pool.domain(NAME).ID()
    for check in (True, False):
        refused = machine(pool, check=check, **request_size)
        assert refused.get("failed") and refused["field"] == field, refused
        assert refused["reason"] == "PoolFull" and "allow_move: true" in refused["msg"], refused["msg"]
        assert "nothing was changed" in refused["msg"] and not refused.get("changed"), refused
        dom = pool.domain(NAME)
        assert dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE) == before
        assert dom.isActive() and dom.ID() == running_id


def test_a_failed_restart_leaves_the_machine_as_it_was_and_running(resized):
    pool = resized
    registered = run_module("machine_pool", uri=pool.uri, name=pool.name, networks=[{"name": "machinery"}],
                            overcommit={"cpu": OVERCOMMIT["cpu"], "memory": 64.0})
    assert not registered.get("failed"), registered
    free = (parse_quantity(registered["pool"]["allocatable"]["memory"]) -
            parse_quantity(registered["pool"]["allocated"]["memory"]) + 256 * 2 ** 20)  # its own size is not counted
    published = run_module("machine_class", uri=pool.uri, name=UNBOOTABLE, cpu=1,
                           memory="%dGi" % (free // 2 ** 30))
    assert not published.get("failed"), published
    before, live_before = size_in_libvirt(pool)
    shown_before = run_module("machine_info", uri=pool.uri, name=[NAME])["machines"][0]
    failed = machine(pool, machine_class="rs-unbootable")
    assert failed.get("failed") and failed["field"] == "machine_class", failed
    assert "did not start with its new size" in failed["msg"], failed["msg"]
    assert "put back as it was, running" in failed["msg"], failed["msg"]
    print("\n" + failed["msg"])
    assert "done" not in failed, failed
    persistent, live = size_in_libvirt(pool)
    assert persistent == before and live == live_before == before[:2]
    assert guest_reports(pool)[0] == before[0]
    info = run_module("machine_info", uri=pool.uri, name=[NAME])["machines"][0]
    assert [info[key] for key in ("machine_class", "cpu", "memory")] == \
        [shown_before[key] for key in ("machine_class", "cpu", "memory")]
    assert info["phase"] == "Running" and "resize failed" in (info.get("last_error") or ""), info


WIDE = {"name": "rs-wide", "cpu": 3, "memory": "256Mi"}


def test_allow_move_moves_a_resize_that_does_not_fit_then_resizes_it(resized, registered):
    home, target, other = registered[0], registered[1], registered[2]
    assert home.uri == resized.uri
    # the first pool now allocates 2 cpu in all: 3 cannot fit there; only the second pool publishes the class
    register(home, overcommit={"cpu": 1.0, "memory": 1.0})
    for pool in (home, target):
        published = run_module("machine_class", uri=pool.uri, **WIDE)
        assert not published.get("failed"), published
    fleet = [{"name": pool.name, "uri": pool.uri} for pool in registered]
    try:
        refused = machine(home, machine_class="rs-wide")
        assert refused.get("failed") and refused["field"] == "machine_class", refused
        assert "allow_move: true" in refused["msg"]

        before = home.domain(NAME).XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE)
        planned = machine(home, check=True, machine_class="rs-wide", allow_move=True, pools=fleet)
        assert not planned.get("failed") and planned["changed"] is True, planned
        # memory changes too when this test runs alone (the machine is still small then)
        assert [planned["actions"][0], planned["actions"][-1]] == ["move", "restart"], planned
        assert planned["actions"][1].startswith("update machine_class, cpu") and len(planned["actions"]) == 3, planned
        assert planned["diff"]["after"]["pool"] == target.name and planned["diff"]["after"]["cpu"] == 3
        assert home.domain(NAME).XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE) == before and home.domain(NAME).isActive()
        assert target.domain(NAME) is None

        moved = machine(home, machine_class="rs-wide", allow_move=True, pools=fleet)
        assert not moved.get("failed") and moved["changed"] is True, moved
        # memory changes too when this test runs alone (the machine is still small then)
        assert [moved["actions"][0], moved["actions"][-1]] == ["move", "restart"], moved
        assert moved["actions"][1].startswith("update machine_class, cpu") and len(moved["actions"]) == 3, moved
        assert moved["machine"]["pool"] == target.name and moved["machine"]["cpu"] == 3, moved["machine"]
        assert any("moved to %s" % target.name in text for text in warnings_of(moved)), moved
        assert home.domain(NAME) is None and other.domain(NAME) is None
        persistent, live = size_in_libvirt(target)
        assert persistent == (3, 256 * 1024, "rs-wide") and live == (3, 256 * 1024)
        assert guest_reports(target)[0] == 3

        again = machine(target, machine_class="rs-wide", allow_move=True, pools=fleet)
        assert again["changed"] is False, again
    finally:
        run_module("machine", uri=target.uri, name=NAME, state="absent")
        for pool in (home, target):
            run_module("machine_class", uri=pool.uri, name=WIDE["name"], state="absent", force=True)
        register(home)

"""A fleet of two releases: Debian 12 pools (libvirt 9, QEMU 7.2) beside a Debian 13 one (libvirt 11, QEMU 10), as
`make lab-up NEWER=1` makes it. Needs such a lab: make integration runs this file on its labs brought up so, and
fails it on a lab of one release. A machine made on the older release moves cold and live both ways; one made on
the newer release carries QEMU 10's machine type, and its move to an older pool is refused before anything is
written, naming that type. Every effect is read from libvirt."""

import re

import libvirt
import pytest

from conftest import assert_failed, load_lab, run_module
from test_13_migrate import fleet, homes, make, remove, snapshot


def release(pool):
    return pool.conn.getLibVersion() // 1000000


@pytest.fixture(name="sides", scope="module")
def older_and_newer(registered):
    pools = registered
    older = [pool for pool in pools if release(pool) < 11]
    newer = [pool for pool in pools if release(pool) >= 11]
    assert len(older) >= 2 and len(newer) >= 1, "this file needs a lab of both releases (make lab-up NEWER=1)"
    return older, newer[0]


def machine_type(pool, name):
    xml = pool.domain(name).XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE)
    return re.search(r"<type arch='x86_64' machine='([^']+)'", xml).group(1)


def test_lab_json_gives_every_pool_its_release(registered, sides):
    older, newer = sides
    entries = {entry["name"]: entry for entry in load_lab()["pools"]}
    for pool in registered:
        version = pool.conn.getLibVersion()
        assert entries[pool.name]["libvirt_version"] == "%d.%d.%d" % (
            version // 1000000, version // 1000 % 1000, version % 1000)
        qemu = pool.conn.getVersion()
        assert entries[pool.name]["qemu_version"] == "%d.%d.%d" % (qemu // 1000000, qemu // 1000 % 1000, qemu % 1000)
    assert newer.conn.getVersion() >= 10000000 > older[0].conn.getVersion()


def test_pool_info_reports_both_releases(registered, sides):
    older, newer = sides
    listed = run_module("machine_pool_info", pools=[pool.uri for pool in registered])
    hypervisors = {entry["name"]: entry["hypervisor"] for entry in listed["pools"]}
    assert hypervisors[newer.name]["libvirt"].startswith("11.")
    assert hypervisors[older[0].name]["libvirt"].startswith("9.")


def test_older_machine_moves_cold_and_live_both_ways(registered, sides, image):
    older, newer = sides
    pools = registered
    name = "mixed-old"
    try:
        make(older[0], image, name, data="8Mi")
        older[0].wait_console(name, "MACHINERY-READY", 180)
        uuid = older[0].domain(name).UUIDString()
        kept_type = machine_type(older[0], name)
        assert kept_type.startswith("pc-q35-7.")

        # live to the newer release and back to the older one: the same guest all along, never booted again
        for source, target in ((older[0], newer), (newer, older[0])):
            moved = run_module("machine_migrate", uri=source.uri, pools=fleet(pools), machine=name,
                               target=target.name, mode="live")
            assert moved.get("changed") is True and moved["mode"] == "live", moved
            assert [pool.name for pool in homes(pools, name)] == [target.name]
            assert target.domain(name).isActive() and target.domain(name).UUIDString() == uuid
            assert machine_type(target, name) == kept_type
        # the same guest, not a new boot: it answers the power button without having booted on this pool
        older[0].domain(name).shutdownFlags(libvirt.VIR_DOMAIN_SHUTDOWN_ACPI_POWER_BTN)
        assert "MACHINERY-TEST-BOOT" not in older[0].wait_console(name, "MACHINERY-POWEROFF", 60)
        assert run_module("machine", uri=older[0].uri, name=name, state="running", wait="none")["changed"]

        # cold to the newer release and on to the other older pool
        for source, target in ((older[0], newer), (newer, older[1])):
            moved = run_module("machine_migrate", uri=source.uri, pools=fleet(pools), machine=name,
                               target=target.name, mode="cold", shutdown_timeout=60)
            assert moved.get("changed") is True and moved["mode"] == "cold", moved
            assert [pool.name for pool in homes(pools, name)] == [target.name]
            assert target.domain(name).UUIDString() == uuid and machine_type(target, name) == kept_type
            target.wait_console(name, "MACHINERY-READY", 180)
    finally:
        remove(pools, name)


def test_newer_machine_is_refused_by_older_pools_with_the_reason(registered, sides, image):
    older, newer = sides
    pools = registered
    name = "mixed-new"
    try:
        make(newer, image, name, data="8Mi")
        newer.wait_console(name, "MACHINERY-READY", 180)
        newer_type = machine_type(newer, name)
        assert newer_type.startswith("pc-q35-10.")
        unchanged = snapshot(pools)
        for mode in ("cold", "live"):
            refused = run_module("machine_migrate", uri=newer.uri, pools=fleet(pools), machine=name,
                                 target=older[0].name, mode=mode, shutdown_timeout=60)
            assert_failed(refused, "target", "machine type %s" % newer_type, older[0].name)
            assert snapshot(pools) == unchanged
        assert newer.domain(name).isActive()
        # the scheduler's own choice never lands on a pool that lacks the type either
        refused = run_module("machine_migrate", uri=newer.uri, pools=fleet(pools), machine=name, mode="cold",
                             shutdown_timeout=60)
        assert refused.get("failed") and "machine type %s" % newer_type in refused["msg"], refused
        assert snapshot(pools) == unchanged
    finally:
        remove(pools, name)

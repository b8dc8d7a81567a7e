"""Capture and clone of the real Debian guest, proven from inside the guests through their agents.

A file is written in the source guest; the capture seals it (cloud-init's instance data, machine-id and SSH host
keys cleared through its agent), stops it and publishes its root disk. A linked clone of the sealed machine boots
with the file, its own machine-id, its own SSH host keys (cloud-init made new ones at its first boot) and its own
address. A full clone is made beside it (not booted) and its disk checked flat. The times of the capture and of
both clones are printed for the issue's note, with the load average.
"""

import os
import time

import pytest

from conftest import first_pool, guest_agent, guest_shell, run_module

from test_12_real_guest import real_image
from test_39_images import root_backing

SOURCE = "ri-src"
LINKED = "ri-linked"
FULL = "ri-full"
IMAGE = "ri-golden"
CLASS_REAL = {"name": "real", "cpu": 1, "memory": "512Mi"}
FILE = "/var/lib/golden-file"
CONTENT = "written in the source before the capture\n"
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBv0HtN+Xb7PbxZ0UJxOq3m3cK6Sx9Cq1lZ2s6k0z0yY machinery-images"
BOOT_TIMEOUT = 900


@pytest.fixture(scope="module")
def ri_pool():
    image = real_image()
    with first_pool(clean) as pool:
        published = run_module("machine_class", uri=pool.uri, **CLASS_REAL)
        assert not published.get("failed"), published
        yield pool, image
        # the pool's classes as found (test_11 reads what a pool publishes in its errors): its machines first
        clean(pool)
        withdrawn = run_module("machine_class", uri=pool.uri, name=CLASS_REAL["name"], state="absent")
        assert not withdrawn.get("failed"), withdrawn


def clean(pool):
    for name in (LINKED, FULL, SOURCE):
        if pool.domain(name) is not None:
            run_module("machine", uri=pool.uri, name=name, state="absent", shutdown_timeout=0)
    run_module("machine_image", uri=pool.uri, name=IMAGE, state="absent", force=True)


def agent_of(pool, name):
    return guest_agent(pool, name, timeout=BOOT_TIMEOUT, call_timeout=30, every=2)


def shell(agent, command, timeout=300):
    return guest_shell(agent, command, timeout)


def identity(agent):
    """machine-id, SSH host key, and the file of the guest, once cloud-init has finished its boot."""
    shell(agent, "cloud-init status --wait >/dev/null 2>&1 || true", timeout=BOOT_TIMEOUT)
    return {"machine_id": shell(agent, "cat /etc/machine-id").strip(),
            "host_key": shell(agent, "cat /etc/ssh/ssh_host_ed25519_key.pub").split()[1],
            "file": shell(agent, "cat %s 2>/dev/null || true" % FILE)}


def make(pool, name, **extra):
    result = run_module("machine", uri=pool.uri, name=name, machine_class=CLASS_REAL["name"],
                        ssh_authorized_keys=[KEY], shutdown_timeout=120, wait_timeout=BOOT_TIMEOUT, **extra)
    assert not result.get("failed"), result
    return result


def timed(call):
    started = time.monotonic()
    result = call()
    return result, time.monotonic() - started


def test_capture_and_clone_the_real_guest(ri_pool, capsys):
    pool, image = ri_pool
    source = make(pool, SOURCE, image=image, wait="address")
    agent = agent_of(pool, SOURCE)
    before = identity(agent)
    shell(agent, "printf '%s' >%s && sync" % (CONTENT, FILE))
    assert before["machine_id"] and before["host_key"]

    load = os.getloadavg()
    captured, took_capture = timed(lambda: run_module(
        "machine_image", uri=pool.uri, name=IMAGE, generalize=True,
        from_machine={"machine": SOURCE}))
    assert captured["changed"] and not captured.get("failed"), captured
    assert captured["actions"] == ["generalize", "capture", "publish"], captured
    assert not pool.domain(SOURCE).isActive()

    linked, took_linked = timed(lambda: make(pool, LINKED, state="stopped",
                                             clone_from={"machine": SOURCE, "mode": "linked"}))
    full, took_full = timed(lambda: make(pool, FULL, state="stopped", clone_from={"machine": SOURCE}))
    assert root_backing(pool, LINKED) is not None and root_backing(pool, FULL) is None
    assert not full.get("failed") and not linked.get("failed")
    with capsys.disabled():
        print("\n[measure] real Debian guest (2 GiB virtual, %s): capture with generalize %.1f s, linked clone "
              "%.1f s, full clone %.1f s (load average before %s, after %s)"
              % (captured["image"]["virtual_size"], took_capture, took_linked, took_full,
                 " ".join("%.2f" % value for value in load),
                 " ".join("%.2f" % value for value in os.getloadavg())))

    booted = make(pool, LINKED, state="running", wait="address")
    after = identity(agent_of(pool, LINKED))
    assert after["file"] == CONTENT
    assert after["machine_id"] and after["machine_id"] != before["machine_id"]
    assert after["host_key"] != before["host_key"]
    assert booted["machine"]["ip_addresses"] and \
        set(booted["machine"]["ip_addresses"]).isdisjoint(source["machine"]["ip_addresses"])
    assert booted["machine"]["network_interfaces"][0]["mac"] != source["machine"]["network_interfaces"][0]["mac"]

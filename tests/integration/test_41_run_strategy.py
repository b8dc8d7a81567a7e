"""Run strategies, read from libvirt: autostart, the crash action of the definition and of the running guest, the
record; converged in place with a diff; refused with a state they contradict. Then a host reboot of a pool
(``lab.py reboot``: daemon stopped, guests killed as in a power loss, runtime state cleared, daemon started): exactly
the machines whose strategy says so come back, with their disks, records and addresses, and the inventory sees
them. The busybox guest proves the boot (its console and its DHCP address); the others run the idle image."""

import json
import os
import re
import subprocess
import time
import xml.etree.ElementTree as ET

import libvirt
import pytest

from conftest import (REPO, assert_failed, lab_file, lab_pid, listing, process_running, qemu_pids,
                      wait_uptime_above, write_source)

NS = "https://machinery.compute/xmlns/machine/1"
TIMINGS = {}


def record_of(dom, flags=libvirt.VIR_DOMAIN_XML_INACTIVE):
    tree = ET.fromstring(dom.XMLDesc(flags))
    return json.loads(tree.find("metadata/{%s}machine" % NS).text)


def crash_action(dom, flags=libvirt.VIR_DOMAIN_XML_INACTIVE):
    return ET.fromstring(dom.XMLDesc(flags)).findtext("on_crash")


def files_of(dom):
    """The files of the machine's disks, as its definition names them."""
    tree = ET.fromstring(dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE))
    return sorted(node.get("file") for node in tree.iter("source") if node.get("file"))


def clean(pool, module, names):
    for name in names:
        module("machine", uri=pool.uri, name=name, state="absent", shutdown_timeout=0)


def test_run_strategy_lifecycle(pool, module, idle_image):
    name = "rs-life"
    clean(pool, module, [name])
    args = dict(uri=pool.uri, name=name, machine_class="small", image=idle_image, network_interfaces=[],
                shutdown_timeout=0)

    result = module("machine", check=True, **args)
    assert result["changed"] and result["actions"] == ["create", "start"], result  # autostart: the create's
    assert pool.domain(name) is None

    result = module("machine", **args)
    assert not result.get("failed"), result
    dom = pool.domain(name)
    assert dom.isActive() and dom.autostart() == 1
    assert crash_action(dom) == "restart" and crash_action(dom, 0) == "restart"
    assert record_of(dom)["spec"]["run_strategy"] == "always"
    assert (result["machine"]["run_strategy"], result["machine"]["autostart"]) == ("always", True)
    assert module("machine", **args)["changed"] is False

    # manual: changed in place, live, with a diff
    result = module("machine", check=True, run_strategy="manual", **args)
    assert result["changed"] and dom.autostart() == 1
    result = module("machine", run_strategy="manual", **args)
    assert result["actions"] == ["update run_strategy"], result
    assert result["diff"]["before"] == {"run_strategy": "always", "autostart": True}
    assert result["diff"]["after"] == {"run_strategy": "manual", "autostart": False}
    assert dom.autostart() == 0 and crash_action(dom) == "destroy" and crash_action(dom, 0) == "destroy"
    assert dom.isActive()
    # left out, a strategy is kept
    assert module("machine", **args)["changed"] is False

    # a machine made before run strategies (no strategy recorded, on_crash destroy) converges to always
    tree = ET.fromstring(dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE))
    node = tree.find("metadata/{%s}machine" % NS)
    legacy = json.loads(node.text)
    legacy["spec"].pop("run_strategy")
    node.text = json.dumps(legacy)
    pool.conn.defineXML(ET.tostring(tree, encoding="unicode"))
    result = module("machine", **args)
    assert result["actions"] == ["update run_strategy"], result
    assert result["diff"]["before"] == {"run_strategy": None, "autostart": False}
    assert dom.autostart() == 1 and crash_action(dom) == "restart"

    # always with state present starts a machine found off
    dom.destroy()
    result = module("machine", state="present", **args)
    assert result["actions"] == ["start"] and dom.isActive(), result
    # stop: an always machine becomes halted, and present then keeps it off
    result = module("machine", state="stopped", **args)
    assert result["diff"]["after"] == {"run_strategy": "halted", "autostart": False}, result
    assert not dom.isActive() and dom.autostart() == 0
    assert module("machine", state="present", **args)["changed"] is False and not dom.isActive()

    clean(pool, module, [name])
    assert pool.domain(name) is None


@pytest.mark.parametrize("strategy, state", [("always", "stopped"), ("halted", "running")])
def test_a_contradicting_state_is_refused_and_nothing_is_made(pool, module, idle_image, strategy, state):
    name = "rs-refused"
    clean(pool, module, [name])
    result = module("machine", uri=pool.uri, name=name, machine_class="small", image=idle_image,
                    network_interfaces=[], state=state, run_strategy=strategy)
    assert_failed(result, "run_strategy", strategy)
    assert pool.domain(name) is None
    assert [v for v in pool.volumes() if v.startswith(name + "-")] == []


def reboot(pool):
    proc = subprocess.run(["python3", os.path.join(REPO, "lab", "lab.py"), "reboot", "--dir",
                           os.path.dirname(lab_file()), "--pool", pool.name], capture_output=True, text=True,
                          timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout + proc.stderr


def started_at(pid):
    """When ``pid`` started, in seconds since the machine booted (/proc/PID/stat field 22)."""
    with open("/proc/%d/stat" % pid) as handle:
        return int(handle.read().rsplit(")", 1)[1].split()[19]) / os.sysconf("SC_CLK_TCK")


def test_a_host_reboot_brings_back_exactly_the_machines_whose_strategy_says_so(
        registered, module, image, idle_image, tmp_path, pools_kept_up, request):
    pool = registered[2]
    fleet = {"rs-always": ("always", "running", image), "rs-onfail": ("on_failure", "running", idle_image),
             "rs-manual": ("manual", "running", idle_image), "rs-halted": ("halted", "stopped", idle_image),
             "rs-onfail-off": ("on_failure", "stopped", idle_image)}
    clean(pool, module, fleet)
    request.addfinalizer(lambda: clean(pool, module, fleet))  # whatever happens: the next file needs pool3 empty
    for name, (strategy, state, source) in fleet.items():
        extra = {} if source == image else {"network_interfaces": []}
        result = module("machine", uri=pool.uri, name=name, machine_class="small", image=source, state=state,
                        run_strategy=strategy, shutdown_timeout=0, wait="address" if source == image else "running",
                        **extra)
        assert not result.get("failed"), result
    address = module("machine", uri=pool.uri, name="rs-always", state="present")["machine"]["ip_addresses"]
    assert address
    pool.wait_console("rs-always", "MACHINERY-READY", timeout=180)
    before = {name: (pool.domain(name).UUIDString(), record_of(pool.domain(name)), files_of(pool.domain(name)))
              for name in fleet}
    old_pids = {name: qemu_pids(before[name][0]) for name in fleet}
    assert all(old_pids[name] for name in ("rs-always", "rs-onfail", "rs-manual"))

    output = reboot(pool)
    back = time.monotonic()
    daemon_started = started_at(lab_pid(pool))
    assert re.search(r"3 guest\(s\) killed", output), output
    # the old guests are dead: SIGKILLed by the power loss (a zombie not yet reaped is dead too; its exit may lag)
    deadline = time.monotonic() + 30
    while any(process_running(pid) for pids in old_pids.values() for pid in pids):
        assert time.monotonic() < deadline, old_pids
        time.sleep(0.2)
    pool.reconnect()
    deadline = time.monotonic() + 60
    while not all(pool.domain(name).isActive() for name in ("rs-always", "rs-onfail")):
        assert time.monotonic() < deadline, "the always and on_failure machines did not come back"
        time.sleep(0.2)
    TIMINGS["reboot command returned to all running"] = time.monotonic() - back
    TIMINGS["daemon start to the last guest's QEMU start"] = max(
        started_at(pid) for name in ("rs-always", "rs-onfail") for pid in qemu_pids(before[name][0])) - daemon_started

    running = {name for name in fleet if pool.domain(name).isActive()}
    assert running == {"rs-always", "rs-onfail"}
    for name in fleet:
        dom = pool.domain(name)
        assert (dom.UUIDString(), record_of(dom), files_of(dom)) == before[name], name
        assert {os.path.basename(path) for path in files_of(dom)} <= set(pool.volumes()), name
    # new guests, booted again: a new QEMU process, a console written anew, the same address
    assert set(qemu_pids(before["rs-always"][0])).isdisjoint(old_pids["rs-always"])
    pool.wait_console("rs-always", "MACHINERY-READY", timeout=180)
    TIMINGS["reboot command returned to the busybox guest booted"] = time.monotonic() - back
    deadline = time.monotonic() + 120
    while True:
        seen = module("machine", uri=pool.uri, name="rs-always", state="present")
        if seen["machine"]["ip_addresses"]:
            break
        assert time.monotonic() < deadline, seen
        time.sleep(1)
    assert seen["machine"]["ip_addresses"] == address and seen["changed"] is False

    # the inventory sees them as libvirt does
    source = write_source(tmp_path, [pool])
    data, _warnings = listing(source)
    phases = {name: data["_meta"]["hostvars"][name]["machinery"]["phase"] for name in fleet}
    # (the two created stopped never ran: Pending)
    assert phases == {"rs-always": "Running", "rs-onfail": "Running", "rs-manual": "Shutdown",
                      "rs-halted": "Pending", "rs-onfail-off": "Pending"}
    assert data["_meta"]["hostvars"]["rs-always"]["ansible_host"] == address[0]
    # a converge agrees with what the host did: nothing to change
    for name in fleet:
        assert module("machine", uri=pool.uri, name=name, state="present")["changed"] is False, name
    clean(pool, module, fleet)
    print("timings: %s" % {key: round(value, 1) for key, value in TIMINGS.items()})


# --- power actions, proven inside the busybox guest --------------------------------------------------------------

# The guest prints its boot id once and its uptime every second (a user-data script: lab/image/rootfs/init).
WATCH = "#!/bin/sh\necho \"BOOTID $(cat /proc/sys/kernel/random/boot_id)\"\n" \
        "while :; do echo \"UPTIME $(cut -d' ' -f1 /proc/uptime)\"; sleep 1; done\n"


def boot_id(pool, name, timeout=180):
    """The boot id the guest printed (its console is written anew by each QEMU process)."""
    deadline = time.monotonic() + timeout
    while True:
        found = re.findall(r"BOOTID ([0-9a-f-]{36})", pool.console(name))
        if found:
            return found[-1]
        assert time.monotonic() < deadline, pool.console(name)[-2000:]
        time.sleep(0.5)


def test_power_actions_seen_from_inside_the_guest(registered, module, image):
    pool = registered[1]
    name = "rs-power"
    clean(pool, module, [name])
    args = dict(uri=pool.uri, name=name, machine_class="small", image=image, shutdown_timeout=20,
                cloud_init={"user_data": WATCH})
    assert not module("machine", **args).get("failed")
    dom = pool.domain(name)
    first = boot_id(pool, name)
    wait_uptime_above(pool, name, 0, timeout=60)

    # restarted, soft: the ACPI button (the guest prints MACHINERY-POWEROFF), a new boot
    result = module("machine", check=True, state="restarted", **args)
    assert result["changed"] and result["actions"] == ["restart"] and boot_id(pool, name) == first
    began = time.monotonic()
    result = module("machine", state="restarted", **args)
    assert result["actions"] == ["restart"] and result["machine"]["restart_count"] == 1, result
    second = boot_id(pool, name)
    TIMINGS["soft restart: run start to the new boot's id on the console"] = time.monotonic() - began
    assert second != first and dom.isActive()
    # hard: a power cycle, another boot
    began = time.monotonic()
    result = module("machine", state="restarted", restart="hard", **args)
    assert result["machine"]["restart_count"] == 2, result
    third = boot_id(pool, name)
    TIMINGS["hard restart: run start to the new boot's id on the console"] = time.monotonic() - began
    assert third not in (first, second)

    # paused: the CPUs stop, and running resumes the same boot
    result = module("machine", state="paused", **args)
    assert result["diff"] == {"before": {"power": "running"}, "after": {"power": "paused"}}, result
    assert dom.state()[0] == libvirt.VIR_DOMAIN_PAUSED and result["machine"]["power_state"] == "paused"
    assert {c["type"]: c["reason"] for c in result["machine"]["conditions"]}["Ready"] == "Paused"
    assert module("machine", state="paused", **args)["changed"] is False
    result = module("machine", **args)
    assert result["actions"] == ["resume"] and dom.state()[0] == libvirt.VIR_DOMAIN_RUNNING, result

    # suspended: memory saved to the host's disk, the QEMU process gone; resumed, the uptime goes on
    seen = max(wait_uptime_above(pool, name, 0))
    assert module("machine", check=True, state="suspended", **args)["changed"] and dom.isActive()
    result = module("machine", state="suspended", **args)
    assert result["actions"] == ["suspend"] and not dom.isActive() and dom.hasManagedSaveImage(0), result
    assert result["machine"]["power_state"] == "suspended"
    assert module("machine", state="suspended", **args)["changed"] is False
    result = module("machine", **args)
    assert result["actions"] == ["resume"] and dom.isActive() and result["machine"]["restart_count"] == 2, result
    after = wait_uptime_above(pool, name, 0, timeout=60)
    assert min(after) >= seen, (seen, after)  # the same boot: its uptime did not start again
    assert module("machine", **args)["changed"] is False

    # a stopped machine cannot be suspended: refused naming the field, nothing changed
    module("machine", state="stopped", run_strategy="manual", **args)
    result = module("machine", state="suspended", **args)
    assert_failed(result, "state", "off")
    assert not dom.isActive() and not dom.hasManagedSaveImage(0)
    clean(pool, module, [name])
    print("timings: %s" % {key: round(value, 1) for key, value in TIMINGS.items()})


# --- a guest that panics: its pvpanic device tells QEMU, libvirt applies the strategy's on_crash -------------------

PANIC = "#!/bin/sh\necho \"BOOTID $(cat /proc/sys/kernel/random/boot_id)\"\nsleep 2\necho c > /proc/sysrq-trigger\n"


@pytest.mark.parametrize("strategy", ["on_failure", "always", "manual"])
def test_a_guest_that_panics_is_restarted_or_left_off_by_its_strategy(registered, module, image, strategy):
    """The busybox guest panics (sysrq c) two seconds after every boot. on_failure and always: libvirt restarts it
    (running after a crash, a new boot id on its console); manual: it is off, crashed, not rebooted by its own
    kernel (panic=5) nor hung."""
    pool = registered[2]
    name = "rs-panic-%s" % strategy.replace("_", "")
    clean(pool, module, [name])
    made = module("machine", uri=pool.uri, name=name, machine_class="small", image=image, network_interfaces=[],
                  run_strategy=strategy, state="running", shutdown_timeout=0, cloud_init={"user_data": PANIC})
    assert made["actions"] == ["create", "start"], made
    dom = pool.domain(name)
    first = boot_id(pool, name)
    deadline = time.monotonic() + 180
    if strategy == "manual":
        while dom.isActive():
            assert time.monotonic() < deadline, pool.console(name)[-2000:]
            time.sleep(0.5)
        assert dom.state() == [libvirt.VIR_DOMAIN_SHUTOFF, libvirt.VIR_DOMAIN_SHUTOFF_CRASHED]
        assert "sysrq triggered crash" in pool.console(name)
    else:
        # libvirt resets the guest at once and says it runs again after a crash (the state's reason); the kernel's
        # own reboot after a panic (panic=5) would leave the reason as it was. Then another boot prints its id.
        crashed = [libvirt.VIR_DOMAIN_RUNNING, libvirt.VIR_DOMAIN_RUNNING_CRASHED]
        while dom.state() != crashed or boot_id(pool, name) == first:
            assert time.monotonic() < deadline, (dom.state(), pool.console(name)[-2000:])
            time.sleep(0.2)
    clean(pool, module, [name])

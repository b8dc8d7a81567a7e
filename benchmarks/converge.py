"""Converge N machines (default 30) on the lab's pools from nothing, then the no-op re-run.

Compared, for the same domains and disks:
  floor      sequential raw libvirt-python: thin qcow2 overlay + defineXML + create per machine, one
             connection per pool, the very XML the collection builds;
  role       the machines role (scheduler lookup + machine module per machine, as asynchronous jobs) through
             ansible-playbook, create from nothing and the no-op re-run;
  community  community.libvirt 2.x through ansible-playbook: virt define + virt state=running per machine
             (its overlays are created beforehand, untimed: it has no way to make them).
The guests boot a blank disk and idle in the firmware, so the numbers measure the control plane rather than
30 TCG guests booting an OS on two cores.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import libvirt

from ansible_collections.machinery.compute.plugins.module_utils.core import domain as dx
from ansible_collections.machinery.compute.plugins.module_utils.machines import images
from ansible_collections.machinery.compute.plugins.module_utils.core import storage
from common import run_module as module

HERE = os.path.dirname(os.path.abspath(__file__))
BIN = os.path.dirname(sys.executable)


def playbook(path, extra, collections=None):
    env = dict(os.environ, ANSIBLE_LOCALHOST_WARNING="false", ANSIBLE_INVENTORY_UNPARSED_WARNING="false")
    if collections:
        env["ANSIBLE_COLLECTIONS_PATH"] = collections
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as handle:
        json.dump(extra, handle)
    start = time.perf_counter()
    proc = subprocess.run([os.path.join(BIN, "ansible-playbook"), path, "-e", "@" + handle.name],
                          capture_output=True, text=True, env=env, check=False)
    elapsed = time.perf_counter() - start
    os.unlink(handle.name)
    if proc.returncode:
        raise SystemExit("%s failed:\n%s\n%s" % (path, proc.stdout[-3000:], proc.stderr[-2000:]))
    return elapsed


def wipe(conns, prefix):
    for conn in conns.values():
        pool = conn.storagePoolLookupByName("machinery")
        for dom in conn.listAllDomains(0):
            if dom.name().startswith(prefix):
                if dom.isActive():
                    dom.destroy()
                dom.undefine()
        pool.refresh(0)
        for name in pool.listVolumes():
            if name.startswith(prefix):
                pool.storageVolLookupByName(name).delete(0)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lab", default=os.path.join(HERE, "..", ".lab", "lab.json"))
    parser.add_argument("--count", type=int, default=30)
    parser.add_argument("--community", help="collections path holding community.libvirt 2.x (optional)")
    options = parser.parse_args()
    lab_file = os.path.abspath(options.lab)
    with open(lab_file) as handle:
        lab = json.load(handle)
    pools = lab["pools"]
    conns = {entry["uri"]: libvirt.open(entry["uri"]) for entry in pools}
    work = tempfile.mkdtemp()
    blank = os.path.join(work, "blank.qcow2")
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", blank, "16M"], check=True)
    for entry in pools:
        module("machine_pool", {"uri": entry["uri"], "name": entry["name"], "networks": [{"name": "machinery"}],
                                "overcommit": {"cpu": 32.0}})
        module("machine_class", {"uri": entry["uri"], "name": "bench", "cpu": 1, "memory": "128Mi"})
    wipe(conns, "conv-")
    wipe(conns, "floor-")
    wipe(conns, "comm-")

    # one warm machine per pool: caches the image and gives the floor the collection's own XML
    templates = {}
    for entry in pools:
        module("machine", {"uri": entry["uri"], "name": "conv-warm", "machine_class": "bench", "image": blank})
        dom = conns[entry["uri"]].lookupByName("conv-warm")
        tree = dx.parse(dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE))
        tree.remove(tree.find("uuid"))
        templates[entry["uri"]] = dx.tostring(tree)
        module("machine", {"uri": entry["uri"], "name": "conv-warm", "state": "absent", "shutdown_timeout": 1})
    checksum = storage.sha256_file(blank)

    def machine_xml(uri, name, root_path):
        tree = dx.parse(templates[uri])
        tree.find("name").text = name
        for source in tree.iter("source"):
            if source.get("file", "").endswith("conv-warm-root.qcow2"):
                source.set("file", root_path)
        for log in tree.iter("log"):
            log.set("file", log.get("file").replace("conv-warm", name))
        for mac in tree.iter("mac"):
            mac.set("address", dx.derive_mac(name, "eth0"))
        return dx.tostring(tree)

    def overlay(uri, name):
        pool = conns[uri].storagePoolLookupByName("machinery")
        image_vol, fmt = images.cached_volume(pool, checksum)
        return storage.create_volume(pool, name + "-root.qcow2", image_vol.info()[1], "qcow2",
                                     backing=(image_vol.path(), fmt))

    report = {"machines": options.count, "pools": len(pools)}
    start = time.perf_counter()
    for index in range(options.count):
        uri = pools[index % len(pools)]["uri"]
        name = "floor-%02d" % index
        root = overlay(uri, name)
        conns[uri].defineXML(machine_xml(uri, name, root.path())).create()
    report["floor_s"] = round(time.perf_counter() - start, 2)
    wipe(conns, "floor-")

    extra = {"lab_file": lab_file, "bench_count": options.count, "bench_image": blank}
    report["role_create_s"] = round(playbook(os.path.join(HERE, "converge.yml"), extra), 2)
    report["role_noop_s"] = round(playbook(os.path.join(HERE, "converge.yml"), extra), 2)
    wipe(conns, "conv-")

    if options.community:
        jobs = []
        for index in range(options.count):
            uri = pools[index % len(pools)]["uri"]
            name = "comm-%02d" % index
            root = overlay(uri, name)
            jobs.append({"uri": uri, "name": name, "xml": machine_xml(uri, name, root.path())})
        jobs_file = os.path.join(work, "jobs.json")
        with open(jobs_file, "w") as handle:
            json.dump(jobs, handle)
        report["community_s"] = round(playbook(os.path.join(HERE, "converge_community.yml"),
                                               {"jobs_file": jobs_file}, options.community), 2)
        report["community_noop_s"] = round(playbook(os.path.join(HERE, "converge_community.yml"),
                                                    {"jobs_file": jobs_file}, options.community), 2)
        wipe(conns, "comm-")
        report["community_vs_role"] = round(report["community_s"] / report["role_create_s"], 2)
    report["role_vs_floor"] = round(report["role_create_s"] / report["floor_s"], 2)
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()

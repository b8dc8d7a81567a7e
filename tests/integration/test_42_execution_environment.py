# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Jobs inside the built execution environment, as AWX runs them: ansible-runner in container mode (podman) on a
private data directory laid out as in test_16_awx_runner.py, the image `make ee` built (MACHINERY_EE_IMAGE). The
credential reaches one lab pool over SSH (the lab's sshd on loopback, the credential's key) and one over TLS (its
link address, the credential's CA, certificate and key); the container shares the machine's network, as an AWX
execution node's job reaches hypervisors on its network, and sees only the job's private data directory and the
disk image. Jobs: pools.yml, machines.yml converging two machines, the inventory update, machines.yml deleting
them. Each is checked from its artifacts and from libvirt. make ee runs this file; make integration leaves it out
(it needs the image).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit

import pytest
import yaml

from conftest import OVERCOMMIT, Pool, load_lab, run_module
from test_16_awx_runner import inject_credential, job_env, private_data_dir, task_results

BIN = Path(sys.executable).parent
MACHINES = ["ee-1", "ee-2"]


@pytest.fixture(name="image", scope="session")
def idle_guest_image(idle_image):
    """Nothing here looks inside a guest."""
    return idle_image


def without(uri, *keys):
    """``uri`` without the query parameters ``keys`` (the lab's own files, which the credential replaces)."""
    parts = urlsplit(uri)
    query = [(key, value) for key, value in parse_qsl(parts.query) if key not in keys]
    return parts._replace(query=urlencode(query, safe="/")).geturl()


@pytest.fixture(scope="module")
def ee(tmp_path_factory, idle_image):
    image = os.environ.get("MACHINERY_EE_IMAGE")
    assert image, "MACHINERY_EE_IMAGE names the execution environment image (make ee builds it and runs this file)"
    lab = load_lab()
    ssh_pool, tls_pool = lab["pools"][0], lab["pools"][1]
    lab_dir = Path(ssh_pool["uris"]["unix"].split("socket=", 1)[1]).parents[2]
    work = tmp_path_factory.mktemp("ee")
    private = private_data_dir(work)
    # the pools as an AWX user enters them: plain URIs, the files in the credential
    uris = {ssh_pool["name"]: without(ssh_pool["uris"]["openssh"], "keyfile") + "&no_verify=1",
            tls_pool["name"]: without(tls_pool["uris"]["tls"], "pkipath")}
    pki = Path(lab["tls"]["pkipath"])
    injected = inject_credential(private, {
        "pool_uris": "\n".join(uris.values()),
        "ssh_private_key": Path(lab["ssh"]["keyfile"]).read_text(),
        "tls_ca_cert": (pki / "cacert.pem").read_text(), "tls_client_cert": (pki / "clientcert.pem").read_text(),
        "tls_client_key": (pki / "clientkey.pem").read_text()})
    # none of the lab's own key or certificate files reaches the job (socket= names a path on the SSH host)
    for own in ("ssh", "pki"):
        assert str(lab_dir / own) not in json.dumps(injected)
    (private / "env" / "envvars").write_text(yaml.safe_dump(dict(injected, ANSIBLE_FORCE_COLOR="0")))
    env = {key: value for key, value in os.environ.items() if not key.startswith("ANSIBLE_")}
    yield {"private": private, "env": env, "image": image, "uris": uris, "lab": lab, "disk": idle_image,
           "pools": [Pool(entry["name"], entry["uri"]) for entry in (ssh_pool, tls_pool)]}
    for entry in (ssh_pool, tls_pool):
        for name in MACHINES:
            run_module("machine", uri=entry["uri"], name=name, state="absent", shutdown_timeout=0)


def in_ee(ee, ident, extravars, *args, cmdline=None):
    """ansible-runner run in container mode: the job's command runs in the image, under podman, with the private
    data directory (at its own path, where the credential's injected files point) and the disk image mounted."""
    private = ee["private"]
    job_env(private, extravars, cmdline)
    disk_dir = os.path.dirname(ee["disk"])
    command = [BIN / "ansible-runner", "run", private, "--ident", ident, "--process-isolation",
               "--process-isolation-executable", "podman", "--container-image", ee["image"],
               "--container-option=--network=host", "--container-option=--user=0",
               "--container-volume-mount", "%s:%s" % (private, private),
               "--container-volume-mount", "%s:%s:ro" % (disk_dir, disk_dir)] + list(args)
    proc = subprocess.run([str(part) for part in command], env=ee["env"], capture_output=True, text=True,
                          timeout=900, check=False)
    artifacts = private / "artifacts" / ident
    assert artifacts.is_dir(), "no artifacts (rc %d): %s %s" % (proc.returncode, proc.stdout, proc.stderr)
    events = [json.loads(path.read_text()) for path in sorted((artifacts / "job_events").glob("*.json"),
                                                              key=lambda path: int(path.name.split("-")[0]))]
    result = {"status": (artifacts / "status").read_text().strip(), "rc": int((artifacts / "rc").read_text()),
              "stdout": (artifacts / "stdout").read_text(), "events": events, "artifacts": artifacts,
              "command": json.loads((artifacts / "command").read_text())["command"]}
    assert result["status"] == "successful" and result["rc"] == 0 and proc.returncode == 0, \
        "%s: status %s rc %d\n%s\n%s" % (ident, result["status"], result["rc"], result["stdout"][-4000:],
                                         proc.stderr[-2000:])
    return result


def test_jobs_converge_machines_inside_the_execution_environment(ee):
    ssh_pool, tls_pool = ee["pools"]
    pools_run = in_ee(ee, "pools", {
        "machinery_pools": [{"name": name, "uri": uri, "networks": [{"name": "machinery"}], "overcommit": OVERCOMMIT}
                            for name, uri in ee["uris"].items()],
        "machinery_classes": [{"name": "small", "cpu": 1, "memory": "128Mi"}]}, "-p", "playbooks/pools.yml")
    # the job ran in the image, and the roles came from the collection installed in it
    assert pools_run["command"][0] == "podman" and ee["image"] in pools_run["command"]
    role_paths = [task["path"] for task in task_results(pools_run) if "/roles/" in task["path"]]
    assert role_paths and all(path.startswith("/usr/share/ansible/collections/") for path in role_paths), role_paths
    # read back over the unix sockets: both pools registered, the class published on each
    listed = run_module("machine_pool_info", pools=[pool.uri for pool in ee["pools"]])
    assert [entry["state"] for entry in listed["pools"]] == ["Ready", "Ready"], listed
    for entry in listed["pools"]:
        assert "small" in [item["name"] for item in entry["available_machine_classes"]], entry

    # two machines, one pinned to each pool: one converged over SSH, one over TLS
    machines = [{"name": name, "machine_class": "small", "image": ee["disk"], "labels": {"app": "ee"},
                 "machine_pool": pool.name} for name, pool in zip(MACHINES, ee["pools"])]
    task_results(in_ee(ee, "machines", {"machinery_machines": machines, "machinery_wait": "running"},
                       "-p", "playbooks/machines.yml"))
    for name, pool in zip(MACHINES, ee["pools"]):
        assert pool.domain(name) is not None and pool.domain(name).isActive(), (name, pool.name)
    # converging again changes nothing
    again = in_ee(ee, "machines-again", {"machinery_machines": machines, "machinery_wait": "running"},
                  "-p", "playbooks/machines.yml")
    stats = again["events"][-1]["event_data"]
    assert not stats["changed"], stats

    # the inventory update, inside the image: the project's source file, its pools from the credential
    output = ee["private"] / "artifacts" / "inventory-output.json"
    source = ee["private"] / "project" / "inventory" / "fleet.machinery.yml"
    inventory_run = in_ee(ee, "inventory", {}, "--binary", "ansible-inventory", "-p", "unused.yml",
                          cmdline="-i %s --list --export --output %s" % (source, output))
    assert inventory_run["command"][0] == "podman"
    listing = json.loads(output.read_text())
    hostvars = listing["_meta"]["hostvars"]
    assert set(MACHINES) <= set(hostvars), (inventory_run["command"], inventory_run["stdout"][-3000:])
    for name, pool in zip(MACHINES, ee["pools"]):
        assert hostvars[name]["machinery"]["pool"] == {"__ansible_unsafe": pool.name}
        assert name in listing["machinery_pool_" + pool.name]["hosts"]
    assert sorted(listing["app_ee"]["hosts"]) == MACHINES

    deleting = in_ee(ee, "delete", {"machinery_machines": [dict(machine, state="absent", shutdown_timeout=0)
                                                           for machine in machines],
                                    "machinery_wait": "none"}, "-p", "playbooks/machines.yml")
    task_results(deleting)
    for name, pool in zip(MACHINES, ee["pools"]):
        assert pool.domain(name) is None

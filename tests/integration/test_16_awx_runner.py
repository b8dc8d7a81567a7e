# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The AWX path: jobs and an inventory update run by ansible-runner on a private data directory laid out as AWX
lays it out.

The directory holds project/ (extensions/awx as a project synced from the collection's source tree: its playbooks
and its inventory source file), inventory/ (the job's inventory, localhost), env/extravars (the job template's
variables), env/envvars and the files of the credential of extensions/awx/credential_type_libvirt_pools.yml,
rendered from its injectors the way AWX renders them (a sandboxed Jinja environment, each file injector under a
name of its own in env/). The collection is the built tarball installed into requirements_collections, the
directory where AWX installs a project's collections/requirements.yml, found through ANSIBLE_COLLECTIONS_PATH
(the link the test environment keeps in its site-packages is switched off).

Jobs: pools.yml (register the lab's pools, publish a class), machines.yml (one small machine), the inventory
update (ansible-inventory --list --export through ansible-runner, as AWX runs inventory sources), and machines.yml
again deleting the machine. Each is checked from its artifacts: status, rc, and a job event of every task.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml
from jinja2.sandbox import ImmutableSandboxedEnvironment

from conftest import OVERCOMMIT, Pool, load_lab, run_module


@pytest.fixture(name="image", scope="session")
def idle_guest_image(idle_image):
    """Nothing here looks inside a guest: its machines run the idle image (conftest.idle_image), at no CPU cost."""
    return idle_image


REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
CREDENTIAL_TYPE = REPO / "extensions" / "awx" / "credential_type_libvirt_pools.yml"
MACHINE = "awx-1"
# Stand-ins for the TLS files: the lab's pools are reached over unix sockets, so they are only linked into the
# pkipath directory the playbooks assemble.
PEM = "-----BEGIN CERTIFICATE-----\n%s\n-----END CERTIFICATE-----\n"


class Namespace(dict):
    __getattr__ = dict.__getitem__


def inject_credential(private, inputs):
    """The credential's env vars and files as AWX injects them into a job's private data directory."""
    definition = yaml.safe_load(CREDENTIAL_TYPE.read_text())
    injectors = definition["injectors"]
    sandbox = ImmutableSandboxedEnvironment()
    values = {field["id"]: inputs.get(field["id"], "") for field in definition["inputs"]["fields"]}
    filenames = Namespace()
    for label, template in injectors["file"].items():
        handle, path = tempfile.mkstemp(dir=private / "env")
        with os.fdopen(handle, "w") as stream:
            stream.write(sandbox.from_string(template).render(**values))
        os.chmod(path, 0o600)
        filenames[label.split(".", 1)[1]] = path
    values["tower"] = Namespace(filename=filenames)
    return {name: sandbox.from_string(template).render(**values) for name, template in injectors["env"].items()}


def private_data_dir(work):
    """ansible-runner's private data directory of a job as AWX lays it out under ``work``: the project (a checkout
    of the collection's extensions/awx, its playbooks/ and inventory/) and the job's inventory, which AWX writes
    from its database (jobs here run on localhost)."""
    private = work / "private"
    for part in ("env", "inventory", "artifacts"):
        (private / part).mkdir(parents=True)
    shutil.copytree(REPO / "extensions" / "awx", private / "project")
    (private / "inventory" / "hosts").write_text(
        "localhost ansible_connection=local ansible_python_interpreter={{ ansible_playbook_python }}\n")
    return private


@pytest.fixture(scope="module")
def awx(tmp_path_factory):
    lab = load_lab()
    pools = lab["pools"][:2]
    work = tmp_path_factory.mktemp("awx")
    private = private_data_dir(work)
    env = {key: value for key, value in os.environ.items() if not key.startswith("ANSIBLE_")}
    env.update(PATH="%s:%s" % (BIN, env.get("PATH", "")), ANSIBLE_COLLECTIONS_SCAN_SYS_PATH="false",
               ANSIBLE_HOME=str(work / "home"), ANSIBLE_NOCOLOR="1")
    subprocess.run([BIN / "ansible-galaxy", "collection", "build", "--output-path", work / "build", REPO],
                   env=env, check=True, capture_output=True, timeout=300)
    collections = private / "requirements_collections"
    subprocess.run([BIN / "ansible-galaxy", "collection", "install", "--force", "-p", collections]
                   + list((work / "build").glob("machinery-compute-*.tar.gz")),
                   env=env, check=True, capture_output=True, timeout=300)
    injected = inject_credential(private, {
        "pool_uris": "\n".join(pool["uri"] for pool in pools),
        "ssh_private_key": "-----BEGIN OPENSSH PRIVATE KEY-----\nnot used by unix sockets\n"
                           "-----END OPENSSH PRIVATE KEY-----\n",
        "tls_ca_cert": PEM % "ca", "tls_client_cert": PEM % "client", "tls_client_key": PEM % "key"})
    envvars = dict(injected, ANSIBLE_COLLECTIONS_PATH=str(collections), ANSIBLE_COLLECTIONS_SCAN_SYS_PATH="false",
                   ANSIBLE_HOME=str(work / "home"), ANSIBLE_FORCE_COLOR="0")
    (private / "env" / "envvars").write_text(yaml.safe_dump(envvars))
    yield {"private": private, "env": env, "pools": pools, "lab": lab, "injected": injected,
           "collections": collections}
    for entry in pools:
        run_module("machine", uri=entry["uri"], name=MACHINE, state="absent", shutdown_timeout=0)


def job_env(private, extravars, cmdline=None):
    """A job's env/extravars and env/cmdline (the command's further arguments, or none), as AWX writes them."""
    (private / "env" / "extravars").write_text(yaml.safe_dump(extravars))
    if cmdline:
        (private / "env" / "cmdline").write_text(cmdline)
    elif (private / "env" / "cmdline").exists():
        (private / "env" / "cmdline").unlink()


def runner(awx, ident, extravars, *args, cmdline=None):
    """ansible-runner run on the private data directory; returns the artifacts of the run. Each job gets its own
    env/extravars and env/cmdline (the command's further arguments), as AWX writes them per job."""
    private = awx["private"]
    job_env(private, extravars, cmdline)
    proc = subprocess.run([BIN / "ansible-runner", "run", private, "--ident", ident] + list(args),
                          env=awx["env"], capture_output=True, text=True, timeout=900, check=False)
    artifacts = private / "artifacts" / ident
    assert artifacts.is_dir(), "no artifacts (rc %d): %s %s" % (proc.returncode, proc.stdout, proc.stderr)
    events = [json.loads(path.read_text()) for path in sorted((artifacts / "job_events").glob("*.json"),
                                                              key=lambda path: int(path.name.split("-")[0]))]
    result = {"status": (artifacts / "status").read_text().strip(), "rc": int((artifacts / "rc").read_text()),
              "stdout": (artifacts / "stdout").read_text(), "events": events, "artifacts": artifacts,
              "runner_rc": proc.returncode}
    assert result["status"] == "successful" and result["rc"] == 0 and proc.returncode == 0, \
        "%s: status %s rc %d\n%s" % (ident, result["status"], result["rc"], result["stdout"][-4000:])
    return result


def task_results(run):
    """Every task started, each with the result events of its hosts: all must be ok (or skipped)."""
    by_task = {}
    for event in run["events"]:
        data = event.get("event_data") or {}
        if event["event"] == "playbook_on_task_start":
            by_task[data["task_uuid"]] = {"name": data["task"], "path": data.get("task_path", ""), "results": []}
        elif event["event"].startswith("runner_on_") or event["event"].startswith("runner_item_on_"):
            by_task[data["task_uuid"]]["results"].append(event["event"])
    assert by_task, run["stdout"]
    for task in by_task.values():
        # a task's host result: runner_on_ok or runner_on_skipped (after its items' events for a loop)
        assert {"runner_on_ok", "runner_on_skipped"} & set(task["results"]), "no result for task %r" % task
        assert set(task["results"]) <= {"runner_on_start", "runner_on_ok", "runner_on_skipped",
                                        "runner_item_on_ok", "runner_item_on_skipped"}, task
    assert [event["event"] for event in run["events"] if event["event"] != "verbose"][0] == "playbook_on_start"
    assert run["events"][-1]["event"] == "playbook_on_stats"
    stats = run["events"][-1]["event_data"]
    assert not stats["failures"] and not stats["dark"], stats
    return list(by_task.values())


def test_jobs_and_inventory_update_through_runner(awx):
    pools, lab = awx["pools"], awx["lab"]
    injected = awx["injected"]
    assert injected["MACHINERY_POOLS"].split(",") == [pool["uri"] for pool in pools]
    assert os.path.isfile(injected["MACHINERY_TLS_CACERT"])

    # job template "pools": the lab's pools registered, the class small published on each
    pools_run = runner(awx, "pools", {
        "machinery_pools": [{"name": pool["name"], "uri": pool["uri"], "networks": [{"name": "machinery"}],
                             "overcommit": OVERCOMMIT} for pool in pools],
        "machinery_classes": [{"name": "small", "cpu": 1, "memory": "128Mi"}]}, "-p", "playbooks/pools.yml")
    tasks = task_results(pools_run)
    # the roles came from the collection installed where AWX installs a project's collections
    role_paths = [task["path"] for task in tasks if "/roles/" in task["path"]]
    assert role_paths and all(path.startswith(str(awx["collections"])) for path in role_paths), role_paths
    # the credential's TLS files under the names libvirt reads from a pkipath (links to the injected files)
    pki = Path(injected["MACHINERY_TLS_CACERT"]).parent / "machinery-pki"
    assert sorted(path.name for path in pki.iterdir()) == ["cacert.pem", "clientcert.pem", "clientkey.pem"]
    assert (pki / "clientcert.pem").read_text() == PEM % "client"

    # job template "machines": one small machine, placed by the scheduler on the credential's pools
    machine = {"name": MACHINE, "machine_class": "small", "image": lab["image"], "labels": {"app": "awx"}}
    machines_run = runner(awx, "machines", {"machinery_machines": [machine], "machinery_wait": "running"},
                          "-p", "playbooks/machines.yml")
    task_results(machines_run)
    placed = [pool for pool in (Pool(entry["name"], entry["uri"]) for entry in pools) if pool.domain(MACHINE)]
    assert len(placed) == 1 and placed[0].domain(MACHINE).isActive()

    # the inventory update, as AWX runs an inventory source from a project: ansible-inventory --list --export on
    # the project's source file (its pools from the credential's MACHINERY_POOLS), through ansible-runner
    # (runner's command line insists on a playbook, which a run of another binary leaves out)
    output = awx["private"] / "artifacts" / "inventory-output.json"
    source = awx["private"] / "project" / "inventory" / "fleet.machinery.yml"
    inventory_run = runner(awx, "inventory", {}, "--binary", str(BIN / "ansible-inventory"), "-p", "unused.yml",
                           "--inventory", str(source), cmdline="--list --export --output %s" % output)
    command = json.loads((inventory_run["artifacts"] / "command").read_text())["command"]
    assert command[:3] == [str(BIN / "ansible-inventory"), "--list", "--export"]
    assert command[command.index("-i") + 1] == str(source)
    listing = json.loads(output.read_text())
    hostvars = listing["_meta"]["hostvars"]
    # --export writes strings read from libvirt as the unsafe values they are
    assert hostvars[MACHINE]["machinery"]["pool"] == {"__ansible_unsafe": placed[0].name}
    assert hostvars[MACHINE]["machinery"]["labels"]["app"] == {"__ansible_unsafe": "awx"}
    assert MACHINE in listing["machinery_pool_" + placed[0].name]["hosts"]
    assert set(listing["machine_pools"]["hosts"]) == {pool["name"] for pool in pools}
    assert listing["app_awx"]["hosts"] == [MACHINE]
    assert inventory_run["rc"] == 0

    # job template "machines" again: the machine deleted
    deleting = runner(awx, "delete", {"machinery_machines": [dict(machine, state="absent", shutdown_timeout=0)],
                                      "machinery_wait": "none"}, "-p", "playbooks/machines.yml")
    task_results(deleting)
    assert placed[0].domain(MACHINE) is None

"""Issue 23's leftovers that need no libvirt: secrets kept out of a set's definition, rollout waves that keep
the floor, and what a failed run reports it did."""

import os
import subprocess

import pytest

from ansible_collections.machinery.compute.plugins.inventory import machines as inventory
from ansible_collections.machinery.compute.plugins.module_utils.core import connection, convergence
from ansible_collections.machinery.compute.plugins.module_utils.core.errors import ConflictError, ValidationError
from ansible_collections.machinery.compute.plugins.module_utils.fleets import machine_set as ms

GIB = 2 ** 30
TEMPLATE = {"machine_class": "small", "image": "/images/test.qcow2", "labels": {"app": "web"}}


def pool(name):
    return {"name": name, "uri": "qemu+unix:///%s" % name, "state": "Ready", "labels": {}, "taints": [],
            "classes": {"small": {"cpu": 1, "memory": GIB}}, "machines": [],
            "allocated": {"cpu": 0, "memory": 0}, "allocatable": {"cpu": 64, "memory": 64 * GIB}}


def desired(**changes):
    params = {"name": "web", "replicas": 3, "selector": {"match_labels": {"app": "web"}}, "template": TEMPLATE}
    params.update(changes)
    return ms.normalize_set(params)


def old_member(name, pool_name, phase="Running"):
    return {"name": name, "pool": pool_name, "uri": "qemu+unix:///%s" % pool_name, "phase": phase,
            "created": "2026-01-01T00:00:00+00:00", "conditions": [],
            "labels": {"app": "web", ms.OWNER_LABEL: "web", ms.HASH_LABEL: "0ld"}}


def observed(machines, pools=("p1", "p2", "p3")):
    return {"snapshots": [pool(name) for name in pools], "machines": list(machines),
            "pools": [{"name": name, "uri": "qemu+unix:///%s" % name, "state": "Ready", "definition": None}
                      for name in pools]}


def test_the_stored_template_keeps_no_passphrase():
    template = dict(TEMPLATE, ignition={"ignition": {"version": "3.4.0"}}, cloud_init={"user_data": "#cloud"},
                    volumes=[{"name": "data", "size": "1Gi", "encrypted": True, "passphrase": "correct horse"},
                             {"name": "scratch", "size": "1Gi"}])
    document = ms.definition(desired(template=template))
    assert "correct horse" not in repr(document)
    assert document["template"]["volumes"] == [
        {"name": "data", "size": "1Gi", "encrypted": True, "passphrase": "<secret>"},
        {"name": "scratch", "size": "1Gi"}]
    assert document["template"]["ignition"] == "<secret>"
    assert document["template"]["cloud_init"] == {"user_data": "<secret>"}
    # the original template is left as it was: members are still made from it
    assert template["volumes"][0]["passphrase"] == "correct horse"


def replay(plan, members):
    """Apply a plan's waves in the order the set applies them, counting running members after every step."""
    running = {member["name"] for member in members if member["phase"] == "Running"}
    total = {member["name"] for member in members}
    lowest, highest = len(running), len(total)
    for action in plan.actions:
        if action.kind == "create":
            running.add(action.target)
            total.add(action.target)
        elif action.kind == "delete":
            running.discard(action.target)
            total.discard(action.target)
        lowest, highest = min(lowest, len(running)), max(highest, len(total))
    return running, lowest, highest


@pytest.mark.parametrize("replicas,surge,unavailable", [
    (6, 2, 1), (6, 1, 0), (6, 0, 1), (6, 0, 2), (5, 3, 2), (3, 1, 1), (4, 2, 0), (1, 1, 0), (1, 0, 1)])
def test_a_rollout_never_drops_below_its_floor_nor_above_its_ceiling(replicas, surge, unavailable):
    members = [old_member("web-old%d" % index, "p%d" % (index % 3 + 1)) for index in range(replicas)]
    wanted = desired(replicas=replicas, rollout={"max_surge": surge, "max_unavailable": unavailable})
    plan = ms.plan_set(wanted, observed(members))
    running, lowest, highest = replay(plan, members)
    assert lowest >= replicas - unavailable
    assert highest <= replicas + surge
    assert len(running) == replicas
    assert not running & {member["name"] for member in members}
    assert plan.warnings == []


def test_members_not_running_go_first_and_cost_the_floor_nothing():
    members = [old_member("web-old%d" % index, "p1", "Shutdown" if index < 2 else "Running") for index in range(4)]
    plan = ms.plan_set(desired(replicas=4, rollout={"max_surge": 1, "max_unavailable": 0}), observed(members))
    _running, lowest, _highest = replay(plan, members)
    assert lowest >= 2  # the two running ones stay until new ones run
    first_wave = [a for a in plan.actions if a.data.get("wave") == 1 and a.kind == "delete"]
    assert {a.target for a in first_wave} >= {"web-old0", "web-old1"}


# --- what a failed run did -----------------------------------------------------------------------------------

class TwoSteps(convergence.Resource):
    """Two actions; the second fails."""

    def describe(self):
        return "thing"

    def holds(self, plan, observed):
        return ()

    def observe(self):
        return {}

    def plan(self, observed):
        return convergence.Plan([convergence.Action("withdraw", "small", pool="pool1"),
                                 convergence.Action("withdraw", "small", pool="pool2")])

    def _withdraw(self, action, _observed):
        if action.data["pool"] == "pool2":
            raise ConflictError("machines still use it")

    APPLY = {"withdraw": _withdraw}


def test_a_failure_carries_what_was_done_before_it():
    with pytest.raises(ConflictError) as failed:
        convergence.converge(TwoSteps())
    assert failed.value.done == ["withdraw small on pool1"]
    message = convergence.with_done(str(failed.value), failed.value.done)
    assert "machines still use it" in message and "withdraw small on pool1" in message
    assert convergence.with_done("nothing happened", []) == "nothing happened"


# --- TLS identities a killed run cannot orphan ---------------------------------------------------------------

def identity(tmp_path, name):
    paths = []
    for part in ("ca", "cert", "key"):
        path = tmp_path / ("%s-%s.pem" % (name, part))
        path.write_text(part)
        paths.append(str(path))
    return tuple(paths)


def test_a_tls_identity_is_reused_and_what_dead_runs_left_is_removed(tmp_path):
    temp = tmp_path / "tmp"
    temp.mkdir()
    first = connection.pki_directory(identity(tmp_path, "job1"), str(temp))
    assert connection.pki_directory(identity(tmp_path, "job1"), str(temp)) == first
    root = os.path.dirname(first)
    assert os.path.basename(root) == "machinery-pki-%d" % os.getuid() and os.stat(root).st_mode & 0o077 == 0
    # a run killed while making one (its pid is gone), and a job whose credential files were removed
    dead = subprocess.Popen(["true"])
    dead.wait()
    os.mkdir(os.path.join(root, ".making-%d-x1" % dead.pid))
    for path in identity(tmp_path, "job1"):
        os.unlink(path)
    second = connection.pki_directory(identity(tmp_path, "job2"), str(temp))
    assert os.listdir(root) == [os.path.basename(second)]
    assert sorted(os.listdir(second)) == ["cacert.pem", "clientcert.pem", "clientkey.pem"]
    assert open(os.path.join(second, "clientkey.pem")).read() == "key"


def test_someone_elses_pki_root_is_refused(tmp_path):
    root = tmp_path / ("machinery-pki-%d" % os.getuid())
    root.mkdir(mode=0o777)
    os.chmod(str(root), 0o777)
    with pytest.raises(ValidationError):
        connection.pki_root(str(tmp_path))


# --- addresses nothing could find are not asked for ----------------------------------------------------------

def test_no_source_is_asked_for_a_machine_without_network_interfaces():
    asked = []
    machine = {"name": "quiet", "phase": "Running", "network_interfaces": [], "guest": None}
    found = inventory.addresses_of(machine, ["lease", "agent", "arp"], lambda source: asked.append(source) or [],
                                   lambda interfaces: [], False)
    assert found == [] and asked == []

"""The collection's filters in a real play, through the templating of the ansible-core that runs it: make test runs
this file under the pinned release and again under the newest, whose Jinja and data tagging differ. Each filter is
applied to what the lab's pools report, and its result is checked against the pools' own answers."""

import json
import os

import pytest

from conftest import REPO, lab_file, run_playbook

from ansible_collections.machinery.compute.plugins.module_utils.core.quantity import format_quantity, parse_quantity
from ansible_collections.machinery.compute.plugins.module_utils.fleets.drivers import driven_by
from ansible_collections.machinery.compute.plugins.module_utils.machines.machine_status import TABLE_COLUMNS

PLAYBOOK = os.path.join(REPO, "tests", "integration", "playbooks", "filters.yml")
MACHINES = [{"name": name} for name in ("filt-a", "filt-b", "filt-c", "filt-d", "filt-e")]


@pytest.fixture(name="image", scope="session")
def idle_guest_image(idle_image):
    """No guest is looked into here."""
    return idle_image


def test_filters_in_a_play(registered, module, tmp_path):
    pools = registered
    out = tmp_path / "filters.json"
    proc, recap = run_playbook(PLAYBOOK, tmp_path / "vars.json", {"lab_file": lab_file(), "filt_out": str(out)})
    assert recap["failed"] == 0, proc.stdout + proc.stderr
    made = json.loads(out.read_text())

    uris = [pool.uri for pool in pools]
    assert made["uris"] == uris
    assert made["uri_of_string"] == uris[0]

    info = module("machine_pool_info", pools=uris)
    # a pool whose reservations take all its memory reports allocatable '0': a quantity like any other, read as
    # the filter reads it (minimum 0), not as an option's size is (minimum 1)
    reported = [parse_quantity(entry["allocatable"]["memory"], minimum=0) for entry in info["pools"]]
    assert made["memory_bytes"] == reported
    assert all(isinstance(value, int) for value in made["memory_bytes"])
    assert made["memory_quantity"] == [format_quantity(value) for value in reported]

    machines = module("machine_info", pools=uris)["machines"]
    assert made["table"][0].split() == list(TABLE_COLUMNS)
    assert len(made["table"]) == len(machines) + 1

    lab_pools = [{"name": pool.name, "uri": pool.uri} for pool in pools]
    expected = {pool.name: [m["name"] for m in driven_by(MACHINES, pool.name, lab_pools)] for pool in pools}
    assert made["driven"] == expected
    assert sorted(sum(made["driven"].values(), [])) == sorted(m["name"] for m in MACHINES)

    assert made["zero"] == [0, 0, "0"]
    assert "quantity: value: '12Q' is not a quantity" in made["bad"], made["bad"]
    assert "quantity: value: '-1' is not a quantity" in made["negative"], made["negative"]

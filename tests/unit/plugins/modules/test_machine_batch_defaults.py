# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""machine_batch's defaults, merged under each machine's own keys before the machine is validated, and what its
result lists."""

from __future__ import annotations

import pytest

from ansible_collections.machinery.compute.plugins.module_utils.core.errors import NameTaken, PoolFull, ValidationError
from ansible_collections.machinery.compute.plugins.module_utils.fleets.batch import BatchOutcome, summary, validated
from ansible_collections.machinery.compute.plugins.module_utils.machines import machine_spec

from conftest import refused


def test_a_machine_keeps_its_own_keys_over_the_defaults():
    specs = validated([{"name": "a", "cpu": 1, "memory": "128Mi"},
                       {"name": "b", "cpu": 1, "memory": "128Mi", "wait": "running", "labels": {"own": "x"}}],
                      {"wait": "none", "labels": {"team": "y"}})
    assert [spec["wait"] for spec in specs] == ["none", "running"]
    assert [spec["labels"] for spec in specs] == [{"team": "y"}, {"own": "x"}]  # whole, not merged


@pytest.mark.parametrize("defaults, message", [
    ({"colour": "red"}, "unknown option colour"),
    ({"name": "a"}, "a name is not a default"),
])
def test_bad_defaults_name_the_field(defaults, message):
    with pytest.raises(ValidationError) as error:
        validated([{"name": "a", "cpu": 1, "memory": "128Mi"}], defaults)
    assert (error.value.field, error.value.message) == ("defaults", message)


def test_a_bad_default_is_reported_at_the_machine_it_reaches():
    assert "wait" in refused("machines[0]", validated, [{"name": "a", "cpu": 1, "memory": "128Mi"}],
                             {"wait": "forever"})


def test_machines_alike_but_for_their_names_are_each_what_params_makes_of_them():
    machine = {"cpu": 2, "memory": "256Mi", "labels": {"app": "web"}, "tolerations": [{"key": "gpu"}]}
    specs = validated([dict(machine, name="web-%d" % index) for index in range(3)] + [dict(machine, name="db", cpu=1)])
    assert [spec["name"] for spec in specs] == ["web-0", "web-1", "web-2", "db"]
    for index, spec in enumerate(specs[:3]):
        assert spec == machine_spec.params(dict(machine, name="web-%d" % index), scheduling=True)
    assert specs[3]["cpu"] == 1


def test_a_bad_name_among_machines_alike_is_refused_at_its_own_element():
    machines = [{"name": name, "cpu": 1, "memory": "128Mi"} for name in ("a", "b", "Not_A_Label")]
    assert "DNS-1123" in refused("machines[2].name", validated, machines)


def _outcome():
    """A batch that created a, left b as it was and deleted c."""
    outcome = BatchOutcome()
    for name, phase, actions in (("a", "Pending", ["create"]), ("b", "Running", []), ("c", "Terminated", ["delete"])):
        outcome.machines[name] = {"name": name, "pool": "p1", "phase": phase, "machine_class": "small"}
        outcome.placements[name] = {"name": name, "pool": "p1", "uri": "test:///default", "reason": "spread"}
        if actions:
            outcome.actions[name] = actions
    return outcome, [{"name": name} for name in ("a", "b", "c")]


@pytest.mark.parametrize("returned, listed", [("all", ["a", "b", "c"]), ("changed", ["a", "c"]), ("none", [])])
def test_the_statuses_returned_are_those_asked_and_the_table_and_counts_cover_every_machine(returned, listed):
    outcome, specs = _outcome()
    result = summary(outcome, specs, returned)
    assert [machine["name"] for machine in result["machines"]] == listed
    assert [placement["name"] for placement in result["placements"]] == listed
    assert result["counts"] == {"Pending": 1, "Running": 1, "Terminated": 1}
    assert [line.split()[0] for line in result["table"]] == ["NAME", "a", "b"]  # a deleted machine has no row


def test_statuses_are_returned_in_the_order_of_the_machines_given():
    outcome, specs = _outcome()
    assert [machine["name"] for machine in summary(outcome, specs[::-1])["machines"]] == ["c", "b", "a"]


def test_a_machine_crowded_out_on_every_attempt_says_so_with_the_last_refusal():
    outcome = BatchOutcome()
    full = PoolFull("pool p1 is full: 2/2 cpu", "machine_pool")
    outcome.fail({"name": "a"}, "p1", full, crowded_out=4)
    outcome.fail({"name": "b"}, "p2", NameTaken("a machine named b already exists on pool p3", "name"), crowded_out=1)
    outcome.fail({"name": "c"}, "p1", ValidationError("bad", "cpu"))
    first, second, third = outcome.failures
    assert first["msg"] == "crowded out by concurrent runs on 4 attempts (retries 3): %s" % full
    assert first["reason"] == "PoolFull" and first["field"] == "machine_pool"
    assert second["msg"].startswith("crowded out by concurrent runs on 1 attempt (retries 0): name: a machine named b")
    assert "crowded" not in third["msg"]

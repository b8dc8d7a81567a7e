"""The move policy as pure functions: parsing with errors naming the field, the timeout from the memory, the
flags and parameters libvirt gets, what progress shows; the watch acting on the timeout once (a fake domain)."""

import libvirt
import pytest

from ansible_collections.machinery.compute.plugins.module_utils.core.errors import ValidationError
from ansible_collections.machinery.compute.plugins.module_utils.fleets import move_policy

MIB, GIB = 2 ** 20, 2 ** 30


def test_a_policy_is_parsed_into_libvirt_units():
    policy = move_policy.parse({"bandwidth": "100Mi/s", "max_downtime": 300, "completion_timeout_per_gib": 8,
                                "on_timeout": "postcopy", "auto_converge": True, "max_parallel": 2})
    assert policy == {"bandwidth": 100, "max_downtime": 300, "completion_timeout_per_gib": 8,
                      "on_timeout": "postcopy", "auto_converge": True, "max_parallel": 2}
    assert move_policy.params(policy) == {libvirt.VIR_MIGRATE_PARAM_BANDWIDTH: 100}
    assert move_policy.flags(policy) == libvirt.VIR_MIGRATE_AUTO_CONVERGE | libvirt.VIR_MIGRATE_POSTCOPY
    assert move_policy.parse(None)["on_timeout"] == "abort" and move_policy.flags(move_policy.parse(None)) == 0


@pytest.mark.parametrize("policy, field", [
    ({"bandwidth": "512Ki"}, "policy.bandwidth"),
    ({"bandwidth": "fast"}, "policy.bandwidth"),
    ({"max_downtime": 0}, "policy.max_downtime"),
    ({"completion_timeout_per_gib": "10"}, "policy.completion_timeout_per_gib"),
    ({"max_parallel": True}, "policy.max_parallel"),
    ({"on_timeout": "retry"}, "policy.on_timeout"),
    ({"speed": 1}, "policy"),
])
def test_bad_policies_name_the_field(policy, field):
    with pytest.raises(ValidationError) as info:
        move_policy.parse(policy)
    assert info.value.field == field


def test_the_timeout_counts_the_memory_in_gib():
    assert move_policy.timeout_seconds({"completion_timeout_per_gib": 8}, 2 * GIB) == 16
    assert move_policy.timeout_seconds({"completion_timeout_per_gib": 8}, 512 * MIB) == 4
    assert move_policy.timeout_seconds({"completion_timeout_per_gib": 4}, 128 * MIB) == 1  # never below 1 s
    assert move_policy.timeout_seconds({}, GIB) is None


class Job:
    """A domain whose migration job reports fixed statistics and records what was done to it."""

    def __init__(self):
        self.done = []

    def jobStats(self, _flags=0):  # noqa: N802
        return {"type": libvirt.VIR_DOMAIN_JOB_UNBOUNDED, "data_remaining": 64 * MIB, "memory_dirty_rate": 900}

    def abortJob(self):  # noqa: N802
        self.done.append("abort")

    def migrateStartPostCopy(self, _flags=0):  # noqa: N802
        self.done.append("postcopy")


@pytest.mark.parametrize("on_timeout", ["abort", "postcopy"])
def test_the_watch_acts_on_the_timeout_once(on_timeout):
    now = [0.0]
    job = Job()
    watch = move_policy.Watch(job, "web-1", {"completion_timeout_per_gib": 8, "on_timeout": on_timeout}, GIB,
                              clock=lambda: now[0])
    watch.tick()
    assert job.done == [] and watch.last == {"data_remaining": 64 * MIB, "dirty_rate": 900}
    now[0] = 9.0
    watch.tick()
    watch.tick()
    assert job.done == [on_timeout] and watch.timed_out == on_timeout and watch.samples == 3
    assert move_policy.message("web-1", 9, 8, watch.last) == "moving web-1: 9s of 8s, 64Mi left, 900 pages/s dirtied"

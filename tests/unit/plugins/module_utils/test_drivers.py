"""Which pool's task drives each machine when the pools are a play's hosts (pure: names and URIs only)."""

import pytest

from ansible_collections.machinery.compute.plugins.module_utils.core.errors import ValidationError
from ansible_collections.machinery.compute.plugins.module_utils.fleets.drivers import driven_by, driver

POOLS = [{"name": "hv%d" % index, "uri": "qemu+ssh://root@hv%d/system" % index} for index in range(1, 6)]
MACHINES = [{"name": "vm-%03d" % index, "machine_class": "small"} for index in range(200)]


def test_every_machine_has_one_driver_and_the_drivers_share_the_work():
    shares = {pool["name"]: driven_by(MACHINES, pool["name"], POOLS) for pool in POOLS}
    names = sorted(machine["name"] for share in shares.values() for machine in share)
    assert names == sorted(machine["name"] for machine in MACHINES)  # each once, none left out
    assert all(25 <= len(share) <= 55 for share in shares.values()), {k: len(v) for k, v in shares.items()}


def test_slices_agree_without_seeing_each_others_hosts():
    """Each slice knows only its own hosts and the full pool list: the answer for a host depends on nothing else,
    so it is the same whether the host is asked by name or by URI, or in a list given in another order."""
    uris = [entry["uri"] for entry in POOLS]
    # the URIs of a credential, with its key added to them: still the same pools
    keyed = [uri + "?keyfile=/runner/env/key" for uri in uris]
    for pool in POOLS:
        by_name = driven_by(MACHINES, pool["name"], POOLS)
        assert driven_by(MACHINES, pool["uri"], list(reversed(POOLS))) == by_name
        by_uri = driven_by(MACHINES, pool["uri"], uris)
        assert driven_by(MACHINES, pool["uri"], list(reversed(keyed))) == by_uri
        assert driven_by(MACHINES, pool["uri"] + "?no_verify=1", uris) == by_uri


def test_local_daemons_told_apart_by_their_socket_share_the_work():
    """Pools on one host (the lab's) differ only in socket=: each is a pool of its own."""
    uris = ["qemu+unix:///system?socket=/run/lab/pool%d/libvirt-sock" % index for index in range(1, 4)]
    shares = [driven_by(MACHINES, uri, uris) for uri in uris]
    assert all(40 <= len(share) <= 95 for share in shares), [len(share) for share in shares]


def test_a_pinned_machine_is_driven_by_its_pool():
    pinned = dict(MACHINES[0], machine_pool="hv4")
    assert driver(pinned, POOLS)["name"] == "hv4"
    assert pinned in driven_by([pinned], "hv4", POOLS)


def test_a_new_pool_takes_only_machines_it_wins():
    before = {machine["name"]: driver(machine, POOLS)["name"] for machine in MACHINES}
    grown = POOLS + [{"name": "hv6", "uri": "qemu+ssh://root@hv6/system"}]
    after = {machine["name"]: driver(machine, grown)["name"] for machine in MACHINES}
    moved = [name for name in before if before[name] != after[name]]
    assert moved and all(after[name] == "hv6" for name in moved)


@pytest.mark.parametrize("machines, pool, pools, field", [
    (MACHINES, "hv9", POOLS, "pool"),
    (MACHINES, "hv1", [], "pools"),
    ([{"machine_class": "small"}], "hv1", POOLS, "machines[0]"),
    (["vm-1"], "hv1", POOLS, "machines[0]"),
])
def test_bad_input_names_the_field(machines, pool, pools, field):
    with pytest.raises(ValidationError) as caught:
        driven_by(machines, pool, pools)
    assert caught.value.field == field


def test_a_slice_drives_what_any_of_its_pools_drives():
    """A slice's one task: the union of its hosts' shares, in the order given; the slices still cover the fleet once."""
    first, second = [POOLS[0]["name"], POOLS[3]["uri"]], [POOLS[1]["name"], POOLS[2]["name"], POOLS[4]["name"]]
    union = driven_by(MACHINES, first, POOLS)
    alone = driven_by(MACHINES, POOLS[0]["name"], POOLS) + driven_by(MACHINES, POOLS[3]["name"], POOLS)
    assert union == [machine for machine in MACHINES if machine in alone]
    assert sorted(m["name"] for m in union + driven_by(MACHINES, second, POOLS)) == sorted(m["name"] for m in MACHINES)


@pytest.mark.parametrize("pool, field", [([], "pool"), (["hv1", "hv9"], "pool[1]"), (["hv1", 7], "pool[1]")])
def test_a_bad_slice_names_the_pool(pool, field):
    with pytest.raises(ValidationError) as caught:
        driven_by(MACHINES, pool, POOLS)
    assert caught.value.field == field

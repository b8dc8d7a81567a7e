"""machine_batch: check mode, diff, validation before any write, masked secrets, deletion wherever a machine is."""

import json

import pytest

from conftest import assert_failed


@pytest.fixture(name="image", scope="session")
def idle_guest_image(idle_image):
    """Nothing here looks inside a guest: its machines run the idle image (conftest.idle_image), at no CPU cost."""
    return idle_image


SECRET = "batch-secret-value-91c2"


def machines(image, names, **extra):
    return [dict({"name": name, "machine_class": "small", "image": image, "network_interfaces": [],
                  "state": "present"}, **extra) for name in names]


def everywhere(pools, names):
    return {name: [pool.name for pool in pools if pool.domain(name) is not None] for name in names}


def test_batch_lifecycle(registered, module, image):
    pools = registered
    names = ["batch-%d" % index for index in range(4)]
    module("machine_batch", pools=[p.uri for p in pools], machines=[{"name": n, "state": "absent"} for n in names])
    specs = machines(image, names, ignition={"ignition": {"version": "3.4.0"}, "secret": SECRET})

    planned = module("machine_batch", check=True, pools=[{"name": p.name, "uri": p.uri} for p in pools],
                     machines=specs)
    assert planned["changed"] is True
    assert [p["pool"] for p in planned["placements"]] and all(p["pool"] for p in planned["placements"])
    assert everywhere(pools, names) == {name: [] for name in names}
    assert SECRET not in json.dumps(planned)

    made = module("machine_batch", pools=[p.uri for p in pools], machines=specs)
    assert made["changed"] is True, made
    assert SECRET not in json.dumps(made)
    found = everywhere(pools, names)
    assert all(len(where) == 1 for where in found.values()), found
    assert sorted(made["diff"]["after"]) == names
    assert made["table"][0].split()[0] == "NAME" and len(made["table"]) == 5

    again = module("machine_batch", pools=[p.uri for p in pools], machines=specs)
    assert again["changed"] is False, again
    assert [p["reason"] for p in again["placements"]] == ["already exists on pool %s" % found[n][0] for n in names]

    quiet = module("machine_batch", pools=[p.uri for p in pools], machines=specs, return_machines="none")
    assert quiet["changed"] is False
    assert (quiet["machines"], quiet["placements"]) == ([], [])
    assert quiet["counts"] == again["counts"] and sum(quiet["counts"].values()) == 4
    assert [line.split()[0] for line in quiet["table"]] == [line.split()[0] for line in again["table"]]

    resized = module("machine_batch", pools=[p.uri for p in pools], return_machines="changed",
                     machines=[dict(spec, labels={"tier": "web"}) for spec in specs[:1]] + specs[1:])
    assert resized["changed"] is True
    assert resized["diff"]["after"] == {names[0]: {"labels": {"tier": "web"}}}
    assert [machine["name"] for machine in resized["machines"]] == names[:1]
    assert resized["machines"][0]["labels"] == {"tier": "web"}
    assert [placement["name"] for placement in resized["placements"]] == names[:1]
    assert sum(resized["counts"].values()) == 4 and len(resized["table"]) == 5

    gone = module("machine_batch", pools=[p.uri for p in pools],
                  machines=[{"name": n, "state": "absent"} for n in names])
    assert gone["changed"] is True
    assert everywhere(pools, names) == {name: [] for name in names}
    assert module("machine_batch", pools=[p.uri for p in pools],
                  machines=[{"name": n, "state": "absent"} for n in names])["changed"] is False


def test_batch_validates_everything_first(registered, module, image):
    pools = registered
    before = {pool.name: pool.domain_names() for pool in pools}
    good = machines(image, ["valid-1", "valid-2"])
    for bad, field in (({"name": "Not A Name", "machine_class": "small", "image": image}, "name"),
                       ({"name": "typo", "machine_clas": "small", "image": image}, "machines[2]"),
                       ({"name": "valid-1", "machine_class": "small", "image": image}, "machines[2].name"),
                       ({"name": "neg", "cpu": -1, "memory": "1Gi", "image": image}, "machines[2].cpu"),
                       ({"name": "noimg", "machine_class": "small", "image": "/nonexistent.qcow2"},
                        "machines[2].image"),
                       ({"name": "nonet", "machine_class": "small", "image": image,
                         "network_interfaces": [{"name": "eth0", "network": "no-such"}]},
                        "machines[2].network_interfaces[0].network")):
        result = module("machine_batch", pools=[p.uri for p in pools], machines=good + [bad])
        assert result.get("failed"), result
        assert field in (result.get("field") or "") + result["msg"], result
        assert {pool.name: pool.domain_names() for pool in pools} == before
    assert_failed(module("machine_batch", pools=[], machines=good), "pools")

"""Runs that overlap (issue #23), the parts that need no libvirt: telling another run's change from a bug after
converging, and a registry that reads a document still being written as not there yet and confirms a short
listing before it picks a generation."""

import pytest

from ansible_collections.machinery.compute.plugins.module_utils.core.convergence import (
    Action, ConvergenceError, Plan, Resource, converge)
from ansible_collections.machinery.compute.plugins.module_utils.core.errors import ConflictError
from ansible_collections.machinery.compute.plugins.module_utils.coordination import documents
from ansible_collections.machinery.compute.plugins.module_utils.coordination import volumes
from ansible_collections.machinery.compute.plugins.module_utils.core import storage


class Dial(Resource):
    """A dial set to a value; ``meddle`` is what another run sets it to right after this run's write (or a write
    that does not land, with ``lost``)."""

    def __init__(self, wanted, meddle=None, lost=False):
        self.wanted = wanted
        self.value = 1
        self.meddle = meddle
        self.lost = lost

    def describe(self):
        return "the dial"

    def holds(self, plan, observed):
        return ()

    def observe(self):
        return self.value

    def plan(self, observed):
        if observed == self.wanted:
            return Plan()
        return Plan([Action("turn", "dial", {"value": observed}, {"value": self.wanted})])

    def _turn(self, action, _observed):
        if not self.lost:
            self.value = action.after["value"]
        if self.meddle is not None:
            self.value = self.meddle

    APPLY = {"turn": _turn}


def test_another_runs_change_is_a_conflict_naming_the_field():
    with pytest.raises(ConflictError) as caught:
        converge(Dial(2, meddle=3))
    assert "changed by another run" in caught.value.message and "value is 3, this run set 2" in caught.value.message
    assert "bug" not in caught.value.message


def test_a_write_that_did_not_land_is_still_a_bug():
    with pytest.raises(ConvergenceError) as caught:
        converge(Dial(2, lost=True))
    assert "this is a bug" in caught.value.message


class Volume:
    def __init__(self, name, busy):
        self._name, self.busy = name, busy

    def name(self):
        return self._name


class RegistryPool:
    """A registry storage pool whose listings come from ``listings`` in turn (the last one repeats)."""

    def __init__(self, listings):
        self.listings = list(listings)
        self.created = []
        self.refreshes = 0

    def listVolumes(self):  # noqa: N802 (libvirt's name)
        return list(self.listings.pop(0) if len(self.listings) > 1 else self.listings[0])

    def refresh(self, _flags):
        self.refreshes += 1

    def storageVolLookupByName(self, name):  # noqa: N802
        return Volume(name, name.endswith(".2.json"))


def test_a_document_still_being_written_reads_as_the_generation_before(monkeypatch):
    stored = {"class-small.1.json": documents.encode("class-small", 1, {"name": "small"})}

    def download(_conn, vol, limit):
        if vol.busy:
            raise storage.VolumeBeingWritten("download of volume %s failed: still being allocated" % vol.name())
        return stored[vol.name()]
    monkeypatch.setattr(storage, "download_bytes", download)
    monkeypatch.setattr(documents.lv, "lookup_volume", lambda pool, name: pool.storageVolLookupByName(name))
    pool = RegistryPool([["pool.1.json", "class-small.1.json", "class-small.2.json"]])
    assert documents.Registry(None, pool).get("class-small") == {"name": "small"}


def test_a_short_listing_is_confirmed_before_a_generation_is_picked(monkeypatch):
    pool = RegistryPool([[], ["pool.1.json", "move-web.4.json"]])
    monkeypatch.setattr(volumes.time, "sleep", lambda _seconds: None)
    registry = documents.Registry(None, pool)
    assert registry._complete_listing("move-web")["move-web"] == [(4, "move-web.4.json")]
    assert pool.refreshes == 1


def test_a_listing_with_the_registration_is_listed_again_before_a_key_is_taken_for_new(monkeypatch):
    """libvirt's list can be short by some volumes with the registration still in it: a put that took the key for
    new would write generation 1 beside the current generation 4, and be lost to every reader."""
    pool = RegistryPool([["pool.1.json"], ["pool.1.json", "move-web.4.json"]])
    monkeypatch.setattr(volumes.time, "sleep", lambda _seconds: None)
    registry = documents.Registry(None, pool)
    assert registry._complete_listing("move-web")["move-web"] == [(4, "move-web.4.json")]
    assert pool.refreshes >= 1


def test_a_key_absent_after_a_refresh_is_new_and_later_keys_cost_nothing_more():
    rounds = documents.ABSENCE_CONFIRMATIONS
    pool = RegistryPool([["pool.1.json"]] * (1 + rounds) + [["pool.1.json", "pending-web.1.json"]])
    registry = documents.Registry(None, pool)
    assert "pending-web" not in registry._complete_listing("pending-web")
    assert "pending-db" not in registry._complete_listing("pending-db")
    assert pool.refreshes == rounds

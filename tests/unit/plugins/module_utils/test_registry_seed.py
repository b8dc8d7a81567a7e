import contextlib
import io
import json
import time

import libvirt
import pycdlib
import pytest
import protocol_world as pw

from ansible_collections.machinery.compute.plugins.module_utils.coordination import documents
from ansible_collections.machinery.compute.plugins.module_utils.coordination import holds
from ansible_collections.machinery.compute.plugins.module_utils.coordination import keys
from ansible_collections.machinery.compute.plugins.module_utils.coordination import locks
from ansible_collections.machinery.compute.plugins.module_utils.coordination import volumes
from ansible_collections.machinery.compute.plugins.module_utils.machines import seed
from ansible_collections.machinery.compute.plugins.module_utils.machines.machine_status import table
from ansible_collections.machinery.compute.plugins.module_utils.pools.classes import published_class

from conftest import refused


@pytest.mark.parametrize("volume, key, generation", [
    ("class-t3.medium.4.json", "class-t3.medium", 4), ("class-small.12.json", "class-small", 12),
    ("class-a.5.3.json", "class-a.5", 3), ("pool.1.json", "pool", 1)])
def test_a_document_name_splits_at_its_last_generation(volume, key, generation):
    """A class named t3.medium keeps its dots in its key: the generation is the last number before .json."""
    found = keys._DOCUMENT.match(volume)
    assert (found.group("key"), int(found.group("generation"))) == (key, generation)


@pytest.mark.parametrize("volume", ["admission.lock", "admission.holder.c.12.34.56", "class-x.json", "Class-x.1.json"])
def test_other_volumes_of_the_registry_are_no_documents(volume):
    assert keys._DOCUMENT.match(volume) is None


def test_document_round_trip():
    body = {"name": "small", "cpu": 1, "memory": 134217728}
    data = documents.encode("class-small", 3, body)
    assert documents.decode(data, "class-small") == body


@pytest.mark.parametrize("cut", [0, 1, 10, 40, -2])
def test_cut_off_document_is_rejected(cut):
    data = documents.encode("class-small", 1, {"name": "small", "cpu": 1, "memory": 1})
    assert documents.decode(data[:cut], "class-small") is None


def test_tampered_or_misplaced_document_is_rejected():
    document = json.loads(documents.encode("pool", 1, {"name": "a"}))
    document["body"]["name"] = "b"
    assert documents.decode(json.dumps(document).encode(), "pool") is None
    assert documents.decode(documents.encode("pool", 1, {"name": "a"}), "class-a") is None


def test_registry_path():
    assert documents.registry_path("/var/lib/libvirt/machinery") == "/var/lib/libvirt/machinery-registry"
    assert documents.registry_path("/srv/vm/") == "/srv/vm-registry"


def read_iso(data):
    iso = pycdlib.PyCdlib()
    iso.open_fp(io.BytesIO(data))
    files = {}
    for name in ("meta-data", "user-data", "network-config"):
        out = io.BytesIO()
        try:
            iso.get_file_from_iso_fp(out, joliet_path="/" + name)
        except pycdlib.pycdlibexception.PyCdlibInvalidInput:
            continue
        files[name] = out.getvalue().decode()
    label = iso.pvd.volume_identifier.decode().strip()
    iso.close()
    return label, files


def test_nocloud_iso():
    files = seed.nocloud_files("web-1", {"user_data": {"packages": ["htop"]}, "network_config": {"version": 2}},
                               ["ssh-ed25519 AAAA test"])
    label, read = read_iso(seed.nocloud_iso(files))
    assert label == "cidata"
    assert "local-hostname: web-1" in read["meta-data"]
    assert read["user-data"].startswith("#cloud-config\n")
    assert "ssh-ed25519 AAAA test" in read["user-data"]
    assert "htop" in read["user-data"]
    assert read["network-config"] == "version: 2\n"


def test_user_data_script_cannot_take_keys():
    refused("cloud_init.user_data", seed.user_data_text, "#!/bin/sh\necho hi\n", ["ssh-ed25519 AAAA"])
    assert seed.user_data_text("#!/bin/sh\necho hi\n") == "#!/bin/sh\necho hi\n"


def test_ignition():
    assert json.loads(seed.ignition_document('{"ignition": {"version": "3.4.0"}}')) == {
        "ignition": {"version": "3.4.0"}}
    with_keys = json.loads(seed.ignition_document({"ignition": {"version": "3.4.0"}}, ["ssh-ed25519 K"]))
    assert with_keys["passwd"]["users"] == [{"name": "core", "sshAuthorizedKeys": ["ssh-ed25519 K"]}]
    for bad in ("{not json", "[1, 2]", 5):
        refused("ignition", seed.ignition_document, bad)


def test_table():
    lines = table([{"name": "web-1", "pool": "pool1", "machine_class": "small", "phase": "Running",
                    "restart_count": 0, "age": "5m", "ip_addresses": ["192.168.101.10"]},
                   {"name": "db", "pool": "pool2", "machine_class": None, "phase": "Pending", "restart_count": 2,
                    "age": "3s", "ip_addresses": []}])
    assert lines[0].split() == ["NAME", "POOL", "CLASS", "PHASE", "RESTARTS", "AGE", "IPS"]
    assert lines[1].split() == ["web-1", "pool1", "small", "Running", "0", "5m", "192.168.101.10"]
    assert lines[2].split() == ["db", "pool2", "-", "Pending", "2", "3s", "<none>"]
    assert lines[0].index("POOL") == lines[1].index("pool1")


def test_a_lock_is_abandoned_by_a_dead_or_missing_holder_and_never_by_a_live_one(monkeypatch):
    """A run killed between taking the lock and naming itself left a lock with no holder: it is broken once a
    waiter has watched it so for MARKERLESS_SECONDS; a live holder's lock only once its lease went unrenewed,
    whatever lies beside it and whatever its file's time says."""
    now = [1000.0]
    lock = locks.VolumeLock(None, None, clock=lambda: now[0])
    alive = locks.Identity().marker(keys.ADMISSION_HOLDER_PREFIX, 2)
    dead = "%sg2.%s.%d.%s.1" % (keys.ADMISSION_HOLDER_PREFIX, locks.Identity().controller, 2 ** 22 + 7, "1")  # no pid

    def seen(age, markers):
        return locks.View(2, markers, [1, 2], markers, age)
    assert lock.abandoned(seen(locks.MARKERLESS_SECONDS + 1, [])) is True
    assert lock.abandoned(seen(1, [])) is False
    assert lock.abandoned(seen(1, [dead])) is True
    assert lock.abandoned(seen(1, [alive])) is False
    assert lock.abandoned(seen(1, [alive, dead])) is False
    lock.watch.note((2, 1), [alive])
    now[0] += locks.ADMISSION_LEASE_SECONDS - 1
    assert lock.abandoned(seen(10 ** 6, [alive])) is False  # renewed within its lease, however old its file
    now[0] += 2
    assert lock.abandoned(seen(0, [alive])) is True  # a whole lease unrenewed, on the waiter's own clock


class HidingPool:
    """A registry pool whose listing misses ``hidden`` volumes until it is refreshed, as libvirt's listing of a dir
    pool does while it refreshes the pool after another thread's upload."""

    def __init__(self, volumes, hidden):
        self.volumes = set(volumes)
        self.hidden = set(hidden)
        self.deleted = []

    def listVolumes(self):
        return sorted(self.volumes - self.hidden)

    def refresh(self, _flags):
        self.hidden = set()


def test_an_expected_journal_hidden_by_a_refresh_is_still_deleted(monkeypatch):
    pool = HidingPool(["pool.1.json", "pending-vm-7.1.json"], hidden=["pending-vm-7.1.json"])
    monkeypatch.setattr(documents.storage, "delete_volume", lambda _pool, name, **_kw: pool.deleted.append(name) or True)
    registry = documents.Registry(None, pool)
    assert registry.remove("pending-vm-7", locked=True, expected=True) is True
    assert pool.deleted == ["pending-vm-7.1.json"]


def test_an_unexpected_key_is_believed_gone_at_once(monkeypatch):
    pool = HidingPool(["pool.1.json", "pending-vm-7.1.json"], hidden=["pending-vm-7.1.json"])
    monkeypatch.setattr(documents.storage, "delete_volume", lambda _pool, name, **_kw: pool.deleted.append(name) or True)
    assert documents.Registry(None, pool).remove("pending-vm-7", locked=True) is False
    assert pool.deleted == []


class CountingListings(HidingPool):
    """A HidingPool that counts its listings and refreshes."""

    def __init__(self, volumes, hidden=()):
        super().__init__(volumes, hidden)
        self.listings = self.refreshes = 0

    def listVolumes(self):
        self.listings += 1
        return super().listVolumes()

    def refresh(self, flags):
        self.refreshes += 1
        super().refresh(flags)


def no_waiting(_seconds):
    raise AssertionError("the registry waited for a document that a complete listing shows absent")


def test_a_class_a_complete_listing_lacks_is_absent_at_once(monkeypatch):
    """A manifest publishing 500 new classes asks each pool for each of them: a listing that holds the registration
    is believed after ABSENCE_CONFIRMATIONS refreshes, each followed by a listing, so each absent class after the
    first costs neither a wait nor another listing."""
    pool = CountingListings(["pool.1.json", "class-small.1.json"])
    monkeypatch.setattr(volumes.time, "sleep", no_waiting)
    registry = documents.Registry(None, pool)
    assert [published_class(registry, "bench-%d" % index) for index in range(50)] == [None] * 50
    rounds = documents.ABSENCE_CONFIRMATIONS
    assert (pool.listings, pool.refreshes) == (1 + rounds, rounds)


class RehidingPool(CountingListings):
    """A HidingPool whose first ``short`` refreshes are followed by another run's refresh that fails midway and
    leaves the list short again (the class hidden), before this process lists it."""

    def __init__(self, volumes, hidden, short):
        super().__init__(volumes, hidden)
        self.short, self.hide = short, set(hidden)

    def refresh(self, flags):
        super().refresh(flags)
        if self.refreshes <= self.short:
            self.hidden = set(self.hide)


def test_a_class_hidden_again_right_after_a_refresh_is_still_found(monkeypatch):
    """The CI registry race with one confirmation (2 of 404 reads missed the class): the listing right after this
    process's refresh was short again. Each of the ABSENCE_CONFIRMATIONS rounds must miss the class."""
    pool = RehidingPool(["pool.1.json", "class-small.1.json"], ["class-small.1.json"],
                        short=documents.ABSENCE_CONFIRMATIONS - 1)
    monkeypatch.setattr(volumes.time, "sleep", lambda _seconds: None)
    monkeypatch.setattr(documents.Registry, "_read", lambda self, key, relisted=False: (
        {"name": "small"} if keys.class_key("small") in self._generations() else None))
    assert published_class(documents.Registry(None, pool), "small") == {"name": "small"}


def test_a_class_a_short_listing_lacks_is_found_after_a_refresh(monkeypatch):
    """libvirt's refresh after an upload can leave the list short by some volumes with the registration still in
    it: a class missing from such a listing is found once the pool is refreshed, not taken for absent."""
    pool = CountingListings(["pool.1.json", "class-small.1.json"], hidden=["class-small.1.json"])
    monkeypatch.setattr(volumes.time, "sleep", lambda _seconds: None)
    monkeypatch.setattr(documents.Registry, "_read", lambda self, key, relisted=False: (
        {"name": "small"} if keys.class_key("small") in self._generations() else None))
    assert published_class(documents.Registry(None, pool), "small") == {"name": "small"}
    assert pool.refreshes >= 1


def test_a_class_hidden_with_the_registration_is_listed_again(monkeypatch):
    """A listing without the registration was taken in libvirt's refresh window: the class is looked for again."""
    pool = CountingListings(["pool.1.json", "class-small.1.json"], hidden=["pool.1.json", "class-small.1.json"])
    monkeypatch.setattr(volumes.time, "sleep", lambda _seconds: None)
    monkeypatch.setattr(documents.Registry, "_read", lambda self, key, relisted=False: (
        {"name": "small"} if keys.class_key("small") in self._generations() else None))
    assert published_class(documents.Registry(None, pool), "small") == {"name": "small"}
    assert pool.refreshes >= 1


def created_name(xml, volumes):
    """The name of the volume ``xml`` creates; libvirt's refusal when ``volumes`` holds it already."""
    name = xml.split("<name>")[1].split("</name>")[0]
    if name in volumes:
        error = libvirt.libvirtError("exists")
        error.err = (libvirt.VIR_ERR_STORAGE_VOL_EXIST,) + (None,) * 8
        raise error
    return name


class LaggingRegistry:
    """A registry pool in libvirt's refresh window: its first ``lag`` listings (and its lookups meanwhile) show
    nothing, whatever this process does; then everything."""

    def __init__(self, volumes, lag):
        self.volumes = set(volumes)
        self.lag = lag

    def name(self):
        return keys.REGISTRY_POOL

    def UUIDString(self):
        return "5f0c3a4e-0000-4000-8000-000000000001"

    def refresh(self, _flags):
        pass  # libvirt's own refresh is not ended by ours

    def listVolumes(self):
        if self.lag > 0:
            self.lag -= 1
            return []
        return sorted(self.volumes)

    def createXML(self, xml, _flags):  # noqa: N802
        name = created_name(xml, self.volumes)
        self.volumes.add(name)
        return MadeVolume(self, name)


class FakeVolume:
    def info(self):
        return [0, 1, 0]

    def XMLDesc(self, _flags):
        return ("<volume><name>admission.lock</name><capacity>1</capacity><allocation>0</allocation><target>"
                "<path>/x</path><format type='raw'/><timestamps><mtime>%f</mtime></timestamps></target></volume>"
                % time.time())


def test_a_dead_runs_lock_hidden_by_a_refresh_is_still_cleared(monkeypatch):
    dead = "%s%s.999999.123.1" % (keys.ADMISSION_HOLDER_PREFIX, locks.Identity().controller)
    assert locks.Identity().is_dead(dead, keys.ADMISSION_HOLDER_PREFIX) is True
    pool = LaggingRegistry(["pool.1.json", keys.ADMISSION_LOCK, dead], lag=2)
    monkeypatch.setattr(documents.lv, "lookup_volume", lambda p, name: FakeVolume() if p.lag == 0 and name in p.volumes
                        else None)
    monkeypatch.setattr(documents.storage, "delete_volume", lambda p, name, **_kw: p.volumes.discard(name))
    monkeypatch.setattr(volumes.time, "sleep", lambda _seconds: None)
    locks.VolumeLock(None, pool).clear_abandoned()
    assert pool.volumes == {"pool.1.json"}


def test_a_superseded_generation_hidden_by_a_refresh_is_still_pruned(monkeypatch):
    """Right after the upload of a new generation, libvirt's refresh can hide the old one from a lookup: the
    prune looks again instead of leaving two registrations behind."""
    pool = LaggingRegistry(["pool.1.json", "pool.2.json"], lag=2)
    monkeypatch.setattr(documents.lv, "lookup_volume", lambda p, name: FakeVolume() if p.lag == 0 and name in p.volumes
                        else None)

    def delete_volume(p, name, keep_if_busy=False):
        if documents.lv.lookup_volume(p, name) is None:
            p.listVolumes()  # time passes in the window
            return False
        p.volumes.discard(name)
        return True
    pruned(monkeypatch, pool, delete_volume)
    assert pool.volumes == {"pool.2.json"}


def pruned(monkeypatch, pool, delete_volume):
    """Prune pool.1.json of ``pool`` with libvirt's volume delete played by ``delete_volume``, the waits skipped."""
    monkeypatch.setattr(documents.storage, "delete_volume", delete_volume)
    monkeypatch.setattr(volumes.time, "sleep", lambda _seconds: None)
    documents.Registry(None, pool)._prune("pool.1.json")


class CountingPool:
    """A storage pool that makes volumes and counts the lookups by name."""

    def __init__(self):
        self.volumes = {}
        self.lookups = 0
        self.listings = 0

    def name(self):
        return "machinery"

    def listVolumes(self):  # noqa: N802
        self.listings += 1
        return sorted(self.volumes)

    def createXML(self, xml, _flags):  # noqa: N802
        name = created_name(xml, self.volumes)
        self.volumes[name] = MadeVolume(self, name)
        return self.volumes[name]

    def storageVolLookupByName(self, name):  # noqa: N802
        self.lookups += 1
        if name not in self.volumes:
            error = libvirt.libvirtError("no volume")
            error.err = (libvirt.VIR_ERR_NO_STORAGE_VOL,) + (None,) * 8
            raise error
        return self.volumes[name]


class MadeVolume:
    def __init__(self, pool, name):
        self.pool, self.name = pool, name

    def delete(self, _flags):
        if isinstance(self.pool.volumes, set):
            self.pool.volumes.discard(self.name)
        else:
            del self.pool.volumes[self.name]


def test_a_hold_is_taken_with_three_creates_and_a_listing_and_given_back_with_another():
    """A hold is a lease: taken afresh, it creates its marker, the lock's anchor and its generation, and lists
    the pool once (no later generation); checked, it lists once; given back, it deletes them by the handles their
    creates gave, and lists once more (no run took it over). Nothing is looked up by name."""
    pool = CountingPool()
    registry = documents.Registry(None, pool)
    with holds.machine_hold(None, "web-1", 5, registry=registry) as hold:  # no storage pool lookup: no conn needed
        assert sorted(pool.volumes) == sorted(["hold-web-1.lock", "hold-web-1.lock.2", hold.marker])
        assert pool.lookups == 0 and pool.listings == 1
        assert hold.still_held() and pool.listings == 2
    assert pool.volumes == {} and pool.lookups == 0 and pool.listings == 3


def test_a_superseded_generation_a_killed_reader_still_holds_is_pruned_once_released(monkeypatch):
    """A run killed while it downloaded the old generation leaves its stream open in libvirtd until the daemon sees
    the connection close: the volume is busy for a moment, and the prune waits for it instead of leaving it."""
    pool = LaggingRegistry(["pool.1.json", "pool.2.json"], lag=0)
    monkeypatch.setattr(documents.lv, "lookup_volume", lambda p, name: FakeVolume() if name in p.volumes else None)
    delete_volume, busy = busy_for(3)  # the daemon notices the dead connection after three tries
    pruned(monkeypatch, pool, delete_volume)
    assert pool.volumes == {"pool.2.json"} and busy == [0]


def busy_for(tries):
    """libvirt's volume delete, played for a volume a download stream keeps busy for ``tries`` attempts; and the
    attempts left."""
    busy = [tries]

    def delete_volume(p, name, keep_if_busy=False):
        assert keep_if_busy
        if busy[0]:
            busy[0] -= 1
            return False
        p.volumes.discard(name)
        return True
    return delete_volume, busy


def test_a_generation_busy_past_the_wait_is_left_to_the_next_put(monkeypatch):
    pool = LaggingRegistry(["pool.1.json", "pool.2.json"], lag=0)
    monkeypatch.setattr(documents.lv, "lookup_volume", lambda p, name: FakeVolume() if name in p.volumes else None)
    monkeypatch.setattr(documents.storage, "delete_volume", lambda _p, _name, keep_if_busy=False: False)
    monkeypatch.setattr(volumes, "PRUNE_RETRY_SECONDS", 0.05)
    documents.Registry(None, pool)._prune("pool.1.json")  # no failure: the next put prunes it
    assert pool.volumes == {"pool.1.json", "pool.2.json"}


def test_a_journal_another_run_is_reading_is_deleted_once_read(monkeypatch):
    """A concurrent run's download keeps the journal busy for a moment: the delete waits for it instead of failing
    the run and leaving the journal behind."""
    pool = LaggingRegistry(["pending-race-3.1.json"], lag=0)
    monkeypatch.setattr(documents.lv, "lookup_volume", lambda p, name: FakeVolume() if name in p.volumes else None)
    monkeypatch.setattr(volumes.time, "sleep", lambda _seconds: None)
    delete_volume, busy = busy_for(3)
    monkeypatch.setattr(documents.storage, "delete_volume", delete_volume)
    volumes.delete_when_read(pool, "pending-race-3.1.json")
    assert pool.volumes == set() and busy == [0]


def test_a_journal_busy_past_the_wait_fails_naming_it(monkeypatch):
    pool = LaggingRegistry(["pending-race-3.1.json"], lag=0)
    monkeypatch.setattr(documents.lv, "lookup_volume", lambda p, name: FakeVolume() if name in p.volumes else None)
    monkeypatch.setattr(volumes.time, "sleep", lambda _seconds: None)

    def delete_volume(_p, name, keep_if_busy=False):
        if keep_if_busy:
            return False
        raise documents.LibvirtFailure("cannot delete volume %s: busy" % name)
    monkeypatch.setattr(documents.storage, "delete_volume", delete_volume)
    with pytest.raises(documents.LibvirtFailure, match="pending-race-3.1.json"):
        volumes.delete_when_read(pool, "pending-race-3.1.json", seconds=0)
    assert pool.volumes == {"pending-race-3.1.json"}


class WrittenRegistry:
    """A registry pool whose volumes hold bytes: a download returns them, delete removes them."""

    def __init__(self, volumes):
        self.volumes = dict(volumes)

    def listVolumes(self):  # noqa: N802
        return sorted(self.volumes)

    def refresh(self, _flags):
        pass


def test_a_newer_generation_a_killed_writer_left_unreadable_is_superseded_and_pruned(monkeypatch):
    """A writer of an older version created pool.2.json and was killed before its upload ended: readers take
    pool.1.json, the registry names pool.2.json as superseded, and its prune deletes it and keeps pool.1.json."""
    good = documents.encode(keys.POOL_KEY, 1, {"name": "hv1"})
    pool = WrittenRegistry({"pool.1.json": good, "pool.2.json": b"\0" * len(good)})
    monkeypatch.setattr(documents.lv, "lookup_volume", lambda p, name: name if name in p.volumes else None)
    monkeypatch.setattr(documents.storage, "download_bytes", lambda _conn, name, limit=None: pool.volumes[name])
    monkeypatch.setattr(documents.storage, "delete_volume",
                        lambda p, name, keep_if_busy=False: p.volumes.pop(name, None) is not None)
    monkeypatch.setattr(locks, "held", lambda _conn, _pool, _locked, _identity: contextlib.nullcontext())
    registry = documents.Registry(None, pool)
    assert registry.get(keys.POOL_KEY) == {"name": "hv1"}
    assert registry.superseded(keys.POOL_KEY) == ["pool.2.json"]
    assert registry.prune_superseded(keys.POOL_KEY) == ["pool.2.json"]
    assert sorted(pool.volumes) == ["pool.1.json"] and registry.superseded(keys.POOL_KEY) == []
    assert registry.get(keys.POOL_KEY) == {"name": "hv1"}


def test_after_its_own_put_the_registry_names_no_generation_superseded():
    pool = pw.Documents({"pool.1.json": documents.encode(keys.POOL_KEY, 1, {"name": "hv1"})})
    registry = documents.Registry(None, pool, store=pool)
    assert registry.get(keys.POOL_KEY) == {"name": "hv1"}
    registry.put(keys.POOL_KEY, {"name": "hv1", "labels": {"zone": "a"}})
    assert sorted(pool.volumes) == ["pool.2.json"] and registry.superseded(keys.POOL_KEY) == []


def test_a_dead_runs_marker_beside_a_live_hold_is_cleared_and_the_hold_kept(monkeypatch):
    """A run killed between naming itself and taking the lock leaves its marker; a later run then holds the
    machine with its own. Clearing dead holds removes the dead marker alone: the live holder keeps its lock and
    its marker, and a marker of another controller (liveness unknown) is left."""
    identity = locks.Identity()
    prefix = keys.hold_prefix("vm-1")
    alive = identity.marker(prefix, 2)
    dead = "%s%s.%d.%s.1" % (prefix, identity.controller, 2 ** 22 + 7, "1")  # no such pid on this controller
    other = "%sothercontroller.42.1.1" % prefix
    pool = HidingPool([keys.hold_volume("vm-1"), alive, dead, other], hidden=[])
    monkeypatch.setattr(volumes.storage, "delete_volume", lambda _pool, name, **_kw: pool.deleted.append(name) or True)
    holds.clear_dead_holds(None, pool, pool.listVolumes(), identity)
    assert pool.deleted == [dead]


class BusyPool(CountingListings):
    """A HidingPool whose refresh libvirt refuses while other runs' uploads run, for ``busy`` seconds of the
    clock given."""

    def __init__(self, volumes, hidden, clock, busy):
        super().__init__(volumes, hidden)
        self.clock, self.busy = clock, busy

    def refresh(self, flags):
        if self.clock[0] < self.busy:
            error = libvirt.libvirtError("pool 'machinery-registry' has asynchronous jobs running.")
            error.err = (libvirt.VIR_ERR_INTERNAL_ERROR,) + (None,) * 8
            raise error
        super().refresh(flags)


def fake_clock(monkeypatch):
    clock = [0.0]
    monkeypatch.setattr(volumes.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(volumes.time, "sleep", lambda seconds: clock.__setitem__(0, clock[0] + seconds))
    monkeypatch.setattr(documents.Registry, "_read", lambda self, key, relisted=False: (
        {"name": "small"} if keys.class_key("small") in self._generations() else None))
    return clock


def test_a_class_is_not_taken_for_absent_while_other_runs_keep_the_registry_busy(monkeypatch):
    """The CI registry race (3 of 632 reads missed the class under load 7): a short listing whose absence could
    not be confirmed for 2 s, libvirt refusing every refresh while other runs uploaded, was taken for absent. A
    registered pool's document is now asked for longer, and found once a refresh goes through."""
    clock = fake_clock(monkeypatch)
    pool = BusyPool(["pool.1.json", "class-small.1.json"], ["class-small.1.json"], clock, busy=5.0)
    assert published_class(documents.Registry(None, pool), "small") == {"name": "small"}
    assert 5.0 <= clock[0] < 5.0 + 1.0


def test_an_unregistered_pool_still_answers_absent_after_the_short_wait(monkeypatch):
    clock = fake_clock(monkeypatch)
    pool = BusyPool(["class-small.1.json"], ["class-small.1.json"], clock, busy=60.0)
    assert published_class(documents.Registry(None, pool), "small") is None
    assert clock[0] < volumes.EXPECTED_RETRY_SECONDS + 1.0


def test_a_write_does_not_start_a_key_again_while_its_absence_cannot_be_confirmed(monkeypatch):
    """The same for a put: its listing must show the key's newest generation, or the write would start it at 1."""
    clock = fake_clock(monkeypatch)
    pool = BusyPool(["pool.1.json", "class-small.3.json"], ["class-small.3.json"], clock, busy=5.0)
    assert documents.Registry(None, pool)._complete_listing("class-small")["class-small"] == [
        (3, "class-small.3.json")]
    assert clock[0] >= 5.0

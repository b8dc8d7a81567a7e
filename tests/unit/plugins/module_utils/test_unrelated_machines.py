"""A run never fails because of a machine that is not its own: a domain undefined between the listing and the read
is not there, and a pool busy building another run's volume is rescanned again for a bounded time."""

import libvirt
import pytest

from ansible_collections.machinery.compute.plugins.module_utils.core import domain as dx
from ansible_collections.machinery.compute.plugins.module_utils.core.errors import LibvirtFailure
from ansible_collections.machinery.compute.plugins.module_utils.core import storage

XML = "<domain type='qemu'><name>%s</name><devices/></domain>"


def libvirt_error(code, message):
    exc = libvirt.libvirtError(message)
    exc.err = (code, 0, message, 0, "", None, None, 0, 0)
    return exc


class Dom:
    def __init__(self, name, gone=False, failure=None):
        self._name = name
        self.gone = gone
        self.failure = failure

    def name(self):
        return self._name

    def XMLDesc(self, _flags):
        if self.failure is not None:
            raise self.failure
        if self.gone:
            raise libvirt_error(libvirt.VIR_ERR_NO_DOMAIN, "Domain not found: no domain with matching name")
        return XML % self._name


class Conn:
    def __init__(self, doms):
        self.doms = doms

    def listAllDomains(self, _flags):
        return list(self.doms)


def test_a_domain_undefined_after_the_listing_is_skipped():
    conn = Conn([Dom("a"), Dom("b", gone=True), Dom("c")])
    assert [dom.name() for dom, tree in dx.defined_domains(conn)] == ["a", "c"]


def test_any_other_failure_of_the_read_still_fails():
    conn = Conn([Dom("a", failure=libvirt_error(libvirt.VIR_ERR_INTERNAL_ERROR, "boom"))])
    with pytest.raises(libvirt.libvirtError):
        list(dx.defined_domains(conn))


class Pool:
    def __init__(self, busy_for):
        self.busy_for = busy_for
        self.calls = 0

    def name(self):
        return "machinery"

    def refresh(self, _flags):
        self.calls += 1
        if self.calls <= self.busy_for:
            raise libvirt_error(libvirt.VIR_ERR_INTERNAL_ERROR, "pool 'machinery' has asynchronous jobs running.")


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now

    def pause(self, seconds):
        self.now += seconds


def test_a_busy_pool_is_rescanned_until_it_is_free():
    pool, clock = Pool(busy_for=30), Clock()
    assert storage.refresh(pool, 10, clock, clock.pause) is pool and pool.calls == 31


def test_a_pool_busy_for_longer_than_the_bound_fails_naming_it():
    pool, clock = Pool(busy_for=10 ** 6), Clock()
    with pytest.raises(LibvirtFailure, match="cannot rescan storage pool machinery"):
        storage.refresh(pool, 5, clock, clock.pause)
    assert 40 < pool.calls < 60  # tried for the 5 s it was given, then gave up


def test_another_refusal_fails_at_once():
    class Broken(Pool):
        def refresh(self, _flags):
            self.calls += 1
            raise libvirt_error(libvirt.VIR_ERR_OPERATION_INVALID, "storage pool 'machinery' is not active")
    pool = Broken(0)
    with pytest.raises(LibvirtFailure):
        storage.refresh(pool, 5, Clock(), Clock().pause)
    assert pool.calls == 1

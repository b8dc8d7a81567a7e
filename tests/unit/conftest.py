# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the unit tests share: libvirt objects that answer from plain values, and the observations the planners
read (pool snapshots for the scheduler, what a pool registration sees), built by hand.

Test files import these by name (``from conftest import FakeDomain``); each file passes its own defaults.
"""

from __future__ import annotations

import libvirt
import pytest

from ansible_collections.machinery.compute.plugins.module_utils.core.errors import ValidationError

GIB = 2 ** 30
READY = {"active": True, "autostart": True}


@pytest.fixture(autouse=True)
def no_registry(monkeypatch):
    """No unit test reaches an OCI registry: a request to one is refused as an unreachable registry. A test
    that needs a registry's answers gives them with its own oci.resolve."""
    from ansible_collections.machinery.compute.plugins.module_utils.core.errors import MachineryError
    from ansible_collections.machinery.compute.plugins.module_utils.machines import oci

    def unreachable(self, path, accept=None):
        raise MachineryError("cannot reach %s: unit tests reach no registry" % self.base, self.field)
    monkeypatch.setattr(oci.Registry, "open", unreachable)


def refused(expected, function, *args, **kwargs):
    """``function(*args, **kwargs)`` refuses its input naming the field ``expected``; its message."""
    with pytest.raises(ValidationError) as info:
        function(*args, **kwargs)
    assert info.value.field == expected, info.value
    return info.value.message


class FakeDomain:
    """A libvirt domain with a name, an XML description and a state; it counts the reads of its XML."""

    def __init__(self, name="m", xml="<domain/>", state=libvirt.VIR_DOMAIN_SHUTOFF):
        self._name = name
        self.xml = xml
        self.state_value = state
        self.reads = 0

    def name(self):
        return self._name

    def UUIDString(self):  # noqa: N802 (libvirt's name)
        return "uuid-" + self._name

    def XMLDesc(self, _flags=0):  # noqa: N802
        self.reads += 1
        return self.xml

    def state(self):
        return [self.state_value, 0]

    def isActive(self):  # noqa: N802
        return self.state_value == libvirt.VIR_DOMAIN_RUNNING

    def autostart(self):
        return False

    def hasManagedSaveImage(self, _flags=0):  # noqa: N802
        return False


def pool_snapshot(name, uri, cpu=8, memory=16 * GIB, used_cpu=0, used_memory=0, classes=None, labels=None,
                  taints=None, state="Ready", machines=()):
    """A pool as the scheduler sees it (memory in bytes); ``classes`` None: class small (1 cpu, 1 GiB) only."""
    return {"name": name, "uri": uri, "state": state, "labels": labels or {}, "taints": taints or [],
            "classes": {"small": {"cpu": 1, "memory": GIB}} if classes is None else classes,
            "allocatable": {"cpu": cpu, "memory": memory}, "allocated": {"cpu": used_cpu, "memory": used_memory},
            "machines": list(machines)}


def pool_seen(registration=None, storage="ready", networks=None, machines=(), host_networks=None):
    """What a pool registration observes on a host of 8 cpus and 16 GiB: its storage pools ``storage`` (ready,
    None when missing, or a state), its registry documents (the pool's when registered) and networks."""
    storage = dict(READY) if storage == "ready" else storage
    return {"registration": registration, "documents": ["pool"] if registration else [],
            "storage_pools": {"machinery-registry": storage, "machinery": storage},
            "networks": networks or {}, "host_networks": host_networks or {},
            "capacity": {"cpu": 8, "memory": 16 * GIB}, "machines": list(machines)}

# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A pool as the machine code sees it: one connection, its registration, its storage and its networks."""

from __future__ import annotations

from ansible_collections.machinery.compute.plugins.module_utils import connection as lv
from ansible_collections.machinery.compute.plugins.module_utils import registry as reg
from ansible_collections.machinery.compute.plugins.module_utils import storage
from ansible_collections.machinery.compute.plugins.module_utils.errors import NotFoundError


class PoolContext:
    """What one run needs from a pool host, each piece fetched at most once."""

    def __init__(self, conn, uri):
        self.conn = conn
        self.uri = uri
        self._registry = None
        self._registration = None
        self._storage = None
        self._storage_path = None
        self._networks = {}
        self.url_opener = None  # set by the Ansible side: how to fetch images given by URL
        self.peer_connections = {}  # uri -> open connection of other pools, shared by a batch run

    def reset(self):
        """Forget what was read from the registry, so the next read is fresh."""
        self._registry = None
        self._registration = None

    def prime(self):
        """Fetch the lazily read pieces now, before several threads share this context."""
        if self.registration:
            self.registry.machine_classes()
            self.storage_file("")  # resolves the storage path once
        return self

    @property
    def registry(self):
        if self._registry is None:
            self._registry = reg.Registry.open(self.conn)
        return self._registry

    @property
    def registration(self):
        """pool.json, or None when machine_pool never registered this host."""
        if self._registration is None:
            self._registration = self.registry.pool_registration() or {}
        return self._registration or None

    @property
    def name(self):
        registration = self.registration
        return registration["name"] if registration else None

    def require_registration(self):
        if not self.registration:
            raise NotFoundError("%s is not a registered pool: run machinery.compute.machine_pool against it first"
                                % self.uri, "uri")
        return self.registration

    @property
    def storage(self):
        if self._storage is None:
            self._storage = lv.lookup_storage_pool(self.conn, reg.STORAGE_POOL)
            if self._storage is None:
                raise NotFoundError("%s has no storage pool %r: run machinery.compute.machine_pool against it "
                                    "first" % (self.uri, reg.STORAGE_POOL), "uri")
            if not self._storage.isActive():
                self._storage.create(0)
        return self._storage

    @property
    def storage_path(self):
        if self._storage_path is None:
            self._storage_path = storage.pool_path(self.storage)
        return self._storage_path

    def storage_file(self, volume_name):
        return "%s/%s" % (self.storage_path.rstrip("/"), volume_name)

    def network(self, name):
        """The libvirt network ``name`` (cached), or None."""
        if name not in self._networks:
            self._networks[name] = lv.lookup_network(self.conn, name)
        return self._networks[name]

    def virt_type(self):
        """kvm or qemu as the pool's registration measured it (a KVM that really ran a guest)."""
        return (self.registration or {}).get("virt_type") or "qemu"

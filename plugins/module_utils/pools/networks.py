# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A libvirt network of one pool, named and addressed by a manifest (KupenStack's Network and VirtualNetwork):
its subnet, gateway, DHCP range (or no DHCP) and MTU, converged through observe -> plan -> apply.

An existing network of that name whose addressing differs is refused rather than redefined: machines of the pool
may be on it, and a new subnet under them would cut them off.
"""

from __future__ import annotations

from ansible_collections.machinery.compute.plugins.module_utils.core import connection as lv
from ansible_collections.machinery.compute.plugins.module_utils.core import elements
from ansible_collections.machinery.compute.plugins.module_utils.core.convergence import Action, Plan, Resource, step
from ansible_collections.machinery.compute.plugins.module_utils.core.errors import ConflictError
from ansible_collections.machinery.compute.plugins.module_utils.pools.pool_registration import (
    check_host_overlaps, host_network_cidrs)
from ansible_collections.machinery.compute.plugins.module_utils.coordination import writer

COMPARED = ("cidr", "gateway", "dhcp_start", "dhcp_end", "mtu")


def desired(params):
    """The owned fields of the network ``params`` ({name, cidr, gateway?, dhcp, dhcp_start?, dhcp_end?, mtu?})
    describes, as read_network reports them."""
    import ipaddress
    net = ipaddress.IPv4Network(params["cidr"])
    hosts = list(net.hosts())
    gateway = params.get("gateway") or str(hosts[0])
    start = params.get("dhcp_start") or str(hosts[min(9, len(hosts) - 2)])
    end = params.get("dhcp_end") or str(hosts[-1])
    dhcp = params.get("dhcp", True)
    return {"name": params["name"], "cidr": str(net), "gateway": gateway, "dhcp_start": start if dhcp else None,
            "dhcp_end": end if dhcp else None, "mtu": params.get("mtu") or None}


def users(conn, name):
    """The domains with a NIC on network ``name``."""
    found = []
    for dom in conn.listAllDomains(0):
        tree = elements.parse(dom.XMLDesc(lv.libvirt.VIR_DOMAIN_XML_INACTIVE))
        if any(source.get("network") == name for source in tree.findall("devices/interface/source")):
            found.append(dom.name())
    return sorted(found)


def plan_network(params, current, others, using=()):
    """Create, keep, or delete: pure, from the parameters, the network as read (or None), the host's other
    networks ({name: cidr}) and the domains using it."""
    name = params["name"]
    if params.get("state") == "absent":
        if current is None:
            return Plan()
        if using:
            raise ConflictError("network %s is used by %s; they keep it" % (name, ", ".join(using)), "state")
        return Plan([Action("delete", name, {key: current.get(key) for key in COMPARED}, None,
                            [step("destroy_network", name), step("undefine_network", name)])])
    want = desired(params)
    if current is None:
        check_host_overlaps([{"name": name, "cidr": want["cidr"]}], others)
        return Plan([Action("create", name, None, {key: want[key] for key in COMPARED},
                            [step("define_network", name), step("start_network", name)], body=want)])
    differ = [key for key in COMPARED if (current.get(key) or None) != (want[key] or None)]
    if differ:
        shown = ", ".join("%s %s (wanted %s)" % (key, current.get(key), want[key]) for key in differ)
        raise ConflictError("network %s exists with %s; it is not redefined under the machines that may use it "
                            "(delete it first)" % (name, shown), differ[0])
    return Plan()


class NetworkResource(Resource):
    def __init__(self, ctx, params):
        self.ctx = ctx
        self.params = params
        self.name = params["name"]

    def describe(self):
        return "network %s on pool %s" % (self.name, self.ctx.name or self.ctx.uri)

    def holds(self, plan, observed):
        """None: a network of the pool changes no machine."""
        return ()

    def observe(self):
        found = None
        try:
            net = self.ctx.conn.networkLookupByName(self.name)
            tree = elements.parse(net.XMLDesc(0))
            found = elements.read_network(tree)
            mtu = tree.find("mtu")
            found["mtu"] = int(mtu.get("size")) if mtu is not None and mtu.get("size") else None
        except lv.libvirt.libvirtError:
            net = None
        others = {} if found else host_network_cidrs(self.ctx.conn)
        using = users(self.ctx.conn, self.name) if found and self.params.get("state") == "absent" else []
        return found, others, using

    def plan(self, observed):
        return plan_network(self.params, *observed)

    def _create(self, action, _observed):
        want = action.data["body"]
        node = elements.network(self.name, want["cidr"], "nat", gateway=want["gateway"],
                                dhcp_range=(want["dhcp_start"], want["dhcp_end"]) if want["dhcp_start"] else None,
                                dhcp=bool(want["dhcp_start"]), mtu=want["mtu"])
        try:
            net = writer.write(self.ctx.conn, "networkDefineXML", elements.to_string(node))
        except lv.libvirt.libvirtError as exc:
            raise ConflictError("cannot create network %s: %s" % (self.name, lv.describe(exc)), "cidr") from None
        try:
            lv.start_or_undefine(net, net.create, lambda: writer.write(net, "setAutostart", 1))
        except lv.libvirt.libvirtError as exc:
            raise ConflictError("cannot start network %s (%s): %s" % (self.name, want["cidr"], lv.describe(exc)),
                                "cidr") from None

    def _delete(self, _action, _observed):
        net = self.ctx.conn.networkLookupByName(self.name)
        if net.isActive():
            writer.write(net, "destroy")
        writer.write(net, "undefine")

    APPLY = {"create": _create, "delete": _delete}

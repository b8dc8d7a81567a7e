# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Security groups: named sets of allow rules kept as libvirt nwfilters on a pool, and the filters that guard
the NICs using them. Converged through observe -> plan -> apply (see convergence.py).

Layout on the pool:
- a group ``web`` is the nwfilter ``machinery-sg-web``: one ``accept`` rule per allow rule (ingress rules in
  direction ``in``, egress rules in direction ``out``), plus, when the group has no egress rule, an accept of all
  egress, as a new cloud security group has;
- a NIC with groups is guarded by a filter of its own, ``machinery-nic-<machine>.<nic>``, that includes every
  group of the NIC and ends with the defaults: DHCP passes, every other inbound and outbound packet is dropped.
  Rules are ordered by priority across included filters (accepts 500 and 600, the drops 1000), so the groups
  of a NIC add up, and what none of them allows is dropped;
- the rules are stateful: libvirt matches the connection state of iptables-level rules by default, so a rule
  that lets a connection in also lets its replies out (and an egress rule lets the replies in).

Every rule of these filters carries a comment starting with ``machinery.compute``: a filter without it is not
the collection's and is never changed or deleted.
"""

from __future__ import annotations

import ipaddress

from ansible_collections.machinery.compute.plugins.module_utils.core import connection as lv
from ansible_collections.machinery.compute.plugins.module_utils.core import domain as dx
from ansible_collections.machinery.compute.plugins.module_utils.core import elements
from ansible_collections.machinery.compute.plugins.module_utils.core import validation as check
from ansible_collections.machinery.compute.plugins.module_utils.core.convergence import Action, Plan, Resource, step
from ansible_collections.machinery.compute.plugins.module_utils.core.errors import (
    ConflictError, LibvirtFailure, NotFoundError, ValidationError)
from ansible_collections.machinery.compute.plugins.module_utils.coordination import writer

GROUP_PREFIX = "machinery-sg-"
NIC_PREFIX = "machinery-nic-"
MARKER = "machinery.compute"
DIRECTIONS = ("ingress", "egress")
PROTOCOLS = ("tcp", "udp", "icmp", "all")
ANYWHERE = "0.0.0.0/0"
RULE_PRIORITY = 500
DEFAULT_EGRESS_PRIORITY = 600
DHCP_PRIORITY = 100
DROP_PRIORITY = 1000


def group_filter(name):
    return GROUP_PREFIX + name


def nic_filter(machine, nic):
    """The filter of one NIC; '.' cannot occur in either name, so the pair is unambiguous."""
    return "%s%s.%s" % (NIC_PREFIX, machine, nic)


def _comment(what):
    return "%s %s" % (MARKER, what)


# --- rules (pure) -----------------------------------------------------------------------------------------------

def _port(value, field):
    if value is None:
        return None
    return check.whole_number(value, field, 1, 65535)


def _cidr(value, field):
    try:
        return str(ipaddress.IPv4Network(str(value), strict=True))
    except ValueError as exc:
        raise ValidationError("%r is not an IPv4 network in CIDR notation (%s)" % (value, exc), field) from None


def normalize_rule(rule, field):
    if not isinstance(rule, dict):
        raise ValidationError("must be a mapping with direction, protocol, port, port_end, remote_cidr", field)
    unknown = sorted(set(rule) - {"direction", "protocol", "port", "port_end", "remote_cidr"})
    if unknown:
        raise ValidationError("unknown key %s" % ", ".join(unknown), field)
    direction = check.one_of(rule.get("direction") or "ingress", DIRECTIONS, field + ".direction")
    protocol = check.one_of(rule.get("protocol") or "tcp", PROTOCOLS, field + ".protocol")
    port = _port(rule.get("port"), field + ".port")
    port_end = _port(rule.get("port_end"), field + ".port_end")
    if protocol in ("icmp", "all") and (port is not None or port_end is not None):
        raise ValidationError("protocol %s has no ports; give port only with tcp or udp" % protocol,
                              field + (".port" if port is not None else ".port_end"))
    if port_end is not None and port is None:
        raise ValidationError("needs port (the first port of the range)", field + ".port_end")
    if port_end is not None and port_end < port:
        raise ValidationError("must not be below port %d" % port, field + ".port_end")
    if port_end == port:
        port_end = None
    cidr = _cidr(rule.get("remote_cidr") or ANYWHERE, field + ".remote_cidr")
    return {"direction": direction, "protocol": protocol, "port": port, "port_end": port_end,
            "remote_cidr": cidr}


def _order(rule):
    return (rule["direction"], rule["protocol"], rule["port"] or 0, rule["port_end"] or 0, rule["remote_cidr"])


def normalize_rules(rules, field="rules"):
    """The rules validated, each named by its index, without duplicates, in a canonical order (the order of
    allow rules does not matter)."""
    if rules is None:
        return []
    if not isinstance(rules, list):
        raise ValidationError("must be a list of rules", field)
    result = []
    for index, rule in enumerate(rules):
        normalized = normalize_rule(rule, "%s[%d]" % (field, index))
        if normalized not in result:
            result.append(normalized)
    return sorted(result, key=_order)


def rule_element(rule, comment):
    """One allow rule as an nwfilter rule: the remote side is the source of ingress packets and the destination
    of egress ones; the port is the destination port either way (the guest's for ingress, the peer's for
    egress)."""
    ingress = rule["direction"] == "ingress"
    match = {}
    network = ipaddress.IPv4Network(rule["remote_cidr"])
    if network.prefixlen:
        side = "src" if ingress else "dst"
        match[side + "ipaddr"] = str(network.network_address)
        match[side + "ipmask"] = str(network.prefixlen)
    if rule["port"] is not None:
        match["dstportstart"] = str(rule["port"])
        if rule["port_end"] is not None:
            match["dstportend"] = str(rule["port_end"])
    match["comment"] = comment
    return {"action": "accept", "direction": "in" if ingress else "out", "priority": RULE_PRIORITY,
            "protocol": rule["protocol"], "match": match}


def read_rule(entry):
    """The allow rule an nwfilter rule of a group holds (the inverse of rule_element)."""
    match = entry["match"]
    ingress = entry["direction"] == "in"
    side = "src" if ingress else "dst"
    cidr = ANYWHERE
    if match.get(side + "ipaddr"):
        cidr = str(ipaddress.IPv4Network("%s/%s" % (match[side + "ipaddr"], match.get(side + "ipmask", "32")),
                                         strict=False))
    port = int(match["dstportstart"]) if match.get("dstportstart") else None
    port_end = int(match["dstportend"]) if match.get("dstportend") else None
    return {"direction": "ingress" if ingress else "egress", "protocol": entry["protocol"], "port": port,
            "port_end": None if port_end == port else port_end, "remote_cidr": cidr}


def group_rules(name, rules):
    """The nwfilter rules of group ``name``: its allow rules, and all egress when it has no egress rule."""
    comment = _comment("security group %s" % name)
    result = [rule_element(rule, comment) for rule in rules]
    if not any(rule["direction"] == "egress" for rule in rules):
        default = _comment("security group %s: egress allowed (no egress rules)" % name)
        for protocol in ("all", "all-ipv6"):
            result.append({"action": "accept", "direction": "out", "priority": DEFAULT_EGRESS_PRIORITY,
                           "protocol": protocol, "match": {"comment": default}})
    return result


def nic_rules(machine, nic):
    """What a NIC with groups always has: DHCP passes (no connection state: the server answers a broadcast),
    everything its groups do not accept is dropped."""
    comment = _comment("network interface %s/%s" % (machine, nic))
    rules = [
        {"action": "accept", "direction": "out", "priority": DHCP_PRIORITY, "statematch": "false",
         "protocol": "udp", "match": {"srcportstart": "68", "dstportstart": "67", "comment": comment}},
        {"action": "accept", "direction": "in", "priority": DHCP_PRIORITY, "statematch": "false",
         "protocol": "udp", "match": {"srcportstart": "67", "dstportstart": "68", "comment": comment}}]
    for direction in ("in", "out"):
        for protocol in ("all", "all-ipv6"):
            rules.append({"action": "drop", "direction": direction, "priority": DROP_PRIORITY,
                          "protocol": protocol, "match": {"comment": comment}})
    return rules


def is_ours(parsed):
    """A filter is the collection's when it has rules and every one carries the marker comment."""
    return bool(parsed["rules"]) and all((rule["match"].get("comment") or "").startswith(MARKER)
                                         for rule in parsed["rules"])


def shown(name, rules, users=()):
    return {"name": name, "filter": group_filter(name), "rules": list(rules), "network_interfaces": list(users)}


# --- reading the pool -------------------------------------------------------------------------------------------

def lookup_filter(conn, name):
    """The parsed nwfilter ``name`` (see elements.read_nwfilter), or None."""
    try:
        found = conn.nwfilterLookupByName(name)
    except lv.libvirt.libvirtError as exc:
        if exc.get_error_code() == lv.libvirt.VIR_ERR_NO_NWFILTER:
            return None
        raise
    return elements.read_nwfilter(elements.parse(found.XMLDesc(0)))


def read_group(conn, name, field="name"):
    """(the group's rules, its filter's uuid), or None when there is no such group; a filter of that name the
    collection did not write is refused."""
    parsed = lookup_filter(conn, group_filter(name))
    if parsed is None:
        return None
    if not is_ours(parsed):
        raise ConflictError("nwfilter %s exists on this pool but was not written by machinery.compute; it is "
                            "left alone" % group_filter(name), field)
    comment = _comment("security group %s" % name)
    rules = [read_rule(rule) for rule in parsed["rules"] if rule["match"].get("comment") == comment]
    return sorted(rules, key=_order), parsed["uuid"]


def check_group_names(conn, names, field):
    """The security groups of a NIC: DNS labels of groups that exist on the pool, sorted, once each."""
    if names is None:
        return None
    if not isinstance(names, list):
        raise ValidationError("must be a list of security group names", field)
    result = []
    for index, name in enumerate(names):
        where = "%s[%d]" % (field, index)
        check.dns_label(name, where)
        if read_group(conn, name, where) is None:
            raise NotFoundError("no security group %r on this pool (create it with "
                                "machinery.compute.security_group)" % name, where)
        if name not in result:
            result.append(name)
    return sorted(result)


def nic_groups(conn, interface):
    """The groups guarding one NIC (as elements.read_interface reads it): none when it has no filter of ours."""
    name = interface.get("filterref") or ""
    if not name.startswith(NIC_PREFIX):
        return []
    parsed = lookup_filter(conn, name)
    if parsed is None:
        return []
    return sorted(ref[len(GROUP_PREFIX):] for ref in parsed["filterrefs"] if ref.startswith(GROUP_PREFIX))


def users_of(conn, name):
    """['machine/nic'] of every NIC on the pool that group ``name`` guards, and their filters."""
    users = []
    wanted = group_filter(name)
    for dom, tree in dx.defined_domains(conn):
        for interface in elements.read_interfaces(tree):
            filter_name = interface.get("filterref") or ""
            if not filter_name.startswith(NIC_PREFIX):
                continue
            parsed = lookup_filter(conn, filter_name)
            if parsed is not None and wanted in parsed["filterrefs"]:
                nic = (interface.get("alias") or "").replace("ua-nic-", "", 1) or interface.get("mac")
                users.append(("%s/%s" % (dom.name(), nic), filter_name))
    return sorted(users)


# --- writing the pool -------------------------------------------------------------------------------------------

def define_filter(conn, name, rules, filterrefs=()):
    """Define (or redefine in place, keeping its uuid) the filter ``name``. libvirt re-applies a redefined
    filter at once to every running guest that uses it."""
    current = lookup_filter(conn, name)
    xml = elements.to_string(elements.nwfilter(name, rules, filterrefs, uuid=current["uuid"] if current else None))
    try:
        writer.write(conn, "nwfilterDefineXML", xml)
    except lv.libvirt.libvirtError as exc:
        raise LibvirtFailure("cannot define nwfilter %s: %s" % (name, lv.describe(exc))) from None


def undefine_filter(conn, name):
    try:
        writer.write(conn.nwfilterLookupByName(name), "undefine")
    except lv.libvirt.libvirtError as exc:
        if exc.get_error_code() == lv.libvirt.VIR_ERR_NO_NWFILTER:
            return
        raise LibvirtFailure("cannot delete nwfilter %s: %s" % (name, lv.describe(exc))) from None


def define_nic_filter(conn, machine, nic, groups):
    define_filter(conn, nic_filter(machine, nic), nic_rules(machine, nic), [group_filter(g) for g in groups])


# --- the security group resource ------------------------------------------------------------------------------

def plan_group(params, current, users):
    """Create, update or delete a group: pure, from the parameters, its current rules (None when it does not
    exist) and the NICs it guards (['machine/nic'])."""
    name = check.dns_label(params.get("name"), "name")
    filter_name = group_filter(name)
    if params.get("state") == "absent":
        if current is None:
            return Plan(group=None)
        if users and not params.get("force"):
            raise ConflictError("security group %s guards %s; set force: true to take it off those network "
                                "interfaces and delete it" % (name, ", ".join(users)), "name")
        steps = [step("define_nwfilter", user, without=filter_name) for user in users]
        return Plan([Action("delete", name, shown(name, current, users), {},
                            steps + [step("undefine_nwfilter", filter_name)], users=users)], group=None)
    desired = normalize_rules(params.get("rules"))
    if current == desired:
        return Plan(group=shown(name, desired, users))
    kind = "create" if current is None else "update"
    before = {} if current is None else {"rules": current}
    return Plan([Action(kind, name, before, {"rules": desired}, [step("define_nwfilter", filter_name)],
                        fields=[] if current is None else ["rules"], rules=desired)],
                group=shown(name, desired, users))


class SecurityGroupResource(Resource):
    def __init__(self, ctx, params):
        self.ctx = ctx
        self.conn = ctx.conn
        self.params = params
        self.name = check.dns_label(params.get("name"), "name")

    def describe(self):
        return "security group %s" % self.name

    def holds(self, plan, observed):
        """None: a group's nwfilter (the NICs using it are machines' own; they name the filter) changes no machine."""
        return ()

    def observe(self):
        found = read_group(self.conn, self.name)
        return (found[0] if found else None), users_of(self.conn, self.name)

    def plan(self, observed):
        current, users = observed
        return plan_group(self.params, current, [user for user, _filter in users])

    def _define(self, action, _observed):
        """create and update alike: the group's filter (re)defined with the rules, which its NICs refer to."""
        define_filter(self.conn, group_filter(self.name), group_rules(self.name, action.data["rules"]))

    def _delete(self, _action, observed):
        wanted = group_filter(self.name)
        for _user, nic_filter_name in observed[1]:
            parsed = lookup_filter(self.conn, nic_filter_name)
            if parsed is not None:
                define_filter(self.conn, nic_filter_name, parsed["rules"],
                              [ref for ref in parsed["filterrefs"] if ref != wanted])
        undefine_filter(self.conn, wanted)

    APPLY = {"create": _define, "update": _define, "delete": _delete}

"""static_module.py plus the reading no no-op can skip: a module that connects to every pool given (one thread
each), lists its domains with one stats call and reads and parses each domain's XML, then returns a JSON file as
its result. Run through a play (noop_scale.py) it is the floor of a no-op of that input and output: ansible-core's
own cost plus the least libvirt reading that can tell the machines are converged."""

import json
import threading

import libvirt
from lxml import etree

from ansible.module_utils.basic import AnsibleModule


def read_pool(uri, counts):
    conn = libvirt.open(uri)
    try:
        domains = conn.getAllDomainStats(libvirt.VIR_DOMAIN_STATS_STATE, 0)
        for dom, _stats in domains:
            etree.fromstring(dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE).encode())
        counts.append(len(domains))
    finally:
        conn.close()


def main():
    # the same arguments as static_module.py: a play hands it the role's or the set's very input
    module = AnsibleModule(argument_spec={"path": {"type": "path", "required": True},
                                          "machines": {"type": "list", "elements": "dict"},
                                          "pools": {"type": "list", "elements": "raw"},
                                          "name": {"type": "str"}, "replicas": {"type": "int"},
                                          "selector": {"type": "dict"}, "template": {"type": "dict"},
                                          "wait": {"type": "str"}})
    counts = []
    threads = [threading.Thread(target=read_pool, args=(pool["uri"], counts)) for pool in module.params["pools"]]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    with open(module.params["path"]) as handle:
        result = json.load(handle)
    result.pop("invocation", None)
    result["domains_read"] = sum(counts)
    module.exit_json(**result)


if __name__ == "__main__":
    main()

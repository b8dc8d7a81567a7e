"""A module that returns a JSON file as its result: what ansible-core alone spends on a module's output of that size
(argument parsing, the no_log scrub of the result, JSON encoding), the floor any module returning it pays.
Run through a play (noop_scale.py) it is ansible-playbook's floor for a task with that input and output."""

import json

from ansible.module_utils.basic import AnsibleModule


def main():
    # machines and pools are taken and ignored: a play can hand it the very arguments the role hands
    # machine_batch, so ansible-core's cost for that input is in the figure too (noop_scale.py)
    # (and machine_set's: its name, replicas, selector, template and wait)
    module = AnsibleModule(argument_spec={"path": {"type": "path", "required": True},
                                          "machines": {"type": "list", "elements": "dict"},
                                          "pools": {"type": "list", "elements": "raw"},
                                          "name": {"type": "str"}, "replicas": {"type": "int"},
                                          "selector": {"type": "dict"}, "template": {"type": "dict"},
                                          "wait": {"type": "str"}})
    with open(module.params["path"]) as handle:
        result = json.load(handle)
    result.pop("invocation", None)
    module.exit_json(**result)


if __name__ == "__main__":
    main()

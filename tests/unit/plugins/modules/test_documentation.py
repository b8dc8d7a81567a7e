"""Every module's documentation says what its argument spec (built from options.py) says.

ansible-test's validate-modules checks the same for the modules it sees; this runs in seconds, and also shows
that each module takes its argument spec from the declarations rather than a table of its own.
"""

import ast
import glob
import importlib
import inspect
import os

import pytest
import yaml

from ansible_collections.machinery.compute.plugins.module_utils.interface import module_base
from ansible_collections.machinery.compute.plugins.module_utils.core import options

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))
MODULES = sorted(os.path.basename(path)[:-3] for path in glob.glob(os.path.join(ROOT, "plugins", "modules", "*.py"))
                 if not path.endswith("__init__.py"))
PACKAGE = "ansible_collections.machinery.compute.plugins"


def fragment_options(name):
    """The options of machinery.compute.<file> or machinery.compute.<file>.<variable> (an upper-case attribute)."""
    parts = name.split(".")[2:]
    module = importlib.import_module("%s.doc_fragments.%s" % (PACKAGE, parts[0]))
    text = getattr(module.ModuleDocFragment, parts[1].upper() if len(parts) > 1 else "DOCUMENTATION")
    return (yaml.safe_load(text) or {}).get("options") or {}


def documented(name):
    module = importlib.import_module("%s.modules.%s" % (PACKAGE, name))
    doc = yaml.safe_load(module.DOCUMENTATION)
    found = {}
    for fragment in doc.get("extends_documentation_fragment") or []:
        if fragment.startswith("machinery.compute."):
            found.update(fragment_options(fragment))
    found.update(doc.get("options") or {})
    return module, found


def module_class(module):
    return next(value for value in vars(module).values() if inspect.isclass(value)
                and issubclass(value, module_base.MachineryModule) and value is not module_base.MachineryModule)


def full_spec(cls):
    spec = dict(module_base.MULTI_POOL_ARGS if getattr(cls, "multi_pool", False) else module_base.COMMON_ARGS)
    spec.update(cls.argument_spec)
    return spec


def compare(doc, spec, where):
    problems = []
    for name in sorted(set(doc) | set(spec)):
        here = "%s.%s" % (where, name)
        if name not in doc or name not in spec:
            problems.append("%s: %s" % (here, "undocumented" if name not in doc else "documented, not in the spec"))
            continue
        documented_option, declared = doc[name], spec[name]
        for key, fallback in (("type", "str"), ("required", False), ("default", None), ("choices", None),
                              ("elements", None)):
            said, meant = documented_option.get(key, fallback), declared.get(key, fallback)
            if said != meant:
                problems.append("%s.%s: documented %r, spec %r" % (here, key, said, meant))
        if "options" in declared or "suboptions" in documented_option:
            problems.extend(compare(documented_option.get("suboptions") or {}, declared.get("options") or {}, here))
    return problems


@pytest.mark.parametrize("name", MODULES)
def test_documentation_matches_the_declared_options(name):
    module, doc = documented(name)
    assert compare(doc, full_spec(module_class(module)), name) == []


def test_declarations_build_the_specs():
    machine = importlib.import_module(PACKAGE + ".modules.machine")
    assert module_class(machine).argument_spec == options.argument_spec(options.MACHINE + options.MACHINE_MOVE)
    for table in (options.MACHINE, options.MACHINE_POOL, options.MACHINE_CLASS, options.VOLUME_ATTACH,
                  options.NIC_ATTACH):
        for option in table:
            spec = option.spec()
            assert spec.get("default") is None or spec.get("choices") is None or spec["default"] in spec["choices"]


def test_choices_are_typed_once():
    # a choice list of the core is the same object as the one the argument spec shows
    spec = options.argument_spec(options.MACHINE)
    assert spec["network_interfaces"]["options"]["model"]["choices"] == list(options.NIC_MODELS)
    assert spec["volumes"]["options"]["bus"]["choices"] == list(options.DISK_BUSES)
    assert options.argument_spec(options.VOLUME_ATTACH)["bus"]["choices"] == list(options.DISK_BUSES)
    assert options.argument_spec(options.MACHINE_POOL)["taints"]["options"]["effect"]["choices"] == \
        list(options.TAINT_EFFECTS)


def test_owned_fields_know_how_a_running_guest_takes_them():
    assert {name: owned.live for name, owned in options.OWNED_BY_NAME.items()} == {
        "machine_class": "metadata", "cpu": "restart", "memory": "balloon", "labels": "metadata",
        "tolerations": "metadata",
        "boot_config": "boot", "topology": "restart", "disk_qos": "iotune", "ip_reservations": "network",
        "run_strategy": "lifecycle", "tpm": "restart"}
    assert [item.name for item in options.FIXED] == ["image", "image_checksum", "firmware", "secure_boot",
                                                     "server_group", "swap"]


def missing_samples(returns, where=""):
    """RETURN keys without a sample; a key that lists what it contains may leave the sample to its members."""
    missing = []
    for key, entry in sorted(returns.items()):
        here = where + key
        if "contains" in entry:
            missing.extend(missing_samples(entry["contains"], here + "."))
        elif "sample" not in entry:
            missing.append(here)
    return missing


@pytest.mark.parametrize("name", MODULES)
def test_every_return_value_has_a_sample(name):
    module = importlib.import_module("%s.modules.%s" % (PACKAGE, name))
    returns = yaml.safe_load(module.RETURN) or {}
    assert returns, "%s has no RETURN" % name
    assert missing_samples(returns) == []


# The machine status is documented once, in the machine module's ``machine`` return; every other return value that
# holds machine statuses says so with this reference (ansible-core merges no doc fragment into RETURN).
STATUS_REFERENCE = "RV(machinery.compute.machine#module:machine)"


def returns_of(name):
    return yaml.safe_load(importlib.import_module("%s.modules.%s" % (PACKAGE, name)).RETURN) or {}


def status_keys():
    return set(returns_of("machine")["machine"]["contains"])


def keys_the_status_is_built_with():
    """The keys of the status dict ``machine_status._base_status`` builds, read from its source."""
    path = os.path.join(ROOT, "plugins", "module_utils", "machines", "machine_status.py")
    with open(path) as source:
        tree = ast.parse(source.read())
    function = next(node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef) and node.name == "_base_status")
    built = next(node.value for node in ast.walk(function) if isinstance(node, ast.Assign)
                 and getattr(node.targets[0], "id", None) == "status" and isinstance(node.value, ast.Dict))
    return {key.value for key in built.keys}


def entries(returns, where=""):
    """(path, entry) of every return value, members included."""
    for key, entry in sorted(returns.items()):
        yield where + key, entry
        yield from entries(entry.get("contains") or {}, where + key + ".")


def sample_items(entry):
    sample = entry.get("sample")
    items = sample if isinstance(sample, list) else [sample]
    return [item for item in items if isinstance(item, dict)]


def test_the_machine_module_documents_the_whole_status():
    assert status_keys() == keys_the_status_is_built_with()


@pytest.mark.parametrize("name", [module for module in MODULES if module != "machine"])
def test_machine_statuses_refer_to_the_one_documented_shape(name):
    status = status_keys()
    problems = []
    for where, entry in entries(returns_of(name)):
        own = set(entry.get("contains") or {})
        shown = [set(item) & status for item in sample_items(entry)]
        if describes(entry, STATUS_REFERENCE):
            if own & status:
                problems.append("%s: documents %s again" % (where, sorted(own & status)))
            if "sample" not in entry:
                problems.append("%s: no compact sample" % where)
            for item in sample_items(entry):
                if set(item) - status - own:
                    problems.append("%s: the sample shows undocumented %s" % (where, sorted(set(item) - status - own)))
            if any(len(keys) > len(status) // 3 for keys in shown):
                problems.append("%s: the sample repeats the status; keep it compact" % where)
        elif len(own & status) > len(status) // 3 or any(len(keys) > len(status) // 3 for keys in shown):
            problems.append("%s: a machine status without %s" % (where, STATUS_REFERENCE))
    assert problems == []


def describes(entry, text):
    description = entry.get("description") or ""
    return text in " ".join(description if isinstance(description, list) else [description])


def test_modules_that_return_statuses_point_to_the_machine_module():
    referring = [name for name in MODULES if any(describes(entry, STATUS_REFERENCE)
                                                 for _where, entry in entries(returns_of(name)))]
    assert referring == ["machine_batch", "machine_info", "machine_migrate", "nic_attach", "volume_attach"]
    for name in referring:
        module = importlib.import_module("%s.modules.%s" % (PACKAGE, name))
        seealso = yaml.safe_load(module.DOCUMENTATION).get("seealso") or []
        assert "machinery.compute.machine" in [entry.get("module") for entry in seealso], name


@pytest.mark.parametrize("name", MODULES)
def test_every_module_points_to_its_neighbours(name):
    module = importlib.import_module("%s.modules.%s" % (PACKAGE, name))
    seealso = yaml.safe_load(module.DOCUMENTATION).get("seealso") or []
    neighbours = [entry.get("module", "") for entry in seealso]
    assert neighbours, "%s has no seealso" % name
    for neighbour in neighbours:
        assert neighbour.startswith("machinery.compute.") and neighbour != "machinery.compute." + name
        assert neighbour.split(".")[-1] in MODULES, "%s: seealso names %s, which does not exist" % (name, neighbour)

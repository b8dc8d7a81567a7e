# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Reading manifests and checking their fields, every problem of every document collected at once.

A problem reads as kubectl prints one: ``Machine/web-1: spec.cpu.cores: must be between 1 and 256``. The
checks here take a value and its path and record a problem rather than raise, so one pass over all the
documents finds everything wrong before anything is written.
"""

from __future__ import annotations

import base64
import binascii
import os

from ansible_collections.machinery.compute.plugins.module_utils.core import validation as check
from ansible_collections.machinery.compute.plugins.module_utils.core.errors import MachineryError, ValidationError

try:
    import yaml
    HAS_YAML = True
except ImportError:  # pragma: no cover - ansible-core depends on PyYAML
    HAS_YAML = False

YAML_SUFFIXES = (".yml", ".yaml")


class ManifestError(ValidationError):
    """The documents are invalid: ``problems`` lists every one, each with its object and field path."""

    reason = "Invalid"

    def __init__(self, problems):
        self.problems = list(problems)
        super().__init__("%d problem(s) in the manifests, nothing was changed: %s"
                         % (len(self.problems), "; ".join(self.problems)), "definition")


# YAML aliases let a few hundred bytes stand for billions of nodes (each anchor naming the one before ten times),
# and every walk over a document (the checks below, each dialect's fields, the module's result) would visit each
# of them. A document is refused when its aliases expand it past MAX_EXPANDED_NODES and ALIAS_EXPANSION times
# the nodes it is written with; aliases that repeat a block a few times (shared labels, a common providerSpec)
# stay well below both.
MAX_EXPANDED_NODES = 100000
ALIAS_EXPANSION = 10
# PyYAML composes a node's children by recursion: a few thousand brackets deep exhaust Python's stack
TOO_DEEP = "its collections nest too deeply to be read (hundreds of levels); no manifest needs that many"


def _children(node):
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            yield key_node
            yield value_node
    elif isinstance(node, yaml.SequenceNode):
        yield from node.value


def alias_problem(root):
    """Why the aliases of a composed YAML document are refused, or None: one names a node that holds it (a
    document without end), or they expand it too far (MAX_EXPANDED_NODES). Each node is visited once, however
    many aliases name it."""
    expanded = {}  # id(node): how many nodes it stands for, its aliases expanded
    on_path = {id(root)}
    stack = [(root, _children(root))]
    aliased = None
    while stack:
        node, children = stack[-1]
        child = next(children, None)
        if child is None:
            stack.pop()
            on_path.discard(id(node))
            expanded[id(node)] = 1 + sum(expanded[id(each)] for each in _children(node))
        elif id(child) in on_path:
            return ("an alias names the anchor at line %d, whose node holds the alias itself: the document would never "
                    "end; write it without that alias" % (child.start_mark.line + 1))
        elif id(child) in expanded:
            aliased = aliased or child  # reached again: through an alias
        else:
            on_path.add(id(child))
            stack.append((child, _children(child)))
    total, written = expanded[id(root)], len(expanded)
    if total > max(MAX_EXPANDED_NODES, ALIAS_EXPANSION * written):
        return ("its YAML aliases expand it to %d nodes from the %d it is written with (the anchor at line %d is "
                "one they repeat); aliases that nest this deep are refused: write the repeated parts out"
                % (total, written, aliased.start_mark.line + 1))
    return None


def _duplicate_keys(node, path="", visited=None):
    """Problems for every mapping key given twice in a composed YAML node, with its document path: YAML
    loaders keep the last value silently, so ``power: On`` then ``power: Off`` would apply Off unnoticed. A node
    that aliases name again is checked once, at the path where it is written."""
    visited = set() if visited is None else visited
    if id(node) in visited:
        return []
    visited.add(id(node))
    problems = []
    if isinstance(node, yaml.MappingNode):
        seen = {}
        for key_node, value_node in node.value:
            if isinstance(key_node, yaml.ScalarNode) and key_node.tag != "tag:yaml.org,2002:merge":
                key = key_node.value
                where = "%s.%s" % (path, key) if path else key
                if key in seen:
                    problems.append("%s: the key %s is given twice (lines %d and %d); give it once"
                                    % (where, key, seen[key] + 1, key_node.start_mark.line + 1))
                else:
                    seen[key] = key_node.start_mark.line
            else:
                where = path or "."
            problems.extend(_duplicate_keys(value_node, where, visited))
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            problems.extend(_duplicate_keys(item, "%s[%d]" % (path, index), visited))
    return problems


def load_yaml(stream):
    """([document], [problem]) of a YAML stream: every document, and every key given twice in one of them
    (``#<document number>: <path>: ...``). A document whose aliases are refused (alias_problem) is not built:
    it stands as None (an empty document), and its problem says why."""
    loader = yaml.SafeLoader(stream)
    documents, problems = [], []
    try:
        while loader.check_node():
            node = loader.get_node()
            number = len(documents) + 1
            refused = alias_problem(node) if node is not None else None
            if refused:
                problems.append("#%d: %s" % (number, refused))
                documents.append(None)
                continue
            problems.extend("#%d: %s" % (number, problem) for problem in _duplicate_keys(node))
            documents.append(loader.construct_document(node))
    finally:
        loader.dispose()
    return documents, problems


def _outside(path, directory):
    """Whether ``path`` (a directory entry) resolves to a file outside ``directory``, through a symlink."""
    root = os.path.realpath(directory)
    return os.path.commonpath([root, os.path.realpath(path)]) != root


def load_sources(src=None, definition=None):
    """[(origin, document)] of every document: the files of ``src`` (a file, a directory of *.yml/*.yaml, or a
    list of either), then ``definition`` (a document, a list of them, or YAML text). ``kind: List`` documents are
    flattened. Empty documents are skipped."""
    found, problems = [], []
    paths = [src] if isinstance(src, str) else list(src or [])
    for index, path in enumerate(paths):
        if not isinstance(path, str):
            problems.append("src[%d]: must be a path" % index)
            continue
        files = [path]
        if os.path.isdir(path):
            files = sorted(os.path.join(path, name) for name in os.listdir(path) if name.endswith(YAML_SUFFIXES))
            # a link out of the directory would read any file the module can (as root: /etc/shadow)
            leaving = [name for name in files if _outside(name, path)]
            problems.extend("src: %s: a symlink to %s, outside %s; refused" % (name, os.path.realpath(name), path)
                            for name in leaving)
            files = [name for name in files if name not in leaving]
        elif not os.path.isfile(path):
            problems.append("src: %s: no such file or directory" % path)
            continue
        for name in files:
            try:
                with open(name) as handle:
                    loaded, duplicates = load_yaml(handle)
            except (OSError, yaml.YAMLError) as exc:
                problems.append("src: %s: %s" % (name, str(exc).replace("\n", " ")))
                continue
            except RecursionError:
                problems.append("src: %s: %s" % (name, TOO_DEEP))
                continue
            problems.extend("src: %s%s" % (name, problem) for problem in duplicates)
            for number, doc in enumerate(loaded):
                origin = "%s#%d" % (name, number + 1)
                if isinstance(doc, list):  # libvirt-provider's --machine-classes-file: its classes
                    classes, refused = machine_classes_file(origin, doc)
                    found.extend(classes)
                    problems.extend("src: %s" % problem for problem in refused)
                else:
                    found.append((origin, doc))
    if isinstance(definition, str):
        try:
            definition, duplicates = load_yaml(definition)
        except yaml.YAMLError as exc:
            problems.append("definition: %s" % str(exc).replace("\n", " "))
            definition, duplicates = [], []
        except RecursionError:
            problems.append("definition: %s" % TOO_DEEP)
            definition, duplicates = [], []
        problems.extend("definition%s" % problem for problem in duplicates)
    if isinstance(definition, dict):
        definition = [definition]
    found.extend(("definition[%d]" % number, doc) for number, doc in enumerate(definition or []))
    documents = []
    for origin, doc in found:
        if doc is None:
            continue
        if isinstance(doc, dict) and doc.get("kind") == "List" and isinstance(doc.get("items"), list):
            documents.extend(("%s.items[%d]" % (origin, number), item) for number, item in enumerate(doc["items"]))
        else:
            documents.append((origin, doc))
    return documents, problems


CLASS_API = "compute.ironcore.dev/v1alpha1"
# IronCore's runtime interface writes a class's capabilities as cpu_millis and memory_bytes (what libvirt-provider's
# own tests put in the file); the file's other forms carry Kubernetes quantities under cpu and memory
IRI_CAPABILITIES = {"cpu_millis": ("cpu", "%dm"), "memory_bytes": ("memory", "%d")}


def machine_classes_file(origin, items):
    """([(origin, MachineClass document)], [problem]) of a YAML list as IronCore's libvirt-provider reads its
    ``--machine-classes-file``: each item a class, written ``{name, capabilities: {cpu, memory}}``, with the
    runtime interface's ``cpu_millis`` / ``memory_bytes``, or as a whole MachineClass (``metadata.name``,
    ``capabilities``, apiVersion and kind optional). Each becomes the IronCore MachineClass it stands for (other
    capabilities, such as nvidia.com/gpu, go on and are refused with their reason by the MachineClass reader).
    A list that is no such file is refused naming the item and field."""
    documents, problems = [], []
    if not items:
        problems.append("%s: an empty list; a list is read as libvirt-provider's machine-class file, a list of "
                        "{name, capabilities}" % origin)
    for index, item in enumerate(items):
        where = "%s[%d]" % (origin, index)
        if not isinstance(item, dict):
            problems.append("%s: must be a mapping: a list is read as libvirt-provider's machine-class file, a list "
                            "of {name, capabilities}" % where)
            continue
        whole = "metadata" in item or "kind" in item
        allowed = ("apiVersion", "kind", "metadata", "capabilities") if whole else ("name", "capabilities")
        unknown = sorted(str(key) for key in item if key not in allowed)
        for key in unknown:
            problems.append("%s.%s: unknown field (an item of a machine-class file is {%s})"
                            % (where, key, ", ".join(allowed)))
        if whole and item.get("kind", "MachineClass") != "MachineClass":
            problems.append("%s.kind: must be MachineClass in a machine-class file, got %r" % (where, item["kind"]))
            continue
        if whole and item.get("apiVersion", CLASS_API) != CLASS_API:
            problems.append("%s.apiVersion: must be %s, got %r" % (where, CLASS_API, item["apiVersion"]))
            continue
        name = (item.get("metadata") or {}).get("name") if whole and isinstance(item.get("metadata"), dict) \
            else item.get("name")
        if not isinstance(name, str) or not name:
            problems.append("%s.%s: required value: every class of a machine-class file is named"
                            % (where, "metadata.name" if whole else "name"))
            continue
        capabilities = item.get("capabilities")
        if not isinstance(capabilities, dict):
            problems.append("%s.capabilities: %s" % (where, "required value" if capabilities is None else
                                                     "must be a mapping of cpu and memory"))
            continue
        if unknown:
            continue
        converted = {}
        for key, value in capabilities.items():
            if key in IRI_CAPABILITIES:
                target, text = IRI_CAPABILITIES[key]
                if isinstance(value, bool) or not isinstance(value, int):
                    problems.append("%s.capabilities.%s: must be a whole number, got %r" % (where, key, value))
                    continue
                converted[target] = text % value
            else:
                converted[key] = value
        metadata = dict(item["metadata"]) if whole else {"name": name}
        documents.append((where, {"apiVersion": CLASS_API, "kind": "MachineClass", "metadata": metadata,
                                  "capabilities": converted}))
    return documents, problems


def secret_strings(documents):
    """The strings of the documents that are secrets, for the module to mask wherever they would be shown: the
    data and stringData of v1 Secrets (encoded and decoded) and vitistack's userData (and cloudInit's). Strings
    under 4 characters are not masked (hiding every 'yes' would hide far more than it protects)."""
    found = set()
    for _origin, doc in documents:
        if not isinstance(doc, dict):
            continue
        values = []
        if doc.get("kind") == "Secret":
            for key in ("data", "stringData"):
                if isinstance(doc.get(key), dict):
                    values.extend(str(value) for value in doc[key].values())
            for value in list(values):
                try:
                    values.append(base64.b64decode(value, validate=True).decode())
                except (binascii.Error, ValueError, UnicodeDecodeError):
                    pass
        spec = doc.get("spec") if isinstance(doc.get("spec"), dict) else {}
        if isinstance(spec.get("userData"), str):
            values.append(spec["userData"])
        cloud_init = spec.get("cloudInit") if isinstance(spec.get("cloudInit"), dict) else {}
        values.extend(str(cloud_init[key]) for key in ("userData", "userDataBase64") if cloud_init.get(key))
        found.update(value for value in values if len(value) >= 4)
    return found


class Problems:
    """Problems and warnings of a set of documents, each under the object it is about."""

    def __init__(self):
        self.errors = []
        self.warnings = []

    def error(self, ref, path, message):
        self.errors.append("%s: %s: %s" % (ref, path, message) if path else "%s: %s" % (ref, message))

    def warn(self, ref, path, message):
        self.warnings.append("%s: %s: %s" % (ref, path, message) if path else "%s: %s" % (ref, message))

    def of(self, ref):
        """The errors recorded about object ``ref``."""
        return [error for error in self.errors if error.startswith(ref + ":")]

    def raise_if_any(self):
        if self.errors:
            raise ManifestError(self.errors)


# The words YAML 1.1 (PyYAML's, and Ansible's) reads as booleans when they are not quoted: IronCore's `power: On`
# arrives as true.
YAML_BOOLEANS = {True: ("on", "yes", "true"), False: ("off", "no", "false")}


def read_as_boolean(value, path, choices=None):
    """The problem of a string field that YAML read as a boolean: which boolean, from what, and how to write it."""
    meant = [choice for choice in choices or () if choice.lower() in YAML_BOOLEANS[value]]
    key = path.rsplit(".", 1)[-1]
    if meant and "[" not in key:
        return ('must be a string, and YAML read the boolean %s here: an unquoted %s is one; write %s: "%s"'
                % (str(value).lower(), meant[0], key, meant[0]))
    return ("must be a string, and YAML read the boolean %s here: an unquoted %s is one; quote the value"
            % (str(value).lower(), ", ".join(YAML_BOOLEANS[value])))


class Fields:
    """The checks of one document, recording problems under its ``ref`` (``Kind/name``)."""

    def __init__(self, problems, ref):
        self.problems = problems
        self.ref = ref

    def error(self, path, message):
        self.problems.error(self.ref, path, message)

    def warn(self, path, message):
        self.problems.warn(self.ref, path, message)

    def known(self, value, allowed, path, ignored=()):
        """Unknown keys of a mapping are errors (kubectl's strict field validation); ``ignored`` ones are kept
        silently (status, for instance)."""
        for key in value:
            if key not in allowed and key not in ignored:
                self.error("%s.%s" % (path, key) if path else str(key), "unknown field")

    def mapping(self, value, path, required=False):
        if value is None:
            if required:
                self.error(path, "required value")
            return None
        if not isinstance(value, dict):
            self.error(path, "must be a mapping")
            return None
        return value

    def items(self, value, path, required=False):
        """A list of mappings: [(index, item)] of those that are mappings."""
        if value is None:
            if required:
                self.error(path, "required value")
            return []
        if not isinstance(value, list):
            self.error(path, "must be a list")
            return []
        good = []
        for index, item in enumerate(value):
            if isinstance(item, dict):
                good.append((index, item))
            else:
                self.error("%s[%d]" % (path, index), "must be a mapping")
        return good

    def strings(self, value, path):
        if value is None:
            return []
        if not isinstance(value, list) or not all(isinstance(item, str) and item for item in value):
            self.error(path, "must be a list of non-empty strings")
            return []
        return value

    def string(self, value, path, required=False, choices=None):
        if value is None:
            if required:
                self.error(path, "required value")
            return None
        if isinstance(value, bool):
            self.error(path, read_as_boolean(value, path, choices))
            return None
        if not isinstance(value, str) or not value:
            self.error(path, "must be a non-empty string")
            return None
        if choices and value not in choices:
            self.error(path, "unsupported value %r: must be one of %s" % (value, ", ".join(choices)))
            return None
        return value

    def name(self, value, path, required=True):
        text = self.string(value, path, required)
        return None if text is None else self.run(check.dns_label, text, path)

    def class_name(self, value, path, required=True):
        """A machine class name: a DNS-1123 subdomain (``t3.medium``), as Kubernetes object names are."""
        text = self.string(value, path, required)
        return None if text is None else self.run(check.class_name, text, path)

    def integer(self, value, path, minimum=None, maximum=None, required=False):
        if value is None:
            if required:
                self.error(path, "required value")
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            self.error(path, "must be an integer")
            return None
        if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
            if maximum is None:
                self.error(path, "must be at least %d" % minimum)
            else:
                self.error(path, "must be between %d and %d" % (minimum, maximum))
            return None
        return value

    def boolean(self, value, path):
        if value is None:
            return None
        if not isinstance(value, bool):
            self.error(path, "must be true or false")
            return None
        return value

    def run(self, validate, value, path, *args):
        """A validation.py check on ``value``; its problem is recorded under ``path``."""
        try:
            return validate(value, path, *args)
        except MachineryError as exc:
            self.error(path, exc.message)
            return None


def secret_value(fields, secret, key, path):
    """The text under ``key`` of a v1 Secret: stringData as is, data base64-decoded."""
    string_data = secret.get("stringData") or {}
    if isinstance(string_data, dict) and key in string_data:
        return str(string_data[key])
    data = secret.get("data") or {}
    if isinstance(data, dict) and key in data:
        try:
            return base64.b64decode(str(data[key]), validate=True).decode()
        except (binascii.Error, ValueError, UnicodeDecodeError):
            fields.error(path, "data.%s of the secret is not valid base64 text" % key)
            return None
    fields.error(path, "the secret has no key %r" % key)
    return None


def kube_quantity(fields, value, path, minimum_bytes=None):
    """A Kubernetes quantity as bytes (memory, storage)."""
    if isinstance(value, bool) or value is None or not isinstance(value, (str, int)):
        fields.error(path, "must be a quantity such as 512Mi or 10Gi")
        return None
    result = fields.run(check.memory_bytes if minimum_bytes else check.disk_bytes, value, path)
    return result


def powered_on(machine):
    """Whether an exported document says ``machine`` (a machine status) is on: what its run strategy keeps it at
    when it keeps one (always: on, halted: off), else whether it runs now. A machine applied off and never booted
    (phase Pending) is off: exported on, a re-apply would start it."""
    strategy = machine.get("run_strategy")
    if strategy in ("always", "halted"):
        return strategy == "always"
    return machine.get("power_state") in ("running", "paused")

"""The layout of plugins/module_utils/ is the one docs/architecture.md explains: every file is named there, and
no package imports from one it should not (pools never from fleets, core from nothing of ours but the
one writer, coordination/writer.py)."""

import ast
import glob
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
MODULE_UTILS = os.path.join(ROOT, "plugins", "module_utils")
PACKAGE = "ansible_collections.machinery.compute.plugins.module_utils"
# a package may import from those before it, never from those after it
ORDER = ("core", "coordination", "pools", "machines", "fleets", "manifests", "interface")
FILES = sorted(os.path.relpath(path, MODULE_UTILS) for path in glob.glob(os.path.join(MODULE_UTILS, "*", "*.py"))
               if not path.endswith("__init__.py"))


def test_no_file_outside_a_package():
    assert [os.path.basename(path) for path in glob.glob(os.path.join(MODULE_UTILS, "*.py"))] == []


@pytest.mark.parametrize("path", FILES)
def test_every_file_is_named_in_the_architecture(path):
    with open(os.path.join(ROOT, "docs", "architecture.md"), encoding="utf-8") as handle:
        text = handle.read()
    assert "`%s`" % path in text, "docs/architecture.md does not say why %s exists" % path


def leaf_writer_only(tree):
    """Whether the file's imports of coordination/ are of its writer alone, and the writer imports nothing of ours."""
    names = [(node.module, [alias.name for alias in node.names]) for node in ast.walk(tree)
             if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(PACKAGE + ".coordination")]
    with open(os.path.join(MODULE_UTILS, "coordination", "writer.py"), encoding="utf-8") as handle:
        writer = ast.parse(handle.read())
    leaf = not any(isinstance(node, ast.ImportFrom) and (node.module or "").startswith(PACKAGE)
                   for node in ast.walk(writer))
    return leaf and all(module == PACKAGE + ".coordination" and aliases == ["writer"] for module, aliases in names)


@pytest.mark.parametrize("path", FILES)
def test_packages_import_only_from_below(path):
    package = path.split(os.sep)[0]
    with open(os.path.join(MODULE_UTILS, path), encoding="utf-8") as handle:
        tree = ast.parse(handle.read())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(PACKAGE + "."):
            imported.add(node.module[len(PACKAGE) + 1:].split(".")[0])
    above = {name for name in imported if name in ORDER and ORDER.index(name) > ORDER.index(package)}
    if package == "core" and leaf_writer_only(tree):
        above.discard("coordination")  # the one writer, a leaf every write goes through (docs/concurrency.md)
    assert not above, "%s imports from %s" % (path, ", ".join(sorted(above)))

# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The collection artifact as a user gets it.

The working tree is built with ansible-galaxy and the tarball installed into an empty collections path. The
tarball must hold what a user installs and nothing of the development tree, and ansible-doc, seeing only that
install (not the working tree the virtual environment links), must read every plugin's documentation. Needs no
libvirt: nothing is run, only built, installed and documented.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
from collections import namedtuple
from pathlib import Path, PurePosixPath

import pytest

REPO = Path(__file__).resolve().parents[2]

# The built tarball, the collection's root in the fresh collections path, and the environment and working
# directory the ansible commands run with.
Artifact = namedtuple("Artifact", "tarball installed env cwd")

# The top level of the artifact, all of it: what ansible-galaxy writes, the documents, the collection's content,
# requirements.txt and bindep.txt (ansible-builder reads them for execution environments), and extensions (AWX).
TOP_LEVEL = {"MANIFEST.json", "FILES.json", "README.md", "LICENSE", "requirements.txt", "bindep.txt", "meta",
             "plugins", "roles", "docs", "changelogs", "extensions"}
# Development-only things that must not ship, wherever they are.
NEVER_TOP = {"Makefile", "lab", "tests", "benchmarks", "playbooks", ".venv", ".lab", ".cache",
             ".ansible", ".ci", "galaxy.yml", "constraints.txt", "requirements-dev.txt"}
# extensions/ ships the AWX files (credential type, EE definition, job template playbooks), never the molecule
# scenarios, which need the lab.
NEVER_UNDER = ("extensions/molecule",)
NEVER_ANYWHERE = {"__pycache__", ".venv", ".lab", ".cache", ".ansible", ".git", ".pytest_cache"}

# The plugins the contract names; the test checks them besides everything it discovers.
CONTRACT = {"inventory": {"machines"}, "lookup": {"scheduler"}, "connection": {"guest_agent"}}


def tool(name):
    """An ansible command beside the running Python (the test environment's), else the one on PATH."""
    beside = Path(sys.executable).parent / name
    found = str(beside) if beside.exists() else shutil.which(name)
    assert found, "%s not found beside %s or on PATH" % (name, sys.executable)
    return found


def run(command, env, cwd):
    result = subprocess.run([str(part) for part in command], env=env, cwd=cwd, capture_output=True, text=True,
                            timeout=300, check=False)
    shown = " ".join(str(part) for part in command)
    assert result.returncode == 0, "%s failed (%d):\n%s\n%s" % (shown, result.returncode, result.stdout, result.stderr)
    return result


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    """Build the working tree and install the tarball into a fresh collections path."""
    work = tmp_path_factory.mktemp("packaging")
    build, collections, home, cwd = (work / part for part in ("build", "collections", "home", "cwd"))
    for path in (build, collections, home, cwd):
        path.mkdir()
    config = work / "ansible.cfg"
    config.write_text("[defaults]\n")
    env = {key: value for key, value in os.environ.items() if not key.startswith("ANSIBLE_")}
    env.update({
        # Only the fresh install: not the user's collections, and not the link to the working tree that the
        # test environment keeps in its site-packages (ansible-core scans sys.path for ansible_collections).
        "ANSIBLE_COLLECTIONS_PATH": str(collections),
        "ANSIBLE_COLLECTIONS_SCAN_SYS_PATH": "false",
        "ANSIBLE_CONFIG": str(config),
        "ANSIBLE_HOME": str(home),
        "ANSIBLE_NOCOLOR": "1",
    })
    run([tool("ansible-galaxy"), "collection", "build", "--output-path", build, REPO], env, cwd)
    tarballs = list(build.glob("machinery-compute-*.tar.gz"))
    assert len(tarballs) == 1, tarballs
    run([tool("ansible-galaxy"), "collection", "install", tarballs[0], "-p", collections], env, cwd)
    installed = collections / "ansible_collections" / "machinery" / "compute"
    assert (installed / "MANIFEST.json").is_file()
    return Artifact(tarballs[0], installed, env, cwd)


@pytest.fixture(scope="module")
def members(artifact):
    with tarfile.open(artifact.tarball) as tarball:
        return {PurePosixPath(name) for name in tarball.getnames()}


def test_tarball_holds_nothing_of_the_development_tree(members):
    top = {member.parts[0] for member in members}
    assert top == TOP_LEVEL, "top level differs: extra %s, missing %s" % (sorted(top - TOP_LEVEL),
                                                                          sorted(TOP_LEVEL - top))
    assert not top & NEVER_TOP
    assert not [str(member) for member in members if str(member).startswith(NEVER_UNDER)]
    unwanted = sorted(str(member) for member in members
                      if set(member.parts) & NEVER_ANYWHERE
                      or any(part.startswith(".") for part in member.parts)
                      or member.suffix in (".pyc", ".pyo"))
    assert not unwanted, "development files in the artifact: %s" % unwanted


def test_tarball_holds_what_a_user_installs(members):
    for needed in ("LICENSE", "README.md", "meta/runtime.yml", "requirements.txt"):
        assert PurePosixPath(needed) in members, needed
    # Every plugin file git tracks and the working tree still has (a deletion not yet committed cannot ship).
    listed = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z", "--", "plugins"], capture_output=True,
                            check=True).stdout.decode().split("\0")
    tracked = {PurePosixPath(path) for path in listed if path and (REPO / path).is_file()}
    assert tracked, "git lists no plugins under %s" % REPO
    missing = sorted(str(path) for path in tracked - members)
    assert not missing, "tracked plugin files missing from the artifact: %s" % missing


def test_license_is_the_gpl3_text(artifact):
    text = (artifact.installed / "LICENSE").read_text()
    assert "GNU GENERAL PUBLIC LICENSE" in text and "Version 3, 29 June 2007" in text


def test_manifest_metadata(artifact):
    info = json.loads((artifact.installed / "MANIFEST.json").read_text())["collection_info"]
    assert (info["namespace"], info["name"]) == ("machinery", "compute")
    assert info["license"] == ["GPL-3.0-or-later"]
    for key in ("repository", "documentation", "homepage", "issues"):
        assert (info[key] or "").startswith("https://"), key


def plugin_names(installed, kind):
    """Plugins of a kind in the installed tree: Python files, except filters, which are named by their docs."""
    if kind == "filter":
        return sorted(path.stem for path in (installed / "plugins" / "filter").glob("*.yml"))
    directory = "modules" if kind == "module" else kind
    return sorted(path.stem for path in (installed / "plugins" / directory).glob("*.py") if path.stem != "__init__")


@pytest.mark.parametrize("kind", ["module", "inventory", "lookup", "filter", "connection"])
def test_ansible_doc_reads_every_plugin_of_the_install(artifact, kind):
    installed = artifact.installed
    names = plugin_names(installed, kind)
    assert names, "no %s plugins in %s" % (kind, installed)
    assert CONTRACT.get(kind, set()) <= set(names)
    fqcns = ["machinery.compute." + name for name in names]
    result = run([tool("ansible-doc"), "-t", kind, "--json"] + fqcns, artifact.env, artifact.cwd)
    # ansible-doc says a plugin it could not find or load in a warning and still exits 0.
    assert "WARNING" not in result.stderr and "ERROR" not in result.stderr, result.stderr
    docs = json.loads(result.stdout)
    assert sorted(docs) == sorted(fqcns), "documented %s of %s\n%s" % (sorted(docs), fqcns, result.stderr)
    for fqcn, entry in docs.items():
        doc = entry["doc"]
        assert doc.get("short_description"), fqcn
        # Read from the install, not from the working tree.
        assert Path(doc["filename"]).resolve().is_relative_to(installed.resolve()), (fqcn, doc["filename"])

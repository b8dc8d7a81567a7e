# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The execution environment, as far as it can be made without a container runtime.

ansible-builder writes the build context of extensions/awx/execution-environment.yml (its Containerfile and what
it copies), and its introspection, run on the collection installed from the built tarball as the image's galaxy
stage installs it, merges the collection's requirements.txt and bindep.txt. The image itself is not built here:
there is no container runtime on the test machines.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DEFINITION = REPO / "extensions" / "awx" / "execution-environment.yml"


def tool(name):
    beside = Path(sys.executable).parent / name
    found = str(beside) if beside.exists() else shutil.which(name)
    assert found, "%s not found beside %s or on PATH" % (name, sys.executable)
    return found


def run(command, env=None, cwd=None):
    result = subprocess.run([str(part) for part in command], env=env, cwd=cwd, capture_output=True, text=True,
                            timeout=300, check=False)
    assert result.returncode == 0, "%s failed (%d):\n%s\n%s" % (" ".join(map(str, command)), result.returncode,
                                                                result.stdout, result.stderr)
    return result


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The collection built and installed into a fresh collections path, and a copy of the EE definition with the
    tarball beside it under the name the definition expects."""
    work = tmp_path_factory.mktemp("ee")
    env = {key: value for key, value in os.environ.items() if not key.startswith("ANSIBLE_")}
    env.update(ANSIBLE_COLLECTIONS_SCAN_SYS_PATH="false", ANSIBLE_HOME=str(work / "home"), ANSIBLE_NOCOLOR="1")
    run([tool("ansible-galaxy"), "collection", "build", "--output-path", work / "build", REPO], env, work)
    tarball = next((work / "build").glob("machinery-compute-*.tar.gz"))
    run([tool("ansible-galaxy"), "collection", "install", "--force", "-p", work / "collections", tarball], env, work)
    definition = work / "definition"
    definition.mkdir()
    shutil.copy(DEFINITION, definition / "execution-environment.yml")
    shutil.copy(tarball, definition / "machinery-compute.tar.gz")
    return {"work": work, "tarball": tarball, "definition": definition / "execution-environment.yml",
            "collections": work / "collections", "env": env}


def test_collection_ee_file_is_a_v3_definition_naming_its_requirements():
    from ansible_builder.ee_schema import validate_schema

    meta = yaml.safe_load((REPO / "meta" / "execution-environment.yml").read_text())
    validate_schema(meta)
    assert meta["version"] == 3
    # introspection reads these relative to the collection's root
    assert meta["dependencies"] == {"python": "requirements.txt", "system": "bindep.txt"}


def test_bindep_names_the_build_and_runtime_packages_on_both_families():
    from bindep.depends import Depends

    depends = Depends((REPO / "bindep.txt").read_text())
    for platform, wanted_compile, wanted_runtime in (
            ("rpm", {"gcc", "pkgconf-pkg-config", "libvirt-devel", "python3-devel"}, {"libvirt-libs", "openssh-clients"}),
            ("dpkg", {"gcc", "pkg-config", "libvirt-dev", "python3-dev"}, {"libvirt0", "openssh-client"})):
        profiles = ["platform:" + platform]
        rules = depends.active_rules(profiles + ["compile"])
        compile_names = {rule[0] for rule in rules}
        runtime_names = {rule[0] for rule in depends.active_rules(profiles)}
        assert wanted_compile | wanted_runtime <= compile_names, (platform, compile_names)
        # the build tools stay in the build stage: the final image installs the rules without a profile
        assert runtime_names == wanted_runtime, (platform, runtime_names)


def test_builder_writes_the_build_context(built):
    context = built["work"] / "context"
    result = run([tool("ansible-builder"), "create", "-f", built["definition"], "-c", context,
                  "--output-filename", "Containerfile"], cwd=built["work"])
    assert "Complete" in result.stdout
    containerfile = (context / "Containerfile").read_text()
    for needle in ('ARG EE_BASE_IMAGE="quay.io/fedora/fedora:41"',
                   'ARG ANSIBLE_INSTALL_REFS="ansible-core>=2.16 ansible-runner>=2.4"',
                   "ansible-galaxy collection install $ANSIBLE_GALAXY_CLI_COLLECTION_OPTS -r requirements.yml",
                   "introspect.py introspect --write-bindep=/tmp/src/bindep.txt --write-pip=/tmp/src/requirements.txt",
                   "/output/scripts/install-from-bindep",
                   "LABEL ansible-execution-environment=true"):
        assert needle in containerfile, "%s not in the Containerfile:\n%s" % (needle, containerfile)
    requirements = yaml.safe_load((context / "_build" / "requirements.yml").read_text())
    assert requirements == {"collections": [{"name": "collections/machinery-compute.tar.gz", "type": "file"}]}
    copied = context / "_build" / "collections" / "machinery-compute.tar.gz"
    assert copied.read_bytes() == built["tarball"].read_bytes()
    with tarfile.open(copied) as archive:
        names = set(archive.getnames())
    assert {"bindep.txt", "requirements.txt", "meta/execution-environment.yml"} <= names


def test_introspection_merges_the_collection_requirements(built):
    """What the image's builder stage runs on the collections its galaxy stage installed."""
    pip_out, bindep_out = built["work"] / "pip.txt", built["work"] / "bindep.txt"
    run([tool("ansible-builder"), "introspect", built["collections"], "--write-pip", pip_out,
         "--write-bindep", bindep_out], cwd=built["work"])
    pip_lines = pip_out.read_text().splitlines()
    bindep_lines = bindep_out.read_text().splitlines()
    origin = "  # from collection machinery.compute"
    for requirement in ("libvirt-python>=9.0", "lxml>=4.9", "jmespath>=1.0", "pycdlib>=1.11"):
        assert requirement + origin in pip_lines, pip_lines
    for line in (REPO / "bindep.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            assert line + origin in bindep_lines, (line, bindep_lines)

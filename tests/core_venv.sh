#!/usr/bin/env bash
# A virtual environment beside VENV with another ansible-core release and the collection's runtime and test
# requirements, its site-packages linked to this working tree like VENV's. Prints its bin directory.
# Used by `make core-venv` (the contract's minimum release, for unit and inventory tests), `make newest-venv` (the
# newest release, on a Python of its own: PYTHON, the third argument) and by benchmarks/inventory_scale.py --core.
set -euo pipefail
venv=${1:?usage: core_venv.sh VENV VERSION [PYTHON]}
version=${2:?usage: core_venv.sh VENV VERSION [PYTHON]}
python=${3:-python3}
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
dest="$venv/cores/$version"
stamp="$dest/.stamp"
# The requirements but ansible-core (the release asked for instead) and the tools not run there (ansible-lint,
# molecule, the docs site's, and ansible-builder and ansible-runner of the AWX tests), at the versions
# constraints.txt pins for the test environment.
skip='ansible-core|ansible-lint|molecule|antsibull-docs|sphinx|myst-parser|ansible-builder|ansible-runner'
wanted=$(cat "$repo/requirements.txt" "$repo/requirements-dev.txt" | grep -Ev "^(#|-r|$skip)" \
    | grep -v '^$' | tr '\n' ' ')
pins=$(bash "$repo/tests/constraints.sh" | grep -Ev "^(#|$skip)" | grep -v '^$' | tr '\n' ' ')
python_version=$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$version $python_version $wanted| $pins" ]; then
    "$python" -m venv --clear "$dest" >&2
    tr ' ' '\n' <<<"$pins" > "$dest/constraints.txt"
    # shellcheck disable=SC2086  # one argument per requirement
    "$dest/bin/pip" install -q --disable-pip-version-check -c "$dest/constraints.txt" "ansible-core==$version" \
        $wanted >&2
    echo "$version $python_version $wanted| $pins" > "$stamp"
fi
site=$("$dest/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
mkdir -p "$site/ansible_collections/machinery"
ln -sfn "$repo" "$site/ansible_collections/machinery/compute"
echo "$dest/bin"

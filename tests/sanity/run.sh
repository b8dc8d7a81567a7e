#!/usr/bin/env bash
# ansible-test sanity on a clean copy of the collection, at ansible_collections/machinery/compute as it requires.
set -euo pipefail
venv=$(cd "${1:?usage: run.sh VENV [ansible-test sanity options]}" && pwd)
shift
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)

# ansible-test bootstraps pip with a script it downloads from a host this network cannot reach; put our shim
# where it looks for its cached copy (the file name carries the pip version it pins).
pip_version=$("$venv/bin/python" -c 'import re, ansible_test, pathlib
p = pathlib.Path(ansible_test.__file__).parent / "_internal" / "python_requirements.py"
print(re.search(r"pip=.([0-9.]+).", p.read_text()).group(1))')
cache="$HOME/.ansible/test/cache/get_pip_${pip_version//./_}.py"
mkdir -p "$(dirname "$cache")"
cp "$repo/tests/sanity/get_pip_shim.py" "$cache"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
dest="$work/ansible_collections/machinery/compute"
mkdir -p "$dest"
(cd "$repo" && git ls-files -z --cached --others --exclude-standard | xargs -0 cp --parents -t "$dest")
cd "$dest"
git init -q && git add -A
"$venv/bin/ansible-test" sanity --venv --python 3.11 --color no "$@"

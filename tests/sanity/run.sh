#!/usr/bin/env bash
# ansible-test sanity on a clean copy of the collection, at ansible_collections/machinery/compute as it requires.
set -euo pipefail
venv=$(cd "${1:?usage: run.sh VENV [ansible-test sanity options]}" && pwd)
shift
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)

# ansible-test runs pip with a whitelisted environment (PIP_* variables are dropped) but keeps HOME. Give it a
# HOME of its own, one per virtual environment so its test venvs are reused, whose pip.conf carries the caller's
# effective pip settings (index, certificates). It lives outside the working tree: make test builds the collection
# from the working tree while this runs, and ansible-galaxy's build walks every file there, so the files pip
# writes and renames in the test venvs meanwhile failed the build ("No such file or directory" on a .pyc).
home="${XDG_CACHE_HOME:-$HOME/.cache}/machinery-compute/ansible-test-$(printf %s "$venv" | sha256sum | cut -c1-12)"
mkdir -p "$home/.config/pip" "$home/.ansible/test/cache"
"$venv/bin/pip" config list 2>/dev/null | python3 -c '
import re, sys
settings = {}
for line in sys.stdin:
    match = re.match(r"^[^.]*\.([a-z-]+)=(.*)$", line.strip())
    if match:
        settings[match.group(1)] = match.group(2).strip("\x27\"")
print("[global]")
for key, value in settings.items():
    print("%s = %s" % (key, value))
' > "$home/.config/pip/pip.conf"

# ansible-test bootstraps pip with a script it downloads from a host this network cannot reach; put our shim
# where it looks for its cached copy (the file name carries the pip version it pins).
pip_version=$("$venv/bin/python" -c 'import re, ansible_test, pathlib
p = pathlib.Path(ansible_test.__file__).parent / "_internal" / "python_requirements.py"
print(re.search(r"pip=.([0-9.]+).", p.read_text()).group(1))')
cp "$repo/tests/sanity/get_pip_shim.py" "$home/.ansible/test/cache/get_pip_${pip_version//./_}.py"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
dest="$work/ansible_collections/machinery/compute"
mkdir -p "$dest"
(cd "$repo" && git ls-files -z --cached --others --exclude-standard | xargs -0 cp --parents -t "$dest")
cd "$dest"
git init -q && git add -A
# The tests run on the virtual environment's own Python (3.11 for the pinned release on Debian 12, 3.13 for the
# newest release and on Debian 13).
python=$("$venv/bin/python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
HOME="$home" "$venv/bin/ansible-test" sanity --venv --python "$python" --color no "$@"

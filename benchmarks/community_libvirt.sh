#!/usr/bin/env bash
# Puts community.libvirt 2.x (as shipped in the PyPI package ansible 12.3.0) into DEST/ansible_collections,
# for the side-by-side benchmarks only. Prints DEST.
set -euo pipefail
venv=${1:?usage: community_libvirt.sh VENV}
dest="$venv/bench-collections"
if [ ! -d "$dest/ansible_collections/community/libvirt" ]; then
    download=$(mktemp -d)
    trap 'rm -rf "$download"' EXIT
    "$venv/bin/pip" download -q --no-deps ansible==12.3.0 -d "$download"
    "$venv/bin/python" - "$download"/ansible-12.3.0-py3-none-any.whl "$dest" <<'PY'
import sys, zipfile
wheel, dest = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as archive:
    members = [m for m in archive.namelist() if m.startswith("ansible_collections/community/libvirt/")]
    archive.extractall(dest, members)
PY
fi
echo "$dest"

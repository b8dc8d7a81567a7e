#!/usr/bin/env bash
# Prints the path of a Python the newest ansible-core runs its controller on (3.12 or later), newest first: the
# system's python3 when it is recent enough (Debian 13's 3.13), a python3.1x on PATH, else one of pyenv's
# installed versions. Prints nothing when the machine has none; the Makefile then says so loudly.
set -uo pipefail
minimum=${1:-3.12}
recent() {
    "$1" -c "import sys; sys.exit(0 if sys.version_info[:2] >= tuple(map(int, '$minimum'.split('.'))) else 1)" \
        >/dev/null 2>&1
}
candidates=()
for name in python3 python3.14 python3.13 python3.12; do
    # pyenv's shims answer for every name and fail when the version is not selected: take the real file.
    path=$(command -v "$name" 2>/dev/null) || continue
    case "$path" in */shims/*) continue ;; esac
    candidates+=("$path")
done
root=${PYENV_ROOT:-}
if [ -z "$root" ] && command -v pyenv >/dev/null 2>&1; then
    root=$(pyenv root 2>/dev/null)
fi
if [ -n "$root" ] && [ -d "$root/versions" ]; then
    while IFS= read -r version; do
        candidates+=("$root/versions/$version/bin/python3")
    done < <(find "$root/versions" -mindepth 1 -maxdepth 1 -name '3.*' -printf '%f\n' | sort -rV)
fi
for python in "${candidates[@]}"; do
    if recent "$python"; then
        echo "$python"
        exit 0
    fi
done
exit 0

#!/usr/bin/env bash
# Builds the collection's documentation site into DEST/html (make docs): antsibull-docs writes the plugin pages
# and the extra docs (docs/docsite/) as reStructuredText, the Markdown guides of docs/ join them, and Sphinx
# renders the lot with the Ansible theme. Offline: nothing is fetched. Warnings fail the build.
set -euo pipefail
venv=${1:?usage: build.sh VENV DEST}
dest=${2:?usage: build.sh VENV DEST}
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
export PATH="$venv/bin:$PATH"
rm -rf "$dest"
# antsibull-docs wants its output directory writable by its owner only.
mkdir -p "$dest"
mkdir -m 700 "$dest/rst"
antsibull-docs collection --use-current --squash-hierarchy --fail-on-error --cleanup everything \
    --dest-dir "$dest/rst" machinery.compute
# Every Markdown page of docs/ is a guide; the extra doc guides.rst lists them (antsibull-docs lints only what
# the collection holds, so the list is written here, where the pages exist).
mkdir -p "$dest/rst/docsite/guide"
cp "$repo"/docs/*.md "$dest/rst/docsite/guide/"
# the pictures the guides show (images/<name>.png, relative to the page)
cp -r "$repo"/docs/images "$dest/rst/docsite/guide/"
{
    printf '\n.. toctree::\n   :maxdepth: 1\n\n'
    for page in "$repo"/docs/*.md; do
        printf '   guide/%s\n' "$(basename "$page" .md)"
    done
} >> "$dest/rst/docsite/guides.rst"
sphinx-build -q -W --keep-going -b html -c "$repo/docs/docsite" "$dest/rst" "$dest/html"
echo "$dest/html/index.html"

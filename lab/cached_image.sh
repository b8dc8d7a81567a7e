#!/usr/bin/env bash
# Builds an image in a cache of the machine's, shared by its clones of the repository, and copies it into OUTPUT_DIR:
#
#   lab/cached_image.sh BUILD_SCRIPT IMAGE_NAME CACHE_DIR OUTPUT_DIR
#
# BUILD_SCRIPT is one of the image recipes' build.sh (lab/image/build.sh, idle/build.sh, real/build.sh), which
# builds IMAGE_NAME.qcow2 into CACHE_DIR unless CACHE_DIR's IMAGE_NAME.recipe holds the hash of its recipe as it is
# now. The image and its recipe file are copied into OUTPUT_DIR when OUTPUT_DIR's recipe file differs, under the
# lock the build scripts take in each directory, so no copy pairs an image with another build's hash. A fresh
# machine builds as before (plus one copy); a second clone on the same machine, or the same clone after
# `make clean`, copies the image its recipe makes. The absolute path of the image is the last line on stdout.
set -euo pipefail

[ $# -eq 4 ] || { echo "usage: $0 BUILD_SCRIPT IMAGE_NAME CACHE_DIR OUTPUT_DIR" >&2; exit 2; }
build=$1
name=$2
mkdir -p "$3" "$4"
cache=$(cd "$3" && pwd -P)
output=$(cd "$4" && pwd -P)

bash "$build" "$cache" >/dev/null

if [ "$cache" != "$output" ]; then
    exec 8>"$cache/.$name.lock" 9>"$output/.$name.lock"
    flock 8
    flock 9
    if ! cmp -s "$cache/$name.recipe" "$output/$name.recipe"; then
        rm -f "$output/$name.recipe"
        cp --reflink=auto "$cache/$name.qcow2" "$output/.$name.qcow2.copy"
        mv -f "$output/.$name.qcow2.copy" "$output/$name.qcow2"
        cp "$cache/$name.recipe" "$output/.$name.recipe.copy"
        mv -f "$output/.$name.recipe.copy" "$output/$name.recipe"
        echo "cached_image.sh: $name.qcow2 copied from $cache" >&2
    fi
fi
echo "$output/$name.qcow2"

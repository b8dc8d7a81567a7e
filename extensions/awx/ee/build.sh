#!/usr/bin/env bash
# make ee: the execution environment image machinery-ee:debian, built as AWX users build theirs: ansible-builder
# with podman (Debian's package), on the base image base.sh makes from Debian packages, with the collection as
# ansible-galaxy builds it from this working tree. Prints the build's time and the image's size.
#
#   build.sh WORKDIR VENV     (VENV: where ansible-galaxy and ansible-builder are)
set -euo pipefail
work=${1:?usage: build.sh WORKDIR VENV}
venv=${2:?usage: build.sh WORKDIR VENV}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../../.." && pwd)
IMAGE=machinery-ee:debian
die() { echo "ee: $*" >&2; exit 1; }
mkdir -p "$work"
work=$(cd "$work" && pwd)

command -v podman >/dev/null || {
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends podman >/dev/null
}
started=$SECONDS
base=$(bash "$here/base.sh" "$work")
echo "ee: base image $base ($((SECONDS - started)) s)" >&2

# A machine whose containers cannot start as podman configures them (setrlimit refused, cgroups in hybrid mode:
# some sandboxed or nested machines) gets a containers.conf of its own with runc-without-rlimits as the runtime;
# make ee exports it (CONTAINERS_CONF) to the jobs as well. On other machines podman runs as configured.
rm -f "$work/containers.conf"
if ! podman run --rm --network=host "$base" true >/dev/null 2>"$work/probe.log"; then
    command -v runc >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends runc >/dev/null
    printf '[engine]\nruntime = "runc"\n[engine.runtimes]\nrunc = ["%s"]\n' "$here/runc-without-rlimits" \
        > "$work/containers.conf"
    export CONTAINERS_CONF=$work/containers.conf
    podman run --rm --network=host "$base" true >/dev/null || die "no container starts here, even with $CONTAINERS_CONF"
    echo "ee: containers start here only without resource limits ($(tail -n 1 "$work/probe.log")): $CONTAINERS_CONF" >&2
fi

definition=$work/definition
rm -rf "$definition" "$work/context"
mkdir -p "$definition"
rm -rf "$work/collection"
"$venv/bin/ansible-galaxy" collection build --output-path "$work/collection" "$repo" >/dev/null
cp "$work"/collection/machinery-compute-*.tar.gz "$definition/machinery-compute.tar.gz"
cp "$repo/extensions/awx/execution-environment-debian.yml" "$definition/execution-environment.yml"
built=$SECONDS
# The build's RUN steps reach the package registries through the machine's network, as apt and pip do here.
"$venv/bin/ansible-builder" build -f "$definition/execution-environment.yml" -c "$work/context" -t "$IMAGE" \
    --container-runtime podman --extra-build-cli-args='--network=host' -v 1 >&2
size=$(podman image inspect --format '{{.Size}}' "$IMAGE")
echo "ee: $IMAGE built in $((SECONDS - built)) s ($((SECONDS - started)) s with the base), $((size / 1000000)) MB" >&2
echo "$IMAGE"

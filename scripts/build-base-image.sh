#!/usr/bin/env bash
# Build the base image the Dockerfile starts FROM, without a container registry:
# debootstrap a minimal Debian bookworm (python3 3.11 + venv, which pyproject's
# requires-python >=3.11 accepts) into a folder and `podman import` it.
#
#   scripts/build-base-image.sh            # -> localhost/prism-base:bookworm (skipped if present)
#   FORCE=1 scripts/build-base-image.sh    # rebuild it
#
# Machines that can pull from a registry do not need this: build with
#   --build-arg BASE_IMAGE=docker.io/library/python:3.11-slim
# Needs root (debootstrap chroots), debootstrap and podman (scripts/build-image.sh installs them).
set -euo pipefail

BASE_IMAGE="${BASE_IMAGE:-localhost/prism-base:bookworm}"
SUITE="${DEBIAN_SUITE:-bookworm}"
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
PODMAN=(podman --runtime runc --cgroup-manager cgroupfs)

fail() { echo "error: $*" >&2; exit 2; }

command -v podman >/dev/null || fail "podman is not installed; fix: apt-get install podman runc (or run scripts/build-image.sh as root, which installs them)"
if [ -z "${FORCE:-}" ] && "${PODMAN[@]}" image exists "$BASE_IMAGE"; then
  echo "base image $BASE_IMAGE exists (FORCE=1 rebuilds it)"
  exit 0
fi
command -v debootstrap >/dev/null || fail "debootstrap is not installed; fix: apt-get install debootstrap"
[ "$(id -u)" = "0" ] || fail "debootstrap needs root to build $BASE_IMAGE; fix: run this script as root, or build with --build-arg BASE_IMAGE=docker.io/library/python:3.11-slim on a machine with a registry"

rootfs="$(mktemp -d "${TMPDIR:-/var/tmp}/prism-base-rootfs.XXXXXX")"
cleanup() { rm -rf --one-file-system "$rootfs"; }
trap cleanup EXIT

echo "debootstrap $SUITE from $MIRROR into $rootfs (a minute or two)"
debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
  "$SUITE" "$rootfs" "$MIRROR" >"$rootfs.log" 2>&1 || { tail -20 "$rootfs.log" >&2; rm -f "$rootfs.log"; fail "debootstrap $SUITE failed (log above); check that $MIRROR is reachable, or set DEBIAN_MIRROR"; }
rm -f "$rootfs.log"

# The image needs no package caches, manuals or translations; apt still works (lists are fetched again).
rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/*.bin "$rootfs"/var/cache/apt/archives/*.deb \
       "$rootfs"/usr/share/doc/* "$rootfs"/usr/share/man/* "$rootfs"/usr/share/info/* "$rootfs"/usr/share/locale/* \
       "$rootfs"/var/log/*.log "$rootfs"/tmp/* "$rootfs"/debootstrap
# Keep the apt sources the host uses so `apt-get` inside the build reaches the same mirror.
printf 'deb %s %s main\ndeb %s %s-updates main\n' "$MIRROR" "$SUITE" "$MIRROR" "$SUITE" >"$rootfs/etc/apt/sources.list"

tar -C "$rootfs" --numeric-owner -c . | "${PODMAN[@]}" import --quiet \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'ENV LANG=C.UTF-8' \
  --change 'CMD ["/bin/bash"]' \
  --message "debootstrap --variant=minbase $SUITE + python3, python3-venv" \
  - "$BASE_IMAGE" >/dev/null
echo "built $BASE_IMAGE ($("${PODMAN[@]}" image inspect --format '{{.Size}}' "$BASE_IMAGE") bytes)"

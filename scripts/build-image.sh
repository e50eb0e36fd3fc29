#!/usr/bin/env bash
# Build the Prism container images with podman (no Docker daemon, no registry needed):
#   localhost/prism:latest       worker + schema registry + CLI (the Dockerfile's default target)
#   localhost/prism-lake:latest  the same plus a Java runtime for the Spark lake job (--target lake)
#
#   scripts/build-image.sh             # both (make image)
#   scripts/build-image.sh worker      # only localhost/prism:latest
#   scripts/build-image.sh lake        # only localhost/prism-lake:latest
#
# Environment:
#   BASE_IMAGE          default localhost/prism-base:bookworm, built by scripts/build-base-image.sh
#                       when missing; set docker.io/library/python:3.11-slim where a registry is reachable
#   PRISM_IMAGE         default localhost/prism:latest        PRISM_LAKE_IMAGE  default localhost/prism-lake:latest
#   PRISM_PODMAN_ARGS   podman's global flags, default "--runtime runc --cgroup-manager cgroupfs"
#                       (crun cannot set up cgroups on some hosts; runc + cgroupfs works everywhere we tried)
#   PRISM_BUILD_CA_BUNDLE  CA bundle pip trusts inside the build (a build secret, never stored in a layer);
#                       default the host's /etc/ssl/certs/ca-certificates.crt, so a TLS-inspecting proxy
#                       the host trusts is trusted by the build too
# Running as root with apt-get, missing podman/runc/debootstrap are installed (Debian packages).
set -euo pipefail
cd "$(dirname "$0")/.."

what="${1:-all}"
case "$what" in worker|lake|all) ;; *) echo "error: unknown target '$what'; fix: use worker, lake or all" >&2; exit 2;; esac

BASE_IMAGE="${BASE_IMAGE:-localhost/prism-base:bookworm}"
PRISM_IMAGE="${PRISM_IMAGE:-localhost/prism:latest}"
PRISM_LAKE_IMAGE="${PRISM_LAKE_IMAGE:-localhost/prism-lake:latest}"
read -r -a PODMAN_ARGS <<<"${PRISM_PODMAN_ARGS:---runtime runc --cgroup-manager cgroupfs}"
CA_BUNDLE="${PRISM_BUILD_CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}"

need=()
command -v podman >/dev/null || need+=(podman)
command -v runc >/dev/null || [ -x /usr/sbin/runc ] || need+=(runc)
if [ "$BASE_IMAGE" = "localhost/prism-base:bookworm" ]; then command -v debootstrap >/dev/null || [ -x /usr/sbin/debootstrap ] || need+=(debootstrap); fi
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null; then
    echo "installing ${need[*]} (Debian packages) to build the image"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null 2>&1 || {
      apt-get update -qq >/dev/null
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
    }
  else
    echo "error: ${need[*]} missing; fix: apt-get install ${need[*]} (as root), then run $0 again" >&2
    exit 2
  fi
fi
export PATH="$PATH:/usr/sbin:/sbin"

if [ "$BASE_IMAGE" = "localhost/prism-base:bookworm" ]; then
  BASE_IMAGE="$BASE_IMAGE" bash scripts/build-base-image.sh
fi

build=(podman "${PODMAN_ARGS[@]}" build --network host --build-arg "BASE_IMAGE=$BASE_IMAGE")
[ -s "$CA_BUNDLE" ] && build+=(--secret "id=ca-bundle,src=$CA_BUNDLE")

start=$SECONDS
if [ "$what" != lake ]; then
  "${build[@]}" --quiet -t "$PRISM_IMAGE" . >/dev/null
  echo "built $PRISM_IMAGE"
fi
if [ "$what" != worker ]; then
  "${build[@]}" --quiet --target lake -t "$PRISM_LAKE_IMAGE" . >/dev/null
  echo "built $PRISM_LAKE_IMAGE"
fi
echo "image build took $((SECONDS - start))s"

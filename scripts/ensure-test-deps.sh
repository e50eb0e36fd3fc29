#!/usr/bin/env bash
# System packages the integration tests need that pip cannot provide (Debian packages):
#   chromium, chromium-driver headless browser for the schema registry UI test
#   podman, runc, debootstrap  build and run the container image (tests/deploy/test_image.py)
set -euo pipefail
need=()
[ -x /usr/bin/chromium ] || need+=(chromium)
[ -x /usr/bin/chromedriver ] || need+=(chromium-driver)
command -v podman >/dev/null 2>&1 || need+=(podman)
[ -x /usr/sbin/runc ] || [ -x /usr/bin/runc ] || need+=(runc)
[ -x /usr/sbin/debootstrap ] || need+=(debootstrap)
[ ${#need[@]} -eq 0 ] && exit 0
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
  echo "installing ${need[*]} (Debian packages) for the integration tests"
  if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null 2>&1; then
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
  fi
else
  echo "missing ${need[*]}: install them (Debian/Ubuntu: apt-get install ${need[*]}); the tests that need them fail under CI=true" >&2
fi

#!/usr/bin/env bash
# System packages the integration tests need that pip cannot provide (Debian packages):
#   chromium, chromium-driver headless browser for the schema registry UI test
set -euo pipefail
need=()
[ -x /usr/bin/chromium ] || need+=(chromium)
[ -x /usr/bin/chromedriver ] || need+=(chromium-driver)
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

#!/usr/bin/env bash
# System packages the integration tests need that pip cannot provide (Debian packages):
#   chromium, chromium-driver headless browser for the schema registry UI test
#   kubectl                   its built-in kustomize renders deploy/ (tests/deploy); Debian's
#                             package where the machine has none (best effort: without it those
#                             tests skip locally and fail under CI=true, naming what is missing)
set -euo pipefail
if ! command -v kubectl >/dev/null 2>&1 && [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
  echo "installing kubectl (Debian package) for tests/deploy"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq kubectl >/dev/null 2>&1 \
    || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq kubernetes-client >/dev/null 2>&1 \
    || echo "could not install kubectl: tests/deploy need it (apt-get install kubectl)" >&2
fi
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

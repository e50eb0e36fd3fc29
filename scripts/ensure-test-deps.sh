#!/usr/bin/env bash
# System tools the integration tests need that pip cannot provide.
# kcat is an independent Kafka client: end-to-end tests use it so that no code of ours
# is on both ends of a topic.
set -euo pipefail
if ! command -v kcat >/dev/null 2>&1; then
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing kcat (Debian package) for the end-to-end tests"
    (apt-get install -y -qq kcat >/dev/null 2>&1) || (apt-get update -qq >/dev/null && apt-get install -y -qq kcat >/dev/null)
  else
    echo "kcat is missing: install it (Debian/Ubuntu: apt-get install kcat) - the end-to-end tests need it" >&2
  fi
fi

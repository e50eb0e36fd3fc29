#!/usr/bin/env bash
# kubectl for tests/deploy: its built-in kustomize renders deploy/ exactly as `kubectl apply -k`
# does. Installed from the Debian archive when missing and running as root; best effort - without
# it tests/deploy skip locally and fail under CI=true, naming what is missing.
set -uo pipefail
command -v kubectl >/dev/null 2>&1 && exit 0
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
  echo "installing kubectl (Debian package) for tests/deploy"
  for pkg in kubectl kubernetes-client; do
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$pkg" >/dev/null 2>&1 && exit 0
  done
  echo "could not install kubectl: tests/deploy need it (apt-get install kubectl)" >&2
else
  echo "missing kubectl: tests/deploy need it (apt-get install kubectl); they fail under CI=true" >&2
fi
exit 0

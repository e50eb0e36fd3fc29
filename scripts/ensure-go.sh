#!/usr/bin/env bash
# Print the path of a Go toolchain for the Go client's tests (clients/go, `make test-go`).
#
# The client needs Go 1.24 or newer (crypto/mlkem). Any Go 1.21+ on the PATH (or in
# /usr/local/go) will do: it fetches the toolchain that clients/go/go.mod names by itself
# (GOTOOLCHAIN=auto). Debian 12's golang-go is 1.19, too old for either, so on a fresh machine
# install the official release (https://go.dev/dl, e.g. go1.24.x.linux-amd64.tar.gz into
# /usr/local) - docs/sdk-go.md, "A fresh machine". The module's dependencies land in Go's
# default caches (GOMODCACHE ~/go/pkg/mod, GOCACHE ~/.cache/go-build): a second run builds
# nothing it built before.
set -euo pipefail
version_ok() {  # go1.X.Y with X >= 21 (toolchain switching)
  local v minor
  v="$("$1" env GOVERSION 2>/dev/null || true)"; v="${v#go}"
  minor="${v#1.}"; minor="${minor%%.*}"; minor="${minor%%[!0-9]*}"
  [ -n "$minor" ] && [ "$minor" -ge 21 ]
}
for cand in "$(command -v go 2>/dev/null || true)" /usr/local/go/bin/go; do
  if [ -n "$cand" ] && [ -x "$cand" ] && version_ok "$cand"; then echo "$cand"; exit 0; fi
done
echo "missing Go 1.21+ (1.24+ preferred): the Go client's tests need it. Install the release from https://go.dev/dl into /usr/local (Debian's golang-go 1.19 is too old); docs/sdk-go.md" >&2
exit 1

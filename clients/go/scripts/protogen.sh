#!/usr/bin/env bash
# Generate (or, with --check, verify) the Go types for every .proto file under proto/.
#
# The generated code is committed so that `go get` needs no protoc; `make test` runs this
# with --check so a .proto edit without regeneration fails CI, as `python -m
# app.envelope.protogen --check` does for the Python types.
#
# protoc:          the one bundled in grpcio-tools (the Python dev venv already has it), so
#                  both languages compile proto/ with the same compiler; PYTHON overrides.
# protoc-gen-go:   built from the google.golang.org/protobuf version pinned in go.mod, so
#                  the generator matches the runtime the module links against.
#
#   clients/go/scripts/protogen.sh           # regenerate clients/go/gen
#   clients/go/scripts/protogen.sh --check   # exit 1 if clients/go/gen is stale
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"       # clients/go
ROOT="$(cd "$HERE/../.." && pwd)"
PYTHON="${PYTHON:-$ROOT/.venv/bin/python}"
[ -x "$PYTHON" ] || PYTHON="$(command -v python3)"
MODULE="github.com/prism-envelope/prism/clients/go"

TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
(cd "$HERE" && go build -buildvcs=false -o "$TMP/protoc-gen-go" google.golang.org/protobuf/cmd/protoc-gen-go)

INCLUDE="$("$PYTHON" -c 'import grpc_tools, os; print(os.path.join(os.path.dirname(grpc_tools.__file__), "_proto"))')"
# The .proto files have no go_package option (they are shared with Python); the M flags
# give each file its Go import path instead.
declare -A PKG=(
  [prism/annotations.proto]=gen/annotationspb
  [prism/envelope/v1/envelope.proto]=gen/reviewedpb
  [prism/envelope/draft/envelope.proto]=gen/draftpb
)
ARGS=()
for f in "${!PKG[@]}"; do ARGS+=("--go_opt=M$f=$MODULE/${PKG[$f]}"); done
mkdir -p "$TMP/out"
(cd "$ROOT/proto" && "$PYTHON" -m grpc_tools.protoc -I. -I"$INCLUDE" \
  --plugin=protoc-gen-go="$TMP/protoc-gen-go" --go_out="$TMP/out" --go_opt=module="$MODULE" "${ARGS[@]}" \
  $(printf '%s\n' "${!PKG[@]}" | sort))
# The protoc version line depends on the grpcio-tools release installed, not on proto/:
# normalize it so that the check compares what matters.
find "$TMP/out" -name '*.pb.go' -exec sed -i 's#^// \tprotoc  .*#// \tprotoc        (grpcio-tools, scripts/protogen.sh)#' {} +

if [ "${1:-}" = "--check" ]; then
  if ! diff -r "$TMP/out/gen" "$HERE/gen" >"$TMP/diff"; then
    echo "generated Go protobuf code is stale; run clients/go/scripts/protogen.sh and commit clients/go/gen:" >&2
    head -40 "$TMP/diff" >&2
    exit 1
  fi
  echo "clients/go/gen is current"
  exit 0
fi
rm -rf "$HERE/gen"
cp -r "$TMP/out/gen" "$HERE/gen"
echo "generated clients/go/gen"

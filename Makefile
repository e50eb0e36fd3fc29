# Two commands do all the set-up on a fresh machine (see README):
#   make demo   - embedded broker + worker + demo load, prints where every message went
#   make test   - the whole test suite
#   make image  - the container images (localhost/prism, localhost/prism-lake) with podman
#   make client-wheel - the client SDK's own distribution (prism-client, import prism_client) in dist/
#   make test-go  - the Go client's tests (clients/go; needs Go 1.21+, scripts/ensure-go.sh)
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed

.PHONY: venv demo run test lint proto proto-check conformance conformance-check bench image client-wheel clean

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	@touch $(STAMP)

venv: $(STAMP)

proto: $(STAMP)
	$(BIN)/python -m app.envelope.protogen

proto-check: $(STAMP)
	$(BIN)/python -m app.envelope.protogen --check

# The shared conformance suite (conformance/README.md): regenerate, or check it is current.
conformance: $(STAMP)
	$(BIN)/python -m conformance.generate

conformance-check: $(STAMP)
	$(BIN)/python -m conformance.generate --check

demo: $(STAMP)
	$(BIN)/prism demo

run: $(STAMP)   # a try-out: throwaway keys if none exist (`prism keys init` makes a set to share)
	$(BIN)/prism run --topology topologies/orders-created.yaml --dev-keys

test: $(STAMP)
	@bash scripts/ensure-test-deps.sh
	@bash scripts/ensure-kubectl.sh
	$(BIN)/python -m app.envelope.protogen --check
	$(BIN)/python -m conformance.generate --check
	$(BIN)/python clients/rust/src/wkt/generate.py --check
	$(BIN)/ruff check app tests bench clients conformance
	$(MAKE) --no-print-directory test-go
	$(MAKE) --no-print-directory test-rust
	$(BIN)/python -m pytest -q -p no:cacheprovider $(PYTEST_ARGS)

# The Go client (docs/sdk-go.md): generated types current, vet and gofmt clean, every test
# (the conformance vectors and the fuzz seed corpus included). Go's build and module caches
# (~/.cache/go-build, ~/go/pkg/mod) make a second run take seconds.
test-go: $(STAMP)
	@if ! bash scripts/ensure-go.sh >/dev/null; then \
	  case "$$CI" in 1|true|yes) echo "CI=true: the Go client's tests need Go (see above)" >&2; exit 1 ;; esac; \
	  echo "SKIPPED the Go client's tests (clients/go): no Go toolchain; they fail under CI=true" >&2; exit 0; fi
	@GO="$$(bash scripts/ensure-go.sh)" && export PATH="$$(dirname "$$GO"):$$PATH" && \
	  PYTHON=$(abspath $(BIN))/python clients/go/scripts/protogen.sh --check && \
	  cd clients/go && go vet ./... && \
	  { unformatted="$$(gofmt -l .)"; [ -z "$$unformatted" ] || { echo "gofmt needed: $$unformatted" >&2; exit 1; }; } && \
	  go test -count=1 ./...


# The Rust client (clients/rust, docs/sdk-rust.md): formatting, clippy, then every test (the
# conformance suite, the generated-types currency check, the fuzz corpus replay). The build is
# cached in one fixed target directory, so a second run compiles only what changed.
CARGO        ?= $(shell command -v cargo 2>/dev/null || echo $(HOME)/.cargo/bin/cargo)
RUST_TARGET  ?= $(HOME)/.cache/prism/cargo-target
test-rust:
	cd clients/rust && $(CARGO) fmt --check
	cd clients/rust && CARGO_TARGET_DIR=$(RUST_TARGET) $(CARGO) clippy --locked --all-targets --all-features -q -- -D warnings
	cd clients/rust && CARGO_TARGET_DIR=$(RUST_TARGET) $(CARGO) test --locked -q

lint: $(STAMP)
	$(BIN)/ruff check app tests bench clients conformance

# Built from app/'s own files (clients/python/pyproject.toml says which); docs/sdk.md, "Installing the client".
client-wheel: $(STAMP)
	$(BIN)/python -m pip wheel --no-deps --wheel-dir dist ./clients/python

bench: $(STAMP)
	$(BIN)/python -m bench.run_all

image:
	bash scripts/build-image.sh

clean:
	rm -rf $(VENV) build dist *.egg-info

# Two commands do all the set-up on a fresh machine (see README):
#   make demo   - embedded broker + worker + demo load, prints where every message went
#   make test   - the whole test suite
#   make image  - the container images (localhost/prism, localhost/prism-lake) with podman
#   make client-wheel - the client SDK's own distribution (prism-client, import prism_client) in dist/
#   make test-go  - the Go client's tests (clients/go; needs Go 1.21+, scripts/ensure-go.sh)
#   make native   - the optional compiled hot path (prism_native, clients/rust/python; needs cargo)
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed

.PHONY: venv demo run test lint native proto proto-check conformance conformance-check bench image client-wheel clean

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
	@$(MAKE) --no-print-directory native || echo "the compiled hot path did not build: the worker runs pure Python" >&2
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
	$(MAKE) --no-print-directory native
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
# conformance suite, the generated-types currency check, the fuzz corpus replay), with every
# feature on - as clippy checks it - so the unit tests of the `kafka` feature (the subscriber's
# clearance, audit and TTL rules; they need the system librdkafka, which ensure-test-deps.sh
# installs) run too. The build is cached in one fixed target directory, so a second run
# compiles only what changed.
CARGO        ?= $(shell command -v cargo 2>/dev/null || echo $(HOME)/.cargo/bin/cargo)
RUST_TARGET  ?= $(HOME)/.cache/prism/cargo-target
test-rust:
	cd clients/rust && $(CARGO) fmt --check
	cd clients/rust && CARGO_TARGET_DIR=$(RUST_TARGET) $(CARGO) clippy --locked --all-targets --all-features -q -- -D warnings
	cd clients/rust && CARGO_TARGET_DIR=$(RUST_TARGET) $(CARGO) test --locked -q --all-features

# The worker's optional compiled hot path (app/native.py, docs/operations.md "Compiled hot
# path"): a PyO3 module built from clients/rust's prism-client by maturin, installed into the
# venv. Rebuilt only when the crates' sources change (its own stamp; $(STAMP) does not depend on
# it). Without cargo it is skipped and the worker runs pure Python - except under CI=true, where
# tests/envelope/test_wire_native.py must run, so a missing toolchain fails here.
NATIVE_SRC   := $(wildcard clients/rust/src/*.rs clients/rust/python/src/*.rs) clients/rust/Cargo.toml \
                clients/rust/python/Cargo.toml clients/rust/python/Cargo.lock clients/rust/python/pyproject.toml
NATIVE_STAMP := $(VENV)/.native-installed
native:
	@if ! command -v $(CARGO) >/dev/null 2>&1; then \
	  case "$$CI" in 1|true|yes) echo "CI=true: the compiled hot path needs cargo (https://rustup.rs)" >&2; exit 1 ;; esac; \
	  echo "SKIPPED the compiled hot path (prism_native): no cargo; the worker runs pure Python" >&2; exit 0; fi
	@test -x $(BIN)/python || { echo "no venv yet: run make venv first" >&2; exit 1; }
	@$(MAKE) --no-print-directory $(NATIVE_STAMP)

$(NATIVE_STAMP): $(NATIVE_SRC)
	@test -x $(BIN)/maturin || $(BIN)/python -m pip install -q 'maturin>=1.5,<2'
	rm -rf build/native-wheels
	PATH="$$(dirname $(CARGO)):$$PATH" CARGO_TARGET_DIR=$(RUST_TARGET) $(BIN)/maturin build --release --locked -q \
	  -m clients/rust/python/Cargo.toml -o build/native-wheels -i $(BIN)/python
	$(BIN)/python -m pip install -q --force-reinstall --no-deps build/native-wheels/prism_native-*.whl
	@touch $(NATIVE_STAMP)

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

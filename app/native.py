"""The one place that chooses between the compiled hot path and pure Python (issue 29).

`prism_native` is a thin PyO3 binding over the Rust client's crate (`clients/rust/python/`,
built by `make native` where cargo is installed). It is optional: without it, or with
`PRISM_NATIVE=0`, every function is the pure-Python one it replaces, and the outputs are the
same bytes either way (tests/envelope/test_wire_native.py runs both on the conformance vectors,
generated and hostile inputs). The choice is made once, at import, and reported by `status()`
(the worker logs it at start-up and shows it under `native` in `/healthz`).

What is compiled so far: `wire.scan`, the top-level record walk that normalize, verify_signature
and the codec run several times per message; `signing._security_record`, the security
record's ambiguity checks every signature check and `check_unambiguous` start with; and the
rest of the signature check's bytes work - `signing._message_parts`, the signed message of
every scope (the re-framed security record, the pair and batch statements' digests, the
Merkle path), and for HMAC signatures of scope v2 and legacy the MAC itself in the same call
(`signing._check_mac`); and the publisher's copies of every message in both layouts,
`signing._pair_copies` (the `.v2` head with `layouts.draft_metadata`'s conversion done on the
serialized `.v3` metadata, the draft security context, both copies' pair/batch digests, in one
call from the reviewed header's bytes; headers the shortcut does not convert take the Python
path; the same call reads the Kafka binding's metadata and `traceparent` headers from those
bytes, `PreparedMessage.headers`) (BENCHMARKS.md, "Compiled hot path", "The `.v2` copy from the
`.v3` bytes" and "prepare's headers compiled"); the
batch signature's last step, `signing.finish_batch` (the Merkle tree, the root signed once
through a callback, and each copy's batch fields spliced into the prepared security context's
bytes, one call per batch; BENCHMARKS.md, "finish_batch's per-copy writes compiled"); and the
enrich stage's check of a JSON payload against a protobuf schema, one-sided
(`payload_check._compiled_fits`, `prism_native.DocPlan`, prism-client's `json_fit`): one call
reads the bytes against the plan the Python fast path walks and says True only for documents
`json_format.Parse` certainly accepts; on False the Python validator runs as before, so every
violation keeps its text (BENCHMARKS.md, "The payload check compiled"); and Kafka's key hash,
`murmur2` (prism-client's `partition::murmur2`, the Java client's), with which the worker places
its keyed output records (`app/bindings/partitioner.py`; aiokafka's pure-Python hash otherwise);
and the output records' Kafka v2 record batches, `record_batch` and `seal_batch` (prism-client's
`record_batch`: the bytes aiokafka's `DefaultRecordBatchBuilder` writes, one call per batch instead
of a Python builder call per record; `app/worker/batch_send.py`; aiokafka's builder otherwise).

The native module reports a walk that stopped as `WireFault(kind, at, field, wire_type, length,
remaining)`; `scan_fault` words it as the very `PrismError` (class, message, path, hint) the
Python walker raises, so callers cannot tell the two apart.
"""

from __future__ import annotations

import os
from types import ModuleType
from typing import Any

from .errors import DecodeError, LengthError, PrismError, TruncatedError, WireTypeError

#: The binding's contract version this code was written for (`prism_native.ABI`).
ABI = 11
ENV = "PRISM_NATIVE"


def _load() -> tuple[ModuleType | None, str]:
    setting = os.environ.get(ENV, "").strip().lower()
    if setting in ("0", "false", "no", "off"):
        return None, f"off ({ENV}={setting})"
    try:
        import prism_native  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        return None, "not installed (pure Python; `make native` builds it where cargo is installed)"
    abi = getattr(prism_native, "ABI", None)
    if abi != ABI:
        return None, f"prism_native ABI {abi} is not {ABI} (a stale build: run `make native`); pure Python"
    return prism_native, f"prism_native {getattr(prism_native, '__version__', '?')} (ABI {abi})"


module, reason = _load()
#: True when the compiled functions are in use.
ACTIVE = module is not None


def status() -> dict[str, Any]:
    """What `/healthz` and the start-up log say about the hot path."""
    return {"active": ACTIVE, "detail": reason}


_CUT = "the message was truncated or corrupted in transit"


def scan_fault(args: tuple[Any, ...]) -> PrismError:
    """The `PrismError` `app.envelope.wire.scan` raises for the fault the native walk reported."""
    kind, at, field, wire_type, length, remaining = args
    where = f"byte {at}"
    if kind == "varint_past_end":
        return TruncatedError("varint runs past the end of the input", path=where)
    if kind == "varint_too_long":
        return LengthError("varint longer than 10 bytes", path=where)
    if kind == "invalid_field":
        return WireTypeError(f"invalid field number {field}", path=where)
    if kind == "length_past_end":
        return LengthError(f"field {field} claims {length} bytes but only {remaining} remain", path=where, hint=_CUT)
    if kind == "fixed_past_end":
        return TruncatedError(f"fixed-width field {field} runs past the end", path=where)
    if kind == "bad_wire_type":
        return WireTypeError(
            f"wire type {wire_type} (group or invalid) for field {field} is not supported at the envelope's top level",
            path=where)
    return DecodeError(f"the compiled record walk failed ({kind})", path=where,
                       hint=f"set {ENV}=0 to use the pure-Python walk, and report this input")

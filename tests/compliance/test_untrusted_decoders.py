"""Every decoder of bytes Prism did not write, held to one rule: a value or a `PrismError`.

Issue 28 ("hard by construction"): whatever a producer, a DLQ record, a replay ledger, an audit
record or an attestation holds, each decoder below answers with a value or raises an error of
the project's own hierarchy - never `RecursionError`, `ValueError`, `KeyError`, `IndexError`
or a crash. The inputs are generated: random bytes, and single-byte damage, truncation and
splicing of the conformance suite's genuine envelopes and LNMP records (so the decoders get past
their first check), with bounded example counts so `make test` stays fast.

One table, so a new decoder is one line here (and a reviewer sees which ones are covered).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.errors import PrismError

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@cache
def _genuine() -> list[bytes]:
    """Valid inputs from the conformance suite: envelopes of both layouts and LNMP records."""
    out: list[bytes] = []
    for path in sorted((ROOT / "conformance").rglob("*.json")):
        if path.name == "manifest.json":
            continue
        doc = json.loads(path.read_text())
        for vec in doc.get("vectors", []) if isinstance(doc, dict) else []:
            for key in ("envelope_hex", "wire_hex", "input_hex", "bytes_hex", "data_hex"):
                raw = vec.get(key) if isinstance(vec, dict) else None
                if isinstance(raw, str):
                    with contextlib.suppress(ValueError):
                        out.append(bytes.fromhex(raw))
    assert len(out) > 50, "the conformance suite should give the property tests real inputs"
    return out


@st.composite
def hostile(draw: st.DrawFn) -> bytes:
    """Random bytes, or a genuine input damaged: a byte changed, cut short, or two spliced."""
    kind = draw(st.sampled_from(["random", "flip", "truncate", "splice", "deep", "digits"]))
    if kind == "random":
        return draw(st.binary(max_size=2048))
    if kind == "digits":  # a number int() refuses (over 4,300 digits), where a decoder reads one
        base = draw(st.sampled_from(_genuine()))
        at = draw(st.integers(0, len(base)))
        key = draw(st.sampled_from([b"", b"timestamp=", b"sequence=", b'"time": ', b"F1=", b"1"]))
        return base[:at] + key + b"9" * draw(st.integers(4_301, 6_000)) + base[at:]
    if kind == "deep":  # nested JSON deeper than any recursive parser survives
        depth = draw(st.integers(1_000, 50_000))
        return b"[" * depth + b"]" * draw(st.integers(0, depth))
    base = draw(st.sampled_from(_genuine()))
    if kind == "flip" and base:
        i = draw(st.integers(0, len(base) - 1))
        return base[:i] + bytes([draw(st.integers(0, 255))]) + base[i + 1:]
    if kind == "truncate":
        return base[:draw(st.integers(0, len(base)))]
    other = draw(st.sampled_from(_genuine()))
    return base[:draw(st.integers(0, len(base)))] + other[draw(st.integers(0, len(other))):]


def _normalize(data: bytes) -> Any:
    from app.formats.detect import normalize

    return normalize(data, [("content-type", b"application/cloudevents+json"), ("ce_id", b"x")] if data[:1] == b"{"
                     else None, topic="t", namespace="ns")


def _normalize_headers(data: bytes) -> Any:
    """The same bytes as a CloudEvent in binary mode, an LNMP record and legacy headers."""
    from app.formats.detect import normalize

    headers = [("ce_specversion", b"1.0"), ("ce_id", data[:40]), ("ce_source", data[40:80]), ("ce_type", b"t"),
               ("X-Publisher-Id", data[:20]), ("traceparent", data[:55]), ("lnmp-envelope", data[:64])]
    return normalize(data, headers, topic="t", namespace="ns")


def _decode(data: bytes) -> Any:
    from app.envelope import decode

    env = decode(data)
    env.payload_bytes()
    return env


def _verify_and_decode(data: bytes) -> Any:
    from app.security.signing import VerificationKeys, verify_and_decode

    return verify_and_decode(data, VerificationKeys({}))


def _record_walk(data: bytes) -> Any:
    from app.envelope.wire import scan  # compiled when prism_native is installed (app/native.py)

    return scan(data), scan(memoryview(data), len(data) // 3, len(data) // 2)


def _check_unambiguous(data: bytes) -> Any:
    from app.envelope import Layout
    from app.security.signing import check_unambiguous  # its security-record check is compiled too

    for layout in Layout:
        with contextlib.suppress(PrismError):
            check_unambiguous(data, layout=layout)
    return check_unambiguous(data)


def _signed_message(data: bytes) -> Any:
    from app.envelope import Layout
    from app.security.signing import SigningKey, VerificationKeys, signed_message, verify

    # the signed message and the HMAC check are compiled when prism_native is installed
    keys = VerificationKeys.of([SigningKey.hmac_sha256("k", b"k" * 32)], accept_legacy_scope=True)
    for layout in Layout:
        with contextlib.suppress(PrismError):
            signed_message(data, layout=layout)
        with contextlib.suppress(PrismError):
            verify(data, keys, layout=layout)
    return signed_message(data)


def _detect_layout(data: bytes) -> Any:
    from app.envelope import Limits, detect_layout

    with contextlib.suppress(PrismError):
        detect_layout(data, limits=Limits(max_header_bytes=len(data) // 4))  # the limit hit mid-walk
    return detect_layout(data)


def _kafka_record(data: bytes) -> Any:
    from app.bindings.kafka import decode

    class Rec:
        value, key = data, data[:8]
        headers = [("prism-envelope-layout", data[:8]), ("prism-message-id", data[8:40]),
                   ("traceparent", data[:55])]

    return decode(Rec())


def _lnmp_container(data: bytes) -> Any:
    from app.formats.lnmp import decode_container

    return decode_container(data, strict=False)


def _lnmp_text(data: bytes) -> Any:
    from app.formats.lnmp import decode_text

    return decode_text(b"#ENVELOPE " + data, strict=True)


def _dlq_context(data: bytes) -> Any:
    from app.agents.dlq import error_context

    return error_context([("prism.errors.reason", data[:30]), ("prism.errors.offset", data[30:50]),
                          ("prism.errors.exception", data)])


def _attestation(data: bytes) -> Any:
    from app.security.attestation import describe

    return describe(data)


DECODERS: dict[str, Callable[[bytes], Any]] = {
    "normalize (value; JSON as a structured CloudEvent)": _normalize,
    "normalize (CloudEvent binary mode, legacy and LNMP headers)": _normalize_headers,
    "envelope decode, both layouts, payload read": _decode,
    "verify_and_decode": _verify_and_decode,
    "top-level record walk (wire.scan, compiled or not)": _record_walk,
    "signature ambiguity check, both layouts (compiled or not)": _check_unambiguous,
    "signed message and HMAC check, both layouts (compiled or not)": _signed_message,
    "envelope layout detection (detect_layout)": _detect_layout,
    "Kafka binding decode (value + prism-* headers)": _kafka_record,
    "LNMP binary container": _lnmp_container,
    "LNMP #ENVELOPE text": _lnmp_text,
    "DLQ record error context": _dlq_context,
    "DLQ attestation (display)": _attestation,
}


@pytest.mark.parametrize("name", sorted(DECODERS))
@EXAMPLES
@given(data=hostile())
def test_a_value_or_a_prism_error(name: str, data: bytes) -> None:
    with contextlib.suppress(PrismError):
        DECODERS[name](data)

"""`required_problems` asks protobuf whether a field is set only where a value cannot answer
(normalize runs it on every input). Against `_reference` - the function as it was, one
presence test per context and field - it must give the same problems, in the same order, with
the same texts: on generated headers where every context and every checked field is absent,
set to its empty value, or set to a valid or an invalid one, and on headers decoded from
arbitrary bytes (so presence also comes from the wire: empty records, zero values)."""

from __future__ import annotations

import re

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app._gen.prism.envelope.v1 import envelope_pb2 as vpb
from app.envelope.model import Envelope, Payload
from app.envelope.validation import CLASSIFICATIONS, required_problems
from app.errors import FieldProblem

_HEX32 = re.compile(r"[0-9a-f]{32}")
_HEX16 = re.compile(r"[0-9a-f]{16}")


def _reference(env: Envelope) -> list[FieldProblem]:
    """`required_problems` before the presence tests were cut (kept verbatim)."""
    p: list[FieldProblem] = []
    h = env.header
    if not h.HasField("metadata"):
        p.append(FieldProblem("metadata", "is required but absent"))
    md = h.metadata
    if not md.message_id:
        p.append(FieldProblem("metadata.message_id", "is required (a UUIDv7 string)"))
    if not md.topic:
        p.append(FieldProblem("metadata.topic", "is required"))
    if not md.namespace:
        p.append(FieldProblem("metadata.namespace", "is required"))
    if md.published_at_ms <= 0:
        p.append(FieldProblem("metadata.published_at_ms", "is required (Unix epoch milliseconds > 0)"))
    if md.HasField("priority") and not 0 <= md.priority <= 10:
        p.append(FieldProblem("metadata.priority", f"must be 0-10, got {md.priority}"))
    if md.ttl_seconds < 0:
        p.append(FieldProblem("metadata.ttl_seconds", f"must be >= 0, got {md.ttl_seconds}"))
    if not env.payload.present:
        p.append(FieldProblem("payload", "is required but absent"))
    if h.HasField("security"):
        sec = h.security
        if sec.HasField("data_classification") and sec.data_classification not in CLASSIFICATIONS:
            p.append(FieldProblem("security.data_classification",
                                  f"must be one of {sorted(CLASSIFICATIONS)}, got {sec.data_classification!r}"))
        if sec.HasField("signature") and not sec.signature_algorithm:
            p.append(FieldProblem("security.signature_algorithm", "is required when a signature is present"))
        if sec.HasField("encryption"):
            enc = sec.encryption
            if not enc.key_id:
                p.append(FieldProblem("security.encryption.key_id", "is required for an encrypted payload"))
            if not enc.algorithm:
                p.append(FieldProblem("security.encryption.algorithm", "is required for an encrypted payload"))
    if h.HasField("observability"):
        obs = h.observability
        if obs.trace_id and not _HEX32.fullmatch(obs.trace_id):
            p.append(FieldProblem("observability.trace_id", "must be 32 lowercase hex characters (W3C)"))
        if obs.span_id and not _HEX16.fullmatch(obs.span_id):
            p.append(FieldProblem("observability.span_id", "must be 16 lowercase hex characters (W3C)"))
        if obs.parent_span_id and not _HEX16.fullmatch(obs.parent_span_id):
            p.append(FieldProblem("observability.parent_span_id", "must be 16 lowercase hex characters (W3C)"))
    return p


def _same(env: Envelope) -> list[FieldProblem]:
    before = env.header.SerializeToString()
    expected = _reference(env)
    got = required_problems(env)
    assert [(x.path, x.problem) for x in got] == [(x.path, x.problem) for x in expected]
    assert env.header.SerializeToString() == before  # reading never set a context
    return got


_ABSENT = object()
_TEXT = st.one_of(st.just(_ABSENT), st.just(""), st.text(max_size=6))
_CLASS = st.one_of(st.just(_ABSENT), st.just(""), st.sampled_from(sorted(CLASSIFICATIONS)), st.text(max_size=12))
_INT = st.one_of(st.just(_ABSENT), st.just(0), st.integers(-(2**31), 2**31 - 1), st.integers(-3, 13))


def _set(msg: object, name: str, value: object) -> None:
    if value is not _ABSENT:
        setattr(msg, name, value)


@settings(max_examples=3000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.fixed_dictionaries({
    "metadata": st.booleans(), "message_id": _TEXT, "topic": _TEXT, "namespace": _TEXT,
    "published_at_ms": _INT, "priority": _INT, "ttl_seconds": _INT,
    "payload": st.booleans(),
    "security": st.booleans(), "data_classification": _CLASS,
    "signature": st.one_of(st.just(_ABSENT), st.binary(max_size=3)), "signature_algorithm": _TEXT,
    "encryption": st.booleans(), "key_id": _TEXT, "algorithm": _TEXT,
    "observability": st.booleans(), "trace_id": st.one_of(_TEXT, st.just("0" * 32)),
}))
def test_generated_headers_give_the_same_problems(f: dict) -> None:
    h = vpb.PrismEnvelope()
    if f["metadata"]:
        h.metadata.SetInParent()
        for name in ("message_id", "topic", "namespace", "published_at_ms", "priority", "ttl_seconds"):
            _set(h.metadata, name, f[name])
    if f["security"]:
        h.security.SetInParent()
        for name in ("data_classification", "signature", "signature_algorithm"):
            _set(h.security, name, f[name])
        if f["encryption"]:
            h.security.encryption.SetInParent()
            _set(h.security.encryption, "key_id", f["key_id"])
            _set(h.security.encryption, "algorithm", f["algorithm"])
    if f["observability"]:
        h.observability.SetInParent()
        _set(h.observability, "trace_id", f["trace_id"])
    _same(Envelope(h, Payload(b"x") if f["payload"] else Payload.absent()))


@settings(max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=80))
def test_headers_from_arbitrary_bytes_give_the_same_problems(data: bytes) -> None:
    try:
        h = vpb.PrismEnvelope.FromString(data)
    except Exception:
        return  # not a header: nothing reaches required_problems
    _same(Envelope(h, Payload.absent()))


def test_the_presence_only_cases() -> None:
    """Each field whose problem depends on presence alone, set to its empty value."""
    h = vpb.PrismEnvelope()
    h.metadata.priority = 0
    h.security.data_classification = ""
    h.security.signature = b""
    got = _same(Envelope(h, Payload(b"x")))
    assert "security.data_classification" in [x.path for x in got]
    assert "security.signature_algorithm" in [x.path for x in got]
    assert "metadata" not in [x.path for x in got] and "metadata.priority" not in [x.path for x in got]
    assert [x.path for x in _same(Envelope(vpb.PrismEnvelope(), Payload.absent()))][:2] == [
        "metadata", "metadata.message_id"]

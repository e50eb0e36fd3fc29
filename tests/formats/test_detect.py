"""Shape detection precedence and normalize() (app.formats.detect)."""

from __future__ import annotations

import json
import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.envelope import Layout, decode, encode, new_envelope, validate
from app.envelope.codec import Limits
from app.envelope.validation import required_problems
from app.errors import (
    CloudEventError,
    EnvelopeError,
    FormatError,
    LegacyFormatError,
    LnmpError,
    PrismError,
    PrismShapeError,
    SizeLimitError,
)
from app.formats import cloudevents as ce
from app.formats import legacy, lnmp
from app.formats import lnmp_envelope as le
from app.formats.detect import InputShape, detect, normalize
from tests.strategies import envelopes

S = InputShape
NOW = 1_700_000_000_000
ENV = new_envelope("orders.created", {"id": 1}, namespace="orders", published_at_ms=NOW - 5)
REVIEWED, DRAFT = encode(ENV), encode(ENV, Layout.DRAFT)
CE_BIN = ce.to_kafka_binary(ENV)
CE_STRUCT = ce.to_kafka_structured(ENV)
LNMP_BIN = lnmp.encode_container(lnmp.Container(record=b"F1=1", envelope=lnmp.LnmpEnvelope(sequence=1)))
LNMP_TXT = b"#ENVELOPE sequence=1\nF1=1"
REDIS = b'{"meta":{"ts":1697200000},"payload":{"a":1}}'
KAFKA_H = [("correlation-id", b"c-1"), ("schema-id", b"7")]
NATS_H = [("Nats-Msg-Id", b"n-1")]


@pytest.mark.parametrize(("value", "headers", "shape"), [
    (CE_STRUCT.value, CE_STRUCT.headers, S.CLOUDEVENT_STRUCTURED),
    (CE_BIN.value, CE_BIN.headers, S.CLOUDEVENT_BINARY),
    (REVIEWED, None, S.PRISM_REVIEWED),
    (DRAFT, None, S.PRISM_DRAFT),
    (LNMP_BIN, None, S.LNMP_BINARY),
    (LNMP_TXT, None, S.LNMP_TEXT),
    (b"F12=14532\nF7=1", None, S.LNMP_TEXT),
    (b"payload", NATS_H, S.NATS_HEADERS),
    (b"payload", KAFKA_H, S.KAFKA_HEADERS),
    (REDIS, None, S.REDIS_JSON),
    (b"\x00\x01\x02", None, S.RAW),
    (b"", None, S.RAW),
    (b'{"a": 1}', None, S.RAW),
    (b"hello world", [("content-type", b"text/plain")], S.RAW),
])
def test_each_shape(value: bytes, headers: list | None, shape: InputShape) -> None:
    assert detect(value, headers) is shape


@pytest.mark.parametrize(("value", "headers", "shape", "why"), [
    (REVIEWED, CE_BIN.headers, S.CLOUDEVENT_BINARY, "a CloudEvent may carry an envelope as its data"),
    (CE_STRUCT.value, [*CE_STRUCT.headers, ("ce_id", b"x")], S.CLOUDEVENT_STRUCTURED, "content type decides the mode"),
    (REVIEWED, KAFKA_H, S.PRISM_REVIEWED, "a valid envelope beats legacy headers"),
    (LNMP_BIN, KAFKA_H, S.LNMP_BINARY, "an LNMP container beats legacy headers"),
    (REDIS, KAFKA_H, S.KAFKA_HEADERS, "header shapes beat value sniffing"),
    (b"p", [*KAFKA_H, *NATS_H], S.NATS_HEADERS, "NATS before Kafka"),
    (b"F1=1", [("lnmp.sequence", b"1")], S.LNMP_TEXT, "LNMP transport headers"),
    (b"\xff\x00", [("X-LNMP-Source", b"s")], S.LNMP_BINARY, "non-text with LNMP headers"),
    (b"garbage", [("prism-message-id", b"m")], S.PRISM_REVIEWED, "prism-* headers claim an envelope"),
    (b"x", [("prism-auth-token", b"t")], S.RAW, "a token header alone claims nothing"),
])
def test_precedence(value: bytes, headers: list, shape: InputShape, why: str) -> None:
    assert detect(value, headers) is shape, why


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=300))
def test_random_bytes_are_never_an_envelope(data: bytes) -> None:
    assert detect(data) not in (S.PRISM_REVIEWED, S.PRISM_DRAFT)


_json = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=10),
                     lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=6), kids, max_size=3),
                     max_leaves=8)


@settings(max_examples=300, deadline=None)
@given(st.one_of(_json.map(lambda v: json.dumps(v).encode()), st.text(max_size=200).map(str.encode)))
def test_json_and_text_are_never_an_envelope(data: bytes) -> None:
    assert detect(data) not in (S.PRISM_REVIEWED, S.PRISM_DRAFT)


@settings(max_examples=300, deadline=None)
@given(pos=st.integers(0, len(REVIEWED) - 1), byte=st.integers(0, 255), cut=st.booleans())
def test_damaged_envelopes_are_detected_only_when_still_valid(pos: int, byte: int, cut: bool) -> None:
    """A damaged envelope is either still valid, or rejected as a broken Prism envelope (when
    its leading metadata block survived), or not an envelope at all - never half-accepted."""
    data = REVIEWED[:pos] if cut else REVIEWED[:pos] + bytes([byte]) + REVIEWED[pos + 1 :]
    shape = detect(data)
    if shape in (S.PRISM_REVIEWED, S.PRISM_DRAFT):
        try:
            env = normalize(data, topic="t", namespace="n").envelope
        except PrismShapeError:
            return  # broken envelope: rejected with a precise error (and so sent to the DLQ)
        if required_problems(env):
            return  # decodes but incomplete: the validate stage rejects it
        validate(env)
    else:
        with pytest.raises(EnvelopeError):  # not detected => it really is not one
            validate(decode(data))


def test_prism_envelope_is_kept_as_is() -> None:
    r = normalize(DRAFT, topic="ignored", namespace="ignored", now_ms=NOW)
    assert r.shape is S.PRISM_DRAFT and r.envelope == ENV and r.notes == []


def test_prism_headers_with_garbage_or_disagreeing() -> None:
    with pytest.raises(PrismShapeError, match="does not decode"):
        normalize(b"\xff\xff\xff", [("prism-message-id", b"x")], topic="t", namespace="n")
    with pytest.raises(PrismShapeError, match="prism-message-id disagrees"):
        normalize(REVIEWED, [("prism-message-id", b"someone-else")], topic="t", namespace="n")
    r = normalize(REVIEWED, [("Prism-Message-ID", ENV.message_id.encode())], topic="t", namespace="n")
    assert r.envelope == ENV


def test_producer_values_are_kept_and_missing_ones_generated() -> None:
    r = normalize(b"x", [("message-id", b"m-7"), ("timestamp", b"1697200000123"),
                         ("traceparent", b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")],
                  topic="t", namespace="n", now_ms=NOW)
    env = r.envelope
    assert (env.message_id, env.published_at_ms, env.observability.trace_id) == (
        "m-7", 1697200000123, "4bf92f3577b34da6a3ce929d0e0e4736")
    r = normalize(b"x", topic="t", namespace="n", now_ms=NOW, default_content_type="application/octet-stream")
    assert uuid.UUID(r.envelope.message_id).version == 7
    assert r.envelope.published_at_ms == NOW and r.envelope.content_type == "application/octet-stream"
    assert (r.envelope.topic, r.envelope.namespace) == ("t", "n") and len(r.notes) == 2


TOKEN = "tok-8c1f0b6a-planted"


def _token_cases() -> list[tuple[str, bytes, list]]:
    auth = ("Authorization", f"Bearer {TOKEN}".encode())
    return [
        ("raw", b"\x00", [auth]),
        ("kafka", b"x", [*KAFKA_H, auth]),
        ("nats", b"x", [*NATS_H, ("prism-auth-token", TOKEN.encode())]),
        ("redis", json.dumps({"meta": {"auth_token": TOKEN}, "payload": 1}).encode(), []),
        ("ce-binary", CE_BIN.value, [*CE_BIN.headers, auth]),
        ("ce-structured", CE_STRUCT.value, [*CE_STRUCT.headers, auth]),
        ("lnmp", LNMP_TXT, [auth]),
        ("prism", REVIEWED, [("prism-auth-token", TOKEN.encode())]),
    ]


@pytest.mark.parametrize(("name", "value", "headers"), _token_cases())
def test_auth_token_lands_in_security_only(name: str, value: bytes, headers: list) -> None:
    r = normalize(value, headers, topic="t", namespace="n", now_ms=NOW)
    env = r.envelope
    assert env.security is not None and env.security.auth_token == TOKEN, name
    stripped = env.copy()
    stripped.header.security.ClearField("auth_token")
    assert TOKEN.encode() not in encode(stripped), name
    assert TOKEN not in " ".join(r.notes) and TOKEN not in repr(env), name


@pytest.mark.parametrize(("value", "headers", "error"), [
    (b'{"meta":[],"payload":1}', None, LegacyFormatError),
    (b"x", [("priority", b"99")], LegacyFormatError),
    (b"x", [("ce_id", b"1")], CloudEventError),
    (b"{", [("content-type", b"application/cloudevents+json")], CloudEventError),
    (b"LNMP\x01\x02\x80\x00\x00\x00\x00\x03\x10\x00", None, LnmpError),
    (b"#ENVELOPE timestamp=soon\nF1=1", None, LnmpError),
])
def test_malformed_input_raises_format_errors(value: bytes, headers: list | None, error: type) -> None:
    with pytest.raises(error) as info:
        normalize(value, headers, topic="t", namespace="n")
    assert isinstance(info.value, FormatError) and str(info.value)


def test_missing_topic_is_reported() -> None:
    with pytest.raises(LegacyFormatError, match=r"metadata\.topic"):
        normalize(b"x", topic="", namespace="n")


def test_size_limit_is_checked_first() -> None:
    with pytest.raises(SizeLimitError):
        normalize(b"x" * 100, topic="t", namespace="n", limits=Limits(max_message_bytes=10))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(env=envelopes(), layout=st.sampled_from(list(Layout)))
def test_normalize_round_trip_prism(env: object, layout: Layout) -> None:
    r = normalize(encode(env, layout), topic="other", namespace="other")
    assert r.shape.value == f"prism-{layout.value}"
    assert encode(r.envelope) == encode(decode(encode(env, layout)))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(env=envelopes(), structured=st.booleans())
def test_normalize_round_trip_cloudevents(env: object, structured: bool) -> None:
    rec = ce.to_kafka_structured(env) if structured else ce.to_kafka_binary(env)
    r = normalize(rec.value, rec.headers, topic=env.topic, namespace=env.namespace, key=rec.key)
    assert r.envelope == env


@settings(max_examples=100, deadline=None)
@given(payload=st.binary(max_size=128), ct=st.none() | st.sampled_from(["application/json", "text/plain"]),
       corr=st.none() | st.text(min_size=1, max_size=10))
def test_normalize_round_trip_redis(payload: bytes, ct: str | None, corr: str | None) -> None:
    env = new_envelope("t", payload, namespace="n", content_type=ct, correlation_id=corr, published_at_ms=NOW)
    r = normalize(legacy.to_redis_json(env), topic="t", namespace="n")
    assert r.shape is S.REDIS_JSON and r.envelope == env


@settings(max_examples=100, deadline=None)
@given(payload=st.binary(max_size=128), text=st.booleans(), seq=st.integers(0, 2**64 - 1))
def test_normalize_round_trip_lnmp(payload: bytes, text: bool, seq: int) -> None:
    env = new_envelope("t", payload, namespace="n", published_at_ms=NOW,
                       content_type="text/lnmp" if text else "application/lnmp",
                       extensions={le.EXT_SEQUENCE: seq.to_bytes(8, "big")})
    wire = le.to_lnmp(env)
    r = normalize(wire, topic="t", namespace="n")
    assert r.shape is (S.LNMP_TEXT if text else S.LNMP_BINARY)
    assert r.envelope.metadata.published_at_ms == NOW and le.sequence_of(r.envelope) == seq
    assert bytes(r.envelope.payload.value) == payload and r.envelope.content_type == env.content_type


@settings(max_examples=200, deadline=None)
@given(value=st.binary(max_size=64), names=st.lists(st.sampled_from(
    ["correlation-id", "nats-msg-id", "content-type", "x-other", "traceparent", "ce_id"]), max_size=3))
def test_payload_bytes_are_never_changed(value: bytes, names: list[str]) -> None:
    headers = [(n, b"v") for n in names]
    try:
        r = normalize(value, headers, topic="t", namespace="n", now_ms=NOW)
    except FormatError:
        return
    if r.shape in (S.RAW, S.KAFKA_HEADERS, S.NATS_HEADERS, S.CLOUDEVENT_BINARY):
        assert bytes(r.envelope.payload.value) == value


_names = st.sampled_from([
    "ce_specversion", "ce_id", "ce_source", "ce_type", "ce_time", "ce_traceparent", "ce_prismpriority",
    "ce_prismextensions", "ce_dataclassification", "content-type", "prism-message-id", "prism-envelope-layout",
    "lnmp.timestamp", "X-LNMP-Sequence", "lnmp-trace-id", "Nats-Msg-Id", "X-Timestamp", "timestamp", "priority",
    "traceparent", "baggage", "Authorization", "correlation-id", "x-anything",
])
_values = st.one_of(st.binary(max_size=24), st.sampled_from([
    b"1.0", b"application/cloudevents+json", b"application/json", b"text/lnmp", b"1697200000", b"5",
    b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", b"reviewed", b'{"a":"AA=="}', b"public",
]))
_bodies = st.one_of(
    st.binary(max_size=200),
    st.sampled_from([REVIEWED, DRAFT, CE_STRUCT.value, LNMP_BIN, LNMP_TXT, REDIS]).flatmap(
        lambda b: st.tuples(st.integers(0, len(b)), st.binary(max_size=3)).map(lambda c: b[: c[0]] + c[1] + b[c[0]:])),
)


@settings(max_examples=500, deadline=None)
@given(value=_bodies, headers=st.lists(st.tuples(_names, _values), max_size=5), strict=st.booleans())
def test_any_input_yields_an_envelope_or_a_documented_error(value: bytes, headers: list, strict: bool) -> None:
    shape = detect(value, headers)  # never raises
    try:
        r = normalize(value, headers, topic="t", namespace="n", strict=strict)
    except PrismError as exc:
        assert str(exc)
        return
    assert r.shape is shape
    if shape not in (S.PRISM_REVIEWED, S.PRISM_DRAFT):  # a Prism envelope is passed on unpatched
        validate(r.envelope)


def test_incomplete_prism_envelope_is_passed_on_unpatched() -> None:
    """prism-* headers on an envelope missing required fields: normalize does not invent them;
    the validate stage reports every problem (ValidationError) and routes it to the DLQ."""
    r = normalize(b"\x08\x01", [("prism-envelope-version", b"1")], topic="t", namespace="n")
    assert r.shape is S.PRISM_DRAFT and r.envelope.message_id == "" and not r.envelope.payload.present


# --------------------------------------------------------------------------- decided edge cases
# (docs/formats.md, "Broken envelopes and LNMP-looking text")


@pytest.mark.parametrize("layout", [Layout.REVIEWED, Layout.DRAFT])
def test_an_envelope_with_a_string_that_is_not_utf8_is_refused_not_raw(layout: Layout) -> None:
    """A namespace of broken UTF-8 made the metadata block fail to parse, so the envelope was
    forwarded as an opaque raw payload - token and all. It is a broken envelope: refused."""
    raw = encode(new_envelope("orders.created", {"a": 1}, namespace="order-events"), layout)
    bad = raw.replace(b"order-events", b"order-\xff\xfeents")  # same length: only the bytes are wrong
    assert len(bad) == len(raw)
    assert detect(bad) is (InputShape.PRISM_REVIEWED if layout is Layout.REVIEWED else InputShape.PRISM_DRAFT)
    with pytest.raises(PrismShapeError, match="bad UTF-8") as info:
        normalize(bad, [], topic="orders.created", namespace="order-events")
    assert info.value.path == "value" and "re-send the complete envelope" in (info.value.hint or "")


def test_lnmp_looking_text_is_a_raw_payload_unless_declared() -> None:
    """Text with an LNMP-like line among others cannot be told from a log line: without an LNMP
    header or content type it is a raw payload, kept byte for byte. Declared as LNMP text it is
    an LNMP record (whose body Prism never interprets), kept byte for byte too - in neither case
    is anything dropped or rewritten."""
    text = b"F12=14532\nthis line is not an LNMP field\n"
    assert detect(text) is InputShape.RAW
    result = normalize(text, [], topic="t", namespace="n")
    assert result.envelope.payload_bytes() == text
    declared = [("content-type", le.CONTENT_TYPE_TEXT.encode())]
    assert detect(text, declared) is InputShape.LNMP_TEXT
    as_lnmp = normalize(text, declared, topic="t", namespace="n")
    assert as_lnmp.envelope.payload_bytes() == text and as_lnmp.envelope.content_type == le.CONTENT_TYPE_TEXT

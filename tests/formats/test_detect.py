"""Shape detection precedence and normalize() (app.formats.detect)."""

from __future__ import annotations

import contextlib
import importlib
import json
import uuid
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.envelope import Layout, decode, encode, new_envelope, validate
from app.envelope.codec import Limits
from app.envelope.validation import required_problems
from app.errors import (
    AmbiguousMapEntryError,
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
from app.formats._fields import SECRET_HEADERS, TOKEN_HEADERS, set_auth_token, take_auth_token
from app.formats.detect import InputShape, detect, normalize
from tests.strategies import envelopes

#: the module itself (`app.formats.detect` is also the name of the function the package exports)
detect_mod = importlib.import_module("app.formats.detect")
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


def _result(value, headers):
    """normalize's whole answer, or its error, in comparable form."""
    try:
        r = normalize(value, headers, topic="t", namespace="n", now_ms=NOW, id_seed=b"t/0/1")
    except FormatError as exc:
        return type(exc), str(exc)
    return r.shape, encode(r.envelope), r.notes, r.records, r.layout


@settings(max_examples=200, deadline=None)
@given(value=st.one_of(st.binary(max_size=64), st.builds(
    lambda p: encode(new_envelope("t", p, namespace="n")), st.binary(max_size=64))),
    names=st.lists(st.sampled_from(["correlation-id", "content-type", "prism-topic", "x-other"]), max_size=2))
def test_a_bytearray_or_memoryview_value_normalizes_as_its_bytes(value: bytes, names: list[str]) -> None:
    """normalize copies a value that is not `bytes` and takes a `bytes` one as it is (issue 29:
    no `bytes(value)` call for the worker's values): either way, the same result."""
    headers = [(n, b"v") for n in names]
    expected = _result(value, headers)
    assert _result(bytearray(value), headers) == expected
    assert _result(memoryview(value), headers) == expected


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


# --------------------------------------------------------------------------- producer headers, checked cheaply


def _detect_before(value, pairs, limits=detect_mod.DEFAULT_LIMITS, dropped=None):
    """`_detect` as it was before the header scans were shortened: the reference."""
    if pairs:
        names = {n for n, _ in pairs}
        ct = detect_mod._content_type(pairs)
        if ct.startswith(ce.STRUCTURED_PREFIX):
            return S.CLOUDEVENT_STRUCTURED, None, None
        if any(n.startswith(ce.CE_PREFIX) for n in names):
            return S.CLOUDEVENT_BINARY, None, None
    else:
        names, ct = frozenset(), ""
    valid = detect_mod._valid_envelope(value, limits, dropped if dropped is not None else []) if value else None
    if valid is not None:
        env, layout, records = valid
        return (S.PRISM_DRAFT if layout is Layout.DRAFT else S.PRISM_REVIEWED), env, records
    if detect_mod._prism_hints(names) or detect_mod._envelope_prefix(value):
        env, layout = None, Layout.REVIEWED
        with contextlib.suppress(EnvelopeError):
            layout = detect_mod.detect_layout(value)
        return (S.PRISM_DRAFT if layout is Layout.DRAFT else S.PRISM_REVIEWED), env, None
    lnmp_hint = detect_mod.lnmp_bindings.has_lnmp_headers(names) or ct in le.BINARY_CONTENT_TYPES \
        or ct in le.TEXT_CONTENT_TYPES
    if lnmp.is_container(value):
        return S.LNMP_BINARY, None, None
    if lnmp.has_text_header(value):
        return S.LNMP_TEXT, None, None
    if lnmp_hint:
        if ct in le.BINARY_CONTENT_TYPES or not detect_mod._is_utf8(value):
            return S.LNMP_BINARY, None, None
        return S.LNMP_TEXT, None, None
    if any(n.startswith("nats-") for n in names) or names & detect_mod._NATS_MARKERS:
        return S.NATS_HEADERS, None, None
    if names & detect_mod._KAFKA_MARKERS:
        return S.KAFKA_HEADERS, None, None
    if legacy.looks_like_redis_json(value):
        return S.REDIS_JSON, None, None
    if detect_mod._is_lnmp_text_record(value):
        return S.LNMP_TEXT, None, None
    return S.RAW, None, None


def _prism_before(data, pairs, env, notes, limits):
    """`_prism` as it was before it skipped headers it does not read: the reference."""
    if env is None:
        dropped: list[str] = []
        try:
            env = decode(data, limits=limits, dropped=dropped)
        except (SizeLimitError, AmbiguousMapEntryError):
            raise
        except EnvelopeError as exc:
            raise PrismShapeError(f"value looks like a Prism envelope (prism-* headers or a leading metadata "
                                  f"block) but does not decode: {exc.message}",
                                  path=exc.path or "value",
                                  hint=f"{exc.hint + '; ' if exc.hint else ''}the producer sent truncated or "
                                       "corrupted envelope bytes: re-send the complete envelope, encoded "
                                       "by a Prism SDK") from None
        notes += [f"dropped converting the draft layout: {d}" for d in dropped]
    if not pairs:
        return env
    found = {n: v for n, v in pairs}
    for header, actual in (("prism-message-id", env.message_id), ("prism-topic", env.topic),
                           ("prism-namespace", env.namespace)):
        claimed = found.get(header)
        if claimed is not None and actual and claimed.decode("utf-8", errors="replace") != actual:
            raise PrismShapeError(f"header {header} disagrees with the envelope", path=f"header {header}",
                                  hint="headers and envelope must come from one encode()")
    auth = take_auth_token(pairs)
    notes += auth.notes
    set_auth_token(env, auth.token, notes, "headers")
    return env


def _outcome(value, headers):
    """Everything `normalize` returns (or raises), comparable across two runs."""
    try:
        r = normalize(value, headers, topic="orders.created", namespace="n", now_ms=NOW, id_seed=b"seed", key=b"k")
    except PrismError as exc:
        return (type(exc), str(exc), exc.path, exc.hint)
    return (r.shape, encode(r.envelope), r.envelope, r.notes, r.records, r.layout)


def _header_spellings(name: str) -> st.SearchStrategy[str]:
    return st.sampled_from([name, name.upper(), name.title()])


#: Every name `_prism` and `_detect` read, in several spellings, next to a live producer's names.
_producer_names = st.one_of(
    st.sampled_from([*detect_mod._CROSS_CHECKED, *TOKEN_HEADERS, *SECRET_HEADERS, "content-type", "ce_id",
                     "ce_specversion", "prism-envelope-layout", "prism-dlq-attestation", "traceparent",
                     "correlation-id", "nats-msg-id", "lnmp.timestamp"]).flatmap(_header_spellings),
    st.sampled_from(["bench-sent", "app-tenant", "x-request-id", "prism", "prismtopic", "ce", "cookies"]),
    st.text(max_size=10),
)
_ENV_WITH_TOKEN = new_envelope("orders.created", {"id": 2}, namespace="orders", published_at_ms=NOW)
_ENV_WITH_TOKEN.ensure_security().auth_token = "eyJhbGciOi.eyJzdWIi.sig"
_PRODUCER_BODIES = [REVIEWED, DRAFT, encode(_ENV_WITH_TOKEN), CE_STRUCT.value, CE_BIN.value, LNMP_BIN, LNMP_TXT,
                    REDIS, b"hello", REVIEWED[:-3]]


@st.composite
def _producer_headers(draw):
    """Header lists whose values are often what the envelope says (a cross-check that agrees),
    else a token, a content type, any bytes, text or None."""
    known = {"prism-message-id": ENV.message_id.encode(), "prism-topic": ENV.topic.encode(),
             "prism-namespace": ENV.namespace.encode(), "authorization": b"Bearer tok-1",
             "content-type": draw(st.sampled_from([b"application/cloudevents+json", b"text/lnmp", b"text/plain"]))}
    out = []
    for name in draw(st.lists(_producer_names, max_size=5)):
        choices = [st.binary(max_size=12), st.text(max_size=6), st.none()]
        if name.lower() in known:
            choices += [st.just(known[name.lower()])] * 3
        out.append((name, draw(st.one_of(*choices))))
    if draw(st.integers(0, 3)) == 0:  # a declared content type, which can decide the shape
        out.insert(draw(st.integers(0, len(out))), (draw(_header_spellings("content-type")), known["content-type"]))
    return out


@settings(max_examples=500, deadline=None)
@given(value=st.sampled_from(_PRODUCER_BODIES), headers=_producer_headers())
def test_producer_headers_normalize_as_before(value: bytes, headers: list) -> None:
    """`normalize` skips the Prism cross-check and the token search when no header is one they
    read, and scans the headers once less in `_detect`: for any header list (our names in any
    case, tokens, secrets, content types, CloudEvents and ordinary names, duplicates, None and
    text values) on every shape, the result - shape, envelope bytes, notes, records - or the
    error is what the implementations kept here as the reference give."""
    now = _outcome(value, headers)
    with mock.patch.object(detect_mod, "_prism", _prism_before), \
            mock.patch.object(detect_mod, "_detect", _detect_before):
        before = _outcome(value, headers)
    assert now == before


def test_ordinary_producer_headers_leave_an_envelope_as_without_them() -> None:
    """The live producer's case: `bench-sent` and application headers change nothing."""
    assert _outcome(REVIEWED, [("bench-sent", b"1764495000.1"), ("App-Tenant", b"acme")]) == _outcome(REVIEWED, None)


def test_a_read_header_among_ordinary_ones_is_still_read() -> None:
    """One header `_prism` reads, last after ordinary ones: still cross-checked, still taken."""
    hs = [("bench-sent", b"1"), ("Prism-Topic", b"payments.created")]
    with pytest.raises(PrismShapeError, match="prism-topic"):
        normalize(REVIEWED, hs, topic="t", namespace="n")
    r = normalize(REVIEWED, [("bench-sent", b"1"), ("Cookie", b"c=1"), ("X-Auth-Token", b"tok-2")],
                  topic="t", namespace="n")
    assert r.envelope.security is not None and r.envelope.security.auth_token == "tok-2"
    assert r.notes == ["header cookie dropped: credentials other than a Prism auth token are never forwarded"]


def test_a_flood_of_tiny_records_is_not_walked_whole() -> None:
    """16 MiB of three-byte records: the envelope check walked all 5.6M of them into tuples
    (hundreds of MB) before it found the header over its limit; it stops near 256 KiB now."""
    import tracemalloc

    data = b"\x90\x03\x00" * (16 * 1024 * 1024 // 3 - 2)
    tracemalloc.start()
    try:
        with contextlib.suppress(PrismError):
            normalize(data, topic="t", namespace="n")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 80 * 1024 * 1024, f"{peak / 1e6:.0f} MB"

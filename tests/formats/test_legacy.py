"""Legacy shapes (RFC-031 "Motivation"): Kafka-header metadata, NATS headers, Redis JSON, raw."""

from __future__ import annotations

import base64
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.envelope import new_envelope
from app.errors import LegacyFormatError
from app.formats import legacy
from app.formats._fields import header_pairs


def test_rfc031_kafka_example() -> None:
    headers = header_pairs([("schema-id", b"123"), ("correlation-id", b"abc-456"), ("timestamp", b"1697200000")])
    d = legacy.from_kafka_headers(b'{"order":1}', headers)
    env = d.envelope
    assert env.extensions["schema.id"] == b"123"
    assert env.metadata.correlation_id == "abc-456"
    assert env.published_at_ms == 1697200000000
    assert bytes(env.payload.value) == b'{"order":1}'


def test_rfc031_kafka_producer_headers() -> None:
    """The RFC's "new code (Kafka)" producer: schema-version and trace-id headers."""
    headers = header_pairs([("schema-version", b"v2"), ("trace-id", b"4BF92F3577B34DA6A3CE929D0E0E4736")])
    env = legacy.from_kafka_headers(b"{}", headers).envelope
    assert env.schema.schema_version == "v2"
    assert env.observability.trace_id == "4bf92f3577b34da6a3ce929d0e0e4736"  # W3C id, normalized to lowercase


def test_rfc031_nats_example_is_case_insensitive() -> None:
    headers = header_pairs([("Nats-Msg-Id", b"xyz-789"), ("X-Schema-URL", b"github.com/acme/schemas/order.proto"),
                            ("x-trace-id", b"trace-123")])
    d = legacy.from_nats_headers(b"data", headers)
    env = d.envelope
    assert env.message_id == "xyz-789"
    assert env.schema.schema_url == "github.com/acme/schemas/order.proto"
    assert env.extensions["header.x-trace-id"] == b"trace-123"  # not a W3C id: kept verbatim
    assert any("x-trace-id" in n for n in d.notes)


def test_every_kafka_header_mapping() -> None:
    headers = header_pairs([
        ("message-id", b"m1"), ("causation-id", b"p1"), ("schema-url", b"u"), ("schema-name", b"N"),
        ("schema-format", b"avro"), ("schema-hash", b"sha256:00"), ("span-id", b"00f067aa0ba902b7"),
        ("trace-id", b"4bf92f3577b34da6a3ce929d0e0e4736"), ("priority", b"9"), ("ttl", b"30"),
        ("publisher-id", b"svc"), ("publisher-team", b"team"), ("data-classification", b"Internal"),
        ("contains-pii", b"true"), ("content-type", b"application/avro"), ("content-encoding", b"GZIP"),
        ("tracestate", b"a=b"), ("baggage", b"k=v"), ("x-custom", b"1"), ("x-custom", b"2"),
    ])
    env = legacy.from_kafka_headers(b"p", headers).envelope
    md = env.metadata
    assert (md.message_id, md.causality_parent, md.priority, md.ttl_seconds) == ("m1", "p1", 9, 30)
    assert (env.schema.schema_url, env.schema.schema_name, env.schema.schema_format) == ("u", "N", "avro")
    assert env.observability.span_id == "00f067aa0ba902b7"
    assert (env.security.publisher_id, env.security.publisher_team) == ("svc", "team")
    assert env.security.data_classification == "internal" and env.security.contains_pii is True
    assert env.content_type == "application/avro" and env.content_encoding == "gzip"
    assert env.extensions["w3c.tracestate"] == b"a=b" and dict(env.observability.baggage) == {"k": "v"}
    assert env.extensions["header.x-custom"] == b"1, 2"


@pytest.mark.parametrize(("headers", "message"), [
    ([("priority", b"urgent")], "priority"),
    ([("timestamp", b"tomorrow")], "timestamp"),
    ([("message-id", b"a"), ("msg-id", b"b")], "disagree"),
    ([("correlation-id", b"\xff")], "UTF-8"),
    ([("data-classification", b"secret")], "unknown"),
])
def test_bad_kafka_headers(headers: list[tuple[str, bytes]], message: str) -> None:
    with pytest.raises(LegacyFormatError, match=message):
        legacy.from_kafka_headers(b"", header_pairs(headers))


def test_tokens_and_credentials_never_reach_extensions() -> None:
    headers = header_pairs([("Authorization", b"Bearer T0KEN"), ("Cookie", b"sid=S3CRET"), ("x-y", b"z")])
    d = legacy.from_kafka_headers(b"", headers)
    assert d.envelope.security.auth_token == "T0KEN"
    assert set(d.envelope.extensions) == {"header.x-y"}
    assert "S3CRET" not in " ".join(d.notes) and "T0KEN" not in " ".join(d.notes)


def test_rfc031_redis_example() -> None:
    value = b'{"meta":{"schema":"v2","ts":1697200000},"payload":{"order_id": 42, "total": 9.90}}'
    env = legacy.from_redis_json(value).envelope
    assert env.schema.schema_version == "v2" and env.published_at_ms == 1697200000000
    assert bytes(env.payload.value) == b'{"order_id": 42, "total": 9.90}'  # the producer's bytes, not re-encoded
    assert env.content_type == "application/json"


def test_redis_payload_rules() -> None:
    b64 = base64.b64encode(b"\x00\xffbin").decode()
    env = legacy.from_redis_json(json.dumps({"meta": {"payload_encoding": "base64"}, "payload": b64}).encode()).envelope
    assert bytes(env.payload.value) == b"\x00\xffbin" and env.content_type == ""
    env = legacy.from_redis_json(b'{"meta":{"content_type":"text/plain"},"payload":"h\\u00e9llo"}').envelope
    assert bytes(env.payload.value) == "héllo".encode()
    env = legacy.from_redis_json(b'{"payload":"just a string"}').envelope  # JSON string payload stays JSON
    assert bytes(env.payload.value) == b'"just a string"' and env.content_type == "application/json"
    env = legacy.from_redis_json(b'{"payload":null}').envelope
    assert bytes(env.payload.value) == b"null"


def test_redis_meta_mapping_token_and_unknown_keys() -> None:
    value = json.dumps({"meta": {"id": "m-1", "trace_id": "4bf92f3577b34da6a3ce929d0e0e4736", "priority": 3,
                                 "contains_pii": False, "auth_token": "SEKRIT", "tenant": {"id": 7}},
                        "payload": []}).encode()
    d = legacy.from_redis_json(value)
    env = d.envelope
    assert env.message_id == "m-1" and env.metadata.priority == 3 and env.security.contains_pii is False
    assert env.observability.trace_id == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert env.security.auth_token == "SEKRIT"
    assert env.extensions["meta.tenant"] == b'{"id":7}'
    assert all(b"SEKRIT" not in v for v in env.extensions.values())


@pytest.mark.parametrize(("value", "message"), [
    (b'{"meta":[1],"payload":1}', "meta must be a JSON object"),
    (b'{"meta":{"payload_encoding":"base64"},"payload":"***"}', "not valid base64"),
    (b'{"meta":{"payload_encoding":"base64"},"payload":5}', "not a string"),
    (b'{"meta":{"payload_encoding":"hex"},"payload":"00"}', "not supported"),
    (b'{"meta":{"ts":"never"},"payload":1}', "timestamp|time"),
    (b'{"meta":{"ID":"a","id":"b"},"payload":1}', "differ only in case"),
    (b'{"payload":1,"payload":2}', "appears twice"),
    (b'{"payload":1', "malformed"),
    (b'{"payload":1,"extra":2}', "members"),
])
def test_bad_redis_json(value: bytes, message: str) -> None:
    with pytest.raises(LegacyFormatError, match=message):
        legacy.from_redis_json(value)


def test_looks_like_redis_json() -> None:
    assert legacy.looks_like_redis_json(b'  {"payload": 1}')
    assert legacy.looks_like_redis_json(b'{"meta": 3, "payload": 1}')  # detected, then refused precisely
    assert not legacy.looks_like_redis_json(b'{"payload": 1, "other": 2}')
    assert not legacy.looks_like_redis_json(b'{"data": "payload"}')
    assert not legacy.looks_like_redis_json(b"\xff{")


def test_raw_keeps_bytes_and_standard_headers() -> None:
    d = legacy.from_raw(b"\x00\x01", header_pairs([("content-type", b"application/x-thing"),
                                                   ("prism-auth-token", b"tok")]))
    assert bytes(d.envelope.payload.value) == b"\x00\x01" and d.envelope.content_type == "application/x-thing"
    assert d.envelope.security.auth_token == "tok" and not d.envelope.extensions


_text = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=20)


@settings(max_examples=150, deadline=None)
@given(payload=st.binary(max_size=64) | st.builds(lambda o: json.dumps(o).encode(),
                                                   st.dictionaries(_text, st.integers(), max_size=3)),
       ct=st.sampled_from([None, "application/json", "text/plain", "application/octet-stream"]),
       corr=st.none() | _text, prio=st.none() | st.integers(0, 10), trace=st.booleans())
def test_redis_round_trip(payload: bytes, ct: str | None, corr: str | None, prio: int | None, trace: bool) -> None:
    env = new_envelope("t", payload, namespace="n", content_type=ct, correlation_id=corr, priority=prio,
                       published_at_ms=1_700_000_000_123)
    if trace:
        obs = env.ensure_observability()
        obs.trace_id, obs.span_id = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    back = legacy.from_redis_json(legacy.to_redis_json(env)).envelope
    back.metadata.topic, back.metadata.namespace = "t", "n"
    assert back == env

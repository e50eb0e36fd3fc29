"""CloudEvents <-> envelope (app.formats.cloudevents), both Kafka content modes, checked against
the `cloudevents` SDK's own readers and writers as an independent implementation."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime

import pytest
from cloudevents.core.bindings import kafka as sdk_kafka
from cloudevents.core.formats.json import JSONFormat
from cloudevents.core.v1.event import CloudEvent
from hypothesis import HealthCheck, given, settings

from app.envelope import new_envelope
from app.errors import CloudEventError
from app.formats import cloudevents as ce
from tests.strategies import envelopes

TP = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
TOPIC, NS = "orders.created", "order-events"


def _full_envelope() -> object:
    env = new_envelope(TOPIC, {"order_id": 42}, namespace=NS, published_at_ms=1732373147123, priority=8,
                       ttl_seconds=60, correlation_id="corr-1", causality_parent="parent-1",
                       labels={"region": "eu"}, extensions={"kafka.key": b"order-42", "ce.subject": b"orders/42",
                                                            "w3c.tracestate": b"congo=t61rcWkgMzE", "x-bin": b"\x00\xff"},
                       data_classification="confidential", contains_pii=True)
    sec = env.ensure_security()
    sec.publisher_id = "https://orders.example.com"
    sec.publisher_team = "checkout"
    sec.auth_token = "SECRET-TOKEN-123"
    obs = env.ensure_observability()
    obs.trace_id, obs.span_id, obs.trace_flags = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7", 1
    obs.parent_span_id = "1111111111111111"
    obs.baggage["user"] = "alice"
    sch = env.ensure_schema()
    sch.schema_url = "https://registry.example.com/orders/created/v2"
    sch.schema_name = "com.example.orders.created"
    sch.schema_version = "v2"
    return env


def test_attribute_mapping_binary_mode() -> None:
    env = _full_envelope()
    rec = ce.to_kafka_binary(env)
    h = {k: v.decode() for k, v in rec.headers}
    assert h["ce_specversion"] == "1.0" and h["ce_id"] == env.message_id
    assert h["ce_source"] == "https://orders.example.com"
    assert h["ce_type"] == "com.example.orders.created"
    assert h["ce_time"] == "2024-11-23T14:45:47.123000Z"
    assert h["content-type"] == "application/json" and "ce_datacontenttype" not in h
    assert h["ce_dataschema"] == "https://registry.example.com/orders/created/v2"
    assert h["ce_traceparent"] == TP and h["ce_tracestate"] == "congo=t61rcWkgMzE"
    assert h["ce_dataclassification"] == "confidential" and h["ce_partitionkey"] == "order-42"
    assert h["ce_subject"] == "orders/42"
    assert h["ce_prismpriority"] == "8" and h["ce_prismttl"] == "60" and h["ce_prismcontainspii"] == "true"
    assert json.loads(h["ce_prismextensions"]) == {"x-bin": base64.b64encode(b"\x00\xff").decode()}
    assert rec.key == b"order-42" and rec.value == b'{"order_id":42}'
    assert "SECRET-TOKEN-123" not in repr(rec.headers) + repr(rec.value)
    assert any("auth_token" in d for d in rec.dropped)


def test_round_trip_both_modes_is_lossless_except_the_token() -> None:
    env = _full_envelope()
    for rec in (ce.to_kafka_binary(env), ce.to_kafka_structured(env)):
        back = ce.from_kafka(rec.value, rec.headers, rec.key, topic=TOPIC, namespace=NS)
        expected = env.copy()
        expected.header.security.ClearField("auth_token")
        assert back.envelope == expected, back.notes


def test_sdk_reads_what_we_write() -> None:
    env = _full_envelope()
    rec = ce.to_kafka_binary(env)
    event = sdk_kafka.from_binary(sdk_kafka.KafkaMessage(dict(rec.headers), rec.key, rec.value), JSONFormat())
    assert event.get_id() == env.message_id and event.get_type() == "com.example.orders.created"
    assert event.get_time() == datetime(2024, 11, 23, 14, 45, 47, 123000, tzinfo=UTC)
    assert event.get_data() == {"order_id": 42} and event.get_extension("partitionkey") == "order-42"
    rec = ce.to_kafka_structured(env)
    assert dict(rec.headers) == {"content-type": b"application/cloudevents+json"}
    event = sdk_kafka.from_structured(sdk_kafka.KafkaMessage(dict(rec.headers), rec.key, rec.value), JSONFormat())
    assert event.get_data() == {"order_id": 42} and event.get_extension("traceparent") == TP


def test_we_read_what_the_sdk_writes() -> None:
    event = CloudEvent({"id": "evt-1", "source": "/sensors/7", "type": "com.example.reading",
                        "time": datetime(2024, 11, 23, 14, 45, 47, 500000, tzinfo=UTC),
                        "datacontenttype": "application/json", "traceparent": TP, "partitionkey": "k7",
                        "dataclassification": "internal", "customext": "v"}, {"celsius": 21.5})
    for msg in (sdk_kafka.to_binary(event, JSONFormat()), sdk_kafka.to_structured(event, JSONFormat())):
        d = ce.from_kafka(msg.value, list(msg.headers.items()), msg.key.encode(), topic="readings", namespace="iot")
        env = d.envelope
        assert env.message_id == "evt-1" and env.security.publisher_id == "/sensors/7"
        assert env.schema.schema_name == "com.example.reading" and env.topic == "readings"
        assert env.published_at_ms == 1732373147500
        assert env.observability.span_id == "00f067aa0ba902b7" and env.security.data_classification == "internal"
        assert env.extensions["ce.customext"] == b"v" and env.extensions["kafka.key"] == b"k7"
        assert json.loads(env.payload_bytes()) == {"celsius": 21.5} and env.content_type == "application/json"


def test_structured_json_data_is_kept_byte_for_byte() -> None:
    value = (b'{"specversion":"1.0","id":"1","source":"s","type":"t",'
             b'"data": { "b" : 1.50,\n "a" : [1, 2] } }')
    d = ce.from_kafka_structured(value, [("content-type", b"application/cloudevents+json")], topic="t", namespace="n")
    assert d.envelope.payload.value == b'{ "b" : 1.50,\n "a" : [1, 2] }'
    assert d.envelope.content_type == "application/json"  # absent datacontenttype + data member = JSON
    rec = ce.to_kafka_structured(d.envelope)
    assert b'"data": { "b" : 1.50,\n "a" : [1, 2] }}' in rec.value


def test_structured_text_and_binary_data() -> None:
    env = new_envelope("t", "héllo", namespace="n", content_type="text/plain")
    rec = ce.to_kafka_structured(env)
    assert json.loads(rec.value)["data"] == "héllo"
    assert ce.from_kafka_structured(rec.value, rec.headers, topic="t", namespace="n").envelope.payload_bytes() == \
        "héllo".encode()
    env = new_envelope("t", b"\x00\x01", namespace="n", content_type="application/octet-stream")
    assert json.loads(ce.to_kafka_structured(env).value)["data_base64"] == "AAE="


def test_from_sdk_event_object() -> None:
    event = CloudEvent({"id": "1", "source": "/prism/n", "type": "t"}, {"k": "v"})
    d = ce.from_cloudevent(event, topic="t", namespace="n")
    assert d.envelope.security is None and d.envelope.schema is None  # defaults recognized
    assert d.envelope.payload_bytes() == b'{"k":"v"}' and d.envelope.content_type == "application/json"
    conv = ce.to_cloudevent(d.envelope)
    assert conv.event.get_source() == "/prism/n" and conv.event.get_data() == b'{"k":"v"}'


def test_auth_header_goes_to_the_token_only() -> None:
    headers = [("ce_specversion", b"1.0"), ("ce_id", b"1"), ("ce_source", b"s"), ("ce_type", b"t"),
               ("Authorization", b"Bearer tok-XYZ"), ("x-other", b"kept")]
    env = ce.from_kafka_binary(b"", headers, topic="t", namespace="n").envelope
    assert env.security.auth_token == "tok-XYZ"
    assert env.extensions["header.x-other"] == b"kept"
    assert b"tok-XYZ" not in b"".join(env.extensions.values())


def test_invalid_traceparent_is_ignored_and_kept() -> None:
    headers = [("ce_specversion", b"1.0"), ("ce_id", b"1"), ("ce_source", b"s"), ("ce_type", b"t"),
               ("ce_traceparent", b"00-zz-yy-01")]
    d = ce.from_kafka_binary(b"x", headers, topic="t", namespace="n", now_ms=5)
    assert d.envelope.observability is None and d.envelope.extensions["ce.traceparent"] == b"00-zz-yy-01"
    assert d.envelope.published_at_ms == 5


BASE = {"ce_specversion": b"1.0", "ce_id": b"1", "ce_source": b"s", "ce_type": b"t"}


@pytest.mark.parametrize(("change", "message"), [
    ({"ce_id": None}, "'id' is missing"),
    ({"ce_source": None}, "'source' is missing"),
    ({"ce_type": None}, "'type' is missing"),
    ({"ce_specversion": None}, "no ce_specversion"),
    ({"ce_specversion": b"0.3"}, "specversion '0.3' is not supported"),
    ({"ce_id": b""}, "non-empty string"),
    ({"ce_time": b"yesterday"}, "not an RFC 3339"),
    ({"ce_time": b"2024-02-30T00:00:00Z"}, "not a valid date-time"),
    ({"ce_dataclassification": b"secret"}, "unknown"),
    ({"ce_bad-name": b"x"}, "not a valid CloudEvent"),
    ({"ce_source": b"\xff"}, "not UTF-8"),
    ({"ce_prismpriority": b"11"}, "0..10"),
    ({"ce_prismextensions": b'{"k": 1}'}, "base64"),
])
def test_invalid_binary_events(change: dict[str, bytes | None], message: str) -> None:
    headers = {**BASE, **change}
    pairs = [(k, v) for k, v in headers.items() if v is not None]
    with pytest.raises(CloudEventError, match=message):
        ce.from_kafka_binary(b"{}", pairs, topic="t", namespace="n")


@pytest.mark.parametrize(("value", "message"), [
    (b'{"specversion":"1.0","id":"1","source":"s"}', "'type' is missing"),
    (b'{"specversion":"2.0","id":"1","source":"s","type":"t"}', "not supported"),
    (b'{"id":"1","source":"s","type":"t"}', "'specversion' is missing"),
    (b'{"specversion":"1.0","id":"1","source":"s","type":"t","data":1,"data_base64":"AA=="}', "both"),
    (b'{"specversion":"1.0","id":"1","source":"s","type":"t","data_base64":"%%"}', "base64"),
    (b'{"specversion":"1.0","id":"1","id":"2","source":"s","type":"t"}', "twice"),
    (b'[1,2]', "one JSON object"),
    (b'{"specversion":"1.0","id":{"x":1},"source":"s","type":"t"}', "dict"),
    (b'\xff', "not UTF-8"),
    # issue 28: data nested 200,000 arrays deep (and just past the bounded decoder's limit)
    (b'{"specversion":"1.0","id":"1","source":"s","type":"t","data":' + b"[" * 200_000 + b"]" * 200_000 + b"}",
     "nested too deeply"),
    (b'{"specversion":"1.0","id":"1","source":"s","type":"t","data":' + b"[" * 64 + b"]" * 64 + b"}",
     "nested too deeply"),
])
def test_invalid_structured_events(value: bytes, message: str) -> None:
    with pytest.raises(CloudEventError, match=message):
        ce.from_kafka_structured(value, [("content-type", b"application/cloudevents+json")], topic="t", namespace="n")


def test_batch_format_is_refused() -> None:
    with pytest.raises(CloudEventError, match="not supported"):
        ce.from_kafka_structured(b"[]", [("content-type", b"application/cloudevents-batch+json")],
                                 topic="t", namespace="n")


def test_partitionkey_and_record_key() -> None:
    headers = list({**BASE, "ce_partitionkey": b"a"}.items())
    d = ce.from_kafka_binary(b"", headers, b"b", topic="t", namespace="n")
    assert d.envelope.extensions["kafka.key"] == b"b" and any("record key wins" in n for n in d.notes)
    env = new_envelope("t", b"", namespace="n", extensions={"kafka.key": b"\xff\x00"})
    rec = ce.to_kafka_binary(env)
    assert rec.key == b"\xff\x00" and "ce_partitionkey" not in dict(rec.headers)
    assert ce.from_kafka_binary(rec.value, rec.headers, rec.key, topic="t", namespace="n").envelope == env


def _expected(env: object) -> object:
    return env


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(env=envelopes())
def test_binary_mode_round_trip(env: object) -> None:
    rec = ce.to_kafka_binary(env)
    back = ce.from_kafka_binary(rec.value, rec.headers, rec.key, topic=env.topic, namespace=env.namespace)
    assert back.envelope == env


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(env=envelopes())
def test_structured_mode_round_trip(env: object) -> None:
    rec = ce.to_kafka_structured(env)
    json.loads(rec.value)  # always a valid JSON document
    back = ce.from_kafka_structured(rec.value, rec.headers, rec.key, topic=env.topic, namespace=env.namespace)
    assert back.envelope == env

"""Publish options, trace context normalisation, envelope building and URL handling
(no server needed)."""

from __future__ import annotations

import pytest

from app.errors import ConfigError, TraceContextError
from app.sdk import PrismClient, PrismPublishOptions
from app.sdk.backends import backend_for_url
from app.sdk.backends.base import redact_url
from app.sdk.backends.nats import jetstream_name
from app.sdk.options import TraceContext, trace_context_of
from app.security.signing import SigningKey


def test_options_are_validated_up_front():
    with pytest.raises(ConfigError, match="priority must be 0-10, got 11"):
        PrismPublishOptions(priority=11)
    with pytest.raises(ConfigError, match="ttl_seconds must be >= 0"):
        PrismPublishOptions(ttl_seconds=-1)


def test_trace_context_from_a_traceparent_string():
    tc = trace_context_of("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
    assert tc == TraceContext("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7", 1)
    with pytest.raises(TraceContextError, match="not a valid W3C traceparent"):
        trace_context_of("00-00000000000000000000000000000000-00f067aa0ba902b7-01")
    with pytest.raises(TraceContextError, match="not supported"):
        trace_context_of(12345)


def test_trace_context_from_opentelemetry_span_and_active_span():
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider

    tracer = TracerProvider().get_tracer("sdk-test")
    client = PrismClient("redis://127.0.0.1:6379/0", namespace="n")
    with tracer.start_as_current_span("publish") as span:
        ctx = span.get_span_context()
        explicit = client.build_envelope("t", {}, PrismPublishOptions(trace_context=ctx))
        from_span = trace_context_of(span)
        implicit = client.build_envelope("t", {})  # the active span is picked up without options
    for env in (explicit, implicit):
        assert env.observability.trace_id == f"{ctx.trace_id:032x}"
        assert env.observability.span_id == f"{ctx.span_id:016x}"
        assert env.observability.trace_flags == int(ctx.trace_flags)
    assert from_span.trace_id == f"{ctx.trace_id:032x}"
    assert trace.get_current_span().get_span_context().is_valid is False
    assert client.build_envelope("t", {}).observability is None  # no span, no option: no context


def test_build_envelope_sets_every_option():
    key = SigningKey.hmac_sha256("k", b"k" * 32)
    client = PrismClient("nats://127.0.0.1:4222", namespace="orders", publisher_id="svc-a", publisher_team="team-a",
                         auth_token=lambda: "jwt-token-value")
    env = client.build_envelope("orders.created", {"a": 1}, PrismPublishOptions(
        correlation_id="c-1", causality_parent="p-1", priority=9, ttl_seconds=60, labels={"r": "eu"},
        content_encoding="zstd", data_classification="confidential", contains_pii=True, message_id="m-1",
        extensions={"x-retry": b"1"}, signing_key=key))
    md = env.metadata
    assert (md.message_id, md.topic, md.namespace, md.correlation_id, md.causality_parent) == (
        "m-1", "orders.created", "orders", "c-1", "p-1")
    assert (env.priority, md.ttl_seconds, env.content_encoding, env.content_type) == (9, 60, "zstd", "application/json")
    assert env.payload_json() == {"a": 1}
    assert dict(env.observability.labels) == {"r": "eu"} and env.extensions["x-retry"] == b"1"
    sec = env.security
    assert (sec.publisher_id, sec.publisher_team, sec.auth_token) == ("svc-a", "team-a", "jwt-token-value")
    assert (sec.data_classification, sec.contains_pii) == ("confidential", True)
    assert not sec.HasField("signature")  # signing happens at publish, after encryption
    with pytest.raises(ConfigError, match="topic must not be empty"):
        client.build_envelope("", {})


def test_a_backend_whose_driver_is_not_installed_names_the_extra(monkeypatch):
    """prism-client installs only the Kafka driver; the others come with extras. A missing one is
    a ConfigError when the client is created, naming the install command (the clean-venv test in
    test_client_distribution.py sees the real thing)."""
    import app.sdk.backends as backends

    real = backends.find_spec
    monkeypatch.setattr(backends, "find_spec", lambda name: None if name in ("psycopg", "aiokafka") else real(name))
    with pytest.raises(ConfigError, match=r"the postgresql:// backend needs the psycopg package") as info:
        PrismClient("postgresql://u:secret@h/db", namespace="n")
    assert info.value.hint == "pip install 'prism-client[postgres]' (or pip install psycopg)"
    assert "secret" not in str(info.value)
    with pytest.raises(ConfigError, match=r"fix: pip install aiokafka$"):
        backend_for_url("kafka://h:9092")
    assert backend_for_url("redis://h:6379/0").scheme == "redis"


def test_urls_pick_backends_and_reject_what_they_do_not_understand():
    assert backend_for_url("kafka://h:9092?partitions=3").partitions == 3
    assert backend_for_url("redis://h:6379/0?prefix=p:").key("t") == "p:t"
    assert backend_for_url("postgres://u@h/db?schema=s").schema == "s"
    assert backend_for_url("nats://h:4222").stream_prefix == "PRISM"
    with pytest.raises(ConfigError, match="unsupported backend URL scheme 'amqp'"):
        backend_for_url("amqp://guest:secret@h")
    with pytest.raises(ConfigError, match=r"unknown URL parameter\(s\) \['bogus'\]"):
        backend_for_url("kafka://h:9092?bogus=1")
    with pytest.raises(ConfigError, match="must be an integer >= 1") as info:
        backend_for_url("kafka://user:hunter2@h:9092?partitions=zero")
    assert "hunter2" not in str(info.value)
    assert redact_url("postgresql://u:pw@h/db") == "postgresql://u:***@h/db"
    with pytest.raises(ConfigError, match="namespace must not be empty"):
        PrismClient("redis://h", namespace="")
    with pytest.raises(ConfigError, match="group must not be empty"):
        PrismClient("redis://h").subscribe("t", group="")


def test_jetstream_names_are_valid_and_distinct():
    assert jetstream_name("PRISM_orders") == "PRISM_orders"
    a, b = jetstream_name("PRISM_a.b"), jetstream_name("PRISM_a_b")
    assert a != b and a.startswith("PRISM_a_b_") and "." not in a

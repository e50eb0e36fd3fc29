"""Publish options, trace context normalisation, envelope building and URL handling
(no server needed)."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.envelope.codec import decode, encode
from app.envelope.validation import required_problems, sanity_problems
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
    with pytest.raises(ConfigError, match="ttl_seconds must be an integer from 0 to"):
        PrismPublishOptions(ttl_seconds=-1)


@pytest.mark.parametrize(("kwargs", "said"), [
    # each of these was a protobuf ValueError / TypeError or a UnicodeEncodeError at publish,
    # or an envelope the worker dead-letters for its metadata
    ({"priority": float("nan")}, "priority must be 0-10"), ({"priority": True}, "priority must be 0-10"),
    ({"ttl_seconds": 2**63}, "ttl_seconds must be an integer"), ({"ttl_seconds": 1.5}, "ttl_seconds must be"),
    ({"message_id": ""}, "message_id must not be empty"), ({"message_id": "x" * 129}, "over 128"),
    ({"correlation_id": "\ud800"}, "lone surrogate"), ({"causality_parent": "a\nb"}, "control characters"),
    ({"content_type": 5}, "content_type must be a str"), ({"content_encoding": "gzip\x00"}, "control characters"),
    ({"data_classification": "topsecret"}, "data_classification must be one of"),
    ({"labels": {1: "v"}}, "labels['1'] must be a str"), ({"labels": {"k": 2}}, "value must be str"),
    ({"labels": {"k": "v" * 300}}, "labels['k']"), ({"labels": {str(i): "v" for i in range(65)}}, "over 64"),
    ({"labels": ["k"]}, "labels must be a mapping"), ({"extensions": {"x": "text"}}, "value must be bytes"),
])
def test_an_option_the_envelope_cannot_carry_is_a_config_error(kwargs, said):
    with pytest.raises(ConfigError, match=re.escape(said)) as info:
        PrismPublishOptions(**kwargs)
    assert info.value.path == "PrismPublishOptions" and "docs/sdk.md" in info.value.hint


def test_every_problem_is_reported_at_once():
    with pytest.raises(ConfigError) as info:
        PrismPublishOptions(priority=11, message_id="", data_classification="x", labels={"k": 1})
    assert [w in info.value.message for w in ("priority", "message_id", "data_classification", "labels")] == [True] * 4


_text = st.one_of(st.none(), st.text(max_size=140), st.integers())


@settings(max_examples=200, deadline=None)
@given(correlation_id=_text, message_id=_text, content_type=_text, priority=st.one_of(st.none(), st.integers()),
       ttl_seconds=st.one_of(st.none(), st.integers(min_value=-2, max_value=2**64)),
       labels=st.one_of(st.none(), st.dictionaries(st.text(max_size=20), st.one_of(st.text(max_size=300),
                                                                                    st.integers()), max_size=3)),
       classification=st.one_of(st.none(), st.sampled_from(["public", "internal", "secret"])))
def test_accepted_options_always_build_an_envelope_the_worker_accepts(correlation_id, message_id, content_type,
                                                                     priority, ttl_seconds, labels, classification):
    """Options are either refused up front or build, encode and pass the worker's required and
    sanity checks: nothing in between reaches a broker."""
    try:
        o = PrismPublishOptions(correlation_id=correlation_id, message_id=message_id, content_type=content_type,
                                priority=priority, ttl_seconds=ttl_seconds, labels=labels,
                                data_classification=classification)
    except ConfigError:
        return
    env = _CLIENT.build_envelope("t", {"a": 1}, o)
    decoded = decode(encode(env))
    assert required_problems(decoded) == [] and sanity_problems(decoded) == []


_CLIENT = PrismClient("kafka://127.0.0.1:9", namespace="n")


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
    # urllib's ValueError for an unclosed IPv6 bracket, and redis-py's for a port that is no
    # number (at connect), were tracebacks from `prism audit --url` / `prism envelope check-compat`
    for url in ("kafka://[::1", "redis://u:hunter2@[::1:6379/0"):
        with pytest.raises(ConfigError, match="not a usable backend URL: Invalid IPv6 URL") as info:
            backend_for_url(url)
        assert "hunter2" not in str(info.value)
    with pytest.raises(ConfigError, match="the Redis URL's port is not usable"):
        backend_for_url("redis://h:abc/0")
    # a Kafka URL's hosts go through the one bootstrap parser (PRISM_BROKER_URL's): `no such:1`
    # was handed to aiokafka as a host with a space in it
    assert backend_for_url("kafka://a:1,b?partitions=2").bootstrap == "a:1,b:9092"
    for url, problem in (("kafka://no such:1", "'no such:1' contains whitespace"),
                         ("kafka://u:hunter2@-bad:1", "invalid host '-bad'"), ("kafka://", "no host:port found")):
        with pytest.raises(ConfigError, match="invalid Kafka bootstrap") as info:
            backend_for_url(url)
        assert problem in str(info.value) and "hunter2" not in str(info.value), info.value
    with pytest.raises(ConfigError, match="namespace must not be empty"):
        PrismClient("redis://h", namespace="")
    with pytest.raises(ConfigError, match="group must not be empty"):
        PrismClient("redis://h").subscribe("t", group="")


def test_jetstream_names_are_valid_and_distinct():
    assert jetstream_name("PRISM_orders") == "PRISM_orders"
    a, b = jetstream_name("PRISM_a.b"), jetstream_name("PRISM_a_b")
    assert a != b and a.startswith("PRISM_a_b_") and "." not in a


@pytest.mark.parametrize(("namespace", "said"), [("a\nb", "contains control characters"),
                                                 ("n" * 250, "250 characters, over 249"),
                                                 ("\ud800", "lone surrogate"), ("", "must not be empty")])
def test_a_namespace_no_envelope_can_carry_is_refused_when_the_client_is_made(namespace, said):
    with pytest.raises(ConfigError, match=said) as info:
        PrismClient("kafka://127.0.0.1:9", namespace=namespace)
    assert info.value.path == "PrismClient(namespace=)"

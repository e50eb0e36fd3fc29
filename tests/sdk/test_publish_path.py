"""The lean publish path of a default publish (issue 6) sends exactly what the general path
sends: the same envelope, the same bytes, the same headers and stream fields (no server needed).

`PrismClient.publish(topic, dict_or_list)` with the default options builds the envelope
without `new_envelope`, encodes it with the same `SerializeToString` call that builds it, and
lets the backends re-use per-topic binding headers (`Outgoing.plain`, `PlainTemplates`).
Each shortcut is compared here with the function it stands in for.
"""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.bindings import kafka as kb
from app.bindings import nats as nb
from app.bindings import redis as rb
from app.envelope.codec import Layout, encode
from app.envelope.model import new_envelope
from app.sdk import PrismClient, PrismPublishOptions
from app.sdk.backends.base import PlainTemplates
from app.sdk.client import _json_envelope
from app.sdk.options import DEFAULT_OPTIONS
from app.sdk.version import SDK_VERSION
from app.security.signing import SigningKey

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False) | st.text(max_size=30),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=20,
)
payloads = st.dictionaries(st.text(max_size=10), json_values, max_size=6) | st.lists(json_values, max_size=5)


@settings(max_examples=300, deadline=None)
@given(payloads, st.sampled_from(["orders.created", "t", "ä.topic"]), st.sampled_from(["ns", "order-events"]))
def test_json_envelope_is_new_envelope_and_its_bytes_are_the_codecs(payload, topic, namespace):
    env, wire = _json_envelope(topic, payload, namespace)
    ref = new_envelope(topic, payload, namespace=namespace, message_id=env.message_id,
                       published_at_ms=env.published_at_ms, producer_sdk_version=SDK_VERSION)
    assert env == ref
    assert env.producer_sdk_version == SDK_VERSION
    assert env.header.SerializeToString() == ref.header.SerializeToString()
    assert not env.header.HasField("payload")  # the model keeps the payload outside the header
    assert wire == encode(ref, Layout.REVIEWED)


URLS = {"kafka": "kafka://127.0.0.1:9092", "redis": "redis://127.0.0.1:6379/0", "nats": "nats://127.0.0.1:4222"}


def _native(client, item):
    """What the backend's publish hands to its library for one item."""
    b = client.backend
    return getattr(b, {"kafka": "_parts", "redis": "_fields", "nats": "_message"}[b.scheme])(item)


def _reference(scheme, env, layout, topic):
    """The binding's general encoding of the same envelope."""
    if scheme == "kafka":
        rec = kb.encode(env, layout)
        return rec.key, rec.value, rec.headers, rec.timestamp_ms
    if scheme == "redis":
        return rb.encode_stream_fields(env, layout)
    m = nb.encode(env, layout, subject=topic)
    return m.subject, m.data, m.headers


@pytest.mark.parametrize("scheme", sorted(URLS))
@pytest.mark.parametrize("layout", list(Layout))
def test_plain_publishes_encode_like_the_bindings(scheme, layout):
    """Several topics and namespaces, each published to repeatedly (template hits), in both layouts."""
    for namespace in ("ns-a", "ns-b"):
        client = PrismClient(URLS[scheme], namespace=namespace, layout=layout)
        for i in range(6):
            topic = ("orders.created", "orders.paid", "x")[i % 3]
            payload = {"n": i, "text": "é" * i} if i % 2 else [i, {"k": None}]
            env, plain, wire = client._build(topic, payload, DEFAULT_OPTIONS)
            assert plain
            item = client._outgoing(env, DEFAULT_OPTIONS, plain, wire)
            assert item.plain and (item.wire is not None) == (layout is Layout.REVIEWED)
            got = _native(client, item)
            ref = _reference(scheme, env, layout, topic)
            assert got == ref
            if scheme == "redis":
                assert list(got) == list(ref)  # the stream entry's field order too


@pytest.mark.parametrize("options,client_kwargs", [
    (PrismPublishOptions(correlation_id="c"), {}),
    (PrismPublishOptions(), {}),  # equal to the default options, but not them: general path
    (DEFAULT_OPTIONS, {"signing_key": SigningKey.hmac_sha256("k", b"k" * 32)}),
    (DEFAULT_OPTIONS, {"publisher_id": "svc"}),
    (PrismPublishOptions(trace_context="00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"), {}),
])
def test_other_publishes_take_the_general_path(options, client_kwargs):
    client = PrismClient(URLS["kafka"], namespace="ns", **client_kwargs)
    env, plain, wire = client._build("t", {"a": 1}, options)
    item = client._outgoing(env, options, plain, wire)
    assert not item.plain and item.wire is None


def test_payloads_that_are_not_dicts_or_lists_take_the_general_path():
    client = PrismClient(URLS["kafka"], namespace="ns")
    for payload in ("text", b"bytes", (1, 2)):
        _, plain, wire = client._build("t", payload, DEFAULT_OPTIONS)
        assert not plain and wire is None


def test_an_active_span_makes_the_publish_general():
    from opentelemetry.sdk.trace import TracerProvider

    client = PrismClient(URLS["nats"], namespace="ns")
    with TracerProvider().get_tracer("t").start_as_current_span("publish"):
        env, plain, wire = client._build("t", {"a": 1}, DEFAULT_OPTIONS)
    assert not plain and wire is None and env.observability is not None
    item = client._outgoing(env, DEFAULT_OPTIONS, plain, wire)
    assert _native(client, item) == _reference("nats", env, Layout.REVIEWED, "t")  # traceparent included


def test_templates_are_bounded():
    calls = []

    def build(env, layout):
        calls.append(env.topic)
        return [("id", env.message_id), ("topic", env.topic)]

    templates = PlainTemplates(build, ["id"], str, max_topics=4)
    client = PrismClient(URLS["kafka"], namespace="ns")
    for i in range(10):
        env, _, _ = client._build(f"t{i}", {}, DEFAULT_OPTIONS)
        assert templates.get(env, Layout.REVIEWED) == [("id", env.message_id), ("topic", f"t{i}")]
    assert len(templates._cache) <= 4
    env, _, _ = client._build("t9", {}, DEFAULT_OPTIONS)
    assert templates.get(env, Layout.REVIEWED) == [("id", env.message_id), ("topic", "t9")]
    assert calls.count("t9") == 1  # served from the template


#: What JSONB refuses or the fast storability check must notice: NaN/Infinity, U+0000, text
#: that looks like them inside strings, escapes.
risky_values = st.recursive(
    st.floats() | st.sampled_from(["NaN", "Infinity", "a\x00b", "\\u0000", "\x7f", "é", "\u2028", 1e308, -0.0])
    | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5) | st.just("NaN"), inner, max_size=4),
    max_leaves=10,
)
pg_payloads = payloads | st.dictionaries(st.text(max_size=5), risky_values, max_size=4) | st.lists(risky_values, max_size=4)


@settings(max_examples=300, deadline=None)
@given(pg_payloads, st.sampled_from(["orders.created", 'q"uote\\d', "é.ü", "\x01prism-message-id\x01"]))
def test_plain_postgres_rows_are_the_bindings(payload, topic):
    """The document assembled from the topic's template is the binding's text, byte for byte."""
    from app.bindings import postgres as pg

    client = PrismClient("postgresql://postgres@127.0.0.1:5432/test", namespace="ns")
    for _ in range(3):  # the first publish builds the template, the others use it
        env, plain, wire = client._build(topic, payload, DEFAULT_OPTIONS)
        assert plain
        assert client.backend._row(client._outgoing(env, DEFAULT_OPTIONS, plain, wire)) == pg.encode(env).params()
    # A topic that could be mistaken for a slot marker gets no template, the others do.
    assert bool(client.backend._doc_templates[(topic, "ns")]) == ("\x01" not in topic)


@pytest.mark.parametrize("layout", list(Layout))
def test_both_paths_stamp_the_sdk_version_and_it_survives_both_layouts(layout):
    """memo-031 migration tracking: the lean path and the general path both write
    `producer_sdk_version`, and it reads back from either layout's bytes."""
    from app.envelope.codec import decode

    client = PrismClient(URLS["kafka"], namespace="ns", layout=layout)
    plain_env, plain, _ = client._build("t", {"a": 1}, DEFAULT_OPTIONS)
    general_env, general, _ = client._build("t", {"a": 1}, PrismPublishOptions(correlation_id="c"))
    assert plain and not general
    for env in (plain_env, general_env):
        assert env.producer_sdk_version == SDK_VERSION
        assert decode(encode(env, layout)).producer_sdk_version == SDK_VERSION


def _nested_list(levels: int) -> list:
    deep: list = []
    for _ in range(levels):
        deep = [deep]
    return deep


@pytest.mark.parametrize("options", [None, PrismPublishOptions(content_type="application/json")])
async def test_publish_of_a_value_nested_too_deep_for_json_is_a_prism_error(options):
    """Issue 28: publish() of a list nested 100,000 deep raised RecursionError. Both build paths
    (the lean default one and new_envelope's) raise the typed error before anything is sent."""
    from app.errors import JsonTooDeepError

    client = PrismClient(URLS["kafka"], namespace="ns")  # never connected: the error comes first
    with pytest.raises(JsonTooDeepError, match="nested too deeply to encode"):
        await client.publish("t", _nested_list(100_000), options)


@settings(max_examples=200, deadline=None)
@given(st.text(min_size=1, max_size=300), st.text(max_size=200), st.integers(0, 70_000))
def test_plain_wire_lengths_of_every_size_are_the_codecs(topic, namespace, pad):
    """Issue 29: the plain path writes the bytes from a template; lengths that need two- and
    three-byte varints (long topics, payloads over 127 and 16,383 bytes), an empty namespace
    and any Unicode are still `codec.encode`'s bytes."""
    payload = {"pad": "x" * pad}
    env, wire = _json_envelope(topic, payload, namespace)
    ref = new_envelope(topic, payload, namespace=namespace, message_id=env.message_id,
                       published_at_ms=env.published_at_ms, producer_sdk_version=SDK_VERSION)
    assert wire == encode(ref, Layout.REVIEWED)
    assert env == ref


def test_the_plain_envelope_builds_its_header_only_when_read_and_then_follows_it():
    env, _ = _json_envelope("orders", {"a": 1}, "ns")
    fields = (env.message_id, env.topic, env.namespace, env.published_at_ms)
    client = PrismClient(URLS["kafka"], namespace="ns")
    client.backend._parts(client._outgoing(env, DEFAULT_OPTIONS, True, b"x"))  # a template miss reads the header
    env2, _ = _json_envelope("orders", {"a": 1}, "ns")
    item = client._outgoing(env2, DEFAULT_OPTIONS, True, b"x")
    client.backend._parts(item)  # a template hit does not
    assert env2._md is not None
    md = env.header.metadata
    assert (md.message_id, md.topic, md.namespace, md.published_at_ms) == fields
    md.topic = "changed"  # whoever changes the built header in place is what the shortcuts report
    assert env.topic == "changed" and env.message_id == fields[0]
    with pytest.raises(AttributeError):
        env.not_an_attribute  # noqa: B018


@pytest.mark.parametrize("ms", [1, 127, 128, 2**35 - 1, 2**35, 1_797_000_000_000, 2**42 - 1, 2**42, 2**50])
def test_plain_wire_writes_every_publish_time_as_protobuf_does(ms):
    """The 6-byte-varint shortcut for this era's times and the general varint for the others."""
    from app.sdk.client import _PlainWire

    env, _ = _json_envelope("orders", {"a": 1}, "ns")
    ref = new_envelope("orders", {"a": 1}, namespace="ns", message_id=env.message_id,
                       published_at_ms=ms, producer_sdk_version=SDK_VERSION)
    wire = _PlainWire("orders", "ns").wire(env.message_id.encode(), ms, env.payload_bytes())
    assert wire == encode(ref, Layout.REVIEWED)


class _RecordingProducer:
    """Stands in for aiokafka's producer: records what a publish hands it."""

    def __init__(self):
        self.sent = []

    async def send(self, topic, value, key=None, headers=None, timestamp_ms=None):
        from types import SimpleNamespace

        self.sent.append((topic, key, value, headers, timestamp_ms))
        future = asyncio.get_running_loop().create_future()
        future.set_result(SimpleNamespace(partition=0, offset=len(self.sent) - 1))
        return future

    async def send_and_wait(self, *args, **kwargs):
        return await (await self.send(*args, **kwargs))


def _recording_kafka_client(**kwargs):
    client = PrismClient(URLS["kafka"], namespace="ns", **kwargs)
    client.backend._producer = producer = _RecordingProducer()
    client.backend._known_topics.update({"orders", "other"})
    client._connected = True
    return client, producer


async def test_the_default_kafka_publish_sends_what_the_general_path_sends():
    """Issue 29: `PrismClient.publish` of a dict/list with no options goes straight to
    `KafkaBackend.publish_plain`; each record is `_parts` of the general path's `Outgoing`."""
    client, producer = _recording_kafka_client()
    calls = []
    client._build = lambda *a, **k: calls.append(a)  # the general path is not taken
    ids = [await client.publish(topic, payload) for topic, payload in
           [("orders", {"a": 1}), ("orders", [1, "é"]), ("other", {"b": None}), ("orders", {})]]
    assert not calls and len(producer.sent) == 4 and len(set(ids)) == 4
    general, _ = _recording_kafka_client()
    for (topic, key, value, headers, ts), message_id in zip(producer.sent, ids, strict=True):
        env = kb.decode(kb.KafkaRecord(key, value, headers, ts))
        assert env.message_id == message_id and env.topic == topic
        item = general._outgoing(env, DEFAULT_OPTIONS, True, value)
        assert general.backend._parts(item) == (key, value, headers, ts)
        assert (key, headers, ts) == (None, kb.headers_for(env, Layout.REVIEWED), env.published_at_ms)
        assert value == encode(env, Layout.REVIEWED)
    assert client.backend.last_offsets == {("orders", 0): 3, ("other", 0): 2}


@pytest.mark.parametrize("call,client_kwargs", [
    (lambda c: c.publish("orders", {"a": 1}, PrismPublishOptions(correlation_id="c")), {}),
    (lambda c: c.publish("orders", "text"), {}),
    (lambda c: c.publish("orders", {"a": 1}), {"layout": Layout.DRAFT}),
    (lambda c: c.publish("orders", {"a": 1}), {"publisher_id": "svc"}),
    (lambda c: c.publish("orders", {"a": 1}), {"signing_key": SigningKey.hmac_sha256("k", b"k" * 32)}),
])
async def test_publishes_that_are_not_the_default_one_take_the_general_path(call, client_kwargs):
    client, producer = _recording_kafka_client(**client_kwargs)
    plain_calls = []

    async def publish_plain(*args):
        plain_calls.append(args)
    client.backend.publish_plain = publish_plain
    await call(client)
    assert not plain_calls and len(producer.sent) == 1


async def test_the_default_publish_under_an_active_span_carries_its_trace_context():
    from opentelemetry.sdk.trace import TracerProvider

    client, producer = _recording_kafka_client()
    with TracerProvider().get_tracer("t").start_as_current_span("publish"):
        await client.publish("orders", {"a": 1})
    (_topic, key, value, headers, ts), = producer.sent
    assert kb.decode(kb.KafkaRecord(key, value, headers, ts)).observability is not None


async def test_a_default_publish_that_kafka_does_not_confirm_is_a_publish_error():
    from app.errors import PublishError

    client, producer = _recording_kafka_client()

    async def refuse(*args, **kwargs):
        raise ConnectionError("broker gone")
    producer.send = refuse
    with pytest.raises(PublishError, match="Kafka did not confirm"):
        await client.publish("orders", {"a": 1})


@pytest.mark.parametrize("attr,value", [
    ("signing_key", SigningKey.hmac_sha256("k", b"k" * 32)),
    ("publisher_id", "svc"),
    ("publisher_team", "team"),
    ("auth_token", "jwt"),
    ("layout", Layout.DRAFT),
])
async def test_a_client_setting_assigned_after_connecting_is_honoured_by_the_next_publish(attr, value):
    """Issue 29: whether the default publish may take the direct path is worked out when a
    client attribute is assigned, not per publish; assigning one after connecting moves the
    next publish to the general path, and assigning it back returns it to the direct one."""
    client, producer = _recording_kafka_client()
    plain_calls = []
    direct = client.backend.publish_plain

    async def publish_plain(*args):
        plain_calls.append(args)
        await direct(*args)
    client.backend.publish_plain = publish_plain
    await client.publish("orders", {"a": 1})
    assert len(plain_calls) == 1
    original = getattr(client, attr)
    setattr(client, attr, value)
    await client.publish("orders", {"a": 1})
    assert len(plain_calls) == 1 and len(producer.sent) == 2
    (_topic, key, value_bytes, headers, ts) = producer.sent[1]
    env = kb.decode(kb.KafkaRecord(key, value_bytes, headers, ts))
    if attr == "signing_key":
        assert env.security is not None and env.security.signature
    elif attr == "layout":
        assert (kb.PREFIX + "envelope-layout", b"draft") in headers
    else:
        assert env.security is not None
    setattr(client, attr, original)
    await client.publish("orders", {"a": 1})
    assert len(plain_calls) == 2


async def test_a_closed_client_does_not_take_the_direct_path():
    from app.errors import ConfigError

    client, producer = _recording_kafka_client()
    await client.publish("orders", {"a": 1})
    client._closed, client._connected = True, False  # what close() leaves
    with pytest.raises(ConfigError, match="closed"):
        await client.publish("orders", {"a": 1})
    assert len(producer.sent) == 1


async def test_the_default_publish_with_only_baggage_in_the_context_sends_no_trace_context():
    """A non-empty OpenTelemetry context without a span: the cheap test says "look", the full
    one finds no span, and the direct path sends the plain record."""
    from opentelemetry import baggage, context

    client, producer = _recording_kafka_client()
    token = context.attach(baggage.set_baggage("k", "v"))
    try:
        await client.publish("orders", {"a": 1})
    finally:
        context.detach(token)
    (_topic, key, value, headers, ts), = producer.sent
    env = kb.decode(kb.KafkaRecord(key, value, headers, ts))
    assert env.observability is None and value == encode(env, Layout.REVIEWED)


async def test_an_unknown_opentelemetry_runtime_context_still_propagates_the_span(monkeypatch):
    """If the ContextVar behind OpenTelemetry's context cannot be read (another runtime
    context), `otel_context` always says "look": a span is still found and propagated."""
    from opentelemetry.sdk.trace import TracerProvider

    from app.sdk import client as client_module

    monkeypatch.setattr(client_module, "otel_context", lambda: True)
    client, producer = _recording_kafka_client()
    await client.publish("orders", {"a": 1})
    with TracerProvider().get_tracer("t").start_as_current_span("publish"):
        await client.publish("orders", {"a": 1})
    plain, traced = (kb.decode(kb.KafkaRecord(k, v, h, t)) for _topic, k, v, h, t in producer.sent)
    assert plain.observability is None and traced.observability is not None


@settings(max_examples=100, deadline=None)
@given(st.text(min_size=1, max_size=60), st.text(min_size=1, max_size=40),
       st.lists(st.dictionaries(st.text(max_size=8), st.integers() | st.text(max_size=300), max_size=4),
                min_size=1, max_size=3))
def test_direct_kafka_publishes_of_any_topic_and_namespace_are_the_general_paths_records(topic, namespace, payloads):
    """Issue 29: the direct path's record - header list split once per (topic, namespace)
    around the message id, bytes from the template - is the general path's and the codec's,
    on the first publish to a topic (template miss) and on the later ones (hits)."""

    async def run():
        client, producer = _recording_kafka_client()
        client.namespace = namespace
        client.backend._known_topics.add(topic)
        ids = [await client.publish(topic, payload) for payload in payloads]
        general, _ = _recording_kafka_client()
        for (sent_topic, key, value, headers, ts), message_id in zip(producer.sent, ids, strict=True):
            env = kb.decode(kb.KafkaRecord(key, value, headers, ts))
            assert (sent_topic, env.message_id, env.topic, env.namespace) == (topic, message_id, topic, namespace)
            assert general.backend._parts(general._outgoing(env, DEFAULT_OPTIONS, True, value)) == \
                (key, value, headers, ts)
            assert headers == kb.headers_for(env, Layout.REVIEWED) and value == encode(env, Layout.REVIEWED)

    asyncio.run(run())

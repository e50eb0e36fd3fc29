"""Consumers that use the schema (RFC-030 "Consumer PII Awareness"): a received message is
decoded by the schema its envelope references (protobuf, JSON Schema, Avro), resolved through
a real registry and cached; `is_pii_field()` and `mask_pii()` follow the schema's tags. The
attacker's side: references to schemas that do not exist, to another subject, with another
hash, a foreign host, extra untagged fields, deep nesting. And RFC-030 phase 2 at publish:
`require_schema` refuses a topic without a registered subject before anything is sent."""

from __future__ import annotations

import asyncio
import copy
import io
import json
from typing import Any

import fastavro
import pytest
from google.protobuf import descriptor_pool, message_factory

from app.envelope.model import new_envelope
from app.errors import ConfigError, SchemaReferenceError, SchemaRequiredError
from app.schema.protoparse import compile_proto
from app.schema.registry import Registry
from app.schema.resolve import resolve_schema_config
from app.sdk import PrismClient
from app.sdk.received import ReceivedEnvelope
from app.sdk.schemas import MASK, MAX_DEPTH, PayloadSchema
from tests.sdk.test_publish_validation import client_with_recorder
from tests.sdk.test_version_reports import registry_server  # noqa: F401 - a fixture

TOPIC = "users.profile"
JSON_SCHEMA = json.dumps({
    "title": "Profile", "type": "object",
    "properties": {
        "user_id": {"type": "string", "x-prism-pii": "none"},
        "contact": {"type": "object", "properties": {"email": {"type": "string", "x-prism-pii": "email"},
                                                     "city": {"type": "string"}}},
        "cards": {"type": "array", "items": {"type": "object", "properties": {
            "pan": {"type": "string", "x-prism-encrypt": "aes256"}, "brand": {"type": "string"}}}},
        "address": {"type": "object", "x-prism-pii": "address",
                    "properties": {"street": {"type": "string"}}},
        "prefs": {"type": "object", "additionalProperties": {"type": "object", "properties": {
            "phone": {"type": "string", "x-prism-pii": "phone"}}}},
    },
})
AVRO = json.dumps({
    "type": "record", "name": "Profile", "namespace": "users",
    "fields": [
        {"name": "user_id", "type": "string", "prism.pii": "none"},
        {"name": "contact", "type": {"type": "record", "name": "Contact", "fields": [
            {"name": "email", "type": "string", "prism.pii": "email"},
            {"name": "city", "type": "string"}]}},
        {"name": "backup", "type": ["null", "Contact"], "default": None},
        {"name": "phones", "type": {"type": "map", "values": "string"}, "prism.pii": "phone"},
        {"name": "visits", "type": "int"},
    ],
})
PROTO = '''syntax = "proto3";
package users.v1;
import "prism/annotations.proto";
message Profile {
  string user_id = 1 [(prism.pii) = "none"];
  Contact contact = 2;
  repeated Contact previous = 3;
  map<string, Contact> by_role = 4;
  int64 birth_year = 5 [(prism.pii) = "dob"];
  bytes avatar = 6 [(prism.pii) = "photo"];
  int32 visits = 7;
  message Contact {
    string email = 1 [(prism.pii) = "email"];
    string city = 2;
  }
}
'''


class Delivery:
    """Stands in for a backend delivery (the tests build received messages directly)."""

    backend, redelivered, ref = "test", False, "0:0"

    async def ack(self) -> None: ...

    async def nack(self) -> None: ...


def _proto_class(name: str = "users.v1.Profile") -> Any:
    pool = descriptor_pool.DescriptorPool()
    for fd in compile_proto(PROTO).fds.file:
        pool.Add(fd)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(name))


def _envelope(payload: Any, resolved: Any, *, topic: str = TOPIC, content_type: str | None = None) -> Any:
    """An envelope stamped the way the worker's enrich stage (or a producer's schema=) stamps it."""
    env = new_envelope(topic, payload, namespace="users", content_type=content_type)
    sc = env.ensure_schema()
    for name, value in resolved.schema_context().items():
        if name != "deprecated_fields_used" and value:
            setattr(sc, name, value)
    return env


def _received(env: Any, client: PrismClient) -> ReceivedEnvelope:
    return ReceivedEnvelope(env, Delivery(), schemas=client.schemas)  # type: ignore[arg-type]


def _register(url: str, registry: Registry, text: str, fmt: str, subject: str = TOPIC) -> Any:
    registry.register(subject, text, fmt, actor="test")
    return resolve_schema_config({"registry_type": "prism", "registry_url": url, "subject": subject,
                                  "version": "latest"})


async def test_json_schema_decode_pii_and_mask(registry_server) -> None:  # noqa: F811
    url, registry = registry_server
    resolved = _register(url, registry, JSON_SCHEMA, "JSON")
    client = PrismClient("kafka://127.0.0.1:1", namespace="users", registry_url=url)
    doc = {"user_id": "u-1", "contact": {"email": "a@example.com", "city": "Lyon"},
           "cards": [{"pan": "4111111111111111", "brand": "visa"}, {"pan": "5500000000000004", "brand": "mc"}],
           "address": {"street": "1 rue X"}, "prefs": {"home": {"phone": "+33 1", "lang": "fr"}},
           "nickname": "ace"}  # not in the schema: untagged, so not PII
    msg = _received(_envelope(doc, resolved), client)
    with pytest.raises(ConfigError, match="not resolved yet"):
        msg.is_pii_field("$.contact.email")
    value = await msg.decoded()
    assert value == doc
    for path, pii in [("$.contact.email", True), ("$.contact.city", False), ("$.cards[1].pan", True),
                      ("$.cards[*].brand", False), ("$.address.street", True), ("$.address", True),
                      ("$.prefs.home.phone", True), ("$.prefs['home'].lang", False), ("$.user_id", False),
                      ("$.nickname", False), ("$.nope.deeper", False), ("contact.email", True)]:
        assert msg.is_pii_field(path) is pii, path
    before = copy.deepcopy(value)
    masked = msg.mask_pii()
    assert value == before  # never mutated
    assert masked == {"user_id": "u-1", "contact": {"email": MASK, "city": "Lyon"},
                      "cards": [{"pan": MASK, "brand": "visa"}, {"pan": MASK, "brand": "mc"}],
                      "address": MASK, "prefs": {"home": {"phone": MASK, "lang": "fr"}}, "nickname": "ace"}
    masked["contact"]["city"] = "changed"
    assert value["contact"]["city"] == "Lyon"  # no shared containers either
    schema = await msg.payload_schema()
    assert (schema.subject, schema.version, schema.format.value) == (TOPIC, 1, "JSON")
    assert schema.pii_paths() == ["address", "cards.pan", "contact.email", "prefs.*.phone"]
    # the next message of the same version costs no registry call
    fetches = client.schemas.fetches  # type: ignore[union-attr]
    again = _received(_envelope(doc, resolved), client)
    assert (await again.decoded())["nickname"] == "ace" and client.schemas.fetches == fetches  # type: ignore[union-attr]


async def test_avro_binary_and_json_payloads(registry_server) -> None:  # noqa: F811
    url, registry = registry_server
    resolved = _register(url, registry, AVRO, "AVRO")
    client = PrismClient("kafka://127.0.0.1:1", namespace="users", registry_url=url)
    datum = {"user_id": "u-2", "contact": {"email": "b@example.com", "city": "Oslo"},
             "backup": {"email": "c@example.com", "city": "Bergen"}, "phones": {"home": "+47 1"}, "visits": 3}
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, fastavro.parse_schema(json.loads(AVRO)), datum)
    msg = _received(_envelope(buf.getvalue(), resolved, content_type="application/avro"), client)
    value = await msg.decoded()
    assert value == datum
    assert msg.is_pii_field("$.backup.email") and msg.is_pii_field("$.phones.home")
    assert not msg.is_pii_field("$.backup.city") and not msg.is_pii_field("$.visits")
    assert msg.mask_pii() == {"user_id": "u-2", "contact": {"email": MASK, "city": "Oslo"},
                              "backup": {"email": MASK, "city": "Bergen"}, "phones": MASK, "visits": 3}
    as_json = _received(_envelope(datum, resolved), client)  # a JSON document under an Avro schema
    assert await as_json.decoded() == datum
    broken = _received(_envelope(b"\x99\x99\x99", resolved, content_type="application/avro"), client)
    with pytest.raises(Exception, match="not a valid AVRO value"):
        await broken.decoded()


async def test_protobuf_decode_and_mask_a_message(registry_server) -> None:  # noqa: F811
    url, registry = registry_server
    resolved = _register(url, registry, PROTO, "PROTOBUF")
    client = PrismClient("kafka://127.0.0.1:1", namespace="users", registry_url=url)
    cls = _proto_class()
    sent = cls(user_id="u-3", birth_year=1990, avatar=b"\x89PNG", visits=4)
    sent.contact.email, sent.contact.city = "d@example.com", "Rome"
    sent.previous.add(email="old@example.com", city="Pisa")
    sent.by_role["admin"].email = "root@example.com"
    msg = _received(_envelope(sent, resolved), client)
    value = await msg.decoded()
    assert value.SerializeToString(deterministic=True) == sent.SerializeToString(deterministic=True)
    assert value.DESCRIPTOR.full_name == "users.v1.Profile"
    assert msg.is_pii_field("$.contact.email") and msg.is_pii_field("$.previous[0].email")
    assert msg.is_pii_field("$.by_role.admin.email") and msg.is_pii_field("$.byRole.admin.email")  # JSON name too
    assert msg.is_pii_field("$.birth_year") and not msg.is_pii_field("$.visits")
    masked = msg.mask_pii()
    assert value.contact.email == "d@example.com"  # the decoded message is untouched
    assert (masked.contact.email, masked.contact.city) == (MASK, "Rome")
    assert masked.previous[0].email == MASK and masked.by_role["admin"].email == MASK
    assert masked.birth_year == 0 and masked.avatar == MASK.encode() and masked.visits == 4
    assert masked.user_id == "u-3"
    # a dict (the JSON mapping of the message) is masked by the same tags
    from google.protobuf.json_format import MessageToDict

    as_dict = MessageToDict(value)
    assert msg.mask_pii(as_dict)["byRole"]["admin"]["email"] == MASK


async def test_forged_and_broken_references(registry_server) -> None:  # noqa: F811
    url, registry = registry_server
    resolved = _register(url, registry, JSON_SCHEMA, "JSON")
    other = _register(url, registry, json.dumps({"type": "object", "properties": {"email": {"type": "string"}}}),
                      "JSON", subject="scratch.nopii")
    client = PrismClient("kafka://127.0.0.1:1", namespace="users", registry_url=url)
    resolver = client.schemas
    assert resolver is not None
    doc = {"contact": {"email": "a@example.com"}}

    def forged(**fields: str) -> ReceivedEnvelope:
        env = _envelope(doc, resolved)
        for k, v in fields.items():
            setattr(env.header.schema, k, v)
        return _received(env, client)

    # a version that does not exist: a clear error, remembered (no second registry call)
    missing = forged(schema_url=f"{url}/v1/subjects/{TOPIC}/versions/99", schema_hash="")
    with pytest.raises(SchemaReferenceError, match="version 99 cannot be read") as e:
        await missing.decoded()
    assert e.value.code == "schema_reference_invalid" and missing.settled is None
    n = resolver.fetches
    with pytest.raises(SchemaReferenceError):
        await forged(schema_url=f"{url}/v1/subjects/{TOPIC}/versions/99", schema_hash="").decoded()
    assert resolver.fetches == n
    # another subject's schema (one with no PII tags, so nothing would be masked): refused unasked
    with pytest.raises(SchemaReferenceError, match=r"references subject 'scratch\.nopii'"):
        await forged(schema_url=other.url, schema_hash=other.hash).decoded()
    assert resolver.fetches == n
    # ... unless the consumer names that subject itself
    assert (await forged(schema_url=other.url, schema_hash=other.hash).payload_schema(
        subject="scratch.nopii")).subject == "scratch.nopii"
    # the right subject version with another content hash
    with pytest.raises(SchemaReferenceError, match="claims schema hash"):
        await forged(schema_hash="sha256:" + "0" * 64).decoded()
    # a foreign host in the URL is never called: only the path is read, the client's registry asked
    evil = forged(schema_url=f"http://203.0.113.9:1/v1/subjects/{TOPIC}/versions/1")
    assert (await evil.decoded()) == doc
    # nothing usable, or garbage (digits int() refuses: "²", 5,000 of them - were a ValueError)
    for url_ in ("", "file:///etc/passwd", f"{url}/v1/subjects/{TOPIC}/versions/latest",
                 f"{url}/v1/subjects/{TOPIC}/versions/²", f"{url}/v1/subjects/{TOPIC}/versions/{'9' * 5000}",
                 f"{url}/v1/schemas/{'9' * 5000}"):
        with pytest.raises(SchemaReferenceError, match="names no registered schema"):
            await forged(schema_url=url_).decoded()
    # a schema id (the Confluent header, app/formats): must be registered under this topic
    by_id = _envelope(doc, resolved)
    by_id.header.schema.schema_url = ""
    by_id.extensions["schema.id"] = str(registry.get(TOPIC, 1).id).encode()
    assert (await _received(by_id, client).decoded()) == doc
    foreign_id = _envelope(doc, resolved)
    foreign_id.header.schema.schema_url = f"{url}/schemas/ids/{registry.get('scratch.nopii', 1).id}"
    foreign_id.header.schema.schema_hash = ""
    with pytest.raises(SchemaReferenceError, match="not registered under"):
        await _received(foreign_id, client).decoded()
    for odd in ("²", "9" * 5000):
        odd_id = _envelope(doc, resolved)
        odd_id.header.schema.schema_url = ""
        odd_id.extensions["schema.id"] = odd.encode()
        with pytest.raises(SchemaReferenceError, match="names no registered schema"):
            await _received(odd_id, client).decoded()
    unknown_id = _envelope(doc, resolved)
    unknown_id.header.schema.schema_url = f"{url}/v1/schemas/424242"
    with pytest.raises(SchemaReferenceError, match="schema id 424242 cannot be read"):
        await _received(unknown_id, client).decoded()
    # no registry configured: said plainly
    with pytest.raises(ConfigError, match="needs a registry"):
        await ReceivedEnvelope(_envelope(doc, resolved), Delivery()).decoded()  # type: ignore[arg-type]


def test_deep_nesting_is_masked_whole_and_the_cache_is_bounded() -> None:
    schema = PayloadSchema.from_text(JSON_SCHEMA, "JSON", subject=TOPIC, version=1)
    deep: Any = {"x": 1}
    for _ in range(MAX_DEPTH + 10):
        deep = {"n": deep}
    masked = schema.mask_pii({"contact": {"email": "e"}, "extra": deep})
    assert masked["contact"]["email"] == MASK
    node = masked["extra"]
    depth = 0
    while isinstance(node, dict):
        node, depth = node["n"], depth + 1
    assert node == MASK and depth < MAX_DEPTH + 10  # cut off (masked), not walked to the bottom

    from app.sdk.schemas import SchemaResolver

    resolver = SchemaResolver("http://127.0.0.1:1", max_entries=2)
    for i in range(5):
        resolver._put(("sv", "s", i), schema)
    assert len(resolver._cache) == 2


async def test_publish_needs_a_registered_subject_when_the_namespace_requires_a_schema(
        registry_server) -> None:  # noqa: F811
    url, registry = registry_server
    registry.set_policy(actor="admin", namespace="order-events", require_schema=True)
    client, rec = client_with_recorder(registry_url=url)  # namespace order-events
    with pytest.raises(SchemaRequiredError) as e:
        await client.publish("orders.created", {"order_id": "o-1"})
    assert e.value.code == "schema_required" and "orders.created" in str(e.value)
    assert "prism schema register" in str(e.value)
    with pytest.raises(SchemaRequiredError):
        await client.publish_batch([("orders.other", {"a": 1})])
    assert rec.sent == []
    registry.register("orders.created", JSON_SCHEMA, "JSON", actor="test")
    await client.publish("orders.created", {"order_id": "o-1"})
    assert len(rec.sent) == 1
    # a namespace without the policy publishes anything
    free, free_rec = client_with_recorder(registry_url=url)
    free.namespace = "playground"
    await free.publish("whatever.topic", {"a": 1})
    assert len(free_rec.sent) == 1
    # a registry that cannot be reached does not stop production (logged), unlike the worker's start
    down, down_rec = client_with_recorder(registry_url="http://127.0.0.1:1")
    await down.publish("orders.new", {"a": 1})
    assert len(down_rec.sent) == 1


@pytest.mark.integration
async def test_end_to_end_subscriber_decodes_by_the_envelope(redis_url, topic, registry_server) -> None:  # noqa: F811
    url, registry = registry_server
    resolved = _register(url, registry, JSON_SCHEMA, "JSON", subject=topic)
    async with PrismClient(redis_url, namespace="users", schema=resolved) as producer:
        await producer.publish(topic, {"user_id": "u", "contact": {"email": "e@example.com", "city": "Nice"}})
    client = PrismClient(redis_url, namespace="users", registry_url=url)
    async with asyncio.timeout(30), client, client.subscribe(topic, group="analytics") as sub:
        msg = await sub.receive(timeout=5)
        assert msg is not None
        assert msg.mask_pii(await msg.decoded()) == {"user_id": "u", "contact": {"email": MASK, "city": "Nice"}}
        assert msg.is_pii_field("$.contact.email")
        await msg.ack()

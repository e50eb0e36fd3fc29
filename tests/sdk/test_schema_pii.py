"""Schema assertion modes (error / warn / ignore), schema context population, and PII-aware
payload access."""

from __future__ import annotations

import asyncio
import json
import logging
import warnings

import pytest
from google.protobuf import descriptor_pool, message_factory

from app.errors import SchemaAssertionError
from app.schema.protoparse import compile_proto
from app.schema.resolve import build_resolved
from app.sdk import PiiAccessWarning, PrismClient
from app.sdk.pii import PiiDict, PiiPolicy, guard

ORDER_PROTO = """syntax = "proto3";
package shop;
import "prism/annotations.proto";
message Order {
  string order_id = 1;
  string email = 2 [(prism.pii) = "email"];
  Customer customer = 3;
  int32 old_total = 4 [deprecated = true];
  message Customer { string name = 1 [(prism.pii) = "name"]; string tier = 2; }
}
"""
ORDER_JSON_SCHEMA = json.dumps({
    "title": "Order", "type": "object",
    "properties": {
        "order_id": {"type": "string"},
        "customer": {"type": "object", "properties": {
            "email": {"type": "string", "x-prism-pii": "email"}, "tier": {"type": "string"}}},
        "items": {"type": "array", "items": {"type": "object", "properties": {
            "ssn": {"type": "string", "x-prism-pii": "ssn"}, "sku": {"type": "string"}}}},
    },
})


def order_class():
    """The `shop.Order` class compiled from ORDER_PROTO, in a private descriptor pool."""
    pool = descriptor_pool.DescriptorPool()
    for f in compile_proto(ORDER_PROTO).files:
        pool.Add(f)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("shop.Order"))


V2 = build_resolved(ORDER_JSON_SCHEMA, "JSON", url="registry/orders/2", version="v2")
V3 = build_resolved(ORDER_JSON_SCHEMA, "JSON", url="registry/orders/3", version="v3")


async def publish_versions(url: str, topic: str) -> None:
    v2, v3 = V2, V3
    async with PrismClient(url, namespace="shop", schema=v2) as c2, PrismClient(url, namespace="shop", schema=v3) as c3:
        await c2.publish(topic, {"order_id": "a"})
        await c3.publish(topic, {"order_id": "b"})
        await c2.publish(topic, {"order_id": "c"})


@pytest.mark.integration
async def test_schema_assertion_error_mode_raises_with_the_message_attached(redis_url, topic):
    await publish_versions(redis_url, topic)
    async with PrismClient(redis_url, namespace="shop") as client, asyncio.timeout(20), \
            client.subscribe(topic, group="strict", expected_version="v2", schema=V2) as sub:
        first = await sub.receive(timeout=5)
        assert first.schema.schema_version == "v2" and first.payload() == {"order_id": "a"}
        await first.ack()
        with pytest.raises(SchemaAssertionError, match="schema version v3, the subscriber expects v2") as info:
            await sub.receive(timeout=5)
        assert info.value.code == "schema_mismatch" and info.value.actual == "v3"
        assert info.value.delivery.payload() == {"order_id": "b"}  # the consumer decides: DLQ + ack, here
        await info.value.delivery.ack()
        third = await sub.receive(timeout=5)  # the subscription goes on after the error
        assert third.payload() == {"order_id": "c"}


@pytest.mark.integration
async def test_schema_assertion_warn_and_ignore_modes_deliver_everything(redis_url, topic, caplog):
    await publish_versions(redis_url, topic)
    async with PrismClient(redis_url, namespace="shop") as client, asyncio.timeout(20):
        for mode, group in (("warn", "lenient"), ("ignore", "silent")):
            caplog.clear()
            with caplog.at_level(logging.WARNING, logger="prism.schema.assertion"):
                async with client.subscribe(topic, group=group, expected_version="2", on_mismatch=mode,
                                            schema=V2) as sub:
                    got = [(await sub.receive(timeout=5)).payload()["order_id"] for _ in range(3)]
            assert got == ["a", "b", "c"]
            warned = [r.getMessage() for r in caplog.records if "unexpected schema version" in r.getMessage()]
            assert len(warned) == (1 if mode == "warn" else 0), (mode, warned)


@pytest.mark.integration
async def test_schema_context_and_pii_warnings_for_json_payloads(redis_url, topic):
    schema = V2
    async with PrismClient(redis_url, namespace="shop", schema=schema) as client, asyncio.timeout(20):
        await client.publish(topic, {"order_id": "a", "customer": {"email": "ann@example.com", "tier": "gold"},
                                     "items": [{"ssn": "123-45-6789", "sku": "X1"}]})
        async with client.subscribe(topic, group="g", schema=schema) as sub:
            msg = await sub.receive(timeout=5)
    assert msg.schema.schema_url == "registry/orders/2" and msg.schema.schema_hash == schema.hash
    assert msg.security.contains_pii  # the schema has PII fields
    order = msg.payload()
    with warnings.catch_warnings():
        warnings.simplefilter("error", PiiAccessWarning)
        assert order["order_id"] == "a" and order["customer"]["tier"] == "gold" and order["items"][0]["sku"] == "X1"
    with pytest.warns(PiiAccessWarning, match="'customer.email'") as record:
        assert order["customer"]["email"] == "ann@example.com"
    assert "ann@example.com" not in str(record[0].message)  # the field is named, never its value
    assert record[0].filename == __file__  # attributed to the consumer's line
    with pytest.warns(PiiAccessWarning, match=r"'items\[\].ssn'"):
        assert [item["ssn"] for item in order["items"]] == ["123-45-6789"]
    with pytest.warns(PiiAccessWarning):  # serializing (logging, storing) the payload reads the PII too
        assert json.loads(json.dumps(order))["customer"]["email"] == "ann@example.com"


@pytest.mark.integration
async def test_protobuf_payload_pii_proxy_and_deprecated_fields(redis_url, topic):
    Order = order_class()
    schema = build_resolved(ORDER_PROTO, "PROTOBUF", url="registry/shop.Order/3", version="v3")
    async with PrismClient(redis_url, namespace="shop", schema=schema) as client, asyncio.timeout(20):
        sent = Order(order_id="o-1", email="bob@example.com", old_total=5)
        sent.customer.name = "Bob"
        sent.customer.tier = "silver"
        await client.publish(topic, sent)
        async with client.subscribe(topic, group="g", schema=schema, payload_type=Order) as sub:
            msg = await sub.receive(timeout=5)
    assert list(msg.schema.deprecated_fields_used) == ["old_total"]
    order = msg.payload()
    with warnings.catch_warnings():
        warnings.simplefilter("error", PiiAccessWarning)
        assert order.order_id == "o-1" and order.customer.tier == "silver"
    with pytest.warns(PiiAccessWarning, match="'Order.email'"):
        assert order.email == "bob@example.com"
    with pytest.warns(PiiAccessWarning, match="'Order.Customer.name'"):
        assert order.customer.name == "Bob"
    assert order.unwrap() == sent


def test_pii_dict_reports_to_the_audit_logger_and_unwraps(caplog):
    policy = PiiPolicy({"email", "a.b"}).for_message("t", "m-1", True)
    data = guard({"email": "x@y", "a": {"b": 1, "c": 2}, "n": 3}, policy)
    assert isinstance(data, PiiDict)
    with caplog.at_level(logging.INFO, logger="prism.sdk.pii"), pytest.warns(PiiAccessWarning):
        data.get("email")
    assert caplog.records[0].prism_pii == {"field": "email", "topic": "t", "message_id": "m-1"}
    assert "x@y" not in caplog.text
    with warnings.catch_warnings():
        warnings.simplefilter("error", PiiAccessWarning)
        assert data["n"] == 3 and data["a"]["c"] == 2 and type(data.unwrap()) is dict
    with pytest.warns(PiiAccessWarning):
        assert dict(data["a"].items())["b"] == 1
    assert guard({"email": 1}, PiiPolicy(())) == {"email": 1}  # no fields: no wrapper at all


def test_flagged_message_without_a_field_list_warns_once_per_message():
    from app.envelope import new_envelope
    from app.sdk.received import ReceivedEnvelope

    env = new_envelope("t", {"x": 1}, namespace="n", contains_pii=True)
    msg = ReceivedEnvelope(env, delivery=None, pii=PiiPolicy(()))  # type: ignore[arg-type]
    with pytest.warns(PiiAccessWarning, match="flagged contains_pii"):
        assert msg.payload() == {"x": 1}
    with warnings.catch_warnings():
        warnings.simplefilter("error", PiiAccessWarning)
        assert msg.payload() == {"x": 1}


def test_pii_warnings_are_one_per_call_site_not_one_per_message():
    """The warning text names field and topic, never the message: Python's default filter then
    shows it once per call site, instead of once for every message a consumer reads. A message
    not flagged contains_pii, without a field list, never warns; a flagged one warns once per
    subscription and topic."""
    from app.envelope import new_envelope
    from app.sdk.received import ReceivedEnvelope

    subscription = PiiPolicy(())
    plain = ReceivedEnvelope(new_envelope("t", {"x": 1}, namespace="n"), delivery=None, pii=subscription)  # type: ignore[arg-type]
    with warnings.catch_warnings():
        warnings.simplefilter("error", PiiAccessWarning)
        assert plain.payload() == {"x": 1}
    flagged = [ReceivedEnvelope(new_envelope("t", {"x": i}, namespace="n", contains_pii=True), delivery=None,
                                pii=subscription) for i in range(3)]  # type: ignore[arg-type]
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for m in flagged:
            m.payload()
    assert len(seen) == 1 and "topic 't'" in str(seen[0].message)
    assert all(m.message_id not in str(seen[0].message) for m in flagged)

    fields = PiiPolicy({"email"})
    texts = set()
    for i in range(3):
        data = guard({"email": f"a{i}@b", "n": i}, fields.for_message("t", f"m-{i}", True))
        with pytest.warns(PiiAccessWarning) as record:
            data["email"]
        texts.add(str(record[0].message))
        with warnings.catch_warnings():
            warnings.simplefilter("error", PiiAccessWarning)
            with pytest.raises(KeyError):
                data["phone"]  # absent: no report of a read that did not happen
    assert texts == {"read PII field 'email' on topic 't'"}  # the same text each message: shown once per site

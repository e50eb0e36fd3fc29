"""SDK publish-time validation (RFC-030 Workflow 1) and `publish_envelope`'s required fields
(memo-031 recommendation 1): a refused message is never handed to the backend."""

from __future__ import annotations

import json

import pytest
from prometheus_client import CollectorRegistry

from app.envelope.model import new_envelope
from app.errors import ConfigError, SchemaValidationError, ValidationError
from app.schema.resolve import build_resolved
from app.sdk import PrismClient
from tests.sdk.test_version_reports import registry_server  # noqa: F401 - a fixture

SCHEMA = json.dumps({"title": "Order", "type": "object", "required": ["order_id"],
                     "properties": {"order_id": {"type": "string"},
                                    "items": {"type": "array", "items": {
                                        "type": "object", "properties": {"price": {"type": "number"}}}}}})


class Recorder:
    """Stands in for the backend's publish: what would have been sent."""

    def __init__(self) -> None:
        self.sent: list = []

    async def __call__(self, items) -> None:
        self.sent.extend(items)


def client_with_recorder(**kw) -> tuple[PrismClient, Recorder]:
    client = PrismClient("kafka://127.0.0.1:1", namespace="order-events", **kw)
    rec = Recorder()
    client.backend.publish = rec  # type: ignore[method-assign]
    client._connected = True
    return client, rec


async def test_invalid_payload_raises_before_anything_is_sent():
    reg = CollectorRegistry()
    schema = build_resolved(SCHEMA, "json", url="file://order.json", version="v2")
    client, rec = client_with_recorder(schema=schema, metrics=reg)
    with pytest.raises(SchemaValidationError) as e:
        await client.publish("orders.created", {"order_id": "o-1", "items": [{"price": 1}, {"price": "x"}]},
                             schema_validation=True)
    assert e.value.path == "$.items[1].price" and e.value.code == "schema_validation_failed"
    assert [v.path for v in e.value.violations] == ["$.items[1].price"]
    assert rec.sent == []
    mid = await client.publish("orders.created", {"order_id": "o-2"}, schema_validation=True)
    (out,) = rec.sent
    assert out.envelope.message_id == mid and out.envelope.schema.schema_version == "v2"
    labels = {"envelope_namespace": "order-events", "schema_version": "v2"}
    assert reg.get_sample_value("prism_sdk_schema_validations_total", {**labels, "result": "invalid"}) == 1
    assert reg.get_sample_value("prism_sdk_schema_validations_total", {**labels, "result": "valid"}) == 1
    assert reg.get_sample_value("prism_sdk_schema_validation_seconds_count", {"envelope_namespace": "order-events"}) == 2
    # without schema_validation nothing is checked (the worker's validation mode decides later)
    await client.publish("orders.created", {"items": "nope"})
    assert len(rec.sent) == 2


async def test_validation_needs_a_schema_and_version_needs_validation():
    client, rec = client_with_recorder()
    with pytest.raises(ConfigError, match="needs a schema"):
        await client.publish("orders.created", {"order_id": "o"}, schema_validation=True)
    with pytest.raises(ConfigError, match="needs a registry"):
        await client.publish("orders.created", {"order_id": "o"}, schema_validation=True, schema_version="2")
    with pytest.raises(ConfigError, match="only used with schema_validation"):
        await client.publish("orders.created", {"order_id": "o"}, schema_version="2")
    assert rec.sent == []


async def test_schema_version_is_fetched_once_from_the_registry(registry_server):  # noqa: F811
    url, registry = registry_server
    v1 = json.loads(SCHEMA)
    v1["properties"]["order_id"]["maxLength"] = 3  # v2 widens it: a BACKWARD-compatible evolution
    registry.register("orders.created", json.dumps(v1), "JSON", actor="test")
    registry.register("orders.created", SCHEMA, "JSON", actor="test")
    client, rec = client_with_recorder(registry_url=url)
    with pytest.raises(SchemaValidationError) as e:
        await client.publish("orders.created", {"order_id": "o-1234"}, schema_validation=True, schema_version=1)
    assert e.value.path == "$.order_id" and e.value.schema_version == "v1"
    await client.publish("orders.created", {"order_id": "o-1"}, schema_validation=True, schema_version=1)
    await client.publish("orders.created", {"order_id": "o-1234"}, schema_validation=True, schema_version="2")
    assert [o.envelope.schema.schema_version for o in rec.sent] == ["v1", "v2"]
    assert len(client._validation._by_version) == 2  # one registry fetch per version


async def test_publish_envelope_checks_the_required_fields():
    client, rec = client_with_recorder()
    env = new_envelope("orders.created", {"order_id": "o"}, namespace="order-events")
    env.header.metadata.message_id = ""
    env.header.metadata.namespace = ""
    env.payload = type(env.payload).absent()
    with pytest.raises(ValidationError) as e:
        await client.publish_envelope(env)
    fields = {p.path for p in e.value.problems}
    assert {"metadata.message_id", "metadata.namespace", "payload"} <= fields
    assert rec.sent == []
    ok = new_envelope("orders.created", {"order_id": "o"}, namespace="order-events")
    assert await client.publish_envelope(ok) == ok.message_id and len(rec.sent) == 1

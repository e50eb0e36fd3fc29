"""RFC-031's promise: the same producer and the same consumer code, unchanged, over Kafka,
Redis, NATS and PostgreSQL. Only the URL differs (the `backend_url` fixture)."""

from __future__ import annotations

import asyncio

import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from app.sdk import PrismClient, PrismPublishOptions

pytestmark = pytest.mark.integration

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


async def produce(client: PrismClient, topic: str) -> list[str]:
    """One producer for every backend: single publishes with options, and a batch."""
    ids = [
        await client.publish(topic, {"order_id": 1, "total": 9.5}, PrismPublishOptions(
            correlation_id="req-1", priority=8, ttl_seconds=3600, labels={"region": "eu", "tier": "gold"},
            trace_context=TRACEPARENT, data_classification="internal")),
        await client.publish(topic, b"\x00raw\xffbytes"),
        await client.publish(topic, Timestamp(seconds=1_700_000_000, nanos=5)),
        await client.publish(topic, "text payload", PrismPublishOptions(content_encoding="gzip")),
    ]
    ids += await client.publish_batch([(topic, {"order_id": 2}), (topic, {"order_id": 3},
                                                                  PrismPublishOptions(correlation_id="req-3"))])
    return ids


async def consume(client: PrismClient, topic: str, count: int) -> list[dict]:
    """One consumer for every backend."""
    seen = []
    async with client.subscribe(topic, group="portable-consumer") as sub:
        async for msg in sub:
            seen.append({
                "id": msg.metadata.message_id,
                "payload": msg.payload(),
                "content_type": msg.content_type,
                "correlation_id": msg.metadata.correlation_id,
                "priority": msg.priority,
                "ttl": msg.metadata.ttl_seconds,
                "labels": msg.labels,
                "trace_id": msg.observability.trace_id,
                "traceparent_parent": (msg.traceparent or "").split("-")[2:3],
                "classification": msg.security.data_classification,
                "namespace": msg.namespace,
            })
            await msg.ack()
            if len(seen) == count:
                break
    return seen


async def test_same_consumer_code_reads_the_same_producer_on_every_backend(backend_url, topic):
    async with PrismClient(backend_url, namespace="order-events") as client:
        ids = await produce(client, topic)
        async with asyncio.timeout(30):
            seen = await consume(client, topic, len(ids))

    assert [m["id"] for m in seen] == ids  # every message once, in publish order (one partition/stream)
    first = seen[0]
    assert first["payload"] == {"order_id": 1, "total": 9.5}
    assert (first["correlation_id"], first["priority"], first["ttl"]) == ("req-1", 8, 3600)
    assert first["labels"] == {"region": "eu", "tier": "gold"}
    assert first["trace_id"] == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert first["traceparent_parent"] == ["00f067aa0ba902b7"]
    assert first["classification"] == "internal"
    assert seen[1]["payload"] == b"\x00raw\xffbytes"
    assert seen[2]["payload"] == Timestamp(seconds=1_700_000_000, nanos=5)  # class found from the type URL
    assert seen[2]["content_type"] == "application/protobuf"
    assert seen[3]["payload"] == b"text payload"  # gzip undone transparently; text/* comes back as bytes
    assert [m["payload"] for m in seen[4:]] == [{"order_id": 2}, {"order_id": 3}]
    assert seen[5]["correlation_id"] == "req-3"
    assert {m["namespace"] for m in seen} == {"order-events"}
    assert seen[1]["priority"] == 5  # absent priority reads as the RFC default

"""The SDK publish benchmark measures what it says (bench/bench_sdk.py): the Kafka hot loop runs
`PrismClient.publish` itself to its end without I/O, and the pre-I/O stamp is taken by every
path that reaches the wrapped send call, the raw producer's too. No timing asserted here."""

from __future__ import annotations

import asyncio

import pytest

from app.bindings import kafka as kb
from app.sdk import PrismClient
from bench import bench_sdk as b


def _connected_kafka_client() -> PrismClient:
    client = PrismClient("kafka://127.0.0.1:9", namespace="bench")
    client.backend._producer = b._ConfirmingProducer()
    client.backend._known_topics.add("t")
    client._connected = True
    return client


async def test_the_kafka_hot_loop_runs_whole_publishes_without_suspending() -> None:
    client = _connected_kafka_client()
    run = b.publish_cpu(client, "t")
    first, second = run(), run()
    assert isinstance(first, str) and len(first) == 36 and first != second


async def test_run_refuses_a_coroutine_that_suspends() -> None:
    async def suspends() -> None:
        await asyncio.sleep(0)

    with pytest.raises(RuntimeError, match="suspended"):
        b._run(suspends())


async def test_the_stamp_is_taken_on_every_wrapped_producer() -> None:
    sdk_producer, raw_producer = b._ConfirmingProducer(), b._ConfirmingProducer()
    stamp = [0, 0]
    b.stamp_io(sdk_producer, "send", stamp)
    b.stamp_io(raw_producer, "send", stamp)
    await raw_producer.send_and_wait("t", b"{}")  # send_and_wait goes through the wrapped send
    raw_stamp = list(stamp)
    assert raw_stamp[0] > 0 and raw_stamp[1] > 0
    client = _connected_kafka_client()
    client.backend._producer = sdk_producer
    await client.publish("t", {"a": 1})  # the SDK's direct path calls send itself
    assert stamp[0] > raw_stamp[0]


async def test_the_confirming_producer_gets_the_records_a_publish_makes() -> None:
    client = _connected_kafka_client()
    seen = []
    producer = client.backend._producer
    original = producer.send

    async def send(topic, value, key=None, partition=None, timestamp_ms=None, headers=None):
        seen.append(kb.decode(kb.KafkaRecord(key, value, headers, timestamp_ms)))
        return await original(topic, value, key, partition, timestamp_ms, headers)
    producer.send = send
    message_id = b._run(client.publish("t", b.PAYLOAD))
    (env,) = seen
    assert env.message_id == message_id and env.payload_json() == b.PAYLOAD

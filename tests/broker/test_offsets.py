"""The embedded-broker consumer fixes in app/worker/offsets.py, checked against the real broker."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from app.broker.admin import ensure_topics
from app.broker.embedded import EmbeddedBroker
from app.worker.faust_app import make_app
from app.worker.offsets import (
    fetch_high_watermarks,
    leave_group_on_close,
    listoffsets_workaround_installed,
    offsets_probe_installed,
    true_end_offsets,
)


async def produce(bootstrap: str, topic: str, per_partition: dict[int, int]) -> None:
    # linger batches the records, so each partition ends up with several record batches: the
    # situation in which ListOffsets(latest) answers the last batch's base offset.
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5, max_batch_size=4096)
    await producer.start()
    try:
        futures = []
        for partition, count in per_partition.items():
            for i in range(count):
                futures.append(await producer.send(topic, b"x" * 100, key=str(i).encode(), partition=partition))
        await asyncio.gather(*futures)
    finally:
        await producer.stop()


WRITTEN = {0: 3000, 1: 1001, 2: 1, 3: 0}  # records per partition: several batches, one, none


async def batched_topic(bootstrap: str) -> tuple[str, list[TopicPartition]]:
    """A fresh 4-partition topic holding WRITTEN records in several batches per partition."""
    topic = f"offsets-{uuid.uuid4().hex[:8]}"
    await ensure_topics(bootstrap, {topic: 4})
    await produce(bootstrap, topic, WRITTEN)
    return topic, [TopicPartition(topic, p) for p in WRITTEN]


@pytest.mark.integration
async def test_true_end_offsets_match_the_records_written(broker: EmbeddedBroker) -> None:
    topic, tps = await batched_topic(broker.bootstrap)
    written = WRITTEN
    consumer = AIOKafkaConsumer(bootstrap_servers=broker.bootstrap)
    await consumer.start()
    try:
        listed = await consumer.end_offsets(tps)
        corrected = await true_end_offsets(consumer, tps)
        assert corrected == {TopicPartition(topic, p): n for p, n in written.items()}
        # The broker bug this works around (docs/platform-notes.md). If this fails, Tansu fixed
        # ListOffsets and the workaround in app/worker/offsets.py can be retired.
        assert listed[TopicPartition(topic, 0)] < 3000, "ListOffsets(latest) is right now: retire the workaround"
        assert all(listed[tp] <= corrected[tp] for tp in tps)
        # The fetch alone, from any valid offset, carries the same high watermark.
        assert await fetch_high_watermarks(consumer._client, {tp: 0 for tp in tps}) == corrected
    finally:
        await consumer.stop()


@pytest.mark.integration
async def test_leave_group_on_close_leaves_generation_zero(broker: EmbeddedBroker) -> None:
    topic = f"groups-{uuid.uuid4().hex[:8]}"
    await ensure_topics(broker.bootstrap, {topic: 2})

    async def members_after_stop(fix: bool) -> int:
        group = f"g-{uuid.uuid4().hex[:8]}"
        consumer = AIOKafkaConsumer(topic, bootstrap_servers=broker.bootstrap, group_id=group,
                                    session_timeout_ms=6000, heartbeat_interval_ms=1000)
        await consumer.start()
        try:
            async with asyncio.timeout(20):
                while not consumer.assignment():
                    await asyncio.sleep(0.05)
            assert consumer._coordinator.generation == 0  # Tansu's first generation; Kafka's is 1
            if fix:
                leave_group_on_close(consumer)
        finally:
            await consumer.stop()
        admin = AIOKafkaAdminClient(bootstrap_servers=broker.bootstrap)
        await admin.start()
        try:
            (response,) = await admin.describe_consumer_groups([group])
            return len(response.to_object()["groups"][0]["members"])
        finally:
            await admin.close()

    groups = await asyncio.gather(members_after_stop(False), members_after_stop(True))
    assert groups == [1, 0]  # stock aiokafka leaves a ghost member; the fix does not


def test_workaround_installed_only_for_the_embedded_broker(tmp_path: Path) -> None:
    embedded = make_app(f"a-{uuid.uuid4().hex[:6]}", "127.0.0.1:9092", tmp_path / "a", embedded=True)
    real = make_app(f"b-{uuid.uuid4().hex[:6]}", "127.0.0.1:9092", tmp_path / "b", embedded=False)
    assert listoffsets_workaround_installed(embedded)
    assert not listoffsets_workaround_installed(real)
    # both ask the recovery's offsets on the probe connection (tests/worker/test_offsets.py)
    assert offsets_probe_installed(embedded) and offsets_probe_installed(real)
    thread_cls = type(embedded.transport).Consumer._new_consumer_thread
    assert thread_cls is not type(real.transport).Consumer._new_consumer_thread


@pytest.mark.integration
async def test_on_apache_kafka_list_offsets_is_right_so_no_workaround_is_needed(kafka) -> None:
    """The other side of the difference: the same batched writes on Apache Kafka, where
    ListOffsets(latest) answers the true end - which is why `make_app(embedded=False)` (every
    worker reached through PRISM_BROKER_URL) keeps Faust's stock end offsets (asked on the
    offsets probe's connection, tests/worker/test_offsets.py)."""
    topic, tps = await batched_topic(kafka.bootstrap)
    written = WRITTEN
    consumer = AIOKafkaConsumer(bootstrap_servers=kafka.bootstrap)
    await consumer.start()
    try:
        expected = {TopicPartition(topic, p): n for p, n in written.items()}
        assert await consumer.end_offsets(tps) == expected
        assert await true_end_offsets(consumer, tps) == expected  # the workaround agrees where it is not needed
    finally:
        await consumer.stop()

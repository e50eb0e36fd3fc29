"""make_app settings, the ROOT-logger fix, load_app, and an in-process worker with all tables."""

from __future__ import annotations

import asyncio
import io
import logging
import threading
import uuid
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from app.broker.admin import ensure_topics
from app.broker.embedded import EmbeddedBroker
from app.errors import ConfigError
from app.tables import FaustDedupWindow, FaustSequenceTracker, FaustTopicCounters
from app.worker.faust_app import InProcessWorker, PrismWorker, load_app, make_app


def test_make_app_applies_the_measured_settings(tmp_path: Path) -> None:
    app = make_app(f"t-{uuid.uuid4().hex[:6]}", "127.0.0.1:9092,127.0.0.1:9093", tmp_path / "data",
                   partitions=8, embedded=True)
    conf = app.conf
    assert [str(u) for u in conf.broker] == ["kafka://127.0.0.1:9092", "kafka://127.0.0.1:9093"]
    assert conf.broker_session_timeout == 6.0 and conf.broker_heartbeat_interval == 1.0
    assert conf.producer_linger == 0.005 and conf.producer_max_batch_size == 256 * 1024
    assert conf.consumer_max_fetch_size == 4 * 1024 * 1024
    assert conf.broker_max_poll_records == 2000
    assert conf.stream_buffer_maxsize > 4096
    assert str(conf.store) == "rocksdb:"
    assert conf.topic_partitions == 8
    assert conf.web_enabled is False
    assert conf.Worker is PrismWorker
    assert (tmp_path / "data").is_dir()
    with_web = make_app(f"w-{uuid.uuid4().hex[:6]}", "h:1", tmp_path / "w", web_port=6099, broker_max_poll_records=10)
    assert with_web.conf.web_enabled and with_web.conf.web_port == 6099
    assert with_web.conf.broker_max_poll_records == 10  # overrides win


def test_make_app_refuses_bad_configurations(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="needs Kafka transactions"):
        make_app("x", "h:1", tmp_path, embedded=True, processing_guarantee="exactly_once")
    with pytest.raises(ConfigError, match="no Kafka bootstrap servers"):
        make_app("x", "", tmp_path)
    with pytest.raises(ConfigError, match="out of range"):
        make_app("x", "h:1", tmp_path, partitions=0)


def test_prism_worker_puts_the_root_logger_back_to_the_requested_level(tmp_path: Path) -> None:
    app = make_app(f"log-{uuid.uuid4().hex[:6]}", "h:1", tmp_path)

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    worker = PrismWorker(app, stdout=Tty(), loglevel="warn")
    logger = logging.getLogger(f"prism-test-{uuid.uuid4().hex[:6]}")
    logger.addHandler(logging.StreamHandler(io.StringIO()))
    worker.on_setup_root_logger(logger, logging.WARNING)
    assert logger.level == logging.WARNING  # Faust's spinner alone leaves it at DEBUG
    assert not logger.isEnabledFor(logging.DEBUG)


def test_load_app_errors() -> None:
    with pytest.raises(ConfigError, match="is not of the form"):
        load_app("no-colon")
    with pytest.raises(ConfigError, match=r"not a faust\.App"):
        load_app("app.worker.faust_app:KIB")


@pytest.mark.integration
async def test_in_process_worker_runs_all_tables_and_stops_cleanly(broker: EmbeddedBroker, tmp_path: Path) -> None:
    topic = f"inproc-{uuid.uuid4().hex[:8]}"
    await ensure_topics(broker.bootstrap, {topic: 2})
    producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, linger_ms=5)
    await producer.start()
    try:
        # 240 originals (3 sources, sequences 0..79 each), then 60 of them redelivered as is
        for i in [*range(240), *range(60)]:
            await producer.send(topic, f"{i}:{i // 3}".encode(), key=f"src{i % 3}".encode())
        await producer.flush()
    finally:
        await producer.stop()

    threads_before = {t.ident for t in threading.enumerate()}
    app = make_app(f"inproc-{uuid.uuid4().hex[:8]}", broker.bootstrap, tmp_path / "data", partitions=2,
                   embedded=True)
    counters = FaustTopicCounters(app, partitions=2)
    sequences = FaustSequenceTracker(app, partitions=2)
    dedup = FaustDedupWindow(app, window=600, partitions=2)
    source = app.topic(topic, key_serializer="raw", value_serializer="raw")

    @app.agent(source)
    async def process(stream):  # type: ignore[no-untyped-def]
        async for event in stream.events():
            message_id, sequence = event.value.decode().split(":")
            counters.incr(topic, "in")
            sequences.observe(event.key.decode(), int(sequence))
            if dedup.check(f"id-{message_id}").duplicate:
                counters.incr(topic, "duplicate")

    worker = InProcessWorker(app)
    await worker.start(timeout=60)
    try:
        async with asyncio.timeout(30):
            while counters.get(topic, "in") < 300:
                await asyncio.sleep(0.05)
        assert counters.totals() == {topic: {"in": 300, "duplicate": 60}}
        stats = sequences.snapshot()
        assert {k: (v.last, v.seen, v.missing, v.regressions) for k, v in stats.items()} == {
            f"src{n}": (79, 100, 0, 20) for n in range(3)}
    finally:
        await worker.stop()
    leftover = [t for t in threading.enumerate() if t.ident not in threads_before and t.is_alive()]
    assert not leftover, f"threads left behind: {leftover}"


@pytest.mark.integration
async def test_dedup_expiry_deletes_through_the_changelog(broker: EmbeddedBroker, tmp_path: Path) -> None:
    topic, app_id = f"expiry-{uuid.uuid4().hex[:8]}", f"expiry-{uuid.uuid4().hex[:8]}"
    await ensure_topics(broker.bootstrap, {topic: 2})
    now = [1_800_000_000.0]
    app = make_app(app_id, broker.bootstrap, tmp_path / "data", partitions=2, embedded=True)
    dedup = FaustDedupWindow(app, window=60, partitions=2, sweep_interval=3600, clock=lambda: now[0])
    processed: list[int] = []
    source = app.topic(topic, key_serializer="raw", value_serializer="raw")

    @app.agent(source)
    async def process(stream):  # type: ignore[no-untyped-def]
        async for event in stream.events():
            dedup.check(event.value.decode())
            processed.append(event.message.partition)

    async def send(prefix: str) -> None:
        producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap)
        await producer.start()
        try:
            for i in range(20):
                await producer.send(topic, f"{prefix}-{i}".encode(), key=f"k{i}".encode())
            await producer.flush()
        finally:
            await producer.stop()

    async def until(count: int) -> None:
        async with asyncio.timeout(30):
            while len(processed) < count:
                await asyncio.sleep(0.05)

    await send("old")
    worker = InProcessWorker(app)
    await worker.start(timeout=60)
    try:
        await until(20)
        assert len(set(processed)) == 2  # both partitions used
        assert sorted(dedup.table) == sorted(f"old-{i}".encode() for i in range(20))
        now[0] += 61  # the window passes
        assert await dedup.scan_expired() == 20
        await send("new")  # same keys -> same partitions: each event deletes its partition's expired ids
        await until(40)
        assert sorted(dedup.table) == sorted(f"new-{i}".encode() for i in range(20))
        assert dedup.pending_expiry == 0
    finally:
        await worker.stop()

    # Every deletion is a tombstone in the changelog partition that holds the id's record.
    consumer = AIOKafkaConsumer(bootstrap_servers=broker.bootstrap, auto_offset_reset="earliest")
    await consumer.start()
    try:
        changelog = f"{app_id}-dedup-changelog"
        consumer.assign([TopicPartition(changelog, p) for p in range(2)])
        records: list = []
        async with asyncio.timeout(20):
            while len(records) < 60:
                for batch in (await consumer.getmany(timeout_ms=500)).values():
                    records.extend(batch)
    finally:
        await consumer.stop()
    puts = {(r.key, r.partition) for r in records if r.value is not None}
    tombstones = {(r.key, r.partition) for r in records if r.value is None}
    assert len(tombstones) == 20
    assert tombstones <= puts  # same key, same partition as the original record
    assert all(b"old-" in key for key, _ in tombstones)

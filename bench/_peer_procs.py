"""The peer processors for `bench.bench_peers`: what a user would write with another Python
stream processor to move JSON from one topic to another, each run as its own process so that
its CPU is measured from outside exactly like Prism's worker:

    python -m bench._peer_procs CONTENDER BOOTSTRAP IN_TOPIC OUT_TOPIC GROUP STATE_DIR

CONTENDER is one of `PEERS`. Every contender applies the same function, `transform` (json.loads
the document, bump one field, json.dumps), to every record's value and writes the result with
the record's key to OUT_TOPIC, at-least-once, until it is stopped (SIGTERM).

This module imports nothing outside the standard library at import time, and no Prism code at
all: the Quix Streams contender runs in a separate venv that has quixstreams but not Prism
(quixstreams pins an older confluent-kafka than Prism's test dependencies, so it cannot share
Prism's venv). Each framework is imported inside its own runner.

Settings that matter on the embedded broker (Tansu) and are applied to every contender:

* consumer-group session timeout 6 s, heartbeat 1 s: Tansu holds a new group's first join for
  about half the session timeout, so the clients' defaults (10-60 s) would add 5-30 s of
  start-up; the measurement window excludes start-up, this only keeps the runs short;
* no idempotent producer: Tansu has no InitProducerId (Quix enables idempotence by default);
* 5 ms linger and 256 KiB producer batches, 4 MiB partition fetches, up to 2000 records per
  poll - the settings Prism's worker uses (`app/worker/faust_app.TUNED_SETTINGS`), given to
  the peers too so that batching is not what separates them.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
import time
from typing import Any

PEERS = ("faust-tuned", "quix", "aiokafka", "confluent")

SESSION_TIMEOUT_MS = 6000
HEARTBEAT_MS = 1000
LINGER_MS = 5
BATCH_BYTES = 256 * 1024
FETCH_BYTES = 4 * 1024 * 1024
MAX_RECORDS = 2000
#: The raw loops flush their producer and commit their offsets this often (at-least-once:
#: outputs acknowledged before the offsets of their inputs are committed).
COMMIT_EVERY_S = 1.0


def transform(value: bytes) -> bytes:
    """The per-message work of every peer: parse the JSON document, bump a field, serialize it.

    The one function all contenders call, so that they differ only in the framework around it
    (`tests/bench/test_peers.py` checks that every runner calls it)."""
    doc = json.loads(value)
    doc["items"][0]["qty"] += 1
    return json.dumps(doc, separators=(",", ":")).encode()


async def run_aiokafka(bootstrap: str, src: str, dst: str, group: str, state_dir: str) -> None:
    """Raw aiokafka: getmany -> transform -> send, flush + commit every second (on uvloop)."""
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    consumer = AIOKafkaConsumer(src, bootstrap_servers=bootstrap, group_id=group, auto_offset_reset="earliest",
                                enable_auto_commit=False, session_timeout_ms=SESSION_TIMEOUT_MS,
                                heartbeat_interval_ms=HEARTBEAT_MS, max_partition_fetch_bytes=FETCH_BYTES)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=LINGER_MS,
                                max_batch_size=BATCH_BYTES, enable_idempotence=False)
    await producer.start()
    await consumer.start()
    last_commit = time.monotonic()
    try:
        while True:
            batch = await consumer.getmany(timeout_ms=200, max_records=MAX_RECORDS)
            for records in batch.values():
                for r in records:
                    await producer.send(dst, transform(r.value or b""), key=r.key)  # enqueues; acks come later
            if time.monotonic() - last_commit >= COMMIT_EVERY_S:
                await producer.flush()  # every output acknowledged before its inputs' offsets are committed
                await consumer.commit()
                last_commit = time.monotonic()
    finally:
        await producer.flush()
        await consumer.commit()
        await consumer.stop()
        await producer.stop()


def run_confluent(bootstrap: str, src: str, dst: str, group: str, state_dir: str) -> None:
    """Raw confluent-kafka (librdkafka): consume -> transform -> produce, flush + commit every second."""
    from confluent_kafka import Consumer, Producer

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest",
                         "enable.auto.commit": False, "session.timeout.ms": SESSION_TIMEOUT_MS,
                         "heartbeat.interval.ms": HEARTBEAT_MS, "max.partition.fetch.bytes": FETCH_BYTES})
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": False,
                         "linger.ms": LINGER_MS, "batch.size": BATCH_BYTES,
                         "partitioner": "murmur2_random"})  # the Java client's partitioner, as aiokafka uses
    consumer.subscribe([src])
    last_commit, pending = time.monotonic(), False
    try:
        while True:
            for m in consumer.consume(num_messages=MAX_RECORDS, timeout=0.2):
                if m.error():
                    raise RuntimeError(f"consume failed: {m.error()}")
                while True:
                    try:
                        producer.produce(dst, transform(m.value() or b""), m.key())
                        break
                    except BufferError:  # local queue full: serve delivery reports, then retry
                        producer.poll(0.05)
                pending = True
            producer.poll(0)
            if pending and time.monotonic() - last_commit >= COMMIT_EVERY_S:
                producer.flush()
                consumer.commit(asynchronous=False)
                last_commit, pending = time.monotonic(), False
    finally:
        producer.flush()
        consumer.close()


def run_faust(bootstrap: str, src: str, dst: str, group: str, state_dir: str) -> None:
    """A Faust agent as a user who tuned it would write it: `take_events` batches, gathered sends,
    on uvloop, with the producer/fetch settings above and the root logger back at WARNING."""
    import mode.loop

    mode.loop.use("uvloop")  # before the app exists: it binds the loop it is built on
    import faust

    app = faust.App(
        group, broker=f"kafka://{bootstrap}", store="memory://", datadir=os.path.join(state_dir, "faust"),
        web_enabled=False, processing_guarantee="at_least_once", producer_acks=-1, topic_partitions=4,
        consumer_auto_offset_reset="earliest", broker_session_timeout=SESSION_TIMEOUT_MS / 1000,
        broker_heartbeat_interval=HEARTBEAT_MS / 1000, producer_linger=LINGER_MS / 1000,
        producer_max_batch_size=BATCH_BYTES, consumer_max_fetch_size=FETCH_BYTES,
        broker_max_poll_records=MAX_RECORDS, stream_buffer_maxsize=16384)
    source = app.topic(src, key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw")
    sink = app.topic(dst, key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw")

    @app.task
    async def root_logger_to_warning() -> None:
        # `faust worker -l warn` sets the ROOT logger to DEBUG for its start-up spinner, so every
        # log.debug() in Faust and aiokafka builds a record: a tuned deployment puts it back.
        logging.getLogger().setLevel(logging.WARNING)

    @app.agent(source)
    async def forward(stream: Any) -> None:
        async for events in stream.take_events(1000, within=0.5):
            await asyncio.gather(*[sink.send(key=e.key, value=transform(e.value)) for e in events])

    # --without-web: `web_enabled=False` does not stop `faust worker` from binding port 6066, which
    # another Faust process on a shared machine may hold (the run then dies at start-up).
    sys.argv = [sys.argv[0], "worker", "--loglevel", "warn", "--without-web"]
    app.main()


def run_quix(bootstrap: str, src: str, dst: str, group: str, state_dir: str) -> None:
    """Quix Streams: `app.dataframe(src).apply(transform).to_topic(dst)`, its defaults otherwise
    (5 s commit interval, librdkafka's batching) except what this broker needs."""
    from quixstreams import Application

    app = Application(
        broker_address=bootstrap, consumer_group=group, auto_offset_reset="earliest",
        processing_guarantee="at-least-once", loglevel=logging.WARNING, use_changelog_topics=False,
        state_dir=os.path.join(state_dir, "quix"),
        producer_extra_config={"enable.idempotence": False, "acks": "all"},
        consumer_extra_config={"session.timeout.ms": SESSION_TIMEOUT_MS, "heartbeat.interval.ms": HEARTBEAT_MS})
    source = app.topic(src, key_deserializer="bytes", value_deserializer="bytes")
    sink = app.topic(dst, key_serializer="bytes", value_serializer="bytes")
    app.dataframe(source).apply(transform).to_topic(sink)
    app.run()


def main(argv: list[str]) -> None:
    contender, bootstrap, src, dst, group, state_dir = argv
    if contender == "aiokafka":
        import uvloop

        uvloop.run(run_aiokafka(bootstrap, src, dst, group, state_dir))
    elif contender == "confluent":
        run_confluent(bootstrap, src, dst, group, state_dir)
    elif contender == "faust-tuned":
        run_faust(bootstrap, src, dst, group, state_dir)
    elif contender == "quix":
        run_quix(bootstrap, src, dst, group, state_dir)
    else:
        raise SystemExit(f"unknown contender {contender!r}; one of {', '.join(PEERS)}")


if __name__ == "__main__":
    main(sys.argv[1:])

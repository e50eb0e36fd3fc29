"""Feed the archive sink from the pipeline's archive tap topic (Kafka protocol).

The sink's manifests, not the consumer group, are the source of truth for what is archived:
partitions are assigned manually and each is positioned at `committed offset + 1` from
`ArchiveSink.committed_offsets()` (or its beginning). So a restart resumes exactly after the
last committed roll, no group join is needed (the embedded broker holds a new group's first
join for ~half the session timeout, docs/platform-notes.md), and nothing depends on the broker's
ListOffsets(latest) answer, which is wrong on the embedded broker. Several archivers split the
work by passing disjoint `assignment`s and distinct `writer_id`s to their sinks. The records'
own (topic, partition, offset) are the archive provenance (the worker's `prism-source` header,
which names the pipeline's input record, is not copied into the archive).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition

from app.broker.metadata import partitions_of
from app.errors import ArchiveError
from app.lake.archive import ArchiveRecord, ArchiveSink


async def archive_topics(
    bootstrap: str,
    topics: str | Sequence[str],
    sink: ArchiveSink,
    *,
    assignment: Iterable[tuple[str, int]] | None = None,
    stop: asyncio.Event | None = None,
    max_records: int | None = None,
    poll_ms: int = 200,
    consumer_kwargs: dict[str, Any] | None = None,
) -> int:
    """Archive `topics` (e.g. `Topology.archive_source_topics()`) until `stop` is set or
    `max_records` new records were accepted.

    `assignment` restricts the (topic, partition)s this archiver owns (default: all of them).
    Returns how many records the sink accepted; everything accepted is committed on return.
    `consumer_kwargs` go to `AIOKafkaConsumer` (e.g. `BrokerSettings.aiokafka_kwargs()`).
    """
    names = [topics] if isinstance(topics, str) else list(topics)
    await asyncio.to_thread(sink.open)
    committed = sink.committed_offsets()
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, group_id=None,
                                fetch_max_bytes=8 << 20, max_partition_fetch_bytes=4 << 20,
                                # an exactly_once worker's aborted outputs never reach the archive;
                                # on topics written without transactions it reads the same records
                                isolation_level="read_committed", **(consumer_kwargs or {}))
    await consumer.start()
    accepted = 0
    try:
        known = {(t, p) for t in names for p in await _partitions(consumer, t, bootstrap)}
        wanted = sorted(known if assignment is None else set(assignment))
        missing = sorted(set(wanted) - known)
        if missing:
            raise ArchiveError(f"partition(s) {missing} do not exist",
                               hint=f"the topics have {sorted(known)}; check the archive tap's topic declaration")
        tps = [TopicPartition(t, p) for t, p in wanted]
        consumer.assign(tps)
        for tp in tps:
            done = committed.get((tp.topic, tp.partition))
            if done is None:
                await consumer.seek_to_beginning(tp)
            else:
                consumer.seek(tp, done + 1)
        while (stop is None or not stop.is_set()) and (max_records is None or accepted < max_records):
            wait_ms = poll_ms
            due = sink.seconds_until_due()
            if due is not None:
                wait_ms = max(1, min(poll_ms, int(due * 1000)))
            batches = await consumer.getmany(timeout_ms=wait_ms, max_records=5000)
            for tp, msgs in batches.items():
                accepted += sink.add(ArchiveRecord(m.value, tp.topic, tp.partition, m.offset)
                                     for m in msgs if m.value is not None)
            if sink.roll_due():
                await asyncio.to_thread(sink.flush)
    finally:
        await consumer.stop()
    await asyncio.to_thread(sink.flush)
    return accepted


async def _partitions(consumer: AIOKafkaConsumer, topic: str, bootstrap: str, timeout: float = 10.0) -> set[int]:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        parts = await partitions_of(consumer, topic)
        if parts:
            return parts
        if loop.time() >= deadline:
            raise ArchiveError(f"topic {topic!r} does not exist on {bootstrap}",
                               hint="start the pipeline with the archive tap enabled, or create the topic")
        await asyncio.sleep(0.2)

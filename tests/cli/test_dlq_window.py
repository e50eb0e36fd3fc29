"""The bounded DLQ reads of app/cli/dlq.py on the embedded broker: `read_window` (the console's
DLQ page: the newest records below a cursor, bounded in offsets and bytes, saying what it left
older) and `read_record` (one offset: `prism dlq show` and the console's record page).

Why: both read the whole DLQ topic for every view, so a producer flooding the DLQ made each
page view cost memory and time proportional to the flood (200k records: +585 MiB and 33 s for
one list page, +402 MiB and 6.6 s for one record page)."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from app.cli.dlq import BadSelector, _shares, parse_cursor, read_record, read_window


async def _topic(bootstrap: str, partitions: int) -> str:
    name = f"win-{uuid.uuid4().hex[:8]}.dlq"
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(name, partitions, 1)])
    finally:
        await admin.close()
    return name


async def _fill(bootstrap: str, topic: str, counts: dict[int, int], value: bytes = b"v",
                key: bytes | None = None) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    await producer.start()
    try:
        futures = [await producer.send(topic, value + str(i).encode(), key=key, partition=p, timestamp_ms=1000 + i)
                   for p, n in counts.items() for i in range(n)]
        for f in futures:
            await f
    finally:
        await producer.stop()


def _offsets(recs: list[Any], partition: int) -> list[int]:
    return sorted(r.offset for r in recs if r.partition == partition)


async def test_the_window_reads_the_newest_and_pages_back_to_the_oldest(broker: Any) -> None:
    topic = await _topic(broker.bootstrap, 2)
    await _fill(broker.bootstrap, topic, {0: 2500, 1: 500})

    first = await read_window(broker.bootstrap, topic, 2, max_records=1000)
    # equal shares: the newest 500 of each partition, nothing else
    assert _offsets(first.records, 0) == list(range(2000, 2500)) and _offsets(first.records, 1) == list(range(500))
    assert (first.total, first.older, first.next_cursor, first.cut_by_bytes) == (3000, 2000, {0: 2000}, False)

    # the next page: partition 1 has nothing older and is not read again; partition 0 gets the budget
    second = await read_window(broker.bootstrap, topic, 2, before=first.next_cursor, max_records=1000)
    assert _offsets(second.records, 0) == list(range(1000, 2000)) and _offsets(second.records, 1) == []
    assert second.next_cursor == {0: 1000}
    third = await read_window(broker.bootstrap, topic, 2, before=second.next_cursor, max_records=1000)
    assert _offsets(third.records, 0) == list(range(1000)) and (third.older, third.next_cursor) == (0, {})

    # a cursor past the end reads from the end; a missing topic reads as empty and is not created
    past = await read_window(broker.bootstrap, topic, 2, before={0: 10**12, 1: 10**12}, max_records=10)
    assert _offsets(past.records, 0) == list(range(2495, 2500))
    empty = await read_window(broker.bootstrap, f"no-{topic}", 2)
    assert (empty.records, empty.total) == ([], 0)


async def test_the_window_is_bounded_in_bytes_keeping_the_newest(broker: Any) -> None:
    topic = await _topic(broker.bootstrap, 1)
    await _fill(broker.bootstrap, topic, {0: 40}, value=b"x" * 10_000)

    w = await read_window(broker.bootstrap, topic, 1, max_records=1000, max_bytes=55_000)
    assert _offsets(w.records, 0) == list(range(35, 40)), _offsets(w.records, 0)  # 5 x 10 kB fit
    assert w.cut_by_bytes and w.next_cursor == {0: 35} and w.older == 35
    older = await read_window(broker.bootstrap, topic, 1, before=w.next_cursor, max_records=1000, max_bytes=55_000)
    assert _offsets(older.records, 0) == list(range(30, 35))


async def test_one_record_is_read_alone(broker: Any) -> None:
    topic = await _topic(broker.bootstrap, 2)
    await _fill(broker.bootstrap, topic, {0: 30, 1: 3}, key=b"k")
    rec = await read_record(broker.bootstrap, topic, 2, 0, 17)
    assert rec is not None and (rec.partition, rec.offset, rec.value) == (0, 17, b"v17")
    for partition, offset in ((1, 3), (1, 10**15), (2, 0), (-1, 0), (0, -1)):  # past the end, no such partition
        assert await read_record(broker.bootstrap, topic, 2, partition, offset) is None, (partition, offset)
    assert await read_record(broker.bootstrap, f"no-{topic}", 2, 0, 0) is None


def test_cursors_are_checked() -> None:
    assert parse_cursor("0@12, 1@7", 2, "t.dlq") == {0: 12, 1: 7}
    assert parse_cursor("", 2, "t.dlq") == {}
    for bad in ("x", "0@1,0@2", "2@1", "-1@4", "0@1,1@1,0@3", "0@" + "9" * 30):
        with pytest.raises(BadSelector):
            parse_cursor(bad, 2, "t.dlq")


def test_shares_give_what_one_partition_cannot_use_to_the_others() -> None:
    assert _shares({0: 2500, 1: 500}, 1000) == {0: 500, 1: 500}
    assert _shares({0: 2500, 1: 100}, 1000) == {0: 900, 1: 100}
    assert _shares({0: 0, 1: 0}, 1000) == {0: 0, 1: 0}
    assert _shares({0: 3, 1: 3, 2: 3}, 2) == {0: 1, 1: 1, 2: 0}
    assert sum(_shares({p: 10**9 for p in range(7)}, 1000).values()) == 1000

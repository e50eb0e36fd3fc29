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


#: writes records of which some have a header name that is not UTF-8 (aiokafka's encoder cannot:
#: its pure-Python one is given a str whose encoding is those bytes), in one batch
_POISON = """
import asyncio, os, sys
os.environ["AIOKAFKA_NO_EXTENSIONS"] = "1"
from aiokafka import AIOKafkaProducer

class Name(str):
    def encode(self, *args, **kwargs):
        return b"\\xff\\xfe not utf-8"

async def main(bootstrap, topic, n, bad):
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=200)
    await producer.start()
    try:
        sent = [await producer.send(topic, b"p%d" % i, partition=0,
                                    headers=[(Name("x") if str(i) in bad.split(",") else "ok", b"h")])
                for i in range(int(n))]
        print(",".join([str((await s).offset) for s in sent]))
    finally:
        await producer.stop()

asyncio.run(main(*sys.argv[1:]))
"""


async def poison(bootstrap: str, topic: str, n: int, bad: set[int]) -> list[int]:
    """`n` records to partition 0 of `topic` in one batch, those in `bad` with a header name that
    is not UTF-8; returns their offsets."""
    import asyncio
    import subprocess
    import sys

    out = await asyncio.to_thread(subprocess.run, [sys.executable, "-c", _POISON, bootstrap, topic, str(n),
                                                   ",".join(map(str, sorted(bad)))],
                                  capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return [int(o) for o in out.stdout.strip().split(",")]


async def test_records_the_client_cannot_decode_are_skipped_and_named(broker: Any) -> None:
    """One record with a header name that is not UTF-8 made aiokafka raise UnicodeDecodeError on
    every read of its batch: the console's DLQ page was a 500, `prism dlq list` a traceback."""
    from app.cli.dlq import Unreadable, read_to_end

    topic = await _topic(broker.bootstrap, 2)
    await _fill(broker.bootstrap, topic, {0: 40, 1: 10})
    batch = await poison(broker.bootstrap, topic, 6, {2, 3})
    assert batch == list(range(40, 46))
    await _fill(broker.bootstrap, topic, {0: 40})  # offsets 46..85

    w = await read_window(broker.bootstrap, topic, 2, max_records=1000)
    # the batch's records before the first bad one still read; from it to the batch's end none does
    assert w.unreadable == [(0, 42, 46)]
    assert _offsets(w.records, 0) == [*range(42), *range(46, 86)] and _offsets(w.records, 1) == list(range(10))
    for good in (41, 46, 60):
        assert (await read_record(broker.bootstrap, topic, 2, 0, good)).offset == good  # type: ignore[union-attr]
    with pytest.raises(Unreadable, match="partition 0 offset 44: the Kafka client cannot decode"):
        await read_record(broker.bootstrap, topic, 2, 0, 44)
    with pytest.raises(Unreadable, match="partition 0 offsets 42-45: the Kafka client cannot decode"):
        await read_to_end(broker.bootstrap, topic, 2)


async def test_spans_are_cut_to_the_log_and_read_each_record_once(broker: Any) -> None:
    from app.cli.dlq import read_spans

    topic = await _topic(broker.bootstrap, 2)
    await _fill(broker.bootstrap, topic, {0: 20, 1: 5})
    got = await read_spans(broker.bootstrap, topic, 2, [(0, 3, 4), (0, 2, 6), (0, 18, 10**12), (1, -5, 2),
                                                        (1, 9, 10), (2, 0, 5), (-1, 0, 5)])
    assert [(r.partition, r.offset) for r in got] == [(0, 2), (0, 3), (0, 4), (0, 5), (0, 18), (0, 19), (1, 0), (1, 1)]


async def test_a_replay_of_chosen_records_reads_them_not_the_whole_dlq(broker: Any, tmp_path: Any,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The console's Replay of one record (and `prism dlq replay --record/--range`) read the
    whole DLQ topic first: a flooded DLQ made each replay cost all of it."""
    import app.cli.dlq as dlq_module
    from app.broker.admin import ensure_topics
    from app.security.devkeys import ensure_dev_keys
    from tests.cli.test_dlq_cli import _dlq_copies, _seed
    from tests.worker.conftest import make_topology

    keys = ensure_dev_keys(tmp_path / "keys")
    topo = make_topology(tmp_path, keys, partitions=2)
    await ensure_topics(broker.bootstrap, topo.topics())
    copies, _ = _dlq_copies(topo, keys, 4)
    where = await _seed(broker.bootstrap, copies, [0, 1, 0, 1])
    whole = dlq_module.read_to_end

    async def ledger_only(bootstrap: str, topic: str, partitions: int, **kw: Any) -> list[Any]:
        assert topic.endswith(dlq_module.LEDGER_SUFFIX), f"{topic} read whole"
        return await whole(bootstrap, topic, partitions, **kw)

    monkeypatch.setattr(dlq_module, "read_to_end", ledger_only)
    p, o = where[2]
    report = await dlq_module.replay(topo, broker.bootstrap, records=[f"{p}@{o}"], ranges=[f"{p}@{o}-{o}"])
    assert [(r.action, r.dlq_partition, r.dlq_offset) for r in report.outcomes] == [("replayed", p, o)]
    with pytest.raises(dlq_module.BadSelector, match="no record at"):
        await dlq_module.replay(topo, broker.bootstrap, records=[f"{p}@{o + 100}"])

"""The worker's compiled record batches (`prism_native.record_batch` / `seal_batch`,
`app.worker.batch_send.ClosedBatch`) against aiokafka's own `BatchBuilder`: the same bytes for the
same records and producer state, the same batch boundaries, and the same batches, partitions,
sequence numbers and per-item outcomes out of `send_batched` whichever builder writes them.

The native module is optional, so locally these tests skip without it; under CI=true a missing
module fails them (tests/support.require)."""

from __future__ import annotations

import asyncio
import random
import time
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka.producer.message_accumulator import BatchBuilder, MessageAccumulator
from aiokafka.producer.transaction_manager import TransactionManager
from aiokafka.record.default_records import DefaultRecordBatchBuilder
from aiokafka.structs import TopicPartition
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app import native
from app.worker import batch_send
from app.worker.batch_send import ClosedBatch, RefusedUpFront, send_batched
from tests.support import require

_record_batch = getattr(native.module, "record_batch", None)
_record_tail = getattr(native.module, "record_tail", None)


@pytest.fixture(autouse=True)
def _native_built() -> None:
    require(_record_batch is not None, "prism_native is not built or is stale (make native: needs cargo)")


_bytes = st.binary(max_size=300)
_headers = st.lists(st.tuples(st.text(max_size=12), st.none() | st.binary(max_size=40)), max_size=5)
#: -1 included: aiokafka keeps an unset first timestamp as -1, so a record stamped -1 leaves the
#: next one "first" again - the compiled writer must do the same
_ts = st.integers(-3, 1 << 45)
_record = st.tuples(st.none() | _bytes, st.none() | _bytes, _ts, _headers)
_state = st.tuples(st.integers(-1, (1 << 63) - 1), st.integers(-1, (1 << 15) - 1), st.integers(0, (1 << 31) - 1))


def _aiokafka_batches(recs: list[tuple], batch_size: int, txn: bool,
                      state: tuple[int, int, int] | None) -> list[tuple[bytes, int, int]]:
    """`send_batched`'s fallback: BatchBuilders, a refused record starting the next one."""
    out, i = [], 0
    while i < len(recs):
        b = BatchBuilder(batch_size, 0, is_transactional=txn, key_serializer=None, value_serializer=None)
        while i < len(recs):
            key, value, ts, headers = recs[i]
            if b.append(timestamp=ts, key=key, value=value, headers=headers) is None:
                break
            i += 1
        size = b.size()
        if state is not None:
            b._set_producer_state(*state)
        out.append((bytes(b._build()), b.record_count(), size))
    return out


def _with_tail(key: bytes | None, value: bytes | None, headers: list) -> tuple[int, bytes]:
    """The size and tail the worker's size fit writes ahead for a record (`SizeFitter.fit`)."""
    assert _record_tail is not None
    size, tail = _record_tail(key, value, headers)
    return size, tail


def _compiled_batches(recs: list[tuple], batch_size: int, txn: bool, state: tuple[int, int, int] | None,
                      tails: list[bool] = ()) -> list[tuple[bytes, int, int]]:
    """`tails[i]`: record i carries its tail (written from it, not from its fields)."""
    out_records = [("t", key, value, ts, headers, *(_with_tail(key, value, headers) if i < len(tails) and tails[i]
                                                     else (None, None)))
                   for i, (key, value, ts, headers) in enumerate(recs)]
    out, start = [], 0
    while start < len(recs):
        assert _record_batch is not None
        buf, n = _record_batch(out_records, start, batch_size, txn)
        batch = ClosedBatch(buf, n)
        assert batch.closed() and batch.append(timestamp=0, key=b"k", value=b"v", headers=[]) is None
        size = batch.size()
        if state is not None:
            batch._set_producer_state(*state)
        out.append((bytes(batch._build()), batch.record_count(), size))
        start += n
    return out


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(recs=st.lists(_record, min_size=1, max_size=12), batch_size=st.integers(0, 3000), txn=st.booleans(),
       state=st.none() | _state, tails=st.lists(st.booleans(), max_size=12))
def test_the_bytes_and_boundaries_are_aiokafkas(recs: list[tuple], batch_size: int, txn: bool,
                                                state: tuple[int, int, int] | None, tails: list[bool]) -> None:
    """Every batch byte for byte (header, CRC, producer state, transactional bit, records), its
    record count and its size before sealing; batch sizes small enough that records spill. Some
    records (`tails`) are written from the tail the size fit writes ahead, the others from their
    fields, mixed in one batch."""
    assert _compiled_batches(recs, batch_size, txn, state, tails) == _aiokafka_batches(recs, batch_size, txn, state)


@settings(max_examples=400, deadline=None)
@given(rec=_record)
def test_a_tail_measures_what_aiokafka_estimates(rec: tuple) -> None:
    """The size fit takes a record's size from `record_tail`: aiokafka's `estimate_size_in_bytes`
    for every key, value and headers (None values, non-ASCII header names, lengths across varint
    boundaries)."""
    key, value, _, headers = rec
    assert _with_tail(key, value, headers)[0] == DefaultRecordBatchBuilder.estimate_size_in_bytes(key, value, headers)


def test_a_tail_refuses_what_the_writer_refuses() -> None:
    """The same checks as `record_batch` on a record's fields: the size fit then measures the
    record with aiokafka's estimate and the send writes it from its fields."""
    assert _record_tail is not None
    with pytest.raises(TypeError):
        _record_tail("text", b"v", [])  # a key is bytes
    with pytest.raises(TypeError):
        _record_tail(None, b"v", [(b"k", b"v")])  # a header key is str
    with pytest.raises(TypeError):
        _record_tail(None, b"v", [("k", "a str header value")])
    with pytest.raises(ValueError):
        _record_tail(None, b"v", [("k", b"v", b"x")])
    with pytest.raises(TypeError):
        _record_tail(None, b"v", None)
    with pytest.raises(TypeError):
        _record_tail(None, "a str value", [])
    assert _record_tail(None, memoryview(b"v"), [("k", bytearray(b"x"))]) == _record_tail(None, b"v", [("k", b"x")])


def test_a_record_without_a_timestamp_is_stamped_now() -> None:
    assert _record_batch is not None
    before = int(time.time() * 1000)
    buf, n = _record_batch([("t", None, b"v", None, [], None), ("t", b"k", None, None, [("h", None)], None)],
                           0, 1 << 20, False)
    after = int(time.time() * 1000)
    first, last = (int.from_bytes(buf[at:at + 8], "big") for at in (27, 35))
    assert n == 2 and before <= first <= last <= after


def test_what_is_not_a_record_is_refused() -> None:
    assert _record_batch is not None and native.module is not None
    with pytest.raises(IndexError):
        _record_batch([("t", None, b"v", 1, [], None)], 1, 100, False)
    with pytest.raises(TypeError):
        _record_batch([("t", "text", b"v", 1, [], None)], 0, 100, False)  # a key is bytes
    with pytest.raises(TypeError):
        _record_batch([("t", None, b"v", 1, [(b"k", b"v")], None)], 0, 100, False)  # a header key is str
    with pytest.raises(ValueError):
        _record_batch([("t", None, b"v", 1, [("k", b"v", b"x")], None)], 0, 100, False)
    with pytest.raises(ValueError):
        native.module.seal_batch(bytearray(60), 1, 2, 3)


# -- through aiokafka's accumulator: the producer state it gives a batch as it drains it -----------

class _Cluster:
    def leader_for_partition(self, tp: TopicPartition) -> int:
        return 0

    def partitions_for_topic(self, topic: str) -> set[int]:
        return {0, 1, 2}

    def available_partitions_for_topic(self, topic: str) -> set[int]:
        return {0, 1, 2}


async def _drained(batches: list[Any], pid: int, epoch: int) -> list[bytes]:
    txn = TransactionManager("txn-1", 60_000)
    txn.set_pid_and_epoch(pid, epoch)
    txn.begin_transaction()
    acc = MessageAccumulator(_Cluster(), 1 << 20, 0, 30, txn_manager=txn)
    tp = TopicPartition("t", 0)
    out = []
    for b in batches:
        b.close()
        await acc.add_batch(b, tp, 1)
        nodes, _ = acc.drain_by_nodes(ignore_nodes=[])
        out.append(bytes(nodes[0][tp].get_data_buffer()))
        nodes[0][tp].done(base_offset=0)
    return out


async def test_the_accumulator_seals_each_batch_with_its_producer_id_epoch_and_sequence() -> None:
    """An exactly_once producer's accumulator gives every batch the producer id and epoch and the
    partition's next sequence number (advanced by each batch's record count) when it drains it:
    the compiled batches come out as aiokafka's own builders do."""
    recs = [(b"k%d" % i, b"v" * (100 + i), 1_700_000_000_000 + i, [("h", b"x"), ("n", None)]) for i in range(9)]
    want = [b for b, *_ in _aiokafka_batches(recs, 500, True, None)]
    assert len(want) > 2  # several batches: the sequence advances
    builders = []
    i = 0
    while i < len(recs):
        b = BatchBuilder(500, 0, is_transactional=True, key_serializer=None, value_serializer=None)
        while i < len(recs) and b.append(timestamp=recs[i][2], key=recs[i][0], value=recs[i][1],
                                         headers=recs[i][3]) is not None:
            i += 1
        builders.append(b)
    compiled = []
    out_records = [("t", *r, None) for r in recs]
    start = 0
    while start < len(recs):
        assert _record_batch is not None
        buf, n = _record_batch(out_records, start, 500, True)
        compiled.append(ClosedBatch(buf, n))
        start += n
    theirs = await _drained(builders, 4711, 3)
    ours = await _drained(compiled, 4711, 3)
    assert ours == theirs and ours != want  # the state is in them: not the unsealed defaults
    assert [int.from_bytes(b[53:57], "big") for b in ours] == [0, *(
        sum(c.record_count() for c in compiled[:k]) for k in range(1, len(compiled)))]


# -- send_batched: the compiled path against aiokafka's builders ----------------------------------

class _Producer:
    """What `send_batched` reads of an aiokafka producer, with an accumulator's settings and a
    `send_batch` that records each batch as the broker would get it."""

    def __init__(self, batch_size: int, txn: bool) -> None:
        self.client = SimpleNamespace(cluster=_Cluster(), _wait_on_metadata=self._metadata)
        self._max_request_size = 4000
        from aiokafka.partitioner import DefaultPartitioner
        self._partitioner = DefaultPartitioner()
        self._key_serializer = self._value_serializer = None
        manager = SimpleNamespace(transactional_id="txn-1" if txn else None)
        self._message_accumulator = SimpleNamespace(_batch_size=batch_size, _compression_type=0,
                                                    _txn_manager=manager if txn else None)
        self.batches: dict[tuple[str, int], list[tuple[bytes, int]]] = {}

    async def _metadata(self, topic: str) -> None:
        return None

    def create_batch(self) -> BatchBuilder:
        acc = self._message_accumulator
        return BatchBuilder(acc._batch_size, 0, is_transactional=acc._txn_manager is not None,
                            key_serializer=None, value_serializer=None)

    async def send_batch(self, batch: Any, topic: str, *, partition: int) -> asyncio.Future[None]:
        assert batch.closed()
        batch._set_producer_state(77, 1, 5)
        self.batches.setdefault((topic, partition), []).append((bytes(batch._build()), batch.record_count()))
        fut = asyncio.get_running_loop().create_future()
        fut.set_result(None)
        return fut


def _sent_both_ways(items: list[list[tuple]], batch_size: int, txn: bool,
                    **kwargs: Any) -> tuple[tuple[list[Any], dict], tuple[list[Any], dict]]:
    """`send_batched(items, **kwargs)` with aiokafka's builders, then with the compiled writer:
    each time the per-item outcome types and the batches the broker would get."""

    async def run(compiled: bool) -> tuple[list[Any], dict]:
        p = _Producer(batch_size, txn)
        saved = batch_send._record_batch
        batch_send._record_batch = saved if compiled else None
        random.seed(7)  # keyless records: aiokafka's partitioner picks at random, the same picks both times
        try:
            errors = await send_batched(p, items, **kwargs)
        finally:
            batch_send._record_batch = saved
        return [type(e) for e in errors], p.batches

    return asyncio.run(run(False)), asyncio.run(run(True))


#: the last field: the record carries the size and tail the size fit writes ahead
_out = st.tuples(st.sampled_from(["a", "b"]), st.none() | st.binary(min_size=1, max_size=8), st.binary(max_size=600),
                 st.integers(0, 1 << 42), _headers, st.booleans())


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(items=st.lists(st.lists(_out, min_size=1, max_size=3), max_size=10), batch_size=st.integers(200, 3000),
       limit=st.integers(300, 4000), split=st.booleans(), txn=st.booleans())
def test_send_batched_writes_what_aiokafkas_builders_write(items: list[list[tuple]], batch_size: int, limit: int,
                                                           split: bool, txn: bool) -> None:
    """Same batches per topic-partition (bytes, record counts, order), same per-item outcomes -
    records over the topic's limit refused up front, an item's later records not sent."""
    out = [[(t, k, v, ts, h, *(_with_tail(k, v, h) if tail else (None, None))) for t, k, v, ts, h, tail in item]
           for item in items]
    theirs, ours = _sent_both_ways(out, batch_size, txn,
                                   limit_for=lambda topic: limit if topic == "a" else limit // 2, split=split)
    assert ours == theirs
    assert all(e in (type(None), RefusedUpFront) for e in ours[0])


@pytest.mark.parametrize("bad", [
    ("a", b"k", "a str value", 1_700_000_000_000, [], 100, None),
    ("a", b"k", b"v", 1_700_000_000_000, [("h", "a str header value")], 100, None),
    ("a", b"k", b"v", 1_700_000_000_000, None, 100, None),  # no header list: aiokafka's builder takes it as []
    ("a", b"k", b"v", 1_700_000_000_000, [], 100, "a str tail"),
])  # sized, as the worker's records are: no up-front estimate refuses them before the writer
def test_a_record_the_compiled_writer_refuses_fails_its_item_alone(bad: tuple) -> None:
    """A record the compiled writer does not take (not bytes, say) never escapes `send_batched`:
    the partition's batch goes through aiokafka's builder, which refuses that item alone (or takes
    it) - the same per-item outcomes and batches as with aiokafka's builder throughout."""
    good = [("a", b"k", b"v%d" % i, 1_700_000_000_000 + i, [("h", b"x")], None, None) for i in range(3)]
    theirs, ours = _sent_both_ways([[good[0]], [bad], [good[1], good[2]]], 3000, False)
    assert ours == theirs
    assert ours[0][0] is type(None) and ours[0][2] is type(None)  # the others' records went out
    assert sum(n for tp in ours[1].values() for _, n in tp) == 3 + (ours[0][1] is type(None))

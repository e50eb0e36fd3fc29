"""`app.worker.batch_send.send_batched`: the same records, partitions, order, headers and
timestamps as one aiokafka `send` per record - checked against a real broker by writing the same
items both ways and reading both topics back - and failures kept with the items they belong to."""

from __future__ import annotations

import asyncio
import uuid
from types import SimpleNamespace

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import MessageSizeTooLargeError
from aiokafka.producer.message_accumulator import BatchBuilder
from aiokafka.record.default_records import DefaultRecordBatchBuilder

from app import native
from app.broker.admin import ensure_topics
from app.worker import batch_send
from app.worker.batch_send import BatchTooLargeError, RefusedUpFront, send_batched
from tests.support import require

PARTS = 4


async def _read_all(bootstrap: str, topic: str, n: int) -> dict[int, list[tuple]]:
    c = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False, fetch_max_wait_ms=20)
    await c.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(PARTS)]
        c.assign(tps)
        await c.seek_to_beginning(*tps)
        out: dict[int, list[tuple]] = {p: [] for p in range(PARTS)}
        got = 0
        async with asyncio.timeout(30):
            while got < n:
                for tp, rs in (await c.getmany(timeout_ms=200)).items():
                    for r in rs:
                        out[tp.partition].append((r.key, r.value, r.timestamp, list(r.headers)))
                        got += 1
        return out
    finally:
        await c.stop()


@pytest.mark.parametrize("builder", ["compiled", "tails", "aiokafka"])
async def test_batched_records_match_per_record_sends(broker, builder: str, monkeypatch) -> None:
    """Both builders of `send_batched`: `prism_native.record_batch` (when built) - from the
    records' fields, or ("tails") from each record's size and tail written ahead as the worker's
    size fit writes them (`prism_native.record_tail`) - and aiokafka's."""
    if builder == "aiokafka":
        monkeypatch.setattr(batch_send, "_record_batch", None)
    else:
        require(batch_send._record_batch is not None, "prism_native is not built or is stale (make native: needs cargo)")

    def measured(k: bytes | None, v: bytes, h: list) -> tuple[int | None, bytes | None]:
        if builder != "tails":
            return None, None
        size, tail = native.module.record_tail(k, v, h)
        return size, tail

    run = uuid.uuid4().hex[:6]
    a, b = f"bs.{run}.a", f"bs.{run}.b"  # written per record / batched
    await ensure_topics(broker.bootstrap, {a + ".v2": PARTS, a + ".v3": PARTS, b + ".v2": PARTS, b + ".v3": PARTS})
    items = []
    for i in range(600):  # several 16 KiB batches per partition
        key = None if i % 50 == 7 else f"key-{i % 37}".encode()
        headers = [("prism-message-id", f"m{i}".encode()), ("prism-source", b"t/0/%d" % i)]
        ts = 1_700_000_000_000 + i
        items.append([(".v2", key, (b"v2-%d-" % i) * 20, ts, headers), (".v3", key, (b"v3-%d-" % i) * 20, ts, headers)])
    p = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, linger_ms=5, max_batch_size=16 * 1024)
    await p.start()
    try:
        futs = [await p.send(a + sfx, v, key=k, timestamp_ms=ts, headers=h) for it in items for sfx, k, v, ts, h in it]
        await asyncio.gather(*futs)
        handed: list[type] = []
        send_batch = p.send_batch

        async def spy(batch, topic, *, partition):
            handed.append(type(batch))
            return await send_batch(batch, topic, partition=partition)

        monkeypatch.setattr(p, "send_batch", spy)
        errors = await send_batched(p, [[(b + sfx, k, v, ts, h, *measured(k, v, h)) for sfx, k, v, ts, h in it]
                                        for it in items])
    finally:
        await p.stop()
    assert errors == [None] * len(items)
    assert set(handed) == {BatchBuilder if builder == "aiokafka" else batch_send.ClosedBatch}
    for sfx in (".v2", ".v3"):
        want = await _read_all(broker.bootstrap, a + sfx, len(items))
        got = await _read_all(broker.bootstrap, b + sfx, len(items))
        keyed = {p: [r for r in rs if r[0] is not None] for p, rs in want.items()}
        # keyed records: same partition, same order, same bytes; keyless ones go to a random
        # partition either way (aiokafka's partitioner), so only their content is compared
        assert {p: [r for r in rs if r[0] is not None] for p, rs in got.items()} == keyed
        assert sorted(r for rs in got.values() for r in rs if r[0] is None) == \
            sorted(r for rs in want.values() for r in rs if r[0] is None)


class _Builder:
    def __init__(self, room: int) -> None:
        self.records: list[bytes] = []
        self.room = room

    def append(self, *, timestamp, key, value, headers):
        if len(self.records) >= self.room:
            return None
        self.records.append(value)
        return object()

    def close(self):
        self.closed = True

    def record_count(self):
        return len(self.records)


class _Cluster:
    def partitions_for_topic(self, topic):
        return {0}

    def available_partitions_for_topic(self, topic):
        return {0}


class _Client:
    cluster = _Cluster()

    async def _wait_on_metadata(self, topic):
        return None


class FakeAiokafka:
    """aiokafka's batch API, with deliveries that fail for chosen values."""

    def __init__(self, fail: set[bytes] = frozenset(), room: int = 2) -> None:
        self.client, self._max_request_size = _Client(), 1000
        self._partitioner = lambda key, all_parts, available: all_parts[0]
        self.fail, self.room = fail, room
        self.batches: list[tuple[str, list[bytes]]] = []

    def create_batch(self) -> _Builder:
        return _Builder(self.room)

    async def send_batch(self, batch, topic, *, partition):
        assert getattr(batch, "closed", False), "handed over open: it would wait out the producer's linger"
        self.batches.append((topic, batch.records))
        fut = asyncio.get_running_loop().create_future()
        if self.fail & set(batch.records):
            fut.set_exception(OSError(f"lost {batch.records}"))
        else:
            fut.set_result(None)
        return fut


async def test_a_failed_batch_fails_every_item_in_it_and_only_those() -> None:
    p = FakeAiokafka(fail={b"c"}, room=2)
    items = [[("t", b"k", b"a", None, [], None, None)], [("t", b"k", b"b", None, [], None, None)], [("t", b"k", b"c", None, [], None, None)],
             [("u", b"k", b"d", None, [], None, None)]]
    errors = await send_batched(p, items)
    assert p.batches == [("t", [b"a", b"b"]), ("t", [b"c"]), ("u", [b"d"])]  # in order, split when full
    assert errors[0] is None and errors[1] is None and errors[3] is None
    assert isinstance(errors[2], OSError)


async def test_an_oversized_record_fails_its_item_before_anything_of_it_is_queued_after() -> None:
    p = FakeAiokafka()
    items = [[("t", b"k", b"x" * 2000, None, [], None, None), ("t", b"k", b"second", None, [], None, None)], [("t", b"k", b"ok", None, [], None, None)]]
    errors = await send_batched(p, items)
    assert isinstance(errors[0], MessageSizeTooLargeError) and errors[1] is None
    assert p.batches == [("t", [b"ok"])]  # the refused item's later record was not sent


async def test_a_record_that_fits_no_batch_fails_alone() -> None:
    p = FakeAiokafka(room=0)
    errors = await send_batched(p, [[("t", b"k", b"a", None, [], None, None)]])
    assert isinstance(errors[0], MessageSizeTooLargeError) and p.batches == []


@pytest.mark.parametrize("via", ["max_request_size", "limit_for"])
async def test_a_record_exactly_at_its_limit_goes_and_one_byte_over_is_refused_up_front(via: str) -> None:
    """A caller without a size fit (size None: `send_batched` measures the record itself, with
    aiokafka's estimate), its limit the producer's `max_request_size` or the topic's `limit_for`."""
    headers = [("prism-h", b"v" * 40)]
    size = DefaultRecordBatchBuilder.estimate_size_in_bytes(b"k", b"x" * 500, headers)
    for limit, fits in ((size, True), (size - 1, False)):
        p = FakeAiokafka(room=10)
        p._max_request_size = limit if via == "max_request_size" else 1 << 20
        kw = {"limit_for": lambda topic, limit=limit: limit} if via == "limit_for" else {}
        errors = await send_batched(p, [[("t", b"k", b"x" * 500, None, headers, None, None)]], **kw)
        if fits:
            assert errors == [None] and p.batches == [("t", [b"x" * 500])]
        else:
            assert isinstance(errors[0], RefusedUpFront) and p.batches == []
            assert f"is {size} bytes when serialized" in str(errors[0])


async def test_a_size_handed_over_meets_the_same_limit_and_is_not_measured_again(monkeypatch) -> None:
    """`OutRecord`'s size: a caller that measured the record (the worker's size fit) hands it over;
    `send_batched` holds it to the limit in force at the send, exactly at it and one byte over,
    and measures only the records handed over without one."""
    calls: list[int] = []
    real = DefaultRecordBatchBuilder.estimate_size_in_bytes

    def counting(key, value, headers):
        calls.append(1)
        return real(key, value, headers)

    monkeypatch.setattr(batch_send, "DefaultRecordBatchBuilder", SimpleNamespace(estimate_size_in_bytes=counting))
    size = real(b"k", b"a" * 300, [])
    for limit, fits in ((size, True), (size - 1, False)):
        p = FakeAiokafka(room=10)
        calls.clear()
        errors = await send_batched(p, [[("t", b"k", b"a" * 300, None, [], size, None)], [("t", b"k", b"b", None, [], None, None)]],
                                    limit_for=lambda topic, limit=limit: limit)
        assert calls == [1]  # the second record only: the first one's size was handed over
        assert errors[1] is None
        if fits:
            assert errors[0] is None and p.batches == [("t", [b"a" * 300, b"b"])]
        else:
            assert isinstance(errors[0], RefusedUpFront) and f"is {size} bytes" in str(errors[0])
            assert p.batches == [("t", [b"b"])]


async def test_a_batch_refused_for_its_size_is_no_verdict_on_its_records_but_a_lone_record_is() -> None:
    """The records a batch held (aiokafka's `record_count`) decide which error its items get:
    several - `BatchTooLargeError` (the caller retries them split); one - the broker's refusal."""
    from aiokafka.errors import RecordTooLargeError

    class Refusing(FakeAiokafka):
        async def send_batch(self, batch, topic, *, partition):
            await super().send_batch(batch, topic, partition=partition)  # recorded, as delivered
            fut = asyncio.get_running_loop().create_future()
            fut.set_exception(RecordTooLargeError())
            return fut

    p = Refusing(room=10)
    errors = await send_batched(p, [[("t", b"k", b"a", None, [], None, None)], [("t", b"k", b"b", None, [], None, None)],
                                    [("u", b"k", b"c", None, [], None, None)]])
    assert p.batches == [("t", [b"a", b"b"]), ("u", [b"c"])]
    assert [type(e) for e in errors] == [BatchTooLargeError, BatchTooLargeError, RecordTooLargeError]
    assert errors[0].records == 2  # type: ignore[union-attr]


async def test_nothing_to_send() -> None:
    assert await send_batched(FakeAiokafka(), []) == []
    told: list[list[BaseException | None]] = []

    async def on_queued(errors: list[BaseException | None]) -> None:
        told.append(errors)

    assert await send_batched(FakeAiokafka(), [], on_queued=on_queued) == [] and told == [[]]


class _Pending(FakeAiokafka):
    """Deliveries that stay pending until the test settles them."""

    async def send_batch(self, batch, topic, *, partition):
        await super().send_batch(batch, topic, partition=partition)
        self.futures = [*getattr(self, "futures", []), asyncio.get_running_loop().create_future()]
        return self.futures[-1]


async def test_on_queued_names_the_items_refused_up_front_before_any_delivery_or_the_hand_over() -> None:
    """exactly_once queues the dedup changelog of the queued items there (app/worker/exactly_once.py):
    told once every record is queued, with the up-front refusals only, while every delivery is
    still pending and before `handed_over` (the transaction's offsets) is resolved."""
    p = _Pending(room=10)
    handed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    told: list[tuple[list[BaseException | None], bool, bool]] = []

    async def on_queued(errors: list[BaseException | None]) -> None:
        told.append((errors, any(f.done() for f in p.futures), handed.done()))

    items = [[("t", b"k", b"a", None, [], None, None)], [("t", b"k", b"x" * 2000, None, [], None, None)], [("u", b"k", b"c", None, [], None, None)]]
    sending = asyncio.ensure_future(send_batched(p, items, handed_over=handed, on_queued=on_queued))
    await handed
    [(errors, delivered, was_handed)] = told
    assert errors[0] is None and isinstance(errors[1], MessageSizeTooLargeError) and errors[2] is None
    assert not delivered and not was_handed and not sending.done()
    p.futures[0].set_result(None)
    p.futures[1].set_exception(OSError("lost"))
    errors = await sending
    assert errors[0] is None and isinstance(errors[2], OSError)
    assert told[0][0][2] is None  # a copy: what failed later is not what the caller was told


@pytest.mark.parametrize("n", [1, 3])
async def test_every_item_of_a_successful_batch_succeeds(n: int) -> None:
    p = FakeAiokafka(room=10)
    assert await send_batched(p, [[("t", None, b"v%d" % i, 1, [], None, None)] for i in range(n)]) == [None] * n


class _SizedCluster:
    """Topics with different partition counts (the memo must not assume one count per key), and
    some partitions unavailable (a keyed record still goes by all of them, as aiokafka places it)."""

    counts = {"seven": 7, "three": 3}

    def partitions_for_topic(self, topic):
        return set(range(self.counts[topic]))

    def available_partitions_for_topic(self, topic):
        return set(range(0, self.counts[topic], 2))


@pytest.mark.parametrize("kind", ["aiokafka", "prism"])
async def test_keys_land_where_aiokafkas_default_partitioner_puts_them(kind: str) -> None:
    """Each key is hashed once per call (the costly part: compiled when prism_native is in use,
    app/bindings/partitioner.py) and placed exactly as aiokafka's `DefaultPartitioner` places
    it, for every topic's partition count - with the producer's partitioner aiokafka's or the
    SDK's compiled-hash twin. Keys of every length mod 4 up to 35 bytes, 36-byte UUIDs (the
    correlation ids `partition_key` gives by default) and bytes >= 0x80. A custom partitioner is
    still called per record."""
    from aiokafka.partitioner import DefaultPartitioner

    from app.bindings.partitioner import Partitioner

    class Placing(FakeAiokafka):
        def __init__(self, partitioner) -> None:
            super().__init__(room=10_000)
            self.client = _Client()
            self.client.cluster = _SizedCluster()
            self._partitioner = partitioner
            self.placed: dict[tuple[str, int], list[bytes]] = {}

        async def send_batch(self, batch, topic, *, partition):
            self.placed[(topic, partition)] = batch.records
            return await super().send_batch(batch, topic, partition=partition)

    keys = [f"order-{i:06d}-{'x' * (i % 23)}".encode() for i in range(200)]
    keys += [str(uuid.UUID(int=i * 0x9E3779B97F4A7C15_F39CC0605CEDC834 % 2**128)).encode() for i in range(200)]
    keys += [bytes((i * 37 + j * 101) % 256 for j in range(i % 41)) + b"\x80\xff" for i in range(100)]
    items = [[(t, k, k + t.encode(), None, [], None, None) for t in ("seven", "three")] for k in keys]
    producer = Placing(DefaultPartitioner() if kind == "aiokafka" else Partitioner())
    assert await send_batched(producer, items) == [None] * len(items)
    reference = DefaultPartitioner()
    for topic, n in _SizedCluster.counts.items():
        for k in keys:
            want = reference(k, list(range(n)), list(range(0, n, 2)))
            assert k + topic.encode() in producer.placed[(topic, want)]
    keyless = Placing(DefaultPartitioner() if kind == "aiokafka" else Partitioner())  # no key: a random available partition, as aiokafka's
    assert await send_batched(keyless, [[("seven", None, b"v%d" % i, None, [], None, None)] for i in range(30)]) == [None] * 30
    assert {p for _, p in keyless.placed} <= {0, 2, 4, 6}

    calls: list[tuple[bytes | None, list[int], list[int]]] = []
    custom = Placing(lambda key, all_parts, available: calls.append((key, all_parts, available)) or all_parts[-1])
    assert await send_batched(custom, items[:5]) == [None] * 5
    assert calls == [(k, list(range(n)), list(range(0, n, 2))) for k in keys[:5] for n in (7, 3)]


async def test_a_closed_batch_is_ready_at_once_in_aiokafkas_accumulator() -> None:
    """Why `send_batched` closes each batch before handing it over (issue 29, latency): aiokafka
    holds an open batch for `linger_ms` - the worker's producer lingers 5 ms - and a partition's
    next `send_batch` waits until the one before has left. A closed batch is ready at once, and
    no later `send` can add records to it. Checked on aiokafka's own accumulator (no broker)."""
    from aiokafka.producer.message_accumulator import BatchBuilder, MessageAccumulator
    from aiokafka.structs import TopicPartition

    acc = MessageAccumulator(_Cluster(), 16384, 0, 30, linger_ms=5_000)
    tp = TopicPartition("t", 0)

    def builder() -> BatchBuilder:
        b = BatchBuilder(16384, 0, is_transactional=False, key_serializer=None, value_serializer=None)
        assert b.append(timestamp=None, key=b"k", value=b"v", headers=[]) is not None
        return b

    open_one = builder()
    await acc.add_batch(open_one, tp, 1)
    assert acc._batches[tp][0].remaining_linger() > 4  # an open batch lingers
    acc._batches[tp].clear()
    closed_one = builder()
    closed_one.close()
    await acc.add_batch(closed_one, tp, 1)
    assert acc._batches[tp][0].remaining_linger() is None  # ready now
    assert closed_one.append(timestamp=None, key=b"k", value=b"late", headers=[]) is None  # nothing joins it


async def test_a_failing_on_queued_leaves_no_delivery_error_unretrieved() -> None:
    """exactly_once's changelog could not be queued: the transaction fails with that error, and the
    outputs' deliveries nobody awaits any more do not each log "Future exception was never retrieved"."""
    p = _Pending(room=10)

    async def on_queued(errors: list[BaseException | None]) -> None:
        raise RuntimeError("the changelog record does not fit an empty producer batch")

    with pytest.raises(RuntimeError):
        await send_batched(p, [[("t", b"k", b"a", None, [], None, None)], [("u", b"k", b"b", None, [], None, None)]], on_queued=on_queued)
    for f in p.futures:
        f.set_exception(OSError("aborted"))
    await asyncio.sleep(0)  # the done-callbacks run
    assert [f._log_traceback for f in p.futures] == [False, False]

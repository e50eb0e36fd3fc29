"""`ExactlyOnce` (app/worker/exactly_once.py) without a broker: one transaction per batch with the
input offset in it, a size refusal retried split on a fresh producer, any other failure aborts
and stops the worker. The same paths on Apache Kafka: test_exactly_once_e2e.py,
test_topic_limits_e2e.py, test_exactly_once_restart_soak.py."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka.errors import KafkaConnectionError, RecordTooLargeError, TopicAuthorizationFailedError
from aiokafka.structs import TopicPartition

from app.worker.exactly_once import SIZE_RETRIES, ExactlyOnce
from app.worker.transactions import PartitionProducers, TransactionFailed, _register_partitions
from tests.worker.fake_delivery import FailingProducer, FakeFitter, RecordingEnd, batch, worker


class TxnProducer(FailingProducer):
    """A transactional producer: records its transaction calls."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.calls: list[Any] = []

    async def begin_transaction(self) -> None:
        self.calls.append("begin")

    async def send_offsets_to_transaction(self, offsets: dict[Any, int], group_id: str) -> None:
        self.calls.append(("offsets", {(tp.topic, tp.partition): o for tp, o in offsets.items()}, group_id))

    async def commit_transaction(self) -> None:
        self.calls.append("commit")

    async def abort_transaction(self) -> None:
        self.calls.append("abort")


class FakeTransactions:
    """`PartitionProducers` over prepared producers: each `producer_for` hands out the next one
    (a closed partition's next producer is a fresh one: a new epoch)."""

    run = PartitionProducers.run  # the real begin / body / offsets / commit-or-abort

    def __init__(self, *producers: TxnProducer) -> None:
        self.producers = list(producers)
        self.handed: list[TxnProducer] = []
        self.closed: list[list[tuple[str, int]]] = []  # every close(), in order
        self._fresh = True
        self.aborted = self.committed = 0  # counted by `run`
        self.all_closed = False

    async def producer_for(self, topic: str, partition: int) -> TxnProducer:
        if self._fresh:
            self.handed.append(self.producers.pop(0))
            self._fresh = False
        return self.handed[-1]

    async def close(self, tps: list[tuple[str, int]]) -> None:
        self.closed.append(tps)
        self._fresh = True

    async def close_all(self) -> None:
        self.all_closed = True


def _aborted(producer: TxnProducer) -> bool:
    """Begun and aborted, never committed. The offsets may have been sent into the transaction
    (they go out once the records are queued, `PartitionProducers.run`): the abort discards them
    with the records."""
    calls = producer.calls
    return calls[0] == "begin" and calls[-1] == "abort" and "commit" not in calls and len(calls) <= 3


def _delivery(*producers: TxnProducer):  # type: ignore[no-untyped-def]
    app, consumer, state, observer = worker()
    fitter = FakeFitter()
    txn = FakeTransactions(*producers)
    return ExactlyOnce(app, state, fitter, txn), app, consumer, state, observer, fitter, txn  # type: ignore[arg-type]


async def test_a_batch_commits_in_one_transaction_with_its_next_offset_then_is_released() -> None:
    producer = TxnProducer()
    d, _, consumer, state, _, _, _ = _delivery(producer)
    end = RecordingEnd(consumer)
    b = batch(consumer, 3, partition=2, start=10)
    await d.deliver(b, None, end)
    assert producer.calls == ["begin", ("offsets", {("src", 2): 13}, "g"), "commit"]
    assert producer.written("src.v2") == [b"v2-10", b"v2-11", b"v2-12"]
    # released, not acknowledged: the offsets were committed in the transaction
    assert consumer.acked_offsets() == [] and not consumer._unacked_messages and all(m.acked for m in b.records)
    assert [c for c, _ in end.calls] == ["count", "account"] and state.stats.emitted == 3


async def test_a_size_refusal_aborts_and_runs_again_split_on_a_fresh_producer() -> None:
    first = TxnProducer(fail_with={b"v3-0": RecordTooLargeError()})
    second = TxnProducer()
    d, _, consumer, state, _, fitter, txn = _delivery(first, second)
    await d.deliver(batch(consumer, 2), None, RecordingEnd(consumer))
    assert _aborted(first) and txn.closed == [[("src", 0)]] and txn.handed == [first, second]
    assert second.calls == ["begin", ("offsets", {("src", 0): 2}, "g"), "commit"]
    # fresh limits, the batch fitted again, one record per producer batch
    assert fitter.refusals == 1 and fitter.fits == 1 and state.stats.size_retried_transactions == 1
    assert [vs for t, vs in second.batches if t == "src.v3"] == [[b"v3-0"], [b"v3-1"]]
    assert not consumer._unacked_messages


async def test_refused_every_time_the_transaction_fails_after_size_retries() -> None:
    producers = [TxnProducer(fail_with={b"v2-0": RecordTooLargeError()}) for _ in range(SIZE_RETRIES)]
    d, _, consumer, state, _, _, _ = _delivery(*producers)
    with pytest.raises(TransactionFailed):
        await d.deliver(batch(consumer, 2), None, RecordingEnd(consumer))
    assert all(_aborted(p) for p in producers)
    assert state.abandoning and state.stats.size_retried_transactions == SIZE_RETRIES - 1


async def test_any_other_failure_aborts_and_stops_the_worker() -> None:
    producer = TxnProducer(fail_with={b"v2-0": KafkaConnectionError()})
    d, _, consumer, state, _, _, _ = _delivery(producer)
    end = RecordingEnd(consumer)
    with pytest.raises(TransactionFailed):
        await d.deliver(batch(consumer, 2), None, end)
    assert _aborted(producer) and end.calls == []
    assert state.abandoning  # no later batch may commit past this one
    assert len(consumer._unacked_messages) == 2  # still tracked: read again from the committed offset


async def test_an_output_refused_up_front_is_dead_lettered_in_the_same_transaction() -> None:
    producer = TxnProducer(fail_with={b"v2-1": TopicAuthorizationFailedError()}, room=1)
    d, _, consumer, state, _, _, _ = _delivery(producer)
    await d.deliver(batch(consumer, 2), None, RecordingEnd(consumer))
    assert producer.calls == ["begin", ("offsets", {("src", 0): 2}, "g"), "commit"]
    assert producer.written("src.dlq") == [b"dlq:m1"] and state.stats.emitted == 1


async def test_stopping_before_the_transaction_leaves_the_batch_to_the_next_owner() -> None:
    producer = TxnProducer()
    d, app, consumer, state, observer, _, txn = _delivery(producer)
    app.should_stop = True
    end = RecordingEnd(consumer)
    await d.deliver(batch(consumer, 2), None, end)
    assert txn.handed == [] and end.calls == [] and observer.abandoned == 1 and state.stats.abandoned_batches == 1


async def test_close_stops_the_transactional_producers() -> None:
    d, _, _, _, _, _, txn = _delivery(TxnProducer())
    await d.close()
    assert txn.all_closed


async def test_close_after_a_failed_transaction_does_not_wait_for_its_batch() -> None:
    """The failed batch stays tracked (read again from the committed offset) but can never be
    acknowledged: close() stops the producers at once instead of waiting out `WRITE_DRAIN_S`."""
    import time

    d, _, consumer, state, _, _, txn = _delivery(TxnProducer(fail_with={b"v2-0": KafkaConnectionError()}))
    with pytest.raises(TransactionFailed):
        await d.deliver(batch(consumer, 2), None, RecordingEnd(consumer))
    assert state.abandoning and len(consumer._unacked_messages) == 2 and d.finishing == 0
    t0 = time.monotonic()
    await d.close()
    assert txn.all_closed and time.monotonic() - t0 < 1.0


async def test_close_waits_for_a_batch_still_finishing_after_another_failed() -> None:
    """Another partition's batch still inside its transaction when one failed: close() waits for
    it to commit before stopping the producers."""
    import asyncio

    gate = asyncio.Event()

    class Slow(TxnProducer):
        async def commit_transaction(self) -> None:
            await gate.wait()
            await super().commit_transaction()

    slow = Slow()
    d, _, consumer, state, _, _, txn = _delivery(slow)
    running = asyncio.ensure_future(d.deliver(batch(consumer, 2, partition=1), None, RecordingEnd(consumer)))
    while d.finishing == 0 or "begin" not in slow.calls:
        await asyncio.sleep(0.01)
    state.abandoning = True  # as a failed transaction of another partition leaves it
    closing = asyncio.ensure_future(d.close())
    await asyncio.sleep(0.2)
    assert not closing.done() and not txn.all_closed
    gate.set()
    await asyncio.wait_for(closing, 5)
    await running
    assert txn.all_closed and slow.calls[-1] == "commit" and d.finishing == 0


class AckAfterOffsets(TxnProducer):
    """The broker acknowledges the batch's writes only once the transaction's offsets were sent:
    a transaction that waited for the writes before sending its offsets never finishes."""

    def __init__(self) -> None:
        super().__init__()
        self.held: list[asyncio.Future[None]] = []

    async def send_batch(self, batch: Any, topic: str, *, partition: int) -> asyncio.Future[None]:
        await super().send_batch(batch, topic, partition=partition)
        fut = asyncio.get_running_loop().create_future()
        self.held.append(fut)
        return fut

    async def send_offsets_to_transaction(self, offsets: dict[Any, int], group_id: str) -> None:
        await super().send_offsets_to_transaction(offsets, group_id)
        for fut in self.held:
            fut.set_result(None)


async def test_the_offsets_go_out_while_the_writes_are_in_flight() -> None:
    producer = AckAfterOffsets()
    d, _, consumer, state, _, _, _ = _delivery(producer)
    await asyncio.wait_for(d.deliver(batch(consumer, 3, partition=1), None, RecordingEnd(consumer)), 5)
    assert producer.calls == ["begin", ("offsets", {("src", 1): 3}, "g"), "commit"]
    assert producer.written("src.v3") == [b"v3-0", b"v3-1", b"v3-2"] and state.stats.emitted == 3


class _Manager:
    def __init__(self) -> None:
        self.added: list[TopicPartition] = []

    def maybe_add_partition_to_txn(self, tp: TopicPartition) -> None:
        self.added.append(tp)


def test_partitions_written_later_join_the_first_add_partitions_when_known() -> None:
    producer = SimpleNamespace(_txn_manager=_Manager(), client=SimpleNamespace(
        cluster=SimpleNamespace(partitions_for_topic=lambda t: {0, 1} if t == "cl" else None)))
    _register_partitions(producer, [TopicPartition("cl", 1), TopicPartition("cl", 7), TopicPartition("new", 0)])
    # a partition the metadata does not know yet is left to its first write (which fetches it)
    assert producer._txn_manager.added == [TopicPartition("cl", 1)]
    _register_partitions(SimpleNamespace(), [TopicPartition("cl", 1)])  # a producer without transactions: nothing


async def test_an_abort_collects_the_offsets_still_waiting_for_the_records() -> None:
    producer = TxnProducer()
    txn = FakeTransactions(producer)
    body_ran: list[bool] = []

    async def body(handed_over: asyncio.Future[None]) -> None:
        body_ran.append(True)
        raise KafkaConnectionError()

    with pytest.raises(TransactionFailed):
        await txn.run(producer, body, {TopicPartition("src", 0): 1}, "g")
    # the records were never queued: the offsets never went out, and nothing is left pending
    assert body_ran and producer.calls == ["begin", "abort"] and txn.aborted == 1
    assert [t for t in asyncio.all_tasks() if t is not asyncio.current_task()] == []


async def test_a_fenced_producer_is_named_in_the_failure_not_only_its_symptom() -> None:
    """aiokafka's sender records `ProducerFenced` on its transaction manager (state FATAL_ERROR); the
    body's next write then raises only "Can't send messages while not in transaction". The
    failure names the fencing first (ci of stop 37: the worker's error line said IllegalOperation)."""
    from aiokafka.errors import IllegalOperation, ProducerFenced
    from aiokafka.producer.transaction_manager import TransactionManager, TransactionState

    producer = TxnProducer()
    manager = producer._txn_manager = TransactionManager("t", 30_000)
    producer.client = SimpleNamespace(cluster=SimpleNamespace(partitions_for_topic=lambda t: None))
    manager._transition_to(TransactionState.READY)
    manager.begin_transaction()
    txn = FakeTransactions(producer)

    async def body(handed_over: asyncio.Future[None]) -> None:
        manager.fatal_error(ProducerFenced())
        raise IllegalOperation("Can't send messages while not in transaction")

    with pytest.raises(TransactionFailed) as failed:
        await txn.run(producer, body, {TopicPartition("src", 0): 1}, "g")
    assert str(failed.value).startswith("ProducerFenced: There is a newer producer")  # its name once
    assert "(then IllegalOperation: Can't send messages while not in transaction)" in str(failed.value)
    assert isinstance(failed.value.__cause__, IllegalOperation)  # the chain keeps what was raised


async def test_a_failure_the_manager_did_not_record_is_named_as_raised() -> None:
    from aiokafka.producer.transaction_manager import TransactionManager, TransactionState

    producer = TxnProducer()
    manager = producer._txn_manager = TransactionManager("t", 30_000)
    producer.client = SimpleNamespace(cluster=SimpleNamespace(partitions_for_topic=lambda t: None))
    manager._transition_to(TransactionState.READY)
    manager.begin_transaction()

    async def body(handed_over: asyncio.Future[None]) -> None:
        raise KafkaConnectionError()

    with pytest.raises(TransactionFailed, match=r"^KafkaConnectionError$"):
        await FakeTransactions(producer).run(producer, body, {TopicPartition("src", 0): 1}, "g")


# -- the dedup changelog travels with the outputs (one produce round trip per transaction) ----------

CHANGELOG = "g-dedup-changelog"


class _KeyedBuilder:
    """The fake producer's batch (`tests/worker/test_batch_send.py`), keeping each record's key too."""

    def __init__(self, room: int) -> None:
        self.records: list[bytes | None] = []
        self.keys: list[bytes | None] = []
        self.room = room

    def append(self, *, timestamp: Any, key: bytes | None, value: bytes | None, headers: Any) -> Any:
        if len(self.records) >= self.room:
            return None
        self.records.append(value)
        self.keys.append(key)
        return object()

    def close(self) -> None:
        self.closed = True

    def record_count(self) -> int:
        return len(self.records)


class ChangelogProducer(TxnProducer):
    """Records each changelog batch as a transaction call - (key, tombstone?) per record, and
    whether an output's delivery was still pending then - and answers it with its offsets. With
    a `gate`, the outputs' deliveries resolve only once it is set."""

    def __init__(self, gate: asyncio.Event | None = None, changelog_fails: BaseException | None = None,
                 **kw: Any) -> None:
        super().__init__(**kw)
        self.gate = gate
        self.changelog_fails = changelog_fails
        self.outputs: list[asyncio.Future[Any]] = []
        self.releases: list[asyncio.Future[None]] = []
        self.next_offset = 0

    def create_batch(self) -> _KeyedBuilder:
        return _KeyedBuilder(self.room)

    async def send_batch(self, batch: Any, topic: str, *, partition: int) -> asyncio.Future[Any]:
        loop = asyncio.get_running_loop()
        if topic == CHANGELOG:
            rows = [(k, v is None) for k, v in zip(batch.keys, batch.records, strict=True)]
            self.calls.append(("changelog", rows, any(not f.done() for f in self.outputs)))
            fut = loop.create_future()
            if self.changelog_fails is not None:
                fut.set_exception(self.changelog_fails)
                return fut
            fut.set_result(SimpleNamespace(topic_partition=(topic, partition), offset=self.next_offset))
            self.next_offset += len(rows)
            return fut
        inner = await super().send_batch(batch, topic, partition=partition)
        if self.gate is None:
            return inner
        gated = loop.create_future()

        async def release() -> None:
            await self.gate.wait()  # type: ignore[union-attr]
            try:
                gated.set_result(inner.result())
            except BaseException as exc:
                gated.set_exception(exc)

        self.releases.append(asyncio.ensure_future(release()))  # held: a pending task is only weakly referenced
        self.outputs.append(gated)
        return gated


def _dedup_batch(consumer: Any, n: int) -> Any:
    """`batch(consumer, n)` whose messages carry ids ``id<i>`` and go through a dedup stage over a
    Faust dedup window (a dict store) with a changelog."""
    from app.agents.dedup import Dedup
    from app.tables.dedup import FaustDedupWindow
    from tests.tables.conftest import FakeApp

    window = FaustDedupWindow(FakeApp(), window=10, max_deletes_per_event=4)
    window.table.changelog_topic = SimpleNamespace(get_topic_name=lambda: CHANGELOG)
    window.table.persisted = {}
    window.table.set_persisted_offset = window.table.persisted.__setitem__
    b = batch(consumer, n)
    for m, _ in b.pending:
        m.envelope = SimpleNamespace(message_id=f"id{m.offset}")
    b.dedup = Dedup(window)
    b.token = b.dedup.begin_batch()
    return b


def _changelog(producer: ChangelogProducer) -> list[tuple[bytes, bool]]:
    """Every changelog record the producer was handed, in order: (key, tombstone?)."""
    return [row for c in producer.calls if c[0] == "changelog" for row in c[1]]


async def _until(cond: Any, timeout: float = 5.0) -> None:
    async def poll() -> None:
        while not cond():
            await asyncio.sleep(0.005)
    await asyncio.wait_for(poll(), timeout)


async def test_the_changelog_is_queued_while_the_outputs_deliveries_are_pending() -> None:
    gate = asyncio.Event()
    producer = ChangelogProducer(gate=gate)
    d, _, consumer, _, _, _, _ = _delivery(producer)
    b = _dedup_batch(consumer, 3)
    running = asyncio.ensure_future(d.deliver(b, None, RecordingEnd(consumer)))
    try:
        await _until(lambda: any(c[0] == "changelog" for c in producer.calls), 2.0)
    finally:
        gate.set()
    await asyncio.wait_for(running, 5)
    # handed over while every output was still in flight, before the offsets and the commit
    assert producer.calls[1] == ("changelog", [(b"id0", False), (b"id1", False), (b"id2", False)], True)
    assert [c if isinstance(c, str) else c[0] for c in producer.calls] == ["begin", "changelog", "offsets", "commit"]
    window = b.dedup.window
    assert all(window.entry(f"id{i}") is not None for i in range(3))
    assert window.table.persisted == {(CHANGELOG, 0): 3}  # the commit marker's offset
    assert not b.dedup.pending


async def test_an_output_refused_up_front_puts_no_id_in_the_changelog() -> None:
    producer = ChangelogProducer()
    d, _, consumer, state, _, _, _ = _delivery(producer)
    b = _dedup_batch(consumer, 3)
    outputs = b.pending[1][1]
    outputs[1].record.value = b"x" * 2000  # larger than the producer's max_request_size: refused before queueing
    await d.deliver(b, None, RecordingEnd(consumer))
    assert _changelog(producer) == [(b"id0", False), (b"id2", False)]
    assert producer.written("src.dlq") == [b"dlq:m1"] and state.stats.emitted == 2
    window = b.dedup.window
    assert window.entry("id1") is None and window.entry("id0") is not None and window.entry("id2") is not None
    assert producer.calls[-1] == "commit"


async def test_an_output_failing_after_it_was_queued_is_put_then_tombstoned_and_absent_locally() -> None:
    producer = ChangelogProducer(fail_with={b"v2-1": TopicAuthorizationFailedError()}, room=1)
    d, _, consumer, state, _, _, _ = _delivery(producer)
    b = _dedup_batch(consumer, 3)
    await d.deliver(b, None, RecordingEnd(consumer))
    # one transaction: the puts with the outputs, the tombstone of id1 after them, then the commit
    assert _changelog(producer) == [(b"id0", False), (b"id1", False), (b"id2", False), (b"id1", True)]
    assert [c if isinstance(c, str) else c[0] for c in producer.calls] == [  # room=1: a record per batch
        "begin", "changelog", "changelog", "changelog", "offsets", "changelog", "commit"]
    assert producer.written("src.dlq") == [b"dlq:m1"] and state.stats.emitted == 2
    window = b.dedup.window
    assert window.entry("id1") is None and window.entry("id0") is not None and window.entry("id2") is not None
    assert window.table.persisted == {(CHANGELOG, 0): 4}


async def test_a_size_retry_stages_the_same_ids_once_and_commits_them_with_the_retry() -> None:
    import time

    first = ChangelogProducer(fail_with={b"v3-0": RecordTooLargeError()})
    second = ChangelogProducer()
    d, _, consumer, _, _, _, _ = _delivery(first, second)
    b = _dedup_batch(consumer, 3)
    window = b.dedup.window
    window.record_many([("old", 0)], now=0.0)  # long expired: its tombstone is due on partition 0
    assert await window.scan_expired(now=time.time()) == 1
    stagings: list[list[tuple[str, int]]] = []
    stage_many = window.stage_many

    def counted(entries: Any, now: float | None = None) -> Any:
        entries = list(entries)
        stagings.append(entries)
        return stage_many(entries, now)

    window.stage_many = counted
    await d.deliver(b, None, RecordingEnd(consumer))
    rows = [(b"old", True), (b"id0", False), (b"id1", False), (b"id2", False)]
    kinds = [c if isinstance(c, str) else c[0] for c in first.calls]
    assert kinds == ["begin", "changelog", "offsets", "abort"]  # the changelog was aborted with the outputs
    assert _changelog(first) == rows
    assert _changelog(second) == rows and second.calls[-1] == "commit"
    assert stagings == [[("id0", 0), ("id1", 0), ("id2", 0)]]  # once: staging takes due tombstones off a queue
    assert window.entry("old") is None and all(window.entry(f"id{i}") is not None for i in range(3))


async def test_a_size_retry_with_other_ids_keeps_the_expiry_tombstones_the_aborted_try_took() -> None:
    """The retry refits the batch (limits read anew): message 1's output is now dead-lettered up
    front, so the retry stages other ids - and must still delete the expired id whose tombstone
    the aborted try took off the window's queue."""
    import time

    from app.agents.dlq import DlqRecord

    first = ChangelogProducer(fail_with={b"v3-0": RecordTooLargeError()})
    second = ChangelogProducer()
    d, _, consumer, _, _, fitter, _ = _delivery(first, second)
    b = _dedup_batch(consumer, 3)
    window = b.dedup.window
    window.record_many([("old", 0)], now=0.0)
    assert await window.scan_expired(now=time.time()) == 1

    def fit(chain: Any, pending: Any, outcomes: Any, observed: Any) -> None:
        m1 = pending[1][0]
        pending[1] = (m1, DlqRecord("src.dlq", m1.key, b"dlq:" + m1.value, headers=[]))

    fitter.fit = fit
    await d.deliver(b, None, RecordingEnd(consumer))
    assert _changelog(second) == [(b"old", True), (b"id0", False), (b"id2", False)]
    assert second.calls[-1] == "commit" and second.written("src.dlq") == [b"dlq:m1"]
    assert window.entry("old") is None and window.entry("id1") is None
    assert window.entry("id0") is not None and window.entry("id2") is not None


async def test_a_changelog_write_that_fails_aborts_the_transaction() -> None:
    """aiokafka commits a transaction whose batch failed (its commit waits for the batches, not
    for their success): a refused changelog write must abort it, or the committed outputs' ids
    would be missing from the dedup table restored from the changelog."""
    producer = ChangelogProducer(changelog_fails=TopicAuthorizationFailedError(CHANGELOG))
    d, _, consumer, state, _, _, _ = _delivery(producer)
    b = _dedup_batch(consumer, 2)
    with pytest.raises(TransactionFailed, match="writing the dedup changelog in the transaction failed"):
        await d.deliver(b, None, RecordingEnd(consumer))
    calls = producer.calls
    assert calls[0] == "begin" and calls[-1] == "abort" and "commit" not in calls and state.abandoning
    window = b.dedup.window
    assert window.entry("id0") is None and window.entry("id1") is None  # nothing applied locally

"""`ExactlyOnce` (app/worker/exactly_once.py) without a broker: one transaction per batch with the
input offset in it, a size refusal retried split on a fresh producer, any other failure aborts
and stops the worker. The same paths on Apache Kafka: test_exactly_once_e2e.py,
test_topic_limits_e2e.py, test_exactly_once_restart_soak.py."""

from __future__ import annotations

from typing import Any

import pytest
from aiokafka.errors import KafkaConnectionError, RecordTooLargeError, TopicAuthorizationFailedError

from app.worker.exactly_once import SIZE_RETRIES, ExactlyOnce
from app.worker.transactions import PartitionProducers, TransactionFailed
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
    assert first.calls == ["begin", "abort"] and txn.closed == [[("src", 0)]] and txn.handed == [first, second]
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
    assert all(p.calls == ["begin", "abort"] for p in producers)
    assert state.abandoning and state.stats.size_retried_transactions == SIZE_RETRIES - 1


async def test_any_other_failure_aborts_and_stops_the_worker() -> None:
    producer = TxnProducer(fail_with={b"v2-0": KafkaConnectionError()})
    d, _, consumer, state, _, _, _ = _delivery(producer)
    end = RecordingEnd(consumer)
    with pytest.raises(TransactionFailed):
        await d.deliver(batch(consumer, 2), None, end)
    assert producer.calls == ["begin", "abort"] and end.calls == []
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

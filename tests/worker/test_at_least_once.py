"""`AtLeastOnce` (app/worker/at_least_once.py) without a broker: what it writes, retries,
dead-letters and acknowledges, and in which order. The same paths on real brokers:
test_write_limits.py (an unwritable DLQ), test_topic_limits_e2e.py (size refusals),
test_shutdown_dead_broker_e2e.py (abandoning at shutdown)."""

from __future__ import annotations

import asyncio

from aiokafka.errors import KafkaConnectionError, RecordTooLargeError, TopicAuthorizationFailedError

from app.worker.at_least_once import AtLeastOnce
from tests.worker.fake_delivery import FailingProducer, FakeFitter, FaustProducer, RecordingEnd, batch, worker


def _delivery(producer: FailingProducer, *, max_attempts: int = 3):  # type: ignore[no-untyped-def]
    app, consumer, state, observer = worker(max_attempts)
    app.producer = FaustProducer(producer)
    fitter = FakeFitter()
    return AtLeastOnce(app, state.topology, state, fitter), app, consumer, state, observer, fitter  # type: ignore[arg-type]


async def test_outputs_are_written_in_order_then_counted_acknowledged_accounted() -> None:
    producer = FailingProducer()
    d, _, consumer, state, _, _ = _delivery(producer)
    end = RecordingEnd(consumer)
    b = batch(consumer, 3)
    await d.deliver(b, None, end)
    assert producer.written("src.v2") == [b"v2-0", b"v2-1", b"v2-2"]
    assert producer.written("src.v3") == [b"v3-0", b"v3-1", b"v3-2"]
    # counted before any acknowledgement, accounted after all of them
    assert end.calls == [("count", 0), ("account", 3)]
    assert consumer.acked_offsets() == [0, 1, 2] and not consumer._unacked_messages
    assert state.stats.emitted == 3 and state.stats.written == {"src.v2": 3, "src.v3": 3}


async def test_a_failed_write_is_retried_and_counted_as_a_retry() -> None:
    producer = FailingProducer({b"v3-1": KafkaConnectionError()}, times={b"v3-1": 1})
    d, _, consumer, state, _, _ = _delivery(producer)
    await d.deliver(batch(consumer, 2), None, RecordingEnd(consumer))
    # the whole producer batch failed (both items): both sent again, nothing dead-lettered
    assert producer.written("src.v3") == [b"v3-0", b"v3-1", b"v3-0", b"v3-1"]
    assert producer.written("src.dlq") == []
    assert state.stats.publish_retries == 2 and consumer.acked_offsets() == [0, 1]


async def test_an_output_refused_for_good_goes_to_the_dlq_and_the_message_is_acknowledged() -> None:
    producer = FailingProducer({b"v2-1": TopicAuthorizationFailedError()}, room=1)
    d, _, consumer, state, _, _ = _delivery(producer)
    await d.deliver(batch(consumer, 2), None, RecordingEnd(consumer))
    assert producer.written("src.dlq") == [b"dlq:m1"]  # no retry of a permanent refusal
    assert state.stats.publish_retries == 1 and consumer.acked_offsets() == [0, 1]
    assert state.stats.emitted == 1 and state.stats.written["src.dlq"] == 1


async def test_a_batch_refused_for_its_size_is_sent_again_split_without_counting_an_attempt() -> None:
    producer = FailingProducer({b"v3-0": RecordTooLargeError()}, times={b"v3-0": 1})
    d, _, consumer, state, _, fitter = _delivery(producer, max_attempts=1)
    await d.deliver(batch(consumer, 2), None, RecordingEnd(consumer))
    assert state.stats.batches_split == 1 and fitter.refusals == 1  # the limits were read again
    assert state.stats.publish_retries == 0 and producer.written("src.dlq") == []
    # sent again one record per producer batch
    assert [(t, vs) for t, vs in producer.batches if t == "src.v3"][1:] == [("src.v3", [b"v3-0"]),
                                                                            ("src.v3", [b"v3-1"])]
    assert consumer.acked_offsets() == [0, 1]


async def test_an_unwritable_dlq_blocks_loudly_and_shutdown_abandons_the_batch() -> None:
    denied = TopicAuthorizationFailedError()
    producer = FailingProducer({b"v2-0": denied, b"dlq:m0": denied}, room=1)
    d, app, consumer, state, observer, _ = _delivery(producer, max_attempts=1)
    end = RecordingEnd(consumer)
    task = asyncio.ensure_future(d.deliver(batch(consumer, 1), None, end))
    async with asyncio.timeout(10):
        while state.blocked is None:
            await asyncio.sleep(0.01)
    assert "src.dlq" in state.blocked and observer.blocked == [state.blocked]
    app.should_stop = True  # SIGTERM while blocked: the stop does not wait for the DLQ
    async with asyncio.timeout(10):
        await task
    assert end.calls == [] and consumer.acked_offsets() == []  # not acknowledged: read again on restart
    assert state.abandoning and state.stats.abandoned_batches == 1 and observer.abandoned == 1
    assert not consumer._unacked_messages  # untracked, so Faust's stop does not wait for it


async def test_a_batch_after_an_abandoned_one_is_abandoned_too() -> None:
    producer = FailingProducer()
    d, _, consumer, state, observer, _ = _delivery(producer)
    state.abandoning = True
    end = RecordingEnd(consumer)
    await d.deliver(batch(consumer, 2), None, end)
    assert end.calls == [] and consumer.acked_offsets() == [] and observer.abandoned == 1


async def test_consecutive_batches_are_acknowledged_in_batch_order() -> None:
    producer = FailingProducer()
    d, _, consumer, _, _, _ = _delivery(producer)
    end = RecordingEnd(consumer)
    gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    async def first() -> None:
        await gate

    second = asyncio.ensure_future(d.deliver(batch(consumer, 2, start=2), first(), end))
    await asyncio.sleep(0.05)
    # written, but waiting for the batch before it: not acknowledged
    assert producer.written("src.v2") == [b"v2-2", b"v2-3"] and consumer.acked_offsets() == []
    gate.set_result(None)
    await second
    assert consumer.acked_offsets() == [2, 3]

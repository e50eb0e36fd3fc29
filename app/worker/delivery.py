"""Delivery: how a processed batch's outputs reach the broker and its inputs get acknowledged.

The batch runner (app/worker/batch_runner.py) takes a batch through the stage chain and hands
the result - a `Batch` - to the worker's `Delivery`, one of two:

* `AtLeastOnce` (app/worker/at_least_once.py): writes through the producer beneath Faust's,
  retries with backoff, dead-letters what cannot be written, blocks loudly when even the DLQ
  cannot be written, then acknowledges; Faust commits the offsets.
* `ExactlyOnce` (app/worker/exactly_once.py): one transaction per batch of one source
  partition - outputs, DLQ records, the dedup ids and the input offsets commit together.

Both end a batch the same way, through the runner's `BatchEnd`: `count` (outcome counters and
the observer), then the acknowledgement, then `account` (`RunStats.read`, the `on_batch` hook).
This module also holds what both send with: `send_all`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from app.agents.dlq import DlqRecord
from app.worker.batch_send import OutRecord, is_size_refusal, send_batched

if TYPE_CHECKING:
    import asyncio

    from app.agents.base import Message
    from app.agents.chain import Chain
    from app.agents.dedup import Dedup
    from app.agents.publish import Emission
    from app.worker.batch_source import CurrentMessage
    from app.worker.interfaces import RunStats


@dataclass(eq=False)
class Batch:
    """One fetched batch after the stage chain: what the delivery writes and acknowledges."""

    chain: Chain
    #: the fetched Faust messages, in order (one source topic; one partition under exactly_once)
    records: list[Any]
    #: source records the consumer had skipped, fetched and processed with the batch
    repaired: list[Message]
    #: each message's outputs or DLQ copy, in input order, fitted to the topics' limits
    pending: list[tuple[Message, list[Emission] | DlqRecord]]
    #: (topic, partition, outcome) -> messages
    outcomes: Counter[tuple[str, int, str]]
    #: the table-routing stand-in of each (topic, partition) of the batch
    stand_in_of: dict[tuple[str, int], CurrentMessage]
    #: (message, result) for the observer; None without one
    observed: list[tuple[Message, Any]] | None
    dedup: Dedup | None
    #: the dedup stage's batch token (`Dedup.begin_batch`)
    token: int | None

    @property
    def size(self) -> int:
        """Messages processed: the batch's own and the repaired ones."""
        return len(self.records) + len(self.repaired)


class BatchEnd(Protocol):
    """What a delivery calls on the runner once a batch is written (in this order, with the
    acknowledgement between): counters first, so a reader that sees a batch accounted for can
    rely on all its outcomes being written."""

    def count(self, batch: Batch) -> None: ...

    def account(self, batch: Batch) -> None: ...


class Delivery(Protocol):
    """A processing guarantee's way of writing and acknowledging a batch."""

    def deliver(self, batch: Batch, previous: Awaitable[None] | None, end: BatchEnd,
                ) -> Coroutine[Any, Any, None]:
        """The coroutine that finishes `batch`: writes its outputs and - after `previous`, the
        batch before it, has finished - acknowledges it. Called in batch order; anything that
        fixes the order of the writes happens before it returns. The coroutine runs as a task
        while the next batch goes through the chain."""
        ...

    async def close(self) -> None:
        """At shutdown, once the batches in flight are done: release what the delivery holds."""
        ...


def is_permanent(err: BaseException) -> bool:
    """A write error that retrying cannot fix: the record's size, the topic's name or the
    worker's permission to write it."""
    from aiokafka.errors import InvalidTopicError, TopicAuthorizationFailedError

    return is_size_refusal(err) or isinstance(err, InvalidTopicError | TopicAuthorizationFailedError)


async def send_all(producer: Any, items: list[list[Emission] | DlqRecord], limit_for: Callable[[str], int],
                   handed_over: asyncio.Future[None] | None = None, *, split: bool = False,
                   on_queued: Callable[[list[BaseException | None]], Awaitable[None]] | None = None,
                   ) -> list[BaseException | None]:
    """Send every item's records, in order, then await all their deliveries together;
    returns per item None (all its records written) or the error that failed it.

    `producer` is Faust's (its `_ensure_producer()` is the aiokafka producer): one producer call
    per topic-partition and batch (`app/worker/batch_send.py`), through the aiokafka producer
    beneath Faust's - the same accumulator, so Faust's flush before each offset commit still
    covers these records. An item whose record is refused sends none of its later records.
    An output's size is the one `SizeFitter.fit` measured (`Emission.size`) when it was fitted;
    `send_batched` checks it against the limit in force now, as it would its own estimate. Its
    tail (`Emission.tail`), its headers written then, is what the compiled batch writer copies.
    `on_queued`: `send_batched`'s - told which items were refused up front, once all are queued."""
    records: list[list[OutRecord]] = []
    append = records.append
    for item in items:
        if isinstance(item, DlqRecord):
            append([(item.topic, item.key, item.value, ts_ms(item.timestamp_ms), item.headers, None, None)])
        else:
            one = []
            for e in item:
                rec = e.record
                ms = rec.timestamp_ms
                # ts_ms(ms) inlined: two records per message; e.size and e.tail: the size fit's
                # measurement and the record's headers written then (None when not fitted), so the
                # send neither estimates the record again nor reads its header objects
                one.append((e.topic, rec.key, rec.value, int(ms / 1000 * 1000.0) if ms else None, rec.headers,
                            e.size, e.tail))
            append(one)
    return await send_batched(producer._ensure_producer(), records, handed_over=handed_over,
                              limit_for=limit_for, split=split, on_queued=on_queued)


def count_written(stats: RunStats, written: Iterable[tuple[Message, list[Emission] | DlqRecord]]) -> list[Message]:
    """Items written: their records per topic, one emitted message per item of outputs; returns
    the messages whose outputs (not DLQ copies) were written, in order. Called once per send with
    all the items it wrote: the topics go into `RunStats.written` in one `Counter.update` (~0.15 µs
    per message less than two `+= 1` each, issue 29)."""
    topics: list[str] = []
    add = topics.append
    emitted: list[Message] = []
    for m, item in written:
        if isinstance(item, DlqRecord):
            add(item.topic)
        else:
            emitted.append(m)
            for e in item:
                add(e.topic)
    stats.emitted += len(emitted)
    stats.written.update(topics)
    return emitted


def ts_ms(ms: int | None) -> int | None:
    """The record timestamp exactly as Faust's `send(timestamp=ms / 1000)` computed it (seconds
    and back), so batching did not change a byte of what is written."""
    return int(ms / 1000 * 1000.0) if ms else None


class StartedProducer:
    """An aiokafka producer where `send_all` expects Faust's (`_ensure_producer()`)."""

    __slots__ = ("producer",)

    def __init__(self, producer: Any) -> None:
        self.producer = producer

    def _ensure_producer(self) -> Any:
        return self.producer


__all__ = ["Batch", "BatchEnd", "Delivery", "StartedProducer", "count_written", "is_permanent", "send_all", "ts_ms"]

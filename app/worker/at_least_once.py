"""at_least_once delivery (the default): write, retry, dead-letter, then acknowledge.

A batch's outputs go to the producer beneath Faust's in batch order (after the previous
batch's hand-over); only once every output of the batch is written - or, for a message whose
outputs cannot be written, its DLQ copy - are the dedup ids made durable and the messages
acknowledged, so a crash never loses a message and the dedup stage turns redeliveries into
"duplicate". Writes that fail are retried with capped, jittered exponential backoff; a write
refused for good (size, authorization, invalid topic) is not retried. If even the DLQ cannot
be written the worker blocks loudly (`WorkerState.set_blocked`): blocking is the only
behaviour that neither drops nor duplicates beyond at-least-once. On shutdown a batch whose
writes have not finished within `WRITE_DRAIN_S` is abandoned unacknowledged.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Coroutine
from typing import TYPE_CHECKING, Any

from app.agents.dlq import DlqRecord
from app.errors import PrismError, SinkError, SizeLimitError
from app.worker.batch_send import BatchTooLargeError, is_size_refusal
from app.worker.batch_source import ack_all
from app.worker.delivery import Batch, BatchEnd, count_written, is_permanent, send_all
from app.worker.worker_state import WRITE_DRAIN_S, Abandoned, WorkerState, backoff

if TYPE_CHECKING:
    import faust

    from app.agents.base import Message
    from app.agents.chain import Chain
    from app.agents.publish import Emission
    from app.topology import Topology
    from app.worker.size_fit import SizeFitter

log = logging.getLogger("prism.worker")


class AtLeastOnce:
    """The at_least_once `Delivery` (app/worker/delivery.py)."""

    def __init__(self, app: faust.App, topology: Topology, state: WorkerState, fitter: SizeFitter) -> None:
        self.app = app
        self.topology = topology
        self.state = state
        self.fitter = fitter
        # id(chain) -> resolved once that chain's latest batch has handed its outputs to the producer
        self._handed_over: dict[int, asyncio.Future[None]] = {}

    def deliver(self, batch: Batch, previous: Awaitable[None] | None, end: BatchEnd,
                ) -> Coroutine[Any, Any, None]:
        producer = self.app.producer
        key = id(batch.chain)
        after = self._handed_over.get(key)
        handed_over = self._handed_over[key] = asyncio.get_running_loop().create_future()
        return self._finish(batch, producer, previous, after, handed_over, end)

    async def close(self) -> None:
        """Nothing to release: the producer is Faust's, flushed by Faust's own stop."""

    async def _finish(self, batch: Batch, producer: Any, previous: Awaitable[None] | None,
                      after: asyncio.Future[None] | None, handed_over: asyncio.Future[None], end: BatchEnd) -> None:
        state, dedup = self.state, batch.dedup
        # Outputs go to the producer in batch order: after the previous batch's.
        try:
            try:
                written = await self.write_all(batch.chain, producer, batch.pending, after=after,
                                               handed_over=handed_over)
            finally:
                if not handed_over.done():
                    handed_over.set_result(None)
            if previous is not None:
                await previous
            if state.abandoning:
                raise Abandoned  # an earlier batch was abandoned: acknowledging this one could skip it
        except Abandoned:
            state.abandon(batch.records, dedup, batch.token)
            return
        if dedup is not None:
            # Each id goes to its message's partition explicitly (no current event needed).
            dedup.record_emitted_all(written)
            # The ids' changelog records, handed to the producer together (retried until it
            # takes them); Faust flushes the producer before committing, so they are durable
            # before the batch's offsets are.
            try:
                await state.retrying(dedup.flush, "writing the dedup changelog", watch=state.write_watch)
            except Abandoned:  # outputs written, ids not durable: unacknowledged, read again
                state.abandon(batch.records, dedup, batch.token)
                return
            dedup.end_batch(batch.token)
        end.count(batch)
        # Acknowledged only now that their outputs are written, so commits never pass an
        # unwritten message; repaired records like the batch's own.
        consumer = self.app.consumer
        if batch.repaired:
            ack_all(consumer, [_faust_message(rec) for rec in batch.repaired])
        ack_all(consumer, batch.records)
        end.account(batch)

    async def write_all(self, chain: Chain, producer: Any, pending: list[tuple[Message, list[Emission] | DlqRecord]],
                        *, after: asyncio.Future[None] | None = None,
                        handed_over: asyncio.Future[None] | None = None) -> list[Message]:
        """Write everything; returns the messages whose outputs (not DLQ copies) were written.

        `after`: the previous batch's hand-over; this batch's first attempt waits for it, so
        the records of consecutive batches reach each output partition in batch order (retries
        of a failed write may land after later batches' records, as Kafka producer retries can).
        `handed_over` is resolved once this batch's first attempt has handed everything over.

        Outputs refused for good (`is_permanent`: size, authorization, topic) go to the DLQ at
        once, others after `dlq.max_attempts`. A DLQ copy the broker refuses for its size is cut
        down further (the broker's limit is lower than the configured one); a DLQ write that
        keeps failing blocks the worker loudly (`WorkerState.set_blocked`). Raises `Abandoned`
        when the worker stops while retrying, or its first attempt outlasts `WRITE_DRAIN_S`."""
        state, fitter, stats = self.state, self.fitter, self.state.stats
        dlq_cfg = self.topology.dlq
        todo = pending
        attempt = 1
        split = False  # after a batch refused for its size: one record per producer batch
        emitted: list[Message] = []
        if after is not None:
            await state.stop_aware(after, drain_s=WRITE_DRAIN_S)
        while todo:
            watch = state.write_watch.begin()
            try:
                results = await state.stop_aware(send_all(producer, [item for _, item in todo],
                                                          fitter.limits.limit_for, handed_over, split=split),
                                                 drain_s=WRITE_DRAIN_S)
            except BaseException:
                state.write_watch.discard(watch)
                raise
            state.write_watch.end(watch, next((r for r in results if r is not None), None))
            handed_over = None
            failed = [(m, item, r) for (m, item), r in zip(todo, results, strict=True) if r is not None]
            # counted in one pass; all of `todo` when nothing failed (the usual send)
            emitted += count_written(stats, todo if not failed else
                                     [(m, item) for (m, item), r in zip(todo, results, strict=True) if r is None])
            if not failed:
                if state.blocked is not None:
                    await state.set_blocked(None)
                return emitted
            if any(isinstance(err, BatchTooLargeError) or is_size_refusal(err) for _, _, err in failed):
                await fitter.after_refusal()
            if any(isinstance(err, BatchTooLargeError) for _, _, err in failed) and not split:
                # A batch refused for its size is no verdict on its records (batch_send.py): from
                # now on one record per batch; when nothing else failed, without counting an
                # attempt against any of them.
                split = True
                stats.batches_split += 1
                log.warning("the broker refused a record batch for its size (%s); the failed item(s) are sent again, "
                            "one record per batch", next(e for _, _, e in failed if isinstance(e, BatchTooLargeError)))
                if all(isinstance(err, BatchTooLargeError) for _, _, err in failed):
                    todo = [(m, item) for m, item, _ in failed]
                    continue
            attempt += 1
            stats.publish_retries += len(failed)
            nxt: list[tuple[Message, list[Emission] | DlqRecord]] = []
            dlq_failures: list[str] = []
            for m, item, err in failed:
                m.attempts = attempt
                if isinstance(item, list) and (attempt > dlq_cfg.max_attempts or is_permanent(err)):
                    log.warning("giving up on outputs of %s/%s@%s after %d attempt(s)%s: %s", m.topic, m.partition,
                                m.offset, attempt - 1, " (refused for good)" if is_permanent(err) else "", err)
                    if is_size_refusal(err):
                        stats.too_large += 1
                        cause: PrismError = SizeLimitError(f"the broker refused an output record: {err}",
                                                           hint="raise the topic's max.message.bytes or have the "
                                                                "producer send smaller messages")
                    else:
                        cause = SinkError(f"writing outputs failed: {err}", hint="check the broker / sink is reachable")
                    res = chain.dlq_for_publish_failure(m, cause, late=True)
                    assert res.dlq is not None
                    nxt.append((m, fitter.fit_dlq(res.dlq)))
                elif isinstance(item, DlqRecord):
                    if is_size_refusal(err):
                        # Refused alone: the broker's limit is below this record, even after the
                        # re-read above. Fit it under its own size until the next re-read.
                        nxt.append((m, fitter.lower(item, err)))
                    else:
                        nxt.append((m, item))
                        if attempt > dlq_cfg.max_attempts or is_permanent(err):
                            dlq_failures.append(f"{item.topic}: {err!r} ({attempt - 1} attempts)")
                else:
                    nxt.append((m, item))
            if dlq_failures and state.blocked is None:
                await state.set_blocked("; ".join(dlq_failures[:3]))
            await state.pause_sleep(backoff(attempt, dlq_cfg.backoff_initial_ms, dlq_cfg.backoff_max_ms))
            todo = nxt
        return emitted


def _faust_message(msg: Message) -> Any:
    """A Faust `Message` for a repaired record, so it is acknowledged like the batch's own."""
    from faust.types import Message as FaustMessage

    return FaustMessage(msg.topic, msg.partition, msg.offset, (msg.timestamp_ms or 0) / 1000, 0, msg.headers,
                        msg.key, msg.value, None)


__all__ = ["AtLeastOnce"]

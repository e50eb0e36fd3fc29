"""exactly_once delivery: one transaction per batch of one source partition.

The batch's outputs, its DLQ records, the dedup ids' changelog records and the next input
offset commit together or not at all, through that partition's transactional producer
(app/worker/transactions.py). Only then do the ids enter the local dedup store and the
messages stop being tracked (Faust never commits them itself).

Order inside the transaction (issue 29, latency): the outputs are queued; then, before their
deliveries are known, the changelog puts of the ids of the messages none of whose outputs was
refused up front (`send_batched`'s `on_queued`); then the offsets; then the deliveries are
awaited and `EndTxn` commits. The changelog's produce request thus travels with the outputs' -
one produce round trip per transaction, where waiting for the outputs before writing the
changelog cost two. What commits is the same: ids are recorded only for messages whose outputs
commit. An output that fails after it was queued with a permanent error is dead-lettered in the
same transaction, and its id, already queued as a put, is queued again as a tombstone after it
(`FaustDedupWindow.stage_removals`): the changelog's last word, and the local store once
`apply_staged` has run, say the id is absent, so a re-send is not dropped as a duplicate. Any
other failure after queueing aborts the transaction, the changelog records with it.

A partition's transactions run
one after the other, in batch order; different partitions' run side by side
(`BatchSource(split_partitions=True)`).

A batch the broker refuses for its size aborts the transaction (`_SizeRefused`); the
partition's producer is replaced (fresh epoch: the refused batch's sequence gap is what made
every later send fail with `OutOfOrderSequenceNumber`), the limits are read again and the batch
runs again split, up to `SIZE_RETRIES` times - its changelog is staged again only when the
retry queues other ids, keeping the expiry tombstones the aborted try took off the window's
queue (`_restage`). Any other failure stops the worker with one error
line; the batch is read again from the committed offset by the restarted worker or the
partition's next owner.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any

from app.agents.dlq import DlqRecord
from app.errors import SinkError
from app.worker.batch_send import BatchTooLargeError, RefusedUpFront, is_size_refusal, retrieved
from app.worker.batch_source import release_all
from app.worker.delivery import Batch, BatchEnd, StartedProducer, count_written, is_permanent, send_all
from app.worker.transactions import PartitionProducers, TransactionFailed
from app.worker.worker_state import WRITE_DRAIN_S, Abandoned, WorkerState

if TYPE_CHECKING:
    import faust

    from app.agents.base import Message
    from app.agents.chain import Chain
    from app.agents.publish import Emission
    from app.tables.dedup import FaustDedupWindow, StagedRow
    from app.worker.size_fit import SizeFitter

log = logging.getLogger("prism.worker")

#: attempts of one batch's transaction when the broker refuses a batch for its size (each retry
#: has fresh limits, a fresh producer epoch and one record per producer batch).
SIZE_RETRIES = 3


class _SizeRefused(Exception):
    """The broker refused one of the transaction's batches for its size."""


def _restage(window: FaustDedupWindow, before: list[StagedRow], entries: list[tuple[str, int]]) -> list[StagedRow]:
    """`window.stage_many(entries)`, keeping the expiry tombstones an earlier, aborted try of the
    same batch staged (`before`): staging took them off the window's queue, so a retry whose ids
    differ (a size retry refits the batch: an output may now be refused up front) would otherwise
    lose them until the next expiry scan. Tombstones stay before the puts (an expired id recorded
    again ends up recorded)."""
    rows = window.stage_many(entries, time.time())
    kept = [row for row in before if row[1] is None]
    if not kept:
        return rows
    known = {row[0] for row in kept}
    return kept + [row for row in rows if row[1] is not None or row[0] not in known]


def _watched(sent: list[tuple[asyncio.Future[Any], int]]) -> list[tuple[asyncio.Future[Any], int]]:
    """`sent` (changelog deliveries), each taken care of when done: the commit awaits them, but an
    aborted try (a size refusal in the same produce request) leaves them to nobody."""
    for fut, _ in sent:
        fut.add_done_callback(retrieved)
    return sent


async def _changelog_delivered(sent: list[tuple[asyncio.Future[Any], int]]) -> None:
    """Wait for the transaction's changelog deliveries; raise `SinkError` if one failed.

    Why: aiokafka's commit waits for a transaction's batches (`flush_for_commit`) but not for
    their success - a changelog batch the broker refused for good would be missing from a
    transaction that commits anyway, leaving the dedup table restored from the changelog
    without ids whose outputs were committed. Failing here aborts the transaction instead. It
    costs no round trip: the changelog travels in the outputs' produce requests, whose
    deliveries the body has awaited already."""
    for fut, _ in sent:
        try:
            await fut
        except Exception as exc:
            raise SinkError(f"writing the dedup changelog in the transaction failed: {exc!r}",
                            hint="the transaction is aborted and the batch read again; check the changelog "
                                 "topic and the worker's write access to it") from exc


class ExactlyOnce:
    """The exactly_once `Delivery` (app/worker/delivery.py) over `transactions`, the
    transactional producers of the owned source partitions."""

    def __init__(self, app: faust.App, state: WorkerState, fitter: SizeFitter,
                 transactions: PartitionProducers) -> None:
        self.app = app
        self.state = state
        self.fitter = fitter
        self.transactions = transactions
        #: batches inside `_finish` right now (awaiting their predecessor or their transaction)
        self.finishing = 0

    def deliver(self, batch: Batch, previous: Awaitable[None] | None, end: BatchEnd,
                ) -> Coroutine[Any, Any, None]:
        return self._counted(self._finish(batch, previous, end))

    async def _counted(self, finish: Coroutine[Any, Any, None]) -> None:
        self.finishing += 1
        try:
            await finish
        finally:
            self.finishing -= 1

    def _in_flight(self) -> bool:
        """Whether waiting can still see a batch finish. Once a batch was abandoned (SIGTERM) or
        its transaction failed (`state.abandoning`), the messages still tracked can never be
        acknowledged - every later batch is abandoned too - so only the batches still inside
        `_finish` are worth the wait. Waiting on the tracked messages then cost the whole
        `WRITE_DRAIN_S` (20 s) before a fenced or timed-out worker exited, and before its
        supervisor could start it again."""
        if self.state.abandoning:
            return self.finishing > 0
        return bool(self.app.consumer._unacked_messages)

    async def close(self) -> None:
        """At shutdown, once the batches in flight are done (at most `WRITE_DRAIN_S`), stop the
        transactional producers; a transaction still open is aborted by the broker or fenced by
        the partition's next owner."""
        deadline = time.monotonic() + WRITE_DRAIN_S
        while self._in_flight() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await self.transactions.close_all()

    async def _finish(self, batch: Batch, previous: Awaitable[None] | None, end: BatchEnd) -> None:
        state = self.state
        try:
            if previous is not None:
                await previous
            if state.abandoning or state.stopping():
                raise Abandoned  # stopping: leave it to the next owner rather than start a transaction
        except Abandoned:
            state.abandon(batch.records, batch.dedup, batch.token)
            return
        from aiokafka.structs import TopicPartition

        txn, chain, pending, dedup = self.transactions, batch.chain, batch.pending, batch.dedup
        topic, partition = batch.records[0].topic, batch.records[0].partition
        next_offset = max(m.offset for m in [*batch.records, *batch.repaired]) + 1
        window = getattr(dedup, "window", None) if dedup is not None else None
        if window is not None and not hasattr(window, "stage_many"):
            window = None  # a window without a changelog: nothing to stage
        staged: list[StagedRow] = []  # the changelog rows of the queued ids (and due expiry tombstones)
        staged_for: list[str] = []
        dropped: list[StagedRow] = []  # tombstones of staged ids whose outputs failed after queueing
        sent: list[Any] = []
        offsets = {TopicPartition(topic, partition): next_offset}
        # the dedup changelog is queued right after the outputs (module docstring): its partition
        # joins the first AddPartitionsToTxn
        changelog = window.table.changelog_topic.get_topic_name() if window is not None else None
        also_in = [TopicPartition(changelog, partition)] if changelog else []
        for attempt in range(1, SIZE_RETRIES + 1):
            producer = await txn.producer_for(topic, partition)

            async def body(handed_over: asyncio.Future[None], producer: Any = producer,
                           split: bool = attempt > 1) -> None:
                queued: list[Message] = []

                async def stage(msgs: list[Message]) -> None:
                    # the ids of the messages whose outputs were all queued, before their deliveries
                    # are known: one produce round trip for outputs and changelog together
                    assert window is not None
                    queued[:] = msgs
                    ids = [m.env.message_id for m in msgs]
                    if ids != staged_for:  # staged once per outcome: staging takes due tombstones off a queue
                        staged[:] = _restage(window, staged, [(m.env.message_id, m.partition) for m in msgs])
                        staged_for[:] = ids
                    sent[:] = _watched(await window.send_staged(producer, staged))

                dropped.clear()
                written = await self.write_in_transaction(chain, producer, pending, split=split,
                                                          handed_over=handed_over,
                                                          on_queued=stage if window is not None else None)
                if window is not None and len(written) != len(queued):
                    # outputs that failed after they were queued were dead-lettered: their ids went to
                    # the changelog as puts, so they go again as tombstones, after the puts
                    done = {id(m) for m in written}
                    dropped[:] = window.stage_removals([(m.env.message_id, m.partition)
                                                        for m in queued if id(m) not in done])
                    sent.extend(_watched(await window.send_staged(producer, dropped)))
                if sent:
                    await _changelog_delivered(sent)

            try:
                await txn.run(producer, body, offsets, str(self.app.conf.id), also_in=also_in)
                break
            except TransactionFailed as exc:
                await txn.close([(topic, partition)])  # its next producer starts a fresh epoch: sequences from 0
                if isinstance(exc.__cause__, _SizeRefused) and attempt < SIZE_RETRIES and not state.stopping():
                    # The broker refused a batch for its size (a limit lowered at run time, or
                    # below what it reports): nothing of the transaction is visible. Read the
                    # limits again, fit the batch to them, and run it again one record per batch.
                    state.stats.size_retried_transactions += 1
                    log.warning("exactly_once: the broker refused a write of %s[%d]'s batch for its size (%s); the "
                                "transaction was aborted and runs again with the limits read anew, one record per "
                                "producer batch", topic, partition, exc.__cause__)
                    await self.fitter.after_refusal()
                    self.fitter.fit(chain, pending, batch.outcomes, batch.observed)
                    continue
                state.abandoning = True  # no later batch may commit past this one
                log.error("exactly_once: the transaction of a batch of %d message(s) from %s[%d] was aborted (%s); "
                          "the worker stops and the batch is read again from the last committed offset - nothing of "
                          "it is visible to read_committed consumers", batch.size, topic, partition, exc)
                raise
        if window is not None and staged:
            window.apply_staged(staged + dropped, sent)  # the puts, then their removals: net absent
        if dedup is not None:
            dedup.end_batch(batch.token)
        end.count(batch)
        release_all(self.app.consumer, batch.records)
        end.account(batch)

    async def write_in_transaction(self, chain: Chain, producer: Any,
                                   pending: list[tuple[Message, list[Emission] | DlqRecord]], *,
                                   split: bool = False, handed_over: asyncio.Future[None] | None = None,
                                   on_queued: Callable[[list[Message]], Awaitable[None]] | None = None,
                                   ) -> list[Message]:
        """Send the batch's records into the open transaction; returns the messages whose outputs
        were sent. An output refused before it was queued (`is_permanent`: its size, the topic)
        is replaced by its DLQ copy in the same transaction, as at_least_once does. A batch the
        broker refused for its size raises `_SizeRefused` (the caller aborts and runs the batch
        again, split); any other failure makes the transaction uncommittable, so it raises.
        `handed_over` is resolved once the batch's records are queued (the transaction's offsets
        go out then, `PartitionProducers.run`). `on_queued`, just before that, is awaited with the
        messages whose outputs were all queued - none refused up front - in batch order (the
        dedup changelog goes out then); a message among them whose outputs fail later is missing
        from the returned list."""
        direct = StartedProducer(producer)
        stats = self.state.stats
        emitted: list[Message] = []
        todo = pending

        async def queued(errors: list[BaseException | None]) -> None:
            assert on_queued is not None
            await on_queued([m for (m, item), err in zip(pending, errors, strict=True)
                             if err is None and isinstance(item, list)])

        for _ in range(2):  # the batch, then the DLQ copies of outputs refused up front
            first = todo is pending
            results = await send_all(direct, [item for _, item in todo], self.fitter.limits.limit_for,
                                     handed_over if first else None, split=split,
                                     on_queued=queued if first and on_queued is not None else None)
            refused = next((e for e in results if e is not None and not isinstance(e, RefusedUpFront)
                            and (isinstance(e, BatchTooLargeError) or is_size_refusal(e))), None)
            if refused is not None:
                # delivered batches of this producer now have a sequence gap: nothing more can commit
                raise _SizeRefused(str(refused))
            retry: list[tuple[Message, list[Emission] | DlqRecord]] = []
            for (m, item), err in zip(todo, results, strict=True):
                if err is None:
                    emitted += count_written(stats, [(m, item)])
                elif isinstance(item, list) and is_permanent(err):
                    if is_size_refusal(err):
                        stats.too_large += 1
                    log.warning("outputs of %s/%s@%s refused (%s): dead-lettered in the same transaction",
                                m.topic, m.partition, m.offset, err)
                    res = chain.dlq_for_publish_failure(m, SinkError(f"writing outputs failed: {err}",
                                                                     hint="check the output topic"), late=True)
                    assert res.dlq is not None
                    retry.append((m, self.fitter.fit_dlq(res.dlq)))
                else:
                    raise SinkError(f"writing {m.topic}/{m.partition}@{m.offset} in the transaction failed: {err!r}")
            if not retry:
                return emitted
            todo = retry
        raise SinkError("DLQ copies refused in the transaction")


__all__ = ["SIZE_RETRIES", "ExactlyOnce"]

"""The worker's health state: blocked or not, stopping or not, what writes are failing.

One `WorkerState` per pipeline worker, shared by the batch runner and the delivery. It holds
what `/readyz` and the operator must see - `blocked` (the DLQ cannot be written: fetching
stops, loudly), the write watch (a write being retried), the run's `RunStats` - and the
stop-aware waiting every retry loop uses, so that SIGTERM ends the worker in every state:
once the worker stops, a write in flight gets at most `WRITE_DRAIN_S` and no retry follows
(`Abandoned`: the batch is left unacknowledged and read again on restart).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any

from app.worker.interfaces import BatchObserver, RunStats
from app.worker.kafka_health import WriteWatch, leader_problems

if TYPE_CHECKING:
    import faust

    from app.agents.dedup import Dedup
    from app.topology import Topology

log = logging.getLogger("prism.worker")

#: Once shutdown began, how long a batch's writes may still take before the batch is abandoned
#: unacknowledged (read again on restart). Well inside the documented drain (docs/operations.md).
WRITE_DRAIN_S = 20.0


class Abandoned(Exception):
    """The worker is stopping and this batch's writes did not finish: leave it unacknowledged."""


def backoff(attempt: int, initial_ms: int, max_ms: int) -> float:
    """Capped exponential backoff with full jitter (AWS architecture blog's recommendation)."""
    return random.uniform(0, min(max_ms, initial_ms * 2 ** (attempt - 2))) / 1000


class WorkerState:
    """Blocked/stopping state, problem reports and run statistics of one worker.

    `write_topics`: the topics the worker writes (its problem report names their leaders)."""

    def __init__(self, app: faust.App, topology: Topology, *, observe: BatchObserver | None = None,
                 write_topics: Iterable[str] = ()) -> None:
        self.app = app
        self.topology = topology
        self.observe = observe
        self.write_topics = tuple(write_topics)
        self.stats = RunStats()
        #: why the worker cannot write its DLQ (None: it can); /readyz reports it
        self.blocked: str | None = None
        #: write attempts in flight and the last failure: /readyz while the cluster is in trouble
        self.write_watch = WriteWatch()
        #: a batch was abandoned: every later one is too, so no commit can pass it
        self.abandoning = False

    # -- stopping ----------------------------------------------------------------------------
    def stopping(self) -> bool:
        return bool(self.app.should_stop)

    async def stop_aware(self, aw: Awaitable[Any], *, drain_s: float = WRITE_DRAIN_S) -> Any:
        """Await `aw`; once the worker is stopping, for at most `drain_s` more seconds, then
        raise `Abandoned` (its writes are left to the producer; the batch is read again)."""
        task = asyncio.ensure_future(aw)
        while True:
            if self.stopping():
                done, _ = await asyncio.wait({task}, timeout=drain_s)
                if not done:
                    task.cancel()
                    raise Abandoned
                return task.result()
            done, _ = await asyncio.wait({task}, timeout=0.5)
            if done:
                return task.result()

    async def pause_sleep(self, seconds: float) -> None:
        """Sleep for a retry's backoff; raise `Abandoned` as soon as the worker stops."""
        deadline = time.monotonic() + seconds
        while True:
            if self.stopping():
                raise Abandoned
            left = deadline - time.monotonic()
            if left <= 0:
                return
            await asyncio.sleep(min(left, 0.1))

    async def retrying(self, call: Callable[[], Awaitable[Any]], what: str, *,
                       watch: WriteWatch | None = None) -> Any:
        """`call()` until it succeeds: blocking beats acknowledging blindly. Stop-aware: once the
        worker stops, the attempt in flight gets at most `WRITE_DRAIN_S` and no retry follows -
        `Abandoned` is raised (the caller leaves its batch unacknowledged, read again on restart)
        after a line naming what was abandoned. Before, a broker gone at SIGTERM kept this loop,
        and the worker, alive until it was killed.

        `watch`: a write's attempts are reported there, so `/readyz` says "writes failing: ..."
        while this retries - a retry loop the readiness probe cannot see is a silent stall (the
        outputs' writes were watched, the dedup changelog flush was not)."""
        attempt = 1
        while True:
            try:
                token = watch.begin() if watch is not None else None
                try:
                    result = await self.stop_aware(call(), drain_s=WRITE_DRAIN_S)
                except Abandoned:
                    if watch is not None:
                        watch.discard(token)
                    raise
                except Exception as exc:  # broker unreachable: block rather than acknowledge blindly
                    if watch is not None:
                        watch.end(token, exc)
                    attempt += 1
                    log.warning("%s failed (attempt %d: %r); retrying", what, attempt - 1, exc)
                    await self.pause_sleep(backoff(attempt, self.topology.dlq.backoff_initial_ms,
                                                   self.topology.dlq.backoff_max_ms))
                else:
                    if watch is not None:
                        watch.end(token, None)
                    return result
            except Abandoned:
                log.warning("shutdown: abandoned %s after %d attempt(s): the worker is stopping and the broker did not "
                            "answer; the batch is not acknowledged and is read again on restart", what, attempt,
                            extra={"event": "shutdown_abandoned"})
                raise

    def abandon(self, batch: list[Any], dedup: Dedup | None, token: int | None) -> None:
        """Leave a batch unacknowledged at shutdown: it is read again on restart (at-least-once).
        Untracked so Faust's stop does not wait for it; every later batch is abandoned too, so
        no commit can pass it (Faust commits past a single unacknowledged offset)."""
        self.abandoning = True
        self.stats.abandoned_batches += 1
        unacked = self.app.consumer._unacked_messages
        for m in batch:
            unacked.discard(m)
        if dedup is not None:
            dedup.end_batch(token)
        log.warning("shutdown: abandoned a batch of %d message(s) whose writes had not finished; they are not "
                    "acknowledged and are read again on restart", len(batch))
        if self.observe is not None:
            self.observe.batch_abandoned()

    # -- blocked -----------------------------------------------------------------------------
    async def set_blocked(self, reason: str | None) -> None:
        """Stop fetching and report not ready while the DLQ cannot be written (`reason`), or
        fetch again (None). Never silent: an ERROR line when it starts, a WARNING when it ends."""
        if (reason is None) == (self.blocked is None):
            self.blocked = reason if reason is not None else None
            return
        self.blocked = reason
        if reason is not None:
            log.error("the worker cannot write its DLQ: %s. It stops fetching and reports not ready (/readyz) "
                      "until the write succeeds; it keeps retrying. Fix the DLQ topic (size limit, ACL, "
                      "existence) or the broker", reason)
        else:
            log.warning("the DLQ is writable again; the worker fetches again")
        if self.observe is not None:
            self.observe.set_blocked(reason)
        paused_by_operator = self.observe is not None and self.topology.name in self.observe.paused
        if reason is None and paused_by_operator:
            return
        try:
            await self.set_fetching(paused=reason is not None)
        except Exception as exc:  # the consumer is stopping or not started: nothing to pause
            log.warning("could not %s fetching: %r", "pause" if reason else "resume", exc)

    async def set_fetching(self, *, paused: bool) -> None:
        """aiokafka's own pause/resume of the source partitions (batch_source.set_source_fetching)."""
        from app.worker.batch_source import set_source_fetching

        await set_source_fetching(self.app.consumer, {s.topic for s in self.topology.sources}, paused=paused)

    # -- problem reports ---------------------------------------------------------------------
    def kafka_problem(self) -> str | None:
        """Why writes do not go through right now (None: they do), with the cause the producer's
        metadata names - a partition without a leader, a leader it cannot reach
        (app/worker/kafka_health.py)."""

        def explain() -> list[str]:
            producer = getattr(self.app.producer, "_producer", None)
            if producer is None:
                return []
            client = producer.client
            # the partitions with undelivered batches: the ones a stalled write waits for
            queued = getattr(getattr(producer, "_message_accumulator", None), "_batches", None) or {}
            parts = [(tp.topic, tp.partition) for tp, batches in list(queued.items()) if batches]
            return leader_problems(client, parts or [
                (t, p) for t in self.write_topics for p in (client.cluster.partitions_for_topic(t) or ())])

        return self.write_watch.problem(explain)

    def source_problems(self) -> list[str]:
        """Assigned source partitions whose leader the consumer has no metadata for or cannot reach."""
        try:
            client = self.app.consumer._thread._consumer._client
            assigned = [(tp.topic, tp.partition) for tp in self.app.consumer.assignment()]
        except Exception:  # not started yet
            return []
        sources = {s.topic for s in self.topology.sources}
        return leader_problems(client, [(t, p) for t, p in assigned if t in sources])


__all__ = ["WRITE_DRAIN_S", "Abandoned", "RunStats", "WorkerState", "backoff"]

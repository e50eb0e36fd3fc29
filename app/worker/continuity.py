"""Offset continuity: the agent notices a source record the consumer never handed it, and
fetches it itself before anything after it is acknowledged.

Why this exists (measured, issue 3 crash test): right after start-up, while table recovery
hands the partitions back to the stream, Faust 0.15.3 can drop one record that aiokafka has
already returned (``Consumer.getmany`` skips records of partitions that are not active yet,
and breaks out when the flow stops; the fetch position has moved past them either way). It
relies on the seek to the committed offset that follows to fetch them again - but a partition
with *no* committed offset is not sought at all, so the record is simply gone. Faust's commit
guard then lets the commit pass over it: ``_new_offset`` refuses to commit across a hole only
when it is wider than one offset (``min(acked) - committed > 1``). The worker log showed it:
offsets 0..55 delivered, 57 next, commit 56, then commit 3894 - offset 56 never processed and
committed past. About one run in twenty lost exactly one message that way.

What this module does: :class:`OffsetTracker` remembers, per source partition, the next offset
the agent expects. A record that arrives *after* a hole (offset > expected) makes the agent
fetch the missing range from the broker (:class:`HoleFetcher`, a group-less aiokafka consumer
with its own connection) and process those records first, in order, before the batch is
acknowledged. A hole without records (compacted away, transaction markers) is accepted as
such. A record *before* the expected offset is a redelivery after a seek (at-least-once; dedup
handles it) and just moves the expectation back. Rebalances reset the partitions concerned.

The first record after an assignment is checked too: against the committed offset, or - with
no commit and ``auto_offset_reset=earliest`` - against the start of the log.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["Hole", "HoleFetcher", "OffsetTracker"]

log = logging.getLogger("prism.worker.continuity")

TP = tuple[str, int]


@dataclass(frozen=True, slots=True)
class Hole:
    """Offsets ``start`` (inclusive) to ``end`` (exclusive) of ``topic``/``partition`` were
    never handed to the agent."""

    topic: str
    partition: int
    start: int
    end: int

    def __str__(self) -> str:
        last = self.end - 1
        span = str(self.start) if last == self.start else f"{self.start}..{last}"
        return f"{self.topic}[{self.partition}] offset {span}"


class OffsetTracker:
    """Next expected offset per partition. Pure bookkeeping: no I/O, testable alone."""

    def __init__(self) -> None:
        self._next: dict[TP, int] = {}

    def known(self, topic: str, partition: int) -> bool:
        return (topic, partition) in self._next

    def start_at(self, topic: str, partition: int, offset: int) -> None:
        """Set where a partition's first record is expected (the committed / start offset)."""
        self._next[(topic, partition)] = offset

    def advance(self, topic: str, partition: int, offset: int) -> bool:
        """The hot path: True (and expect the next offset) when `offset` is exactly the one
        expected; False when the caller must look closer (:meth:`observe`): unknown partition,
        hole, or redelivery."""
        key = (topic, partition)
        if self._next.get(key) == offset:
            self._next[key] = offset + 1
            return True
        return False

    def observe(self, topic: str, partition: int, offset: int) -> Hole | None:
        """Record that `offset` is being processed; return the hole before it, if any."""
        key = (topic, partition)
        expected = self._next.get(key)
        self._next[key] = offset + 1
        if expected is not None and offset > expected:
            return Hole(topic, partition, expected, offset)
        return None

    def forget(self, partitions: Iterable[Any]) -> None:
        """Drop partitions (revoked or newly assigned): their next record starts afresh."""
        for tp in partitions:
            self._next.pop((tp[0], tp[1]), None)

    def __len__(self) -> int:
        return len(self._next)


class HoleFetcher:
    """Reads offset ranges and start positions with its own group-less consumer.

    Its own connection on purpose: requests on the worker consumer's connection would queue
    behind its long-poll fetches, and it must not disturb that consumer's positions.
    """

    def __init__(self, bootstrap: str, *, group_id: str, auto_offset_reset: str = "earliest",
                 consumer_kwargs: Mapping[str, Any] | None = None, timeout_s: float = 30.0) -> None:
        self.bootstrap = bootstrap
        self.group_id = group_id
        self.auto_offset_reset = auto_offset_reset
        self.consumer_kwargs = dict(consumer_kwargs or {})
        self.timeout_s = timeout_s
        self._consumer: Any = None
        self._lock = asyncio.Lock()

    async def _ensure(self) -> Any:
        if self._consumer is None:
            from aiokafka import AIOKafkaConsumer

            # group_id only so that committed() can ask for the worker group's offsets; this
            # consumer never subscribes, so it never joins the group.
            c = AIOKafkaConsumer(bootstrap_servers=self.bootstrap, group_id=self.group_id,
                                 enable_auto_commit=False, auto_offset_reset="earliest",
                                 client_id=f"{self.group_id}-continuity", **self.consumer_kwargs)
            await c.start()
            self._consumer = c
        return self._consumer

    async def expected_start(self, topic: str, partition: int) -> int | None:
        """Where the first record of a freshly assigned partition should be: the committed
        offset, else the log start when the reset policy is `earliest`, else unknown.

        Bounded by `timeout_s` like :meth:`fetch`: aiokafka retries an offset fetch (and the
        coordinator lookup before it) for as long as the broker answers with a retriable
        error, and an unbounded wait here holds the partition's first batch - and so the
        whole worker - without a word. On timeout the client is dropped, so the caller's retry
        starts from a fresh connection and coordinator lookup."""
        from aiokafka import TopicPartition

        async with self._lock, self._bounded(f"the start offset of {topic}[{partition}]"):
            c = await self._ensure()
            tp = TopicPartition(topic, partition)
            committed = await c.committed(tp)
            if committed is not None and committed >= 0:
                return int(committed)
            if self.auto_offset_reset != "earliest":
                return None
            return int((await c.beginning_offsets([tp]))[tp])

    @contextlib.asynccontextmanager
    async def _bounded(self, what: str) -> AsyncIterator[None]:
        try:
            async with asyncio.timeout(self.timeout_s):
                yield
        except TimeoutError:
            await self._drop()
            raise TimeoutError(f"could not read {what} from the broker within {self.timeout_s:g}s") from None

    async def _drop(self) -> None:
        c, self._consumer = self._consumer, None
        if c is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(c.stop(), 5)

    async def fetch(self, hole: Hole) -> list[Any]:
        """Every record in the hole, in offset order (none for a legitimately empty range).

        Raises `TimeoutError` when the broker does not return the range in time: the caller
        must not acknowledge past the hole then.
        """
        from aiokafka import TopicPartition

        async with self._lock, self._bounded(str(hole)):
            c = await self._ensure()
            tp = TopicPartition(hole.topic, hole.partition)
            c.assign([tp])
            c.seek(tp, hole.start)
            out: list[Any] = []
            while await c.position(tp) < hole.end:
                batch = await c.getmany(tp, timeout_ms=200, max_records=max(1, hole.end - hole.start))
                out.extend(r for r in batch.get(tp, ()) if hole.start <= r.offset < hole.end)
            c.unsubscribe()
            return out

    async def stop(self) -> None:
        c, self._consumer = self._consumer, None
        if c is not None:
            await c.stop()

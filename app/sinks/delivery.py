"""Delivering one batch to a sink: retries, the outage policy, and the DLQ.

The runner's agent awaits `Delivery.deliver(batch)` before it takes the next batch, and
Faust acknowledges a batch's offsets only after that (`stream.take_events`). So:

* **at-least-once**: an offset is committed only once its record is in the backend or in
  the DLQ; a crash before that replays the record, and the sink's idempotent write turns
  the replay into a no-op;
* **backpressure**: one batch in flight per sink; while it waits, the stream buffer
  (`stream_buffer_maxsize`) fills and Faust stops fetching. Memory stays bounded and the
  consumer simply stops advancing;
* **outage policy** (`on_outage`):
  - `wait`: retry with capped, jittered exponential backoff until the backend is back.
    Nothing is lost and nothing is skipped; order per partition is kept;
  - `dlq`: after `max_attempts` failed attempts the batch goes to `<source>.dlq` with the
    `prism.errors.*` headers of `app.agents.dlq` (stage `sink:<name>`), so the stream keeps
    flowing and `prism dlq replay` can bring the records back later.
* **poison records** (the backend can never hold them: `encode` raised, or the encoded item is
  over the backend's size limit, `Sink.size_problem`) go to the DLQ at once under either
  policy: waiting would stall the sink forever on one record. The size check runs again after
  a failed write, so a limit the backend lowered meanwhile (a NATS server restarted with a
  smaller `max_payload`) dead-letters the records over it instead of retrying them.

Shutdown and rebalance: a batch that is still waiting for its backend when the worker stops
(or its partitions are revoked) is abandoned *unacknowledged* (`DeliveryResult.aborted`),
so its offsets are not committed and the records are delivered again later. Without this,
Faust's stop would wait for the batch forever.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from app.agents.base import Message
from app.agents.dlq import DlqRecord, build_dlq_record
from app.errors import PrismError, SinkError
from app.sinks.base import Sink, SinkRecord

log = logging.getLogger("prism.sinks")

#: Sends DLQ records; must raise when they were not all written.
DlqWriter = Callable[[Sequence[DlqRecord]], Awaitable[None]]
#: True when the worker is stopping or rebalancing: waiting batches must give up (unacked).
AbortCheck = Callable[[], bool]

_ABORT_POLL_S = 0.1


@dataclass(frozen=True, slots=True)
class OutagePolicy:
    on_outage: Literal["wait", "dlq"] = "wait"
    max_attempts: int = 5
    backoff_initial_s: float = 0.1
    backoff_max_s: float = 5.0

    @classmethod
    def from_spec(cls, spec: Any) -> OutagePolicy:
        return cls(spec.on_outage, spec.max_attempts, spec.backoff_initial_ms / 1000, spec.backoff_max_ms / 1000)

    def backoff(self, failed_attempts: int) -> float:
        """Capped exponential backoff with "equal jitter" (AWS architecture blog): uniform in
        [c/2, c] for c = min(cap, base * 2^(n-1)). The jitter keeps a fleet of sinks from
        hammering a backend that just came back in lockstep; the lower half-bound keeps a
        waiting sink from spinning."""
        ceiling = min(self.backoff_max_s, self.backoff_initial_s * 2 ** max(failed_attempts - 1, 0))
        return random.uniform(ceiling / 2, ceiling)


@dataclass(frozen=True, slots=True)
class DeliveryResult:
    written: int = 0      # records the sink accepted (new or already present)
    dlq: int = 0          # records sent to the DLQ
    aborted: bool = False  # gave up unacknowledged (shutdown/rebalance): redeliver


def dlq_topic_of(input_topic: str, suffix: str = ".dlq") -> str:
    """`orders.created.v3` -> `orders.created.dlq`: a sink's DLQ is its source's DLQ, where
    `prism dlq` already looks."""
    for layout_suffix in (".v2", ".v3"):
        if input_topic.endswith(layout_suffix):
            return input_topic[: -len(layout_suffix)] + suffix
    return input_topic + suffix


def message_of(record: SinkRecord | Message) -> Message:
    """The `app.agents.base.Message` the DLQ builder takes, from a sink record."""
    if isinstance(record, Message):
        return record
    return Message(topic=record.topic, partition=record.partition, offset=record.offset, value=record.raw,
                   key=record.key, headers=list(record.headers), timestamp_ms=record.timestamp_ms)


class Delivery:
    """Delivers batches to one sink under one outage policy (module docs)."""

    def __init__(self, sink: Sink[Any], policy: OutagePolicy, *, dlq: DlqWriter | None,
                 dlq_topic_for: Callable[[str], str] = dlq_topic_of,
                 should_abort: AbortCheck = lambda: False) -> None:
        if policy.on_outage == "dlq" and dlq is None:
            raise SinkError(f"sink {sink.name!r} has on_outage: dlq but no DLQ writer", path=f"sinks.{sink.name}",
                            hint="run the sink inside a Faust app (register_sinks) or pass dlq=")
        self.sink = sink
        self.policy = policy
        self.dlq = dlq
        self.dlq_topic_for = dlq_topic_for
        self.should_abort = should_abort
        self._stage = f"sink:{sink.name}"
        self._stage_class = f"{type(sink).__module__}.{type(sink).__qualname__}"

    async def deliver(self, records: Sequence[SinkRecord]) -> DeliveryResult:
        """Return once every record is in the backend or in the DLQ (or, aborted, in neither)."""
        stats = self.sink.stats
        stats.received += len(records)
        good: list[SinkRecord] = []
        items: list[Any] = []
        poison: list[tuple[Message, BaseException]] = []
        await self.sink.refresh_limits()
        for r in records:
            try:
                item = self.sink.encode(r)
            except PrismError as exc:
                poison.append((message_of(r), exc))
                continue
            too_large = self.sink.size_problem(item)
            if too_large is not None:
                poison.append((message_of(r), too_large))
            else:
                items.append(item)
                good.append(r)
        if poison:
            stats.rejected += len(poison)
            log.warning("sink %s: %d record(s) the backend can never hold go to the DLQ (first: %s)",
                        self.sink.name, len(poison), poison[0][1])
            if not await self.dead_letter(poison):
                return DeliveryResult(aborted=True)
        if not items:
            return DeliveryResult(dlq=len(poison))

        failed = 0
        while True:
            try:
                await self.sink.write_encoded(items)
            except Exception as exc:
                good, items, over = self._split_oversized(good, items)
                if over:  # the backend's limit is lower than when the batch was encoded
                    stats.rejected += len(over)
                    log.warning("sink %s: %d record(s) are over the backend's size limit and go to the DLQ (first: "
                                "%s)", self.sink.name, len(over), over[0][1])
                    if not await self.dead_letter(over):
                        return DeliveryResult(aborted=True)
                    poison += over
                    if not items:
                        return DeliveryResult(dlq=len(poison))
                    continue
                failed += 1
                stats.failed_attempts += 1
                stats.last_error = str(exc)[:500]
                if not stats.in_outage:
                    stats.in_outage = True
                    stats.outages += 1
                    log.warning("sink %s: backend unavailable, %s (%s): %s", self.sink.name,
                                "waiting for it" if self.policy.on_outage == "wait" else
                                f"DLQ after {self.policy.max_attempts} attempts", len(items), exc)
                if self.policy.on_outage == "dlq" and failed >= self.policy.max_attempts:
                    err = exc if isinstance(exc, PrismError) else self.sink.error("write failed", exc)
                    msgs = [(_with_attempts(message_of(r), failed), err) for r in good]
                    if not await self.dead_letter(msgs):
                        return DeliveryResult(aborted=True)
                    return DeliveryResult(dlq=len(poison) + len(good))
                if not await self._sleep(self.policy.backoff(failed)):
                    stats.aborted += 1
                    return DeliveryResult(aborted=True)
                continue
            if stats.in_outage:
                stats.in_outage = False
                log.warning("sink %s: backend is back after %d failed attempt(s)", self.sink.name, failed)
            return DeliveryResult(written=len(items), dlq=len(poison))

    def _split_oversized(self, good: list[SinkRecord], items: list[Any],
                         ) -> tuple[list[SinkRecord], list[Any], list[tuple[Message, BaseException]]]:
        """(records, items) still within the backend's limit, and the DLQ entries of those over it."""
        keep_r: list[SinkRecord] = []
        keep_i: list[Any] = []
        over: list[tuple[Message, BaseException]] = []
        for r, item in zip(good, items, strict=True):
            problem = self.sink.size_problem(item)
            if problem is None:
                keep_r.append(r)
                keep_i.append(item)
            else:
                over.append((message_of(r), problem))
        return keep_r, keep_i, over

    async def dead_letter(self, items: Sequence[tuple[Message, BaseException]]) -> bool:
        """Send `items` to their DLQ topics, retrying until it works. False: aborted."""
        if not items:
            return True
        if self.dlq is None:
            raise SinkError(f"sink {self.sink.name!r} must dead-letter {len(items)} record(s) but has no DLQ writer",
                            path=f"sinks.{self.sink.name}", hint="pass dlq= to Delivery")
        recs = [build_dlq_record(m, stage=self._stage, stage_class=self._stage_class, error=e,
                                 dlq_topic=self.dlq_topic_for(m.topic)) for m, e in items]
        failed = 0
        while True:
            try:
                await self.dlq(recs)
            except Exception as exc:  # the DLQ is Kafka: it comes back too; never drop
                failed += 1
                log.warning("sink %s: writing %d DLQ record(s) failed (attempt %d): %s", self.sink.name,
                            len(recs), failed, exc)
                if not await self._sleep(self.policy.backoff(failed)):
                    self.sink.stats.aborted += 1
                    return False
                continue
            self.sink.stats.dlq += len(recs)
            return True

    async def _sleep(self, seconds: float) -> bool:
        """Sleep, waking early to give up when the worker stops. False: abort."""
        deadline = time.monotonic() + seconds
        while True:
            if self.should_abort():
                return False
            left = deadline - time.monotonic()
            if left <= 0:
                return True
            await asyncio.sleep(min(left, _ABORT_POLL_S))


def _with_attempts(msg: Message, attempts: int) -> Message:
    msg.attempts = attempts
    return msg

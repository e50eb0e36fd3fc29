"""The hot path: one fetched batch through the stage chain, handed to the delivery.

`BatchSource` (app/worker/batch_source.py) calls `BatchRunner.start` with up to `batch_size`
Faust messages of one source topic. For each message, in order:

1. its table writes are routed to its partition (`CurrentMessage` stands in for Faust's
   current event, which a batch does not have);
2. records the consumer skipped before it are fetched and run first (offset continuity,
   app/worker/continuity.py);
3. an input over the input limit goes to the DLQ as `too_large` without running the chain;
   otherwise the chain runs and, for an emitted message, the publisher prepares its outputs.

Then the batch's outputs are signed at once (`Publisher.finish`, scope batch: one signature),
fitted to the topics' size limits (app/worker/size_fit.py) and handed, as one `Batch`, to the
`Delivery` (app/worker/delivery.py: at_least_once or exactly_once), whose coroutine writes and
acknowledges it while the next batch runs through the chain. The delivery ends a batch
through `count` (outcome counters, the observer) and `account` (`RunStats.read`, `on_batch`).

**Counting held for `count_every_s`** (at_least_once: `PipelineApp` sets 0.1 s; exactly_once and
the default: 0, every batch at once). Each batch's counter-table writes (one changelog record per
topic, partition and outcome), the observer's metric updates and `RunStats.read` are a fixed cost
per batch; with adaptive batches a light stream's batches are a fetch of 10-20 messages, so that
cost was paid per ~15 messages instead of per 500 (BENCHMARKS.md, issue 29, "Added latency").
With `count_every_s` > 0 a written, acknowledged batch is held and counted together with the
others of the same interval (`flush_counts`): the same sums, one table write per key and one
metric pass per interval. What keeps the counts exact:

* `flush_counts` runs at the top of every Faust offset commit (`hold_counts_until_commit`
  wraps `Consumer.commit`; the periodic one, `commit_every`, a rebalance's and the last one at
  shutdown), before the commit picks its offsets and before it flushes the producer: no commit
  covers a message whose counts are not handed to the producer with it, as before;
* the counters are written before `RunStats.read` grows, in the same step, so a reader that sees
  `read == n` still sees all n counted;
* a kill -9 can lose the held counts of at most the last interval - only of messages whose
  offsets were not committed either (the commit counts first). They are read again on restart,
  and as their outputs and dedup ids were written they count as `duplicate` instead of
  `emitted`: at-least-once statistics, as before, when the same could happen to the counter
  records the producer had not sent yet (a window of milliseconds, now up to `count_every_s`).
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any

from faust.streams import _current_event  # per-message table routing: see the module docstring

from app.agents.base import Message
from app.agents.chain import Outcome
from app.agents.identity import stated_publisher
from app.agents.publish import Prepared
from app.errors import SizeLimitError
from app.worker.batch_source import CurrentMessage
from app.worker.delivery import Batch, Delivery
from app.worker.worker_state import Abandoned

if TYPE_CHECKING:
    import faust

    from app.agents.chain import Chain
    from app.agents.dedup import Dedup
    from app.agents.dlq import DlqRecord
    from app.agents.publish import Emission, Publisher
    from app.tables.counters import FaustTopicCounters
    from app.tables.sequence import FaustSequenceTracker
    from app.worker.continuity import HoleFetcher, OffsetTracker
    from app.worker.interfaces import BatchObserver, RunStats
    from app.worker.size_fit import SizeFitter
    from app.worker.worker_state import WorkerState

log = logging.getLogger("prism.worker")
LNMP_SEQUENCE_EXT = "lnmp.sequence"
#: the outcomes `run_one` tests on every message, as module names (an EnumType attribute lookup
#: costs ~40 ns more on Python 3.11; as in app/agents/chain.py)
_EMITTED, _DLQ = Outcome.EMITTED, Outcome.DLQ
#: messages run through the chain between two turns of the event loop
YIELD_EVERY = 100


class BatchRunner:
    """Runs fetched batches through their chain and hands them to `delivery`.

    `dedups`: each chain's dedup stage by `id(chain)` (filled as the chains are built);
    `on_batch`: called with the run's stats after every batch (demo, tests)."""

    def __init__(self, app: faust.App, *, publisher: Publisher, delivery: Delivery, state: WorkerState,
                 fitter: SizeFitter, offsets: OffsetTracker, hole_fetcher: HoleFetcher,
                 counters: FaustTopicCounters, sequences: FaustSequenceTracker, dedups: dict[int, Dedup],
                 observe: BatchObserver | None = None,
                 on_batch: Callable[[RunStats], None] | None = None, count_every_s: float = 0.0) -> None:
        self.app = app
        self.publisher = publisher
        self.delivery = delivery
        self.state = state
        self.stats = state.stats
        self.fitter = fitter
        self.offsets = offsets
        self.hole_fetcher = hole_fetcher
        self.counters = counters
        self.sequences = sequences
        self.dedups = dedups
        self.observe = observe
        self.on_batch = on_batch
        #: > 0: batches are counted together, at most this long after they were acknowledged
        #: (the module docstring); 0: each batch when it ends
        self.count_every_s = count_every_s
        self._held: list[Batch] = []  # written and acknowledged, not counted yet (count_every_s > 0)
        self._flush_at: asyncio.TimerHandle | None = None

    async def process(self, chain: Chain, batch: list[Any]) -> None:
        """Run one batch start to finish (no overlap with another batch)."""
        await (await self.start(chain, batch, None))

    async def start(self, chain: Chain, batch: list[Any], previous: Awaitable[None] | None,
                    ) -> Coroutine[Any, Any, None]:
        """Run one fetched batch (Faust `Message`s of one source topic) through the chain and
        return the coroutine that finishes it (the delivery's): writes every output, then -
        after `previous`, the batch before it, has finished - records the dedup ids, counts and
        acknowledges each message. `BatchSource` runs that coroutine as a task while the next
        batch goes through the chain, so the broker's round trip no longer leaves the worker idle."""
        prepared: list[tuple[Message, Prepared | DlqRecord]] = []
        outcomes: Counter[tuple[str, int, str]] = Counter()
        stand_in_of: dict[tuple[str, int], CurrentMessage] = {}
        obs = self.observe
        observed: list[tuple[Message, Any]] | None = None if obs is None else []
        if obs is not None:
            obs.batch_started()
        dedup = self.dedups.get(id(chain))
        token = dedup.begin_batch() if dedup is not None else None
        offsets, repaired = self.offsets, list[Message]()
        active: CurrentMessage | None = None
        for i, m in enumerate(batch):
            if i and not i % YIELD_EVERY:
                # Let the loop breathe within a long batch: the previous batch's produce
                # requests go out, heartbeats and fetches run.
                await asyncio.sleep(0)
            # Faust's (non-windowed) tables route a write by the current event's topic and
            # partition only: one stand-in per partition of the batch, set when it changes.
            current = stand_in_of.get((m.topic, m.partition))
            if current is None:
                current = stand_in_of[(m.topic, m.partition)] = CurrentMessage(m)
            if current is not active:
                _current_event.set(weakref.ref(current))
                active = current
            if not offsets.advance(m.topic, m.partition, m.offset):
                # Records the consumer skipped come first, in order, routed like this one.
                try:
                    missing = await self.missing_before(m.topic, m.partition, m.offset)
                except Abandoned:  # stopping while the broker does not answer: read again on restart
                    _current_event.set(None)
                    self.state.abandon(batch, dedup, token)
                    return _nothing()
                for j, msg in enumerate(missing):
                    if j and not j % YIELD_EVERY:
                        await asyncio.sleep(0)  # a hole can hold thousands of records
                    repaired.append(msg)
                    outcomes[(msg.topic, msg.partition, self.run_one(chain, msg, prepared, observed))] += 1
            msg = Message(topic=m.topic, partition=m.partition, offset=m.offset, value=m.value or b"", key=m.key,
                          headers=[(k, v) for k, v in (m.headers or []) if v is not None],
                          timestamp_ms=int(m.timestamp * 1000) if m.timestamp else None)
            outcomes[(m.topic, m.partition, self.run_one(chain, msg, prepared, observed))] += 1
        _current_event.set(None)
        # Phase 2: the batch's outputs signed at once (scope batch: one signature), in order.
        pending = self.sign_prepared(chain, prepared, outcomes, observed)
        if not self.fitter.limits_read.is_set():
            await self.fitter.limits_read.wait()  # the first batch only: the topics' limits are being read
        self.fitter.fit(chain, pending, outcomes, observed)
        return self.delivery.deliver(Batch(chain, batch, repaired, pending, outcomes, stand_in_of, observed, dedup,
                                           token), previous, self)

    def run_one(self, chain: Chain, msg: Message, pending: list[tuple[Message, Prepared | DlqRecord]],
                observed: list[tuple[Message, Any]] | None) -> str:
        """Run the chain (and prepare the outputs: everything but the batch's signature) for
        one message; returns its outcome. A message whose encoding fails goes to the DLQ here,
        alone, as before; one larger than the input limit, without running the chain."""
        size = len(msg.value) + len(msg.key or b"")
        if msg.headers:
            size += sum(len(k) + len(v) for k, v in msg.headers)
        limit = self.fitter.input_limit_for(msg.topic)
        if size > limit:
            self.stats.too_large += 1
            result = chain.dlq_for_publish_failure(msg, SizeLimitError(
                f"message is {size} bytes (key, value and headers), over the {limit}-byte input limit: its "
                f"outputs could not be written (limits: {self.fitter.limits.output_limit} bytes per output record)",
                hint="have the producer split the message, or raise max.message.bytes of the output topics "
                     "and the worker's producer_max_request_size"), stage="normalize")
        else:
            result = chain.run(msg)
        if result.outcome is _EMITTED:
            try:
                t0 = time.perf_counter_ns()
                prepared = self.publisher.prepare(msg)
                ns = time.perf_counter_ns() - t0
                chain.stats.stage_ns["publish"] += ns
                chain.stats.stage_calls["publish"] += 1
                if chain.latency_samples is not None:  # this message's own share (app/agents/chain.py)
                    chain.latency_samples.stages.append(("publish", ns))
                pending.append((msg, prepared))
            except Exception as exc:  # encoding/signing failed: DLQ, never crash
                result = chain.dlq_for_publish_failure(msg, exc)
            else:
                self.track_sequence(msg)
        if result.outcome is _DLQ:
            assert result.dlq is not None
            pending.append((msg, result.dlq))
        if observed is not None:
            observed.append((msg, result))
        return str(result.outcome)

    def sign_prepared(self, chain: Chain, prepared: list[tuple[Message, Prepared | DlqRecord]],
                      outcomes: Counter[tuple[str, int, str]], observed: list[tuple[Message, Any]] | None,
                      ) -> list[tuple[Message, list[Emission] | DlqRecord]]:
        """The batch's prepared outputs made final by `Publisher.finish` (one signature for
        the batch with scope batch), each item in its place, so the output order is the input
        order. Timed as "publish" (its per-message share: `prepare` counted the calls).

        `finish` can only fail for the whole batch (the worker key itself), never for one
        message: then every message it was to sign goes to the DLQ, as a failed encoding would."""
        items = [item for _, item in prepared if isinstance(item, Prepared)]
        t0 = time.perf_counter_ns()
        try:
            done = iter(self.publisher.finish(items))
            failure: Exception | None = None
        except Exception as exc:  # signing failed: DLQ, never crash
            done, failure = iter(()), exc
        chain.stats.stage_ns["publish"] += time.perf_counter_ns() - t0
        out: list[tuple[Message, list[Emission] | DlqRecord]] = []
        for msg, item in prepared:
            if not isinstance(item, Prepared):
                out.append((msg, item))
            elif failure is None:
                out.append((msg, next(done)))
            else:
                result = chain.dlq_for_publish_failure(msg, failure)
                assert result.dlq is not None
                out.append((msg, result.dlq))
                outcomes[(msg.topic, msg.partition, str(Outcome.EMITTED))] -= 1
                outcomes[(msg.topic, msg.partition, str(Outcome.DLQ))] += 1
                if observed is not None:
                    observed[:] = [(m, result if m is msg else r) for m, r in observed]
        return out

    async def missing_before(self, topic: str, partition: int, offset: int) -> list[Message]:
        """The source records between the last one processed on this partition and `offset`
        that the consumer never handed over (usually none). Retries until the broker answers:
        acknowledging past an unread record could lose it."""
        tracker = self.offsets
        if not tracker.known(topic, partition):
            start = await self.state.retrying(lambda: self.hole_fetcher.expected_start(topic, partition),
                                              f"reading the start offset of {topic}[{partition}]")
            if start is not None:
                tracker.start_at(topic, partition, start)
        hole = tracker.observe(topic, partition, offset)
        if hole is None:
            return []
        records = await self.state.retrying(lambda: self.hole_fetcher.fetch(hole), f"reading {hole}")
        if records:
            self.stats.holes_repaired += len(records)
            log.warning("the consumer skipped %d record(s) at %s; fetched and processed them before acknowledging "
                        "anything after them", len(records), hole)
        return [message_from_record(r) for r in records]

    def track_sequence(self, msg: Message) -> None:
        raw = msg.env.extensions.get(LNMP_SEQUENCE_EXT)
        if raw is None or len(raw) != 8:
            return
        source = stated_publisher(msg.env) or msg.env.namespace  # an LNMP source is a claim, still its sequence
        verdict = self.sequences.observe(source, int.from_bytes(raw, "big"))
        self.stats.sequence[str(verdict.status)] += 1

    # -- BatchEnd (app/worker/delivery.py): the delivery ends each written batch with these -----
    def count(self, batch: Batch) -> None:
        """The batch's outcome counters and metrics, before it is acknowledged - or, with
        `count_every_s`, held until `flush_counts` (after the acknowledgement, see `account`)."""
        if self.count_every_s <= 0:
            self._count([batch])

    def account(self, batch: Batch) -> None:
        if self.count_every_s <= 0:
            self.stats.read += batch.size
            if self.on_batch is not None:
                self.on_batch(self.stats)
            return
        # Held: counted with the interval's other batches. The batch is no longer in flight for
        # the observer (pause and shutdown wait for that), only its counting is late.
        if self.observe is not None:
            self.observe.batch_finished()
        self._held.append(batch)
        if self._flush_at is None:
            self._flush_at = asyncio.get_running_loop().call_later(self.count_every_s, self.flush_counts)

    def flush_counts(self) -> None:
        """Count every held batch now: counters, metrics, then `RunStats.read` and `on_batch`.
        Synchronous, so nothing can acknowledge or commit in between; called by the interval's
        timer and at the top of every offset commit (`hold_counts_until_commit`)."""
        if self._flush_at is not None:
            self._flush_at.cancel()
            self._flush_at = None
        held, self._held = self._held, []
        if not held:
            return
        self._count(held)
        self.stats.read += sum(b.size for b in held)
        if self.on_batch is not None:
            self.on_batch(self.stats)

    def _count(self, batches: list[Batch]) -> None:
        # One counter write per (topic, partition, outcome) per call, not per message: every
        # table write is also a changelog record. Routed by the latest stand-in of the partition.
        if len(batches) == 1:
            outcomes, stand_in_of = batches[0].outcomes, batches[0].stand_in_of
        else:
            outcomes, stand_in_of = Counter(), {}
            for b in batches:
                outcomes.update(b.outcomes)
                stand_in_of.update(b.stand_in_of)
        for (topic, partition, outcome), n in outcomes.items():
            if n:
                _current_event.set(weakref.ref(stand_in_of[(topic, partition)]))
                self.counters.incr(topic, outcome, n, partition=partition)
        _current_event.set(None)
        # Counted only now, when every message of the batch has its outcome written: a
        # reader that sees `read == n` can rely on all n being accounted for.
        obs = self.observe
        if obs is None:
            return
        if self.count_every_s <= 0:
            b = batches[0]
            if b.observed is not None:
                obs.batch_done(b.chain, b.records[0].topic, b.observed)
            return
        # one metric pass per chain and source topic for the whole interval
        groups: dict[tuple[int, str], tuple[Chain, list[tuple[Message, Any]]]] = {}
        for b in batches:
            if b.observed is None:
                continue
            key = (id(b.chain), b.records[0].topic)
            group = groups.get(key)
            if group is None:
                groups[key] = (b.chain, list(b.observed))
            else:
                group[1].extend(b.observed)
        for (_, topic), (chain, observed) in groups.items():
            obs.count_batches(chain, topic, observed)

def message_from_record(r: Any) -> Message:
    """A `Message` from an aiokafka `ConsumerRecord` (the records the continuity check fetched)."""
    return Message(topic=r.topic, partition=r.partition, offset=r.offset, value=r.value or b"", key=r.key,
                   headers=[(k, v) for k, v in (r.headers or ()) if v is not None],
                   timestamp_ms=r.timestamp if r.timestamp and r.timestamp > 0 else None)


def hold_counts_until_commit(consumer: Any, runner: BatchRunner) -> None:
    """Make every offset commit of `consumer` (Faust's) count the runner's held batches first
    (`BatchRunner.flush_counts`, the module docstring). At the top of `Consumer.commit`, before
    it waits for a running commit or picks its offsets: whatever it or the commit it waits for
    covers has its counts handed to the producer, which Faust flushes before committing."""
    original = consumer.commit

    async def commit(*args: Any, **kwargs: Any) -> bool:
        runner.flush_counts()
        return await original(*args, **kwargs)

    consumer.commit = commit


async def _nothing() -> None:
    """The finishing step of a batch abandoned before its writes (`start`)."""


__all__ = ["LNMP_SEQUENCE_EXT", "YIELD_EVERY", "BatchRunner", "hold_counts_until_commit", "message_from_record"]

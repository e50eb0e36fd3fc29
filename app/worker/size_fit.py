"""Size fitting: every record checked against its topic's limit before it is sent.

`SizeFitter` keeps the written topics' `WriteLimits` (app/worker/limits.py) current - read at
start, every `LIMITS_REFRESH_S` and after every size refusal, so a limit changed at run time is
followed both ways and one refusal never lowers a limit for good - and fits a batch to them: a
message with an output that would not fit goes to the DLQ as `too_large`, and every DLQ copy is
cut down to what its topic accepts (`app.agents.dlq.fit_dlq_record`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from aiokafka.record.default_records import DefaultRecordBatchBuilder

from app import native as _native
from app.agents.chain import Outcome
from app.agents.dlq import VALUE_REF, DlqRecord, fit_dlq_record
from app.broker.admin import BrokerSettings, read_max_message_bytes
from app.errors import PrismError, SizeLimitError
from app.worker.interfaces import RunStats
from app.worker.limits import WriteLimits, check_room, record_size

if TYPE_CHECKING:
    import faust

    from app.agents.base import Message
    from app.agents.chain import Chain
    from app.agents.publish import Emission
    from app.worker.dlq_overflow import OverflowStore

log = logging.getLogger("prism.worker")

#: How often the written topics' `max.message.bytes` are read again (and after every size refusal).
LIMITS_REFRESH_S = 60.0

#: `record_size` without its `int()` wrapper (the same aiokafka estimate, already an int)
_size = DefaultRecordBatchBuilder.estimate_size_in_bytes
#: `prism_native.record_tail` when the compiled module is in use (`app.native`), else None:
#: `(size, tail)`, the record's `_size` and its headers as its record batch will hold them
#: (`SizeFitter.fit`).
_tail: Callable[[bytes | None, bytes | None, Any], tuple[int, bytes]] | None = getattr(
    _native.module, "record_tail", None)

#: One message's outputs or its DLQ copy, as a batch carries them to the delivery.
Pending = list[tuple["Message", "list[Emission] | DlqRecord"]]


class SizeFitter:
    """The written topics' size limits, and the fitting of a batch's records to them.

    `source_outputs`: each source topic's output topics (its inputs' size limit follows from
    theirs); `write_topics`: every topic written (outputs and DLQs)."""

    def __init__(self, app: faust.App, limits: WriteLimits, *, write_topics: tuple[str, ...],
                 source_outputs: dict[str, tuple[str, ...]], overflow: OverflowStore | None, stats: RunStats,
                 bootstrap: str, settings: BrokerSettings | None) -> None:
        self.app = app
        self.limits = limits
        self.write_topics = write_topics
        self.source_outputs = source_outputs
        #: where a truncated DLQ copy's whole value is kept (`dlq.overflow`)
        self.overflow = overflow
        self.stats = stats
        self.bootstrap, self.settings = bootstrap, settings
        #: set once the broker answered (or failed to): the first batch's writes wait for it
        self.limits_read = asyncio.Event()
        #: `input_limit_for` per source topic, for the `WriteLimits` object it was computed from
        #: (asked once per message; `limits` is immutable and replaced whenever it changes)
        self._input_limits: tuple[WriteLimits | None, dict[str, int]] = (None, {})

    # -- the limits --------------------------------------------------------------------------
    async def read(self) -> WriteLimits:
        """Read the written topics' `max.message.bytes` and log every limit in one line (a
        WARNING when a topic's limit is unknown and the configured producer limit stands in)."""
        try:
            values, why = await read_max_message_bytes(self.bootstrap, list(self.write_topics),
                                                       settings=self.settings)
            self.limits = self.limits.with_broker(values, why)
        finally:
            self.limits_read.set()
        line = self.limits.describe(self.write_topics)
        try:
            check_room(self.limits, self.source_outputs)
        except PrismError as exc:  # the limits changed since start-up: stop rather than dead-letter everything
            log.error("error [%s] %s", exc.code, exc)
            await self.app.crash(exc)
            raise
        fields = {"event": "write_limits", "max_request_size": self.limits.max_request_size,
                  "input_limit": self.limits.input_limit,
                  "topics": {t: self.limits.limit_for(t) for t in self.write_topics}}
        # WARNING either way: the worker runs at `-l warn` by default, and an operator must see
        # the limits it enforces (issue: "the worker says at start-up what the limits are").
        log.warning("%s", line, extra=fields)
        return self.limits

    async def keep_current(self) -> None:
        """The worker's task: read the limits, then again every `LIMITS_REFRESH_S` (a limit
        learned from a refusal lasts until the broker's next answer)."""
        await self.read()
        while True:
            await asyncio.sleep(LIMITS_REFRESH_S)
            with contextlib.suppress(Exception):
                await self.refresh()

    async def refresh(self) -> WriteLimits:
        """Read the topics' `max.message.bytes` again (every `LIMITS_REFRESH_S`, and after the
        broker refused a write for its size): a limit changed at run time is followed both ways,
        and one refusal never lowers a limit for good. Logged only when a limit changed."""
        values, why = await read_max_message_bytes(self.bootstrap, list(self.write_topics), settings=self.settings)
        before = {t: self.limits.limit_for(t) for t in self.write_topics}
        self.limits = WriteLimits(self.limits.max_request_size, output_topics=self.limits.output_topics,
                                  envelope_limit=self.limits.envelope_limit,
                                  overhead=self.limits.overhead).with_broker(values, why)
        if before != {t: self.limits.limit_for(t) for t in self.write_topics}:
            log.warning("%s (re-read from the broker)", self.limits.describe(self.write_topics),
                        extra={"event": "write_limits"})
        return self.limits

    async def after_refusal(self) -> None:
        """The broker refused a write for its size: its limits may have changed; read them again
        (a failure to read keeps the known ones - the retry splits the batch either way)."""
        try:
            await self.refresh()
        except Exception as exc:
            log.warning("could not re-read the topics' size limits after a size refusal: %r", exc)

    def check_room(self, *, timeout: float = 20.0) -> WriteLimits:
        """Start-up: read the written topics' limits now and refuse to start, with one
        `error [no_room] ... fix:` line, when they leave an input no usable room
        (`app/worker/limits.py`, `check_room`). Run after the topics exist, before the worker."""
        from app.broker.preflight import run_isolated

        values, why = run_isolated(read_max_message_bytes(self.bootstrap, list(self.write_topics),
                                                          settings=self.settings), timeout=timeout)
        limits = self.limits.with_broker(values, why)
        check_room(limits, self.source_outputs)
        return limits

    def input_limit_for(self, topic: str) -> int:
        """The largest input of `topic` whose outputs can still fit their topics."""
        limits = self.limits
        known_for, known = self._input_limits
        if known_for is not limits:  # new limits (read, re-read or lowered): compute again
            known = {}
            self._input_limits = (limits, known)
        limit = known.get(topic)
        if limit is None:
            limit = known[topic] = limits.input_limit_for(self.source_outputs.get(topic, limits.output_topics))
        return limit

    def lower(self, rec: DlqRecord, err: BaseException) -> DlqRecord:
        """A DLQ record the broker refused alone: its limit is below this record, even after a
        re-read (its message.max.bytes, or compression overhead). Fit it under its own size; the
        next re-read of the limits undoes this."""
        size = record_size(rec.key, rec.value, rec.headers)
        self.limits = self.limits.lowered(rec.topic, size - 1)
        log.warning("the broker refused a %d-byte DLQ record for %s (%s); until the limits are read "
                    "again its limit is taken as %d bytes", size, rec.topic, err, self.limits.limit_for(rec.topic))
        return self.fit_dlq(rec)

    # -- fitting -----------------------------------------------------------------------------
    def fit(self, chain: Chain, pending: Pending, outcomes: Counter[tuple[str, int, str]],
            observed: list[tuple[Message, Any]] | None) -> None:
        """Check every record of the batch against its topic's limit before anything is sent
        (`app/worker/limits.py`): a message with an output that would not fit goes to the DLQ as
        `too_large` instead, and every DLQ copy is cut down to what its topic accepts. In place.

        Every output record is measured exactly (`record_size`, aiokafka's compiled estimate):
        that is cheaper than the rough Python sum over the headers it replaced (~0.3 against
        ~0.65 µs for an output with eight headers), so no record needs a "far below" shortcut.
        The size is kept on the output (`Emission.size`): the send's own up-front check uses
        it instead of measuring the record again (issue 29).

        With the compiled module the same number comes with the record's tail (`Emission.tail`,
        `prism_native.record_tail`): its headers written as its record batch will hold them.
        Why: this runs right after the batch is signed, while the records' header objects are
        in the CPU's caches; the send runs after the next batch's first messages went through
        the chain, when reading a record's dozen header objects again missed the caches (the
        compiled batch writer's call ~1.7-2 µs per record by the wall clock, ~0.5 with the
        tails; the worker ~2 µs per message less in CPU, BENCHMARKS.md, "The output headers
        written ahead"). A record the compiled call does not take (a buffer of items wider than
        a byte, say) is measured by aiokafka's estimate and sent from its fields."""
        limits = self.limits
        tail_of = _tail
        limit_of: dict[str, int] = {}  # topic -> its limit, for this batch
        for i, (msg, item) in enumerate(pending):
            if isinstance(item, DlqRecord):
                pending[i] = (msg, self.fit_dlq(item))
                continue
            over: tuple[str, int, int] | None = None
            for e in item:
                rec, topic = e.record, e.topic
                limit = limit_of.get(topic)
                if limit is None:
                    limit = limit_of[topic] = limits.limit_for(topic)
                # kept on the emission: the send checks this size again, against the limit in
                # force then (`send_all`), without measuring the record a second time
                if tail_of is not None:
                    try:
                        size, e.tail = tail_of(rec.key, rec.value, rec.headers)
                    except (TypeError, ValueError, BufferError):  # not bytes: aiokafka measures it, the send walks it
                        e.tail = None
                        size = _size(rec.key, rec.value, rec.headers)
                    e.size = size
                else:
                    size = e.size = _size(rec.key, rec.value, rec.headers)
                if size > limit:
                    over = (topic, int(size), limit)
                    break
            if over is None:
                continue
            topic, size, limit = over
            self.stats.too_large += 1
            result = chain.dlq_for_publish_failure(msg, SizeLimitError(
                f"the output record for {topic} would be {size} bytes, over the topic's {limit}-byte limit "
                f"({limits.describe([topic])})",
                hint="have the producer send smaller messages, or raise the topic's max.message.bytes and the "
                     "worker's producer_max_request_size"))
            assert result.dlq is not None
            pending[i] = (msg, self.fit_dlq(result.dlq))
            outcomes[(msg.topic, msg.partition, str(Outcome.EMITTED))] -= 1
            outcomes[(msg.topic, msg.partition, str(Outcome.DLQ))] += 1
            if observed is not None:
                observed[:] = [(m, result if m is msg else r) for m, r in observed]

    def fit_dlq(self, rec: DlqRecord) -> DlqRecord:
        """`rec` cut down to its topic's limit (logged and counted when it was)."""
        fitted = fit_dlq_record(rec, self.limits.limit_for(rec.topic),
                                None if self.overflow is None else self.overflow.put)
        if fitted is not rec:
            self.stats.dlq_truncated += 1
            ref = next((v.decode() for k, v in fitted.headers if k == VALUE_REF), None)
            log.warning("the DLQ copy of %s/%s@%s (%s) is %d bytes, over the %d-byte limit of %s: written with its "
                        "value truncated to %d bytes (prism.errors.value.sha256 and .length describe the original%s)",
                        _header(rec, "topic"), _header(rec, "partition"), _header(rec, "offset"), rec.reason,
                        record_size(rec.key, rec.value, rec.headers), self.limits.limit_for(rec.topic), rec.topic,
                        len(fitted.value), f"; the whole value is at {ref}" if ref else "")
        return fitted


def _header(rec: DlqRecord, name: str) -> str:
    """A `prism.errors.<name>` context header of a DLQ record, for log lines."""
    return next((v.decode(errors="replace") for k, v in rec.headers if k == "prism.errors." + name), "?")


__all__ = ["LIMITS_REFRESH_S", "Pending", "SizeFitter"]

"""The in-process chain: run stages in order, account for every message exactly once.

Every message ends in exactly one outcome - emitted, dlq, expired or duplicate - and the
counts are kept per stage, so a run's summary always adds up to what was read.

Timing: the whole chain is timed on every message (`ChainStats.chain_ns`/`chain_calls`,
two clock reads). Each stage is timed on a sample: one message in `stage_timing_every`
(the first, then every Nth), and every message while a tracing `stage_scope` is installed.
Timing every stage of every message cost two clock reads (perf_counter_ns ~100 ns, the
benchmark's thread-CPU clock ~500 ns) plus two counter updates per stage - as much as a
small stage itself. `stage_ns`/`stage_calls` count the timed calls only, so their ratio
stays the mean time per message of each stage (`stage_us_per_message` reads exactly that
ratio); a batch smaller than the sampling interval may contribute no per-stage sample.

Latency histograms need each message's own duration, not that ratio: a batch mean hides the
slow messages a p99 is about. With `latency_samples` set (the worker's observer does), every
timed stage call also appends `(stage, ns)` and every message its chain `ns` to a list - one
`list.append` (~30 ns), no histogram work on the hot path; the observer drains the lists after
each batch into `prism_stage_latency_seconds`. Unset (benchmarks, tools) nothing is kept.
"""

from __future__ import annotations

import enum
import logging
import time
from collections import Counter
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

from app.agents.base import Message, Stage
from app.agents.dlq import DlqRecord, build_dlq_record
from app.errors import DuplicateError, ExpiredError
from app.observability.redaction import Redactor, default_redactor
from app.schema.pii import PiiValueFinder
from app.security.attestation import Attester

log = logging.getLogger("prism.worker")


class Outcome(enum.StrEnum):
    EMITTED = "emitted"
    DLQ = "dlq"
    EXPIRED = "expired"
    DUPLICATE = "duplicate"


@dataclass(slots=True)
class Result:
    outcome: Outcome
    stage: str = ""
    reason: str = ""
    dlq: DlqRecord | None = None


@dataclass
class ChainStats:
    outcomes: Counter[str] = field(default_factory=Counter)
    dlq_reasons: Counter[str] = field(default_factory=Counter)
    #: DLQ records of final writes that failed after the batch's results were taken (a subset
    #: of `dlq_reasons`): the only ones the metrics count apart from the results
    late_dlq_reasons: Counter[str] = field(default_factory=Counter)
    #: per stage: time and number of the *timed* calls (a sample; module docs)
    stage_ns: Counter[str] = field(default_factory=Counter)
    stage_calls: Counter[str] = field(default_factory=Counter)
    #: the whole chain (every stage a message reached), over every message
    chain_ns: int = 0
    chain_calls: int = 0

    def stage_us_per_message(self) -> dict[str, float]:
        return {k: self.stage_ns[k] / 1000 / max(1, self.stage_calls[k]) for k in self.stage_ns}


class LatencySamples:
    """Per-message durations (ns) since the last `drain`: `(stage, ns)` of each timed stage call
    and the chain's `ns` of every message (module docs). Plain lists, so recording is an append."""

    __slots__ = ("chain", "stages")

    def __init__(self) -> None:
        self.stages: list[tuple[str, int]] = []
        self.chain: list[int] = []

    def drain(self) -> tuple[list[tuple[str, int]], list[int]]:
        """The samples so far, and start afresh (the caller owns the returned lists)."""
        stages, chain = self.stages, self.chain
        self.stages, self.chain = [], []
        return stages, chain


_EMITTED = Outcome.EMITTED  # once per message: a module name, not an EnumType attribute lookup

#: `Chain.stage_timing_every` by default: ~30 timed messages per 500-message batch
STAGE_TIMING_EVERY = 16


class Chain:
    """Runs the synchronous stages of one topology over a message."""

    def __init__(self, stages: Sequence[Stage], *, dlq_topic_for, expired_to_dlq: bool = False,
                 attester: Attester | None = None, pii: PiiValueFinder | None = None,
                 redactor: Redactor | None = None) -> None:
        self.stages = list(stages)
        #: finds the values of the schema's PII fields in a failed message's payload, so they are
        #: masked in the DLQ context headers and in logs/spans (registered with `redactor`)
        self.pii = pii if pii else None
        self.redactor = redactor
        #: signs the verified identity onto DLQ copies, so `prism dlq replay` keeps it
        self.attester = attester
        self.dlq_topic_for = dlq_topic_for
        self.expired_to_dlq = expired_to_dlq
        self.stats = ChainStats()
        #: Observer hook (app/worker/observe.py): `with stage_scope(stage, msg): stage.process(msg)`
        #: opens a tracing span per stage. None (tracing off) costs one `is None` test per stage.
        self.stage_scope: Callable[[Stage, Message], AbstractContextManager[Any]] | None = None
        #: time the stages of one message in this many (1: every message); module docs
        self.stage_timing_every = STAGE_TIMING_EVERY
        self._untimed = 0
        #: per-message durations for latency histograms, kept only when set (module docs)
        self.latency_samples: LatencySamples | None = None

    def run(self, msg: Message) -> Result:
        """Run every stage. EMITTED here means "passed every stage"; the caller counts it
        as emitted only once its writes succeed."""
        stats = self.stats
        clock = time.perf_counter_ns
        t0 = clock()
        try:
            if self.stage_scope is None and self._untimed:
                self._untimed -= 1
                return self._run_untimed(msg)
            self._untimed = max(self.stage_timing_every, 1) - 1  # 0 or less: time every message
            return self._run_timed(msg)
        finally:
            ns = clock() - t0
            stats.chain_ns += ns
            stats.chain_calls += 1
            samples = self.latency_samples
            if samples is not None:
                samples.chain.append(ns)

    def _run_untimed(self, msg: Message) -> Result:
        """`_run_timed` without the per-stage clock reads: the same outcomes and accounting."""
        stage = None
        try:
            for stage in self.stages:
                stage.process(msg)
        except ExpiredError as exc:
            if self.expired_to_dlq:
                return self._dlq(msg, stage, exc)  # type: ignore[arg-type]
            self.stats.outcomes[Outcome.EXPIRED] += 1
            return Result(Outcome.EXPIRED, stage.name, exc.code)  # type: ignore[union-attr]
        except DuplicateError as exc:
            self.stats.outcomes[Outcome.DUPLICATE] += 1
            return Result(Outcome.DUPLICATE, stage.name, exc.code)  # type: ignore[union-attr]
        except Exception as exc:  # PrismError, or a bug: either way the DLQ, never a crash
            return self._dlq(msg, stage, exc)  # type: ignore[arg-type]
        return Result(_EMITTED)

    def _run_timed(self, msg: Message) -> Result:
        stats = self.stats
        clock = time.perf_counter_ns
        scope = self.stage_scope
        samples = self.latency_samples
        for stage in self.stages:
            t0 = clock()
            try:
                if scope is None:
                    stage.process(msg)
                else:
                    with scope(stage, msg):
                        stage.process(msg)
            except ExpiredError as exc:
                if self.expired_to_dlq:
                    return self._dlq(msg, stage, exc)
                stats.outcomes[Outcome.EXPIRED] += 1
                return Result(Outcome.EXPIRED, stage.name, exc.code)
            except DuplicateError as exc:
                stats.outcomes[Outcome.DUPLICATE] += 1
                return Result(Outcome.DUPLICATE, stage.name, exc.code)
            except Exception as exc:  # PrismError, or a bug: either way the DLQ, never a crash
                return self._dlq(msg, stage, exc)
            finally:
                ns = clock() - t0
                stats.stage_ns[stage.name] += ns
                stats.stage_calls[stage.name] += 1
                if samples is not None:
                    samples.stages.append((stage.name, ns))
        return Result(_EMITTED)

    def _dlq(self, msg: Message, stage: Stage | str, exc: BaseException) -> Result:
        name = stage if isinstance(stage, str) else stage.name
        cls = "app.worker.publish" if isinstance(stage, str) else f"{type(stage).__module__}.{type(stage).__qualname__}"
        pii = self._pii_values(msg)
        if pii:
            # before anything below (or an observer, or a later log line) writes about this message
            (self.redactor or default_redactor()).register_pii(pii)
        rec = build_dlq_record(msg, stage=name, stage_class=cls, error=exc, dlq_topic=self.dlq_topic_for(msg.topic),
                               attester=self.attester, pii_values=pii)
        self.stats.outcomes[Outcome.DLQ] += 1
        self.stats.dlq_reasons[rec.reason] += 1
        if log.isEnabledFor(logging.DEBUG):
            log.debug("dead-lettered %s[%s]@%s at %s (%s): %s", msg.topic, msg.partition, msg.offset, name,
                      rec.reason, exc)
        return Result(Outcome.DLQ, name, rec.reason, rec)

    def _pii_values(self, msg: Message) -> list[str]:
        """The PII field values of a failed message's payload (only failures are read: nothing
        Prism writes about a message that succeeds quotes its payload)."""
        if self.pii is None:
            return []
        env = msg.envelope
        try:
            if env is None:
                return self.pii.values(msg.value)
            if env.is_encrypted:
                return []
            return self.pii.values(env.payload_bytes(), env.content_type)
        except Exception:  # a payload that cannot even be read (bad compression): nothing to find
            return []

    def dlq_for_publish_failure(self, msg: Message, exc: BaseException, *, stage: str = "publish",
                                late: bool = False) -> Result:
        """Route a message whose final writes failed after retries (Connect's DLQ gap), or that
        the worker refused before the chain (`stage="normalize"`: over the input size limit).
        `late`: the caller cannot put this result in its batch's observed results (the writes
        already ran); it is counted in `stats.late_dlq_reasons`, which the metrics read, so that
        every DLQ record is counted exactly once."""
        res = self._dlq(msg, stage, exc)
        if late:
            self.stats.late_dlq_reasons[res.reason] += 1
        return res

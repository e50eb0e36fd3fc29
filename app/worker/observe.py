"""Everything the pipeline worker needs to be observable, kept out of the hot path.

`Observer` is given to `PipelineApp(..., observe=Observer(...))`. It wires the existing
library (`app.observability`) into the worker:

* **Metrics** (`PipelineMetrics`, one registry per worker). The chain already accounts for
  every message (`Result` per message, `ChainStats` per stage); the observer turns one
  *batch* of results into counter increments - a handful of `inc(n)` per batch instead of
  several per message per stage. Stage latency is a true per-message histogram: the chain
  keeps each timed message's own duration (`Chain.latency_samples`, a list append on the hot
  path) and the observer observes every one of them after the batch - the whole chain
  (`stage="chain"`) and publish for every message, the other stages for the messages the
  chain times (one in `Chain.stage_timing_every`, every one while tracing). Publish is the
  message's own `prepare` plus its share of the batch's one signature (`Publisher.finish`).
  `_count` counts timed messages, `_sum / _count` is the mean, and the buckets hold the
  distribution a p99 is read from (a batch mean hid the slow messages). Consumer lag is the
  group's committed offsets against the log end offsets, read from the broker in the
  background by `app.worker.lag` (right while paused, rebalancing or with nothing assigned: never what this worker last
  fetched); table sizes are computed when `/metrics` is scraped, at most every
  `table_size_interval_s` (RocksDB counts by iterating), and so are the archive tap's totals
  (`prism_archive_*`, app/observability/archive_metrics.py).
* **Health**: a `HealthState` fed by Faust's `on_partitions_assigned/revoked` signals, table
  recovery (`app.in_recovery`), the consumer's broker connections and the shutdown signal.
* **Tracing**: with an exporter other than `none`, a span per stage per message via
  `stage_span` (parent = the envelope's / headers' context), installed as the chain's
  `stage_scope`. With `none` nothing is installed at all: the chain runs exactly as without
  an observer and the enrich stage still continues the W3C context in the envelope.
  Under the default parent-based sampler, a message whose context says "not sampled" gets
  no spans at all (its children would not be recorded anyway).
* **Web views** on Faust's web server: `/metrics`, `/healthz`, `/readyz`, the Connect-style
  management API (`app.worker.management`) and `/openapi.json`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ParentBased
from opentelemetry.trace import SpanKind, Status, StatusCode

from app.agents.chain import LatencySamples, Outcome, Result
from app.errors import ConfigError, PrismError
from app.observability import tracecontext as tc
from app.observability.health import HealthState, run_heartbeat
from app.observability.metrics import PipelineMetrics
from app.observability.redaction import Redactor, default_redactor
from app.observability.tracing import (
    DLQ_REASON,
    OUTCOME,
    TracingSetup,
    _context_from,
    configure_tracing_from_env,
    inject_into_envelope,
    stage_span,
)
from app.worker.management import ManagementSettings, register_views, set_fetching
from app.worker.progress import DEFAULT_STALL_S, ProgressWatch, stall_after_from_env

if TYPE_CHECKING:
    from app.agents.base import Message, Stage
    from app.agents.chain import Chain
    from app.envelope.model import Envelope
    from app.worker.interfaces import PipelineView
    from app.worker.lag import LagMonitor

log = logging.getLogger("prism.worker.observe")

ENV_METRIC_LABELS = "PRISM_METRIC_LABELS"
ENV_WEB_PORT = "PRISM_WEB_PORT"
PUBLISH_STAGE = "publish"
#: `prism_stage_latency_seconds{stage=...}` of the whole stage chain per message (every message timed)
CHAIN_STAGE = "chain"
#: seconds a source partition's leader must stay unreachable before /readyz reports it
SOURCE_GRACE_S = 2.0


# --------------------------------------------------------------------------- tracing scope


class StageTracer:
    """The chain's `stage_scope`: `with tracer(stage, msg): stage.process(msg)`.

    A stage that runs before the message has an envelope (normalize) gets a span built
    after the fact with its real start time, parented on the `traceparent` header (or the
    envelope it produced). Every successful stage re-injects its span into the envelope,
    because enrich's `continue_or_start` writes a span id of its own: the outputs then
    carry the enrich SPAN's context and the consumer's span is its child.

    Unsampled messages: under a parent-based sampler that drops children of an unsampled
    remote parent (the SDK default), a message whose context says "not sampled" gets no span
    at all - not even a non-recording one. The worker is then a non-participating hop for it
    (the context is passed on unchanged; enrich continues it), exactly as with tracing off.
    A non-recording SDK span per message cost ~27 µs (bench/bench_observed_pipeline.py), the
    skip costs ~1 µs per stage.
    """

    __slots__ = ("_skip_unsampled", "_unsampled_msg", "redactor", "tracer")

    def __init__(self, setup: TracingSetup, redactor: Redactor | None = None) -> None:
        self.tracer = setup.tracer("prism.worker")
        self.redactor = redactor
        sampler = setup.provider.sampler
        self._skip_unsampled = (isinstance(sampler, ParentBased)
                                and getattr(sampler, "_remote_parent_not_sampled", ALWAYS_OFF) is ALWAYS_OFF)
        # The message the first stage found unsampled: the chain runs one message through all
        # its stages before the next, so its later stages skip on an identity test.
        self._unsampled_msg: Message | None = None

    def __call__(self, stage: Stage, msg: Message) -> _Scope | _Skip:
        if msg is self._unsampled_msg:
            return _SKIP
        return _Scope(self, stage, msg)


class _Skip:
    """The scope of a stage of an unsampled message: nothing at all."""

    __slots__ = ()

    def __enter__(self) -> _Skip:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: Any) -> bool:
        return False


_SKIP = _Skip()


class _Scope:
    __slots__ = ("msg", "owner", "span", "stage", "t0")

    def __init__(self, owner: StageTracer, stage: Stage, msg: Message) -> None:
        self.owner, self.stage, self.msg = owner, stage, msg
        self.span: Any = None
        self.t0 = 0

    def __enter__(self) -> _Scope:
        env = self.msg.envelope
        if env is None:
            self.t0 = time.time_ns()
            return self
        if self.owner._skip_unsampled:
            obs = env.observability
            if obs is not None and obs.trace_id and not (obs.trace_flags & tc.FLAG_SAMPLED):
                return self  # parent-based sampler: an unsampled parent means no recorded children
        m = self.msg
        self.span = stage_span(self.owner.tracer, self.stage.name, env, m.topic, m.partition, headers=m.headers,
                               offset=m.offset, redactor=self.owner.redactor)
        self.span.__enter__()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: Any) -> bool:
        s = self.span
        if s is None:
            if self.t0:
                m = self.msg
                incoming = tc.read_incoming(m.envelope if exc is None else None, m.headers)
                if self.owner._skip_unsampled and _pass_unsampled(incoming, m.envelope if exc is None else None):
                    self.owner._unsampled_msg = m
                else:
                    self._late_span(exc, incoming)
            return False
        if exc is None:
            inject_into_envelope(s.span, self.msg.env)
        elif not isinstance(exc, PrismError) and isinstance(exc, Exception):
            s.dlq("internal_error")  # the chain routes a stage bug to the DLQ too
        s.__exit__(exc_type, exc, tb)
        return False

    def _late_span(self, exc: BaseException | None, incoming: tc.Incoming) -> None:
        """Span for a stage that started without an envelope (it built it, or failed to);
        `incoming` is the context read from the envelope it built (not after a failure) or
        the headers."""
        m = self.msg
        env = m.envelope
        parent = _context_from(incoming)
        attrs: dict[str, Any] = {"messaging.system": "kafka", "messaging.operation.type": "process",
                                 "messaging.destination.name": m.topic, "prism.stage": self.stage.name,
                                 "messaging.destination.partition.id": str(m.partition),
                                 "messaging.kafka.offset": m.offset}
        span = self.owner.tracer.start_span(f"{self.stage.name} {m.topic}", context=parent, kind=SpanKind.CONSUMER,
                                            start_time=self.t0, attributes=attrs)
        try:
            if exc is None:
                assert env is not None
                if env.message_id:
                    red = self.owner.redactor
                    span.set_attribute("messaging.message.id", red.redact(env.message_id) if red else env.message_id)
                span.set_attribute(OUTCOME, "emitted")
                if not inject_into_envelope(span, env) and env.observability is None:
                    tc.continue_or_start(env, m.headers)
            else:
                reason = exc.code if isinstance(exc, PrismError) else "internal_error"
                span.set_attribute(OUTCOME, "dlq")
                span.set_attribute(DLQ_REASON, reason)
                span.set_attribute("error.type", type(exc).__qualname__)
                span.set_status(Status(StatusCode.ERROR, reason))
        finally:
            span.end()


def _pass_unsampled(incoming: tc.Incoming, env: Envelope | None) -> bool:
    """True (and nothing to record) when the message's valid context says "not sampled".
    A context that came in the headers is copied, unchanged, into the envelope, as a
    non-participating hop does (tracing.stage_span with a NoOpTracer does the same)."""
    tp = incoming.traceparent
    if tp is None or tp.sampled:
        return False
    if env is not None and incoming.source == "headers":
        tc.write_envelope_context(env, tp.trace_id, tp.parent_id, None, tp.propagated_flags(), incoming.tracestate)
    return True


# --------------------------------------------------------------------------- per-batch metrics


@dataclass
class _ChainSnapshot:
    """A chain's totals at the last batch, to count each batch's share of them."""

    #: `ChainStats.late_dlq_reasons` at the last batch
    dlq_reasons: Counter[str] = field(default_factory=Counter)
    #: `ChainStats.stage_ns["publish"]`: prepare of every message plus each batch's finish
    publish_ns: int = 0


class Observer:
    """Metrics, health, tracing and the management API of one pipeline worker.

    Args:
        metrics: the worker's metrics (default: a fresh `PipelineMetrics`, own registry).
        health: the worker's health state (default: a fresh `HealthState`).
        tracing: a `TracingSetup`; None or exporter "none" = no stage spans.
        redactor: applied to producer-supplied span attributes and label values.
        table_size_interval_s: minimum seconds between two table size counts.
        management: who may use the management API, and its TLS (default: reads open,
            mutations closed; `from_env` reads PRISM_ADMIN_* and PRISM_WEB_SSL_*).
    """

    def __init__(self, *, metrics: PipelineMetrics | None = None, health: HealthState | None = None,
                 tracing: TracingSetup | None = None, redactor: Redactor | None = None,
                 table_size_interval_s: float = 10.0, management: ManagementSettings | None = None,
                 stall_after_s: float = DEFAULT_STALL_S) -> None:
        self.management = management if management is not None else ManagementSettings.default()
        self.redactor = redactor or default_redactor()
        self.metrics = metrics if metrics is not None else PipelineMetrics(redactor=self.redactor)
        self.health = health if health is not None else HealthState(redactor=self.redactor)
        self.tracing = tracing
        self.table_size_interval_s = table_size_interval_s
        self.pipeline: PipelineView | None = None
        self.stage_tracer: StageTracer | None = None
        if tracing is not None and tracing.exporter_name != "none":
            self.stage_tracer = StageTracer(tracing, self.redactor)
        self._snap: dict[int, _ChainSnapshot] = {}
        self._written: Counter[str] = Counter()
        self._tables_at = 0.0
        self.paused: set[str] = set()          # topology names paused through the management API
        self.in_flight = 0                     # batches being processed right now
        self._idle = asyncio.Event()
        self._idle.set()
        self.batches = 0
        self._pause_task: asyncio.Future[None] | None = None
        self.started_at = time.time()
        self._source_trouble_since: float | None = None
        self.progress = ProgressWatch(stall_after_s)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, *, service_name: str = "prism-worker") -> Observer:
        """`PRISM_TRACES_EXPORTER` (otlp|console|none|memory, default none; OTEL_* for OTLP) and
        `PRISM_METRIC_LABELS` (comma-separated envelope label keys allowed as metric labels)."""
        env = os.environ if env is None else env
        allow = [x.strip() for x in env.get(ENV_METRIC_LABELS, "").split(",") if x.strip()]
        red = default_redactor()
        try:
            metrics = PipelineMetrics(label_allowlist=allow, redactor=red)
        except ConfigError as exc:  # it named `metrics.label_allowlist`, a key no file has
            raise ConfigError(exc.message, path=ENV_METRIC_LABELS,
                              hint=f"remove that key from {ENV_METRIC_LABELS} (comma-separated envelope label keys; "
                                   "they may not be Prometheus' reserved names or start with __)") from None
        return cls(metrics=metrics,
                   tracing=configure_tracing_from_env(service_name, env), redactor=red,
                   management=ManagementSettings.from_env(env), stall_after_s=stall_after_from_env(env))

    #: the broker-side lag reader (app/worker/lag.py), set by attach()
    lag_monitor: LagMonitor | None = None

    @property
    def tracing_enabled(self) -> bool:
        return self.stage_tracer is not None

    # -- wiring ------------------------------------------------------------------------------
    def attach(self, pipeline: PipelineView) -> None:
        """Connect to the pipeline's Faust app (call before the app starts)."""
        self.pipeline = pipeline
        app = pipeline.app
        for chain in pipeline.chains.values():
            chain.stage_scope = self.stage_tracer
            chain.latency_samples = LatencySamples()  # drained by every batch_done
            self._snap[id(chain)] = _ChainSnapshot()
        for name in _table_names(app):
            self.health.register_table(name)
        # the archive tap's totals, read at scrape time (app/observability/archive_metrics.py)
        from app.observability.archive_metrics import ArchiveCollector

        self.metrics.registry.register(ArchiveCollector(lambda: getattr(pipeline.archive, "sink", None)))
        app.on_partitions_assigned.connect(self._on_assigned)
        app.on_partitions_revoked.connect(self._on_revoked)
        app.on_before_shutdown.connect(self._on_before_shutdown)
        # Lag from the broker (app/worker/lag.py), read in the background so that neither a
        # scrape nor /status waits on it: the group's committed offsets against the log end.
        from app.worker.lag import monitor_for_pipeline

        self.lag_monitor = monitor_for_pipeline(pipeline)
        app.task(self.lag_monitor.run)

        async def _started() -> None:
            self.health.mark_started()
            self._refresh_health()
        app.task(_started)
        app.task(_heartbeat(self.health))
        app.task(self._watch_kafka)
        if app.conf.web_enabled:
            register_views(app, self, self.management)

    async def _on_assigned(self, sender: Any, assigned: Iterable[Any], **_: Any) -> None:
        self.health.set_broker_connected(True)
        pipeline = self.pipeline
        if pipeline is None:
            return
        sources = {s.topic for s in pipeline.topology.sources}
        mine = [(tp.topic, tp.partition) for tp in assigned if tp.topic in sources]
        self.health.partitions_assigned(mine)
        if self.paused:  # a rebalance must not silently resume a paused topology
            # not awaited here: the consumer thread is waiting for this rebalance callback
            self._pause_task = asyncio.ensure_future(set_fetching(self, True))

    async def _on_revoked(self, sender: Any, revoked: Iterable[Any], **_: Any) -> None:
        tps = [(tp.topic, tp.partition) for tp in revoked]
        self.health.partitions_revoked(tps)
        for topic, partition in tps:
            self.metrics.remove_partition(topic, partition)

    async def _on_before_shutdown(self, sender: Any = None, **_: Any) -> None:
        self.health.mark_stopping()

    def mark_stopping(self) -> None:
        self.health.mark_stopping()

    # -- the hot path: once per batch -----------------------------------------------------
    def batch_started(self) -> None:
        self.in_flight += 1
        self._idle.clear()

    def batch_done(self, chain: Chain, topic: str, observed: list[tuple[Message, Result]]) -> None:
        """Turn one batch's results into metric increments (a few `inc(n)` per batch); the
        batch is no longer in flight."""
        try:
            self._count_batch(chain, topic, observed)
        finally:
            self.batch_finished()

    def batch_finished(self) -> None:
        """A batch written and acknowledged, its metrics counted later with others
        (`count_batches`; app/worker/batch_runner.py, `count_every_s`): no longer in flight."""
        self.batches += 1
        self.in_flight -= 1
        if self.in_flight <= 0:
            self.in_flight = 0
            self._idle.set()

    def count_batches(self, chain: Chain, topic: str, observed: list[tuple[Message, Result]]) -> None:
        """The metric increments of several finished batches of one chain and source topic
        together (their results in order): the same sums as one `batch_done` each, one pass."""
        self._count_batch(chain, topic, observed)

    def batch_abandoned(self) -> None:
        """A batch left unacknowledged at shutdown (`PipelineApp`): no longer in flight, not counted."""
        self.in_flight = max(0, self.in_flight - 1)
        if self.in_flight == 0:
            self._idle.set()

    def set_blocked(self, reason: str | None) -> None:
        """The worker cannot write its DLQ (`reason`) and stopped fetching, or can again (None)."""
        self.health.set_blocked(reason)

    async def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until no batch is in flight (pause/restart, shutdown). False on timeout."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except TimeoutError:
            return False
        return True

    def _count_batch(self, chain: Chain, topic: str, observed: list[tuple[Message, Result]]) -> None:
        m = self.metrics
        guard = m.labels
        stages = [s.name for s in chain.stages]
        # (labels) -> Counter of "stopped at stage i", and how many were seen
        seen: Counter[tuple[str, ...]] = Counter()
        stopped: Counter[tuple[tuple[str, ...], str]] = Counter()
        publish_in: Counter[tuple[str, ...]] = Counter()
        sdk_versions: Counter[str] = Counter()  # emitted messages by producer SDK version (memo-031)
        for msg, res in observed:
            lv = guard.of(msg.envelope)  # namespace, schema_version, allowlisted labels
            seen[lv] += 1
            out = res.outcome
            if out is Outcome.EMITTED:
                publish_in[lv] += 1
                env = msg.envelope
                sdk_versions[env.header.metadata.producer_sdk_version if env is not None else ""] += 1
                continue
            st = res.stage
            if st == PUBLISH_STAGE:
                publish_in[lv] += 1
            else:
                stopped[(lv, st)] += 1
            if out is Outcome.DLQ:
                m.dlq(topic, st, res.reason, label_values=lv)
                if res.reason == "expired":
                    m.expired(topic, st)
                elif st == "verify_signature":
                    m.signature_failure(topic, res.reason)
                elif st == "authenticate":
                    m.auth_failure(topic, res.reason)
            elif out is Outcome.EXPIRED:
                m._child(m.expired_messages, (topic, st)).inc()
            elif out is Outcome.DUPLICATE:
                m._child(m.dedup_hits, (topic, st)).inc()
        for lv, n in seen.items():
            reached = n
            for st in stages:
                m._child(m.messages_in, (topic, st, *lv)).inc(reached)
                reached -= stopped.get((lv, st), 0)
                if reached:
                    m._child(m.messages_out, (topic, st, *lv)).inc(reached)
        for lv, n in publish_in.items():
            m._child(m.messages_in, (topic, PUBLISH_STAGE, *lv)).inc(n)
        for sdk_version, n in sdk_versions.items():
            m.producer_sdk_output(topic, sdk_version, n)
        # outputs written (per output topic) and DLQ records from failed final writes
        pipeline = self.pipeline
        if pipeline is not None:
            written = pipeline.stats.written
            suffix = pipeline.topology.dlq.topic_suffix
            empty = guard.empty
            for out_topic, total in written.items():
                delta = total - self._written[out_topic]
                if delta and not out_topic.endswith(suffix):
                    m._child(m.messages_out, (out_topic, PUBLISH_STAGE, *empty)).inc(delta)
            self._written = Counter(written)
        snap = self._snap.setdefault(id(chain), _ChainSnapshot())
        cs = chain.stats
        # Each DLQ record counted once: the results above, plus the records of final writes that
        # failed after their batch's results were taken (`late_dlq_reasons`), at the publish stage.
        # (Inferring those as "DLQ records since the last count minus this batch's results"
        # counted a later batch's records, already run through the chain while this one was still
        # writing, a second time - token_expired at authenticate and again at publish.)
        for reason, total in cs.late_dlq_reasons.items():
            extra = total - snap.dlq_reasons[reason]
            if extra > 0:
                m._child(m.dlq_messages, (topic, PUBLISH_STAGE, m._clean_reason(reason),
                                          *guard.empty)).inc(extra)
        snap.dlq_reasons = Counter(cs.late_dlq_reasons)
        self._observe_latencies(chain, topic, snap)
        for stage in chain.stages:  # enrich: payloads validated against the schema (RFC-030)
            drain_validations = getattr(stage, "drain_validations", None)
            if drain_validations is not None:
                for (namespace, version, mode, result), n in drain_validations().items():
                    m.schema_validation(topic, namespace, version, mode, result, n)
        drain = getattr(chain.stages[0], "drain_newer_versions", None) if chain.stages else None
        if drain is not None:  # normalize: draft envelopes newer than this build (RFC-031 compatibility)
            for version, n in drain().items():
                m.newer_envelope_version(topic, version, n)

    def _observe_latencies(self, chain: Chain, topic: str, snap: _ChainSnapshot) -> None:
        """Each timed message's own durations since the last batch into the latency histogram
        (module docs); without samples (a chain not attached here) nothing is observed."""
        samples = chain.latency_samples
        if samples is None:
            return
        stage_samples, chain_samples = samples.drain()
        cs = chain.stats
        m = self.metrics
        # publish: `prepare` was sampled per message; the batch's one `finish` (the signature) is
        # in stage_ns only, so each message gets an equal share of it
        publish = [ns for st, ns in stage_samples if st == PUBLISH_STAGE]
        finish_share = 0.0
        if publish:
            finish_ns = cs.stage_ns[PUBLISH_STAGE] - snap.publish_ns - sum(publish)
            finish_share = max(finish_ns, 0) / len(publish)
        children: dict[str, Any] = {}
        for st, ns in stage_samples:
            child = children.get(st)
            if child is None:
                child = children[st] = m._child(m.stage_latency, (topic, st))
            child.observe(((ns + finish_share) if st == PUBLISH_STAGE else ns) / 1e9)
        # The whole chain, timed on every message (the stages themselves are sampled): one
        # more `stage` value, CHAIN_STAGE, so a dashboard needs no new metric.
        if chain_samples:
            observe = m._child(m.stage_latency, (topic, CHAIN_STAGE)).observe
            for ns in chain_samples:
                observe(ns / 1e9)
        snap.publish_ns = cs.stage_ns[PUBLISH_STAGE]

    # -- scrape-time gauges -----------------------------------------------------------------
    def partition_status(self) -> list[dict[str, Any]]:
        """Per source partition assigned to this worker: the group's committed offset, the log
        end offset (``highwater``) and the lag between them as the broker last reported them
        (:attr:`lag_monitor`; None before the first read), and whether it is paused. Not this
        consumer's fetch positions: those froze while paused and made lag read 0."""
        pipeline = self.pipeline
        if pipeline is None:
            return []
        app = pipeline.app
        sources = {s.topic for s in pipeline.topology.sources}
        consumer = getattr(app, "_consumer", None)
        if consumer is None:
            return []
        try:
            assignment = consumer.assignment()
        except Exception:  # not started yet
            return []
        paused = pipeline.topology.name in self.paused
        snap = self.lag_monitor.latest if self.lag_monitor is not None else None
        rows = []
        for tp in sorted(assignment):
            if tp.topic not in sources:
                continue
            p = snap.get(tp.topic, tp.partition) if snap is not None else None
            rows.append({"topic": tp.topic, "partition": tp.partition, "committed": p.committed if p else None,
                         "highwater": p.log_end if p else None, "lag": p.lag if p else None, "paused": paused})
        return rows

    def group_lag(self) -> dict[str, Any] | None:
        """The group's lag on every source partition, assigned here or not (``GroupLag.to_dict``)."""
        snap = self.lag_monitor.latest if self.lag_monitor is not None else None
        return snap.to_dict() if snap is not None else None

    def refresh_gauges(self) -> None:
        # Every partition of the group, assigned here or not: lag belongs to the group, and it
        # must not vanish while a rebalance leaves this worker with nothing assigned.
        snap = self.lag_monitor.latest if self.lag_monitor is not None else None
        for part in snap.partitions if snap is not None else ():
            if part.lag is not None:
                self.metrics.set_consumer_lag(part.topic, part.partition, part.lag)
        now = time.monotonic()
        if self.pipeline is not None and now - self._tables_at >= self.table_size_interval_s:
            self._tables_at = now
            for name, size in self.table_sizes().items():
                self.metrics.set_table_size(name, size)
        self._refresh_health()

    def table_sizes(self) -> dict[str, int]:
        out: dict[str, int] = {}
        if self.pipeline is None:
            return out
        for name, table in self.pipeline.app.tables.items():
            with contextlib.suppress(Exception):  # a table whose store is not open yet
                out[name] = len(table)
        return out

    def _refresh_health(self) -> None:
        pipeline = self.pipeline
        if pipeline is None:
            return
        app = pipeline.app
        recovering = bool(getattr(app, "in_recovery", False))
        for name in self.health.tables:
            self.health.table_recovered(name, not recovering)
        connected = _broker_connected(app)
        if connected is not None:
            self.health.set_broker_connected(connected, None if connected else "no broker connection")
        self._refresh_kafka()

    def _refresh_kafka(self) -> None:
        """Writes failing, a lost partition leader, an unreachable broker: into /readyz while it
        lasts, with a WARNING when it starts and when it ends (app/worker/kafka_health.py).
        A source partition's leader must stay unreachable for `SOURCE_GRACE_S` to count: the
        consumer opens its connections lazily, right after an assignment none is open yet."""
        pipeline = self.pipeline
        if pipeline is None or not self.health.started or self.health.stopping:
            return
        try:
            problems = [p] if (p := pipeline.kafka_problem()) else []
            source = pipeline.source_problems()
        except Exception as exc:  # never let a probe fail on a diagnostic
            log.debug("kafka health check failed: %r", exc)
            return
        now = time.monotonic()
        if source and not self.paused:  # a paused topology fetches nothing: its idle connections may close
            self._source_trouble_since = self._source_trouble_since or now
            if now - self._source_trouble_since >= SOURCE_GRACE_S:
                problems.append("fetching: " + "; ".join(source[:4]))
        else:
            self._source_trouble_since = None
        before = self.health.kafka_problem
        since = self.health._kafka_since
        self.health.set_kafka_problem("; ".join(problems) if problems else None)
        if problems and before is None:
            log.warning("Kafka trouble: %s. /readyz reports it (503) until it clears; nothing is committed past "
                        "an unwritten output", self.health.kafka_problem)
        elif not problems and before is not None:
            log.warning("Kafka trouble over after %.1f s (was: %s)", now - (since or now), before)

    async def _watch_kafka(self) -> None:
        """Evaluate the Kafka checks every second, so that the log says when trouble starts and
        ends even when nothing probes /readyz."""
        while True:
            await asyncio.sleep(1.0)
            self._refresh_kafka()
            self._refresh_progress()
            await self._act_on_stall()

    def _waiting(self) -> int | None:
        """Messages the broker says wait on this worker's source partitions: committed offset
        behind the log end, counted where the gap is more than 1 (a transactional producer's
        commit marker takes one offset after the last record, so an idle exactly_once partition
        stays 1 behind). None when the broker's numbers are missing or older than 3 reads."""
        snap = self.lag_monitor.latest if self.lag_monitor is not None else None
        if snap is None or snap.error or self.lag_monitor is None:
            return None
        if time.time() - snap.at > 3 * self.lag_monitor.interval_s + self.lag_monitor.timeout_s:
            return None
        lags = [r["lag"] for r in self.partition_status() if r["lag"] is not None]
        return sum(lag for lag in lags if lag > 1)

    def _stall_excuse(self) -> str | None:
        """A reason, already reported elsewhere, for processing nothing while messages wait."""
        pipeline, health = self.pipeline, self.health
        assert pipeline is not None
        app = pipeline.app
        if health.stopping or health.failed:
            return "stopping"
        if pipeline.topology.name in self.paused:
            return "paused"
        if health.blocked is not None or health.kafka_problem is not None:
            return "writes or Kafka"
        if getattr(app, "rebalancing", False) or getattr(app, "in_recovery", False) or not health.assignment_received:
            return "rebalance"
        return None

    def _refresh_progress(self) -> None:
        """A stall with no known cause: into /readyz, and one WARNING with the diagnosis
        (app/worker/progress.py); a WARNING again when progress resumes."""
        pipeline = self.pipeline
        if pipeline is None or not self.health.started:
            return
        try:
            was = self.progress.stalled
            now = self.progress.check(processed=pipeline.stats.read, waiting=self._waiting(),
                                      excuse=self._stall_excuse())
        except Exception as exc:  # never let a diagnostic fail the worker
            log.debug("progress check failed: %r", exc)
            return
        self.health.set_stalled(now)
        if now is not None and was is None:
            from app.worker.diagnose import consumer_snapshot, worker_task_stacks

            try:
                snapshot = json.dumps(consumer_snapshot(pipeline.app), default=str)
                stacks = worker_task_stacks(pipeline.app)
            except Exception as exc:  # the stall is reported even if its diagnosis fails
                snapshot, stacks = f"<snapshot failed: {exc!r}>", []
            log.warning("%s. /readyz reports it (503) until a batch finishes. Diagnosis - consumer: %s; tasks: %s",
                        now, snapshot, " | ".join(stacks[:40]), extra={"event": "stalled"})
        elif now is None and was is not None:
            log.warning("progress again (was: %s)", was, extra={"event": "stall_over"})

    async def _act_on_stall(self) -> None:
        """A stall never persists (app/worker/progress.py): re-read from the committed offsets
        once, then, if that did not help, stop with an error for the supervisor to restart."""
        from app.worker.progress import Action

        action = self.progress.action()
        if action is Action.NONE or self.pipeline is None:
            return
        app = self.pipeline.app
        if action is Action.RESEEK:
            log.warning("stall: rewinding the source partitions to their committed offsets to read again what a "
                        "fetch may have dropped", extra={"event": "stall_reseek"})
            # Bounded: the rewind is carried out by the consumer thread, and a stall can be that very
            # thread stuck (a commit that never returned, seen once after a partition leader's kill
            # -9). Waiting on it unbounded kept this watch from ever reaching the exit below.
            try:
                await asyncio.wait_for(app.consumer.perform_seek(), timeout=self.progress.stall_after_s)
            except TimeoutError:
                await self._exit_on_stall(app, f"the consumer did not carry out a rewind to the committed offsets "
                                               f"within {self.progress.stall_after_s:.0f} s")
            except Exception as exc:  # the exit below still bounds the stall
                log.warning("stall: the rewind failed: %r", exc)
            return
        await self._exit_on_stall(app, f"a rewind to the committed offsets did not help within "
                                       f"{self.progress.stall_after_s:.0f} s")

    async def _exit_on_stall(self, app: Any, why: str) -> None:
        """End the worker with a `StallError` (exit code 1) for its supervisor to restart."""
        from app.errors import StallError

        exc = StallError(f"{self.progress.stalled}; {why}",
                         hint="nothing is lost: offsets were not committed past unprocessed records; the worker "
                              "exits so that its supervisor starts it afresh - report the logged diagnosis")
        log.error("error [%s] %s", exc.code, exc, extra={"event": "stall_exit"})
        await app.crash(exc)

    def exposition(self) -> bytes:
        self.refresh_gauges()
        return self.metrics.exposition()


def _heartbeat(health: HealthState) -> Any:
    async def beat() -> None:
        await run_heartbeat(health)
    return beat


def _table_names(app: Any) -> list[str]:
    try:
        return list(app.tables.keys())
    except Exception:
        return []


def _broker_connected(app: Any) -> bool | None:
    """True when the worker consumer's aiokafka client holds a live broker connection.
    None when that cannot be told (consumer not created yet)."""
    try:
        thread = app.consumer._thread
        client = thread._consumer._client
    except Exception:
        return None
    conns = getattr(client, "_conns", None)
    if conns is None:
        return None
    return any(c.connected() for c in list(conns.values()))

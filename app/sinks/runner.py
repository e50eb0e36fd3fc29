"""Sinks as Faust agents: one agent per configured sink, like one Kafka Connect task each.

    sinks = register_sinks(app, topology, bootstrap=bootstrap)   # before the worker starts

For every `sinks:` entry of the topology, `register_sinks` adds an agent `prism-sink-<name>`
that consumes `<source>.v3` (or `.v2`, per `input`) of every topology source, and:

1. takes up to `batch_size` events, waiting at most `linger_ms` (`stream.take_events`);
2. decodes each value header-only (`SinkRecord.from_bytes`; bytes that are no envelope go
   to the DLQ as poison);
3. awaits `Delivery.deliver` (app.sinks.delivery): retries, the outage policy, the DLQ;
4. only then lets Faust acknowledge the batch, so offsets never pass an unwritten record.

Each sink has its own agent, stream buffer, retry loop and stats, so a slow or failing
sink does not slow the others' writes. Offsets, though, belong to the Faust app's consumer
group: agents of one app share it. Two sinks on the same topic in one app each process
every record, and the topic's offset commits once both have written it (a sink in outage
holds the other's commit back, never its writes; a replay after a crash is then absorbed
by the idempotent writes). For fully independent offsets - Kafka Connect's one group per
connector - run sinks in their own app: `make_sink_app` (or
`python -m app.worker.faust_app app.sinks.runner:app_from_env`), one app id per sink group.

Sinks do not use Faust tables, so the per-message current-event juggling of the pipeline
agent (table routing) is not needed here.
"""

from __future__ import annotations

import asyncio
import logging
import os
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import faust

from app.agents.base import Message
from app.agents.dlq import DlqRecord, fit_dlq_record
from app.errors import ConfigError, PrismError
from app.sinks.base import Sink, SinkRecord, SinkStats
from app.sinks.delivery import Delivery, OutagePolicy, dlq_topic_of
from app.sinks.nats import NatsSink
from app.sinks.postgres import PostgresSink
from app.sinks.redis_pubsub import RedisPubSubSink
from app.sinks.redis_stream import RedisStreamSink
from app.sinks.s3 import S3Sink
from app.topology import SinkSpec, Topology
from app.worker.limits import WriteLimits, max_request_from_env, record_size

if TYPE_CHECKING:
    from app.worker.dlq_overflow import OverflowStore

log = logging.getLogger("prism.sinks")

__all__ = ["SinkAgent", "app_from_env", "build_sink", "make_sink_app", "register_sinks", "sinks_summary"]

_REGISTERED: weakref.WeakKeyDictionary[faust.App, list[SinkAgent]] = weakref.WeakKeyDictionary()


def build_sink(spec: SinkSpec, topology: Topology | None = None) -> Sink[Any]:
    """The sink object for one `sinks:` entry (not yet started)."""
    if spec.type == "redis-pubsub":
        return RedisPubSubSink.from_spec(spec)
    if spec.type == "redis-stream":
        return RedisStreamSink.from_spec(spec)
    if spec.type == "postgres":
        return PostgresSink.from_spec(spec)
    if spec.type == "nats":
        subjects = [s.topic for s in topology.sources] if topology is not None else []
        return NatsSink.from_spec(spec, default_subjects=subjects)
    if spec.type == "s3":
        return S3Sink.from_spec(spec)
    raise ConfigError(f"unknown sink type {spec.type!r}", path=f"sinks.{spec.name}.type",  # pragma: no cover
                      hint="use redis-pubsub, redis-stream, postgres, nats or s3")


class SinkAgent:
    """One sink running as a Faust agent: its spec, sink, delivery loop and stats."""

    def __init__(self, app: faust.App, topology: Topology, spec: SinkSpec, *, bootstrap: str | None = None,
                 sink: Sink[Any] | None = None, on_batch: Callable[[SinkAgent], None] | None = None,
                 limit_for: Callable[[str], int] | None = None, overflow: OverflowStore | None = None) -> None:
        """`limit_for`: the DLQ topics' size limits as the pipeline worker knows them
        (`WriteLimits.limit_for`); None (a sinks-only app): read from the broker before the first
        dead letter. `overflow`: where a truncated dead letter's whole value goes (`dlq.overflow`)."""
        if spec.input not in topology.outputs.layouts:
            raise ConfigError(
                f"sink {spec.name!r} reads the {spec.input} output, but the topology publishes only "
                f"{topology.outputs.layouts}", path=f"sinks.{spec.name}.input",
                hint=f"add {spec.input} to outputs.layouts, or set input: {topology.outputs.layouts[0]}")
        self.app = app
        self.spec = spec
        self.bootstrap = bootstrap
        self.on_batch = on_batch
        self.sink = sink if sink is not None else build_sink(spec, topology)
        self.topics = [f"{s.topic}.{spec.input}" for s in topology.sources]
        suffix = topology.dlq.topic_suffix
        self._dlq_partitions = {s.topic + suffix: s.partitions for s in topology.sources}
        self._dlq_topics_ready = False
        self.limit_for = limit_for
        self.overflow = overflow
        #: a sinks-only app's own limits, read on the first dead letter
        self._limits: WriteLimits | None = None
        #: topics whose broker refused a DLQ record its known limit allowed: the limit learnt
        self._lowered: dict[str, int] = {}
        self.delivery = Delivery(self.sink, OutagePolicy.from_spec(spec), dlq=self._send_dlq,
                                 dlq_topic_for=lambda t: dlq_topic_of(t, suffix), should_abort=self._should_abort)
        self.batches = 0
        self.name = f"prism-sink-{spec.name}"
        topic = app.topic(*self.topics, key_type=bytes, value_type=bytes, key_serializer="raw",
                          value_serializer="raw")
        self.agent = app.agent(topic, name=self.name)(self._agent_fun())
        app.on_before_shutdown.connect(self._on_shutdown)

    @property
    def stats(self) -> SinkStats:
        return self.sink.stats

    async def healthy(self) -> bool:
        return await self.sink.healthy()

    def summary(self) -> dict[str, Any]:
        return {"name": self.spec.name, "type": self.spec.type, "topics": self.topics,
                "on_outage": self.spec.on_outage, **self.stats.as_dict()}

    # -- the agent -------------------------------------------------------------------------
    def _agent_fun(self) -> Callable[[Any], Any]:
        within = max(self.spec.linger_ms, 1) / 1000  # take_events(within=0) would wait for a full batch

        async def agent(stream: Any) -> None:
            try:
                await self.sink.start()
            except PrismError as exc:  # not fatal: every write reconnects; the outage policy applies
                log.warning("sink %s: backend not reachable at start-up (%s); writes will retry", self.spec.name,
                            exc)
            async for events in stream.take_events(self.spec.batch_size, within=within):
                await self._process(events)
        return agent

    async def _process(self, events: Sequence[Any]) -> None:
        if self.app.should_stop:
            _leave_unacknowledged(events)
            return
        records: list[SinkRecord] = []
        poison: list[tuple[Message, BaseException]] = []
        for ev in events:
            m = ev.message
            headers = tuple((k, v) for k, v in (m.headers or []) if v is not None)
            ts = int(m.timestamp * 1000) if m.timestamp else None
            try:
                records.append(SinkRecord.from_bytes(m.value or b"", topic=m.topic, partition=m.partition,
                                                     offset=m.offset, key=m.key, headers=headers, timestamp_ms=ts))
            except PrismError as exc:
                poison.append((Message(topic=m.topic, partition=m.partition, offset=m.offset, value=m.value or b"",
                                       key=m.key, headers=list(headers), timestamp_ms=ts), exc))
        if poison:
            self.stats.received += len(poison)
            self.stats.rejected += len(poison)
            log.warning("sink %s: %d record(s) are not envelopes and go to the DLQ (first: %s)", self.spec.name,
                        len(poison), poison[0][1])
            if not await self.delivery.dead_letter(poison):
                _leave_unacknowledged(events)
                return
        result = await self.delivery.deliver(records)
        if result.aborted:
            _leave_unacknowledged(events)
            return
        self.batches += 1
        if self.on_batch is not None:
            self.on_batch(self)

    def _should_abort(self) -> bool:
        return bool(self.app.should_stop or getattr(self.app, "rebalancing", False))

    async def _send_dlq(self, recs: Sequence[DlqRecord]) -> None:
        if not self._dlq_topics_ready and self.bootstrap:
            # Create DLQ topics with the source's partition count before the first dead letter:
            # a produce to a missing topic would auto-create it with the broker's default.
            from app.broker.admin import ensure_topics

            await ensure_topics(self.bootstrap, {t: self._dlq_partitions.get(t, 1) for t in {r.topic for r in recs}})
        self._dlq_topics_ready = True
        producer = self.app.producer
        # A sink's DLQ copy carries a whole output record plus context headers: cut it to what the
        # DLQ topic accepts - the smaller of the producer's limit and the topic's max.message.bytes
        # (app/worker/limits.py) - or the dead letter would fail, and be retried, forever.
        limit_for = self.limit_for or await self._own_limits(sorted({r.topic for r in recs}))
        put = None if self.overflow is None else self.overflow.put
        fitted = [fit_dlq_record(r, min(limit_for(r.topic), self._lowered.get(r.topic, 1 << 62)), put) for r in recs]
        for before, after in zip(recs, fitted, strict=True):
            if after is not before:
                log.warning("sink %s: the DLQ copy of %s/%s@%s is over the %d-byte limit of %s: written with its value "
                            "truncated to %d bytes", self.spec.name, *(_ctx(before, k) for k in ("topic", "partition",
                            "offset")), limit_for(before.topic), before.topic, len(after.value))
        futs = [await producer.send(r.topic, r.key, r.value, None, r.timestamp_ms / 1000 if r.timestamp_ms else None,
                                    r.headers) for r in fitted]
        results = await asyncio.gather(*futs, return_exceptions=True)
        for rec, res in zip(fitted, results, strict=True):
            if isinstance(res, BaseException):
                if _is_size_error(res):  # the broker's limit is below the known one: learn it, cut again on retry
                    size = record_size(rec.key, rec.value, rec.headers)
                    self._lowered[rec.topic] = max(1024, size // 2)
                    log.warning("sink %s: the broker refused a %d-byte DLQ record for %s (%s); its limit is lower than "
                                "known: now %d bytes", self.spec.name, size, rec.topic, res, self._lowered[rec.topic])
                raise res

    async def _own_limits(self, topics: list[str]) -> Callable[[str], int]:
        """A sinks-only app's DLQ limits: the producer's, lowered to each topic's
        `max.message.bytes` as the broker reports it (once per topic)."""
        max_request = int(self.app.conf.producer_max_request_size)
        if self._limits is None:
            self._limits = WriteLimits(max_request)
        missing = [t for t in topics if t not in self._limits.topic_limits and t not in self._limits.unknown]
        if missing and self.bootstrap:
            from app.broker.admin import read_max_message_bytes

            values, why = await read_max_message_bytes(self.bootstrap, missing)
            known = {**self._limits.topic_limits, **{t: v for t, v in values.items() if v}}
            unknown = {**self._limits.unknown, **{t: why.get(t, "not reported") for t, v in values.items() if not v}}
            self._limits = WriteLimits(max_request, known, unknown)
        return self._limits.limit_for

    async def _on_shutdown(self, *args: Any, **kwargs: Any) -> None:
        await self.sink.stop()


def _is_size_error(err: BaseException) -> bool:
    from aiokafka.errors import MessageSizeTooLargeError, RecordListTooLargeError, RecordTooLargeError

    return isinstance(err, MessageSizeTooLargeError | RecordTooLargeError | RecordListTooLargeError)


def _ctx(rec: DlqRecord, name: str) -> str:
    return next((v.decode(errors="replace") for k, v in rec.headers if k == "prism.errors." + name), "?")


def _leave_unacknowledged(events: Sequence[Any]) -> None:
    """Make sure the offsets of `events` are NOT committed, although `take_events` will
    "ack" them when the loop body returns.

    Faust marks an offset committable in `Consumer.ack`, which runs only for a message whose
    `acked` flag is still False; setting it here makes that later ack a no-op and lets
    Faust's `wait_empty` stop waiting for these messages (it drops messages flagged acked).
    The committed offset then stays below them, and they are delivered again after the
    restart or rebalance - at-least-once, without blocking shutdown on a dead backend.
    """
    for ev in events:
        ev.message.acked = True


def register_sinks(app: faust.App, topology: Topology, *, bootstrap: str | None = None,
                   on_batch: Callable[[SinkAgent], None] | None = None, limit_for: Callable[[str], int] | None = None,
                   overflow: OverflowStore | None = None) -> list[SinkAgent]:
    """Add one Faust agent per `topology.sinks` entry to `app` (call before the worker starts).

    `bootstrap` is the Kafka the app talks to; it is used to create DLQ topics with the
    declared partition counts before a sink's first dead letter. Calling this twice for the
    same app returns the agents of the first call (an agent name can exist only once).
    """
    existing = _REGISTERED.get(app)
    if existing is not None:
        return existing
    agents = [SinkAgent(app, topology, spec, bootstrap=bootstrap, on_batch=on_batch, limit_for=limit_for,
                        overflow=overflow) for spec in topology.sinks]
    _REGISTERED[app] = agents
    return agents


def sinks_summary(agents: Sequence[SinkAgent]) -> dict[str, dict[str, Any]]:
    return {a.spec.name: a.summary() for a in agents}


def make_sink_app(topology: Topology, *, bootstrap: str, data_dir: str | Path, app_id: str | None = None,
                  embedded: bool = False, **faust_overrides: Any) -> tuple[faust.App, list[SinkAgent]]:
    """A Faust app that runs only the topology's sinks, in its own consumer group
    (`prism-<topology>-sinks` unless `app_id` is given): the Kafka Connect worker shape,
    where a sink's offsets are independent of the pipeline's."""
    from app.worker.faust_app import make_app

    if not topology.sinks:
        raise ConfigError("the topology configures no sinks", path="sinks",
                          hint="add a `sinks:` list (see docs/sinks.md)")
    parts = max(s.partitions for s in topology.sources)
    from app.worker.dlq_overflow import build_overflow

    overflow = build_overflow(topology)  # checked before any broker, like the pipeline worker's
    app = make_app(app_id or f"prism-{topology.name}-sinks", bootstrap, data_dir, partitions=parts, embedded=embedded,
                   **faust_overrides)
    return app, register_sinks(app, topology, bootstrap=bootstrap, overflow=overflow)


def app_from_env() -> faust.App:
    """Factory for `python -m app.worker.faust_app app.sinks.runner:app_from_env`.

    Reads PRISM_TOPOLOGY, PRISM_BOOTSTRAP, PRISM_DATA_DIR, PRISM_APP_ID, PRISM_EMBEDDED and
    PRISM_MAX_REQUEST_BYTES (app/worker/limits.py)."""
    from app.topology import load_topology

    missing = [k for k in ("PRISM_TOPOLOGY", "PRISM_BOOTSTRAP", "PRISM_DATA_DIR") if not os.environ.get(k)]
    if missing:
        raise ConfigError(f"missing environment variable(s) {missing}", hint="set them before starting the sinks")
    max_request = max_request_from_env()
    overrides: dict[str, Any] = {} if max_request is None else {"producer_max_request_size": max_request}
    app, _ = make_sink_app(load_topology(os.environ["PRISM_TOPOLOGY"]), bootstrap=os.environ["PRISM_BOOTSTRAP"],
                           data_dir=os.environ["PRISM_DATA_DIR"], app_id=os.environ.get("PRISM_APP_ID"),
                           embedded=os.environ.get("PRISM_EMBEDDED") == "1", **overrides)
    return app

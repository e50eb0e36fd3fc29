"""OpenTelemetry tracing for the pipeline: one trace per message, one span per stage.

Trace model: the producer (SDK) span's context travels in the envelope's observability
context (and the `traceparent`/`tracestate` Kafka headers). Each worker stage opens a span
that is a CHILD of the context the message carries, records what happened to the message
(`prism.outcome` = emitted | dlq | expired | duplicate, plus `prism.dlq.reason`), and writes
its own context back into the envelope, so the next stage / hop / consumer continues the
same trace. Incoming contexts are validated by `app.observability.tracecontext` first, and
only a normalized W3C carrier is given to OTel's `TraceContextTextMapPropagator`: a
malformed `traceparent` therefore restarts the trace instead of crashing or propagating.

Span attributes are an allowlist: message id, topic, partition, offset, stage, namespace.
Never the token, signature, keys, labels or payload; exception messages are NOT recorded
(they can quote secrets) - only the exception type and the `PrismError.code`.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SimpleSpanProcessor,
    SpanExporter,
)
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import Sampler
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace import TraceState as OTelTraceState
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from app.errors import ConfigError, PrismError
from app.observability import tracecontext as tc
from app.observability.logging import bind_log_context, reset_log_context

if TYPE_CHECKING:
    from app.envelope.model import Envelope
    from app.observability.metrics import PipelineMetrics
    from app.observability.redaction import Redactor

EXPORTERS = ("otlp", "console", "none", "memory")
ENV_EXPORTER = "PRISM_TRACES_EXPORTER"

OUTCOME = "prism.outcome"
DLQ_REASON = "prism.dlq.reason"
OUTCOMES = frozenset({"emitted", "dlq", "expired", "duplicate"})

PROPAGATOR = TraceContextTextMapPropagator()


# --------------------------------------------------------------------------- setup


@dataclass
class TracingSetup:
    """The provider `configure_tracing` built. `exporter` is the InMemorySpanExporter for
    "memory" (tests read spans from it), else the exporter in use or None."""

    provider: TracerProvider
    exporter: SpanExporter | None
    exporter_name: str

    def tracer(self, name: str = "prism.worker") -> trace.Tracer:
        return self.provider.get_tracer(name)

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return self.provider.force_flush(timeout_millis)

    def shutdown(self) -> None:
        """Flush queued spans and stop the exporter (call at worker shutdown)."""
        self.provider.shutdown()


def configure_tracing(
    exporter: str = "none",
    service_name: str = "prism-worker",
    *,
    endpoint: str | None = None,
    sampler: Sampler | None = None,
    resource_attributes: Mapping[str, str] | None = None,
    set_global: bool = False,
    console_out: IO[str] | None = None,
) -> TracingSetup:
    """Build a TracerProvider for `exporter`:

    * "otlp": OTLP/HTTP protobuf, batched; `endpoint` or `OTEL_EXPORTER_OTLP_ENDPOINT`
      / `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` (the exporter reads the standard OTEL_* vars);
    * "console": JSON spans on `console_out` (default: the current stdout), batched;
    * "none": spans are created and their context propagated downstream, nothing exported;
    * "memory": in-memory exporter, synchronous (tests).

    `sampler=None` lets the SDK read `OTEL_TRACES_SAMPLER` (default parent-based always-on).
    `set_global=False` keeps the provider private (tests build many); the worker may pass True.
    """
    name = (exporter or "none").strip().lower()
    if name not in EXPORTERS:
        raise ConfigError(f"unknown traces exporter {exporter!r}", path=ENV_EXPORTER,
                          hint=f"use one of {', '.join(EXPORTERS)}")
    attrs = {"service.name": service_name, **(resource_attributes or {})}
    provider = TracerProvider(resource=Resource.create(attrs), sampler=sampler)
    span_exporter: SpanExporter | None = None
    if name == "otlp":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        if endpoint:
            endpoint = endpoint.rstrip("/")
            if not endpoint.endswith("/v1/traces"):
                endpoint += "/v1/traces"
        span_exporter = OTLPSpanExporter(endpoint=endpoint) if endpoint else OTLPSpanExporter()
        provider.add_span_processor(BatchSpanProcessor(span_exporter))
    elif name == "console":
        span_exporter = ConsoleSpanExporter(service_name=service_name, out=console_out or sys.stdout)
        provider.add_span_processor(BatchSpanProcessor(span_exporter))
    elif name == "memory":
        span_exporter = InMemorySpanExporter()
        provider.add_span_processor(SimpleSpanProcessor(span_exporter))
    if set_global:
        trace.set_tracer_provider(provider)
    return TracingSetup(provider, span_exporter, name)


def configure_tracing_from_env(service_name: str = "prism-worker", env: Mapping[str, str] | None = None) -> TracingSetup:
    """`PRISM_TRACES_EXPORTER=otlp|console|none` (default none); OTLP settings from OTEL_*."""
    env = os.environ if env is None else env
    return configure_tracing(env.get(ENV_EXPORTER, "none"), service_name,
                             endpoint=env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or None)


# --------------------------------------------------------------------------- propagation


def extract_context(envelope: Envelope | None, headers: tc.HeadersLike | None = None) -> Context:
    """The OTel context a message carries (envelope first, then headers), or an empty
    Context - which makes the next span a new root, i.e. restarts the trace.

    Goes through OTel's W3C propagator with a normalized carrier: the API for consumers and
    the SDK, and the reference `stage_span`'s fast path is tested against."""
    carrier = tc.carrier_from(envelope, headers)
    if not carrier:
        return Context()
    return PROPAGATOR.extract(carrier)


def _context_from(incoming: tc.Incoming) -> Context:
    """The context `PROPAGATOR.extract(carrier_from(...))` returns, built directly from the
    already validated incoming context. Why: the propagator re-parses the carrier with its own
    regex, ~4 µs per stage per message measured here, for a result that is identical
    (tests/observability/test_tracing.py::test_fast_context_equals_the_propagators)."""
    tp = incoming.traceparent
    if tp is None:
        return Context()
    state = OTelTraceState(list(incoming.tracestate.items())) if incoming.tracestate else None
    sc = trace.SpanContext(trace_id=int(tp.trace_id, 16), span_id=int(tp.parent_id, 16), is_remote=True,
                           trace_flags=trace.TraceFlags(tp.propagated_flags()), trace_state=state)
    return trace.set_span_in_context(trace.NonRecordingSpan(sc), Context())


def inject_into_envelope(span: trace.Span, envelope: Envelope) -> bool:
    """Write `span`'s context into the envelope so the next hop continues this trace.

    The envelope's previous span id becomes `parent_span_id` (the span's real parent when
    the SDK knows it). A span with an invalid context (tracing disabled and nothing to
    continue) writes nothing and returns False. Re-injecting the same span is a no-op.
    """
    sc = span.get_span_context()
    if not sc.is_valid:
        return False
    obs = envelope.observability
    trace_id = trace.format_trace_id(sc.trace_id)
    span_id = trace.format_span_id(sc.span_id)
    if obs is not None and obs.trace_id == trace_id and obs.span_id == span_id:
        return True
    parent_ctx = getattr(span, "parent", None)
    if parent_ctx is not None and parent_ctx.is_valid:
        parent = trace.format_span_id(parent_ctx.span_id)
    elif obs is not None and obs.trace_id == trace_id and tc.is_valid_span_id(obs.span_id):
        parent = obs.span_id
    else:
        parent = None
    state = sc.trace_state.to_header() if sc.trace_state else None  # OTel validated its entries
    tc.write_envelope_context(envelope, trace_id, span_id, parent, int(sc.trace_flags) & tc.KNOWN_FLAGS, state)
    return True


def inject_into_headers(span: trace.Span, headers: list[tuple[str, bytes]] | None = None) -> list[tuple[str, bytes]]:
    """`traceparent`/`tracestate` Kafka headers for `span` (via OTel's propagator).
    Existing trace headers in `headers` are replaced, other headers kept. A span with an
    invalid context (tracing disabled) leaves the headers as they were: unmodified
    propagation, which the spec allows a non-participating hop."""
    carrier: dict[str, str] = {}
    PROPAGATOR.inject(carrier, context=trace.set_span_in_context(span))
    if not carrier:
        return list(headers or [])
    out = [(k, v) for k, v in (headers or []) if k.lower() not in (tc.TRACEPARENT, tc.TRACESTATE)]
    out += [(k, v.encode("ascii")) for k, v in carrier.items()]
    return out


# --------------------------------------------------------------------------- stage spans


class StageSpan:
    """Context manager returned by `stage_span`; call one outcome method inside it.

    Without an explicit outcome, a body that completes is "emitted"; one that raises a
    PrismError is "dlq" with the error's code as reason (ExpiredError -> "expired",
    DuplicateError -> "duplicate"), since the worker routes every PrismError that way.
    Other exceptions mark the span as an error without an outcome, and re-raise.
    """

    __slots__ = (
        "_ctx_token",
        "_labels",
        "_log_token",
        "_t0",
        "envelope",
        "headers",
        "kind",
        "metrics",
        "offset",
        "out_topic",
        "outcome",
        "partition",
        "propagate",
        "reason",
        "redactor",
        "span",
        "stage",
        "topic",
        "tracer",
    )

    def __init__(self, tracer: trace.Tracer, stage: str, envelope: Envelope, topic: str, partition: int | None,
                 *, headers: tc.HeadersLike | None, offset: int | None, kind: SpanKind,
                 metrics: PipelineMetrics | None, redactor: Redactor | None, propagate: bool) -> None:
        self.tracer = tracer
        self.stage = stage
        self.envelope = envelope
        self.topic = topic
        self.partition = partition
        self.headers = headers
        self.offset = offset
        self.kind = kind
        self.metrics = metrics
        self.redactor = redactor
        self.propagate = propagate
        self.outcome: str | None = None
        self.reason: str | None = None
        self.out_topic: str | None = None
        self.span: trace.Span = trace.INVALID_SPAN

    # -- outcomes ---------------------------------------------------------------------------
    def set_outcome(self, outcome: str, reason: str | None = None) -> None:
        if outcome not in OUTCOMES:
            raise ConfigError(f"unknown stage outcome {outcome!r}", path="prism.outcome",
                              hint=f"use one of {sorted(OUTCOMES)}")
        self.outcome = outcome
        self.reason = reason

    def emitted(self, topic: str | None = None) -> None:
        """The message (or its transformation) was emitted, to `topic` if it differs from the input."""
        self.set_outcome("emitted")
        self.out_topic = topic

    def dlq(self, reason: str | PrismError) -> None:
        self.set_outcome("dlq", reason.code if isinstance(reason, PrismError) else reason)

    def expired(self) -> None:
        self.set_outcome("expired")

    def duplicate(self) -> None:
        self.set_outcome("duplicate")

    # -- context manager --------------------------------------------------------------------
    def __enter__(self) -> StageSpan:
        env = self.envelope
        md = env.header.metadata
        msg_id = md.message_id
        if isinstance(self.tracer, trace.NoOpTracer):
            # Tracing disabled: no OTel work at all, but the message's context is still
            # validated - passed through unchanged when valid, restarted when garbage.
            self._ctx_token = None
            if self.propagate:
                _pass_through(env, self.headers)
        else:
            self._start_span(env, msg_id, md.namespace)
        obs = env.observability
        log_fields: dict[str, Any] = {"message_id": msg_id, "topic": self.topic, "stage": self.stage}
        if self.partition is not None:
            log_fields["partition"] = self.partition
        if obs is not None and obs.trace_id:
            log_fields["trace_id"] = obs.trace_id
            log_fields["span_id"] = obs.span_id
        self._log_token = bind_log_context(log_fields)
        if self.metrics is not None:
            self._labels = self.metrics.labels.of(env)
            self.metrics.message_in(self.topic, self.stage, label_values=self._labels)
        self._t0 = time.perf_counter()
        return self

    def _start_span(self, env: Envelope, msg_id: str, ns: str) -> None:
        parent = _context_from(tc.read_incoming(env, self.headers))
        attrs: dict[str, Any] = {
            "messaging.system": "kafka",
            "messaging.operation.type": "process",
            "messaging.destination.name": self.topic,
            "prism.stage": self.stage,
        }
        red = self.redactor
        if msg_id:
            attrs["messaging.message.id"] = red.redact(msg_id) if red else msg_id
        if ns:
            attrs["prism.namespace"] = red.redact(ns) if red else ns
        if self.partition is not None:
            attrs["messaging.destination.partition.id"] = str(self.partition)
        if self.offset is not None:
            attrs["messaging.kafka.offset"] = self.offset
        span = self.tracer.start_span(f"{self.stage} {self.topic}", context=parent, kind=self.kind,
                                      attributes=attrs, record_exception=False, set_status_on_exception=False)
        self.span = span
        if self.propagate and not inject_into_envelope(span, env):
            # A tracer that gives invalid span contexts and nothing valid to continue: a context
            # that is present is garbage - restart it rather than pass it on.
            obs = env.observability
            if obs is not None and (obs.trace_id or obs.span_id):
                tc.continue_or_start(env)
        self._ctx_token = otel_context.attach(trace.set_span_in_context(span, parent))

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        elapsed = time.perf_counter() - self._t0
        span = self.span
        recording = span.is_recording()  # unsampled / no-op spans: skip attribute work
        try:
            if exc is not None and self.outcome is None:
                if isinstance(exc, PrismError):
                    if exc.code in ("expired", "duplicate"):
                        self.outcome = exc.code
                    else:
                        self.outcome, self.reason = "dlq", exc.code
                if isinstance(exc, Exception) and recording:
                    span.set_attribute("error.type", type(exc).__qualname__)
                    desc = exc.code if isinstance(exc, PrismError) else type(exc).__qualname__
                    span.set_status(Status(StatusCode.ERROR, desc))
            elif exc is None and self.outcome is None:
                self.outcome = "emitted"
            if self.outcome is not None and recording:
                span.set_attribute(OUTCOME, self.outcome)
                if self.outcome == "dlq":
                    reason = (self.reason or "unspecified")[:128]
                    span.set_attribute(DLQ_REASON, self.redactor.redact(reason) if self.redactor else reason)
            m = self.metrics
            if m is not None:
                m.observe_latency(self.topic, self.stage, elapsed)
                if self.outcome == "emitted":
                    m.message_out(self.out_topic or self.topic, self.stage, label_values=self._labels)
                elif self.outcome == "dlq":
                    m.dlq(self.topic, self.stage, self.reason or "unspecified", label_values=self._labels)
                elif self.outcome == "expired":
                    m.expired(self.topic, self.stage, self.envelope)
                elif self.outcome == "duplicate":
                    m.dedup_hit(self.topic, self.stage, self.envelope)
        finally:
            span.end()
            reset_log_context(self._log_token)
            if self._ctx_token is not None:
                otel_context.detach(self._ctx_token)


def _pass_through(env: Envelope, headers: tc.HeadersLike | None) -> None:
    """Non-participating hop (W3C "unmodified propagation"): keep a valid context as it is
    (copying it from the headers into an envelope that has none), restart garbage, and
    leave an absent context absent (a disabled tracer does not originate traces)."""
    inc = tc.read_incoming(env, headers)
    tp = inc.traceparent
    if tp is None:
        obs = env.observability
        if obs is not None and (obs.trace_id or obs.span_id):
            tc.continue_or_start(env)
    elif inc.source == "headers":
        tc.write_envelope_context(env, tp.trace_id, tp.parent_id, None, tp.propagated_flags(), inc.tracestate)


def stage_span(
    tracer: trace.Tracer,
    stage: str,
    envelope: Envelope,
    topic: str,
    partition: int | None = None,
    *,
    headers: tc.HeadersLike | None = None,
    offset: int | None = None,
    kind: SpanKind = SpanKind.CONSUMER,
    metrics: PipelineMetrics | None = None,
    redactor: Redactor | None = None,
    propagate: bool = True,
) -> StageSpan:
    """Open the span for one stage processing one message (use as `with ... as s:`).

    The span is a child of the message's trace context (envelope, else `headers`); with
    `propagate` the envelope is updated on entry, so anything the stage emits - output,
    DLQ record - carries this span as its parent. Inside, the span is the current OTel span
    and the log context holds message_id/topic/stage/trace_id. With `metrics`, messages
    in/out, DLQ/expired/dedup counters and the stage latency histogram are recorded too.
    `redactor` (optional) is applied to the producer-supplied attribute values.
    """
    return StageSpan(tracer, stage, envelope, topic, partition, headers=headers, offset=offset, kind=kind,
                     metrics=metrics, redactor=redactor, propagate=propagate)

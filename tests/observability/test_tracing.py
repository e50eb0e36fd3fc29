"""Stage spans read back from the in-memory exporter: one connected trace from the producer
(SDK) through the worker's stages to the consumer, restarts on invalid contexts, outcome
attributes, and no secrets in any span."""

from __future__ import annotations

import io
import json
import logging

import pytest
from opentelemetry import trace
from opentelemetry.trace import SpanKind, StatusCode

from app.envelope import Layout, decode, encode, new_envelope
from app.errors import ConfigError, DuplicateError, ExpiredError, SignatureError
from app.observability import tracecontext as tc
from app.observability.logging import configure_logging
from app.observability.metrics import PipelineMetrics
from app.observability.redaction import Redactor
from app.observability.tracing import (
    DLQ_REASON,
    OUTCOME,
    _context_from,
    configure_tracing,
    configure_tracing_from_env,
    extract_context,
    inject_into_envelope,
    inject_into_headers,
    stage_span,
)

TOKEN = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJjYW5hcnktdG9rZW4tOTE3MyJ9.c2lnbmF0dXJlLWNhbmFyeQ"
PII = "canary-pii-alice@example.invalid"
LABEL_CANARY = "canary-label-7781"
SIG = b"\x9c" * 64


@pytest.fixture
def tracing():
    setup = configure_tracing("memory", "prism-test")
    yield setup
    setup.shutdown()


def _span_by_name(spans, name):
    (span,) = [s for s in spans if s.name == name]
    return span


def _secret_envelope():
    env = new_envelope("orders.created", {"customer_email": PII, "total": 42}, namespace="orders",
                       labels={"tenant": LABEL_CANARY})
    sec = env.ensure_security()
    sec.auth_token = TOKEN
    sec.signature = SIG
    sec.signature_algorithm = "hmac-sha256"
    return env


def _all_span_text(spans) -> str:
    return "\n".join(s.to_json() for s in spans)


def test_sdk_to_worker_stages_to_consumer_is_one_connected_trace(tracing):
    sdk, worker, consumer = tracing.tracer("prism.sdk"), tracing.tracer("prism.worker"), tracing.tracer("app")

    # Producer (what the SDK does): its span context goes into the envelope and the headers.
    with sdk.start_as_current_span("publish orders.created", kind=SpanKind.PRODUCER) as producer_span:
        env = _secret_envelope()
        assert inject_into_envelope(producer_span, env)
        headers = inject_into_headers(producer_span, [("prism-message-id", env.message_id.encode())])
    wire = encode(env, Layout.REVIEWED)

    # Worker: decode, two stages, re-encode for the output topic (draft layout, as for .v2).
    got = decode(wire)
    with stage_span(worker, "validate", got, "orders.created", 3, headers=headers, offset=17) as s:
        s.emitted()
    with stage_span(worker, "enrich", got, "orders.created", 3, headers=headers) as s:
        s.emitted("orders.created.v2")
    out_headers = inject_into_headers(trace.INVALID_SPAN, headers)  # (no-op for an invalid span)
    assert out_headers == headers
    out_wire = encode(got, Layout.DRAFT)

    # Consumer: continues from the envelope it receives.
    received = decode(out_wire)
    with consumer.start_as_current_span("process order", context=extract_context(received), kind=SpanKind.CONSUMER):
        pass

    spans = tracing.exporter.get_finished_spans()
    producer = _span_by_name(spans, "publish orders.created")
    validate = _span_by_name(spans, "validate orders.created")
    enrich = _span_by_name(spans, "enrich orders.created")
    process = _span_by_name(spans, "process order")
    trace_ids = {s.context.trace_id for s in spans}
    assert trace_ids == {producer.context.trace_id}
    assert producer.parent is None
    assert validate.parent.span_id == producer.context.span_id
    assert enrich.parent.span_id == validate.context.span_id
    assert process.parent.span_id == enrich.context.span_id
    assert validate.kind == SpanKind.CONSUMER

    # The envelope records the chain too: its span is the last stage, parent the one before.
    obs = received.observability
    assert obs.trace_id == trace.format_trace_id(producer.context.trace_id)
    assert obs.span_id == trace.format_span_id(enrich.context.span_id)
    assert obs.parent_span_id == trace.format_span_id(validate.context.span_id)

    # Attributes: the allowlisted ones, and the outcome.
    a = validate.attributes
    assert a["messaging.message.id"] == env.message_id
    assert a["messaging.destination.name"] == "orders.created"
    assert a["messaging.destination.partition.id"] == "3"
    assert a["messaging.kafka.offset"] == 17
    assert a["prism.stage"] == "validate"
    assert a["prism.namespace"] == "orders"
    assert a[OUTCOME] == "emitted"

    text = _all_span_text(spans)
    for canary in (TOKEN, PII, LABEL_CANARY, SIG.hex()):
        assert canary not in text


def test_headers_alone_continue_the_trace(tracing):
    tracer = tracing.tracer()
    env = new_envelope("t", b"x", namespace="n")
    tid, pid = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    headers = [("traceparent", f"00-{tid}-{pid}-01".encode()), ("tracestate", b"congo=t61rcWkgMzE")]
    with stage_span(tracer, "ingest", env, "t", 0, headers=headers) as s:
        hdrs = dict(inject_into_headers(s.span, headers))
    (span,) = tracing.exporter.get_finished_spans()
    assert trace.format_trace_id(span.context.trace_id) == tid
    assert trace.format_span_id(span.parent.span_id) == pid
    assert span.parent.is_remote
    assert span.context.trace_state.to_header() == "congo=t61rcWkgMzE"
    assert env.extensions[tc.TRACESTATE_EXTENSION] == b"congo=t61rcWkgMzE"
    assert hdrs["traceparent"].decode() == f"00-{tid}-{trace.format_span_id(span.context.span_id)}-01"
    assert hdrs["tracestate"] == b"congo=t61rcWkgMzE"


@pytest.mark.parametrize(
    "traceparent",
    ["00-00000000000000000000000000000000-00f067aa0ba902b7-01",
     "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
     "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
     "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
     "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
     "garbage"],
    ids=["zero_trace", "zero_parent", "version_ff", "uppercase", "v00_extra_field", "garbage"],
)
def test_invalid_traceparent_header_restarts_the_trace(tracing, traceparent):
    env = new_envelope("t", b"x", namespace="n")
    headers = [("traceparent", traceparent.encode()), ("tracestate", b"congo=must-not-survive")]
    with stage_span(tracing.tracer(), "ingest", env, "t", 0, headers=headers):
        pass
    (span,) = tracing.exporter.get_finished_spans()
    assert span.parent is None  # a new root: the trace was restarted
    assert "4bf92f3577b34da6a3ce929d0e0e4736" not in (env.observability.trace_id, )
    assert tc.is_valid_trace_id(env.observability.trace_id)
    assert env.observability.parent_span_id == ""
    assert tc.TRACESTATE_EXTENSION not in env.extensions
    assert not span.context.trace_state


def test_invalid_envelope_context_restarts_even_with_the_sdk(tracing):
    env = new_envelope("t", b"x", namespace="n")
    obs = env.ensure_observability()
    obs.trace_id, obs.span_id = "0" * 32, "00f067aa0ba902b7"
    env.extensions[tc.TRACESTATE_EXTENSION] = b"congo=x"
    with stage_span(tracing.tracer(), "ingest", env, "t"):
        pass
    (span,) = tracing.exporter.get_finished_spans()
    assert span.parent is None
    assert env.observability.trace_id == trace.format_trace_id(span.context.trace_id) != "0" * 32
    assert tc.TRACESTATE_EXTENSION not in env.extensions


@pytest.mark.parametrize(
    ("raise_exc", "outcome", "reason"),
    [(SignatureError("signature does not match"), "dlq", "bad_signature"),
     (ExpiredError("ttl passed"), "expired", None),
     (DuplicateError("seen"), "duplicate", None)],
    ids=["dlq", "expired", "duplicate"],
)
def test_prism_errors_set_the_outcome_and_propagate(tracing, raise_exc, outcome, reason):
    env = new_envelope("t", b"x", namespace="n")
    with pytest.raises(type(raise_exc)), stage_span(tracing.tracer(), "verify", env, "t", 1):
        raise raise_exc
    (span,) = tracing.exporter.get_finished_spans()
    assert span.attributes[OUTCOME] == outcome
    assert span.attributes.get(DLQ_REASON) == reason
    assert span.status.status_code == StatusCode.ERROR
    assert span.attributes["error.type"] == type(raise_exc).__qualname__


def test_explicit_outcomes(tracing):
    tracer = tracing.tracer()
    for name, action in [("a", lambda s: s.duplicate()), ("b", lambda s: s.expired()),
                         ("c", lambda s: s.dlq("schema_mismatch")), ("d", lambda s: s.dlq(SignatureError("x")))]:
        with stage_span(tracer, name, new_envelope("t", b"x", namespace="n"), "t") as s:
            action(s)
    got = {s.name: (s.attributes[OUTCOME], s.attributes.get(DLQ_REASON)) for s in tracing.exporter.get_finished_spans()}
    assert got == {"a t": ("duplicate", None), "b t": ("expired", None), "c t": ("dlq", "schema_mismatch"),
                   "d t": ("dlq", "bad_signature")}
    with pytest.raises(ConfigError), stage_span(tracer, "e", new_envelope("t", b"x", namespace="n"), "t") as s:
        s.set_outcome("vanished")


def test_exception_messages_with_secrets_never_reach_spans(tracing):
    env = _secret_envelope()
    with pytest.raises(ValueError), stage_span(tracing.tracer(), "transform", env, "orders.created"):
        raise ValueError(f"cannot parse {TOKEN} for {PII}")
    with pytest.raises(SignatureError), stage_span(tracing.tracer(), "verify", env, "orders.created"):
        raise SignatureError(f"bad token {TOKEN}")
    spans = tracing.exporter.get_finished_spans()
    transform = _span_by_name(spans, "transform orders.created")
    assert transform.status.status_code == StatusCode.ERROR
    assert OUTCOME not in transform.attributes  # not a known outcome: an unexpected crash
    text = _all_span_text(spans)
    assert TOKEN not in text and PII not in text and "eyJ" not in text


def test_redactor_applies_to_producer_supplied_attributes(tracing):
    red = Redactor()
    red.register_secret("canary-ns-secret")
    env = new_envelope("t", b"x", namespace="canary-ns-secret", message_id=f"id-{TOKEN}")
    with stage_span(tracing.tracer(), "s", env, "t", redactor=red) as s:
        s.dlq(f"reason with {TOKEN}")
    text = _all_span_text(tracing.exporter.get_finished_spans())
    assert "canary-ns-secret" not in text and TOKEN not in text


def test_noop_tracer_passes_valid_context_through_and_restarts_garbage():
    tracer = trace.NoOpTracer()
    tid, pid = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    env = new_envelope("t", b"x", namespace="n")
    obs = env.ensure_observability()
    obs.trace_id, obs.span_id, obs.trace_flags = tid, pid, 1
    with stage_span(tracer, "s", env, "t"):
        pass
    assert (env.observability.trace_id, env.observability.span_id) == (tid, pid)  # unmodified pass-through

    bad = new_envelope("t", b"x", namespace="n")
    bad.ensure_observability().trace_id = "not-a-trace-id"
    with stage_span(tracer, "s", bad, "t"):
        pass
    assert tc.is_valid_trace_id(bad.observability.trace_id)
    assert tc.is_valid_span_id(bad.observability.span_id)

    absent = new_envelope("t", b"x", namespace="n")
    with stage_span(tracer, "s", absent, "t") as s:
        assert inject_into_headers(s.span, [("traceparent", b"keep-as-is")]) == [("traceparent", b"keep-as-is")]
    assert absent.observability is None

    from_headers = new_envelope("t", b"x", namespace="n")
    headers = [("traceparent", f"00-{tid}-{pid}-01".encode()), ("tracestate", b"rojo=1")]
    with stage_span(tracer, "s", from_headers, "t", headers=headers):
        pass
    obs = from_headers.observability
    assert (obs.trace_id, obs.span_id, obs.parent_span_id, obs.trace_flags) == (tid, pid, "", 1)
    assert from_headers.extensions[tc.TRACESTATE_EXTENSION] == b"rojo=1"


def test_stage_span_records_metrics(tracing):
    m = PipelineMetrics()
    tracer = tracing.tracer()
    for _ in range(3):
        with stage_span(tracer, "route", new_envelope("in", b"x", namespace="n"), "in", metrics=m) as s:
            s.emitted("out")
    with stage_span(tracer, "route", new_envelope("in", b"x", namespace="n"), "in", metrics=m) as s:
        s.dlq("bad_signature")
    with pytest.raises(DuplicateError), stage_span(tracer, "route", new_envelope("in", b"x", namespace="n"), "in",
                                                   metrics=m):
        raise DuplicateError("seen")
    r = m.registry
    ns = {"envelope_namespace": "n", "schema_version": ""}  # every message metric names the envelope's namespace
    assert r.get_sample_value("prism_messages_in_total", {"topic": "in", "stage": "route", **ns}) == 5
    assert r.get_sample_value("prism_messages_out_total", {"topic": "out", "stage": "route", **ns}) == 3
    assert r.get_sample_value("prism_dlq_messages_total",
                              {"topic": "in", "stage": "route", "reason": "bad_signature", **ns}) == 1
    assert r.get_sample_value("prism_dedup_hits_total", {"topic": "in", "stage": "route"}) == 1
    assert r.get_sample_value("prism_stage_latency_seconds_count", {"topic": "in", "stage": "route"}) == 5


def test_logs_inside_a_stage_carry_message_and_trace_ids(tracing):
    stream = io.StringIO()
    setup = configure_logging("INFO", stream=stream, redactor=Redactor())
    try:
        env = new_envelope("t", b"x", namespace="n")
        with stage_span(tracing.tracer(), "enrich", env, "t", 2):
            logging.getLogger("prism.worker").info("enriched")
    finally:
        setup.close()
    line = json.loads(stream.getvalue().splitlines()[-1])
    (span,) = tracing.exporter.get_finished_spans()
    assert line["message_id"] == env.message_id
    assert line["stage"] == "enrich" and line["topic"] == "t" and line["partition"] == 2
    assert line["trace_id"] == trace.format_trace_id(span.context.trace_id)
    assert line["span_id"] == trace.format_span_id(span.context.span_id)


def test_configure_tracing_exporters(monkeypatch):
    with pytest.raises(ConfigError):
        configure_tracing("zipkin")
    none = configure_tracing("none")
    assert none.exporter is None
    with stage_span(none.tracer(), "s", env := new_envelope("t", b"x", namespace="n"), "t"):
        pass
    assert tc.is_valid_trace_id(env.observability.trace_id)  # "none" still propagates context
    none.shutdown()

    out = io.StringIO()
    console = configure_tracing("console", "prism-console", console_out=out)
    with stage_span(console.tracer(), "s", new_envelope("t", b"x", namespace="n"), "t"):
        pass
    console.shutdown()
    assert json.loads(out.getvalue())["name"] == "s t"

    otlp = configure_tracing("otlp", endpoint="http://127.0.0.1:4318")
    assert otlp.exporter._endpoint == "http://127.0.0.1:4318/v1/traces"
    otlp.shutdown()  # nothing queued: no network traffic

    monkeypatch.setenv("PRISM_TRACES_EXPORTER", "memory")
    from_env = configure_tracing_from_env("svc")
    assert from_env.exporter_name == "memory"
    assert from_env.provider.resource.attributes["service.name"] == "svc"
    from_env.shutdown()


@pytest.mark.parametrize(
    "headers",
    [[("traceparent", b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")],
     [("traceparent", b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-03"),
      ("tracestate", b"rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"), ("TraceState", b"t@v=1")],
     [("traceparent", b"cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-ff-future")],
     [("traceparent", b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"), ("tracestate", b"a=1,a=2")],
     [("traceparent", b"garbage"), ("tracestate", b"a=1")],
     []],
    ids=["plain", "tracestate_multi", "future_version", "bad_tracestate", "garbage", "none"],
)
def test_fast_context_equals_the_propagators(headers):
    """stage_span builds the parent context directly; it must equal what OTel's propagator
    extracts from the same (normalized) carrier."""
    env = new_envelope("t", b"x", namespace="n")
    via_propagator = trace.get_current_span(extract_context(env, headers)).get_span_context()
    direct = trace.get_current_span(_context_from(tc.read_incoming(env, headers))).get_span_context()
    assert direct == via_propagator
    assert direct.trace_state == via_propagator.trace_state
    assert direct.is_remote == via_propagator.is_remote

"""OTLP over the real wire: the pipeline worker exports its stage spans with the `otlp`
exporter (OTLP/HTTP protobuf, `OTLPSpanExporter`) to a local receiver, and the test reads
what arrived as an `ExportTraceServiceRequest` - the bytes a Collector would get.

Checked on the decoded protobuf: a span for every stage of every message with its
`prism.outcome`, all in the producer's trace and chained parent to child up to the producer
span, `service.name` on the resource; and on the raw request bytes: no planted canary (JWT,
signing key, PII, signature) anywhere.

Integration: needs the embedded broker binary; under CI=true a missing one fails the test.
"""

from __future__ import annotations

import base64
import json
import uuid
from pathlib import Path

import pytest
from opentelemetry.trace import SpanKind, format_span_id

from app.envelope import Layout, new_envelope
from app.observability.tracing import configure_tracing, inject_into_envelope
from app.security.signing import sign
from app.worker.observe import Observer
from tests.otlp_receiver import OtlpReceiver
from tests.worker.conftest import make_topology
from tests.worker.test_observability_e2e import CHAIN as STAGES  # every traced stage, the identity rule too
from tests.worker.test_observability_e2e import ObservedPipeline

pytestmark = pytest.mark.integration

N_MESSAGES = 3


def _attrs(kvs) -> dict:
    """OTLP KeyValue list -> {key: python value}."""
    out = {}
    for kv in kvs:
        v = kv.value
        out[kv.key] = getattr(v, v.WhichOneof("value")) if v.WhichOneof("value") else None
    return out


def _byte_forms(value: str | bytes) -> list[bytes]:
    """How a secret could show up in a protobuf body: as is, hex, base64 (std and url)."""
    raw = value.encode() if isinstance(value, str) else value
    forms = [raw, raw.hex().encode(), base64.b64encode(raw), base64.urlsafe_b64encode(raw).rstrip(b"=")]
    if isinstance(value, str):
        forms.append(value.encode("utf-16-le"))
    return [f for f in forms if len(f) >= 8]


@pytest.mark.parametrize("compression", ["none", "gzip"])
async def test_worker_exports_connected_stage_spans_over_otlp_http(
        broker, tmp_path: Path, dev_keys, monkeypatch, compression: str) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_COMPRESSION", compression)  # read by the OTLP exporter itself
    topo = make_topology(tmp_path, dev_keys, partitions=1)
    src = topo.sources[0].topic
    service = f"prism-otlp-{uuid.uuid4().hex[:6]}"

    # Canaries, planted the way tests/worker/test_observability_e2e.py plants them.
    token = dev_keys.mint_token(f"canary-{uuid.uuid4().hex}")
    # the value of the schema's PII-tagged field (order_created.proto: customer_email); the worker
    # keeps it out of spans by itself, nothing registers it here
    pii = f"pii-canary-{uuid.uuid4().hex}@example.invalid"
    key_doc = json.loads(Path(dev_keys.signing_path).read_text())
    key_values = [v for v in (key_doc.values() if isinstance(key_doc, dict) else [])
                  if isinstance(v, str) and len(v) > 16]
    signing_key = dev_keys.keyring.signing["dev-producer-1"]
    key_values += [s for s in (getattr(signing_key, "secret", None),) if s]

    # The producer side (the SDK, its own process and TracerProvider): one sampled trace per message.
    sdk_setup = configure_tracing("memory", "prism-sdk")
    sdk = sdk_setup.tracer("prism.sdk")
    producer_spans = {}
    records, signatures = [], []
    for i in range(N_MESSAGES):
        env = new_envelope(src, {"customer_email": pii, "i": i}, namespace="order-events",
                           labels={"tenant": f"t{i}"}, message_id=f"otlp-{i}-{uuid.uuid4().hex[:8]}")
        env.ensure_security().auth_token = token
        span = sdk.start_span(f"publish {src}", kind=SpanKind.PRODUCER)
        assert span.get_span_context().trace_flags.sampled
        inject_into_envelope(span, env)  # the observability context is inside the signed bytes
        span.end()
        producer_spans[span.get_span_context().trace_id] = span
        value = sign(env, signing_key, Layout.REVIEWED)
        signatures.append(env.security.signature)
        records.append((value, [("Authorization", f"Bearer {token}".encode())]))
    sdk_setup.shutdown()

    with OtlpReceiver() as rx:
        # The worker's own wiring (what app_from_env does), pointed at the receiver.
        observer = Observer.from_env({"PRISM_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_ENDPOINT": rx.endpoint},
                                     service_name=service)
        assert observer.tracing is not None and observer.tracing.exporter_name == "otlp"
        try:
            async with ObservedPipeline(topo, broker.bootstrap, tmp_path / "w", observer) as p:
                await p.produce(records)
                await p.wait_read(len(records))
                summary = p.pipeline.summary()
                assert summary["emitted"] == N_MESSAGES, repr(summary)
        finally:
            observer.tracing.shutdown()  # flushes the batch processor: every span is sent before this returns
        assert rx.wait_spans(N_MESSAGES * len(STAGES), timeout=10), rx.stats()
        assert not rx.errors, rx.errors
        received = list(rx.requests)

    # -- the wire: OTLP/HTTP protobuf, as configured --------------------------------------------
    assert received
    for req in received:
        assert req.headers.get("content-type") == "application/x-protobuf"
        if compression == "gzip":
            assert req.headers.get("content-encoding") == "gzip" and req.raw != req.body
        else:
            assert req.headers.get("content-encoding", "identity") == "identity" and req.raw == req.body

    # -- resource and spans, from the decoded ExportTraceServiceRequest --------------------------
    spans = []
    for req in received:
        for rs in req.message.resource_spans:
            assert _attrs(rs.resource.attributes).get("service.name") == service
            for ss in rs.scope_spans:
                assert ss.scope.name == "prism.worker"
                spans.extend(ss.spans)
    assert len(spans) == N_MESSAGES * len(STAGES), [s.name for s in spans]

    for trace_id, producer in producer_spans.items():
        tid = trace_id.to_bytes(16, "big")
        mine = [s for s in spans if s.trace_id == tid]  # the producer's trace id, carried through
        assert sorted(s.name.split(" ")[0] for s in mine) == sorted(STAGES)
        for s in mine:
            a = _attrs(s.attributes)
            assert s.name == f"{a['prism.stage']} {src}"
            assert a["prism.outcome"] == "emitted"
            assert a["messaging.destination.name"] == src
            assert s.kind == s.SPAN_KIND_CONSUMER
            assert s.end_time_unix_nano >= s.start_time_unix_nano > 0
        # one connected chain: enrich -> ... -> normalize -> the producer's span
        by_id = {s.span_id: s for s in mine}
        producer_id = bytes.fromhex(format_span_id(producer.get_span_context().span_id))
        (leaf,) = [s for s in mine if s.name.startswith("enrich ")]
        chain, s = [], leaf
        while s.parent_span_id in by_id:
            chain.append(s.name.split(" ")[0])
            s = by_id[s.parent_span_id]
        chain.append(s.name.split(" ")[0])
        assert chain == list(reversed(STAGES)), chain
        assert s.parent_span_id == producer_id  # normalize's parent is the producer span

    # -- canaries: never anywhere in what went over the wire -------------------------------------
    canaries = [token, pii, *key_values, *signatures]
    for req in received:
        for blob in (req.raw, req.body):
            for c in canaries:
                for form in _byte_forms(c):
                    assert form not in blob, "canary leaked into the OTLP export"

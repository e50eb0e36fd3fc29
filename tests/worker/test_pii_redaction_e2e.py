"""PII redaction by the running worker, end to end: the namespace's JSON Schema tags
`customer_email` as PII (`x-prism-pii`) and constrains it; messages whose email breaks the
constraint fail payload validation, and the validator's error quotes the value. The worker
itself - no test registers anything - keeps that value out of every log line, DLQ header and
span, while the DLQ payload stays intact (docs/observability.md, "PII")."""

from __future__ import annotations

import io
import json
import logging
import uuid
from pathlib import Path

import yaml

from app.agents.dlq import error_context
from app.demo.runner import read_all
from app.envelope import encode, new_envelope
from app.observability.logging import configure_logging
from app.topology import load_topology
from app.worker.observe import Observer
from tests.otlp_receiver import OtlpReceiver
from tests.worker import independent
from tests.worker.conftest import make_topology
from tests.worker.test_observability_e2e import ObservedPipeline

SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "OrderCreated",
    "type": "object",
    "properties": {
        "order_id": {"type": "string"},
        "customer_email": {"type": "string", "x-prism-pii": "email", "pattern": "^[a-z0-9.-]+@shop\\.example$"},
        "shipping": {"type": "object", "x-prism-pii": "address",
                     "properties": {"street": {"type": "string", "maxLength": 8}}},
        "total": {"type": "number"},
    },
    "required": ["order_id", "customer_email"],
}


def _topology(tmp_path: Path, dev_keys):
    topo = make_topology(tmp_path, dev_keys, partitions=1)
    (tmp_path / "order_created.schema.json").write_text(json.dumps(SCHEMA))
    doc = yaml.safe_load((tmp_path / "topology.yaml").read_text())
    doc["validation"] = "off"  # the older switch below instead of the shipped topology's `validation: warn`
    for stage in doc["stages"]:
        if "enrich" in stage:
            stage["enrich"]["schema"] = {"registry_type": "file", "path": "order_created.schema.json",
                                         "version": "v1", "validate_payloads": True}
    (tmp_path / "topology.yaml").write_text(yaml.safe_dump(doc))
    return load_topology(tmp_path / "topology.yaml"), topo.sources[0].topic


async def test_pii_of_a_failed_message_is_in_no_log_header_or_span(broker, tmp_path: Path, dev_keys,
                                                                   caplog) -> None:
    caplog.set_level(logging.DEBUG)
    topo, src = _topology(tmp_path, dev_keys)
    email = f"pii-canary-{uuid.uuid4().hex}@elsewhere.invalid"  # breaks the pattern: quoted by the validator
    street = f"street-canary-{uuid.uuid4().hex}"                  # nested under a PII object; too long
    bad_envelope = encode(new_envelope(src, {"order_id": "o-1", "customer_email": email}, namespace="order-events"))
    bad_legacy = json.dumps({"order_id": "o-2", "customer_email": "ok@shop.example",
                             "shipping": {"street": street}}).encode()
    valid = f"ok-canary-{uuid.uuid4().hex}@shop.example"  # passes: it must not be logged either
    good = encode(new_envelope(src, {"order_id": "o-3", "customer_email": valid}, namespace="order-events"))
    stream = io.StringIO()
    logs = configure_logging("DEBUG", stream=stream)
    with OtlpReceiver() as rx:
        # the worker's own wiring (what app_from_env does): spans leave over OTLP/HTTP
        observer = Observer.from_env({"PRISM_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_ENDPOINT": rx.endpoint})
        try:
            async with ObservedPipeline(topo, broker.bootstrap, tmp_path / "w", observer) as p:
                # librdkafka (C, not Python logging) plays the producer: every captured record is Prism's
                independent.produce(broker.bootstrap, src, [
                    (bad_envelope, [], None),
                    (bad_legacy, [("content-type", b"application/json"), ("correlation-id", b"c-2")], None),
                    (good, [], None)])
                await p.wait_read(3)
                _, metrics_text = await p.get("/metrics")
                dlq = (await read_all(broker.bootstrap, {src + ".dlq": 1}, expected_total=2,
                                      timeout=30))[src + ".dlq"]
        finally:
            observer.tracing.shutdown()  # flushes: every span is sent before this returns
            logs.close()
        assert rx.wait_spans(3 * 7, timeout=10), rx.stats()
        received = list(rx.requests)
    s = p.pipeline.summary()
    assert s["emitted"] == 1 and s["dlq_reasons"] == {"payload_schema_mismatch": 2}, s

    # DLQ: the payload is kept intact for replay; the context headers do not quote the PII
    assert len(dlq) == 2
    by_id = {error_context(r.headers)["exception.message"]: r for r in dlq}
    assert email.encode() in dlq[0].value and street.encode() in dlq[1].value
    for rec in dlq:
        ctx = error_context(rec.headers)
        assert ctx["reason"] == "payload_schema_mismatch" and "*****" in ctx["exception.message"]
        headers = b"".join(k.encode() + v for k, v in rec.headers)
        assert email.encode() not in headers and street.encode() not in headers
    assert any("does not match" in m for m in by_id) and any("is too long" in m for m in by_id)

    reasons = [kv.value.string_value for req in received for rs in req.message.resource_spans
               for ss in rs.scope_spans for sp in ss.spans for kv in sp.attributes if kv.key == "prism.dlq.reason"]
    assert reasons.count("payload_schema_mismatch") == 2, reasons
    span_text = "\n".join(blob.decode("latin-1") for req in received for blob in (req.raw, req.body))
    log_text = stream.getvalue() + "\n".join(r.getMessage() + (r.exc_text or "") for r in caplog.records)
    assert "dead-lettered" in log_text and "does not match" in log_text  # the failure *was* logged
    for name, text in (("logs", log_text), ("spans", span_text), ("metrics", metrics_text)):
        assert email not in text and street not in text and valid not in text, f"PII leaked into {name}"

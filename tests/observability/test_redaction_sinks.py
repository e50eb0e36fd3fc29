"""The issue's redaction test: planted token/key/PII canaries, one message flowing through
stages with tracing, metrics and logging all on - and no sink contains a canary."""

from __future__ import annotations

import io
import logging

import pytest

from app.envelope import Layout, decode, encode, new_envelope
from app.errors import AuthError
from app.observability.logging import audit_key_use, configure_logging
from app.observability.metrics import PipelineMetrics
from app.observability.redaction import Redactor
from app.observability.tracing import configure_tracing, stage_span

TOKEN = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJjYW5hcnktc2lua3MtNjYxIn0.ZmFrZS1zaWduYXR1cmUtY2FuYXJ5"
KEY = bytes(range(200, 232))
PII = "canary-pii-sinks-carol@example.invalid"
LABEL = "canary-tenant-sinks-31337"


def test_no_sink_ever_sees_a_canary():
    red = Redactor()
    red.register_secret(KEY)  # the worker registers the keys it loads ...
    red.register_secret(PII)  # ... and tagged PII values it finds
    red.register_secret(LABEL)
    logs = io.StringIO()
    log_setup = configure_logging("DEBUG", stream=logs, redactor=red)
    tracing = configure_tracing("memory")
    metrics = PipelineMetrics(label_allowlist=["tenant"], redactor=red)
    log = logging.getLogger("app.worker")
    try:
        env = new_envelope("orders.created", {"email": PII, "n": 1}, namespace="orders", labels={"tenant": LABEL})
        sec = env.ensure_security()
        sec.auth_token, sec.signature, sec.signature_algorithm = TOKEN, KEY[:16] * 4, "hmac-sha256"
        red.register_secret(TOKEN)  # validated token: registered before anything logs it
        env = decode(encode(env, Layout.REVIEWED))
        tracer = tracing.tracer()
        with stage_span(tracer, "auth", env, "orders.created", 0, metrics=metrics, redactor=red) as s:
            log.info("validated token %s with key %r", TOKEN, KEY)
            log.debug("envelope %r payload %s", env, env.payload_bytes())
            audit_key_use("verify", key_id="worker-hmac", algorithm="hmac-sha256", success=True,
                          message_id=env.message_id)
            s.emitted()
        with pytest.raises(AuthError), stage_span(tracer, "authz", env, "orders.created", 0, metrics=metrics,
                                                 redactor=red):
            try:
                raise AuthError(f"token {TOKEN} not allowed for {PII}")
            except AuthError:
                log.exception("denied, key=%s", KEY.hex())
                raise
        spans = "\n".join(sp.to_json() for sp in tracing.exporter.get_finished_spans())
        exposition = metrics.exposition().decode()
    finally:
        log_setup.close()
        tracing.shutdown()
    output = logs.getvalue()
    assert "validated token" in output and "denied" in output and "Traceback" in output
    assert any(line.startswith("prism_dlq_messages_total{") and 'reason="auth_failed"' in line
               and 'namespace="orders"' in line for line in exposition.splitlines())
    for sink_name, text in (("logs", output), ("spans", spans), ("metrics", exposition)):
        for canary in (TOKEN, KEY.hex(), KEY[:16].hex(), PII, LABEL):
            assert canary not in text, f"{canary[:24]}... leaked into {sink_name}"

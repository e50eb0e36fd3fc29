"""Observability for Prism workers: W3C trace context, OpenTelemetry stage spans,
Prometheus metrics, redacted JSON logs with crypto audit records, and health state.

Modules (import the one you need; none has import-time side effects):

* `tracecontext` - W3C `traceparent`/`tracestate` parsing, formatting, `continue_or_start`;
* `tracing`      - `configure_tracing`, `stage_span`, `inject_into_envelope`, `extract_context`;
* `metrics`      - `PipelineMetrics` (own registry, label allowlist guard);
* `logging`      - `configure_logging`, `RedactionFilter`, `JsonFormatter`, `audit_key_use`;
* `redaction`    - `Redactor` (`register_secret`, `redact`);
* `health`       - `HealthState`, `/healthz` `/readyz` rendering and aiohttp routes.

See docs/observability.md.
"""

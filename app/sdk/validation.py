"""Publish-time schema validation and schema metrics for `PrismClient` (RFC-030 Workflow 1
and "Observability").

`publish(..., schema_validation=True)` validates the payload before anything is sent and raises
`SchemaValidationError` (each problem with its field path, `$.items[2].price`) instead of
letting the worker find out later - in the DLQ under `validation: strict`, or as a warning. The
schema is the client's `schema=` or, with `schema_version=`, that version of the topic's
subject in the client's `registry_url` (fetched once per subject and version; a registry call
per message would cost more than the validation). Validators are compiled once per schema id
(`app.schema.payload_check.validator_for`), shared with the worker code.

`SchemaMetrics` puts the SDK's side of RFC-030's observability in a prometheus_client registry
the application serves with its own `/metrics`:

    prism_sdk_schema_validations_total{envelope_namespace,schema_version,result}   publish-time validations
    prism_sdk_schema_validation_seconds{envelope_namespace}                       their cost (histogram)
    prism_sdk_schema_messages_received_total{envelope_namespace,schema_version,result}
                                                                         what subscribers read, and
                                                                         whether it matched their assertion

Label values come from the client's own namespace and the schema versions it publishes or
receives; received versions and namespaces are producer-controlled, so they are capped like
the worker's (100 distinct values, then `__other__`).
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError, SchemaValidationError

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

#: publish-time validation buckets: 10 µs to 50 ms (RFC-030's budget is 15 ms at p99)
VALIDATION_BUCKETS = (1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.015, 0.025, 0.05)
_MAX_VALUES = 100


class SchemaMetrics:
    """The SDK's schema metrics (module docs), in `registry` (a new private one by default).

    prometheus_client is imported here, not at module level: only a client given `metrics=`
    needs it, and the client distribution has it as the optional `[metrics]` extra."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        from prometheus_client import CollectorRegistry, Counter, Histogram

        from ..observability.metrics import OTHER

        self._other = OTHER
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        r = self.registry
        self.validations = Counter("prism_sdk_schema_validations", "Payloads validated before publishing "
                                   "(result valid or invalid; an invalid one was not sent)",
                                   ["envelope_namespace", "schema_version", "result"], registry=r)
        self.validation_seconds = Histogram("prism_sdk_schema_validation_seconds",
                                            "Time to validate one payload before publishing", ["envelope_namespace"],
                                            registry=r, buckets=VALIDATION_BUCKETS)
        self.received = Counter("prism_sdk_schema_messages_received", "Messages a subscriber read, by schema "
                                "version and assertion result (match, mismatch, unchecked)",
                                ["envelope_namespace", "schema_version", "result"], registry=r)
        self._seen: set[str] = set()

    def _cap(self, value: str) -> str:
        value = value[:64]
        if value in self._seen:
            return value
        if len(self._seen) >= _MAX_VALUES:
            return self._other
        self._seen.add(value)
        return value

    def validated(self, namespace: str, version: str, ok: bool, seconds: float) -> None:
        self.validations.labels(namespace, self._cap(version), "valid" if ok else "invalid").inc()
        self.validation_seconds.labels(namespace).observe(seconds)

    def received_message(self, namespace: str, version: str, result: str) -> None:
        self.received.labels(self._cap(namespace), self._cap(version), result).inc()


def payload_bytes(payload: Any) -> tuple[bytes, str]:
    """(bytes, content type) of a payload the way the envelope will carry it, for validation."""
    from google.protobuf.message import Message

    if isinstance(payload, dict | list):
        return json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode(), "application/json"
    if isinstance(payload, Message):
        return payload.SerializeToString(), "application/protobuf"
    if isinstance(payload, str):
        return payload.encode(), "text/plain"
    if isinstance(payload, bytes | bytearray | memoryview):
        return bytes(payload), "application/octet-stream"
    raise ConfigError(f"cannot validate a payload of type {type(payload).__name__}", path="publish(payload=)")


class SchemaValidation:
    """The client's validator: which schema applies to a publish, and the check itself."""

    def __init__(self, registry_url: str | None, metrics: SchemaMetrics | None) -> None:
        self.registry_url = registry_url
        self.metrics = metrics
        self._by_version: dict[tuple[str, str], Any] = {}
        self._lock = asyncio.Lock()

    async def schema_for(self, topic: str, default: Any, version: str | None) -> Any:
        """`default` (the client's `schema=`), or `version` of subject `topic` from the registry."""
        if version is None:
            if default is None:
                raise ConfigError("schema_validation=True needs a schema", path="publish(schema_validation=)",
                                  hint="pass schema_version= (with PrismClient(registry_url=...)) or "
                                       "PrismClient(schema=resolved)")
            return default
        key = (topic, str(version))
        hit = self._by_version.get(key)
        if hit is not None:
            return hit
        if not self.registry_url:
            raise ConfigError("schema_version= needs a registry", path="publish(schema_version=)",
                              hint="create the client with registry_url='http://registry:8081'")
        async with self._lock:
            hit = self._by_version.get(key)
            if hit is None:
                from ..errors import PrismError
                from ..schema.resolve import SchemaResolutionError, resolve_schema_config

                cfg = {"registry_type": "prism", "url": self.registry_url, "subject": topic, "version": str(version)}
                try:
                    hit = await asyncio.to_thread(resolve_schema_config, cfg)
                except SchemaResolutionError as exc:
                    if isinstance(exc, PrismError):  # its references do not resolve: already typed
                        raise
                    raise ConfigError(f"cannot read version {version} of subject {topic!r} to validate against: "
                                      f"{exc}", path="publish(schema_version=)",
                                      hint="register the schema, or check registry_url and its credentials"
                                      ) from None
                self._by_version[key] = hit
        return hit

    def check(self, schema: Any, namespace: str, payload: Any, content_type: str | None = None) -> None:
        """Raise `SchemaValidationError` when `payload` does not match `schema`."""
        from ..schema.payload_check import validator_for

        body, detected = payload_bytes(payload)
        t0 = time.perf_counter()
        violations = validator_for(schema)(body, content_type or detected)
        if self.metrics is not None:
            self.metrics.validated(namespace, schema.version, not violations, time.perf_counter() - t0)
        if violations:
            raise SchemaValidationError(
                f"payload does not match {schema.name or schema.url} {schema.version}: "
                + "; ".join(map(str, violations[:5])), violations=violations, schema_version=schema.version,
                hint="fix the payload at the path shown; nothing was published")

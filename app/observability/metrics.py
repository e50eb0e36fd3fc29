"""Prometheus metrics for one pipeline worker, in a registry of its own.

Why not the global default registry: every worker (and every test) gets an isolated
registry, so two workers in one process - or two tests - never see each other's counts,
and `/metrics` shows exactly this worker.

Metric names (prometheus_client adds `_total` to counters):

    prism_messages_in_total{topic,stage,envelope_namespace,schema_version,<allowlisted labels>}
    prism_messages_out_total{topic,stage,envelope_namespace,schema_version,<allowlisted labels>}
    prism_dlq_messages_total{topic,stage,reason,envelope_namespace,schema_version,<allowlisted labels>}
    prism_schema_validations_total{topic,envelope_namespace,schema_version,mode,result}
                                                      payloads validated (RFC-030; result valid|invalid|skipped)
    prism_dedup_hits_total{topic,stage}
    prism_expired_messages_total{topic,stage}
    prism_signature_failures_total{topic,reason}
    prism_auth_failures_total{topic,reason}
    prism_stage_latency_seconds{topic,stage}          histogram (stage "chain": the whole chain)
    prism_envelope_version_newer_total{topic,version} draft envelopes newer than the worker knows
                                                      (version "other" past 16 distinct values)
    prism_producer_sdk_outputs_total{topic,sdk_version} messages emitted, by the SDK that published them
                                                      (metadata.producer_sdk_version; "none" without one,
                                                      "invalid" if not <name>/<version>, "other" past 16)
    prism_consumer_lag{topic,partition}               gauge, messages
    prism_table_size{table}                           gauge, keys
    process_*, python_info, python_gc_*               the process (app.observability.runtime_metrics)

Cardinality guard for the envelope's `observability.labels` (producer-controlled, so
unbounded by nature): only keys in `label_allowlist` become metric labels; every other key
is dropped. An allowlisted key's value is truncated to `max_label_value_length` characters,
passed through the redactor (a token planted in a label never reaches `/metrics`), and once
`max_values_per_label` distinct values were seen for that label, new values are counted
under `__other__`. Missing labels are the empty string. The same distinct-value cap guards
`reason` labels, which should be `PrismError.code` values but are caller-supplied text.

`envelope_namespace` and `schema_version` (RFC-030 "Observability": which namespaces and schema
versions flow) are read from every envelope (metadata.namespace, schema.schema_version) and
kept under the same guard: the namespace is a producer's claim, so its values are truncated,
redacted and capped exactly like an allowlisted label's. A message that failed before it had
an envelope (or before enrich stamped a schema) has the empty string.
"""

from __future__ import annotations

import contextlib
import re
import threading
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from ..errors import ConfigError
from .runtime_metrics import add_runtime_collectors

if TYPE_CHECKING:
    from ..envelope.model import Envelope
    from .redaction import Redactor

CONTENT_TYPE = CONTENT_TYPE_LATEST
OTHER = "__other__"
DEFAULT_LATENCY_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)
_RESERVED = frozenset({"topic", "stage", "reason", "partition", "table", "le", "quantile", "namespace",
                       "envelope_namespace",
                       "schema_version", "mode", "result"})
#: the labels every message metric carries ahead of the allowlisted ones (module docs)
#: ``envelope_namespace``, not ``namespace``: Prometheus's Kubernetes discovery attaches the pod's
#: namespace as ``namespace`` and would rename ours to ``exported_namespace``
BUILTIN_LABELS = ("envelope_namespace", "schema_version")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
#: distinct producer SDK versions per worker before new ones are counted as "other"
MAX_SDK_VERSIONS = 16
_REASON_CLEAN = re.compile(r"[^a-z0-9_.:\-]")


class _BoundedValues:
    """Remembers up to `limit` distinct values; later new values map to `__other__`."""

    __slots__ = ("_lock", "_seen", "limit")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._seen: set[str] = set()
        self._lock = threading.Lock()

    def __call__(self, value: str) -> str:
        if value in self._seen:
            return value
        with self._lock:
            if len(self._seen) >= self.limit:
                return OTHER
            self._seen.add(value)
            return value


class LabelGuard:
    """Turns an envelope's `observability.labels` into a fixed tuple of metric label values."""

    def __init__(
        self,
        allowlist: Iterable[str] | Mapping[str, str] = (),
        *,
        max_value_length: int = 64,
        max_values_per_label: int = 100,
        redactor: Redactor | None = None,
    ) -> None:
        mapping = dict(allowlist) if isinstance(allowlist, Mapping) else {k: k for k in allowlist}
        names = []
        for key, name in mapping.items():
            metric_name = re.sub(r"[^a-zA-Z0-9_]", "_", name)
            if not _LABEL_NAME.fullmatch(metric_name) or metric_name.startswith("__") or metric_name in _RESERVED:
                raise ConfigError(f"envelope label {key!r} cannot become metric label {metric_name!r}",
                                  path="metrics.label_allowlist",
                                  hint=f"map it to another name; reserved: {sorted(_RESERVED)}, no leading __")
            if metric_name in names:
                raise ConfigError(f"two allowlisted labels map to metric label {metric_name!r}",
                                  path="metrics.label_allowlist", hint="give them distinct names (pass a mapping)")
            names.append(metric_name)
        self.keys: tuple[str, ...] = tuple(mapping)
        #: metric label names, the built-in ones first (what `of` returns values for)
        self.names: tuple[str, ...] = (*BUILTIN_LABELS, *names)
        self.max_value_length = max_value_length
        self.redactor = redactor
        self._bounds = [_BoundedValues(max_values_per_label) for _ in self.keys]
        self._empty = ("",) * len(self.keys)
        #: `of(None)`: every label empty
        self.empty: tuple[str, ...] = ("",) * len(self.names)
        # built-in labels: raw value -> guarded value, so each distinct value is redacted once
        self._ns_bound = _BoundedValues(max_values_per_label)
        self._ver_bound = _BoundedValues(max_values_per_label)
        self._seen_ns: dict[str, str] = {}
        self._seen_ver: dict[str, str] = {}
        self._memo_limit = 4 * max_values_per_label

    def _builtin(self, value: str, seen: dict[str, str], bound: _BoundedValues) -> str:
        out = seen.get(value)
        if out is None:
            out = value[: self.max_value_length]
            if out and self.redactor is not None:
                out = self.redactor.redact(out)
            out = bound(out) if out else out
            if len(seen) < self._memo_limit:
                seen[value] = out
        return out

    def values(self, labels: Mapping[str, str] | None) -> tuple[str, ...]:
        if not self.keys:
            return ()
        if not labels:
            return self._empty
        out = []
        for key, bound in zip(self.keys, self._bounds, strict=True):
            v = labels.get(key, "")
            if v:
                v = v[: self.max_value_length]
                if self.redactor is not None:
                    v = self.redactor.redact(v)
                v = bound(v)
            out.append(v)
        return tuple(out)

    def of(self, envelope: Envelope | None) -> tuple[str, ...]:
        """(namespace, schema_version, *allowlisted) of `envelope`, guarded."""
        if envelope is None:
            return self.empty
        h = envelope.header
        ns = self._builtin(h.metadata.namespace, self._seen_ns, self._ns_bound)
        ver = self._builtin(h.schema.schema_version, self._seen_ver, self._ver_bound) if h.HasField("schema") else ""
        if not self.keys:
            return ns, ver
        obs = envelope.observability
        return ns, ver, *self.values(obs.labels if obs is not None else None)


class PipelineMetrics:
    """All worker metrics, in `self.registry`. Methods are cheap: label children are cached."""

    def __init__(
        self,
        *,
        registry: CollectorRegistry | None = None,
        namespace: str = "prism",
        label_allowlist: Iterable[str] | Mapping[str, str] = (),
        max_label_value_length: int = 64,
        max_values_per_label: int = 100,
        max_reasons: int = 100,
        latency_buckets: Iterable[float] = DEFAULT_LATENCY_BUCKETS,
        redactor: Redactor | None = None,
    ) -> None:
        if registry is None:
            # a private registry has no process/runtime collectors of its own (runtime_metrics.py)
            registry = CollectorRegistry(auto_describe=True)
            add_runtime_collectors(registry)
        self.registry = registry
        self.labels = LabelGuard(label_allowlist, max_value_length=max_label_value_length,
                                 max_values_per_label=max_values_per_label, redactor=redactor)
        extra = self.labels.names
        r, ns = self.registry, namespace
        self.messages_in = Counter("messages_in", "Messages that entered a stage", ["topic", "stage", *extra],
                                   namespace=ns, registry=r)
        self.messages_out = Counter("messages_out", "Messages a stage emitted (by output topic)",
                                    ["topic", "stage", *extra], namespace=ns, registry=r)
        self.dlq_messages = Counter("dlq_messages", "Messages routed to the DLQ, by reason",
                                    ["topic", "stage", "reason", *extra], namespace=ns, registry=r)
        self.dedup_hits = Counter("dedup_hits", "Duplicates dropped inside the dedup window",
                                  ["topic", "stage"], namespace=ns, registry=r)
        self.expired_messages = Counter("expired_messages", "Messages whose TTL had passed",
                                        ["topic", "stage"], namespace=ns, registry=r)
        self.signature_failures = Counter("signature_failures", "Envelope signatures missing, unknown or invalid",
                                          ["topic", "reason"], namespace=ns, registry=r)
        self.auth_failures = Counter("auth_failures", "Producer authentication failures",
                                     ["topic", "reason"], namespace=ns, registry=r)
        self.stage_latency = Histogram("stage_latency_seconds", "Time a stage spent on one message",
                                       ["topic", "stage"], namespace=ns, registry=r, buckets=tuple(latency_buckets))
        self.schema_validations = Counter(
            "schema_validations", "Payloads validated against their schema (RFC-030), by validation mode and "
            "result (valid, invalid, skipped: encrypted)", ["topic", "envelope_namespace", "schema_version", "mode", "result"],
            namespace=ns, registry=r)
        self.envelope_version_newer = Counter(
            "envelope_version_newer", "Draft envelopes whose envelope_version is newer than this worker knows "
            "(processed best-effort)", ["topic", "version"], namespace=ns, registry=r)
        self.producer_sdk_outputs = Counter(
            "producer_sdk_outputs", "Messages emitted to the outputs, by the producer SDK version in their envelope "
            "(memo-031 migration tracking)", ["topic", "sdk_version"], namespace=ns, registry=r)
        self._sdk_versions = _BoundedValues(MAX_SDK_VERSIONS)
        self.consumer_lag = Gauge("consumer_lag", "Messages between the committed offset and the high watermark",
                                  ["topic", "partition"], namespace=ns, registry=r)
        self.table_size = Gauge("table_size", "Keys in a worker table", ["table"], namespace=ns, registry=r)
        self._reason = _BoundedValues(max_reasons)
        self._cache: dict[tuple[object, ...], Any] = {}

    # -- helpers -------------------------------------------------------------------------------
    def _child(self, metric: Counter | Histogram | Gauge, values: tuple[str, ...]) -> Any:
        key = (id(metric), *values)
        child = self._cache.get(key)
        if child is None:
            child = metric.labels(*values)
            self._cache[key] = child
        return child

    def _clean_reason(self, reason: str) -> str:
        r = _REASON_CLEAN.sub("_", (reason or "unspecified").lower())[:64]
        return self._reason(r)

    # -- counters --------------------------------------------------------------------------------
    # `label_values` (from `self.labels.of(envelope)`) lets a caller that counts one message
    # several times - `stage_span` counts it in and out - read the envelope's labels once.
    def message_in(self, topic: str, stage: str, envelope: Envelope | None = None, *,
                   label_values: tuple[str, ...] | None = None) -> None:
        lv = self.labels.of(envelope) if label_values is None else label_values
        self._child(self.messages_in, (topic, stage, *lv)).inc()

    def message_out(self, topic: str, stage: str, envelope: Envelope | None = None, *,
                    label_values: tuple[str, ...] | None = None) -> None:
        lv = self.labels.of(envelope) if label_values is None else label_values
        self._child(self.messages_out, (topic, stage, *lv)).inc()

    def dlq(self, topic: str, stage: str, reason: str, envelope: Envelope | None = None, *,
            label_values: tuple[str, ...] | None = None) -> None:
        lv = self.labels.of(envelope) if label_values is None else label_values
        self._child(self.dlq_messages, (topic, stage, self._clean_reason(reason), *lv)).inc()

    def dedup_hit(self, topic: str, stage: str, envelope: Envelope | None = None) -> None:
        self._child(self.dedup_hits, (topic, stage)).inc()

    def expired(self, topic: str, stage: str, envelope: Envelope | None = None) -> None:
        self._child(self.expired_messages, (topic, stage)).inc()

    def signature_failure(self, topic: str, reason: str) -> None:
        self._child(self.signature_failures, (topic, self._clean_reason(reason))).inc()

    def auth_failure(self, topic: str, reason: str) -> None:
        self._child(self.auth_failures, (topic, self._clean_reason(reason))).inc()

    def schema_validation(self, topic: str, namespace: str, schema_version: str, mode: str, result: str,
                          n: int = 1) -> None:
        """Count `n` validated payloads; namespace and version go through the label guard."""
        g = self.labels
        ns = g._builtin(namespace, g._seen_ns, g._ns_bound)
        ver = g._builtin(schema_version, g._seen_ver, g._ver_bound)
        self._child(self.schema_validations, (topic, ns, ver, mode, result)).inc(n)

    def newer_envelope_version(self, topic: str, version: int, n: int = 1) -> None:
        """Count `n` draft envelopes of a newer `envelope_version` (RFC-031 Backward
        Compatibility); the normalize stage bounds the distinct versions (-1: "other")."""
        self._child(self.envelope_version_newer, (topic, str(version) if version >= 0 else "other")).inc(n)

    def producer_sdk_output(self, topic: str, sdk_version: str, n: int = 1) -> None:
        """Count `n` messages of source `topic` emitted with this `producer_sdk_version`. The value
        is the producer's claim, so the label is bounded: "none" (no SDK stamped it), "invalid"
        (not `<name>/<version>`), at most MAX_SDK_VERSIONS distinct values, then "other"."""
        from ..sdk.version import version_label

        label = version_label(sdk_version)
        if label not in ("none", "invalid"):
            label = self._sdk_versions(label)
            if label == OTHER:
                label = "other"
        self._child(self.producer_sdk_outputs, (topic, label)).inc(n)

    # -- latency and gauges ------------------------------------------------------------------------
    def observe_latency(self, topic: str, stage: str, seconds: float) -> None:
        self._child(self.stage_latency, (topic, stage)).observe(seconds)

    def set_consumer_lag(self, topic: str, partition: int, lag: int) -> None:
        """Lag = high watermark - committed offset. On the embedded Tansu broker derive the
        high watermark from fetch responses (`consumer.highwater(tp)`), not ListOffsets."""
        self._child(self.consumer_lag, (topic, str(partition))).set(max(lag, 0))

    def remove_partition(self, topic: str, partition: int) -> None:
        """Drop a revoked partition's lag series (a stale gauge would lie after a rebalance)."""
        self._cache.pop((id(self.consumer_lag), topic, str(partition)), None)
        with contextlib.suppress(KeyError):
            self.consumer_lag.remove(topic, str(partition))

    def set_table_size(self, table: str, size: int) -> None:
        self._child(self.table_size, (table,)).set(size)

    # -- exposition --------------------------------------------------------------------------------
    def exposition(self) -> bytes:
        """The Prometheus text format of this registry (what `/metrics` serves)."""
        return generate_latest(self.registry)

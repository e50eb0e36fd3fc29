"""Prometheus metrics of the schema registry (RFC-030 "Observability"), in a registry of its own.

Same approach as the pipeline worker (:mod:`app.observability.metrics`): ``prometheus_client``
metrics in a private :class:`~prometheus_client.CollectorRegistry`, so two registries in one
process (or two tests) never see each other's counts and ``/metrics`` shows exactly this one.

Metric names (prometheus_client adds ``_total`` to counters)::

    prism_schema_registry_requests_total{route,method,status}
    prism_schema_registry_request_duration_seconds{route,method}        histogram
    prism_schema_registry_cache_lookups_total{cache,result}             result = hit|miss
    prism_schema_registry_cache_hit_ratio                               gauge, hits / lookups, all caches
    prism_schema_registry_compatibility_checks_total{format,mode,verdict}   verdict = compatible|incompatible
    prism_schema_registry_validation_failures_total{operation,reason}
    prism_schema_registry_pii_rejections_total{pii_policy}
    prism_schema_registry_registrations_total{result}                   result = created|idempotent

Several worker processes (``prism schema serve --workers N``): prometheus_client's
multiprocess mode (``PROMETHEUS_MULTIPROC_DIR``, set by ``serve``) keeps each process's
counts in files, and ``/metrics`` - whichever worker answers it - adds them all up. The hit
ratio gauge is then computed from the summed ``cache_lookups`` counters, not per process.

Cardinality is bounded by construction: ``route`` is the route *template*
(``/subjects/{subject}/versions/{version}``, never the raw path; unmatched paths are
``__unmatched__``), ``method`` is one of the HTTP methods or ``OTHER``, ``status`` is a
three-digit code, and every other label takes values from a fixed set in the code. Subject
names, which clients choose, are never labels.

Besides its own metrics, ``/metrics`` serves ``process_*`` and ``python_*``
(:mod:`app.observability.runtime_metrics`): of this process, or with ``--workers N`` of the
supervisor and its workers together, as one process.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.metrics_core import GaugeMetricFamily, Metric

from app.observability.runtime_metrics import add_process_tree_collectors, add_runtime_collectors

CONTENT_TYPE = CONTENT_TYPE_LATEST
UNMATCHED_ROUTE = "__unmatched__"
_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"})
#: Schema GETs take ~0.1 ms in-process; the low buckets make the < 10 ms target readable.
LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class RegistryMetrics:
    """All registry metrics, in ``self.registry``. Hot-path methods cache label children."""

    def __init__(self, registry: CollectorRegistry | None = None, namespace: str = "prism_schema_registry") -> None:
        self.multiprocess_dir = os.environ.get("PROMETHEUS_MULTIPROC_DIR") or None
        if registry is None:
            # a private registry has no process/runtime collectors of its own (runtime_metrics.py)
            registry = CollectorRegistry(auto_describe=True)
            if self.multiprocess_dir is None:
                add_runtime_collectors(registry)
        self.registry = registry
        r, ns = self.registry, namespace
        self.requests = Counter("requests", "HTTP requests by route template, method and status code",
                                ["route", "method", "status"], namespace=ns, registry=r)
        self.request_duration = Histogram("request_duration_seconds", "Time to serve one HTTP request",
                                          ["route", "method"], namespace=ns, registry=r, buckets=LATENCY_BUCKETS)
        self.cache_lookups = Counter("cache_lookups", "Lookups in the registry's in-memory caches",
                                     ["cache", "result"], namespace=ns, registry=r)
        self._ratio_name = f"{ns}_cache_hit_ratio"
        if self.multiprocess_dir is None:
            self.cache_hit_ratio = Gauge("cache_hit_ratio", _RATIO_HELP, namespace=ns, registry=r)
            self.cache_hit_ratio.set_function(self._hit_ratio)
        self.compat_checks = Counter("compatibility_checks", "Compatibility checks by verdict",
                                     ["format", "mode", "verdict"], namespace=ns, registry=r)
        self.validation_failures = Counter("validation_failures", "Rejected registrations/checks, by reason",
                                           ["operation", "reason"], namespace=ns, registry=r)
        self.pii_rejections = Counter("pii_rejections", "Registrations rejected by an enforcing PII policy",
                                      ["pii_policy"], namespace=ns, registry=r)
        self.registrations = Counter("registrations", "Successful register calls: new version or idempotent",
                                     ["result"], namespace=ns, registry=r)
        self._hits = 0
        self._lookups = 0
        self._req_children: dict[tuple[str, str, int], tuple[object, object]] = {}
        self._cache_children: dict[tuple[str, bool], object] = {}

    def _hit_ratio(self) -> float:
        return self._hits / self._lookups if self._lookups else 0.0

    # -- hot path ------------------------------------------------------------------------------
    def request(self, route: str, method: str, status: int, seconds: float) -> None:
        """One served HTTP request (called by the ASGI middleware)."""
        key = (route, method, status)
        children = self._req_children.get(key)
        if children is None:
            m = method if method in _METHODS else "OTHER"
            children = (self.requests.labels(route, m, str(status)), self.request_duration.labels(route, m))
            self._req_children[key] = children
        children[0].inc()  # type: ignore[attr-defined]
        children[1].observe(seconds)  # type: ignore[attr-defined]

    def cache(self, cache: str, hit: bool) -> None:
        """One lookup in the in-memory cache named ``cache`` (a fixed name from the code)."""
        child = self._cache_children.get((cache, hit))
        if child is None:
            child = self.cache_lookups.labels(cache, "hit" if hit else "miss")
            self._cache_children[(cache, hit)] = child
        child.inc()  # type: ignore[attr-defined]
        self._lookups += 1
        if hit:
            self._hits += 1

    # -- rarer events ----------------------------------------------------------------------------
    def compat_check(self, fmt: str, mode: str, compatible: bool) -> None:
        self.compat_checks.labels(fmt, mode, "compatible" if compatible else "incompatible").inc()

    def validation_failure(self, operation: str, reason: str) -> None:
        self.validation_failures.labels(operation, reason).inc()

    def pii_rejection(self, policy: str) -> None:
        self.pii_rejections.labels(policy).inc()

    def registration(self, created: bool) -> None:
        self.registrations.labels("created" if created else "idempotent").inc()

    # -- exposition ------------------------------------------------------------------------------
    @property
    def cache_hits(self) -> int:
        return self._hits

    @property
    def cache_misses(self) -> int:
        return self._lookups - self._hits

    def exposition(self) -> bytes:
        """The Prometheus text format of this registry (what ``/metrics`` serves)."""
        if self.multiprocess_dir is None:
            return generate_latest(self.registry)
        from prometheus_client.multiprocess import MultiProcessCollector

        merged = CollectorRegistry()
        collector = MultiProcessCollector(merged, path=self.multiprocess_dir)
        merged.register(_RatioFromCounters(collector, self._ratio_name))
        # the pod's server as one process: the uvicorn supervisor and its workers (runtime_metrics.py)
        add_process_tree_collectors(merged)
        return generate_latest(merged)


_RATIO_HELP = "Cache hits / lookups since start, all caches"


class _RatioFromCounters:
    """The hit-ratio gauge over all worker processes, from their summed lookup counters."""

    def __init__(self, source: Any, name: str) -> None:
        self.source, self.name = source, name

    def collect(self) -> Iterator[Metric]:
        hits = lookups = 0.0
        for metric in self.source.collect():
            if metric.name != self.name.replace("_hit_ratio", "_lookups"):
                continue
            for sample in metric.samples:
                if sample.name.endswith("_total"):
                    lookups += sample.value
                    hits += sample.value if sample.labels.get("result") == "hit" else 0.0
        yield GaugeMetricFamily(self.name, _RATIO_HELP, value=hits / lookups if lookups else 0.0)

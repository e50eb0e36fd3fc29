"""Liveness and readiness of a pipeline worker.

The worker updates one `HealthState` from its lifecycle hooks (Faust: `on_startup`,
`on_partitions_assigned/revoked`, table recovery callbacks, producer/consumer errors);
`/healthz` and `/readyz` render it.

* Liveness (`/healthz`) answers "should the orchestrator restart me?": false only for a
  fatal error (`mark_failed`) or a stalled event loop (no `beat()` for `liveness_timeout`
  seconds once heartbeats started). A broker outage is NOT a liveness failure - restarting
  the pod does not fix the broker, it only adds a rebalance.
* Readiness (`/readyz`) answers "is this worker processing its share?": started, not
  shutting down, broker connected, partition assignment received (possibly empty: a group
  with more members than partitions leaves some idle, and they are still healthy), and
  every registered table recovered from its changelog, writes going through and the leaders
  of its partitions reachable (`kafka`: app/worker/kafka_health.py).

Reasons shown in the JSON are short codes/exception class names, passed through the
redactor (a broker error can quote a SASL URL with a password).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from app.observability.redaction import Redactor, default_redactor

if TYPE_CHECKING:
    from aiohttp import web

    from app.observability.metrics import PipelineMetrics

JSON_CONTENT_TYPE = "application/json"


@dataclass(frozen=True, slots=True)
class HealthReport:
    ok: bool
    checks: dict[str, dict[str, Any]]

    @property
    def http_status(self) -> int:
        return 200 if self.ok else 503

    def to_dict(self) -> dict[str, Any]:
        return {"status": "ok" if self.ok else "fail", "checks": self.checks}

    def to_json(self) -> bytes:
        return json.dumps(self.to_dict(), sort_keys=True).encode()


class HealthState:
    """Mutable health of one worker. Updated from the event loop; reads are cheap."""

    def __init__(self, *, liveness_timeout: float = 30.0, clock: Callable[[], float] = time.monotonic,
                 redactor: Redactor | None = None) -> None:
        self.liveness_timeout = liveness_timeout
        self._clock = clock
        self._redactor = redactor or default_redactor()
        self.started = False
        self.stopping = False
        self.failed: str | None = None
        #: why the worker stopped consuming (a write it cannot complete, e.g. its DLQ); None: it did not
        self.blocked: str | None = None
        #: what is wrong with the Kafka cluster as the worker sees it (app/worker/kafka_health.py)
        self.kafka_problem: str | None = None
        self._kafka_since: float | None = None
        #: messages wait and nothing is processed, for no known reason (app/worker/progress.py)
        self.stalled: str | None = None
        self.broker_connected = False
        self.broker_error: str | None = None
        self.assignment_received = False
        self.partitions: set[tuple[str, int]] = set()
        self.tables: dict[str, bool] = {}
        self._last_beat: float | None = None

    # -- lifecycle -------------------------------------------------------------------------
    def mark_started(self) -> None:
        self.started = True
        self.beat()

    def mark_stopping(self) -> None:
        """Graceful shutdown began (SIGTERM): not ready any more, still live."""
        self.stopping = True

    def mark_failed(self, reason: str) -> None:
        """An unrecoverable error: liveness fails so the orchestrator restarts the worker."""
        self.failed = self._redactor.redact(reason)[:200]

    def set_blocked(self, reason: str | None) -> None:
        """Not ready while a write cannot complete and consumption is stopped (None: resumed).
        Readiness only: the worker is alive and retrying, a restart would not help."""
        self.blocked = None if reason is None else self._redactor.redact(reason)[:300]

    def set_kafka_problem(self, reason: str | None) -> None:
        """Not ready while writes fail or a partition's leader is lost (None: all clear again).
        Readiness only, like `set_blocked`: restarting the worker does not bring a broker back."""
        if reason is None:
            self.kafka_problem = self._kafka_since = None
            return
        if self._kafka_since is None:
            self._kafka_since = self._clock()
        self.kafka_problem = self._redactor.redact(reason)[:500]

    def set_stalled(self, reason: str | None) -> None:
        """Not ready while the worker is stalled (None: it made progress again). Readiness only:
        the stall's cause is unknown, and a restart would lose the diagnosis the log carries."""
        self.stalled = None if reason is None else self._redactor.redact(reason)[:300]

    def beat(self) -> None:
        """Event-loop heartbeat (see `run_heartbeat`)."""
        self._last_beat = self._clock()

    # -- broker and assignment ---------------------------------------------------------------
    def set_broker_connected(self, connected: bool, error: str | None = None) -> None:
        self.broker_connected = connected
        self.broker_error = None if connected or not error else self._redactor.redact(error)[:200]

    def partitions_assigned(self, assigned: Iterable[tuple[str, int]]) -> None:
        """The full new assignment (Faust passes the complete set after a rebalance)."""
        self.partitions = {(t, int(p)) for t, p in assigned}
        self.assignment_received = True

    def partitions_revoked(self, revoked: Iterable[tuple[str, int]]) -> None:
        """A rebalance started: not ready until the next assignment arrives."""
        self.partitions -= {(t, int(p)) for t, p in revoked}
        self.assignment_received = False

    # -- tables ------------------------------------------------------------------------------
    def register_table(self, name: str) -> None:
        self.tables.setdefault(name, False)

    def table_recovered(self, name: str, recovered: bool = True) -> None:
        self.tables[name] = recovered

    # -- reports -----------------------------------------------------------------------------
    def liveness(self) -> HealthReport:
        checks: dict[str, dict[str, Any]] = {"fatal_error": {"ok": self.failed is None}}
        if self.failed is not None:
            checks["fatal_error"]["reason"] = self.failed
        if self._last_beat is not None:
            age = self._clock() - self._last_beat
            checks["event_loop"] = {"ok": age <= self.liveness_timeout, "last_beat_seconds_ago": round(age, 3)}
        return HealthReport(all(c["ok"] for c in checks.values()), checks)

    def readiness(self) -> HealthReport:
        pending = sorted(name for name, ok in self.tables.items() if not ok)
        broker: dict[str, Any] = {"ok": self.broker_connected}
        if self.broker_error:
            broker["reason"] = self.broker_error
        checks: dict[str, dict[str, Any]] = {
            "lifecycle": {"ok": self.started and not self.stopping and self.failed is None,
                          "started": self.started, "stopping": self.stopping},
            "broker": broker,
            "assignment": {"ok": self.assignment_received, "partitions": len(self.partitions)},
            "tables": {"ok": not pending, "recovering": pending, "total": len(self.tables)},
        }
        if self.blocked is not None:
            checks["writes"] = {"ok": False, "reason": self.blocked}
        if self.stalled is not None:
            checks["progress"] = {"ok": False, "reason": self.stalled}
        if self.kafka_problem is not None:
            since = self._kafka_since if self._kafka_since is not None else self._clock()
            checks["kafka"] = {"ok": False, "reason": self.kafka_problem,
                               "for_seconds": round(self._clock() - since, 1)}
        return HealthReport(all(c["ok"] for c in checks.values()), checks)


def render_healthz(state: HealthState) -> tuple[int, bytes]:
    report = state.liveness()
    return report.http_status, report.to_json()


def render_readyz(state: HealthState) -> tuple[int, bytes]:
    report = state.readiness()
    return report.http_status, report.to_json()


async def run_heartbeat(state: HealthState, interval: float = 1.0) -> None:
    """Beat every `interval` seconds until cancelled; a blocked loop stops the beats."""
    while True:
        state.beat()
        await asyncio.sleep(interval)


def route_table(state: HealthState, metrics: PipelineMetrics | None = None) -> web.RouteTableDef:
    """aiohttp routes: GET /healthz, /readyz and (with `metrics`) /metrics.
    Faust's web server is aiohttp; the lead can mount these or wrap the render functions."""
    from aiohttp import web

    routes = web.RouteTableDef()

    @routes.get("/healthz")
    async def healthz(request: web.Request) -> web.Response:
        status, body = render_healthz(state)
        return web.Response(status=status, body=body, content_type=JSON_CONTENT_TYPE)

    @routes.get("/readyz")
    async def readyz(request: web.Request) -> web.Response:
        status, body = render_readyz(state)
        return web.Response(status=status, body=body, content_type=JSON_CONTENT_TYPE)

    if metrics is not None:
        from app.observability.metrics import CONTENT_TYPE

        @routes.get("/metrics")
        async def metrics_view(request: web.Request) -> web.Response:
            resp = web.Response(status=200, body=metrics.exposition())
            resp.headers["Content-Type"] = CONTENT_TYPE
            return resp

    return routes

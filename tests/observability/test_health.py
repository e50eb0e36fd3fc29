"""Liveness/readiness state transitions and the /healthz /readyz endpoints."""

from __future__ import annotations

import asyncio
import json

from aiohttp.test_utils import TestClient, TestServer
from aiohttp.web import Application

from app.observability.health import HealthState, render_healthz, render_readyz, route_table, run_heartbeat
from app.observability.redaction import Redactor


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def ready_state(**kw) -> HealthState:
    s = HealthState(**kw)
    s.mark_started()
    s.set_broker_connected(True)
    s.register_table("dedup")
    s.partitions_assigned([("orders", 0), ("orders", 1)])
    s.table_recovered("dedup")
    return s


def test_fresh_worker_is_live_but_not_ready():
    s = HealthState()
    assert s.liveness().ok
    r = s.readiness()
    assert not r.ok and r.http_status == 503
    assert {k for k, c in r.checks.items() if not c["ok"]} == {"lifecycle", "broker", "assignment"}


def test_ready_after_connect_assign_and_recover():
    s = ready_state()
    r = s.readiness()
    assert r.ok and r.http_status == 200
    assert r.checks["assignment"]["partitions"] == 2
    assert r.checks["tables"] == {"ok": True, "recovering": [], "total": 1}


def test_empty_assignment_is_ready():
    s = ready_state()
    s.partitions_revoked([("orders", 0), ("orders", 1)])
    assert not s.readiness().ok  # rebalancing
    s.partitions_assigned([])
    assert s.readiness().ok


def test_table_recovery_and_broker_loss_gate_readiness_not_liveness():
    s = ready_state()
    s.register_table("counts")
    r = s.readiness()
    assert not r.ok and r.checks["tables"]["recovering"] == ["counts"]
    s.table_recovered("counts")
    s.set_broker_connected(False, "KafkaConnectionError")
    r = s.readiness()
    assert not r.ok and r.checks["broker"] == {"ok": False, "reason": "KafkaConnectionError"}
    assert s.liveness().ok


def test_shutdown_and_fatal_error():
    s = ready_state()
    s.mark_stopping()
    assert not s.readiness().ok and s.liveness().ok
    s.mark_failed("ConsistencyError")
    live = s.liveness()
    assert not live.ok and live.checks["fatal_error"]["reason"] == "ConsistencyError"


def test_stalled_event_loop_fails_liveness():
    clock = Clock()
    s = HealthState(liveness_timeout=5, clock=clock)
    s.mark_started()
    clock.now += 4
    assert s.liveness().ok
    clock.now += 2
    live = s.liveness()
    assert not live.ok and live.checks["event_loop"]["last_beat_seconds_ago"] == 6
    s.beat()
    assert s.liveness().ok


def test_reasons_are_redacted():
    red = Redactor()
    s = HealthState(redactor=red)
    s.set_broker_connected(False, "cannot reach sasl://svc:hunter2@kafka:9093 token=abc123")
    s.mark_failed("Authorization: Bearer abcdef123456")
    body = render_readyz(s)[1] + render_healthz(s)[1]
    assert b"hunter2" not in body and b"abc123" not in body and b"abcdef123456" not in body


def test_render_functions_return_status_and_json():
    status, body = render_readyz(ready_state())
    assert status == 200 and json.loads(body)["status"] == "ok"
    status, body = render_healthz(HealthState())
    assert status == 200 and json.loads(body)["checks"]["fatal_error"]["ok"] is True


async def test_heartbeat_task_beats():
    clock = Clock()
    s = HealthState(liveness_timeout=1, clock=clock)
    task = asyncio.create_task(run_heartbeat(s, interval=0.01))
    await asyncio.sleep(0.05)
    clock.now += 0.5
    await asyncio.sleep(0.03)
    task.cancel()
    assert s.liveness().checks["event_loop"]["last_beat_seconds_ago"] < 0.5


async def test_endpoints_over_http():
    s = HealthState()
    app = Application()
    app.add_routes(route_table(s))
    async with TestClient(TestServer(app)) as client:
        resp = await client.get("/readyz")
        assert resp.status == 503 and resp.content_type == "application/json"
        assert (await resp.json())["status"] == "fail"
        s.mark_started()
        s.set_broker_connected(True)
        s.partitions_assigned([("t", 0)])
        resp = await client.get("/readyz")
        assert resp.status == 200 and (await resp.json())["checks"]["assignment"]["partitions"] == 1
        resp = await client.get("/healthz")
        assert resp.status == 200
        assert (await client.get("/metrics")).status == 404  # only mounted when metrics are given

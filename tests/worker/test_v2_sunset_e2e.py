"""The `.v2` sunset through a running worker (embedded broker): one consumer group, three worker
runs with the migration clock moved by `PRISM_MIGRATION_CLOCK_OFFSET_S` (as an operator rehearses
a sunset on staging), records published by the SDK's encoder in each phase.

* before the deprecation date: `.v2` and `.v3` records, no `prism-deprecation` header;
* after it: every new `.v2` record carries the header (deprecated, sunset, successor = `.v3`);
* after the cutoff: the start-up log says the worker writes `.v3` only, no new `.v2` record is
  written while `.v3` gets every message, and `GET /connectors/{name}/status` shows the phase
  under `migration` - as it does in the two phases before.

The worker also counts what it emitted per producer SDK version (`prism_producer_sdk_outputs_total`)."""

from __future__ import annotations

import logging
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiokafka import AIOKafkaProducer

from app.broker.admin import ensure_topics
from app.broker.embedded import find_free_port
from app.demo.runner import read_all
from app.envelope import Layout, encode, new_envelope
from app.observability.metrics import PipelineMetrics
from app.sdk.version import SDK_VERSION
from app.sunset import CLOCK_OFFSET_ENV, DEPRECATION_HEADER, parse_header
from app.worker.faust_app import InProcessWorker
from app.worker.management import ManagementSettings
from app.worker.observe import Observer
from app.worker.pipeline import PipelineApp
from tests.support import auth_headers, write_users_file
from tests.worker.conftest import make_topology
from tests.worker.test_lag_e2e import _wait
from tests.worker.test_observability_e2e import samples

PARTITIONS = 2
PER_PHASE = 6
DAY = 86400


def _header(rec: Any, name: str) -> bytes | None:
    return next((v for k, v in rec.headers or () if k == name), None)


async def _publish(bootstrap: str, topic: str, tag: str) -> None:
    """PER_PHASE envelopes as the SDK builds them (its version stamped), spread over the partitions."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    await producer.start()
    try:
        for i in range(PER_PHASE):
            env = new_envelope(topic, {"i": i, "tag": tag}, namespace="order-events", producer_sdk_version=SDK_VERSION)
            await producer.send_and_wait(topic, encode(env, Layout.REVIEWED), key=f"{tag}-{i}".encode())
    finally:
        await producer.stop()


@pytest.mark.timeout(300)
async def test_the_sunset_through_a_running_worker(broker, tmp_path: Path, dev_keys, monkeypatch,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    today = datetime.now(UTC).replace(microsecond=0)
    deprecation, cutoff = today + timedelta(days=10), today + timedelta(days=20)
    topo = make_topology(tmp_path, dev_keys, partitions=PARTITIONS, outputs={
        "layouts": ["v2", "v3"], "signature_scope": "batch",
        "migration": {"deprecation_date": deprecation.isoformat(), "cutoff_date": cutoff.isoformat()}})
    src = topo.sources[0].topic
    v2, v3 = f"{src}.v2", f"{src}.v3"
    group = f"sunset-{uuid.uuid4().hex[:8]}"
    await ensure_topics(broker.bootstrap, topo.topics())
    management = ManagementSettings.from_env({"PRISM_ADMIN_USERS_FILE": str(write_users_file(tmp_path / "u.yaml"))})
    written: dict[str, list[Any]] = {}

    async def run_phase(name: str, offset_days: int) -> tuple[dict[str, Any], str]:
        """One worker run with the clock `offset_days` ahead; returns its status and /metrics."""
        monkeypatch.setenv(CLOCK_OFFSET_ENV, str(offset_days * DAY))
        port = find_free_port()
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="prism.worker"):
            pipeline = PipelineApp(topo, bootstrap=broker.bootstrap, data_dir=tmp_path / f"w-{name}", app_id=group,
                                   embedded=True, web_port=port,
                                   observe=Observer(metrics=PipelineMetrics(), management=management))
            worker = InProcessWorker(pipeline.app)
            await worker.start()
        try:
            await _publish(broker.bootstrap, src, name)
            async with aiohttp.ClientSession(headers=auth_headers("reader")) as http:
                async def status() -> dict[str, Any]:
                    async with http.get(f"http://127.0.0.1:{port}/connectors/{topo.name}/status") as r:
                        assert r.status == 200, await r.text()
                        return await r.json()

                st = await _wait(f"{name}: every message emitted", status,
                                 lambda s: pipeline.summary()["emitted"] >= PER_PHASE and s["lag"] == 0)
                async with http.get(f"http://127.0.0.1:{port}/metrics") as r:
                    metrics = await r.text()
        finally:
            await worker.stop()
        assert pipeline.summary()["emitted"] == PER_PHASE and pipeline.summary()["dlq"] == 0, pipeline.summary()
        written.update(await read_all(broker.bootstrap, {v2: PARTITIONS, v3: PARTITIONS}, expected_total=0,
                                      timeout=15))
        return st, metrics

    # 1. before the deprecation date: .v2 as always, no header
    st, _ = await run_phase("active", 0)
    assert st["migration"]["v2"] == "active" and st["migration"]["v2_written"] is True
    assert "are deprecated from" in caplog.text
    assert len(written[v2]) == len(written[v3]) == PER_PHASE
    assert all(_header(r, DEPRECATION_HEADER) is None for r in written[v2] + written[v3])

    # 2. deprecated: every new .v2 record carries the header; .v3 never does
    st, _ = await run_phase("deprecated", 15)
    assert st["migration"]["v2"] == "deprecated" and st["migration"]["v2_written"] is True
    assert st["migration"]["cutoff_date"] == cutoff.strftime("%Y-%m-%dT%H:%M:%SZ")
    assert "are deprecated since" in caplog.text
    assert len(written[v2]) == len(written[v3]) == 2 * PER_PHASE
    tags = [(r, r.value) for r in written[v2]]
    new_v2 = [r for r, value in tags if b"deprecated" in value]
    assert len(new_v2) == PER_PHASE
    for rec in new_v2:
        notice = parse_header(_header(rec, DEPRECATION_HEADER) or b"")
        assert notice["successor"] == v3 and notice["sunset"] == st["migration"]["cutoff_date"]
    assert all(_header(r, DEPRECATION_HEADER) is None for r, value in tags if b"deprecated" not in value)
    assert all(_header(r, DEPRECATION_HEADER) is None for r in written[v3])

    # 3. after the cutoff: said at start-up, .v3 only, and the status shows it
    st, metrics = await run_phase("stopped", 25)
    startup = [r for r in caplog.records if getattr(r, "event", "") == "v2_sunset"]
    assert startup and startup[0].phase == "stopped" and "at start-up" in startup[0].getMessage()
    assert "writes .v3 only" in startup[0].getMessage()
    assert st["migration"]["v2"] == "stopped" and st["migration"]["v2_written"] is False
    assert len(written[v3]) == 3 * PER_PHASE
    assert len(written[v2]) == 2 * PER_PHASE  # no new .v2 record
    assert not any(b"stopped" in r.value for r in written[v2])
    sdk = {lb["sdk_version"]: v for lb, v in samples(metrics, "prism_producer_sdk_outputs_total")
           if lb["topic"] == src}
    assert sdk == {SDK_VERSION: float(PER_PHASE)}

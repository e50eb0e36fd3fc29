"""Lag is the group's committed offsets against the log end (app/worker/lag.py), the same in all
three views - ``/connectors/{name}/status``, ``prism_consumer_lag`` and ``prism status --group`` -
on the embedded broker and on Apache Kafka (``any_broker``): while the connector is paused (the
worker fetches nothing, which used to freeze lag at 0), after resume, and with the worker down.

The expected numbers come from the broker independently of the code under test: the records
produced per partition (the producer's acknowledgements) and the offsets the group committed."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiokafka import AIOKafkaProducer
from typer.testing import CliRunner

from app.broker.admin import ensure_topics
from app.broker.embedded import find_free_port
from app.envelope import encode, new_envelope
from app.observability.metrics import PipelineMetrics
from app.worker.faust_app import InProcessWorker
from app.worker.management import ManagementSettings
from app.worker.observe import Observer
from app.worker.pipeline import PipelineApp
from tests.brokers import BrokerUnderTest
from tests.support import auth_headers, write_users_file
from tests.worker.conftest import make_topology
from tests.worker.test_observability_e2e import samples


async def _produce(bootstrap: str, topic: str, n: int, tag: str) -> Counter[int]:
    """``n`` envelopes, keyed so they spread over the partitions; returns records per partition."""
    p = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    await p.start()
    try:
        futs = [await p.send(topic, encode(new_envelope(topic, {"i": i, "tag": tag}, namespace="order-events")),
                             key=f"{tag}-{i}".encode()) for i in range(n)]
        metas = await asyncio.gather(*futs)
    finally:
        await p.stop()
    return Counter(m.partition for m in metas)


def _cli_group_lag(bootstrap: str, group: str, topic: str) -> dict[str, Any]:
    """``prism status --group`` as an operator runs it (no worker needed), through the real CLI."""
    from app.cli.main import build_app

    r = CliRunner().invoke(build_app(), ["status", "--group", group, "--topic", topic, "--json"],
                           env={"PRISM_BROKER_URL": bootstrap})
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


async def _wait(what: str, probe: Any, ok: Any, timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = await probe()
        if ok(last):
            return last
        await asyncio.sleep(0.25)
    raise AssertionError(f"{what}: last seen {last!r}")


@pytest.mark.timeout(300)
async def test_lag_is_committed_against_log_end_in_every_view(any_broker: BrokerUnderTest, tmp_path: Path,
                                                              dev_keys, monkeypatch) -> None:
    monkeypatch.setenv("PRISM_LAG_INTERVAL_S", "0.5")
    broker = any_broker
    topo = make_topology(tmp_path, dev_keys, partitions=4)
    src = topo.sources[0].topic
    group = f"lag-{uuid.uuid4().hex[:8]}"
    management = ManagementSettings.from_env({"PRISM_ADMIN_USERS_FILE": str(write_users_file(tmp_path / "u.yaml"))})
    observer = Observer(metrics=PipelineMetrics(), management=management)
    port = find_free_port()
    pipeline = PipelineApp(topo, bootstrap=broker.bootstrap, data_dir=tmp_path / "w", app_id=group,
                           embedded=broker.kind == "embedded", web_port=port, observe=observer)
    await ensure_topics(broker.bootstrap, topo.topics())
    worker = InProcessWorker(pipeline.app)
    url = f"http://127.0.0.1:{port}"
    await worker.start()
    stopped = False
    try:
        async with aiohttp.ClientSession() as http:
            async def status() -> dict[str, Any]:
                async with http.get(f"{url}/connectors/{topo.name}/status") as r:
                    return await r.json()

            async def metric_lag() -> dict[int, float]:
                async with http.get(f"{url}/metrics") as r:
                    text = await r.text()
                return {int(lb["partition"]): v for lb, v in samples(text, "prism_consumer_lag") if lb["topic"] == src}

            async def admin(method: str, path: str) -> int:
                async with http.request(method, url + path, headers=auth_headers("admin")) as r:
                    return r.status

            produced = await _produce(broker.bootstrap, src, 20, "warm")
            # everything processed and committed: lag 0 in the status and the metric
            await _wait("lag 0 after the first 20", status, lambda s: s["lag"] == 0 and s["group_lag"] and all(
                p["committed"] == produced[p["partition"]] for p in s["group_lag"]["partitions"]))

            assert await admin("PUT", f"/connectors/{topo.name}/pause") == 202
            more = await _produce(broker.bootstrap, src, 50, "paused")
            produced += more
            st = await _wait("status lag 50 while paused", status, lambda s: s["lag"] == 50)
            assert st["connector"]["state"] == "PAUSED"
            by_part = {p["partition"]: p for p in st["group_lag"]["partitions"]}
            assert sorted(by_part) == [0, 1, 2, 3]  # every partition of the group
            for part, p in by_part.items():
                # from the broker: committed before the pause, log end = every record produced
                assert (p["committed"], p["log_end"], p["lag"]) == (produced[part] - more[part], produced[part],
                                                                     more[part]), p
            assert st["group_lag"]["end_from"] == ("fetch" if broker.kind == "embedded" else "list_offsets")
            # the tasks (assigned partitions) carry the same numbers
            assert {t["partition"]: t["lag"] for t in st["tasks"]} == {k: more[k] for k in range(4)}
            lag_metric = await _wait("metric lag 50 while paused", metric_lag, lambda m: sum(m.values()) == 50)
            assert lag_metric == {k: float(more[k]) for k in range(4)}
            cli = await asyncio.to_thread(_cli_group_lag, broker.bootstrap, group, src)
            assert cli["lag"] == 50 and {p["partition"]: p["lag"] for p in cli["partitions"]} == {
                k: more[k] for k in range(4)}

            assert await admin("PUT", f"/connectors/{topo.name}/resume") == 202
            await _wait("status lag 0 after resume", status, lambda s: s["lag"] == 0)
            await _wait("metric lag 0 after resume", metric_lag, lambda m: m and sum(m.values()) == 0)
            assert (await asyncio.to_thread(_cli_group_lag, broker.bootstrap, group, src))["lag"] == 0

            # the worker down: the broker still knows the group's offsets
            assert await admin("PUT", f"/connectors/{topo.name}/pause") == 202
        await worker.stop()
        stopped = True
        late = await _produce(broker.bootstrap, src, 30, "down")
        cli = await asyncio.to_thread(_cli_group_lag, broker.bootstrap, group, src)
        assert cli["lag"] == 30 and {p["partition"]: p["lag"] for p in cli["partitions"]} == {
            k: late[k] for k in range(4)}
        assert all(p["log_end"] == produced[p["partition"]] + late[p["partition"]] for p in cli["partitions"])
    finally:
        if not stopped:
            await worker.stop()


def test_status_group_without_a_broker_says_what_to_set() -> None:
    from app.cli.main import build_app

    r = CliRunner().invoke(build_app(), ["status", "--group", "g"], env={"PRISM_BROKER_URL": ""})
    assert r.exit_code == 2 and "PRISM_BROKER_URL" in r.output

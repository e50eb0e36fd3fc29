"""Every query of deploy/grafana/prism-dashboard.json returns series from a real Prometheus
(Debian's `prometheus` package) scraping a running worker, a running schema registry and an SDK
producer/consumer's metrics - the static check in tests/deploy/test_dashboard.py proves the
names and labels exist; this proves the queries, as Grafana sends them, find data.

Traffic first, so that every panel has something to show: valid and invalid payloads under
`validation: warn` (namespace order-events) and `strict` (billing), a duplicate, an expired
TTL, a forged signature and an expired token; on the registry registrations, a compatibility
check, a rejected schema and a PII rejection; the SDK validates before publishing (one payload
refused) and a subscriber reads the outputs with a schema assertion."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, start_http_server

from app.envelope import encode, new_envelope
from app.errors import SchemaValidationError
from app.observability.metrics import PipelineMetrics
from app.schema.registry import Registry
from app.schema.store import SqliteStore
from app.sdk import PrismClient
from app.worker.observe import Observer
from tests.deploy.test_dashboard import queries
from tests.schema.conftest import serve_registry
from tests.support import USERS, auth_headers, require, write_users_file
from tests.worker.conftest import make_topology
from tests.worker.test_observability_e2e import ObservedPipeline

ORDER = {"title": "Order", "type": "object", "required": ["order_id"],
         "properties": {"order_id": {"type": "string"}, "total": {"type": "number"},
                        "items": {"type": "array", "items": {"type": "object",
                                                             "properties": {"price": {"type": "number"}}}}}}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http(method: str, url: str, body: Any = None, user: str | None = "admin") -> tuple[int, Any]:
    data = json.dumps(body).encode() if body is not None else None
    headers = {"Content-Type": "application/json", **(auth_headers(user) if user else {})}
    req = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")


class Prometheus:
    """A throwaway Prometheus on a free loopback port with its own config and data directory."""

    def __init__(self, binary: str, folder: Path, targets: dict[str, str]) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                  "scrape_configs": [{"job_name": job, "metrics_path": "/metrics",
                                      # `pod`: the target label the ServiceMonitor (deploy/monitoring) adds
                                      "static_configs": [{"targets": [target], "labels": {"pod": f"{job}-0"}}]}
                                     for job, target in targets.items()]}
        (folder / "prometheus.yml").write_text(json.dumps(config))  # JSON is YAML
        self.log = (folder / "prometheus.log").open("wb")
        self.proc = subprocess.Popen([binary, f"--config.file={folder / 'prometheus.yml'}",
                                      f"--storage.tsdb.path={folder / 'data'}",
                                      f"--web.listen-address=127.0.0.1:{self.port}"],
                                     stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(self.url + "/-/ready", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"prometheus did not start: {(folder / 'prometheus.log').read_text()[-2000:]}")
            time.sleep(0.2)

    def targets_up(self) -> dict[str, str]:
        with urllib.request.urlopen(self.url + "/api/v1/targets", timeout=5) as r:
            doc = json.loads(r.read())
        return {t["labels"]["job"]: t["health"] for t in doc["data"]["activeTargets"]}

    def last_errors(self) -> dict[str, str]:
        with urllib.request.urlopen(self.url + "/api/v1/targets", timeout=5) as r:
            doc = json.loads(r.read())
        return {t["labels"]["job"]: t["lastError"] for t in doc["data"]["activeTargets"]}

    def query(self, expr: str) -> list[dict[str, Any]]:
        q = urllib.parse.urlencode({"query": expr})
        with urllib.request.urlopen(f"{self.url}/api/v1/query?{q}", timeout=10) as r:
            doc = json.loads(r.read())
        assert doc["status"] == "success", doc
        return doc["data"]["result"]

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def as_grafana_sends_it(expr: str) -> str:
    """Grafana's variables filled in: every topic, pod and instance, and a rate window of several
    1 s scrapes."""
    expr = re.sub(r"\$__rate_interval|\$\{__rate_interval\}|\$__interval|\$__range", "30s", expr)
    return expr.replace("$topic", ".*").replace("$pod", ".*").replace("$instance", ".*")


#: Panels whose series this test cannot produce: kube-state-metrics (the lake job's panels) does
#: not run here, the worker's topology has no archive tap, and no producer sends an envelope
#: newer than the worker. tests/deploy/test_dashboard.py still checks their names and labels.
NOT_PRODUCED_HERE = re.compile(r"\b(kube_\w+|prism_archive_\w+|prism_envelope_version_newer_total)\b")


def registry_traffic(url: str, subject: str) -> None:
    """Registrations (created, idempotent), a compatibility check, a rejected schema, a PII rejection."""
    schema = json.dumps(ORDER)
    assert http("POST", f"{url}/subjects/{subject}/versions", {"schema": schema, "schemaType": "JSON"})[0] == 200
    assert http("POST", f"{url}/subjects/{subject}/versions", {"schema": schema, "schemaType": "JSON"})[0] == 200
    assert http("POST", f"{url}/compatibility/subjects/{subject}/versions/latest",
                {"schema": schema, "schemaType": "JSON"})[0] == 200
    assert http("POST", f"{url}/subjects/{subject}/versions", {"schema": "{not json", "schemaType": "JSON"})[0] >= 400
    assert http("PUT", f"{url}/v1/policies/users", {"pii_policy": "enforce"})[0] == 200
    pii = 'syntax = "proto3";\nmessage User { string user_id = 1; string email = 2; }\n'
    assert http("POST", f"{url}/v1/schemas", {"topic": "users.profile", "namespace": "users", "format": "protobuf",
                                             "schema": pii})[0] == 422
    for _ in range(3):  # cache hits for the hit ratio
        assert http("GET", f"{url}/subjects/{subject}/versions/latest", user="reader")[0] == 200


async def test_every_dashboard_query_returns_series(broker, tmp_path: Path, dev_keys, monkeypatch) -> None:
    binary = shutil.which("prometheus")
    require(binary is not None, "the prometheus binary (Debian package prometheus; scripts/ensure-test-deps.sh)")
    assert binary is not None
    from app.security.http_auth import auth_from_settings

    registry = Registry(SqliteStore(str(tmp_path / "registry.db")))
    auth = auth_from_settings(users_file=write_users_file(tmp_path / "users.yaml"), jwt_config=None,
                              allow_anonymous=None, realm="prism-schema-registry", where="tests")
    monkeypatch.setenv("PRISM_REGISTRY_USER", "reader")  # the worker and the SDK read the registry as `reader`
    monkeypatch.setenv("PRISM_REGISTRY_PASSWORD", USERS["reader"][0])
    monkeypatch.delenv("PRISM_REGISTRY_TOKEN", raising=False)
    sdk_registry = CollectorRegistry()
    sdk_port = free_port()
    sdk_server, _ = start_http_server(sdk_port, addr="127.0.0.1", registry=sdk_registry)
    prom = None
    try:
        with serve_registry(registry, auth) as reg_url:
            topo0 = make_topology(tmp_path, dev_keys, partitions=1)
            src = topo0.sources[0].topic
            registry_traffic(reg_url, src)
            topo = make_topology(
                tmp_path, dev_keys, partitions=1, validation="warn", namespaces={"billing": {"validation": "strict"}},
                producers=[{"name": "all", "principals": ["*"], "anonymous": True,
                            "namespaces": ["order-events", "billing"]}])
            topo = _with_registry_schema(tmp_path, topo0, topo, reg_url)
            src = topo.sources[0].topic
            observer = Observer(metrics=PipelineMetrics())
            async with ObservedPipeline(topo, broker.bootstrap, tmp_path / "w", observer) as p:
                prom = await asyncio.to_thread(Prometheus, binary, tmp_path / "prometheus", {
                    "worker": f"127.0.0.1:{p.port}", "registry": reg_url.removeprefix("http://"),
                    "sdk": f"127.0.0.1:{sdk_port}"})
                records = _worker_traffic(src, dev_keys)
                await p.produce([(v, []) for v in records])
                # the SDK: validate before publishing (one refused), then read the outputs back
                client = PrismClient(f"kafka://{broker.bootstrap}", namespace="order-events", registry_url=reg_url,
                                     metrics=sdk_registry)
                async with client:
                    await client.publish(src, {"order_id": "sdk-1", "total": 3.5}, schema_validation=True,
                                         schema_version="1")
                    with pytest.raises(SchemaValidationError):
                        await client.publish(src, {"order_id": "sdk-2", "total": "free"}, schema_validation=True,
                                             schema_version="1")
                    await p.wait_read(len(records) + 1)
                    async with asyncio.timeout(30), client.subscribe(f"{src}.v3", group="dash-reader",
                                                                     expected_version="v1",
                                                                     on_mismatch="warn") as sub:
                        msg = await sub.receive(timeout=10)
                        assert msg is not None
                        await msg.ack()
                health = await _wait_up(prom)
                assert all(h == "up" for h in health.values()), (health, await asyncio.to_thread(prom.last_errors))
                missing = await _wait_for_series(prom, timeout=45)
                assert not missing, "dashboard queries without series:\n" + "\n".join(
                    f"  {title}: {expr}" for title, expr in missing)
    finally:
        if prom is not None:
            prom.stop()
        sdk_server.shutdown()
        registry.store.close()


def _with_registry_schema(tmp_path: Path, topo0: Any, topo: Any, reg_url: str) -> Any:
    """`topo` with enrich reading the source topic's subject from the registry (the same schema
    the SDK validates against), on the first topology's topic names."""
    import yaml

    from app.topology import load_topology

    doc = yaml.safe_load((tmp_path / "topology.yaml").read_text())
    doc["name"], doc["sources"][0]["topic"] = topo0.name, topo0.sources[0].topic
    for stage in doc["stages"]:
        if "enrich" in stage:
            stage["enrich"]["schema"] = {"registry_type": "prism", "url": reg_url, "subject": topo0.sources[0].topic,
                                         "version": "latest"}
    path = tmp_path / "topology-registry.yaml"
    path.write_text(yaml.safe_dump(doc))
    return load_topology(path)


def _worker_traffic(src: str, dev_keys: Any) -> list[bytes]:
    valid = [encode(new_envelope(src, {"order_id": f"o-{i}", "total": i}, namespace="order-events"))
             for i in range(5)]
    warn = [encode(new_envelope(src, {"order_id": "o-w", "items": [{"price": "x"}]}, namespace="order-events"))]
    strict = [encode(new_envelope(src, {"total": 1}, namespace="billing"))]
    expired = new_envelope(src, {"order_id": "late"}, namespace="order-events", ttl_seconds=1,
                           published_at_ms=int(time.time() * 1000) - 120_000)
    token = dev_keys.mint_token("late", ttl_s=-5, now=time.time() - 600)
    bad_auth = new_envelope(src, {"order_id": "t"}, namespace="order-events")
    bad_auth.ensure_security().auth_token = token
    forged = new_envelope(src, {"order_id": "f"}, namespace="order-events")
    sec = forged.ensure_security()
    sec.signature, sec.signature_algorithm, sec.signature_key_id = b"\x01" * 64, "ed25519", "dev-producer-1"
    return [*valid, valid[0], *warn, *strict, encode(expired), encode(bad_auth), encode(forged)]


async def _wait_up(prom: Prometheus, timeout: float = 20) -> dict[str, str]:
    """Every target scraped successfully. The worker runs on this event loop: never block it."""
    deadline = time.monotonic() + timeout
    while True:
        health = await asyncio.to_thread(prom.targets_up)
        if (len(health) == 3 and all(h == "up" for h in health.values())) or time.monotonic() > deadline:
            return health
        await asyncio.sleep(0.5)


async def _wait_for_series(prom: Prometheus, timeout: float) -> list[tuple[str, str]]:
    """Queries still empty after `timeout` (a rate needs two scrapes of a series)."""
    deadline = time.monotonic() + timeout
    while True:
        missing = [(title, expr) for title, expr in queries() if not NOT_PRODUCED_HERE.search(expr)
                   and not await asyncio.to_thread(prom.query, as_grafana_sends_it(expr))]
        if not missing or time.monotonic() > deadline:
            return missing
        await asyncio.sleep(1.0)

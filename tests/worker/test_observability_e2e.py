"""The observer wired into a real worker on the embedded broker: `/metrics` counters add up to
what was published, health and the management API answer, one trace runs from a producer
span through every stage to a consumer span, and planted canaries never reach logs, spans
or metrics."""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import logging
import time
import uuid
from pathlib import Path
from typing import Any

import aiohttp
from aiokafka import AIOKafkaProducer
from opentelemetry.trace import SpanKind
from prometheus_client.parser import text_string_to_metric_families

from app.broker.admin import ensure_topics
from app.broker.embedded import find_free_port
from app.demo.runner import read_all
from app.envelope import decode, encode, new_envelope
from app.observability.logging import configure_logging
from app.observability.metrics import PipelineMetrics
from app.observability.redaction import default_redactor
from app.observability.tracing import configure_tracing, extract_context, inject_into_envelope
from app.worker.faust_app import InProcessWorker
from app.worker.management import ManagementSettings
from app.worker.observe import Observer
from app.worker.pipeline import PipelineApp
from tests.support import auth_headers, write_users_file
from tests.worker import independent
from tests.worker.conftest import make_topology

STAGES = ["normalize", "validate", "authenticate", "verify_signature", "policy", "dedup", "enrich"]
#: what the worker runs (and traces): the topology's stages, and the identity rule after the
#: verifying ones (app/agents/identity.py; no topology names it)
CHAIN = [*STAGES[:4], "identity", *STAGES[4:]]


class ObservedPipeline:
    def __init__(self, topo: Any, bootstrap: str, data_dir: Path, observer: Observer) -> None:
        self.topo, self.bootstrap, self.observer = topo, bootstrap, observer
        self.port = find_free_port()
        self.pipeline = PipelineApp(topo, bootstrap=bootstrap, data_dir=data_dir, embedded=True,
                                    app_id=f"obs-{uuid.uuid4().hex[:8]}", web_port=self.port, observe=observer)
        self.worker = InProcessWorker(self.pipeline.app)
        self.url = f"http://127.0.0.1:{self.port}"

    async def __aenter__(self) -> ObservedPipeline:
        await ensure_topics(self.bootstrap, self.topo.topics())
        await self.worker.start()
        self.http = aiohttp.ClientSession()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.http.close()
        await self.worker.stop()

    async def produce(self, records: list[tuple[bytes, list[tuple[str, bytes]]]]) -> None:
        p = AIOKafkaProducer(bootstrap_servers=self.bootstrap, linger_ms=5)
        await p.start()
        try:
            src = self.topo.sources[0].topic
            # keyed like a real producer, so a re-sent message lands on the same partition
            # (dedup is per partition: docs/topologies.md)
            await asyncio.gather(*[await p.send(src, v, key=hashlib.sha256(v).digest()[:8], headers=h)
                                   for v, h in records])
        finally:
            await p.stop()

    async def wait_read(self, n: int, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while self.pipeline.stats.read < n:
            assert time.monotonic() < deadline, f"read {self.pipeline.stats.read} of {n}"
            await asyncio.sleep(0.05)

    async def get(self, path: str) -> tuple[int, Any]:
        async with self.http.get(self.url + path) as r:
            body = await r.read()
            return r.status, (json.loads(body) if r.content_type == "application/json" else body.decode())

    async def send(self, method: str, path: str, user: str | None = "admin") -> tuple[int, Any]:
        """A management call as ``user`` (a test user of tests/schema/conftest.py; None: anonymous)."""
        headers = auth_headers(user) if user else {}
        async with self.http.request(method, self.url + path, headers=headers) as r:
            raw = await r.read()  # pause/resume answer 202 and a plain restart 204 without a body, as Connect
            return r.status, (json.loads(raw) if raw else None)


def samples(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    out = []
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name:
                out.append((dict(s.labels), s.value))
    return out


def total(text: str, name: str, **match: str) -> float:
    return sum(v for labels, v in samples(text, name) if all(labels.get(k) == x for k, x in match.items()))


async def test_metrics_health_and_management_add_up(broker, tmp_path: Path, dev_keys) -> None:
    topo = make_topology(tmp_path, dev_keys, partitions=2)
    src = topo.sources[0].topic
    # the management API with credentials, as `prism run` builds it from PRISM_ADMIN_USERS_FILE
    management = ManagementSettings.from_env({"PRISM_ADMIN_USERS_FILE": str(write_users_file(tmp_path / "u.yaml"))})
    observer = Observer(metrics=PipelineMetrics(label_allowlist=["tenant"]), management=management)
    ok = [encode(new_envelope(src, {"i": i}, namespace="order-events", labels={"tenant": f"t{i % 2}", "x": "y"}))
          for i in range(40)]
    expired_token = dev_keys.mint_token("late", ttl_s=-5, now=time.time() - 600)

    def bad_auth(i: int) -> bytes:
        e = new_envelope(src, {"bad": i}, namespace="order-events")
        e.ensure_security().auth_token = expired_token
        return encode(e)

    bad = [bad_auth(i) for i in range(5)]
    published = [(v, []) for v in ok + bad] + [(ok[0], [])]  # the last one is a duplicate
    async with ObservedPipeline(topo, broker.bootstrap, tmp_path / "w", observer) as p:
        status, ready = await p.get("/readyz")
        assert status == 200, ready
        assert (await p.get("/healthz"))[0] == 200
        await p.produce(published)
        await p.wait_read(len(published))
        status, text = await p.get("/metrics")
        assert status == 200
        s = p.pipeline.summary()
        # what was published, stage by stage
        assert total(text, "prism_messages_in_total", stage="normalize") == len(published)
        assert total(text, "prism_messages_in_total", stage="normalize", tenant="t0") == 20 + 1
        assert total(text, "prism_messages_out_total", stage="authenticate") == len(ok) + 1
        assert total(text, "prism_dlq_messages_total", stage="authenticate") == len(bad) == s["dlq"]
        assert total(text, "prism_dlq_messages_total") == len(bad)  # each DLQ record once, not again at publish
        assert total(text, "prism_auth_failures_total") == len(bad)
        assert total(text, "prism_dedup_hits_total", stage="dedup") == 1 == s["duplicate"]
        assert total(text, "prism_messages_in_total", stage="publish") == len(ok) == s["emitted"]
        for layout in topo.outputs.layouts:
            assert total(text, "prism_messages_out_total", stage="publish", topic=f"{src}.{layout}") == len(ok)
        assert "x" not in {k for labels, _ in samples(text, "prism_messages_in_total") for k in labels}
        assert total(text, "prism_stage_latency_seconds_count", stage="enrich") >= 1
        # a per-message histogram, not batch means: the whole chain and publish are observed
        # once per message, the sampled stages once per timed message
        assert total(text, "prism_stage_latency_seconds_count", stage="chain") == len(published)
        assert total(text, "prism_stage_latency_seconds_sum", stage="chain") > 0
        assert total(text, "prism_stage_latency_seconds_count", stage="publish") == len(ok)
        assert 1 <= total(text, "prism_stage_latency_seconds_count", stage="normalize") <= len(published)
        lags = samples(text, "prism_consumer_lag")
        deadline = asyncio.get_running_loop().time() + 20
        while not lags and asyncio.get_running_loop().time() < deadline:  # lag is read from the broker every 5 s
            await asyncio.sleep(0.25)
            lags = samples((await p.get("/metrics"))[1], "prism_consumer_lag")
        assert {lb["partition"] for lb, _ in lags} == {"0", "1"} and all(v >= 0 for _, v in lags)
        assert {lb["table"] for lb, _ in samples(text, "prism_table_size")} >= {f"dedup-{src}"}

        # Connect-style management API
        assert (await p.get("/connectors")) == (200, [topo.name])
        status, info = await p.get(f"/connectors/{topo.name}")
        assert info["stages"] == STAGES and info["dlq"] == [src + ".dlq"]
        assert (await p.get("/connectors/nope"))[0] == 404
        status, st = await p.get(f"/connectors/{topo.name}/status")
        assert st["connector"]["state"] == "RUNNING"
        assert sorted(t["partition"] for t in st["tasks"]) == [0, 1]
        status, dlq = await p.get(f"/connectors/{topo.name}/dlq")
        assert status == 200 and dlq["total"] == len(bad)
        assert (await p.send("PUT", f"/connectors/{topo.name}/pause", user=None))[0] == 401
        assert (await p.send("PUT", f"/connectors/{topo.name}/pause", user="reader"))[0] == 403
        assert (await p.get(f"/connectors/{topo.name}/status"))[1]["connector"]["state"] == "RUNNING"
        assert (await p.send("PUT", f"/connectors/{topo.name}/pause"))[0] == 202
        status, st = await p.get(f"/connectors/{topo.name}/status")
        assert st["connector"]["state"] == "PAUSED" and all(t["paused"] for t in st["tasks"])
        await p.produce([(encode(new_envelope(src, {"late": 1}, namespace="order-events")), [])])
        await asyncio.sleep(1.0)
        assert p.pipeline.stats.read == len(published)  # paused: nothing taken
        assert (await p.send("PUT", f"/connectors/{topo.name}/resume"))[0] == 202
        await p.wait_read(len(published) + 1)
        status, body = await p.send("POST", f"/connectors/{topo.name}/restart")
        assert status == 204 and body is None
        status, body = await p.send("POST", f"/connectors/{topo.name}/restart?includeTasks=true")
        assert status == 202 and body["connector"]["state"] == "RUNNING" and len(body["tasks"]) == 2
        status, spec = await p.get("/openapi.json")
        assert spec["openapi"].startswith("3.") and "/connectors/{name}/dlq" in spec["paths"]


async def test_one_trace_from_producer_through_stages_to_consumer(broker, tmp_path: Path, dev_keys) -> None:
    topo = make_topology(tmp_path, dev_keys, partitions=1)
    src = topo.sources[0].topic
    setup = configure_tracing("memory", "prism-test")
    observer = Observer(tracing=setup)
    sdk = setup.tracer("prism.sdk")
    producer_spans = []
    records = []
    for i in range(3):
        env = new_envelope(src, {"i": i}, namespace="order-events")
        span = sdk.start_span(f"publish {src}", kind=SpanKind.PRODUCER)
        inject_into_envelope(span, env)
        span.end()
        producer_spans.append(span)
        records.append((encode(env), []))
    records.append((b'{"legacy": true}', [("traceparent", b"00-ZZZ-garbage-01")]))  # restarts, never crashes
    async with ObservedPipeline(topo, broker.bootstrap, tmp_path / "w", observer) as p:
        await p.produce(records)
        await p.wait_read(len(records))
    out = await read_all(broker.bootstrap, {src + ".v3": 1}, expected_total=len(records), timeout=20)
    for rec in out[src + ".v3"]:
        env = decode(rec.value)
        with sdk.start_as_current_span("process order", context=extract_context(env, rec.headers),
                                       kind=SpanKind.CONSUMER):
            pass
    spans = setup.exporter.get_finished_spans()
    for ps in producer_spans:
        tid = ps.context.trace_id
        mine = [s for s in spans if s.context.trace_id == tid]
        by_id = {s.context.span_id: s for s in mine}
        consumer = [s for s in mine if s.name == "process order"]
        assert len(consumer) == 1
        chain = []  # walk from the consumer span up to the producer span
        s = consumer[0]
        while s.parent is not None:
            s = by_id[s.parent.span_id]
            chain.append(s.name.split(" ")[0])
        assert chain == [*reversed(CHAIN), "publish"], chain
        assert all(x.attributes.get("prism.outcome") == "emitted" for x in mine if x.name.split(" ")[0] in CHAIN)
    legacy = [s for s in spans if s.name.startswith("normalize") and
              s.context.trace_id not in {ps.context.trace_id for ps in producer_spans}]
    assert len(legacy) == 1 and legacy[0].parent is None  # garbage traceparent: a new root


async def test_canaries_never_reach_logs_spans_or_metrics(broker, tmp_path: Path, dev_keys, caplog) -> None:
    caplog.set_level(logging.DEBUG)
    topo = make_topology(tmp_path, dev_keys, partitions=1)
    src = topo.sources[0].topic
    token = dev_keys.mint_token(f"canary-{uuid.uuid4().hex}")
    expired = dev_keys.mint_token(f"canary-{uuid.uuid4().hex}", ttl_s=-5, now=time.time() - 600)
    # The value of a field the namespace schema tags as PII (order_created.proto: customer_email).
    # The worker finds it itself: nothing here registers it with the redactor.
    pii = f"pii-canary-{uuid.uuid4().hex}@example.invalid"
    key_material = json.dumps(json.loads(Path(dev_keys.signing_path).read_text()))
    canaries = [token, expired, pii]
    setup = configure_tracing("memory", "prism-test")
    observer = Observer(tracing=setup, metrics=PipelineMetrics(label_allowlist=["tenant", "customer"],
                                                               redactor=default_redactor()))
    stream = io.StringIO()
    logs = configure_logging("DEBUG", stream=stream)
    try:
        records = []
        for i, tok in enumerate([token, expired]):
            e = new_envelope(src, {"customer_email": pii, "i": i}, namespace="order-events",
                             labels={"tenant": tok}, message_id=f"m-{i}-{tok[-12:]}")
            e.ensure_security().auth_token = tok
            records.append((encode(e), [("Authorization", f"Bearer {tok}".encode())]))
        async with ObservedPipeline(topo, broker.bootstrap, tmp_path / "w", observer) as p:
            # librdkafka (C, not Python logging) plays the producer: every captured record is Prism's
            independent.produce(broker.bootstrap, src, [(v, h, None) for v, h in records])
            await p.wait_read(len(records))
            logging.getLogger("prism.worker").warning("processed %s with token=%s", src, token)
            _, metrics_text = await p.get("/metrics")
    finally:
        logs.close()
    span_text = "\n".join(s.to_json() for s in setup.exporter.get_finished_spans())
    log_text = stream.getvalue() + "\n".join(r.getMessage() + (r.exc_text or "") for r in caplog.records)
    assert src in log_text and "[REDACTED]" in log_text  # the capture saw the worker's records
    assert "prism.outcome" in span_text and "prism_messages_in_total" in metrics_text
    for name, text in (("logs", log_text), ("spans", span_text), ("metrics", metrics_text)):
        for c in canaries:
            assert c not in text, f"canary leaked into {name}"
    for value in json.loads(key_material).values() if isinstance(json.loads(key_material), dict) else []:
        if isinstance(value, str) and len(value) > 16:
            assert value not in log_text + span_text + metrics_text

"""Sinks inside the real pipeline: embedded Kafka broker + PipelineApp + sinks registered with
`register_sinks`; envelopes produced to the source topic end up, byte for byte as on
`<source>.v3`, in PostgreSQL and in a Redis stream. Also: a worker stopped while its sink's
backend is down neither hangs nor commits, and the next worker delivers what was left."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from aiokafka import AIOKafkaProducer

from app.demo.runner import read_all
from app.envelope import Layout, encode, new_envelope
from app.sinks.postgres import PostgresQueue
from app.sinks.redis_stream import RedisStreamSource
from app.sinks.runner import make_sink_app, register_sinks, sinks_summary
from app.worker.faust_app import InProcessWorker
from tests.sinks.helpers import wait_for
from tests.worker.conftest import dev_keys, make_topology  # noqa: F401 - fixtures (broker: tests/conftest.py)
from tests.worker.harness import RunningPipeline

pytestmark = pytest.mark.integration


async def test_pipeline_output_lands_in_postgres_and_redis_byte_exact(
        broker, tmp_path: Path, dev_keys, pg_dsn: str, pg_schema: str, redis_url: str) -> None:  # noqa: F811
    stream = f"sink-e2e-{uuid.uuid4().hex}"
    topo = make_topology(tmp_path, dev_keys, partitions=2, sinks=[
        {"type": "postgres", "name": "pg", "dsn": pg_dsn, "schema": pg_schema, "batch_size": 50, "linger_ms": 20},
        {"type": "redis-stream", "name": "rs", "url": redis_url, "stream": stream, "on_outage": "dlq",
         "max_attempts": 3},
    ])
    source = topo.sources[0].topic
    n = 120
    p = RunningPipeline(topo, broker.bootstrap, tmp_path / "w")
    agents = register_sinks(p.pipeline.app, topo, bootstrap=broker.bootstrap)
    assert register_sinks(p.pipeline.app, topo, bootstrap=broker.bootstrap) is agents  # idempotent
    async with p:
        for i in range(n):
            await p.send(encode(new_envelope(source, {"order_id": i, "total": 9.5}, namespace="order-events")))
        # not an envelope, written straight to the sinks' input: poison for every sink
        assert p.producer is not None
        await (await p.producer.send(f"{source}.v3", b"not an envelope", partition=0))
        await p.wait_read(n)
        await wait_for(lambda: all(a.stats.written + a.stats.duplicates == n and a.stats.dlq == 1 for a in agents),
                       "both sinks wrote everything", timeout=60)
    summary = sinks_summary(agents)
    assert summary["pg"]["written"] == n and summary["rs"]["written"] == n, summary
    assert summary["pg"]["rejected"] == 1 and summary["pg"]["topics"] == [f"{source}.v3"]

    out = await read_all(broker.bootstrap, {f"{source}.v3": 2, f"{source}.dlq": 2}, expected_total=n + 3, timeout=30)
    v3 = {r.value for r in out[f"{source}.v3"] if r.value != b"not an envelope"}
    assert len(v3) == n

    queue = PostgresQueue(pg_dsn, schema=pg_schema)
    claim = await queue.claim(n + 10)
    assert {e.wire(Layout.REVIEWED) for e in claim.events} == v3  # byte-exact, signature included
    await claim.release()
    await queue.stop()

    src = RedisStreamSource(redis_url, stream, "g", "c")
    entries = await src.read(count=n + 10, block_ms=100)
    await src.stop()
    assert {d.raw for d in entries} == v3
    client = aioredis.from_url(redis_url)
    await client.delete(stream)
    await client.aclose()

    dead = [r for r in out[f"{source}.dlq"] if dict(r.headers).get("prism.errors.stage", b"").startswith(b"sink:")]
    assert sorted(dict(r.headers)["prism.errors.stage"] for r in dead) == [b"sink:pg", b"sink:rs"]
    assert all(r.value == b"not an envelope" for r in dead)


async def test_stop_during_an_outage_neither_hangs_nor_commits(
        broker, tmp_path: Path, dev_keys, redis_url: str) -> None:  # noqa: F811
    """The sink app (own consumer group) waits on a Redis that is not there; stopping it must
    return promptly and leave the offsets uncommitted, so the next worker - with Redis
    reachable - delivers every record."""
    stream = f"sink-e2e-{uuid.uuid4().hex}"
    spec = {"type": "redis-stream", "name": "rs", "stream": stream, "batch_size": 20, "linger_ms": 10,
            "backoff_max_ms": 200, "timeout_ms": 1000}
    dead = make_topology(tmp_path, dev_keys, partitions=2, sinks=[{**spec, "url": "redis://127.0.0.1:9/0"}])
    source = dead.sources[0].topic
    from app.broker.admin import ensure_topics

    await ensure_topics(broker.bootstrap, dead.topics())
    producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, linger_ms=5)
    await producer.start()
    raws = [encode(new_envelope(source, {"i": i}, namespace="order-events")) for i in range(60)]
    for i, raw in enumerate(raws):
        await producer.send(f"{source}.v3", raw, partition=i % 2)
    await producer.stop()

    app_id = f"sinks-{uuid.uuid4().hex[:8]}"
    app, agents = make_sink_app(dead, bootstrap=broker.bootstrap, data_dir=tmp_path / "d1", app_id=app_id,
                                embedded=True)
    worker = InProcessWorker(app)
    await worker.start()
    await wait_for(lambda: agents[0].stats.failed_attempts >= 2, "sink waiting for Redis", timeout=60)
    started = time.monotonic()
    await worker.stop()
    assert time.monotonic() - started < 15
    assert agents[0].stats.written == 0 and agents[0].stats.aborted >= 1

    # Same consumer group, Redis reachable now: nothing was committed, so everything comes.
    live = dead.model_copy(update={"sinks": [dead.sinks[0].model_copy(update={"url": redis_url})]})
    app2, agents2 = make_sink_app(live, bootstrap=broker.bootstrap, data_dir=tmp_path / "d2", app_id=app_id,
                                  embedded=True)
    async with InProcessWorker(app2):
        await wait_for(lambda: agents2[0].stats.written >= 60, "60 written after restart", timeout=60)
    src = RedisStreamSource(redis_url, stream, "g", "c")
    entries = await src.read(count=200, block_ms=100)
    await src.stop()
    assert sorted(d.raw for d in entries) == sorted(raws)
    client = aioredis.from_url(redis_url)
    await client.delete(stream)
    await client.aclose()

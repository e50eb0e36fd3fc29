"""Sink throughput per backend (issue 6), all measured in one run against the local servers.

    .venv/bin/python -m bench.bench_sinks [--quick] [--json bench/results/sinks.json]

For each backend and batch size, N signed reviewed-layout envelopes (~500-byte JSON payload,
as the worker publishes them to `<source>.v3`) go through `Delivery.deliver` - the exact path
the runner's agent takes: encode, one idempotent batched write, stats - one batch after the
other. Reported: envelopes/s and µs per envelope (wall clock), for first writes and for a
replay of the same envelopes (every write a duplicate the backend refuses).

Backends: Redis Pub/Sub (Lua dedup + PUBLISH, no subscriber), Redis Streams (Lua dedup +
XADD), PostgreSQL (one INSERT ... SELECT unnest ... ON CONFLICT per batch), NATS JetStream
(concurrent publishes with Nats-Msg-Id, file storage, waiting for every ack), S3 (moto's
server on loopback: a Python HTTP server, so this number measures moto more than the sink).
Kafka consumption is not part of these numbers (see docs/platform-notes.md for Faust's own cost).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from app.envelope import Layout, new_envelope
from app.security.signing import SigningKey, sign
from app.sinks.base import Sink, SinkRecord
from app.sinks.delivery import Delivery, OutagePolicy
from app.sinks.nats import NatsSink
from app.sinks.postgres import PostgresSink
from app.sinks.redis_pubsub import RedisPubSubSink
from app.sinks.redis_stream import RedisStreamSink
from app.sinks.s3 import S3Sink

REDIS_URL = os.environ.get("PRISM_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
PG_DSN = os.environ.get("PRISM_TEST_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test")
NATS_URL = os.environ.get("PRISM_TEST_NATS_URL", "nats://127.0.0.1:4222")
KEY = SigningKey.hmac_sha256("bench", b"b" * 32)


def make_records(n: int, topic: str) -> list[SinkRecord]:
    out = []
    for i in range(n):
        payload = {"order_id": f"ord-{i:08d}", "customer": "c-981", "status": "paid",
                   "items": [{"sku": f"SKU-{j:05d}", "qty": j + 1, "price": 9.99 + j} for j in range(6)]}
        env = new_envelope(topic, payload, namespace="order-events", correlation_id=f"c-{i % 97}")
        obs = env.ensure_observability()
        obs.trace_id, obs.span_id = uuid.uuid4().hex, uuid.uuid4().hex[:16]
        out.append(SinkRecord.from_bytes(sign(env, KEY, Layout.REVIEWED), topic=topic + ".v3", offset=i))
    return out


async def run_one(sink: Sink[Any], records: list[SinkRecord], batch: int) -> float:
    """Seconds to deliver `records` in batches of `batch`, one batch after the other."""
    delivery = Delivery(sink, OutagePolicy("wait"), dlq=None)
    t0 = time.perf_counter()
    for i in range(0, len(records), batch):
        result = await delivery.deliver(records[i : i + batch])
        assert not result.aborted and result.dlq == 0
    return time.perf_counter() - t0


async def bench_backend(name: str, factory: Callable[[], Sink[Any]], n: int, batches: list[int],
                        cleanup: Callable[[], Any] | None = None) -> list[dict[str, Any]]:
    rows = []
    for batch in batches:
        count = min(n, 300 * batch) if batch < 10 else n  # batch=1 is slow by nature: fewer envelopes
        recs = make_records(count, f"bench.{name.replace('-', '')}.{uuid.uuid4().hex[:8]}")
        sink = factory()
        await sink.start()
        try:
            first = await run_one(sink, recs, batch)
            assert sink.stats.written == count, (name, sink.stats)
            replay = await run_one(sink, recs, batch)
            assert sink.stats.duplicates == count or name == "redis-pubsub-nodedup", (name, sink.stats)
        finally:
            await sink.stop()
        rows.append({"backend": name, "batch": batch, "envelopes": count,
                     "first_per_s": count / first, "first_us": first / count * 1e6,
                     "replay_per_s": count / replay, "replay_us": replay / count * 1e6})
        print(f"  {name:<13} batch {batch:>4}  {count:>6} env  first {count / first:>9,.0f}/s "
              f"({first / count * 1e6:>7.1f} µs)  replay {count / replay:>9,.0f}/s", flush=True)
    if cleanup is not None:
        res = cleanup()
        if asyncio.iscoroutine(res):
            await res
    return rows


async def main_async(quick: bool) -> dict[str, Any]:
    n = 2000 if quick else 10_000
    batches = [1, 50, 500]
    rows: list[dict[str, Any]] = []
    tag = uuid.uuid4().hex[:8]

    # Redis
    import redis.asyncio as aioredis

    streams: list[str] = []

    def rs_factory() -> Sink[Any]:
        streams.append(f"bench-sinks-{tag}-{len(streams)}")
        return RedisStreamSink("bench-rs", url=REDIS_URL, stream=streams[-1])

    async def redis_cleanup() -> None:
        c = aioredis.from_url(REDIS_URL)
        if streams:
            await c.delete(*streams)
        await c.aclose()

    rows += await bench_backend("redis-pubsub", lambda: RedisPubSubSink("bench-ps", url=REDIS_URL,
                                                                         channel=f"bench-{tag}"), n, batches)
    rows += await bench_backend("redis-stream", rs_factory, n, batches, redis_cleanup)

    # PostgreSQL: a private schema, dropped afterwards
    import psycopg

    schema = f"bench_sinks_{tag}"

    async def pg_cleanup() -> None:
        async with await psycopg.AsyncConnection.connect(PG_DSN, autocommit=True) as conn:
            await conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")

    rows += await bench_backend("postgres", lambda: PostgresSink("bench-pg", dsn=PG_DSN, schema=schema), n, batches,
                                pg_cleanup)

    # NATS JetStream: one stream per run, deleted afterwards
    import nats

    stream = f"BENCH_SINKS_{tag.upper()}"

    async def nats_cleanup() -> None:
        nc = await nats.connect(NATS_URL)
        try:
            await nc.jetstream().delete_stream(stream)
        finally:
            await nc.close()

    rows += await bench_backend("nats", lambda: NatsSink("bench-nats", url=NATS_URL, stream=stream,
                                                         stream_subjects=["bench.>"]), n, batches, nats_cleanup)

    # S3 via moto's server
    from moto.server import ThreadedMotoServer

    os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        rows += await bench_backend("s3 (moto)", lambda: S3Sink("bench-s3", bucket="bench-sinks",
                                                                endpoint=f"http://{host}:{port}", create_bucket=True),
                                    min(n, 2000), [1, 50, 500])
    finally:
        server.stop()

    return {"when": datetime.now(UTC).isoformat(timespec="seconds"), "python": platform.python_version(),
            "machine": f"{platform.machine()}, {os.cpu_count()} cores", "quick": quick, "rows": rows}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="2,000 envelopes per case instead of 10,000")
    ap.add_argument("--json", type=Path, help="also write the results here")
    args = ap.parse_args(argv)
    print("sink throughput (Delivery.deliver, one batch at a time, signed ~500 B envelopes)", flush=True)
    result = asyncio.run(main_async(args.quick))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

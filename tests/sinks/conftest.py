"""Fixtures for the sink tests: signed envelopes, and the test run's own servers.

Every test gets fresh stream keys, channels, schemas, JetStream streams and buckets, so tests
never see each other's data. A server that is down skips the test locally and FAILS it under
CI=true (tests.support.require)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable, Iterator

import pytest

from app.envelope import Layout, encode, new_envelope
from app.security.signing import SigningKey, sign
from app.sinks.base import SinkRecord
from tests import servers
from tests.support import require

WORKER_KEY = SigningKey.hmac_sha256("worker-test", b"k" * 32)


def make_records(n: int, *, topic: str | None = None, layout: Layout = Layout.REVIEWED, signed: bool = True,
                 start: int = 0) -> list[SinkRecord]:
    """`n` envelopes as the worker publishes them to `<topic>.v3` (signed, with labels,
    extensions, trace context, a non-canonical JSON payload), decoded like the runner does."""
    topic = topic or f"orders.sink{uuid.uuid4().hex[:8]}"
    suffix = ".v3" if layout is Layout.REVIEWED else ".v2"
    out = []
    for i in range(start, start + n):
        env = new_envelope(topic, {"order_id": i, "status": "paid", "amount": 12.5, "items": [i, "x"]},
                           namespace="order-events", correlation_id=f"c-{i % 7}", labels={"region": "eu", "i": str(i)},
                           extensions={"x.seq": i.to_bytes(8, "big"), "a.flag": b"\x01"})
        obs = env.ensure_observability()
        obs.trace_id = uuid.uuid4().hex
        obs.span_id = uuid.uuid4().hex[:16]
        raw = sign(env, WORKER_KEY, layout) if signed else encode(env, layout)
        out.append(SinkRecord.from_bytes(raw, topic=topic + suffix, partition=i % 2, offset=i))
    return out


@pytest.fixture
def records() -> Callable[..., list[SinkRecord]]:
    return make_records


@pytest.fixture
def redis_url() -> str:
    """The test run's own Redis (started on first use; tests/servers.py)."""
    return servers.redis_url()


@pytest.fixture
def nats_url() -> str:
    return servers.nats_url()


@pytest.fixture
def pg_dsn() -> str:
    return servers.pg_dsn()


@pytest.fixture
async def pg_schema(pg_dsn: str) -> AsyncIterator[str]:
    """A private schema (so a private prism_events table), dropped afterwards."""
    import psycopg

    schema = f"prism_sink_{uuid.uuid4().hex[:10]}"
    yield schema
    for _ in range(50):  # the server may be coming back from an outage test
        try:
            async with await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True, connect_timeout=2) as conn:
                # A failed test may leave a claim's transaction open (row locks): never wait on it forever.
                await conn.execute("SET lock_timeout = '10s'")
                await conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
            return
        except psycopg.OperationalError:
            await asyncio.sleep(0.2)


@pytest.fixture
async def nats_stream(nats_url: str) -> AsyncIterator[str]:
    """A fresh JetStream stream name; the stream is deleted afterwards."""
    import nats

    name = f"PRISM_SINK_{uuid.uuid4().hex[:10].upper()}"
    yield name
    try:
        nc = await nats.connect(nats_url, connect_timeout=2, max_reconnect_attempts=20, reconnect_time_wait=0.2)
        try:
            await nc.jetstream().delete_stream(name)
        finally:
            await nc.close()
    except Exception as exc:  # best-effort cleanup: the stream name is unique anyway
        print(f"could not delete JetStream stream {name}: {exc}")


@pytest.fixture
def s3_endpoint(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """moto's S3-compatible server on a free loopback port (fake credentials, as moto wants)."""
    try:
        from moto import server as moto_server
    except ImportError as exc:  # moto[server] is a dev dependency
        require(False, f"moto[server] is required for the S3 sink tests: {exc}")
        raise
    for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                 "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(k, v)
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()

"""Fixtures for the SDK tests: one URL per real backend, each isolated per test.

* Kafka: one embedded broker for the session (it starts in ~0.1 s), a fresh topic per test,
  a short session timeout (the broker holds a new group's first join for half of it).
* Redis: a unique key prefix per test (`?prefix=`); every key under it is deleted after.
* NATS: a unique stream prefix per test, memory storage; its streams are deleted after.
* PostgreSQL: a unique schema per test (`?schema=`), dropped after.

A missing server skips the test locally and FAILS it under CI=true.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator

import pytest

from app.broker.embedded import BrokerBinaryNotFound, EmbeddedBroker, resolve_broker_binary
from tests import servers
from tests.support import require

BACKENDS = ["kafka", "redis", "nats", "postgres"]


@pytest.fixture(scope="session")
def kafka_broker() -> Iterator[EmbeddedBroker]:
    try:
        resolve_broker_binary()
    except BrokerBinaryNotFound as exc:
        require(False, f"embedded Kafka broker: {exc}")
    broker = EmbeddedBroker(startup_timeout=20)
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture
def kafka_url(kafka_broker: EmbeddedBroker) -> str:
    return f"kafka://{kafka_broker.bootstrap}?session_timeout_ms=2000&heartbeat_interval_ms=500"


@pytest.fixture
def redis_url() -> Iterator[str]:
    import redis

    client = redis.Redis.from_url(servers.redis_url(), socket_connect_timeout=3)
    try:
        client.ping()
    except Exception as exc:
        require(False, f"Redis at {servers.redis_url()}: {exc!r}")
    prefix = f"prism-test:sdk:{uuid.uuid4().hex[:12]}:"
    yield f"{servers.redis_url()}?prefix={prefix}&claim_idle_ms=2000"
    keys = list(client.scan_iter(match=prefix + "*"))
    if keys:
        client.delete(*keys)
    client.close()


async def _nats_cleanup(prefix: str) -> None:
    import nats

    nc = await nats.connect(servers.nats_url(), connect_timeout=3)
    try:
        js = nc.jetstream()
        for info in await js.streams_info():
            if info.config.name.startswith(prefix):
                await js.delete_stream(info.config.name)
    finally:
        await nc.close()


@pytest.fixture
def nats_url() -> Iterator[str]:
    import nats

    async def ping() -> None:
        nc = await nats.connect(servers.nats_url(), connect_timeout=3, max_reconnect_attempts=0)
        try:
            await nc.jetstream().account_info()
        finally:
            await nc.close()

    try:
        asyncio.run(ping())
    except Exception as exc:
        require(False, f"NATS JetStream at {servers.nats_url()}: {exc!r}")
    prefix = f"PRISMTEST{uuid.uuid4().hex[:10]}"
    yield f"{servers.nats_url()}?stream_prefix={prefix}&storage=memory"
    asyncio.run(_nats_cleanup(prefix))


@pytest.fixture
def pg_url() -> Iterator[str]:
    import psycopg

    try:
        conn = psycopg.connect(servers.pg_dsn(), autocommit=True, connect_timeout=3)
    except Exception as exc:
        require(False, f"PostgreSQL at {servers.pg_dsn()}: {exc!r}")
    schema = f"prism_sdk_{uuid.uuid4().hex[:10]}"
    yield f"{servers.pg_dsn()}?schema={schema}&poll_ms=200"
    conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
    conn.close()


@pytest.fixture(params=BACKENDS)
def backend_url(request: pytest.FixtureRequest) -> str:
    """The URL of each real backend in turn: the one thing portable code changes."""
    name = {"postgres": "pg_url"}.get(request.param, f"{request.param}_url")
    return request.getfixturevalue(name)


@pytest.fixture
def topic() -> str:
    return f"sdk.t{uuid.uuid4().hex[:12]}"

"""Subscribers report the schema versions they read to the registry by themselves
(RFC-030 "active consumers per schema version"): a real SDK subscriber on Redis Streams, a
real registry served by uvicorn over TCP, and the round trip read back through the
registry's API and CLI. A registry that is down or hangs must not disturb consumption."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import time
from collections.abc import Iterator

import pytest
from typer.testing import CliRunner

from app.schema.cli import schema_app
from app.schema.registry import Registry
from app.schema.resolve import resolve_schema_config
from app.schema.store import SqliteStore
from app.sdk import PrismClient
from app.sdk.usage import subject_version
from tests.schema.conftest import free_port, serve_registry
from tests.support import USERS, auth_headers, write_users_file

V1 = json.dumps({"title": "Order", "type": "object", "properties": {"order_id": {"type": "string"}}})
V2 = json.dumps({"title": "Order", "type": "object",
                 "properties": {"order_id": {"type": "string"}, "note": {"type": "string"}}})


@pytest.fixture
def registry_server(tmp_path, monkeypatch) -> Iterator[tuple[str, Registry]]:  # type: ignore[no-untyped-def]
    """A real registry on SQLite behind uvicorn; the SDK (resolver and version reports) reads
    as the read-only user from the environment, like a deployed consumer."""
    from app.security.http_auth import auth_from_settings

    registry = Registry(SqliteStore(str(tmp_path / "registry.db")))
    auth = auth_from_settings(users_file=write_users_file(tmp_path / "users.yaml"), jwt_config=None,
                              allow_anonymous=None, realm="prism-schema-registry", where="tests")
    monkeypatch.delenv("PRISM_REGISTRY_TOKEN", raising=False)
    monkeypatch.setenv("PRISM_REGISTRY_USER", "reader")
    monkeypatch.setenv("PRISM_REGISTRY_PASSWORD", USERS["reader"][0])
    try:
        with serve_registry(registry, auth) as url:
            yield url, registry
    finally:
        registry.store.close()


async def publish_two_versions(backend_url: str, registry_url: str, registry: Registry, topic: str) -> None:
    """Three messages of v1 then three of v2, each producer resolving its schema from the registry."""
    registry.register(topic, V1, "JSON", actor="test")
    registry.register(topic, V2, "JSON", actor="test")
    schemas = [resolve_schema_config({"registry_type": "prism", "registry_url": registry_url, "subject": topic,
                                      "version": v}) for v in ("1", "2")]
    assert [subject_version(s.url) for s in schemas] == [(topic, 1), (topic, 2)]
    # a received envelope's URL: 5,000 digits were a ValueError in int(), not "names no version"
    assert subject_version(f"http://r/v1/subjects/{topic}/versions/{'9' * 5000}") is None
    for schema in schemas:
        async with PrismClient(backend_url, namespace="shop", schema=schema) as producer:
            for i in range(3):
                await producer.publish(topic, {"order_id": f"{schema.version}-{i}"})


@pytest.mark.integration
async def test_subscriber_reports_both_versions_it_read(redis_url, topic, registry_server):
    url, registry = registry_server
    await publish_two_versions(redis_url, url, registry, topic)
    async with asyncio.timeout(30):
        client = PrismClient(redis_url, namespace="shop", registry_url=url)
        async with client, client.subscribe(topic, group="billing") as sub:
            got = []
            for _ in range(6):
                msg = await sub.receive(timeout=5)
                got.append(msg.schema.schema_version)
                await msg.ack()
            reporter = client.version_reporter
            await reporter.flush(timeout=5)
    assert got == ["v1"] * 3 + ["v2"] * 3
    assert reporter.stats == {"sent": 2, "failed": 0}  # six messages, one report per version

    # read back: the consumer list, the per-version counts, and the CLI
    consumers = await asyncio.to_thread(_get_json, f"{url}/v1/subjects/{topic}/consumers")
    assert [(c["consumer_id"], c["version"]) for c in consumers] == [("billing", 1), ("billing", 2)]
    versions = await asyncio.to_thread(_get_json, f"{url}/v1/subjects/{topic}/versions")
    assert [(v["version"], v["active_consumers"]) for v in versions] == [(1, 1), (2, 1)]
    out = await asyncio.to_thread(CliRunner().invoke, schema_app, ["list", "--topic", topic, "--registry", url])
    assert out.exit_code == 0, out.output
    rows = [line.split() for line in out.output.splitlines()[1:]]
    assert [(r[0], r[2]) for r in rows] == [("v1", "1"), ("v2", "1")]  # VERSION, CONSUMERS (no labels)
    # delete safety now sees the reading consumer on v1 as well as v2
    refused = await asyncio.to_thread(_delete, f"{url}/v1/subjects/{topic}/versions/1")
    assert refused[0] == 422 and "billing" in refused[1]


@pytest.mark.integration
async def test_unreachable_or_hanging_registry_does_not_disturb_consumption(redis_url, topic, registry_server,
                                                                            caplog):
    url, registry = registry_server
    await publish_two_versions(redis_url, url, registry, topic)

    # 1) a registry that accepts connections and never answers: reads must not wait for it
    hang = socket.socket()
    hang.bind(("127.0.0.1", 0))
    hang.listen(16)  # never accept()ed: the POST connects, then waits for a response until its timeout
    try:
        client = PrismClient(redis_url, namespace="shop", registry_url=f"http://127.0.0.1:{hang.getsockname()[1]}")
        client.version_reporter.close_timeout = 0.1
        async with asyncio.timeout(30), client, client.subscribe(topic, group="hung") as sub:
            t0 = time.monotonic()
            got = [await sub.receive(timeout=5) for _ in range(6)]
            elapsed = time.monotonic() - t0
            for m in got:
                await m.ack()
            stats_while_reading = dict(client.version_reporter.stats)
        assert [m.payload()["order_id"] for m in got] == [f"v{v}-{i}" for v in (1, 2) for i in range(3)]
        # both reports were still in flight (2 s timeout) when all six messages had been handed out
        assert stats_while_reading == {"sent": 0, "failed": 0}, stats_while_reading
        assert elapsed < client.version_reporter.timeout, elapsed
    finally:
        hang.close()

    # 2) nothing listening at all: one WARNING, then DEBUG; consumption unaffected
    dead = f"http://127.0.0.1:{free_port()}"
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="prism.sdk.usage"):
        client = PrismClient(redis_url, namespace="shop", registry_url=dead)
        async with asyncio.timeout(30), client, client.subscribe(topic, group="dead") as sub:
            got = [await sub.receive(timeout=5) for _ in range(6)]
            for m in got:
                await m.ack()
            await client.version_reporter.flush(timeout=5)
            assert client.version_reporter.stats == {"sent": 0, "failed": 2}
    assert len(got) == 6
    levels = [r.levelno for r in caplog.records if "could not report schema" in r.getMessage()]
    assert levels == [logging.WARNING, logging.DEBUG]


def test_subject_version_from_schema_urls() -> None:
    assert subject_version("http://r:8081/v1/subjects/orders.created/versions/3") == ("orders.created", 3)
    assert subject_version("http://r:8081/subjects/orders.created-value/versions/12") == ("orders.created-value", 12)
    assert subject_version("http://r/v1/subjects/a%2Fb/versions/1") == ("a/b", 1)
    assert subject_version("file:///schemas/order.proto") is None
    assert subject_version("/repo@abc123#schemas/order.proto") is None
    assert subject_version("http://r/v1/subjects/orders/versions/latest") is None


def _get_json(url: str) -> object:
    import urllib.request

    with urllib.request.urlopen(urllib.request.Request(url, headers=auth_headers("reader")), timeout=10) as r:
        return json.loads(r.read())


def _delete(url: str) -> tuple[int, str]:
    import urllib.error
    import urllib.request

    try:
        req = urllib.request.Request(url, method="DELETE", headers=auth_headers("admin"))
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()

"""`check_compat` and the `prism envelope migrate` / `check-compat` commands."""

from __future__ import annotations

import asyncio
import json

import pytest
import redis.asyncio as aredis
import typer
from typer.testing import CliRunner

from app.cli.migrate import register
from app.envelope import Layout
from app.schema.resolve import build_resolved
from app.sdk import PrismClient
from app.sdk.compat import check_compat

pytestmark = pytest.mark.integration
SCHEMA = build_resolved('{"title": "Order", "type": "object"}', "JSON", url="registry/orders/2", version="v2")


def cli() -> typer.Typer:
    app = typer.Typer()
    envelope_app = typer.Typer()
    app.add_typer(envelope_app, name="envelope")
    register(envelope_app)
    return app


async def mixed_stream(redis_url: str, topic: str) -> None:
    """Two reviewed envelopes with schema v2, one draft envelope without schema, one legacy entry."""
    async with PrismClient(redis_url, namespace="shop", schema=SCHEMA) as reviewed, \
            PrismClient(redis_url, namespace="shop", layout=Layout.DRAFT) as draft:
        await reviewed.publish_batch([(topic, {"n": 1}), (topic, {"n": 2})])
        await draft.publish(topic, {"n": 3})
        r = aredis.Redis.from_url(redis_url.split("?")[0])
        await r.xadd(reviewed.backend.key(topic), {"data": b'{"meta":{"schema":"v1"},"payload":{"n":4}}'})
        await r.aclose()


async def test_check_compat_counts_shapes_and_explains_problems(redis_url, topic):
    await mixed_stream(redis_url, topic)

    sdk = await check_compat(redis_url, topic)
    assert (sdk.sampled, sdk.readable, sdk.compatible) == (4, 3, False)
    assert dict(sdk.shapes) == {"prism-reviewed": 2, "prism-draft": 1, "redis-json": 1}
    assert dict(sdk.layouts) == {"reviewed": 2, "draft": 1}
    assert dict(sdk.schema_versions) == {"v2": 2, "(none)": 1}
    assert len(sdk.problems) == 1 and "redis-json message, not a Prism envelope" in sdk.problems[0]

    assert (await check_compat(redis_url, topic, dual_read=True)).compatible is True

    v1_consumer = await check_compat(redis_url, topic, expect_layout="draft", dual_read=True)
    assert v1_consumer.readable == 2
    assert sum("reviewed layout, the consumer parses the draft layout" in p for p in v1_consumer.problems) == 2

    pinned = await check_compat(redis_url, topic, expect_version="2", dual_read=True)
    assert pinned.readable == 3 and any("schema version (none), the consumer expects 2" in p for p in pinned.problems)

    assert (await check_compat(redis_url, topic + ".empty")).compatible is None


async def test_check_compat_samples_kafka_without_consuming(kafka_url, topic):
    async with PrismClient(kafka_url, namespace="shop", schema=SCHEMA) as client:
        await client.publish_batch([(topic, {"n": i}) for i in range(5)])
        report = await check_compat(kafka_url, topic, sample=3, expect_version="v2")
        assert (report.sampled, report.compatible, dict(report.layouts)) == (3, True, {"reviewed": 3})
        async with asyncio.timeout(20), client.subscribe(topic, group="after-check") as sub:
            got = []
            while len(got) < 5:
                got += await sub.receive_batch(5, timeout=5)
        assert [m.payload()["n"] for m in got] == [0, 1, 2, 3, 4]  # the check consumed nothing


def test_check_compat_command_exit_codes(redis_url, topic):
    asyncio.run(mixed_stream(redis_url, topic))
    runner = CliRunner()
    bad = runner.invoke(cli(), ["envelope", "check-compat", "--topic", topic, "--url", redis_url])
    assert bad.exit_code == 1 and "NOT compatible" in bad.output and "redis-json" in bad.output
    ok = runner.invoke(cli(), ["envelope", "check-compat", "--topic", topic, "--url", redis_url, "--dual-read",
                               "--json"])
    assert ok.exit_code == 0 and json.loads(ok.output)["readable"] == 4
    empty = runner.invoke(cli(), ["envelope", "check-compat", "--topic", topic + "x", "--url", redis_url])
    assert empty.exit_code == 3
    wrong = runner.invoke(cli(), ["envelope", "check-compat", "--topic", topic, "--url", "amqp://h"])
    assert wrong.exit_code == 2 and "unsupported backend URL scheme" in wrong.output


def test_migrate_command_moves_a_stream(redis_url, pg_url, topic):
    async def seed() -> list[str]:
        async with PrismClient(redis_url, namespace="shop") as client:
            return await client.publish_batch([(topic, {"n": i}) for i in range(7)])

    ids = asyncio.run(seed())
    result = CliRunner().invoke(cli(), ["envelope", "migrate", "--from", redis_url, "--to", pg_url, "--topic", topic,
                                        "--idle-seconds", "0.3", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output[result.output.index("{"):])
    assert (report["copied"], report["duplicates_skipped"], report["source_pending"]) == (7, 0, 0)

    async def stored() -> list[str]:
        async with PrismClient(pg_url, namespace="r") as client, client.subscribe(topic, group="g") as sub:
            return [m.message_id for m in await sub.receive_batch(20, timeout=3)]

    assert sorted(asyncio.run(stored())) == sorted(ids)
    refused = CliRunner().invoke(cli(), ["envelope", "migrate", "--from", pg_url, "--to", redis_url, "--topic", topic])
    assert refused.exit_code == 2 and "source must be a Redis stream" in refused.output

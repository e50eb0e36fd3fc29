"""The delivery loop's policies with real clients pointed at a loopback port where nothing
listens (a backend that is down): abort on shutdown, DLQ retries, and no secrets in errors."""

from __future__ import annotations

import asyncio

import pytest

from app.errors import SinkError
from app.sinks.delivery import Delivery, OutagePolicy, dlq_topic_of
from app.sinks.postgres import PostgresSink
from app.sinks.redis_stream import RedisStreamSink
from tests.sinks.conftest import make_records

DEAD_REDIS = "redis://127.0.0.1:9/0"


async def test_wait_policy_gives_up_unacknowledged_when_the_worker_stops() -> None:
    recs = make_records(5)
    stopping = False
    sink = RedisStreamSink("rs", url=DEAD_REDIS, timeout_s=1)
    delivery = Delivery(sink, OutagePolicy("wait", backoff_initial_s=0.01, backoff_max_s=0.05), dlq=None,
                        should_abort=lambda: stopping)
    task = asyncio.create_task(delivery.deliver(recs))
    while sink.stats.failed_attempts < 3:  # waiting for the backend, as long as it takes
        await asyncio.sleep(0.01)
    assert not task.done()
    stopping = True
    result = await asyncio.wait_for(task, 2)
    assert result.aborted and result.written == 0 and result.dlq == 0
    assert sink.stats.aborted == 1 and sink.stats.outages == 1 and sink.stats.in_outage
    assert "Connect" in sink.stats.last_error or "connect" in sink.stats.last_error


async def test_dlq_writes_are_retried_until_they_succeed() -> None:
    recs = make_records(2)
    calls = 0
    written: list = []

    async def flaky_dlq(batch) -> None:
        nonlocal calls
        calls += 1
        if calls < 3:
            raise ConnectionError("broker unavailable")
        written.extend(batch)

    sink = RedisStreamSink("rs", url=DEAD_REDIS, timeout_s=1)
    policy = OutagePolicy("dlq", max_attempts=2, backoff_initial_s=0.01, backoff_max_s=0.02)
    result = await Delivery(sink, policy, dlq=flaky_dlq).deliver(recs)
    assert result.dlq == 2 and calls == 3 and len(written) == 2
    assert {dict(r.headers)["prism.errors.stage"] for r in written} == {b"sink:rs"}


def test_dlq_policy_needs_a_dlq_writer() -> None:
    with pytest.raises(SinkError, match="no DLQ writer"):
        Delivery(RedisStreamSink("rs", url=DEAD_REDIS), OutagePolicy("dlq"), dlq=None)


async def test_errors_never_contain_the_password() -> None:
    sink = PostgresSink("pg", dsn="postgresql://prism:hunter2-secret@127.0.0.1:9/db", timeout_s=1)
    with pytest.raises(SinkError) as info:
        await sink.write_batch(make_records(1))
    assert "hunter2-secret" not in str(info.value)
    assert "sinks.pg" in str(info.value) and "postgres sink 'pg'" in str(info.value)


def test_backoff_is_capped_and_jittered() -> None:
    p = OutagePolicy(backoff_initial_s=0.1, backoff_max_s=1.0)
    first = [p.backoff(1) for _ in range(200)]
    late = [p.backoff(30) for _ in range(200)]
    assert all(0.05 <= x <= 0.1 for x in first) and len(set(first)) > 100
    assert all(0.5 <= x <= 1.0 for x in late)


def test_a_sinks_dlq_is_its_sources_dlq() -> None:
    assert dlq_topic_of("orders.created.v3") == "orders.created.dlq"
    assert dlq_topic_of("orders.created.v2", ".dead") == "orders.created.dead"
    assert dlq_topic_of("other") == "other.dlq"

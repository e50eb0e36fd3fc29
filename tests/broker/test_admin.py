"""ensure_topics against the embedded broker."""

from __future__ import annotations

import uuid

import pytest
from aiokafka.admin import AIOKafkaAdminClient

from app.broker.admin import TopicError, TopicPartitionMismatch, check_retention, ensure_topics
from app.broker.embedded import BrokerError, EmbeddedBroker, find_free_port


def fresh(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


async def partition_counts(bootstrap: str, topics: list[str]) -> dict[str, int]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        return {t["topic"]: len(t["partitions"]) for t in await admin.describe_topics(topics)}
    finally:
        await admin.close()


async def all_topics(bootstrap: str) -> set[str]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        return set(await admin.list_topics())
    finally:
        await admin.close()


@pytest.mark.integration
async def test_creates_topics_with_declared_partitions_and_is_idempotent(broker: EmbeddedBroker) -> None:
    orders, events, single = fresh("orders"), fresh("events"), fresh("single")
    declared = {orders: 4, events: 2, single: 1}
    assert await ensure_topics(broker.bootstrap, declared) == dict.fromkeys(declared, "created")
    assert await partition_counts(broker.bootstrap, list(declared)) == declared
    assert await ensure_topics(broker.bootstrap, declared) == dict.fromkeys(declared, "exists")
    # a mix of existing and new topics; nothing else gets created on the way
    extra = fresh("extra")
    result = await ensure_topics(broker.bootstrap, {orders: 4, extra: 3})
    assert result == {orders: "exists", extra: "created"}
    assert await all_topics(broker.bootstrap) == {*declared, extra}


@pytest.mark.integration
async def test_wrong_partition_count_on_existing_topic_is_a_precise_error(broker: EmbeddedBroker) -> None:
    a, b = fresh("a"), fresh("b")
    await ensure_topics(broker.bootstrap, {a: 4, b: 2})
    with pytest.raises(TopicPartitionMismatch) as info:
        await ensure_topics(broker.bootstrap, {a: 3, b: 2})
    assert info.value.mismatches == {a: (4, 3)}
    message = str(info.value)
    assert f"topic {a!r} has 4 partition(s) but 3 are declared" in message
    assert "fix:" in message
    # nothing was changed
    assert await partition_counts(broker.bootstrap, [a, b]) == {a: 4, b: 2}


@pytest.mark.integration
async def test_topic_configs_are_accepted(broker: EmbeddedBroker) -> None:
    changelog = fresh("app-table-changelog")
    result = await ensure_topics(broker.bootstrap, {changelog: 2},
                                 configs={changelog: {"cleanup.policy": "compact"}})
    assert result == {changelog: "created"}


@pytest.mark.parametrize("topics, match", [
    ({"bad name": 1}, "invalid topic name"),
    ({"..": 1}, "invalid topic name"),
    ({"x" * 250: 1}, "invalid topic name"),
    ({"ok": 0}, "declares 0 partitions"),
    ({"ok": -2}, "declares -2 partitions"),
    ({"ok": True}, "declares True partitions"),
    ({"ok": 2.0}, "declares 2.0 partitions"),
])
async def test_invalid_declarations_fail_before_contacting_the_broker(topics: dict, match: str) -> None:
    with pytest.raises(TopicError, match=match):
        await ensure_topics("127.0.0.1:1", topics)


async def test_unreachable_broker_is_a_broker_error() -> None:
    port = find_free_port()  # nothing listens there
    with pytest.raises(BrokerError, match=f"cannot reach Kafka at 127.0.0.1:{port}"):
        await ensure_topics(f"127.0.0.1:{port}", {"t": 1}, timeout=2)


async def test_empty_declaration_is_a_no_op() -> None:
    assert await ensure_topics("127.0.0.1:1", {}) == {}


@pytest.mark.integration
async def test_retention_is_read_back_with_describe_configs(broker: EmbeddedBroker) -> None:
    short, forever, plain = fresh("src-short"), fresh("src-forever"), fresh("src-plain")
    await ensure_topics(broker.bootstrap, {short: 1, forever: 1, plain: 1},
                        configs={short: {"retention.ms": "3600000"}, forever: {"retention.ms": "-1"}})
    checks = {c.topic: c for c in await check_retention(
        broker.bootstrap, {short: 3_600_000, forever: 3_600_000, plain: 3_600_000})}
    assert (checks[short].status, checks[short].actual_ms) == ("ok", 3_600_000)
    assert (checks[forever].status, checks[forever].actual_ms) == ("too_long", -1)
    # The embedded broker reports only configs set on the topic: no value means its default applies.
    assert checks[plain].status == "unknown" and "no retention.ms" in checks[plain].detail
    tighter = (await check_retention(broker.bootstrap, {short: 1_800_000}))[0]
    assert (tighter.status, tighter.actual_ms, tighter.limit_ms) == ("too_long", 3_600_000, 1_800_000)


async def test_retention_check_never_raises_for_an_unreachable_broker() -> None:
    port = find_free_port()
    (check,) = await check_retention(f"127.0.0.1:{port}", {"orders": 60_000}, timeout=2)
    assert check.status == "unchecked" and "DescribeConfigs failed" in check.detail
    assert await check_retention(f"127.0.0.1:{port}", {}) == []

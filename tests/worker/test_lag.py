"""`read_group_lag` (app/worker/lag.py), the reader of `prism status --group`, on the embedded
broker: a group's lag without naming its topics."""

from __future__ import annotations

import uuid
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.structs import OffsetAndMetadata

from app.broker.admin import ensure_topics
from app.worker.lag import read_group_lag


async def test_a_groups_topics_are_found_on_a_broker_that_cannot_list_them_all(broker: Any) -> None:
    """The embedded broker closes the connection on an OffsetFetch for "all topics", so the
    documented `prism status --group prism-<topology>` (no --topic) failed with "Connection ...
    closed" there. The topics the group committed on are found partition by partition; a topic
    it never committed on is left out."""
    topic, other, group = (f"lag-{uuid.uuid4().hex[:8]}", f"lag-other-{uuid.uuid4().hex[:8]}",
                           f"g-{uuid.uuid4().hex[:8]}")
    await ensure_topics(broker.bootstrap, {topic: 2, other: 1})
    producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap)
    await producer.start()
    try:
        for i in range(5):
            await producer.send_and_wait(topic, f"m{i}".encode(), partition=0)
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(bootstrap_servers=broker.bootstrap, group_id=group, enable_auto_commit=False)
    await consumer.start()
    try:
        consumer.assign([TopicPartition(topic, 0)])
        await consumer.commit({TopicPartition(topic, 0): OffsetAndMetadata(2, "")})
    finally:
        await consumer.stop()

    lag = await read_group_lag(broker.bootstrap, group)
    assert lag.topics == (topic,), lag
    by_partition = {p.partition: p for p in lag.partitions}
    assert set(by_partition) == {0, 1} and by_partition[0].committed == 2 and by_partition[0].lag == 3
    assert by_partition[1].committed is None
    assert (await read_group_lag(broker.bootstrap, f"g-{uuid.uuid4().hex[:8]}")).partitions == ()  # nothing committed


def test_both_lag_variables_are_reported_at_once() -> None:
    """A bad PRISM_LAG_INTERVAL_S hid a bad PRISM_LAG_TIMEOUT_S until the next start."""
    import pytest

    from app.errors import ConfigProblems
    from app.worker.lag import lag_settings_from_env

    with pytest.raises(ConfigProblems) as err:
        lag_settings_from_env({"PRISM_LAG_INTERVAL_S": "nan", "PRISM_LAG_TIMEOUT_S": "-1"})
    assert [p.path for p in err.value.problems] == ["PRISM_LAG_INTERVAL_S", "PRISM_LAG_TIMEOUT_S"]

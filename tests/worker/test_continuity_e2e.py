"""Records the consumer drops before the agent sees them are fetched and processed anyway.

Faust can drop a record it already fetched (seen in the crash test: one record right after
start-up, then committed past - app/worker/continuity.py). Here the drop is made deterministic:
the consumer's delivery callback swallows chosen records, exactly what Faust does when it
discards them. Every input must still reach `.v3` exactly once, and the group's committed
offsets must move past the repaired records (Faust was told they are done)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from aiokafka import AIOKafkaConsumer, TopicPartition

from tests.brokers import BrokerUnderTest
from tests.worker.conftest import make_topology
from tests.worker.harness import RunningPipeline

N = 60
DROPPED = {(0, 0), (0, 7), (0, 8), (1, 14)}  # (partition, offset): a first record, a 2-wide hole, a single one


async def test_dropped_records_are_fetched_processed_and_committed(any_broker: BrokerUnderTest, tmp_path: Path,
                                                                   dev_keys) -> None:
    broker = any_broker  # the guard is broker-independent: it must hold on Apache Kafka too
    topo = make_topology(tmp_path, dev_keys, partitions=2)
    rp = RunningPipeline(topo, broker.bootstrap, tmp_path / "data", embedded=broker.embedded)
    # The fetch loop hands a source record to the batch list (app/worker/batch_source.py,
    # directly or through the conductor): swallow chosen records there, exactly what Faust does
    # when it discards one it fetched.
    buffer = rp.pipeline.sources[0].buffer
    put = buffer.put
    swallowed: list[tuple[int, int]] = []

    def dropping_put(message) -> None:
        if (message.partition, message.offset) in DROPPED and (message.partition, message.offset) not in swallowed:
            swallowed.append((message.partition, message.offset))
            return
        put(message)

    buffer.put = dropping_put
    async with rp:
        for i in range(N):
            await rp.producer.send(rp.source, json.dumps({"i": i}).encode(), partition=i % 2)
        await rp.producer.flush()
        await rp.wait_read(N, timeout=90)
        outputs = await rp.outputs()
        app_id = rp.pipeline.app.conf.id
        repaired = rp.pipeline.stats.holes_repaired
        await rp.pipeline.app.consumer.commit()

    assert sorted(swallowed) == sorted(DROPPED)  # the drops really happened
    assert repaired == len(DROPPED)
    sources = Counter(dict(r.headers)["prism-source"].decode() for r in outputs[rp.source + ".v3"])
    expected = {f"{rp.source}/{i % 2}/{i // 2}" for i in range(N)}
    assert set(sources) == expected, sorted(expected - set(sources))
    assert all(n == 1 for n in sources.values()), {k: n for k, n in sources.items() if n > 1}
    assert not outputs[rp.source + ".dlq"]

    probe = AIOKafkaConsumer(bootstrap_servers=broker.bootstrap, group_id=app_id, enable_auto_commit=False)
    await probe.start()
    try:
        committed = {p: await probe.committed(TopicPartition(rp.source, p)) for p in (0, 1)}
    finally:
        await probe.stop()
    assert committed == {0: N // 2, 1: N // 2}, committed

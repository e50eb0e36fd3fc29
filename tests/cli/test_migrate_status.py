"""`prism migrate status` on the embedded broker and on Apache Kafka (`any_broker`): the real CLI
in its own process, against topics and consumer groups this test sets up.

Held: a group that consumed part of `<source>.v2` is listed with the offset it committed and
its lag (log end - committed, the log end right on the embedded broker too); a group that reads
only `.v3` is not listed; the phase and dates come from the topology; the producer SDK adoption
counts recent source records per `producer_sdk_version` (envelopes without one and other input
shapes separately); the table has no literal rich markup."""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.structs import TopicPartition

from app.broker.admin import ensure_topics
from app.envelope import Layout, encode, new_envelope
from app.sdk.version import SDK_VERSION
from tests.brokers import BrokerUnderTest
from tests.cli.test_dlq_cli import assert_no_markup, prism
from tests.worker.conftest import dev_keys, make_topology  # noqa: F401 - fixture

PARTITIONS = 2
PER_PARTITION = 10  # records on each .v2 / .v3 partition
READ = 4  # records of partition 0 the .v2 group consumed before it committed


async def _produce(bootstrap: str, topic: str, values: list[bytes], partition: int) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        for v in values:
            await producer.send_and_wait(topic, v, partition=partition)
    finally:
        await producer.stop()


async def _consume_and_commit(bootstrap: str, group: str, tp: TopicPartition, n: int) -> None:
    """Read `n` records of `tp` from the start as `group`, then commit the position (n)."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False,
                                auto_offset_reset="earliest")
    await consumer.start()
    try:
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        got = 0
        while got < n:
            batch = await consumer.getmany(tp, timeout_ms=1000, max_records=n - got)
            got += sum(len(r) for r in batch.values())
        await consumer.commit({tp: got})
    finally:
        await consumer.stop()


async def _setup(bootstrap: str, source: str) -> tuple[str, str]:
    await ensure_topics(bootstrap, {source: PARTITIONS, f"{source}.v2": PARTITIONS, f"{source}.v3": PARTITIONS})
    record = b"x"
    for layout_topic in (f"{source}.v2", f"{source}.v3"):
        for p in range(PARTITIONS):
            await _produce(bootstrap, layout_topic, [record] * PER_PARTITION, p)
    # source records: 3 from this SDK, 1 envelope without a version, 1 from another SDK, 2 not envelopes
    def env(version: str | None) -> bytes:
        return encode(new_envelope(source, {"a": 1}, namespace="order-events", producer_sdk_version=version),
                      Layout.REVIEWED)

    await _produce(bootstrap, source, [env(SDK_VERSION)] * 3 + [env(None), env("prism-go/2.0.0")], 0)
    await _produce(bootstrap, source, [b"raw bytes", b'{"payload": 1}'], 1)
    suffix = uuid.uuid4().hex[:6]
    on_v2, on_v3 = f"billing-{suffix}", f"audit-{suffix}"
    await _consume_and_commit(bootstrap, on_v2, TopicPartition(f"{source}.v2", 0), READ)
    await _consume_and_commit(bootstrap, on_v3, TopicPartition(f"{source}.v3", 0), PER_PARTITION)
    return on_v2, on_v3


async def test_groups_on_v2_with_offsets_and_lag_and_sdk_adoption(any_broker: BrokerUnderTest, tmp_path: Path,
                                                                  dev_keys) -> None:  # noqa: F811
    topo = make_topology(tmp_path, dev_keys, partitions=PARTITIONS, outputs={
        "layouts": ["v2", "v3"], "migration": {"deprecation_date": "2020-01-01", "cutoff_date": "2999-01-01"}})
    source = topo.sources[0].topic
    on_v2, on_v3 = await _setup(any_broker.bootstrap, source)
    env = {"PRISM_BROKER_URL": any_broker.bootstrap, "PRISM_MIGRATION_CLOCK_OFFSET_S": None}

    res = await asyncio.to_thread(prism, "migrate", "status", "-t", str(tmp_path / "topology.yaml"), "--json",
                                  env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    doc = json.loads(res.stdout)
    assert doc["migration"]["v2"] == "deprecated" and doc["migration"]["v2_written"] is True
    assert doc["migration"]["cutoff_date"] == "2999-01-01T00:00:00Z"
    groups = {g["group"]: g for g in doc["v2_groups"]}
    assert on_v2 in groups and on_v3 not in groups, groups
    g = groups[on_v2]
    assert g["topics"] == [f"{source}.v2"]
    assert [(p["partition"], p["committed"], p["log_end"], p["lag"]) for p in g["partitions"]] == \
        [(0, READ, PER_PARTITION, PER_PARTITION - READ)]
    assert g["lag"] == PER_PARTITION - READ
    adoption = doc["sdk_adoption"]["topics"][source]
    assert adoption["records"] == 7 and adoption["complete"] is True
    assert adoption["versions"] == {SDK_VERSION: 3, "not_envelope": 2, "none": 1, "prism-go/2.0.0": 1}

    # the same for people: a table, no literal markup; after the cutoff (clock shifted) it says so
    env["PRISM_MIGRATION_CLOCK_OFFSET_S"] = str(1000 * 365 * 86400)
    res = await asyncio.to_thread(prism, "migrate", "status", "-t", str(tmp_path / "topology.yaml"), env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    out = res.stdout
    assert_no_markup(out)
    assert ".v2 is stopped" in out and "written now: no" in out
    assert on_v2 in out and on_v3 not in out
    assert SDK_VERSION in out and "not_envelope" in out


def test_without_a_broker_it_is_one_error_line(tmp_path: Path, dev_keys) -> None:  # noqa: F811
    make_topology(tmp_path, dev_keys)
    res = prism("migrate", "status", "-t", str(tmp_path / "topology.yaml"),
                env={"PRISM_BROKER_URL": None, "PRISM_BROKER_STATE_DIR": str(tmp_path / "no-broker")})
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    assert "error [no_broker] no broker configured" in res.stderr  # its own code, not prism_error
    assert_no_markup(res.stderr)

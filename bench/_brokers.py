"""The broker a backlog benchmark (`bench_release`, `bench_peers`) runs on: `--broker embedded`
(Prism's embedded Kafka-protocol broker, Tansu, as before) or `--broker kafka` (one Apache Kafka
node in KRaft mode, started from its jars by the launcher the Kafka tests use,
`tests.kafka.cluster.ApacheKafka`: both are dev tooling, and one launcher means the benchmark runs
the very broker the tests prove Prism against).

Everything a benchmark needs from either broker is in `BenchBroker`: the bootstrap address every
client gets, the broker's pid (its CPU is measured from /proc, the Tansu process or the Kafka JVM,
every thread) and the `PRISM_*` variables a worker gets on it - the ones `prism run` gives its
children: `PRISM_EMBEDDED=1` on the embedded broker (its workarounds on), and on Kafka
`PRISM_EMBEDDED=0` with `PRISM_BROKER_URL` and `PRISM_SECURITY_PROTOCOL` (no workarounds).

The Kafka node keeps the tests' small-machine settings (two network and two I/O threads, serial GC;
`tests/kafka/cluster.py`) except two JVM choices that would make a benchmark measure the test
setup instead of Kafka: the JIT's top tier (the tests stop at C1, which starts faster and runs
slower) and a 1 GiB heap. Before the first round it moves a warm-up backlog through itself, so
that the first contender does not pay for the broker's JIT compilation.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BROKERS = ("embedded", "kafka")
#: The JVM flags a benchmark adds to the tests' (`-XX:TieredStopAtLevel=1`): the last one wins.
BENCH_JVM_ARGS = ("-XX:TieredStopAtLevel=4",)
KAFKA_HEAP = "1g"
WARM_UP_MESSAGES = 20_000


@dataclass
class BenchBroker:
    """A running broker as a benchmark sees it."""

    kind: str  # "embedded" | "kafka"
    bootstrap: str
    pid: int | None  # the process whose CPU is the broker's
    description: str
    #: PRISM_* variables a worker gets on this broker, as `prism run` sets them for its children.
    worker_env: dict[str, str] = field(default_factory=dict)


@asynccontextmanager
async def bench_broker(kind: str, directory: Path) -> AsyncIterator[BenchBroker]:
    """Start the broker `kind` with its files under `directory`; stop it on exit."""
    if kind == "embedded":
        from app.broker.embedded import EmbeddedBroker

        async with EmbeddedBroker(log_dir=directory / "broker") as embedded:
            yield BenchBroker("embedded", embedded.bootstrap, embedded.pid, "embedded broker (Tansu)",
                              {"PRISM_EMBEDDED": "1"})
        return
    if kind != "kafka":
        raise SystemExit(f"unknown broker {kind!r}; one of {', '.join(BROKERS)}")
    from tests.kafka.cluster import ApacheKafka, fetch_kafka, prism_env

    # Started from this (the main) thread: the JVM's parent-death signal follows the starting thread.
    kafka = ApacheKafka(fetch_kafka(), directory / "kafka", heap=KAFKA_HEAP, extra_jvm_args=BENCH_JVM_ARGS).start()
    try:
        node = kafka.nodes[1]
        broker = BenchBroker("kafka", kafka.bootstrap, node.pid,
                             f"Apache Kafka {kafka.version} (1 KRaft node, JVM -Xmx{KAFKA_HEAP}, full JIT)",
                             {"PRISM_EMBEDDED": "0", **prism_env(kafka.client_config())})
        took = await warm_up(broker)
        print(f"{broker.description} on {broker.bootstrap} (pid {broker.pid}); warm-up {took:.1f} s", flush=True)
        yield broker
    finally:
        kafka.stop()


async def warm_up(broker: BenchBroker, n: int = WARM_UP_MESSAGES) -> float:
    """Write `n` 1 KB records to a fresh topic and read them back (the broker's produce and fetch
    paths compiled by its JIT before anything is measured); returns the seconds it took."""
    from app.broker.admin import ensure_topics
    from bench.bench_pipeline import preload
    from bench.bench_release import PARTITIONS, read_from_start

    t0 = time.monotonic()
    topic = f"bench.warmup.{uuid.uuid4().hex[:8]}"
    await ensure_topics(broker.bootstrap, {topic: PARTITIONS})
    await preload(broker.bootstrap, topic, [b"x" * 1024] * n)
    consumer = await read_from_start(broker.bootstrap, topic)
    seen = 0
    try:
        while seen < n and time.monotonic() - t0 < 300:
            batch = await consumer.getmany(timeout_ms=200, max_records=5000)
            seen += sum(len(rs) for rs in batch.values())
    finally:
        await consumer.stop()
    return time.monotonic() - t0


def describe(broker: BenchBroker) -> dict[str, Any]:
    """What a result file records about the broker."""
    return {"kind": broker.kind, "description": broker.description}

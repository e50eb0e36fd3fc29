"""A running pipeline for tests: topics created, worker in-process, helpers to produce and read."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaProducer

from app.broker.admin import BrokerSettings, ensure_topics
from app.demo.runner import read_all
from app.topology import Topology
from app.worker.faust_app import InProcessWorker
from app.worker.pipeline import PipelineApp


class RunningPipeline:
    def __init__(self, topology: Topology, bootstrap: str, data_dir: Path, *, app_id: str | None = None,
                 embedded: bool = True, settings: BrokerSettings | None = None, **pipeline_kw: Any) -> None:
        """`app_id` (the consumer group): pass the same one to run a second worker that resumes
        where a stopped one left off (e.g. after a topology fix). `embedded`: the broker is the
        embedded one (its workarounds on); False for Apache Kafka (`BrokerUnderTest.embedded`).
        `settings`: credentials of a secured cluster, used by the worker, the topic set-up, the
        test producer and `outputs()` (tests/kafka/test_worker_security.py). `pipeline_kw`: more
        `PipelineApp` arguments, e.g. `web_port` and `observe` for the management API."""
        self.settings = settings
        self.topology = topology
        self.bootstrap = bootstrap
        self.source = topology.sources[0].topic
        self.pipeline = PipelineApp(topology, bootstrap=bootstrap, data_dir=data_dir,
                                    app_id=app_id or f"test-{uuid.uuid4().hex[:8]}", embedded=embedded,
                                    broker_settings=settings, **pipeline_kw)
        self.worker = InProcessWorker(self.pipeline.app)
        self.producer: AIOKafkaProducer | None = None

    async def __aenter__(self) -> RunningPipeline:
        await ensure_topics(self.bootstrap, self.topology.topics(), settings=self.settings)
        self.producer = AIOKafkaProducer(bootstrap_servers=self.bootstrap, linger_ms=5,
                                         **(self.settings.aiokafka_kwargs() if self.settings else {}))
        await self.producer.start()
        await self.worker.start()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.worker.stop()
        if self.producer is not None:
            await self.producer.stop()

    async def send(self, value: bytes, headers: list[tuple[str, bytes]] | None = None,
                   key: bytes | None = None) -> Any:
        assert self.producer is not None
        return await (await self.producer.send(self.source, value, key=key, headers=headers or []))

    async def wait_read(self, n: int, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while self.pipeline.stats.read < n:
            if time.monotonic() > deadline:
                raise AssertionError(f"worker read {self.pipeline.stats.read} of {n} within {timeout}s")
            await asyncio.sleep(0.05)
        # the batch that read the last message also awaited its writes before counting

    async def outputs(self) -> dict[str, list[Any]]:
        t = self.topology
        topics = t.topics()
        names = [f"{self.source}.{x}" for x in t.outputs.layouts] + [self.source + t.dlq.topic_suffix]
        if t.archive.enabled and t.archive.topic:
            names.append(t.archive.topic)
        s = self.pipeline.summary()
        expected = s["emitted"] * len(names[:-1]) + s["dlq"]
        return await read_all(self.bootstrap, {n: topics[n] for n in names}, expected_total=expected, timeout=30,
                              settings=self.settings)


async def until(condition: Callable[[], bool], what: str, timeout: float = 90.0,
                state: Callable[[], Any] = lambda: None) -> None:
    """Wait (polling every 50 ms) until `condition()` holds; past `timeout` fail with `what`
    and what `state()` shows then - a condition, not a sleep, in every end-to-end test."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}: {state()}")
        await asyncio.sleep(0.05)

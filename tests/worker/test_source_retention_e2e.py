"""The worker checks, at start-up, how long the broker keeps its source topics (they hold
producer tokens) and logs a structured warning when it is longer than the topology allows."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

from app.broker.admin import ensure_topics
from tests.worker.conftest import make_topology
from tests.worker.harness import RunningPipeline


async def _checks(p: RunningPipeline, timeout: float = 30) -> list:
    deadline = time.monotonic() + timeout
    while p.pipeline.retention_checks is None:
        assert time.monotonic() < deadline, "the worker never checked the source retention"
        await asyncio.sleep(0.05)
    return p.pipeline.retention_checks


def _records(caplog) -> list[logging.LogRecord]:
    return [r for r in caplog.records if getattr(r, "event", None) == "source_retention"]


async def test_a_source_topic_kept_too_long_is_a_structured_warning(broker, tmp_path: Path, dev_keys,
                                                                    caplog) -> None:
    caplog.set_level(logging.DEBUG, logger="prism.worker")
    topo = make_topology(tmp_path, dev_keys, partitions=1)
    src = topo.sources[0].topic
    assert topo.source_retention_limits() == {src: 86_400_000}  # the shipped default, 24h
    await ensure_topics(broker.bootstrap, {src: 1}, configs={src: {"retention.ms": "-1"}})  # kept forever
    async with RunningPipeline(topo, broker.bootstrap, tmp_path / "w") as p:
        (check,) = await _checks(p)
    assert (check.status, check.actual_ms) == ("too_long", -1)
    (rec,) = _records(caplog)
    assert rec.levelno == logging.WARNING and "forever" in rec.getMessage() and "retention.ms=86400000" in \
        rec.getMessage()
    assert (rec.topic, rec.status, rec.retention_ms, rec.limit_ms) == (src, "too_long", -1, 86_400_000)


async def test_within_the_limit_is_quiet_and_unknown_is_said(broker, tmp_path: Path, dev_keys, caplog) -> None:
    caplog.set_level(logging.DEBUG, logger="prism.worker")
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    topo = make_topology(tmp_path / "a", dev_keys, partitions=1)
    src = topo.sources[0].topic
    await ensure_topics(broker.bootstrap, topo.topics(), configs=topo.topic_configs())
    async with RunningPipeline(topo, broker.bootstrap, tmp_path / "wa") as p:
        assert [c.status for c in await _checks(p)] == ["ok"]
    assert [r.levelno for r in _records(caplog)] == [logging.DEBUG]

    caplog.clear()
    other = make_topology(tmp_path / "b", dev_keys, partitions=1)  # created without retention.ms
    async with RunningPipeline(other, broker.bootstrap, tmp_path / "wb") as p:
        assert [c.status for c in await _checks(p)] == ["unknown"]
    (rec,) = _records(caplog)
    assert rec.levelno == logging.INFO and "could not check the retention" in rec.getMessage()
    assert src not in rec.getMessage() and rec.topic == other.sources[0].topic

"""The tables' changelog partitions are paused in aiokafka after their recovery, on Apache Kafka
(app/tables/recovery.py, ``_pause_changelogs``; issue 29).

Why: Faust's own pause after a recovery only narrows what it asks aiokafka for; aiokafka kept
fetching every changelog partition, in every fetch, and a fetch of idle changelogs alone held the
source partitions back for the whole long poll. What is held here, on the real broker:

* after the recovery the changelog partitions are paused in aiokafka and the worker consumer's
  fetch requests name only the source partitions; the tables' writes still reach the changelog;
* a recovery that begins again reads them: made fetchable before it reads (the resume), with a
  stale pause - issued for an earlier generation or before the recovery began reading - dropped
  (the guard). Either missing, the recovery waits for changelog records that are never fetched:
  it stalls for good, the worst outcome, and these tests time out;
* Faust's livelock check does not report a paused changelog as a partition aiokafka "stopped
  fetching from".

Restarts and rebalances (a second worker joining and leaving) with the pause in place:
tests/tables/test_recovery.py.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from pathlib import Path
from typing import Any

import pytest
from aiokafka import TopicPartition

from app.tables.recovery import wipe_partition
from app.worker.batch_source import set_fetching
from tests.worker.conftest import make_topology
from tests.worker.harness import RunningPipeline, until
from tests.worker.test_offsets import _Requests, requests  # noqa: F401 - the fixture

pytestmark = pytest.mark.integration

N = 60


def _changelog_tps(app: Any) -> set[Any]:
    names = app.tables.changelog_topics
    return {tp for tp in app.consumer.assignment() if tp.topic in names}


def _paused(app: Any) -> set[tuple[str, int]]:
    """What aiokafka has paused (read from outside its thread, as a test may)."""
    client = app.consumer._thread._ensure_consumer()
    return {(tp.topic, tp.partition) for tp in client._subscription.paused_partitions()}


def _as_pairs(tps: set[Any]) -> set[tuple[str, int]]:
    return {(tp.topic, tp.partition) for tp in tps}


async def _recovered_and_paused(rp: RunningPipeline) -> set[Any]:
    app = rp.pipeline.app
    await until(lambda: bool(_changelog_tps(app)) and _as_pairs(_changelog_tps(app)) <= _paused(app),
                "the changelog partitions paused in aiokafka after the recovery", timeout=30,
                state=lambda: {"changelogs": _changelog_tps(app), "paused": _paused(app)})
    return _changelog_tps(app)


def _fetched_topics(requests: _Requests, client_id: str, since: int) -> set[str]:  # noqa: F811
    out: set[str] = set()
    for request, _s in requests.by(client_id, "Fetch")[since:]:
        out |= {topic for topic, _partitions in request._topics}
    return out


async def _send(rp: RunningPipeline, n: int) -> None:
    """`n` more messages over both source partitions (each one writes the tables: dedup, counters)."""
    assert rp.producer is not None
    first = rp.pipeline.stats.read
    for i in range(first, first + n):
        await rp.producer.send(rp.source, json.dumps({"i": i}).encode(), partition=i % 2)
    await rp.producer.flush()


async def test_after_recovery_the_changelogs_are_paused_in_aiokafka_and_still_written(
        kafka, tmp_path: Path, dev_keys, requests: _Requests) -> None:  # noqa: F811
    topo = make_topology(tmp_path, dev_keys, partitions=2)
    rp = RunningPipeline(topo, kafka.bootstrap, tmp_path / "w", embedded=False)
    app = rp.pipeline.app
    async with rp:
        changelogs = await _recovered_and_paused(rp)
        client = app.consumer._thread._ensure_consumer()
        assert not (_paused(app) - _as_pairs(changelogs)), "a source partition was paused"
        # what aiokafka fetches from now on: the sources, never a changelog (a fetch sent before
        # the pause is listed when its answer comes: one long poll, KAFKA_FETCH_MAX_WAIT_MS)
        worker = client._client._client_id
        await asyncio.sleep(0.5)
        since = len(requests.by(worker, "Fetch"))
        ends_before = dict(await app.consumer.highwaters(*changelogs))  # the offsets probe's ListOffsets
        await _send(rp, N)
        await rp.wait_read(N, timeout=60)
        await until(lambda: len(requests.by(worker, "Fetch")) > since + 3, "fetches after the messages")
        fetched = _fetched_topics(requests, worker, since)
        assert fetched == {rp.source}, fetched
        # the producer side is untouched: the tables' writes reached their changelogs
        ends_after = dict(await app.consumer.highwaters(*changelogs))
        grown = {tp.topic for tp in ends_before if ends_after[tp] > ends_before[tp]}
        assert grown, f"no changelog grew after {N} messages: {ends_before} -> {ends_after}"
        assert _as_pairs(changelogs) <= _paused(app)


async def _recover_again(rp: RunningPipeline, *, inject: Any = None) -> tuple[Any, int, int]:
    """Begin a recovery again on the same aiokafka assignment (no rebalance: aiokafka keeps its
    paused changelogs) with one table partition wiped locally, so that the recovery must read its
    changelog from the start; return (table, partition, keys before the wipe). `inject(recovery,
    consumer)` runs right after the recovery's seek, before it reads."""
    app = rp.pipeline.app
    recovery = app.tables.recovery
    consumer = app.consumer
    changelogs = await _recovered_and_paused(rp)
    await _send(rp, N)
    await rp.wait_read(N, timeout=60)
    # a table with entries in a changelog partition this worker holds
    table, partition, keys = None, -1, 0
    for t in app.tables.values():
        for tp in sorted(changelogs):
            if tp.topic == t.changelog_topic.get_topic_name():
                n = len(list(t.data._db_for_partition(tp.partition).keys()))
                if n > keys:
                    table, partition, keys = t, tp.partition, n
    assert table is not None and keys > 1, "no table partition with entries to recover"
    await asyncio.sleep(1.0)  # let the last changelog writes be acknowledged (persisted offsets)
    if inject is not None:
        original = consumer.seek_wait

        async def seek_wait(partitions: Any) -> None:
            await original(partitions)
            await inject(recovery, consumer)

        consumer.seek_wait = seek_wait
    ready = recovery.completed
    ready.clear()
    assert wipe_partition(table, partition) == keys
    await recovery.on_rebalance(consumer.assignment(), set(), set(), generation_id=app.consumer_generation_id)
    return table, partition, keys


async def _assert_recovered(rp: RunningPipeline, table: Any, partition: int, keys: int) -> None:
    app = rp.pipeline.app
    recovery = app.tables.recovery
    db = table.data._db_for_partition(partition)
    await until(lambda: recovery.completed.is_set() and len(list(db.keys())) >= keys,
                "the recovery that began again to read the wiped partition's changelog", timeout=30,
                state=lambda: {"in_recovery": recovery.in_recovery, "keys": len(list(db.keys())), "want": keys,
                               "paused": _paused(app), "remaining": dict(recovery.active_remaining())})
    # and paused again once it is done
    await _recovered_and_paused(rp)


async def test_a_recovery_that_begins_again_resumes_the_paused_changelogs(kafka, tmp_path: Path, dev_keys) -> None:
    topo = make_topology(tmp_path, dev_keys, partitions=2)
    rp = RunningPipeline(topo, kafka.bootstrap, tmp_path / "w", embedded=False)
    async with rp:
        table, partition, keys = await _recover_again(rp)
        await _assert_recovered(rp, table, partition, keys)


async def test_a_stale_pause_after_a_recovery_began_is_dropped(kafka, tmp_path: Path, dev_keys) -> None:
    """The rebalance race, made to happen: pauses issued for the previous generation, and for
    this generation before the recovery began reading, land after the recovery's resume."""
    topo = make_topology(tmp_path, dev_keys, partitions=2)
    rp = RunningPipeline(topo, kafka.bootstrap, tmp_path / "w", embedded=False)
    app = rp.pipeline.app
    before = {"epoch": app.tables.recovery.fetch_epoch}
    changed: list[set[Any]] = []

    async def stale_pauses(recovery: Any, consumer: Any) -> None:
        tps = _changelog_tps(app)
        generation = app.consumer_generation_id
        epoch = recovery.fetch_epoch
        assert epoch > before["epoch"]
        changed.append(await set_fetching(consumer, tps, paused=True,
                                          still=lambda c: recovery.still_current(c, generation - 1, epoch)))
        changed.append(await set_fetching(consumer, tps, paused=True,
                                          still=lambda c: recovery.still_current(c, generation, before["epoch"])))

    async with rp:
        await _recovered_and_paused(rp)
        before["epoch"] = app.tables.recovery.fetch_epoch
        table, partition, keys = await _recover_again(rp, inject=stale_pauses)
        await _assert_recovered(rp, table, partition, keys)
    assert changed and not any(changed), changed


async def test_faust_livelock_check_does_not_report_a_paused_changelog(kafka, tmp_path: Path, dev_keys,
                                                                        caplog: pytest.LogCaptureFixture) -> None:
    """Faust logs an ERROR every few seconds for an assigned partition aiokafka has sent no fetch
    for since the consumer started, once stream_processing_timeout (300 s) has passed - a
    changelog paused before its first fetch answered (a new assignment whose recovery had
    nothing to read) would be one. A paused changelog must not be reported.

    (Faust's other branch, "stopped fetching" since the last fetch, compares aiokafka's wall-clock
    fetch time with its own monotonic clock and never fires: not relied on here.)"""
    topo = make_topology(tmp_path, dev_keys, partitions=2)
    rp = RunningPipeline(topo, kafka.bootstrap, tmp_path / "w", embedded=False)
    app = rp.pipeline.app
    async with rp:
        changelogs = await _recovered_and_paused(rp)
        thread = app.consumer._thread
        assignment = thread._ensure_consumer()._subscription.subscription.assignment

        def never_fetched(tp: Any) -> None:  # as if no fetch of it had answered since the start
            assignment.state_value(TopicPartition(tp.topic, tp.partition)).timestamp = None

        later = time.monotonic() + 10 * app.conf.stream_processing_timeout
        with caplog.at_level(logging.ERROR):
            for tp in changelogs:
                never_fetched(tp)
                thread.verify_event_path(later, tp)
            assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
            # the check itself is live: a source partition in the same state is reported
            source = next(tp for tp in app.consumer.assignment() if tp.topic == rp.source)
            never_fetched(source)
            thread.verify_event_path(later, source)
        assert any("has not sent fetch request" in r.getMessage() for r in caplog.records), caplog.text

"""A worker joining or leaving the group makes nobody process a record twice (at_least_once).

The bug this guards: Faust 0.15.3 forgets a revoked partition's acknowledged offsets before its
own revocation commit, so on every rebalance - a clean join or leave too - everything a worker
had processed since its last timer commit (Faust's ``broker_commit_interval``, 2.8 s by default)
was read and processed again by the partition's next owner. Prism lets the streams finish and
commits before it forgets (app/worker/offsets.py, ``OffsetsProbeConsumer.on_partitions_revoked``).

First test: worker A (in this process) has a commit timer that never fires (an hour), processes
N records and commits nothing. Worker B (a subprocess, the same group) joins: the rebalance revokes A's
partitions, and A's revocation must commit all N. B then owns half the partitions and reads
nothing; A reads nothing again; `.v3` holds N records. B stops cleanly (a second rebalance): A
takes B's half back and still reads nothing. Both brokers (``any_broker``).

Second test, the same two rebalances under a live stream (Faust's default commit timer): every
record is processed once and every offset committed. It guards the post-recovery seek: Faust
resumes the stream partitions and only then seeks them to the committed offsets, with flow
control already active, so records fetched while the seek's round trips ran were processed and
then read again from the committed offset - and a gap then recorded over them made the
partition's commits advance by one or two offsets each (`hold_until_seek` in
app/worker/batch_source.py, `OffsetsProbeConsumer._new_offset` in app/worker/offsets.py; before
them, 13 of 23 runs of bench/bench_rebalance.py processed 500-3,200 records twice and one never
committed a partition's last ~1,400 offsets).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from app.envelope import encode, new_envelope
from app.worker.faust_app import WorkerProcess
from tests.brokers import BrokerUnderTest
from tests.support import committed_offsets
from tests.worker.conftest import make_topology
from tests.worker.harness import RunningPipeline, until

N = 4_000
PARTITIONS = 2
#: the live-stream test: records per second, and records between its steps
LIVE_RATE, LIVE_STEP = 800, 2_400

pytestmark = pytest.mark.integration


def _sources(rp: RunningPipeline) -> set[int] | None:
    """The source partitions A owns, once no rebalance is under way (None while one is)."""
    app = rp.pipeline.app
    if app.rebalancing:
        return None
    return {tp.partition for tp in app.consumer.assignment() if tp.topic == rp.source}


async def test_a_worker_joining_and_leaving_makes_nobody_read_a_record_twice(
        any_broker: BrokerUnderTest, tmp_path: Path, dev_keys: Any) -> None:
    broker = any_broker
    topo = make_topology(tmp_path, dev_keys, partitions=PARTITIONS)
    a = RunningPipeline(topo, broker.bootstrap, tmp_path / "a", embedded=broker.embedded,
                        broker_commit_interval=3600.0)
    group, v3 = a.pipeline.app.conf.id, a.source + ".v3"

    async def committed() -> int:
        return sum((await committed_offsets(broker.bootstrap, group, a.source, PARTITIONS)).values())

    env = {"PRISM_TOPOLOGY": str(tmp_path / "topology.yaml"), "PRISM_BOOTSTRAP": broker.bootstrap,
           "PRISM_DATA_DIR": str(tmp_path / "b"), "PRISM_APP_ID": group, **broker.worker_env()}
    b = WorkerProcess("app.worker.pipeline:app_from_env", log_path=tmp_path / "b.log", env=env)
    async with a:
        assert a.producer is not None
        for i in range(N):
            await a.producer.send(a.source, encode(new_envelope(a.source, {"i": i}, namespace="order-events")),
                                  partition=i % PARTITIONS)
        await a.producer.flush()
        await until(lambda: a.pipeline.stats.written.get(v3, 0) >= N, f"A to write {N} records",
                    state=lambda: a.pipeline.stats.written)
        assert await committed() == 0  # the timer commits nothing for an hour
        try:
            await asyncio.to_thread(b.start, timeout=120)  # ready: B's rebalance and recovery are over
            await until(lambda: len(_sources(a) or ()) == PARTITIONS // 2, "A to keep half the partitions",
                        state=lambda: _sources(a))
            # the join revoked all of A's partitions: what A processed was committed then
            deadline = asyncio.get_running_loop().time() + 30
            while (done := await committed()) != N:
                assert asyncio.get_running_loop().time() < deadline, f"committed {done} of {N} after the join"
                await asyncio.sleep(0.2)
            assert a.pipeline.stats.read == N, a.pipeline.stats.read
            assert b.running, b.log_tail()
        finally:
            code = await asyncio.to_thread(b.stop)
        assert code == 0, b.log_tail()
        await until(lambda: _sources(a) == set(range(PARTITIONS)), "A to take B's partitions back",
                    state=lambda: _sources(a))
        assert await committed() == N
        assert a.pipeline.stats.read == N  # nothing read again after either rebalance
        outputs = await a.outputs()
    assert len(outputs[v3]) == N  # nobody wrote a record twice


async def test_a_worker_joining_and_leaving_a_live_stream_processes_every_record_once(
        any_broker: BrokerUnderTest, tmp_path: Path, dev_keys: Any) -> None:
    broker, partitions = any_broker, 4
    topo = make_topology(tmp_path, dev_keys, partitions=partitions)
    a = RunningPipeline(topo, broker.bootstrap, tmp_path / "a", embedded=broker.embedded)
    group = a.pipeline.app.conf.id
    env = {"PRISM_TOPOLOGY": str(tmp_path / "topology.yaml"), "PRISM_BOOTSTRAP": broker.bootstrap,
           "PRISM_DATA_DIR": str(tmp_path / "b"), "PRISM_APP_ID": group, **broker.worker_env()}
    b = WorkerProcess("app.worker.pipeline:app_from_env", log_path=tmp_path / "b.log", env=env)
    sent, stop = [0], asyncio.Event()

    async def stream() -> None:
        assert a.producer is not None
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        while not stop.is_set():
            due = t0 + sent[0] / LIVE_RATE
            if due > loop.time():
                await asyncio.sleep(due - loop.time())
            value = encode(new_envelope(a.source, {"i": sent[0]}, namespace="order-events"))
            await a.producer.send(a.source, value, partition=sent[0] % partitions)
            sent[0] += 1
        await a.producer.flush()

    async def committed() -> int:
        return sum((await committed_offsets(broker.bootstrap, group, a.source, partitions)).values())

    async with a:
        producing = asyncio.ensure_future(stream())
        try:
            await until(lambda: sent[0] >= LIVE_STEP, "the stream to begin")
            await asyncio.to_thread(b.start, timeout=120)  # ready: the join's rebalance is over
            at_join = sent[0]
            await until(lambda: sent[0] >= at_join + LIVE_STEP, "the stream to go on with B in the group")
            assert b.running, b.log_tail()
            code = await asyncio.to_thread(b.stop)  # a clean leave: the second rebalance
            assert code == 0, b.log_tail()
            at_leave = sent[0]
            await until(lambda: sent[0] >= at_leave + LIVE_STEP, "the stream to go on after B left", timeout=120)
        finally:
            stop.set()
            await producing
            if b.running:
                await asyncio.to_thread(b.stop)
        n = sent[0]
        await until(lambda: _sources(a) == set(range(partitions)), "A to own every partition again",
                    state=lambda: _sources(a))
        deadline = asyncio.get_running_loop().time() + 60
        while (done := await committed()) != n:  # Faust's timer commits every 2.8 s
            assert asyncio.get_running_loop().time() < deadline, (
                f"committed {done} of {n}: {await committed_offsets(broker.bootstrap, group, a.source, partitions)}")
            await asyncio.sleep(0.2)
        a.pipeline.runner.flush_counts()  # at_least_once counts up to 0.1 s late (app/worker/batch_runner.py)
        totals = a.pipeline.counters.totals().get(a.source, {})
    # B's counts came back with its partitions' changelog: the table holds both workers' outcomes
    assert totals.get("duplicate", 0) == 0, (totals, a.pipeline.counters.by_partition(a.source, "duplicate"))
    assert totals.get("emitted", 0) == n, (totals, n)

"""A worker joining or leaving the group makes nobody process a record twice (at_least_once).

The bug this guards: Faust 0.15.3 forgets a revoked partition's acknowledged offsets before its
own revocation commit, so on every rebalance - a clean join or leave too - everything a worker
had processed since its last timer commit (Faust's ``broker_commit_interval``, 2.8 s by default)
was read and processed again by the partition's next owner. Prism lets the streams finish and
commits before it forgets (app/worker/offsets.py, ``OffsetsProbeConsumer.on_partitions_revoked``).

Worker A (in this process) has a commit timer that never fires (an hour), processes N records
and commits nothing. Worker B (a subprocess, the same group) joins: the rebalance revokes A's
partitions, and A's revocation must commit all N. B then owns half the partitions and reads
nothing; A reads nothing again; `.v3` holds N records. B stops cleanly (a second rebalance): A
takes B's half back and still reads nothing. Both brokers (``any_broker``).
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

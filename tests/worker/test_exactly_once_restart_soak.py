"""exactly_once restarts after kill -9 never stall, lose or duplicate (issue 31, item 1).

A worker with ``processing_guarantee: exactly_once`` is killed with SIGKILL while one of its
transactions is open, restarted, killed again, ... and the last one must bring every input to
`.v3` or the DLQ, each exactly once for a ``read_committed`` reader - within a bounded time.
A worker that stops making progress for `STALL_S` seconds with inputs waiting fails the run
at once, with its own diagnosis (``WorkerProcess.diagnose``).

``make test`` runs one seed. The soak (BENCHMARKS.md, "exactly_once restart soak") runs many:
``PRISM_SOAK_SEEDS=20 make test PYTEST_ARGS=tests/worker/test_exactly_once_restart_soak.py``
(a number: that many seeds from 1; or a comma-separated list of seeds).
"""

from __future__ import annotations

import os
import random
import time
import uuid
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer

from app.broker.admin import ensure_topics
from app.worker.faust_app import WorkerProcess
from tests.worker.conftest import make_topology
from tests.worker.test_crash_e2e import ArchiveWatcher, _produce_backlog
from tests.worker.test_exactly_once_chain_e2e import OpenTransactions

PARTITIONS = 4
PRODUCED = int(os.environ.get("PRISM_SOAK_INPUTS", "6000"))
KILLS = 3
#: no new input accounted for this long, with inputs waiting: a stall (the worker's own watch says 60 s)
STALL_S = float(os.environ.get("PRISM_SOAK_STALL_S", "75"))
TARGET = "app.worker.pipeline:app_from_env"


def _seeds() -> list[int]:
    raw = os.environ.get("PRISM_SOAK_SEEDS", "").strip()
    if not raw:
        return [20261128]
    if raw.isdigit():
        return list(range(1, int(raw) + 1))
    return [int(s) for s in raw.split(",") if s.strip()]


async def _progress_or_stall(watch: ArchiveWatcher, target: int, worker: WorkerProcess, what: str) -> None:
    """Poll until `target` inputs are accounted for; fail as soon as nothing moved for `STALL_S`."""
    last, since = len(watch.seen), time.monotonic()
    while len(watch.seen) < target:
        await watch.poll()
        if len(watch.seen) != last:
            last, since = len(watch.seen), time.monotonic()
        elif time.monotonic() - since > STALL_S:
            raise AssertionError(f"stall {what}: {last} of {target} inputs accounted for, none for {STALL_S:.0f} s (logs: {worker.log_path})"
                                 f"\n--- worker pid {worker.pid} ---\n{worker.diagnose()}\n{worker.log_tail(6000)}")


@pytest.mark.timeout(1800)
@pytest.mark.parametrize("seed", _seeds())
async def test_restarts_after_kill_9_with_open_transactions(kafka, tmp_path: Path, dev_keys, capsys,
                                                            seed: int) -> None:
    rng = random.Random(seed)
    topo = make_topology(tmp_path, dev_keys, partitions=PARTITIONS)
    source = topo.sources[0].topic
    await ensure_topics(kafka.bootstrap, topo.topics())
    await _produce_backlog(kafka.bootstrap, source, PRODUCED)
    env = {"PRISM_TOPOLOGY": str(tmp_path / "topology.yaml"), "PRISM_BOOTSTRAP": kafka.bootstrap,
           "PRISM_DATA_DIR": str(tmp_path / "data"), "PRISM_APP_ID": f"soak-{uuid.uuid4().hex[:8]}",
           "PRISM_BROKER_URL": kafka.bootstrap, "PRISM_PROCESSING_GUARANTEE": "exactly_once"}
    watch = ArchiveWatcher(kafka.bootstrap, {source + ".dlq": PARTITIONS, source + ".v3": PARTITIONS})
    watch.consumer = AIOKafkaConsumer(bootstrap_servers=kafka.bootstrap, group_id=None, enable_auto_commit=False,
                                      isolation_level="read_committed")
    await watch.start()
    txns = OpenTransactions(kafka.bootstrap, source + ".v3")
    await txns.start()
    workers = [WorkerProcess(TARGET, log_path=tmp_path / f"w{i}.log", env=env) for i in range(KILLS + 1)]
    kills: list[dict[str, object]] = []
    try:
        workers[0].start(timeout=120)
        for i in range(KILLS):
            at = min(PRODUCED - 1_000, len(watch.seen) + rng.randint(200, PRODUCED // (KILLS + 1)))
            await _progress_or_stall(watch, at, workers[i], f"before kill {i + 1}")
            deadline = time.monotonic() + 30
            while not await txns.open() and time.monotonic() < deadline:
                pass
            workers[i].kill()
            kills.append({"at": len(watch.seen), "left_open": await txns.open()})
            workers[i + 1].start(timeout=120)
        await _progress_or_stall(watch, PRODUCED, workers[-1], "after the last restart")
        code = workers[-1].stop(timeout=120)
    finally:
        for w in workers:
            w.kill()
        await watch.consumer.stop()
        await txns.stop()
    with capsys.disabled():
        print(f"\nexactly_once restart soak (seed {seed}): {PRODUCED} inputs; kills {kills}; "
              f"accounted {len(watch.seen)}; max copies {max(watch.seen.values())}")
    assert code == 0, workers[-1].log_tail(4000)
    assert len(watch.seen) == PRODUCED
    dupes = {k: n for k, n in watch.seen.items() if n > 1}
    assert not dupes, f"read_committed saw inputs more than once: {list(dupes.items())[:10]}"
    assert all(n == 1 for n in watch.v3_ids.values())

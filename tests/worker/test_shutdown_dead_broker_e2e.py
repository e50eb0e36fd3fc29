"""SIGTERM a worker whose broker died mid-run: it must still exit within the drain time.

The bug this guards: three waits at shutdown were bounded only by Faust's and aiokafka's own
timeouts - Faust's producer flush on stop (its request timeout is 1200 s), and the retry loops
of the dedup-changelog flush and of the skipped-record fetch, which retried until the broker
answered. With the broker gone, SIGTERM left the worker running until the supervisor's or the
orchestrator's SIGKILL. Now every wait at shutdown ends within `SHUTDOWN_DRAIN_S` of SIGTERM
(app/worker/shutdown.py), and the worker says in one line what it abandoned.

The broker is the embedded one, started for this test and stopped while the worker works
through a backlog (Apache Kafka is not killed here: the session's Kafka is shared).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path
from typing import Any

from app.broker.admin import ensure_topics
from app.broker.embedded import EmbeddedBroker
from app.worker.faust_app import WorkerProcess
from app.worker.shutdown import SHUTDOWN_DRAIN_S
from tests.worker.conftest import make_topology
from tests.worker.test_crash_e2e import ArchiveWatcher, produce_envelopes

N = 20_000
#: What the process may take beyond the drain: its own exit (RocksDB close, logging), measured ~1-3 s.
MARGIN_S = 8.0


async def test_sigterm_with_the_broker_gone_exits_within_the_drain(broker: EmbeddedBroker, tmp_path: Path,
                                                                   dev_keys: Any) -> None:
    topo = make_topology(tmp_path, dev_keys, partitions=2)
    source = topo.sources[0].topic
    await ensure_topics(broker.bootstrap, topo.topics())
    await produce_envelopes(broker.bootstrap, source, N)
    env = {"PRISM_TOPOLOGY": str(tmp_path / "topology.yaml"), "PRISM_BOOTSTRAP": broker.bootstrap,
           "PRISM_DATA_DIR": str(tmp_path / "data"), "PRISM_APP_ID": f"dead-{uuid.uuid4().hex[:8]}",
           "PRISM_EMBEDDED": "1"}
    watch = ArchiveWatcher(broker.bootstrap, {source + ".dlq": 2, source + ".v3": 2})
    await watch.start()
    worker = WorkerProcess("app.worker.pipeline:app_from_env", log_path=tmp_path / "w.log", env=env)
    try:
        worker.start(timeout=60)
        await watch.wait_until(1000, 60, worker)
        await watch.consumer.stop()
        broker.stop()  # mid-run: batches in flight, the producer's buffer full, commits pending
        await asyncio.sleep(2)  # let the worker notice (writes fail, retries start)
        assert worker.running, worker.log_tail()
        t0 = time.monotonic()
        code = worker.stop(timeout=SHUTDOWN_DRAIN_S + 60)
        took = time.monotonic() - t0
        log = worker.log_tail(400_000)
        print(f"\nstop with the broker gone took {took:.1f}s (exit {code})")
        assert took < SHUTDOWN_DRAIN_S + MARGIN_S, (took, log[-6000:])
        assert "shutdown: abandoned" in log, log[-6000:]
    finally:
        worker.kill()

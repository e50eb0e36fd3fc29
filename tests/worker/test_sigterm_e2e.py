"""Graceful shutdown: SIGTERM a subprocess worker in the middle of a backlog, restart it on the
same data dir, and prove that every input reached `.v3` exactly once - no loss and no
duplicate output for the messages that were in flight at shutdown."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

from app.broker.admin import ensure_topics
from app.demo.runner import read_all
from app.worker.faust_app import GC_GEN0_THRESHOLD, WorkerProcess
from tests.brokers import BrokerUnderTest
from tests.worker.conftest import make_topology
from tests.worker.test_crash_e2e import ArchiveWatcher, produce_envelopes

N = 6_000


async def test_sigterm_mid_stream_no_loss_no_duplicates(any_broker: BrokerUnderTest, tmp_path: Path, dev_keys, capsys) -> None:
    broker = any_broker  # runs on the embedded broker and on Apache Kafka
    topo = make_topology(tmp_path, dev_keys, partitions=2)
    source = topo.sources[0].topic
    await ensure_topics(broker.bootstrap, topo.topics())
    await produce_envelopes(broker.bootstrap, source, N)
    env = {"PRISM_TOPOLOGY": str(tmp_path / "topology.yaml"), "PRISM_BOOTSTRAP": broker.bootstrap,
           "PRISM_DATA_DIR": str(tmp_path / "data"), "PRISM_APP_ID": f"term-{uuid.uuid4().hex[:8]}",
           **broker.worker_env()}
    topics = {source + ".dlq": 2, source + ".v3": 2}
    watch = ArchiveWatcher(broker.bootstrap, topics)
    await watch.start()
    first = WorkerProcess("app.worker.pipeline:app_from_env", log_path=tmp_path / "w1.log", env=env)
    second = WorkerProcess("app.worker.pipeline:app_from_env", log_path=tmp_path / "w2.log", env=env)
    try:
        first.start(timeout=60)
        ready = first.wait_ready(5)  # the deployed worker runs with tune_gc applied
        assert ready["gc"]["threshold"][0] == GC_GEN0_THRESHOLD and ready["gc"]["frozen"] > 10_000, ready
        assert ready["event_loop"] == "uvloop", ready  # the subprocess entry installs it before the app exists
        await watch.wait_until(500, 60, first)
        # kill -USR1 mid-stream: the stall snapshot describes the live consumer and costs nothing
        # the exactly-once verdict below could notice
        dump = first.diagnose()
        line = next(ln for ln in dump.splitlines() if ln.startswith("prism consumer snapshot: "))
        snap = json.loads(line.split(": ", 1)[1])
        assert snap["consumer"]["flow_active"] is True and snap["rebalancing"] is False, snap
        assert {f"{source}/0", f"{source}/1"} <= set(snap["partitions"]), snap
        assert snap["batch_sources"][0]["topics"] == [source], snap
        assert "drain_messages" in dump and "prism diagnosis end" in dump, dump  # the tasks follow
        t0 = time.monotonic()
        code = first.stop(timeout=30)             # SIGTERM: finish the batch, commit, flush
        stop_s = time.monotonic() - t0
        await watch.poll()
        at_stop = len(watch.seen)
        assert code == 0, first.log_tail()
        # the stop ends every task it started: the loop closes without waiting out mode's second
        assert "still pending" not in (tmp_path / "w1.log").read_text(), first.log_tail()
        second.start(timeout=60)
        await watch.wait_until(N, 60, second)
    finally:
        first.kill()
        second.stop()
        await watch.consumer.stop()
    final = ArchiveWatcher(broker.bootstrap, topics)
    for recs in (await read_all(broker.bootstrap, topics, expected_total=N, timeout=30)).values():
        final.count(recs)
    duplicates = sum(n - 1 for n in final.v3_ids.values() if n > 1)
    with capsys.disabled():
        print(f"\nsigterm test: {N} inputs, {at_stop} done at SIGTERM (stop took {stop_s:.1f}s), "
              f"distinct {len(final.seen)}, duplicate .v3 records {duplicates}")
    assert at_stop < N, "the backlog was finished before SIGTERM: the test proved nothing"
    assert len(final.seen) == N                 # no loss
    assert len(final.v3_ids) == N and duplicates == 0   # each input exactly once in .v3

"""at_least_once counts finished batches per interval (app/worker/batch_runner.py, `count_every_s`):
a clean stop must still leave every processed message counted, in the counters' changelog, before
its offset is committed.

The first worker holds its counts for an hour (the interval timer never fires), so only Faust's
offset commits count them (`hold_counts_until_commit`: the periodic one and the last one at stop).
It is stopped in the middle of the stream. A second worker of the same group on a fresh data dir
rebuilds the counters table from the changelog alone and reads the rest: the table must end at
exactly N emitted and no duplicate - a count lost at the stop would leave it short for good (its
offset was committed), an offset committed before its count or not at all would show up as a
message counted twice or as a duplicate."""

from __future__ import annotations

import json
from pathlib import Path

from tests.brokers import BrokerUnderTest
from tests.worker.conftest import make_topology
from tests.worker.harness import RunningPipeline, until

N = 3_000


def _totals(rp: RunningPipeline) -> dict[str, int]:
    return rp.pipeline.counters.totals().get(rp.source, {})


async def test_counts_held_between_commits_survive_a_clean_stop_exactly(any_broker: BrokerUnderTest, tmp_path: Path,
                                                                        dev_keys) -> None:
    broker = any_broker
    topo = make_topology(tmp_path, dev_keys, partitions=2)
    first = RunningPipeline(topo, broker.bootstrap, tmp_path / "data1", embedded=broker.embedded)
    runner = first.pipeline.runner
    assert runner.count_every_s > 0  # at_least_once holds counts (exactly_once counts per transaction)
    runner.count_every_s = 3600.0  # only the commits count: the stop's own commit must
    flushes: list[int] = []
    flush = runner.flush_counts

    def recording_flush() -> None:
        flushes.append(len(runner._held))
        flush()

    runner.flush_counts = recording_flush  # type: ignore[method-assign]
    app_id = first.pipeline.app.conf.id
    async with first:
        for i in range(N):
            await first.producer.send(first.source, json.dumps({"i": i}).encode(), partition=i % 2)
        await first.producer.flush()
        # stop mid-stream: once some batches are written (their counts held until a commit)
        await until(lambda: first.pipeline.stats.written.get(first.source + ".v3", 0) >= N // 4, "first writes")
    counted_first = first.pipeline.stats.read
    assert not runner._held, "a held batch outlived the worker's last commit"
    assert sum(flushes) > 0 and 0 < counted_first <= N

    second = RunningPipeline(topo, broker.bootstrap, tmp_path / "data2", app_id=app_id, embedded=broker.embedded)
    async with second:
        # the second worker's table starts from the changelog alone (fresh data dir)
        await until(lambda: _totals(second).get("emitted", 0) >= N, f"{N} emitted in the counters",
                     state=lambda: {"totals": _totals(second), "first read": counted_first,
                                    "second read": second.pipeline.stats.read})
        await second.pipeline.app.consumer.commit()
        totals = _totals(second)
    assert totals.get("emitted") == N, totals
    assert not totals.get("duplicate") and not totals.get("dlq"), totals
    assert second.pipeline.stats.read == N - counted_first  # the rest only: every counted offset was committed

"""The framework-overhead baseline for `bench.bench_release`: Prism's stages and outputs in a
plain aiokafka consume -> produce loop, no Faust. Run as its own process so that its CPU is
measured exactly like the worker's:

    python -m bench._plain_loop TOPOLOGY BOOTSTRAP GROUP N STATS_JSON

Same topology file, same stage chain (`build_stages`, as `PipelineApp` builds it), same
`Publisher` (both layouts, re-signed; `prepare` per message and one `finish` per batch, as
the worker signs a batch at once), same outputs on the same topics written the worker's way (`app/worker/batch_send.py`), the worker's client
settings (batches of 500 records like its `take_events`, 4 MiB partition fetches, 20 ms fetch wait on the embedded
broker, 5 ms linger, 256 KiB batches), uvloop and the worker's GC tuning. At-least-once like
the worker: a batch's outputs are acknowledged by the broker before its offsets are committed.
What it leaves out is what Faust gives the worker: group lifecycle beyond aiokafka's own
consumer group, the RocksDB dedup table and its changelog (the dedup window here is an
in-memory dict, `DedupWindow`), tables, web server, offset-continuity guard. So
worker CPU / this loop's CPU - 1 is the framework's share of the worker's cost.

After N inputs it writes the chain's per-stage CPU µs per message (thread CPU clock) to
STATS_JSON and exits.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

MIB = 1024 * 1024


async def run(topology_path: str, bootstrap: str, group: str, n: int, stats_path: str) -> None:
    import bench.bench_stages as bench_stages
    from app.agents.base import Message
    from app.agents.chain import Outcome
    from app.topology import load_topology
    from app.worker.batch_send import OutRecord, send_batched
    from app.worker.faust_app import tune_gc
    from app.worker.pipeline import _keyring_for

    bench_stages.use_cpu_clock()
    clock = bench_stages.CLOCK  # this thread's CPU time, as the chain's stage timer now reads
    topo = load_topology(topology_path)
    keyring = _keyring_for(topo)
    assert keyring is not None
    h = bench_stages.harness_for(topo, keyring)
    chain, publisher, dedup = h.chain, h.publisher, h.dedup
    two_phase = hasattr(publisher, "prepare")  # an older Publisher signs in `emissions`

    def _out(emissions: list[Any]) -> list[OutRecord]:
        # size and tail None: no size fit here, send_batched measures and writes each record itself
        return [(e.topic, e.record.key, e.record.value, e.record.timestamp_ms, e.record.headers, None, None)
                for e in emissions]
    consumer = AIOKafkaConsumer(*[s.topic for s in topo.sources], bootstrap_servers=bootstrap, group_id=group,
                                enable_auto_commit=False, auto_offset_reset="earliest",
                                session_timeout_ms=6000, heartbeat_interval_ms=1000,
                                max_partition_fetch_bytes=4 * MIB, fetch_max_wait_ms=20)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5, max_batch_size=256 * 1024,
                                max_request_size=4 * MIB)
    await consumer.start()
    await producer.start()
    tune_gc()
    done = 0
    try:
        while done < n:
            batch = await consumer.getmany(timeout_ms=500, max_records=500)  # the worker's batch_size
            items: list[list[OutRecord] | None] = []
            prepared: list[tuple[int, Any]] = []  # (index in items, Prepared)
            emitted = []
            for records in batch.values():
                for r in records:
                    msg = Message(topic=r.topic, partition=r.partition, offset=r.offset, value=r.value or b"",
                                  key=r.key, headers=[(k, v) for k, v in (r.headers or ()) if v is not None],
                                  timestamp_ms=r.timestamp if r.timestamp and r.timestamp > 0 else None)
                    result = chain.run(msg)
                    if result.outcome is Outcome.EMITTED:
                        t0 = clock()
                        if two_phase:
                            prepared.append((len(items), publisher.prepare(msg)))
                            items.append(None)  # filled in once the batch is signed
                        else:
                            items.append(_out(publisher.emissions(msg)))
                        chain.stats.stage_ns["publish"] += clock() - t0
                        chain.stats.stage_calls["publish"] += 1
                        emitted.append(msg)
                    elif result.outcome is Outcome.DLQ:
                        d = result.dlq
                        assert d is not None
                        items.append([(d.topic, d.key, d.value, d.timestamp_ms, d.headers)])
                    done += 1
            if prepared:
                t0 = clock()
                for (at, _), emissions in zip(prepared, publisher.finish([p for _, p in prepared]), strict=True):
                    items[at] = _out(emissions)
                chain.stats.stage_ns["publish"] += clock() - t0
            errors = await send_batched(producer, [it for it in items if it is not None])  # the worker's output path, without Faust
            if any(e is not None for e in errors):
                raise RuntimeError(f"writing outputs failed: {next(e for e in errors if e is not None)!r}")
            if dedup is not None:
                for msg in emitted:
                    dedup.record_emitted(msg)
                dedup.end_batch()
            if batch:
                await consumer.commit()
    finally:
        await consumer.stop()
        await producer.stop()
    Path(stats_path).write_text(json.dumps({"stage_cpu_us_per_message": chain.stats.stage_us_per_message(),
                                            "read": done}))


if __name__ == "__main__":
    from app.worker.faust_app import use_uvloop

    use_uvloop()
    t, b, g, count, out = sys.argv[1:6]
    asyncio.run(run(t, b, g, int(count), out))

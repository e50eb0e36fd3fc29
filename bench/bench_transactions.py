"""What `processing_guarantee: exactly_once` costs (issue 23): the same worker, the same backlog, the
same Apache Kafka broker, at_least_once and exactly_once one after the other in every round.

    .venv/bin/python -m bench.bench_transactions [--n 20000] [--rounds 3] [--json bench/results/transactions.json]

Per round and mode: the steady rate over a pre-loaded backlog of signed 1 KB envelopes (first to
last processed batch, start-up excluded, as bench/bench_pipeline.py measures it), the worker
process's CPU per message (the transactional producers run in it, so their cost is in there) and
the broker JVM's CPU per message (transaction markers, the coordinator). Then, once, the end-to-end
latency at half of at_least_once's maximum rate - the same offered load for both - read back from
`.v3` by a separate process: `read_uncommitted` for at_least_once, `read_committed` for
exactly_once (what its consumers configure; a record becomes visible at the commit).

The rounds alternate the order of the two modes so that a load swing on a shared machine does not
always hit the same one; the median round's ratio is reported.

``--rounds 0 --latency-rate R`` runs the latency phase alone at R msg/s; ``--trace`` times each step
of a record's way through the latency workers' transactions and joins when the reader saw it
(bench/_eos_trace.py; ``result["trace"]``); ``--reader-wait MS`` sets the reader's
``fetch_max_wait_ms`` (20 by default; 500 is aiokafka's default - whether a read_committed reader
waits it out when a transaction commits).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from app.broker.admin import ensure_topics
from app.security.devkeys import ensure_dev_keys
from app.topology import load_topology
from app.worker.faust_app import InProcessWorker, tune_gc
from app.worker.pipeline import PipelineApp
from bench._brokers import bench_broker
from bench._latency_client import ISOLATION_ENV, READER_WAIT_ENV, SEEN_ENV
from bench.bench_pipeline import Clock, bench_topology, latency, make_messages, preload

MODES = ("at_least_once", "exactly_once")


def _proc_cpu_s(pid: int | None) -> float:
    """CPU seconds (user + system) of process `pid`, every thread (the broker JVM)."""
    if pid is None:
        return 0.0
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def run_mode(bootstrap: str, broker_pid: int | None, topo_path: Path, n: int, data_dir: Path,
                   mode: str) -> dict[str, float]:
    topo = load_topology(topo_path)
    await ensure_topics(bootstrap, topo.topics())
    clock, first, seen = Clock(n), [0], [0]

    def on_batch(stats: Any) -> None:
        k = stats.read - seen[0]
        seen[0] = stats.read
        if clock.count == 0:
            first[0] = k
        clock.batch(k)

    pipe = PipelineApp(topo, bootstrap=bootstrap, data_dir=data_dir, app_id=f"bench-{mode}-{uuid.uuid4().hex[:6]}",
                       on_batch=on_batch, processing_guarantee=mode)
    async with InProcessWorker(pipe.app):
        tune_gc()
        b0 = _proc_cpu_s(broker_pid)
        t0 = time.perf_counter()
        await asyncio.wait_for(clock.done.wait(), 900)
        broker_cpu = _proc_cpu_s(broker_pid) - b0
        wall = time.perf_counter() - t0
    s = pipe.summary()
    assert s["emitted"] == n, s  # every input valid: a benchmark that drops work proves nothing
    out = clock.result(first[0])
    out["broker_cpu_us_per_msg"] = broker_cpu / n * 1e6
    out["wall_s"] = wall
    if pipe.transactions is not None:
        out["transactions"] = pipe.transactions.committed
        out["msgs_per_transaction"] = n / max(pipe.transactions.committed, 1)
    return out


async def main_async(n: int, rounds: int, out: Path | None, with_latency: bool,
                     latency_rate: float | None = None, batch_within_s: float | None = None,
                     trace: bool = False, reader_wait_ms: int | None = None) -> dict[str, Any]:
    """`latency_rate`: the latency phase at this rate (msg/s) instead of half of at_least_once's
    measured maximum (with ``rounds=0``: the latency phase alone). `batch_within_s`: the latency
    workers' fill wait (`PipelineApp(batch_within_s=...)`; default the worker's own). `trace`:
    time each step of a record's way through the latency workers (bench/_eos_trace.py) into
    ``result["trace"]``. `reader_wait_ms`: the latency reader's fetch_max_wait_ms (default 20)."""
    tmp = Path(tempfile.mkdtemp(prefix="prism-bench-eos-"))
    keys = ensure_dev_keys(tmp / "keys")
    result: dict[str, Any] = {"n": n, "payload": "1 KB JSON, signed, with JWT", "rounds": []}
    async with bench_broker("kafka", tmp) as broker:
        result["broker"] = broker.description
        bs = broker.bootstrap
        backlogs: dict[str, Path] = {}
        for mode in MODES:
            topic = f"bench.eos.{mode}.{uuid.uuid4().hex[:6]}"
            (tmp / mode).mkdir()
            backlogs[mode] = bench_topology(tmp / mode, keys, topic, None)
            await ensure_topics(bs, load_topology(backlogs[mode]).topics())
            await preload(bs, topic, make_messages(keys, topic, n))
        print(f"preloaded {n} messages per mode on {broker.description}", flush=True)
        for r in range(rounds):
            one: dict[str, Any] = {}
            for mode in MODES if r % 2 == 0 else tuple(reversed(MODES)):
                one[mode] = await run_mode(bs, broker.pid, backlogs[mode], n, tmp / f"{mode}-{r}", mode)
                print(f"[round {r + 1}/{rounds}] {mode}: {json.dumps(one[mode])}", flush=True)
            alo, eos = one["at_least_once"], one["exactly_once"]
            one["cpu_ratio"] = eos["cpu_us_per_msg"] / alo["cpu_us_per_msg"]
            one["rate_ratio"] = eos["msgs_per_s"] / alo["msgs_per_s"]
            print(f"[round {r + 1}/{rounds}] exactly_once / at_least_once: CPU per message x{one['cpu_ratio']:.2f}, "
                  f"rate x{one['rate_ratio']:.2f}", flush=True)
            result["rounds"].append(one)
        mid = sorted(result["rounds"], key=lambda o: o["cpu_ratio"])[len(result["rounds"]) // 2] if rounds else None
        result["median_round"] = mid
        if with_latency and (mid is not None or latency_rate):
            rate = latency_rate or mid["at_least_once"]["msgs_per_s"] / 2
            m = min(n, int(rate * 15))
            result["latency"] = {"rate_msgs_per_s": rate, "load_before": os.getloadavg()[0]}
            if reader_wait_ms is not None:
                os.environ[READER_WAIT_ENV] = str(reader_wait_ms)
                result["latency"]["reader_fetch_max_wait_ms"] = reader_wait_ms
            if trace:
                from bench import _eos_trace

                _eos_trace.install_all()
                result["trace"] = {}
            for mode in MODES:
                lat_topic = f"bench.eoslat.{mode}.{uuid.uuid4().hex[:6]}"
                (tmp / f"lat-{mode}").mkdir()
                topo2 = load_topology(bench_topology(tmp / f"lat-{mode}", keys, lat_topic, None))
                await ensure_topics(bs, topo2.topics())

                class _Worker:
                    async def __aenter__(self, topo2: Any = topo2, mode: str = mode) -> None:
                        self.p = PipelineApp(topo2, bootstrap=bs, data_dir=tmp / f"lat-{uuid.uuid4().hex[:6]}",
                                             app_id=f"lat-{uuid.uuid4().hex[:6]}", processing_guarantee=mode,
                                             **({} if batch_within_s is None else {"batch_within_s": batch_within_s}))
                        self.w = InProcessWorker(self.p.app)
                        await self.w.start()

                    async def __aexit__(self, *a: Any) -> None:
                        await self.w.stop()

                os.environ[ISOLATION_ENV] = "read_committed" if mode == "exactly_once" else "read_uncommitted"
                seen_file = tmp / f"seen-{mode}.json"
                if trace:
                    _eos_trace.reset()
                    os.environ[SEEN_ENV] = str(seen_file)
                result["latency"][mode] = await latency(bs, lat_topic, lat_topic + ".v3", m, rate, keys.folder,
                                                        _Worker)
                print(f"latency {mode} at {rate:.0f} msg/s: {result['latency'][mode]}", flush=True)
                if trace:
                    result["trace"][mode] = _eos_trace.summary(seen_file)
                    print(f"trace {mode}: {json.dumps(result['trace'][mode], indent=1)}", flush=True)
            for env in (ISOLATION_ENV, SEEN_ENV, READER_WAIT_ENV):
                os.environ.pop(env, None)
            result["latency"]["load_after"] = os.getloadavg()[0]
            lat = result["latency"]
            lat["added_p50_ms"] = lat["exactly_once"]["p50_ms"] - lat["at_least_once"]["p50_ms"]
            lat["added_p99_ms"] = lat["exactly_once"]["p99_ms"] - lat["at_least_once"]["p99_ms"]
    print(json.dumps(result, indent=2))
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2))
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=20_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--no-latency", action="store_true")
    ap.add_argument("--latency-rate", type=float, default=None,
                    help="latency phase at this rate (msg/s) instead of half the measured maximum")
    ap.add_argument("--batch-within", type=float, default=None,
                    help="latency workers: seconds a batch waits to fill (0.02: the fill wait before adaptive batches)")
    ap.add_argument("--trace", action="store_true",
                    help="time each step of a record's way through the latency workers (bench/_eos_trace.py)")
    ap.add_argument("--reader-wait", type=int, default=None,
                    help="the latency reader's fetch_max_wait_ms (default 20)")
    args = ap.parse_args(argv)
    from app.worker.faust_app import use_uvloop

    use_uvloop()
    asyncio.run(main_async(args.n, args.rounds, args.json, not args.no_latency, args.latency_rate, args.batch_within,
                           args.trace, args.reader_wait))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""What an idle worker costs on Apache Kafka, with the worker consumer's fetch long poll at
Prism's bound against Faust's own 1.5 s (issue 29; docs/operations.md, "The worker consumer's
fetches").

Why: the bound (`app.worker.offsets.KAFKA_FETCH_MAX_WAIT_MS`, 50 ms) ended 1.5 s stalls of a
live stream, and in exchange an idle worker fetches up to ~20 times a second instead of ~0.7. This
measures what that exchange costs where it costs most - a worker with nothing to do - in the
worker's and the broker's CPU.

Method: one Apache Kafka node (`bench/_brokers.py`), the shipped topology with a fresh source
topic (as `bench_release`), one worker process per run started exactly as `bench_release` starts
one, but through `bench._idle_worker`, which sets the long poll from ``BENCH_FETCH_MAX_WAIT_MS``
before the app is built. Once the worker's ready file appears and `--settle` seconds have passed,
the worker's and the broker's CPU (utime + stime from /proc, every thread) are read over
`--window` seconds with no traffic. The two settings alternate, the order flipped every round;
the figure is the median of the rounds, and the ratio of the medians.

With ``--baseline REV`` (and ``--baseline-python``, as `bench_release`), every round also runs
the baseline's worker at both settings, interleaved with this tree's: before/after of a change
to what the worker fetches (BENCHMARKS.md, "Changelogs paused after their recovery").

    python -m bench.bench_idle [--rounds 4] [--window 20] [--settle 5] [--baseline main
        --baseline-python PY] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from bench._brokers import bench_broker
from bench.bench_release import (
    PARTITIONS,
    Contender,
    Version,
    bench_topology,
    cpu_seconds,
    create_topics,
    head_version,
    release_version,
    run_on_uvloop,
    stop,
    wait_ready,
)

#: the long polls compared: Prism's bound, and Faust's hard-coded value it replaces
WAITS_MS = (50, 1500)
IDLE_TARGET = "bench._idle_worker:app_from_env"


async def one_run(broker: Any, tmp: Path, keys: Any, wait_ms: int, settle: float, window: float,
                  version: Version | None = None) -> dict[str, Any]:
    """One idle worker of `version` (default this tree) with the long poll at `wait_ms`: its and
    the broker's CPU per second."""
    from app.worker.faust_app import READY_FILE_ENV

    version = version or head_version()
    name = f"idle-{wait_ms}-{uuid.uuid4().hex[:6]}"
    topic = f"bench.idle.{uuid.uuid4().hex[:8]}"
    topology = bench_topology(version, tmp, keys, topic, name)
    await create_topics(broker, version, topology, topic)
    ready = tmp / f"{name}.ready"
    procs = Contender(name, version).start(
        topology, broker.bootstrap, name, tmp / name, 0, tmp / "logs",
        extra_env={READY_FILE_ENV: str(ready), "BENCH_FETCH_MAX_WAIT_MS": str(wait_ms)},
        broker_env=broker.worker_env, target=IDLE_TARGET)
    try:
        await wait_ready(ready, procs, f"the idle worker did not get ready; see {tmp / 'logs'}")
        await asyncio.sleep(settle)  # past the start's own work (recovery, first commits)
        pids = [p.pid for p in procs]
        load_before = os.getloadavg()[0]
        w0, b0, t0 = cpu_seconds(pids), cpu_seconds([broker.pid]), time.monotonic()
        await asyncio.sleep(window)
        w1, b1, t1 = cpu_seconds(pids), cpu_seconds([broker.pid]), time.monotonic()
        if procs[0].poll() is not None:
            raise RuntimeError(f"the idle worker exited during the window; see {tmp / 'logs'}")
    finally:
        stop(procs)
    span = t1 - t0
    return {"fetch_max_wait_ms": wait_ms, "worker_cpu_ms_per_s": round((w1 - w0) / span * 1000, 2),
            "broker_cpu_ms_per_s": round((b1 - b0) / span * 1000, 2),
            "load_1m": round((load_before + os.getloadavg()[0]) / 2, 2)}


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    from app.security.devkeys import ensure_dev_keys

    tmp = Path(tempfile.mkdtemp(prefix="prism-bench-idle-"))
    (tmp / "logs").mkdir()
    keys = ensure_dev_keys(tmp / "keys")
    result: dict[str, Any] = {"partitions": PARTITIONS, "window_s": args.window, "settle_s": args.settle,
                              "rounds": []}
    versions: list[tuple[str, Version]] = [("head", head_version())]
    if args.baseline:
        versions.append(("baseline", release_version(args.baseline, args.cache, fresh=False,
                                                     python=args.baseline_python)))
    runs = [(label, version, wait_ms) for label, version in versions for wait_ms in WAITS_MS]
    keys_of = {f"{label}-{wait_ms}" if args.baseline else str(wait_ms): (label, wait_ms)
               for label, _v, wait_ms in runs}
    async with bench_broker("kafka", tmp) as broker:
        for r in range(args.rounds):
            one = {}
            for label, version, wait_ms in (runs if r % 2 == 0 else runs[::-1]):
                key = f"{label}-{wait_ms}" if args.baseline else str(wait_ms)
                res = one[key] = await one_run(broker, tmp, keys, wait_ms, args.settle, args.window, version)
                print(f"[round {r + 1}/{args.rounds}] {label}, long poll {wait_ms} ms: worker "
                      f"{res['worker_cpu_ms_per_s']} ms CPU/s, broker {res['broker_cpu_ms_per_s']} ms CPU/s "
                      f"(load {res['load_1m']})", flush=True)
            result["rounds"].append(one)
    medians = {key: {k: statistics.median(r[key][k] for r in result["rounds"])
                     for k in ("worker_cpu_ms_per_s", "broker_cpu_ms_per_s")} for key in keys_of}
    result["medians"] = medians
    result["extra_cpu_ms_per_s"] = {}
    for label, _v in versions:
        prefix = f"{label}-" if args.baseline else ""
        bound, faust = medians[f"{prefix}{WAITS_MS[0]}"], medians[f"{prefix}{WAITS_MS[1]}"]
        result["extra_cpu_ms_per_s"][label] = {k: round(bound[k] - faust[k], 2) for k in bound}
    print(json.dumps({"medians": medians, "extra_cpu_ms_per_s": result["extra_cpu_ms_per_s"]}, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--rounds", type=int, default=4, help="rounds; each runs both settings, order alternating")
    ap.add_argument("--window", type=float, default=20.0, help="seconds of idle CPU counted per run")
    ap.add_argument("--settle", type=float, default=5.0, help="seconds after the ready file before counting")
    ap.add_argument("--baseline", default=None, help="also run this git revision's worker (e.g. main)")
    ap.add_argument("--baseline-python", type=Path, default=None,
                    help="the baseline's interpreter (no venv of its own: same dependencies)")
    ap.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "prism-bench-release",
                    help="where the baseline's export is kept (as bench_release)")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.rounds < 1 or args.window <= 0 or args.settle < 0:
        ap.error("--rounds >= 1, --window > 0 and --settle >= 0")
    return run_on_uvloop(main_async, args)


if __name__ == "__main__":
    raise SystemExit(main())

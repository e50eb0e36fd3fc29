"""Pipeline throughput with observability off vs on, same process, same broker, same backlog
shape, one mode after the other (issue 7: target <= 10 % cost).

    .venv/bin/python -m bench.bench_observed_pipeline [--n 10000] [--rounds 2]

Modes (each on its own fresh topic with the same pre-loaded signed envelopes):
* off          - `PipelineApp` without an observer (the baseline);
* metrics      - `Observer` with metrics, tracing exporter `none` (the default deployment);
* metrics+spans- `Observer` with metrics and a recorded span per stage per message, exported
                 by the console exporter into /dev/null (worst case: every message sampled).
Rate = messages / time between the first and the last processed batch (start-up excluded).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import uuid
from pathlib import Path
from typing import Any

from app.broker.admin import ensure_topics
from app.broker.embedded import EmbeddedBroker
from app.observability.tracing import configure_tracing
from app.security.devkeys import ensure_dev_keys
from app.topology import load_topology
from app.worker.faust_app import InProcessWorker
from app.worker.observe import Observer
from app.worker.pipeline import PipelineApp
from bench.bench_pipeline import Clock, bench_topology, make_messages, preload


def _observer(mode: str) -> Observer | None:
    if mode == "off":
        return None
    if mode == "metrics":
        return Observer()
    return Observer(tracing=configure_tracing("console", console_out=open(os.devnull, "w")))


async def run_mode(mode: str, bootstrap: str, tmp: Path, keys: Any, n: int) -> dict[str, float]:
    topic = f"bench.obs.{uuid.uuid4().hex[:6]}"
    topo = load_topology(bench_topology(tmp, keys, topic, None))
    await ensure_topics(bootstrap, topo.topics())
    await preload(bootstrap, topic, make_messages(keys, topic, n))
    clock, first, seen = Clock(n), [0], [0]

    def on_batch(stats: Any) -> None:
        k = stats.read - seen[0]
        seen[0] = stats.read
        if clock.count == 0:
            first[0] = k
        clock.batch(k)

    obs = _observer(mode)
    pipe = PipelineApp(topo, bootstrap=bootstrap, data_dir=tmp / f"d-{topic}", embedded=True, on_batch=on_batch,
                       app_id=f"bench-obs-{uuid.uuid4().hex[:6]}", observe=obs)
    async with InProcessWorker(pipe.app):
        await asyncio.wait_for(clock.done.wait(), 600)
    if obs is not None and obs.tracing is not None:
        obs.tracing.shutdown()
    assert pipe.summary()["emitted"] == n
    return {"msgs_per_s": clock.rate(first[0]), "cpu_us_per_msg": clock.cpu_us(first[0])}


async def main_async(n: int, rounds: int) -> dict[str, list[dict[str, float]]]:
    results: dict[str, list[dict[str, float]]] = {"off": [], "metrics": [], "metrics+spans": []}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        keys = ensure_dev_keys(tmp / "keys")
        broker = EmbeddedBroker(log_dir=tmp / "broker").start()
        try:
            for _ in range(rounds):
                for mode in results:
                    r = await run_mode(mode, broker.bootstrap, tmp, keys, n)
                    results[mode].append(r)
                    print(f"{mode:>14}: {r['msgs_per_s']:8.0f} msg/s  {r['cpu_us_per_msg']:6.1f} CPU us/msg", flush=True)
        finally:
            broker.stop()
    base = sum(r["msgs_per_s"] for r in results["off"]) / rounds
    for mode, rs in results.items():
        rate = sum(r["msgs_per_s"] for r in rs) / rounds
        print(f"mean {mode:>14}: {rate:8.0f} msg/s  cost vs off {100 * (1 - rate / base):+5.1f} %")
    return results


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=10_000)
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args(argv)
    asyncio.run(main_async(a.n, a.rounds))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

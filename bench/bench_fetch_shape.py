"""What the worker consumer's fetch requests carry on a live stream on Apache Kafka, with the
tables' changelog partitions paused in aiokafka after their recovery and without (issue 29;
app/tables/recovery.py, ``_pause_changelogs``).

Why: the CPU and latency figures of a live stream are noisy on a shared machine, while what is
fetched is not: this counts the worker consumer's fetch requests and the partitions each names,
per second of a stream, which the pause changes directly.

Method: one Apache Kafka node (`bench/_brokers.py`), the shipped topology with a fresh source
topic of 4 partitions, one worker in this process (as the tests run one), started after its
recovery; messages (1 KB JSON, not signed: they go to the DLQ, writing the dedup and counter
tables as every message does) are sent at `--rate` for `--window` seconds; every request the
worker consumer's aiokafka client sends is recorded. "off" runs the same code with the pause
disabled (main's behaviour: the changelogs fetched after recovery). The two alternate, order
flipped every round; the figures are medians of the rounds.

    python -m bench.bench_fetch_shape [--rounds 3] [--rate 2000] [--window 10] [--json PATH]
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
from bench.bench_release import head_version, run_on_uvloop


async def one_run(bootstrap: str, tmp: Path, keys: Any, *, pause: bool, rate: float, window: float) -> dict[str, Any]:
    from aiokafka import AIOKafkaProducer
    from aiokafka.client import AIOKafkaClient

    from app.broker.admin import ensure_topics
    from app.tables import recovery
    from app.topology import load_topology
    from app.worker.faust_app import InProcessWorker
    from app.worker.pipeline import PipelineApp
    from bench.bench_release import bench_topology

    name = f"shape-{'on' if pause else 'off'}-{uuid.uuid4().hex[:6]}"
    topic = f"bench.shape.{uuid.uuid4().hex[:8]}"
    topology = load_topology(bench_topology(head_version(), tmp, keys, topic, name))
    await ensure_topics(bootstrap, topology.topics())
    cls = recovery.PrismRecovery
    original_pause = cls._pause_changelogs
    if not pause:
        async def no_pause(self: Any, generation_id: int) -> None:
            return None
        cls._pause_changelogs = no_pause
    sent: list[tuple[str, Any]] = []
    original_send = AIOKafkaClient.send

    async def send(self: AIOKafkaClient, node_id: Any, request: Any, **kwargs: Any) -> Any:
        sent.append((self._client_id, request))
        return await original_send(self, node_id, request, **kwargs)

    AIOKafkaClient.send = send  # type: ignore[method-assign]
    pipeline = PipelineApp(topology, bootstrap=bootstrap, data_dir=tmp / name, app_id=f"prism-{name}",
                           embedded=False)
    worker = InProcessWorker(pipeline.app)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    await producer.start()
    try:
        await worker.start()
        await asyncio.sleep(3.0)  # past the recovery and the first commits
        client_id = pipeline.app.consumer._thread._ensure_consumer()._client._client_id
        changelogs = pipeline.app.tables.changelog_topics
        start = len(sent)
        cpu0, t0 = os.times(), time.monotonic()
        value = json.dumps({"pad": "x" * 1000}).encode()
        n = int(rate * window)
        for i in range(n):
            await producer.send(topic, value, partition=i % 4)
            lag = (i + 1) / rate - (time.monotonic() - t0)
            if lag > 0:
                await asyncio.sleep(lag)
        await producer.flush()
        span = time.monotonic() - t0
        cpu1 = os.times()
        fetches = [r for c, r in sent[start:] if c == client_id and type(r).__name__.startswith("Fetch")]
        parts = [sum(len(p) for _t, p in r._topics) for r in fetches]
        with_changelog = sum(1 for r in fetches if any(t in changelogs for t, _p in r._topics))
        return {"pause": pause, "messages": n, "seconds": round(span, 2),
                "fetches_per_s": round(len(fetches) / span, 1),
                "partitions_per_fetch": round(statistics.mean(parts), 2) if parts else 0.0,
                "fetches_naming_a_changelog": with_changelog,
                "process_cpu_ms_per_s": round(((cpu1.user - cpu0.user) + (cpu1.system - cpu0.system)) / span * 1000, 1),
                "load_1m": round(os.getloadavg()[0], 2)}
    finally:
        await producer.stop()
        await worker.stop()
        AIOKafkaClient.send = original_send  # type: ignore[method-assign]
        cls._pause_changelogs = original_pause


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    from app.security.devkeys import ensure_dev_keys

    tmp = Path(tempfile.mkdtemp(prefix="prism-bench-shape-"))
    keys = ensure_dev_keys(tmp / "keys")
    result: dict[str, Any] = {"rate": args.rate, "window_s": args.window, "rounds": []}
    async with bench_broker("kafka", tmp) as broker:
        for r in range(args.rounds):
            one = {}
            for pause in ((True, False) if r % 2 == 0 else (False, True)):
                res = one["on" if pause else "off"] = await one_run(broker.bootstrap, tmp, keys, pause=pause,
                                                                    rate=args.rate, window=args.window)
                print(f"[round {r + 1}/{args.rounds}] {res}", flush=True)
            result["rounds"].append(one)
    result["medians"] = {k: {m: statistics.median(r[k][m] for r in result["rounds"])
                             for m in ("fetches_per_s", "partitions_per_fetch", "fetches_naming_a_changelog",
                                       "process_cpu_ms_per_s")} for k in ("on", "off")}
    print(json.dumps(result["medians"], indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--rate", type=float, default=2000.0, help="messages per second offered")
    ap.add_argument("--window", type=float, default=10.0, help="seconds of traffic counted per run")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.rounds < 1 or args.rate <= 0 or args.window <= 0:
        ap.error("--rounds >= 1, --rate > 0 and --window > 0")
    return run_on_uvloop(main_async, args)


if __name__ == "__main__":
    raise SystemExit(main())

"""SDK consumer throughput (issue 29): `PrismClient.subscribe` with signature verification and
an ack per message, against a raw aiokafka consumer reading the same records, same run.

    .venv/bin/python -m bench.bench_sdk_consumer --quick                       # harness check
    .venv/bin/python -m bench.bench_sdk_consumer -n 20000 --rounds 3 --json bench/results/sdk_consumer.json
    .venv/bin/python -m bench.bench_sdk_consumer --broker kafka -n 20000 --rounds 3 \\
        --json bench/results/sdk_consumer-kafka.json

One topic (4 partitions) is loaded once with `n` envelopes published by the SDK itself
(`publish_batch`, Ed25519-signed, a ~1 KB JSON order each, `bench_pipeline.payload_1kb`).
Every contender then reads all of it from the beginning with a fresh consumer group, in this
process, one after the other; each round runs the contenders in a rotated order, so that load
drift on the shared 2-core machine hits them alike. Contenders:

* ``raw`` - an aiokafka `getmany` loop that only counts the records and commits every second
  (what the transport can do; `bench_peers`' aiokafka loop without its JSON work);
* ``raw+verify`` - the same loop running the SDK's own decode on every record,
  `app.bindings.kafka.decode(record, verify_with=keys)`: binding header checks, signature
  verification, envelope decode. The same work the SDK must do per message, nothing else -
  the baseline the issue's target is about ("a raw aiokafka consumer's throughput with
  signature verification on");
* ``sdk`` - what a user writes: `async for msg in client.subscribe(topic, group=...,
  verify_with=keys)`, `await msg.ack()` for every message (acks committed in the background,
  `commit_interval_ms` default);
* ``sdk-batch`` - `receive_batch(500)` and an ack per message;
* ``sdk-sync-commit`` - the `sdk` loop with `await sub.commit()` after every ack: one
  OffsetCommit round trip per record, which is what `ack()` did before issue 29. It reads only
  the first `--sync-n` records (at ~150 records/s the whole topic would take minutes).

Rate: the records after the first batch (one record in the per-message loops, up to 500 in
the others), over the time from that batch's end to the last record's (the consumer's start
and group join are outside it). CPU per message: process CPU over the
same window. Per round the ratio of every contender to ``raw+verify`` and to ``raw``; the
result is the median of the rounds. The "CPU-bound ratio" is the baseline's CPU per message
over the contender's: the throughput ratio when the process has a core to itself. On the
shared 2-core machine (load averages of 5-7 are common) the wall-clock rate of one read swings
by 2x with what else runs, CPU per message much less. The load average (1 min) is recorded per
round. `--broker kafka` runs it on one Apache Kafka node instead of the
embedded broker (`bench/_brokers.py`).

Where the time goes: run one contender under py-spy (`pip install py-spy` anywhere; it is not
a Prism dependency), e.g. `py-spy record --format raw -o sdk.txt -- .venv/bin/python -m
bench.bench_sdk_consumer --contenders sdk --rounds 1`; `top_functions(open("sdk.txt").read())`
prints the hottest frames of the read loop with their inclusive and self shares.
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
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from bench._brokers import BROKERS, bench_broker, describe

PARTITIONS = 4
CONTENDERS = ("raw", "raw+verify", "sdk", "sdk-batch", "sdk-sync-commit")
BASELINE = "raw+verify"


class Window:
    """First/last record times and process CPU: a rate that leaves the start-up out.

    `add` runs per record in the SDK loops, so it reads only `perf_counter` (vDSO, ~0.1 µs);
    the process CPU clock is a system call (py-spy put a per-record `process_time()` at 10 %
    of the loop), read at the first record and once more in `finish()`."""

    def __init__(self) -> None:
        self.count = self.first = 0
        self.t0 = self.t1 = self.cpu0 = self.cpu1 = 0.0

    def add(self, k: int) -> None:
        """`k` more records handled. The window opens when the first batch is done (its
        records are not counted: they arrived with the start-up), so per-record and
        per-batch loops are measured alike."""
        now = time.perf_counter()
        if self.count == 0:
            self.t0, self.cpu0, self.first = now, time.process_time(), k
        self.count += k
        self.t1 = now

    def finish(self) -> None:
        """Right after the last record: its CPU reading (and nothing of the shutdown)."""
        self.cpu1 = time.process_time()

    def result(self) -> dict[str, float]:
        span = max(self.t1 - self.t0, 1e-9)
        done = max(self.count - self.first, 1)
        return {"msgs_per_s": round(done / span, 1), "cpu_us_per_msg": round((self.cpu1 - self.cpu0) / done * 1e6, 1),
                "records": self.count, "seconds": round(span, 3)}


async def load_topic(bootstrap: str, topic: str, n: int) -> Any:
    """Publish `n` signed envelopes through the SDK; returns the verification keys."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from app.broker.admin import ensure_topics
    from app.sdk import PrismClient
    from app.security.signing import SigningKey, VerificationKeys
    from bench.bench_pipeline import payload_1kb

    key = SigningKey.ed25519("bench-producer", Ed25519PrivateKey.generate())
    await ensure_topics(bootstrap, {topic: PARTITIONS})
    async with PrismClient(f"kafka://{bootstrap}?linger_ms=5", namespace="order-events", signing_key=key) as client:
        for start in range(0, n, 1000):
            await client.publish_batch([(topic, payload_1kb(i)) for i in range(start, min(n, start + 1000))])
    return VerificationKeys.of([key])


async def run_raw(bootstrap: str, topic: str, n: int, keys: Any, *, verify: bool) -> dict[str, Any]:
    from aiokafka import AIOKafkaConsumer

    from app.bindings import kafka as kb

    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=f"raw-{uuid.uuid4().hex[:8]}",
                                enable_auto_commit=False, auto_offset_reset="earliest",
                                session_timeout_ms=6000, heartbeat_interval_ms=1000)
    await consumer.start()
    w = Window()
    last_commit = time.monotonic()
    try:
        while w.count < n:
            batch = await consumer.getmany(timeout_ms=1000, max_records=500)
            for records in batch.values():
                if verify:
                    for rec in records:
                        kb.decode(rec, verify_with=keys)
                if records:
                    w.add(len(records))
            if time.monotonic() - last_commit >= 1.0:
                await consumer.commit()
                last_commit = time.monotonic()
        w.finish()
        await consumer.commit()
    finally:
        await consumer.stop()
    return w.result()


async def run_sdk(bootstrap: str, topic: str, n: int, keys: Any, *, batch: bool = False,
                  sync_commit: bool = False) -> dict[str, Any]:
    from app.sdk import PrismClient

    async with PrismClient(f"kafka://{bootstrap}?create_topics=0", namespace="order-events") as client:
        sub = client.subscribe(topic, group=f"sdk-{uuid.uuid4().hex[:8]}", verify_with=keys, batch_size=500)
        w = Window()
        async with sub:
            if batch:
                while w.count < n:
                    msgs = await sub.receive_batch(500, timeout=1.0)
                    for msg in msgs:
                        await msg.ack()
                    if msgs:
                        w.add(len(msgs))
            else:
                async for msg in sub:
                    await msg.ack()
                    if sync_commit:
                        await sub.commit()
                    w.add(1)
                    if w.count >= n:
                        break
            w.finish()
            commits = sub._inner.commit_requests
        out = w.result()
        out["commit_requests"] = commits  # OffsetCommits while reading; the close's final one is not counted
        return out


def median(values: list[float]) -> float:
    return round(statistics.median(values), 3)


def top_functions(collapsed: str, k: int = 25, within: str = "run_sdk") -> list[str]:
    """The hottest frames of a py-spy `raw` (collapsed stacks) profile, counting only the
    stacks that pass through `within` (default: the SDK contender's read loop, not the
    broker start or the topic load): inclusive and self share of those samples."""
    inclusive: dict[str, int] = {}
    own: dict[str, int] = {}
    total = 0
    for line in collapsed.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit() or within not in stack:
            continue
        c = int(count)
        total += c
        frames = stack.split(";")
        for f in set(frames):
            inclusive[f] = inclusive.get(f, 0) + c
        own[frames[-1]] = own.get(frames[-1], 0) + c
    rows = sorted(inclusive.items(), key=lambda kv: -kv[1])[:k]
    return [f"{v / max(total, 1) * 100:5.1f}% incl {own.get(f, 0) / max(total, 1) * 100:5.1f}% self  {f}"
            for f, v in rows] + [f"({total} samples)"]


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    runs: dict[str, Callable[[], Awaitable[dict[str, Any]]]]
    with tempfile.TemporaryDirectory(prefix="bench-sdk-consumer-") as tmp:
        async with bench_broker(args.broker, Path(tmp)) as broker:
            topic = f"bench.sdkc.{uuid.uuid4().hex[:8]}"
            t0 = time.monotonic()
            keys = await load_topic(broker.bootstrap, topic, args.n)
            print(f"loaded {args.n} signed envelopes in {time.monotonic() - t0:.1f} s on {broker.description}",
                  flush=True)
            b, n = broker.bootstrap, args.n
            runs = {
                "raw": lambda: run_raw(b, topic, n, keys, verify=False),
                "raw+verify": lambda: run_raw(b, topic, n, keys, verify=True),
                "sdk": lambda: run_sdk(b, topic, n, keys),
                "sdk-batch": lambda: run_sdk(b, topic, n, keys, batch=True),
                "sdk-sync-commit": lambda: run_sdk(b, topic, min(n, args.sync_n), keys, sync_commit=True),
            }
            names = [c for c in CONTENDERS if c in args.contenders.split(",")]
            rounds: list[dict[str, Any]] = []
            for r in range(args.rounds):
                order = names[r % len(names):] + names[:r % len(names)]
                load = os.getloadavg()[0]
                res: dict[str, Any] = {}
                for name in order:
                    res[name] = await runs[name]()
                    print(f"  round {r + 1} {name:16s} {res[name]['msgs_per_s']:9.1f} msg/s  "
                          f"{res[name]['cpu_us_per_msg']:7.1f} µs CPU/msg"
                          + (f"  {res[name]['commit_requests']} commits" if "commit_requests" in res[name] else ""),
                          flush=True)
                ratios, cpu_ratios = {}, {}
                for name in names:
                    for base in ("raw+verify", "raw"):
                        if base in res and name != base:
                            ratios[f"{name}/{base}"] = round(res[name]["msgs_per_s"] / res[base]["msgs_per_s"], 3)
                            cpu_ratios[f"{name}/{base}"] = round(
                                res[base]["cpu_us_per_msg"] / max(res[name]["cpu_us_per_msg"], 1e-9), 3)
                rounds.append({"order": order, "loadavg_1m": [round(load, 2), round(os.getloadavg()[0], 2)],
                               "results": res, "ratios": ratios, "cpu_ratios": cpu_ratios})
                print(f"  round {r + 1} ratios: " + ", ".join(f"{k} {v:.3f}" for k, v in ratios.items()), flush=True)
                print(f"  round {r + 1} CPU-bound ratios: " + ", ".join(f"{k} {v:.3f}" for k, v in cpu_ratios.items()),
                      flush=True)
            summary = {
                "median_msgs_per_s": {c: median([rd["results"][c]["msgs_per_s"] for rd in rounds]) for c in names},
                "median_cpu_us_per_msg": {c: median([rd["results"][c]["cpu_us_per_msg"] for rd in rounds])
                                          for c in names},
                "median_ratio": {k: median([rd["ratios"][k] for rd in rounds]) for k in rounds[0]["ratios"]},
                "median_cpu_bound_ratio": {k: median([rd["cpu_ratios"][k] for rd in rounds])
                                           for k in rounds[0]["cpu_ratios"]},
            }
            return {"broker": describe(broker), "n": n, "sync_n": min(n, args.sync_n), "partitions": PARTITIONS,
                    "rounds": rounds, "summary": summary}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--broker", choices=BROKERS, default="embedded")
    ap.add_argument("-n", type=int, default=20000, help="records in the topic; every contender reads them all")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--sync-n", type=int, default=1500, help="records the sdk-sync-commit contender reads")
    ap.add_argument("--contenders", default=",".join(CONTENDERS))
    ap.add_argument("--quick", action="store_true", help="-n 2000 --rounds 1 --sync-n 200 (harness check)")
    ap.add_argument("--json", help="write the results to this file")
    args = ap.parse_args(argv)
    if args.quick:
        args.n, args.rounds, args.sync_n = 2000, 1, 200
    result = asyncio.run(main_async(args))
    s = result["summary"]
    print("median msg/s: " + ", ".join(f"{k} {v:.0f}" for k, v in s["median_msgs_per_s"].items()))
    print("median ratios: " + ", ".join(f"{k} {v:.3f}" for k, v in s["median_ratio"].items()))
    print("median CPU-bound ratios: " + ", ".join(f"{k} {v:.3f}" for k, v in s["median_cpu_bound_ratio"].items()))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""What a clean rebalance costs in records processed twice: Prism's revocation against Faust's
own, side by side in the same run (at_least_once, docs/operations.md "What a rebalance does").

    .venv/bin/python -m bench.bench_rebalance [--broker kafka|embedded] [--rounds 2] [--rate 1500] [--hold 5]

Per round and variant: a fresh source topic (4 partitions) fed at ``--rate`` msg/s with signed
1 KB envelopes; worker A (in this process) reads it from the start. Worker B (a `prism run`
subprocess, same group) is started at once and joins when it is up - a rebalance that revokes
every partition of A (eager) -; ``--hold`` seconds after it is ready, B stops cleanly - a second
one -, and the stream goes on for ``--hold`` seconds more. When it has ended and A owns every
partition again with the group's committed offsets at the end of the topic, A's counter table
holds every outcome of both workers (B's came through the changelog): outcomes minus inputs =
**records processed twice** (turned into ``duplicate`` by the dedup table, or written twice where
its changelog lagged). Both workers revoke the same way in a run: "prism" as shipped (drain and
commit, then forget), "stock" with Faust 0.15.3's ``Consumer.on_partitions_revoked`` (forget,
then the app's commit finds nothing: faust-streaming issue #502). The variants alternate their
order per round.

A count, not a time: what it measures does not move with the machine's load, only how many
records were between two timer commits when a rebalance came (Faust's ``broker_commit_interval``,
2.8 s) - so the stock figure varies with the rate and the moment; Prism's must be 0.
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
from app.worker.faust_app import InProcessWorker, WorkerProcess
from app.worker.pipeline import PipelineApp
from bench._brokers import BROKERS, bench_broker
from bench._rebalance_worker import REVOCATION_ENV, VARIANTS, revocation
from bench.bench_pipeline import PARTITIONS, bench_topology, make_messages
from tests.support import committed_offsets

TARGET = "bench._rebalance_worker:app_from_env"
OUTCOMES = ("emitted", "dlq", "expired", "duplicate")
#: how long any one step may take before the round is reported as stuck (seconds)
STEP_TIMEOUT_S = 180.0


async def _until(check: Any, what: str, timeout: float = STEP_TIMEOUT_S, state: Any = None) -> None:
    deadline = time.monotonic() + timeout
    while not (await check() if asyncio.iscoroutinefunction(check) else check()):
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {timeout:.0f} s for {what}" + (f"; {state()}" if state else ""))
        await asyncio.sleep(0.1)


async def _paced(bootstrap: str, topic: str, messages: list[bytes], rate: float, sent: list[int],
                 stop: asyncio.Event) -> None:
    """Send `messages` round-robin over the partitions at `rate` msg/s until `stop` is set;
    `sent[0]` counts them. Running out of messages before `stop` is an error (raise the cap)."""
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    await producer.start()
    try:
        t0 = time.monotonic()
        for i, value in enumerate(messages):
            if stop.is_set():
                break
            due = t0 + i / rate
            if due > time.monotonic():
                await asyncio.sleep(due - time.monotonic())
            await producer.send(topic, value, partition=i % PARTITIONS)
            sent[0] = i + 1
        else:
            raise RuntimeError(f"all {len(messages)} messages were sent before the second rebalance; raise --seconds")
        await producer.flush()
    finally:
        await producer.stop()


async def one_run(broker: Any, tmp: Path, keys: Any, variant: str, rate: float, hold: float,
                  messages_cap: int) -> dict[str, Any]:
    """One join and one clean leave of worker B while A reads a live stream; both revoke as
    `variant` does. Returns the outcome counts and the records processed twice."""
    run = f"{variant}-{uuid.uuid4().hex[:6]}"
    work = tmp / run
    work.mkdir()
    topic = f"bench.rebal.{run}"
    topo_path = bench_topology(work, keys, topic, None)
    topo = load_topology(topo_path)
    await ensure_topics(broker.bootstrap, topo.topics())
    messages = make_messages(keys, topic, messages_cap)
    group = f"rebal-{run}"
    env = {"PRISM_TOPOLOGY": str(topo_path), "PRISM_BOOTSTRAP": broker.bootstrap, "PRISM_DATA_DIR": str(work / "b"),
           "PRISM_APP_ID": group, REVOCATION_ENV: variant, **broker.worker_env}
    b = WorkerProcess(TARGET, log_path=work / "b.log", env=env)
    sent, stop = [0], asyncio.Event()
    with revocation(variant):
        pipe = PipelineApp(topo, bootstrap=broker.bootstrap, data_dir=work / "a", app_id=group)
        app = pipe.app

        def owns_all() -> bool:
            mine = {tp.partition for tp in app.consumer.assignment() if tp.topic == topic}
            return not app.rebalancing and mine == set(range(PARTITIONS))

        committed: dict[int, int] = {}

        async def all_committed() -> bool:
            committed.update(await committed_offsets(broker.bootstrap, group, topic, PARTITIONS))
            return sum(committed.values()) == sent[0]

        async with InProcessWorker(app):
            t0 = time.monotonic()
            producing = asyncio.ensure_future(_paced(broker.bootstrap, topic, messages, rate, sent, stop))
            try:
                await asyncio.to_thread(b.start, timeout=STEP_TIMEOUT_S)  # ready: its join's rebalance is over
                joined_at = sent[0]
                await asyncio.sleep(hold)
                code = await asyncio.to_thread(b.stop)  # a clean leave: the second rebalance
                left_at = sent[0]
                if code != 0:
                    raise RuntimeError(f"worker B exited with {code}; see {work / 'b.log'}")
                await asyncio.sleep(hold)
                stop.set()
                await producing
                n = sent[0]
                await _until(owns_all, "worker A to own every partition again")
                await _until(all_committed, f"the group to commit all {n} records",
                             state=lambda: f"committed {committed}, A read {pipe.stats.read}")
            finally:
                stop.set()
                producing.cancel()
                if b.running:
                    await asyncio.to_thread(b.stop)
            pipe.runner.flush_counts()  # at_least_once holds counts up to 0.1 s (app/worker/batch_runner.py)
            totals = pipe.counters.totals().get(topic, {})
            twice_by_partition = pipe.counters.by_partition(topic, "duplicate")
            wall = time.monotonic() - t0
    counted = {o: totals.get(o, 0) for o in OUTCOMES}
    processed = sum(counted.values())
    if processed < n:
        raise RuntimeError(f"{variant}: outcomes for {processed} of {n} inputs - a record was lost or not counted")
    return {"variant": variant, "inputs": n, "outcomes": counted, "processed_twice": processed - n,
            "duplicate_by_partition": twice_by_partition,
            "a_read": pipe.stats.read, "b_joined_after": joined_at, "b_left_after": left_at,
            "wall_s": round(wall, 1), "load_1m": round(os.getloadavg()[0], 2)}


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="prism-bench-rebalance-"))
    keys = ensure_dev_keys(tmp / "keys")
    result: dict[str, Any] = {"rate_msgs_per_s": args.rate, "hold_s": args.hold, "partitions": PARTITIONS,
                              "rounds": []}
    async with bench_broker(args.broker, tmp) as broker:
        result["broker"] = broker.description
        for r in range(args.rounds):
            one: dict[str, Any] = {}
            for variant in VARIANTS if r % 2 == 0 else tuple(reversed(VARIANTS)):
                one[variant] = await one_run(broker, tmp, keys, variant, args.rate, args.hold,
                                             int(args.rate * args.seconds))
                print(f"[round {r + 1}/{args.rounds}] {variant}: {json.dumps(one[variant])}", flush=True)
            result["rounds"].append(one)
    for variant in VARIANTS:
        twice = sorted(o[variant]["processed_twice"] for o in result["rounds"])
        result[f"{variant}_processed_twice"] = twice
    print(json.dumps(result, indent=2))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2))
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--broker", choices=BROKERS, default="kafka")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--rate", type=float, default=1_500.0, help="msg/s the stream is fed at")
    ap.add_argument("--hold", type=float, default=5.0,
                    help="seconds between B being ready and its leave, and after the leave")
    ap.add_argument("--seconds", type=float, default=90.0,
                    help="messages made per run: rate x this (the stream must not run out before B left)")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    result = asyncio.run(main_async(args))
    return 0 if all(t == 0 for t in result["prism_processed_twice"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())

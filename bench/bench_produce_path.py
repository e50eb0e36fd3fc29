"""The worker's produce path alone (issue 29): `send_batched` with a real aiokafka producer
against the embedded broker, the compiled record batches (`prism_native.record_batch`) against
aiokafka's own `BatchBuilder`s, alternating in one process, so the difference is not lost in a
worker run's noise.

    .venv/bin/python -m bench.bench_produce_path [--n 4000] [--batch 500] [--pairs 8]

Each message is the worker's two outputs (`.v2`, `.v3`; 36-byte key, 1.8 KB value, eight headers,
as `bench/bench_worker_loop.py` builds them), written in calls of `--batch` messages, as the worker
writes a batch, with the sizes (and the headers' tails) handed over as the size fit does. The figure is this process's CPU
(`time.process_time`: the event loop, `send_batched`, aiokafka's sender encoding the produce
requests and reading the responses; not the broker's) per message, one line per pass, then the
medians and the paired ratio. The producer is a plain one (the embedded broker gives no producer
ids): every batch is still sealed (producer state -1/-1/0 and the CRC), as aiokafka builds it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
import uuid
from pathlib import Path

from aiokafka import AIOKafkaProducer

from app.broker.admin import ensure_topics
from app.broker.embedded import EmbeddedBroker
from app.worker import batch_send, size_fit
from app.worker.batch_send import OutRecord, send_batched
from app.worker.limits import record_size
from bench.bench_worker_loop import HEADERS

PARTITIONS = 12


def items(run: str, n: int) -> list[list[OutRecord]]:
    out = []
    for i in range(n):
        key = b"%036d" % i
        value = bytes([i % 251]) * 1800
        headers = list(HEADERS)
        out.append([(f"{run}.{sfx}", key, value, 1_700_000_000_123 + i, headers, *_measured(key, value, headers))
                    for sfx in ("v2", "v3")])
    return out


def _measured(key: bytes, value: bytes, headers: list[tuple[str, bytes]]) -> tuple[int, bytes | None]:
    """The size (and with the compiled module the headers' tail) the worker's size fit hands over."""
    if size_fit._tail is not None:
        return size_fit._tail(key, value, headers)
    return record_size(key, value, headers), None


async def one_pass(producer: AIOKafkaProducer, work: list[list[OutRecord]], batch: int, compiled: bool) -> float:
    saved = batch_send._record_batch
    batch_send._record_batch = saved if compiled else None
    try:
        start = time.process_time()
        for at in range(0, len(work), batch):
            errors = await send_batched(producer, work[at:at + batch])
            assert not any(errors), errors
        return (time.process_time() - start) / len(work) * 1e6
    finally:
        batch_send._record_batch = saved


async def main(n: int, batch: int, pairs: int) -> dict[str, object]:
    if batch_send._record_batch is None:
        raise SystemExit("prism_native is not built or is stale (make native): nothing to compare")
    with tempfile.TemporaryDirectory() as tmp:
        broker = EmbeddedBroker(log_dir=Path(tmp) / "broker", startup_timeout=20)
        broker.start()
        try:
            run = "bench.produce." + uuid.uuid4().hex[:6]
            await ensure_topics(broker.bootstrap, {f"{run}.v2": PARTITIONS, f"{run}.v3": PARTITIONS})
            producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, linger_ms=5, max_batch_size=256 * 1024,
                                        max_request_size=4 * 1024 * 1024, acks=1)
            await producer.start()
            try:
                work = items(run, n)
                await one_pass(producer, work[:batch], batch, True)  # metadata, connections, warm-up
                await one_pass(producer, work[:batch], batch, False)
                rows = []
                for p in range(pairs):
                    order = (True, False) if p % 2 == 0 else (False, True)  # alternate which goes first
                    got = {c: await one_pass(producer, work, batch, c) for c in order}
                    rows.append((got[True], got[False]))
                    print(f"pass {p + 1}: compiled {got[True]:.2f} µs/msg, aiokafka {got[False]:.2f}", flush=True)
            finally:
                await producer.stop()
        finally:
            broker.stop()
    return {
        "n": n, "batch": batch, "pairs": pairs,
        "compiled_us_per_msg": statistics.median(c for c, _ in rows),
        "aiokafka_us_per_msg": statistics.median(a for _, a in rows),
        "paired_ratio_median": statistics.median(c / a for c, a in rows),
        "paired_diff_median": statistics.median(a - c for c, a in rows),
    }


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=4000, help="messages per pass (two outputs each)")
    ap.add_argument("--batch", type=int, default=500, help="messages per send_batched call")
    ap.add_argument("--pairs", type=int, default=8)
    args = ap.parse_args()
    print(json.dumps(asyncio.run(main(args.n, args.batch, args.pairs))))

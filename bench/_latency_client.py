"""Load client for the latency measurement, run as a separate process (producers are
separate processes in reality, and sharing the worker's CPU would inflate its latency).

    python -m bench._latency_client BOOTSTRAP TOPIC OUT_TOPIC RATE N KEYS_DIR [SCOPE [WARMUP_S]]

Publishes N signed envelopes at RATE msg/s with a send-timestamp header and reads OUT_TOPIC
until all N are back; prints {"p50_ms", "p99_ms", "samples", "messages"} as JSON (`messages`:
every record sent, the warm-up's included - what a worker carried in the run).

WARMUP_S (default 0): the first RATE x WARMUP_S messages are sent and read back like the others
but not counted. A worker's ready file appears before its first fetch round: measured with
bench/_latency_trace.py, every record that took over 50 ms from produce to fetch at 1,550 msg/s
was fetched in the first 0.4 s - the consumer's first fetches and the first writes' metadata,
not the steady state - and those ~2.5 % of the records made that run's p99. The raw loop gets
the same warm-up. (With a 1 s warm-up, two rounds at 1,550 msg/s still gave worker p99s of
112-141 ms: the start-up is not the whole tail; BENCHMARKS.md, issue 29.)
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from app.security.devkeys import ensure_dev_keys
from bench.bench_pipeline import PARTITIONS, make_messages

#: the reading consumer's isolation level (bench/bench_transactions.py sets read_committed)
ISOLATION_ENV = "BENCH_ISOLATION_LEVEL"
#: the reading consumer's fetch_max_wait_ms (default 20; bench_transactions --reader-wait)
READER_WAIT_ENV = "BENCH_READER_FETCH_MAX_WAIT_MS"
#: a file to write [bench-sent header, seen] per record to (bench/_eos_trace.py joins them)
SEEN_ENV = "BENCH_SEEN_FILE"


async def run(bootstrap: str, topic: str, out_topic: str, rate: float, n: int, keys_dir: str,
              scope: int | None = None, warmup_s: float = 0.0) -> dict:
    warm = int(rate * warmup_s)
    values = make_messages(ensure_dev_keys(Path(keys_dir)), topic, n + warm, scope=scope)
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                                # Tansu answers long-polls late (app/worker/offsets.py)
                                fetch_max_wait_ms=int(os.environ.get(READER_WAIT_ENV, "20")),
                                # read_committed: the latency a consumer of an exactly_once worker sees
                                isolation_level=os.environ.get(ISOLATION_ENV, "read_uncommitted"))
    await consumer.start()
    tps = [TopicPartition(out_topic, p) for p in range(PARTITIONS)]
    consumer.assign(tps)
    await consumer.seek_to_end(*tps)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=1)
    await producer.start()
    lat: list[float] = []
    back = [0]
    seen: list[tuple[str, float]] = []
    seen_file = os.environ.get(SEEN_ENV)

    async def reader() -> None:
        while back[0] < n + warm:
            batch = await consumer.getmany(timeout_ms=100)
            now = time.time()
            for rs in batch.values():
                for r in rs:
                    headers = dict(r.headers or [])
                    sent = headers.get("bench-sent")
                    if sent is not None:
                        back[0] += 1
                        if seen_file:
                            seen.append((sent.decode(), now))
                        if "bench-warmup" not in headers:
                            lat.append((now - float(sent)) * 1000)

    task = asyncio.create_task(reader())
    t0 = time.perf_counter()
    for i, v in enumerate(values):
        headers = [("bench-sent", repr(time.time()).encode())] + ([("bench-warmup", b"1")] if i < warm else [])
        await producer.send(topic, v, key=str(i % 64).encode(), headers=headers)
        delay = t0 + (i + 1) / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
    await asyncio.wait_for(task, 180)
    await producer.stop()
    await consumer.stop()
    if seen_file:
        Path(seen_file).write_text(json.dumps(seen))
    lat.sort()
    return {"p50_ms": statistics.median(lat), "p99_ms": lat[max(0, int(len(lat) * 0.99) - 1)], "samples": len(lat),
            "messages": n + warm}


if __name__ == "__main__":
    b, t, o, r, n, k = sys.argv[1:7]
    scope = int(sys.argv[7]) if len(sys.argv) > 7 else None  # signature scope (bench_pipeline.make_messages)
    warmup = float(sys.argv[8]) if len(sys.argv) > 8 else 0.0
    print(json.dumps(asyncio.run(run(b, t, o, float(r), int(n), k, scope, warmup))))

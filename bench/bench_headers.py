"""What producer headers cost the worker's Python per message, without a broker (issue 29).

    .venv/bin/python -m bench.bench_headers [--headers 1] [--rounds 30] [--chunk 500]

The chain and the publisher of `bench_stages`' harness (`build`, `run`: as the worker builds and
drives them, dedup window in a dict) over signed envelopes with the valid payload, in chunks that
alternate between records without headers and records with `--headers` ordinary producer headers
(`profile_stages.producer_headers`: `bench-sent` first, as the latency client's live stream has);
which goes first alternates per round, and the first two rounds are warm-up. Prints the median
thread-CPU µs per message of each and their difference: the worker's Python cost of the headers,
without aiokafka's decoding and encoding of them, the broker's answer sizes or another process's
load swings (`profile_stages worker --headers N` measures the whole worker). For a "before", run
it under a `git archive` of the older tree with `bench/` of this one copied in.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--headers", type=int, default=1, help="ordinary producer headers per record (default 1)")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--chunk", type=int, default=500, help="records per turn")
    args = ap.parse_args(argv)

    from app.security.devkeys import ensure_dev_keys
    from app.worker.faust_app import tune_gc
    from bench import bench_pipeline, bench_stages
    from bench.profile_stages import producer_headers

    bench_pipeline.use_payload("valid")
    bench_stages.use_cpu_clock()
    keys_dir = Path(tempfile.mkdtemp(prefix="prism-headers-")) / "keys"
    harness = bench_stages.build(keys_dir)
    values = bench_pipeline.make_messages(ensure_dev_keys(keys_dir), bench_stages.TOPIC,
                                          2 * args.rounds * args.chunk)
    headers = producer_headers(args.headers) or []
    tune_gc()
    us: dict[int, list[float]] = {0: [], args.headers: []}
    at = 0
    for r in range(args.rounds):
        for n in ((0, args.headers) if r % 2 else (args.headers, 0)):
            chunk = values[at:at + args.chunk]
            at += args.chunk
            inputs = [(v, headers if n else [], str(i % 64).encode(), 1764495000000) for i, v in enumerate(chunk)]
            t0 = time.thread_time_ns()
            bench_stages.run(harness, inputs, keep=False)
            if r >= 2:
                us[n].append((time.thread_time_ns() - t0) / len(chunk) / 1000)
    bare, with_headers = statistics.median(us[0]), statistics.median(us[args.headers])
    print(f"no headers {bare:.1f} µs/msg, {args.headers} header(s) {with_headers:.1f} µs/msg, "
          f"difference {with_headers - bare:+.1f} µs/msg")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

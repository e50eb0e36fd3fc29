"""The worker loop's own per-message work, alone (issue 29): `SizeFitter.input_limit_for`,
`SizeFitter.fit` and `send_all`'s record building over a batch of realistic outputs, without a
broker or the stages, so a change to them shows in ns instead of in a worker run's noise.

    .venv/bin/python -m bench.bench_worker_loop [--n 500] [--repeat 30]

Each figure is the best of `--repeat` passes, in ns per message (two outputs of eight headers
each, as the worker writes `.v2` and `.v3`). For a before/after, run the same command with
`PYTHONPATH` pointing at a `git archive` export of the older tree (BENCHMARKS.md, issue 29).
`send_batched` itself is replaced by a recorder: the producer's work is aiokafka's, measured in
the worker profile (`bench/profile_stages.py`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections import Counter
from typing import Any

from app.agents.base import Message
from app.agents.publish import Emission
from app.bindings.kafka import KafkaRecord
from app.worker import delivery
from app.worker.interfaces import RunStats
from app.worker.limits import WriteLimits
from app.worker.size_fit import SizeFitter

SOURCE = "bench.in"
OUTPUTS = (SOURCE + ".v2", SOURCE + ".v3")
HEADERS = [("ce_specversion", b"1.0"), ("ce_id", b"x" * 36), ("ce_source", b"/orders"),
           ("ce_type", b"prism.envelope"), ("content-type", b"application/x-protobuf"),
           ("prism-source", b"bench.in/3/12345"), ("prism-schema-validation", b"x" * 60), ("prism-signature", b"s" * 90)]


def pending(n: int) -> list[tuple[Message, Any]]:
    """`n` messages as `BatchRunner` hands them to the fitter: each with its two outputs."""
    return [(Message(topic=SOURCE, partition=i % 12, offset=i, value=b"v" * 1100, key=b"k" * 36),
             [Emission(t, KafkaRecord(b"k" * 36, b"v" * 1800, list(HEADERS), 1_700_000_000_123)) for t in OUTPUTS])
            for i in range(n)]


class _Recorder:
    """Stands in for Faust's producer and for `send_batched`: keeps what it was handed."""

    def __init__(self) -> None:
        self.items: Any = None

    def _ensure_producer(self) -> _Recorder:
        return self


async def _record(producer: _Recorder, items: Any, **_: Any) -> list[None]:
    producer.items = items
    return [None] * len(items)


async def measure(n: int, repeat: int) -> dict[str, float]:
    """Best-of-`repeat` ns per message of each piece."""
    fitter = SizeFitter(None, WriteLimits(4 * 1024 * 1024, output_topics=OUTPUTS),  # type: ignore[arg-type]
                        write_topics=(*OUTPUTS, SOURCE + ".dlq"), source_outputs={SOURCE: OUTPUTS}, overflow=None,
                        stats=RunStats(), bootstrap="unused:9", settings=None)
    real, delivery.send_batched = delivery.send_batched, _record  # type: ignore[assignment]
    best: dict[str, float] = {}
    try:
        for _ in range(repeat):
            batch = pending(n)
            items = [item for _, item in batch]
            t0 = time.perf_counter_ns()
            for _ in range(n):
                fitter.input_limit_for(SOURCE)
            t1 = time.perf_counter_ns()
            fitter.fit(None, batch, Counter(), None)  # type: ignore[arg-type]
            t2 = time.perf_counter_ns()
            await delivery.send_all(_Recorder(), items, fitter.limits.limit_for)
            t3 = time.perf_counter_ns()
            for key, ns in (("input_limit_for", t1 - t0), ("fit", t2 - t1), ("send_all_records", t3 - t2)):
                best[key] = min(best.get(key, float("inf")), ns / n)
    finally:
        delivery.send_batched = real  # type: ignore[assignment]
    best["total"] = sum(best.values())
    return best


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=500, help="messages per pass")
    ap.add_argument("--repeat", type=int, default=30, help="passes; the best is reported")
    args = ap.parse_args(argv)
    result = asyncio.run(measure(args.n, args.repeat))
    print(json.dumps({k: round(v, 1) for k, v in result.items()}, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())

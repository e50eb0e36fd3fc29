"""Pipeline throughput with observability off vs on, same process, same broker, same backlog
shape, modes interleaved round by round (issue 7: target <= 10 % cost).

    .venv/bin/python -m bench.bench_observed_pipeline [--n 10000] [--rounds 2] [--json PATH]

Modes (each on its own fresh topic with the same pre-loaded signed envelopes; every envelope
carries a W3C trace context, as the SDK writes it):
* off              - `PipelineApp` without an observer (the baseline);
* metrics          - `Observer` with metrics, tracing exporter `none` (the default deployment);
* metrics+spans@1% - metrics and OTLP tracing with the worker's default parent-based sampler;
                     the producer sampled 1 % of the messages (the `sampled` flag is set on
                     every 100th message, by index): the realistic deployment;
* metrics+spans    - the same with every message sampled (worst case): a recorded span per
                     stage per message.
The traced modes export with the real OTLP/HTTP protobuf exporter to a local receiver
(tests/otlp_receiver.py) running in its own process, so the exporter's encoding and HTTP
cost is in the worker's CPU but the receiver's decoding is not; the bench checks that the
receiver got exactly one span per stage per sampled message.
Rate = messages / time between the first and the last processed batch (start-up excluded);
CPU = process CPU time over the same interval, per message.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

from app.broker.admin import ensure_topics
from app.broker.embedded import EmbeddedBroker
from app.envelope import Layout, new_envelope
from app.observability import tracecontext as tc
from app.observability.tracing import configure_tracing
from app.security.devkeys import DevKeys, ensure_dev_keys
from app.security.signing import sign
from app.topology import load_topology
from app.worker.faust_app import InProcessWorker
from app.worker.observe import Observer
from app.worker.pipeline import PipelineApp
from bench.bench_pipeline import ROOT, Clock, bench_topology, payload_1kb, preload

MODES = ("off", "metrics", "metrics+spans@1%", "metrics+spans")
SAMPLE_EVERY = {"metrics+spans@1%": 100, "metrics+spans": 1}  # other modes: the 1 % backlog
STAGES = 7  # normalize .. enrich: one span each per sampled message


def make_traced_messages(keys: DevKeys, topic: str, n: int, sample_every: int) -> list[bytes]:
    """bench_pipeline.make_messages plus the producer's trace context (inside the signed
    bytes, as the SDK writes it): `sampled` on message i iff i % sample_every == 0."""
    token = keys.mint_token("svc-orders", ttl_s=7200)
    key = keys.keyring.signing["dev-producer-1"]
    out = []
    for i in range(n):
        env = new_envelope(topic, payload_1kb(i), namespace="order-events", correlation_id=f"c-{i}")
        flags = tc.FLAG_RANDOM | (tc.FLAG_SAMPLED if i % sample_every == 0 else 0)
        tc.write_envelope_context(env, tc.new_trace_id(), tc.new_span_id(), None, flags)
        sec = env.ensure_security()
        sec.auth_token, sec.data_classification = token, "internal"
        out.append(sign(env, key, Layout.REVIEWED))
    return out


class ReceiverProcess:
    """tests/otlp_receiver.py in its own process (a stand-in for the Collector)."""

    def __enter__(self) -> ReceiverProcess:
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.otlp_receiver"], cwd=str(ROOT),
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().split()
        assert line[:1] == ["PORT"], line
        self.endpoint = f"http://127.0.0.1:{line[1]}"
        return self

    def stats(self) -> dict[str, int]:
        with urllib.request.urlopen(self.endpoint + "/stats", timeout=10) as r:
            return json.loads(r.read())

    def __exit__(self, *exc: Any) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()  # the receiver serves until stdin closes
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _observer(mode: str, endpoint: str) -> Observer | None:
    if mode == "off":
        return None
    if mode == "metrics":
        return Observer()
    # sampler=None: what the worker does by default (OTEL_TRACES_SAMPLER unset: parent-based always-on)
    return Observer(tracing=configure_tracing("otlp", "prism-bench", endpoint=endpoint))


async def run_mode(mode: str, bootstrap: str, tmp: Path, keys: Any, n: int, rx: ReceiverProcess) -> dict[str, float]:
    topic = f"bench.obs.{uuid.uuid4().hex[:6]}"
    topo = load_topology(bench_topology(tmp, keys, topic, None))
    await ensure_topics(bootstrap, topo.topics())
    every = SAMPLE_EVERY.get(mode, 100)
    await preload(bootstrap, topic, make_traced_messages(keys, topic, n, every))
    clock, first, seen = Clock(n), [0], [0]

    def on_batch(stats: Any) -> None:
        k = stats.read - seen[0]
        seen[0] = stats.read
        if clock.count == 0:
            first[0] = k
        clock.batch(k)

    before = rx.stats()
    obs = _observer(mode, rx.endpoint)
    pipe = PipelineApp(topo, bootstrap=bootstrap, data_dir=tmp / f"d-{topic}", embedded=True, on_batch=on_batch,
                       app_id=f"bench-obs-{uuid.uuid4().hex[:6]}", observe=obs)
    async with InProcessWorker(pipe.app):
        await asyncio.wait_for(clock.done.wait(), 600)
    exported = 0
    if obs is not None and obs.tracing is not None:
        obs.tracing.shutdown()  # flush: every span sent before the count below
        exported = rx.stats()["spans"] - before["spans"]
        sampled = len(range(0, n, every))
        assert exported == sampled * STAGES, (mode, exported, sampled)
    assert pipe.summary()["emitted"] == n
    return {"msgs_per_s": clock.rate(first[0]), "cpu_us_per_msg": clock.cpu_us(first[0]),
            "spans_exported": exported}


async def main_async(n: int, rounds: int) -> dict[str, Any]:
    results: dict[str, list[dict[str, float]]] = {m: [] for m in MODES}
    t_start = time.time()
    with tempfile.TemporaryDirectory() as d, ReceiverProcess() as rx:
        tmp = Path(d)
        keys = ensure_dev_keys(tmp / "keys")
        broker = EmbeddedBroker(log_dir=tmp / "broker").start()
        try:
            for r in range(rounds):
                # interleaved, and the order rotated each round so no mode always runs first
                for mode in MODES[r % len(MODES):] + MODES[:r % len(MODES)]:
                    res = await run_mode(mode, broker.bootstrap, tmp, keys, n, rx)
                    results[mode].append(res)
                    print(f"{mode:>17}: {res['msgs_per_s']:8.0f} msg/s  {res['cpu_us_per_msg']:6.1f} CPU us/msg"
                          f"  {res['spans_exported']:6d} spans", flush=True)
        finally:
            broker.stop()
    # Per round, each mode against that round's `off` run (paired: same load conditions, give
    # or take), then the median over rounds: this machine's background load swings too much
    # for a plain mean over a few runs.
    summary = {}
    for mode, rs in results.items():
        rate_cost = [100 * (1 - r["msgs_per_s"] / b["msgs_per_s"]) for r, b in zip(rs, results["off"], strict=True)]
        cpu_cost = [100 * (r["cpu_us_per_msg"] / b["cpu_us_per_msg"] - 1) for r, b in zip(rs, results["off"], strict=True)]
        summary[mode] = {"median_msgs_per_s": statistics.median(r["msgs_per_s"] for r in rs),
                         "median_cpu_us_per_msg": statistics.median(r["cpu_us_per_msg"] for r in rs),
                         "median_rate_cost_pct": statistics.median(rate_cost),
                         "median_cpu_cost_pct": statistics.median(cpu_cost),
                         "rate_cost_pct_by_round": rate_cost, "cpu_cost_pct_by_round": cpu_cost}
        m = summary[mode]
        print(f"median {mode:>17}: {m['median_msgs_per_s']:8.0f} msg/s  {m['median_cpu_us_per_msg']:6.1f} CPU us/msg"
              f"  cost vs off (paired by round): rate {m['median_rate_cost_pct']:+5.1f} %,"
              f" CPU {m['median_cpu_cost_pct']:+5.1f} %")
    return {"n": n, "rounds": rounds, "modes": list(MODES), "stages": STAGES,
            "payload": "1 KB JSON, signed, with JWT and a W3C trace context",
            "exporter": "OTLP/HTTP protobuf to a local receiver process", "started": t_start,
            "results": results, "summary": summary}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=10_000)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json", type=Path, default=None, help="write the results here")
    a = ap.parse_args(argv)
    out = asyncio.run(main_async(a.n, a.rounds))
    if a.json is not None:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

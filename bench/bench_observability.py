"""Per-message cost of observability (stage spans + metrics), on vs off, in the same run.

    .venv/bin/python bench/bench_observability.py            # 100k messages per mode
    .venv/bin/python bench/bench_observability.py --n 20000 --json

Every mode processes the same synthetic envelopes (512-byte JSON payload, a valid trace
context, two labels) through the same minimal "pipeline": decode the wire bytes, run one
stage, encode the output. Modes differ only in the observability around the stage:

  baseline      decode + encode, no observability at all
  noop_span     + stage_span with OTel's NoOpTracer (tracing disabled, context passed through)
  metrics       + stage_span(NoOpTracer) with PipelineMetrics (in/out counters, latency histogram)
  sdk_unsampled + stage_span with the SDK whose sampler says no (a trace the producer did not
                  sample, or a worker-side ratio sampler): context propagated, nothing recorded
  sdk_none      + stage_span with the OTel SDK, every span recorded, no exporter
                  (PRISM_TRACES_EXPORTER=none)
  sdk_otlp      + stage_span with the SDK, BatchSpanProcessor and an exporter that encodes
                  each batch to OTLP protobuf and discards it (the CPU of OTLP export, no network)
  all_on        sdk_otlp + metrics: what a worker with tracing and metrics on pays
  all_unsampled sdk_unsampled + metrics: tracing on but this message not sampled

Modes run in interleaved rounds so machine noise spreads over all of them. Wall time and
process CPU time (which includes the batch exporter's thread) are both reported.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF

from app.envelope import Layout, decode, encode, new_envelope
from app.observability.metrics import PipelineMetrics
from app.observability.tracecontext import new_span_id, new_trace_id
from app.observability.tracing import stage_span

TOPIC = "orders.created"


class OtlpEncodingDiscardExporter(SpanExporter):
    """Pays the serialization cost of OTLP export, then drops the bytes."""

    def __init__(self) -> None:
        self.spans = 0
        self.bytes = 0

    def export(self, spans: Sequence) -> SpanExportResult:
        self.bytes += len(encode_spans(spans).SerializeToString())
        self.spans += len(spans)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass


def make_wires(n: int) -> list[bytes]:
    payload = {"order_id": 0, "customer": "c" * 400, "items": [1, 2, 3], "total": 99.5}
    template = new_envelope(TOPIC, payload, namespace="orders", labels={"tenant": "acme", "region": "eu"})
    obs = template.ensure_observability()
    wires = []
    for i in range(n):
        obs.trace_id, obs.span_id, obs.trace_flags = new_trace_id(), new_span_id(), 1
        template.header.metadata.message_id = f"01890a5d-ac96-774b-bcce-{i:012d}"
        wires.append(encode(template, Layout.REVIEWED))
    return wires


def make_modes() -> tuple[dict[str, Callable[[bytes], bytes]], dict[str, object]]:
    noop = trace.NoOpTracer()
    off_provider = TracerProvider(sampler=ALWAYS_OFF)
    off_provider.add_span_processor(BatchSpanProcessor(OtlpEncodingDiscardExporter()))
    none_provider = TracerProvider()
    otlp_provider = TracerProvider()
    exporter = OtlpEncodingDiscardExporter()
    otlp_provider.add_span_processor(BatchSpanProcessor(exporter, max_queue_size=65536, max_export_batch_size=512))
    sdk_none, sdk_otlp = none_provider.get_tracer("bench"), otlp_provider.get_tracer("bench")
    metrics_only = PipelineMetrics(label_allowlist=["tenant"])
    metrics_all = PipelineMetrics(label_allowlist=["tenant"])
    metrics_unsampled = PipelineMetrics(label_allowlist=["tenant"])
    sdk_off = off_provider.get_tracer("bench")

    def baseline(wire: bytes) -> bytes:
        env = decode(wire)
        return encode(env, Layout.REVIEWED)

    def with_span(tracer: trace.Tracer, metrics: PipelineMetrics | None) -> Callable[[bytes], bytes]:
        def run(wire: bytes) -> bytes:
            env = decode(wire)
            with stage_span(tracer, "route", env, TOPIC, 0, metrics=metrics) as s:
                s.emitted()
            return encode(env, Layout.REVIEWED)

        return run

    modes = {
        "baseline": baseline,
        "noop_span": with_span(noop, None),
        "metrics": with_span(noop, metrics_only),
        "sdk_unsampled": with_span(sdk_off, None),
        "sdk_none": with_span(sdk_none, None),
        "sdk_otlp": with_span(sdk_otlp, None),
        "all_on": with_span(sdk_otlp, metrics_all),
        "all_unsampled": with_span(sdk_off, metrics_unsampled),
    }
    resources = {"otlp_provider": otlp_provider, "exporter": exporter, "none_provider": none_provider}
    return modes, resources


def run(n: int, rounds: int) -> dict[str, dict[str, float]]:
    wires = make_wires(n)
    modes, res = make_modes()
    for fn in modes.values():  # warm-up: imports, caches, label children
        for w in wires[:2000]:
            fn(w)
    res["otlp_provider"].force_flush()  # type: ignore[attr-defined]
    wall = dict.fromkeys(modes, 0.0)
    cpu = dict.fromkeys(modes, 0.0)
    chunk = n // rounds
    names = list(modes)
    for r in range(rounds):
        part = wires[r * chunk:(r + 1) * chunk]
        order = names[r % len(names):] + names[:r % len(names)]
        for name in order:
            fn = modes[name]
            c0, w0 = time.process_time(), time.perf_counter()
            for w in part:
                fn(w)
            if name in ("sdk_otlp", "all_on"):
                res["otlp_provider"].force_flush()  # type: ignore[attr-defined]  # export cost lands in this mode
            wall[name] += time.perf_counter() - w0
            cpu[name] += time.process_time() - c0
    total = chunk * rounds
    base_w, base_c = wall["baseline"] / total * 1e6, cpu["baseline"] / total * 1e6
    out: dict[str, dict[str, float]] = {}
    for name in names:
        w_us, c_us = wall[name] / total * 1e6, cpu[name] / total * 1e6
        out[name] = {"wall_us_per_msg": round(w_us, 2), "cpu_us_per_msg": round(c_us, 2),
                     "overhead_wall_us": round(w_us - base_w, 2), "overhead_cpu_us": round(c_us - base_c, 2),
                     "ratio_wall_vs_baseline": round(w_us / base_w, 3)}
    exp = res["exporter"]
    res["otlp_provider"].shutdown()  # type: ignore[attr-defined]
    out["_meta"] = {"messages_per_mode": total, "rounds": rounds, "spans_exported": exp.spans,  # type: ignore[attr-defined]
                    "otlp_bytes_per_span": round(exp.bytes / max(exp.spans, 1), 1)}  # type: ignore[attr-defined]
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=100_000, help="messages per mode (default 100000)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = ap.parse_args(argv)
    result = run(args.n, args.rounds)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    meta = result.pop("_meta")
    print(f"{meta['messages_per_mode']} messages per mode, {meta['rounds']} interleaved rounds; "
          f"{meta['spans_exported']} spans OTLP-encoded ({meta['otlp_bytes_per_span']} B/span)")
    print(f"{'mode':<13} {'wall µs/msg':>12} {'cpu µs/msg':>11} {'+wall µs':>9} {'+cpu µs':>8} {'x baseline':>10}")
    for name, r in result.items():
        print(f"{name:<13} {r['wall_us_per_msg']:>12.2f} {r['cpu_us_per_msg']:>11.2f} {r['overhead_wall_us']:>9.2f} "
              f"{r['overhead_cpu_us']:>8.2f} {r['ratio_wall_vs_baseline']:>10.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

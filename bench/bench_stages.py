"""Stage CPU benchmark (issue 3), broker-free: the worker's Chain + Publisher in-process.

    .venv/bin/python -m bench.bench_stages [--n 20000] [--passes 5]        # µs / message / stage
    .venv/bin/python -m bench.bench_stages --profile prof.out               # cProfile one pass
    .venv/bin/python -m bench.bench_stages --baseline HEAD~3 [--rounds 40]  # before/after, interleaved
    .venv/bin/python -m bench.bench_stages --baseline HEAD~3 --stage-timing-every 1  # every stage timed
    .venv/bin/python -m bench.bench_stages --baseline HEAD --latency-samples  # + the latency histogram
    .venv/bin/python -m bench.bench_stages --baseline HEAD --payload valid   # a payload the schema accepts

The worker's settings are the harness's: payloads are validated when the topology's
`validation` is warn/strict (the shipped one: warn; `bench_pipeline.payload_1kb` fails its
schema, so the default input measures the warn path - `--payload valid` sends one that passes),
and garbage is collected as `prism run` collects it (`--gc worker`; `--gc default` for CPython's).

Input: `bench.bench_pipeline.make_messages` (signed reviewed envelopes, JWT, 1 KB JSON) over
`topologies/orders-created.yaml` with development keys, run the way
`app/worker/batch_runner.py` (`BatchRunner.start`) runs them (batches of 500, publish timed as
"publish": each message's `Publisher.prepare` plus the batch's `Publisher.finish`, which
signs the batch once - or `emissions` per message on code from before that split; dedup ids
recorded after the batch), minus Faust: the dedup window is an
in-memory `DedupWindow` over a dict. The per-stage numbers are the chain's own
`stats.stage_ns` / `stats.stage_calls` (the mean over the messages whose stages the chain
timed: one in `Chain.stage_timing_every`, or every one with `--stage-timing-every 1`, which
also works on code older than the sampling). The `chain` row is timed here, around every
`chain.run` call, in both variants alike: the whole chain including the chain's own timing
overhead, which the per-stage numbers cannot show.

Why subprocesses for `--baseline`: the old and the new code are both the `app` package, so
they cannot share one interpreter. The baseline's `app/` (and `topologies/`, `bench/`) is
exported with `git archive` into a temporary folder (the repository is not touched); both
variants run as worker processes that take turns, 1000 messages at a time, so machine-load
drift hits both alike; medians over turns and of the paired ratios are reported.

`--latency-samples` adds what the worker's observer does for `prism_stage_latency_seconds`: the
chain keeps each timed message's durations (`Chain.latency_samples`) and after each batch the
observer observes them into the histogram; that drain is billed to the `chain` row, so the row
shows the whole cost. Code without per-message samples ignores the flag (the baseline of a
before/after comparison then runs without them).

`--compare-outputs BEFORE AFTER` compares two such files (`compare_outputs`: byte for byte,
except what upb's per-process map order changes). `--dump-corpus`/`--dump-outputs` check behaviour rather than speed: a fixed corpus (the demo
load generator's mix, bench messages and signature edge cases) is written once, then every emission's and DLQ
record's topic, key, value, headers and timestamp are written as JSON; run it under two
code versions with the same keys folder and compare the files. Random trace/span ids are
made deterministic (seeded `getrandbits` in the trace-context module) and the wall
clock is frozen at the corpus' creation time (error texts such as "expired N s ago").
"""

from __future__ import annotations

import argparse
import cProfile
import json
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TOPIC = "orders.created"
BATCH = 500
STAGES = ("normalize", "validate", "authenticate", "verify_signature", "policy", "dedup", "enrich", "publish")
#: the extra row: all of `chain.run` per message, timed by the harness (module docs)
CHAIN = "chain"
#: `--stage-timing-every`: None keeps the chain's own default
TIMING_EVERY: int | None = None
#: `--latency-samples`: record per-message latencies and observe them per batch (module docs)
LATENCY_SAMPLES = False
#: `--payload`: "bench" (`bench_pipeline.payload_1kb`, which fails the topology's schema: the warn
#: path) or "valid" (`bench_pipeline.payload_valid_1kb`, which matches it)
PAYLOAD = "bench"
#: `--gc`: "worker" collects the way `prism run` does (`tune_gc`), "default" keeps CPython's
GC_MODE = "worker"

Input = tuple[bytes, list[tuple[str, bytes]], bytes | None, int | None]  # value, headers, key, timestamp_ms


def use_cpu_clock() -> None:
    """Make the chain's stage timer (and the publish timer here) read this thread's CPU time.

    The chain times stages with `perf_counter_ns` (wall time), which on a shared, oversubscribed
    machine bills a stage for every time slice other processes took meanwhile (2-3x swings
    between runs here). CPU time is what this benchmark is about; both variants get the same clock.
    """
    import types

    import app.agents.chain as chain_mod

    chain_mod.time = types.SimpleNamespace(perf_counter_ns=time.thread_time_ns)  # type: ignore[assignment]
    global CLOCK
    CLOCK = time.thread_time_ns


CLOCK = time.perf_counter_ns


@dataclass
class Harness:
    chain: Any
    publisher: Any
    dedup: Any
    #: harness-timed `chain.run` total (CHAIN row) and its number of calls
    chain_ns: int = 0
    chain_calls: int = 0
    #: `--latency-samples`: drains the chain's samples into a histogram after each batch
    drain: Any = None


def build(keys_dir: Path) -> Harness:
    """Chain + Publisher for the orders-created topology, built as `PipelineApp._stages` does."""
    from app.security.devkeys import ensure_dev_keys
    from app.security.signing import load_signing_keyring
    from app.topology import load_topology
    from bench.bench_pipeline import bench_topology

    keys = ensure_dev_keys(keys_dir)
    topo = load_topology(bench_topology(keys_dir, keys, TOPIC, None))
    return harness_for(topo, load_signing_keyring(keys.signing_path))


def harness_for(topo: Any, keyring: Any) -> Harness:
    """The broker-free chain and publisher of `topo`, built as `PipelineApp` builds them; the
    dedup window is a plain dict (the one thing that differs from the worker)."""
    import inspect

    from app.agents.chain import Chain
    from app.agents.dedup import Dedup
    from app.agents.publish import Publisher
    from app.tables.dedup import DedupWindow
    from app.worker.pipeline import build_stages, resolve_schema

    # As PipelineApp does: a topology with `validation: warn | strict` gets the payload validator
    # compiled (the shipped one has `warn`, so enrich validates every payload in the worker).
    # Code from before that switch resolves without it.
    kw: dict[str, Any] = {}
    if "validate" in inspect.signature(resolve_schema).parameters and hasattr(topo, "validation_modes"):
        default_mode, ns_modes = topo.validation_modes()
        kw["validate"] = default_mode != "off" or any(m != "off" for m in ns_modes.values())
    stages = build_stages(topo, keyring=keyring, schema=resolve_schema(topo.stage("enrich"), topo.base_dir, **kw),
                          dedup_window=lambda window_s: DedupWindow({}, window=window_s))
    dedup = next((st for st in stages if isinstance(st, Dedup)), None)
    policy = topo.stage("policy")
    chain = Chain(stages, dlq_topic_for=lambda t: t + topo.dlq.topic_suffix,
                  expired_to_dlq=bool(policy and policy.expired == "dlq"))
    kid = topo.outputs.signing_key_id or keyring.worker_key_id
    if TIMING_EVERY is not None:
        chain.stage_timing_every = TIMING_EVERY  # a plain attribute on code without sampling: no effect
    drain = None
    if LATENCY_SAMPLES and hasattr(chain, "latency_samples"):  # code from before per-message samples: ignored
        from app.agents.chain import LatencySamples
        from app.worker.observe import Observer, _ChainSnapshot

        chain.latency_samples = LatencySamples()
        observer, snap = Observer(), _ChainSnapshot()

        def drain() -> None:
            observer._observe_latencies(chain, TOPIC, snap)
    return Harness(chain, Publisher(topo, worker_key=keyring.signing[kid] if topo.outputs.sign else None), dedup,
                   drain=drain)


def run(h: Harness, inputs: Iterable[Input], *, partition_of: Any = None, keep: bool = True) -> list[tuple[str, Any]]:
    """Process `inputs` like `BatchRunner.process` (app/worker/batch_runner.py); returns (outcome, emissions | dlq | reason).

    `keep=False` keeps only the outcome, as the worker drops a batch's records once written: holding
    every output alive would make each garbage collection walk a growing heap and bill the stages for it.
    """
    from app.agents.base import Message
    from app.agents.chain import Outcome

    chain, publisher, dedup = h.chain, h.publisher, h.dedup
    clock = CLOCK
    results: list[tuple[str, Any]] = []
    items = list(inputs)
    chain_ns = 0
    two_phase = hasattr(publisher, "prepare")  # the baseline may predate prepare/finish
    for b in range(0, len(items), BATCH):
        emitted: list[Any] = []
        prepared: list[tuple[int, Any]] = []  # (index in results, Prepared)
        for i, (value, headers, key, ts) in enumerate(items[b:b + BATCH], start=b):
            part = partition_of(key) if partition_of else i % 4
            msg = Message(topic=TOPIC, partition=part, offset=i, value=value, key=key,
                          headers=[(k, v) for k, v in headers if v is not None], timestamp_ms=ts)
            t0 = clock()
            result = chain.run(msg)
            chain_ns += clock() - t0
            if result.outcome is Outcome.EMITTED:
                try:
                    t0 = clock()
                    out = publisher.prepare(msg) if two_phase else publisher.emissions(msg)
                    ns = clock() - t0
                    chain.stats.stage_ns["publish"] += ns
                    chain.stats.stage_calls["publish"] += 1
                    if h.drain is not None:  # as app/worker/batch_runner.py records it
                        chain.latency_samples.stages.append(("publish", ns))
                    if two_phase:
                        prepared.append((len(results), out))
                    results.append(("emitted", out if keep else None))
                    emitted.append(msg)
                except Exception as exc:
                    result = chain.dlq_for_publish_failure(msg, exc)
            if result.outcome is Outcome.DLQ:
                results.append(("dlq", result.dlq if keep else None))
            elif result.outcome is not Outcome.EMITTED:
                results.append((str(result.outcome), result.reason))
        if prepared:  # phase 2, as the worker: the batch's outputs signed at once, order kept
            t0 = clock()
            done = publisher.finish([p for _, p in prepared])
            chain.stats.stage_ns["publish"] += clock() - t0
            for (at, _), emissions in zip(prepared, done, strict=True):
                results[at] = ("emitted", emissions if keep else None)
        if dedup is not None:
            for msg in emitted:
                dedup.record_emitted(msg)
            dedup.end_batch()
        if h.drain is not None:  # the observer's per-batch histogram work, billed to the chain row
            t0 = clock()
            h.drain()
            chain_ns += clock() - t0
    h.chain_ns += chain_ns
    h.chain_calls += len(items)
    return results


# --------------------------------------------------------------------------- timing


def _bench_inputs(keys_dir: Path, n: int) -> list[Input]:
    from app.security.devkeys import ensure_dev_keys
    from bench import bench_pipeline

    now = int(time.time() * 1000)
    if PAYLOAD == "valid":
        # make_messages reads `payload_1kb` when called: swapping it works on a baseline's
        # bench_pipeline too (the module a baseline exports)
        bench_pipeline.payload_1kb = bench_pipeline.PAYLOADS["valid"]
    values = bench_pipeline.make_messages(ensure_dev_keys(keys_dir), TOPIC, n)
    return [(v, [], str(i % 64).encode(), now) for i, v in enumerate(values)]


def one_pass(keys_dir: Path, inputs: list[Input]) -> dict[str, float]:
    """µs per message per stage over one pass (a fresh chain, so no id is a duplicate)."""
    h = build(keys_dir)
    out = run(h, inputs, keep=False)
    assert all(o == "emitted" for o, _ in out), {o for o, _ in out}  # dropped work would prove nothing
    us = h.chain.stats.stage_us_per_message()
    return {**{k: us.get(k, 0.0) for k in STAGES}, CHAIN: h.chain_ns / 1000 / max(1, h.chain_calls)}


def tune_gc() -> None:
    """What the worker does once started (`app.worker.faust_app.tune_gc`, inlined so a baseline
    from before it gets the same): freeze what start-up allocated and collect the young
    generation every 100,000 allocations. With CPython's defaults the older generations re-walk
    every protobuf descriptor and input at each collection; the py-spy profile then bills that
    to whatever allocated at that moment (issue 29: `HMAC.copy` showed 9 % of all samples), a
    cost the worker does not pay. `--gc default` keeps CPython's collector as it is."""
    import gc

    if GC_MODE != "worker":
        return
    gc.collect()
    gc.freeze()
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(100_000, gen1, gen2)


def worker(n: int, passes: int, keys_dir: Path) -> list[dict[str, float]]:
    inputs = _bench_inputs(keys_dir, n)
    one_pass(keys_dir, inputs[:BATCH])  # warm-up: imports, JWT cache, first-call costs
    tune_gc()
    return [one_pass(keys_dir, inputs) for _ in range(passes)]


def _table(columns: dict[str, dict[str, float]]) -> str:
    ratio = columns.pop("paired after/before", None)
    names = list(columns)
    lines = ["| stage | " + " | ".join(names) + (" | change (paired) |" if ratio else " |"),
             "|---|" + "---|" * (len(names) + (1 if ratio else 0))]
    for stage in (*STAGES, "total", CHAIN):
        row = f"| {stage} | " + " | ".join(f"{columns[c][stage]:.1f}" for c in names)
        if ratio:
            row += f" | {(ratio[stage] - 1) * 100:+.0f} %"
        lines.append(row + " |")
    return "\n".join(lines)


def _medians(samples: list[dict[str, float]]) -> dict[str, float]:
    med = {k: statistics.median(s[k] for s in samples) for k in (*STAGES, CHAIN)}
    med["total"] = statistics.median(sum(s[k] for k in STAGES) for s in samples)
    return med


def serve(n: int, chunk: int, keys_dir: Path) -> None:
    """Worker for `compare`: one harness, one chunk of fresh messages per `run` line on stdin,
    one JSON line of µs per message per stage (for that chunk) on stdout."""
    import app

    inputs = _bench_inputs(keys_dir, n)
    one_pass(keys_dir, inputs[:BATCH])  # warm-up
    h = build(keys_dir)
    tune_gc()
    stats = h.chain.stats
    print(json.dumps({"app": str(Path(app.__file__).parent)}), flush=True)
    pos = 0
    for line in sys.stdin:
        if line.strip() != "run":
            break
        if pos + chunk > len(inputs):
            h, pos = build(keys_dir), 0  # a fresh window: the same ids again would be duplicates
            stats = h.chain.stats
        ns0, calls0 = dict(stats.stage_ns), dict(stats.stage_calls)
        chain0, chain_calls0 = h.chain_ns, h.chain_calls
        out = run(h, inputs[pos:pos + chunk], keep=False)
        assert all(o == "emitted" for o, _ in out), {o for o, _ in out}
        pos += chunk
        print(json.dumps({**{k: (stats.stage_ns[k] - ns0.get(k, 0)) / 1000 / max(1, stats.stage_calls[k] - calls0.get(k, 0))
                             for k in STAGES},
                          CHAIN: (h.chain_ns - chain0) / 1000 / max(1, h.chain_calls - chain_calls0)}), flush=True)


def compare(baseline: str, n: int, rounds: int, chunk: int, clock: str = "cpu",
            timing_every: int | None = None) -> dict[str, dict[str, float]]:
    """Baseline (`git archive` of `baseline`) against the working tree.

    Both run as long-lived worker processes and take turns, one chunk of `chunk` messages at a
    time (a fraction of a second), so load changes on the shared machine - which move whole
    multi-second passes by 2-3x here - hit both variants alike. Per stage: the median over
    chunks of each variant, and the median of the paired (same round) after/before ratios.
    """
    tmp = Path(tempfile.mkdtemp(prefix="prism-bench-stages-"))
    base_dir = tmp / "baseline"
    base_dir.mkdir()
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", baseline, "app", "bench", "topologies"],
                             check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(base_dir)], input=archive, check=True)
    shutil.copy(Path(__file__), base_dir / "bench" / "bench_stages.py")  # same harness for both
    keys_dir = tmp / "keys"
    from app.security.devkeys import ensure_dev_keys

    ensure_dev_keys(keys_dir)  # once, before two processes could race to create them
    variants = {f"before ({baseline})": base_dir, "after (working tree)": ROOT}
    procs = {}
    for name, cwd in variants.items():
        procs[name] = subprocess.Popen(
            [sys.executable, "-m", "bench.bench_stages", "--serve", "--n", str(n), "--chunk", str(chunk),
             "--keys", str(keys_dir), "--clock", clock, "--gc", GC_MODE, "--payload", PAYLOAD, *(["--latency-samples"] if LATENCY_SAMPLES else []),
             *(["--stage-timing-every", str(timing_every)] if timing_every is not None else [])], cwd=str(cwd), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    samples: dict[str, list[dict[str, float]]] = {v: [] for v in variants}
    try:
        for name, p in procs.items():
            hello = json.loads(p.stdout.readline())  # type: ignore[union-attr]
            assert Path(hello["app"]).resolve().is_relative_to(variants[name].resolve()), hello
        for r in range(rounds):
            order = list(procs.items()) if r % 2 == 0 else list(reversed(procs.items()))
            for name, p in order:
                p.stdin.write("run\n")  # type: ignore[union-attr]
                p.stdin.flush()  # type: ignore[union-attr]
                samples[name].append(json.loads(p.stdout.readline()))  # type: ignore[union-attr]
    finally:
        for p in procs.values():
            p.stdin.close()  # type: ignore[union-attr]
            p.wait()
        shutil.rmtree(tmp, ignore_errors=True)
    result = {name: _medians(s) for name, s in samples.items()}
    before, after = samples.values()
    ratios = {k: statistics.median(a[k] / b[k] for a, b in zip(after, before, strict=True) if b[k])
              for k in (*STAGES, CHAIN)}
    ratios["total"] = statistics.median(sum(a[k] for k in STAGES) / sum(b[k] for k in STAGES)
                                        for a, b in zip(after, before, strict=True))
    result["paired after/before"] = ratios
    return result


# --------------------------------------------------------------------------- output equivalence


def _edge_cases(keys: Any, n: int) -> list[tuple[bytes, list[tuple[str, bytes]]]]:
    """Envelopes that exercise the signature checks the demo mix never reaches: legacy scope,
    draft layout, a second security record (signed and unsigned), a repeated metadata record,
    a security record with the wrong wire type, a tampered payload, disagreeing prism-* headers."""
    from app.envelope import Layout, encode, new_envelope
    from app.security.signing import SCOPE_LEGACY, sign

    token = keys.mint_token("svc-orders", ttl_s=7200)
    key = keys.keyring.signing["dev-producer-1"]
    empty_security = b"\x12\x00"  # reviewed layout: field 2, length 0
    out: list[tuple[bytes, list[tuple[str, bytes]]]] = []
    for i in range(n):
        def env(i: int = i) -> Any:
            e = new_envelope(TOPIC, {"order_id": f"edge-{i}", "n": i}, namespace="order-events",
                             message_id=f"01900000-0000-7000-8000-{i:012d}")
            e.ensure_security().auth_token = token
            return e
        v2 = sign(env(), key)
        meta = v2[: v2.index(b"\x12")]  # the leading metadata record (field 1), as encoded
        kind = i % 9
        if kind == 0:
            out.append((sign(env(), key, scope=SCOPE_LEGACY), []))
        elif kind == 1:
            out.append((sign(env(), key, Layout.DRAFT), []))
        elif kind == 2:
            out.append((v2 + empty_security, []))
        elif kind == 3:
            out.append((encode(env()) + empty_security, []))
        elif kind == 4:
            out.append((v2 + meta, []))
        elif kind == 5:
            out.append((v2 + b"\x10\x01", []))
        elif kind == 6:
            out.append((v2.replace(b"edge-", b"EDGE-"), []))
        elif kind == 7:
            out.append((v2, [("prism-message-id", b"not-the-id"), ("prism-auth-token", token.encode())]))
        else:
            out.append((v2, [("traceparent", b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")]))
    return out


def dump_corpus(path: Path, keys_dir: Path, n: int) -> None:
    """A varied corpus: the demo load generator's mix (good, bad, duplicates) + bench messages
    + signature edge cases (`_edge_cases`)."""
    from app.demo.loadgen import LoadGenerator
    from app.security.devkeys import ensure_dev_keys

    keys = ensure_dev_keys(keys_dir)
    gen = LoadGenerator(keys, topic=TOPIC, namespace="order-events", seed=11)
    now = int(time.time() * 1000)
    corpus = []
    for i in range(n):
        s = gen.next()
        corpus.append({"value": s.value.hex(), "headers": [[k, v.hex()] for k, v in s.headers],
                       "key": s.key.hex() if s.key is not None else None, "ts": now + i})
    for v, _, k, ts in _bench_inputs(keys_dir, n // 4):
        corpus.append({"value": v.hex(), "headers": [["traceparent", b"00-4bf92f3577b34da6a3ce929d0e0e4736-"
                                                      b"00f067aa0ba902b7-01".hex()]],
                       "key": k.hex() if k else None, "ts": ts})
    for i, (v, hs) in enumerate(_edge_cases(keys, n // 10)):
        corpus.append({"value": v.hex(), "headers": [[k, hv.hex()] for k, hv in hs], "key": str(i % 64).encode().hex(),
                       "ts": now + n + i})
    path.write_text(json.dumps({"now": now / 1000, "items": corpus}))


def compare_outputs(before: Path, after: Path) -> str:
    """Compare two `--dump-outputs` files: outcomes, DLQ records and every emission's topic, key,
    headers and timestamp must be identical; an emitted `.v2`/`.v3` value must be identical or
    decode to the same envelope once the batch signature's per-batch fields (signature,
    sibling_digest, tree_path) are set aside. Why not bytes alone: upb writes a map (the
    envelope's `extensions`) in an order that depends on the process (its hash seed), so a
    message with two or more extension entries is encoded differently by two runs of the very
    same code - and the Merkle root, hence the batch's signature, with it. Raises on a difference."""
    from app._gen.prism.envelope.draft import envelope_pb2 as dpb
    from app._gen.prism.envelope.v1 import envelope_pb2 as vpb

    def decoded(topic: str, value: str) -> Any:
        cls = dpb.PrismEnvelope if topic.endswith(".v2") else vpb.PrismEnvelope
        m = cls.FromString(bytes.fromhex(value))
        if m.HasField("security"):
            for name in ("signature", "sibling_digest", "tree_path"):
                m.security.ClearField(name)
        return m

    a, b = json.loads(before.read_text()), json.loads(after.read_text())
    if len(a) != len(b):
        raise AssertionError(f"{len(a)} inputs against {len(b)}")
    exact = 0
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        if x == y:
            exact += 1
            continue
        if x["outcome"] != y["outcome"] or len(x["records"]) != len(y["records"]):
            raise AssertionError(f"input {i}: {x['outcome']} with {len(x['records'])} records against "
                                 f"{y['outcome']} with {len(y['records'])}")
        for p, q in zip(x["records"], y["records"], strict=True):
            if {k: v for k, v in p.items() if k != "value"} != {k: v for k, v in q.items() if k != "value"}:
                raise AssertionError(f"input {i}: topic, key, headers or timestamp differ: {p} / {q}")
            if p["value"] != q["value"] and (not p["topic"].endswith((".v2", ".v3"))
                                             or decoded(p["topic"], p["value"]) != decoded(q["topic"], q["value"])):
                raise AssertionError(f"input {i}: the {p['topic']} value differs")
    return (f"{len(a)} inputs: {exact} byte-identical, {len(a) - exact} the same envelopes with other "
            "batch-signature fields (map order; see compare_outputs)")


def dump_outputs(corpus_path: Path, out_path: Path, keys_dir: Path) -> None:
    import app.observability.tracecontext as tc

    rng = random.Random(1234)
    tc.getrandbits = rng.getrandbits  # type: ignore[attr-defined]
    doc = json.loads(corpus_path.read_text())
    corpus, frozen = doc["items"], doc["now"] + 5.0
    time.time = lambda: frozen  # error texts say "expired N s ago": freeze the wall clock
    inputs: list[Input] = [(bytes.fromhex(c["value"]), [(k, bytes.fromhex(v)) for k, v in c["headers"]],
                            bytes.fromhex(c["key"]) if c["key"] is not None else None, c["ts"]) for c in corpus]
    h = build(keys_dir)
    out = []

    def rec(topic: str, r: Any) -> dict[str, Any]:
        return {"topic": topic, "key": r.key.hex() if r.key is not None else None, "value": r.value.hex(),
                "headers": [[k, v.hex()] for k, v in r.headers], "ts": r.timestamp_ms}

    for outcome, item in run(h, inputs, partition_of=lambda key: (key or b"\0")[0] % 4):
        if outcome == "emitted":
            out.append({"outcome": outcome, "records": [rec(e.topic, e.record) for e in item]})
        elif outcome == "dlq":
            out.append({"outcome": outcome, "reason": item.reason, "record": rec(item.topic, item)})
        else:
            out.append({"outcome": outcome, "reason": item})
    out_path.write_text(json.dumps(out, indent=0))
    print(json.dumps(dict(h.chain.stats.outcomes)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=20000)
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--keys", type=Path, default=None, help="dev keys folder (created when missing)")
    ap.add_argument("--worker", action="store_true", help="print one JSON line of per-pass results")
    ap.add_argument("--profile", type=Path, default=None, help="cProfile one pass into this file")
    ap.add_argument("--baseline", default=None, help="git ref to compare against, interleaved")
    ap.add_argument("--rounds", type=int, default=40, help="chunks per variant in --baseline mode")
    ap.add_argument("--chunk", type=int, default=1000, help="messages per turn in --baseline mode")
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--clock", choices=("cpu", "wall"), default="cpu",
                    help="time stages by thread CPU time (default) or wall time, as the worker does")
    ap.add_argument("--stage-timing-every", type=int, default=None,
                    help="time the stages of one message in N (default: the chain's own; 1 times every message)")
    ap.add_argument("--latency-samples", action="store_true",
                    help="record per-message latencies and observe them per batch, as the worker's observer")
    ap.add_argument("--gc", choices=("worker", "default"), default="worker",
                    help="worker: collect as `prism run` does (freeze + young threshold 100,000); default: CPython's")
    ap.add_argument("--payload", choices=("bench", "valid"), default="bench",
                    help="bench: payload_1kb (fails the schema: validation's warn path); valid: matches it")
    ap.add_argument("--dump-corpus", type=Path, default=None)
    ap.add_argument("--dump-outputs", nargs=2, type=Path, metavar=("CORPUS", "OUT"), default=None)
    ap.add_argument("--compare-outputs", nargs=2, type=Path, metavar=("BEFORE", "AFTER"), default=None)
    args = ap.parse_args()
    keys_dir = args.keys or Path(tempfile.mkdtemp(prefix="prism-bench-keys-"))
    if args.clock == "cpu":
        use_cpu_clock()
    global TIMING_EVERY, LATENCY_SAMPLES, GC_MODE, PAYLOAD
    TIMING_EVERY = args.stage_timing_every
    GC_MODE = args.gc
    PAYLOAD = args.payload
    LATENCY_SAMPLES = args.latency_samples
    if args.dump_corpus:
        dump_corpus(args.dump_corpus, keys_dir, args.n)
    elif args.dump_outputs:
        dump_outputs(*args.dump_outputs, keys_dir)
    elif args.compare_outputs:
        print(compare_outputs(*args.compare_outputs))
    elif args.serve:
        serve(args.n, args.chunk, keys_dir)
    elif args.baseline:
        res = compare(args.baseline, args.n, args.rounds, args.chunk, args.clock, args.stage_timing_every)
        print(f"\n{args.clock} µs per message, medians of {args.rounds} interleaved turns of {args.chunk} messages\n")
        print(_table(res))
    elif args.profile:
        inputs = _bench_inputs(keys_dir, args.n)
        one_pass(keys_dir, inputs[:BATCH])
        tune_gc()
        prof = cProfile.Profile()
        prof.enable()
        one_pass(keys_dir, inputs)
        prof.disable()
        prof.dump_stats(str(args.profile))
        import pstats

        pstats.Stats(prof).sort_stats("tottime").print_stats(40)
    else:
        import app

        passes = worker(args.n, args.passes, keys_dir)
        if args.worker:
            print(json.dumps({"app": str(Path(app.__file__).parent), "passes": passes}))
        else:
            print(_table({"µs/msg (median)": _medians(passes)}))


if __name__ == "__main__":
    main()

"""Per-stage py-spy profiles of the worker's message path (issue 29), before/after in one table.

Record (py-spy is in the dev extra; sampling, so the code runs at full speed):

    py-spy record -r 250 -f raw -o after.txt -- .venv/bin/python -m bench.bench_stages --n 6000 --passes 3
    py-spy record -r 250 -f raw -o worker.txt -- .venv/bin/python -m bench.profile_stages worker 20000
    py-spy record -r 250 -f raw -o valid.txt -- .venv/bin/python -m bench.profile_stages worker 12000 --payload valid
    py-spy record -r 250 -f raw -o hdr.txt -- .venv/bin/python -m bench.profile_stages worker 12000 --payload valid --headers 1
    .venv/bin/python -m bench.profile_stages worker 12000 --payload valid --uuid-keys

The first is the broker-free stage harness (`bench_stages`); the second is the worker itself:
`PipelineApp` on Faust with the RocksDB dedup table, on the embedded broker, over a preloaded
backlog (`bench_pipeline.run_chain`), so the framework, aiokafka and the table show too. `--payload
valid` sends the order that matches the topology's schema (production's path; the default, `bench`,
fails it at its second key and measures validation's warn path). `--headers N` gives every backlog
record N ordinary producer headers (`bench-sent` first, as the latency client's live stream has).
`--uuid-keys` keys the input records by 36-byte UUIDs, as a Prism producer's correlation ids
(default: "0".."63"). For a
"before", run the same under a `git archive` of the older tree with this file copied in.

Report (share of samples per stage, and µs when the total CPU per message is given):

    .venv/bin/python -m bench.profile_stages report before.txt after.txt [--us 240 183]

Samples are attributed to the innermost stage frame (`<Stage>.process`, `Publisher.prepare`,
`Publisher.finish`); outside a stage, to the dedup table, the worker loop (app/worker), aiokafka,
Faust/mode, or the rest. Idle time is excluded: py-spy drops idle threads, and the frames uvloop
sits in while it waits (a thread's `_start_thread`, the loop's `Runner.run` as the innermost frame)
are dropped here, since uvloop's wait is native code py-spy cannot tell from work. Start-up and
shutdown (`_STARTUP`) are dropped too: the worker's CPU per message is timed from its first batch
to its last. The per-payload-validation and warning-log lines are parts of enrich.

Function-level view of one part (where its samples are, by the innermost app/worker line and
what it called):

    .venv/bin/python -m bench.profile_stages detail worker.txt "worker loop" [--top 30]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import re
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

_STAGE = re.compile(r"^(\w+)\.process \(app/agents/")
_SETUP = ("make_messages", "preload (", "ensure_dev_keys", "bench_topology", "load_topology", "build (", "_bench_inputs")
#: Start-up and shutdown work of the worker run, which `bench_pipeline.Clock` leaves out of the CPU
#: per message (it times from the first batch to the last): imports, building the app, Faust's
#: settings, `tune_gc`'s full collection, opening and closing the RocksDB table on (re)assignment.
#: Counting them put ~80 % of the "worker loop", "Faust / mode" and "other" rows of the first
#: worker profile (BENCHMARKS.md, issue 29) on start-up, which no message pays.
_STARTUP = ("_find_and_load", "_handle_fromlist", "PipelineApp.__init__", "tune_gc (", "App._load_settings",
            "on_rebalance (", "_open_for_partition", "Store.stop (", "on_first_start", "_prepare_datadir")
_IDLE_LEAVES = ("ServiceThread._start_thread", "Runner.run", "_run_module_as_main")


def categorize(frames: list[str]) -> str | None:
    """The part of the message path one sample belongs to; None for setup and idle samples."""
    joined = ";".join(frames)
    if any(s in joined for s in _SETUP) or any(s in joined for s in _STARTUP):
        return None
    if frames[-1].startswith(_IDLE_LEAVES):
        return None
    cat = None
    for f in frames:
        m = _STAGE.match(f)
        if m:
            cat = m.group(1)
        elif f.startswith("Publisher.prepare"):
            cat = "publish: prepare (both layouts, digests)"
        elif f.startswith("Publisher.finish"):
            cat = "publish: finish (Merkle tree, signature, bytes)"
    if cat is not None:
        return cat
    if "app/tables/" in joined or "Dedup.record_emitted" in joined:
        return "dedup table (record, changelog)"
    if "app/worker/" in joined:
        return "worker loop (app/worker, outside the stages)"
    if "aiokafka/" in joined:
        return "aiokafka (fetch, produce, commit)"
    if "faust/" in joined or "mode/" in joined:
        return "Faust / mode"
    if "Chain.run" in joined or "Chain._run" in joined:
        return "chain dispatch (+ the harness's thread-CPU clock reads)"
    if "bench_stages.py" in joined:
        return "stage harness (message objects, clock reads)"
    return "other (event loop, GC)"


def _samples(path: Path) -> Iterator[tuple[list[str], int, str]]:
    """(frames, sample count, part) of each counted stack of a py-spy raw file (`categorize`
    leaves out the uncounted ones)."""
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        cat = categorize(frames)
        if cat is not None:
            yield frames, int(count), cat


def load(path: Path) -> tuple[collections.Counter[str], collections.Counter[str]]:
    """(samples per part, samples of enrich's payload validation and of its warning log)."""
    parts: collections.Counter[str] = collections.Counter()
    enrich: collections.Counter[str] = collections.Counter()
    for frames, n, cat in _samples(path):
        parts[cat] += n
        if cat == "Enrich":
            if any("payload_check" in f or "json_format" in f for f in frames):
                enrich["  enrich: payload validation"] += n
            elif any(f.startswith("Enrich._log") for f in frames):
                enrich["  enrich: warning log"] += n
    return parts, enrich


_HARNESS = "stage harness (message objects, clock reads)"


def report(paths: list[Path], us: list[float] | None) -> str:
    """Shares of the message path's samples; `bench_stages`' own harness (building the input
    records, its thread-CPU clock reads around publish) is left out of the total and noted."""
    loaded = [load(p) for p in paths]
    harness = [parts.pop(_HARNESS, 0) for parts, _ in loaded]
    totals = [sum(parts.values()) for parts, _ in loaded]
    names = sorted({k for parts, _ in loaded for k in parts}, key=lambda k: -loaded[0][0].get(k, 0))
    head = "| part | " + " | ".join(f"{p.name}, % of samples" for p in paths)
    if us:
        head += " | " + " | ".join(f"{p.name}, µs of {u:g}" for p, u in zip(paths, us, strict=True))
    lines = [head + " |", "|---" * (1 + len(paths) * (2 if us else 1)) + "|"]
    for name in names:
        row = [f"{100 * parts.get(name, 0) / t:.1f}" for (parts, _), t in zip(loaded, totals, strict=True)]
        if us:
            row += [f"{u * parts.get(name, 0) / t:.0f}" for (parts, _), t, u in zip(loaded, totals, us, strict=True)]
        lines.append(f"| {name} | " + " | ".join(row) + " |")
        if name == "Enrich":
            for sub in ("  enrich: payload validation", "  enrich: warning log"):
                vals = [f"{100 * e.get(sub, 0) / t:.1f}" for (_, e), t in zip(loaded, totals, strict=True)]
                lines.append(f"| {sub.strip()} | " + " | ".join(vals) + (" |" * (len(paths) if us else 0)) + " |")
    lines.append(f"\nsamples: {', '.join(str(t) for t in totals)}"
                 + (f" (and in bench_stages' harness, left out: {', '.join(str(h) for h in harness)})"
                    if any(harness) else ""))
    return "\n".join(lines)


def detail(path: Path, part: str, top: int = 30) -> str:
    """The samples of the parts whose name starts with `part`, by the innermost `app/worker/`
    line and the function it was in (its callee, or "self"), as shares of all counted samples."""
    lines: collections.Counter[str] = collections.Counter()
    total = 0
    for frames, n, cat in _samples(path):
        total += n
        if not cat.startswith(part):
            continue
        at = [i for i, f in enumerate(frames) if "app/worker/" in f]
        if not at:
            where = " ; ".join(f.split(" (")[0] for f in frames[-3:])
        else:
            i = at[-1]
            callee = frames[i + 1].split(" (")[0] if i + 1 < len(frames) else "self"
            where = f"{frames[i].split('app/worker/')[0].split(' (')[0]} ({frames[i].rsplit('/', 1)[-1]} -> {callee}"
        lines[where] += n
    out = [f"| {part}: where | % of all samples |", "|---|---|"]
    out += [f"| {k} | {100 * v / max(total, 1):.1f} |" for k, v in lines.most_common(top)]
    return "\n".join(out)


def producer_headers(n: int) -> list[tuple[str, bytes]] | None:
    """`n` ordinary producer headers (none of them `prism-*`, a trace or an auth header), as a
    live producer sets them: `bench-sent` first, as `bench/_latency_client.py` sends it, then
    application headers. None for 0: records without headers, as `preload` sends by default."""
    if n <= 0:
        return None
    return [("bench-sent", b"1764495000.123456"), *((f"x-app-header-{i}", f"value-{i}".encode()) for i in range(1, n))]


async def worker(n: int, payload: str = "bench", headers: int = 0, uuid_keys: bool = False) -> None:
    """bench_pipeline's Prism chain alone (no raw loop, no Faust passthrough), for py-spy.
    `payload`: "bench" (fails the topology's schema: validation's warn path) or "valid" (matches it,
    the path production traffic takes). `headers`: how many ordinary producer headers each backlog
    record carries (`producer_headers`): a live producer's records nearly always carry some.
    `uuid_keys`: input records keyed by 36-byte UUIDs (the default key of a Prism producer, its
    correlation id) instead of "0".."63"; the worker keeps the key, so its output placement
    hashes realistic keys (issue 29)."""
    from app.broker.admin import ensure_topics
    from app.broker.embedded import EmbeddedBroker
    from app.security.devkeys import ensure_dev_keys
    from app.topology import load_topology
    from bench import bench_pipeline
    from bench.bench_pipeline import bench_topology, make_messages, preload, run_chain

    bench_pipeline.use_payload(payload)
    tmp = Path(tempfile.mkdtemp(prefix="prism-profile-"))
    keys = ensure_dev_keys(tmp / "keys")
    async with EmbeddedBroker(log_dir=tmp / "broker") as broker:
        topic = f"bench.in.{uuid.uuid4().hex[:6]}"
        topo_path = bench_topology(tmp, keys, topic, None)
        await ensure_topics(broker.bootstrap, load_topology(topo_path).topics())
        await preload(broker.bootstrap, topic, make_messages(keys, topic, n), producer_headers(headers),
                      uuid_keys=uuid_keys)
        result, _ = await run_chain(broker.bootstrap, topo_path, n, tmp / "chain")
        print(result, flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("worker", help="run the worker's chain over a preloaded backlog (wrap it in py-spy)")
    w.add_argument("n", type=int)
    w.add_argument("--payload", choices=("bench", "valid"), default="bench",
                   help="bench: payload_1kb (fails the schema: the warn path); valid: payload_valid_1kb")
    w.add_argument("--headers", type=int, default=0,
                   help="ordinary producer headers per record (bench-sent, x-app-header-1, ...); default none")
    w.add_argument("--uuid-keys", action="store_true",
                   help='key the input records by 36-byte UUIDs (default: "0".."63")')
    r = sub.add_parser("report", help="per-stage table of py-spy raw files")
    r.add_argument("paths", nargs="+", type=Path)
    r.add_argument("--us", nargs="+", type=float, default=None, help="CPU µs per message of each run")
    d = sub.add_parser("detail", help="function-level view of one part of a py-spy raw file")
    d.add_argument("path", type=Path)
    d.add_argument("part", help='the start of a part\'s name, e.g. "worker loop"')
    d.add_argument("--top", type=int, default=30)
    args = ap.parse_args(argv)
    if args.cmd == "worker":
        from app.worker.faust_app import use_uvloop

        use_uvloop()
        asyncio.run(worker(args.n, args.payload, args.headers, args.uuid_keys))
    elif args.cmd == "detail":
        print(detail(args.path, args.part, args.top))
    else:
        if args.us is not None and len(args.us) != len(args.paths):
            ap.error("--us takes one figure per file")
        print(report(args.paths, args.us))
    return 0


if __name__ == "__main__":
    sys.exit(main())

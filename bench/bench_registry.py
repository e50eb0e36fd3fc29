"""Registry benchmarks (RFC-030 targets: < 10 ms p99 schema fetch, 10k req/s class).

1. GET latency under concurrent load: a real uvicorn server in its own process (SQLite
   store), and the load generated from a SECOND process (stdlib http.client, keep-alive,
   N threads) so client CPU does not share the server's interpreter. Reports p50/p99/max
   and throughput for ``GET /schemas/ids/{id}`` and ``GET /subjects/{s}/versions/latest``.
2. Compatibility-check time for a 100-field schema (Protobuf incl. protoc, Avro, JSON
   Schema), median of repeated runs, cold (first protoc compile) and warm (cached).

    python -m bench.bench_registry [--seconds 5] [--threads 16] [--json out.json]
    python -m bench.bench_registry --compare /tmp/before --rounds 3 --seconds 4   # A/B, interleaved
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing as mp
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _proto(n: int, extra: str = "") -> str:
    fields = "\n".join(f"  {'int64' if i % 3 == 0 else 'string' if i % 3 == 1 else 'double'} f{i} = {i};"
                       for i in range(1, n + 1))
    return f'syntax = "proto3";\npackage bench.v1;\nmessage Wide {{\n{fields}\n{extra}}}\n'


def _avro(n: int, extra: list | None = None) -> str:
    t = ["long", "string", "double"]
    fields = [{"name": f"f{i}", "type": t[i % 3]} for i in range(1, n + 1)] + (extra or [])
    return json.dumps({"type": "record", "name": "Wide", "namespace": "bench", "fields": fields})


def _json(n: int, extra: dict | None = None) -> str:
    t = ["integer", "string", "number"]
    props = {f"f{i}": {"type": t[i % 3]} for i in range(1, n + 1)} | (extra or {})
    return json.dumps({"type": "object", "properties": props, "required": ["f1"]})


def _load_worker(port: int, path: str, seconds: float, threads: int, q: mp.Queue) -> None:
    """Runs in the second process: N keep-alive connections hammering one GET path."""
    lat: list[float] = []
    errors = [0]
    lock = threading.Lock()
    stop = time.perf_counter() + seconds

    def run() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        mine: list[float] = []
        while time.perf_counter() < stop:
            t0 = time.perf_counter()
            try:
                conn.request("GET", path)
                r = conn.getresponse()
                r.read()
                if r.status != 200:
                    errors[0] += 1
            except Exception:
                errors[0] += 1
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
                continue
            mine.append(time.perf_counter() - t0)
        with lock:
            lat.extend(mine)

    ts = [threading.Thread(target=run) for _ in range(threads)]
    t0 = time.perf_counter()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    q.put({"latencies": lat, "errors": errors[0], "elapsed": time.perf_counter() - t0})


def bench_get(seconds: float, threads: int, root: Path = ROOT) -> dict:
    """GET load against a server running the code in ``root`` (another checkout for A/B runs)."""
    port = _free_port()
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "PRISM_REGISTRY_DB": f"sqlite:///{tmp}/bench.db", "PYTHONPATH": str(root)}
        # uvloop and httptools named explicitly: "auto" silently falls back to asyncio/h11
        server = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "app.schema.service:app", "--host", "127.0.0.1", "--port", str(port),
             "--loop", "uvloop", "--http", "httptools", "--log-level", "warning", "--no-access-log"],
            cwd=root, env=env)
        try:
            deadline = time.time() + 20
            while True:
                try:
                    c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
                    c.request("GET", "/subjects")
                    c.getresponse().read()
                    break
                except OSError:
                    if time.time() > deadline:
                        raise RuntimeError("server did not start") from None
                    time.sleep(0.1)
            c = http.client.HTTPConnection("127.0.0.1", port)
            body = json.dumps({"schema": _proto(100), "schemaType": "PROTOBUF"})
            c.request("POST", "/subjects/bench.wide-value/versions", body,
                      {"Content-Type": "application/vnd.schemaregistry.v1+json"})
            sid = json.loads(c.getresponse().read())["id"]
            out = {}
            for name, path in (("by_id", f"/schemas/ids/{sid}"), ("latest", "/subjects/bench.wide-value/versions/latest")):
                ctx = mp.get_context("spawn")
                q: mp.Queue = ctx.Queue()
                p = ctx.Process(target=_load_worker, args=(port, path, seconds, threads, q))
                p.start()
                res = q.get(timeout=seconds + 60)
                p.join()
                lat = sorted(res["latencies"])
                n = len(lat)
                out[name] = {
                    "path": path, "requests": n, "errors": res["errors"], "threads": threads,
                    "rps": round(n / res["elapsed"], 1),
                    "p50_ms": round(lat[n // 2] * 1000, 3), "p99_ms": round(lat[int(n * 0.99) - 1] * 1000, 3),
                    "max_ms": round(lat[-1] * 1000, 3),
                }
            return out
        finally:
            server.terminate()
            server.wait(timeout=10)


def bench_compat(repeat: int = 20) -> dict:
    sys.path.insert(0, str(ROOT))
    from app.schema import protoparse
    from app.schema.compat import check

    cases = {
        "protobuf": (_proto(100), _proto(100, "  optional string added = 101;\n")),
        "avro": (_avro(100), _avro(100, [{"name": "added", "type": ["null", "string"], "default": None}])),
        "json": (_json(100), _json(100, {"added": {"type": "string"}})),
    }
    out = {}
    for fmt, (old, new) in cases.items():
        protoparse._CACHE.clear()
        t0 = time.perf_counter()
        res = check(fmt.upper() if fmt != "json" else "JSON", new, [old], "FULL")
        cold = time.perf_counter() - t0
        assert res.is_compatible, res
        runs = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            check(fmt.upper() if fmt != "json" else "JSON", new, [old], "FULL")
            runs.append(time.perf_counter() - t0)
        out[fmt] = {"fields": 100, "mode": "FULL", "cold_ms": round(cold * 1000, 2),
                    "warm_median_ms": round(statistics.median(runs) * 1000, 3)}
    return out


def compare_get(seconds: float, threads: list[int], before: Path, rounds: int) -> dict:
    """A/B: ``before`` (another checkout) and this tree take turns, round by round, so the
    shared machine's load swings hit both alike; medians over rounds are reported."""
    runs: dict[str, list[dict]] = {}
    for r in range(rounds):
        order = [("before", before), ("after", ROOT)]
        if r % 2:
            order.reverse()
        for n in threads:
            for variant, root in order:
                for path, res in bench_get(seconds, n, root).items():
                    runs.setdefault(f"{variant}/{path}/t{n}", []).append(res)
    out = {}
    for key, rs in sorted(runs.items()):
        out[key] = {k: round(statistics.median(x[k] for x in rs), 3) for k in ("rps", "p50_ms", "p99_ms", "max_ms")}
        out[key]["p99_ms_per_round"] = [x["p99_ms"] for x in rs]
        out[key]["errors"] = sum(x["errors"] for x in rs)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--threads", type=int, default=16)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--compare", type=Path, metavar="CHECKOUT",
                    help="A/B the GET paths against the code in another checkout (e.g. a git worktree)")
    ap.add_argument("--compare-threads", default="4,16", help="thread counts for --compare")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds for --compare")
    args = ap.parse_args(argv)
    if args.compare:
        result = {"cpus": os.cpu_count(), "python": sys.version.split()[0], "seconds": args.seconds,
                  "before": str(args.compare), "get_ab": compare_get(
                      args.seconds, [int(x) for x in args.compare_threads.split(",")], args.compare, args.rounds)}
        print(json.dumps(result, indent=2))
        if args.json:
            args.json.write_text(json.dumps(result, indent=2))
        return 0
    result = {"cpus": os.cpu_count(), "python": sys.version.split()[0], "compat": bench_compat(),
              "get": bench_get(args.seconds, args.threads)}
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

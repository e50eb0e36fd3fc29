"""Registry benchmarks (RFC-030 targets: < 10 ms p99 schema fetch, 10k req/s class).

1. GET latency and throughput under concurrent load from a SECOND process. The server is
   what operators run: ``prism schema serve --workers N`` (uvicorn, uvloop + httptools,
   SQLite store). The load comes from ``wrk`` (C, epoll; Debian package ``wrk``) with N
   keep-alive connections, so the client's own CPU is small and the server, not a Python
   load generator, is what is measured. Without wrk (or with ``--load python``) a Python
   client (stdlib http.client, N threads in one process) is used instead and says so; it
   saturates itself at ~4-5k req/s on 2 cores.
   Baseline in the same run: a bare ASGI app on the same uvicorn settings and worker count
   that answers every GET with a fixed body of the same size - the HTTP stack's ceiling, so
   ``vs bare`` shows what the registry itself costs.
   Reports req/s, p50/p99/max and errors for ``GET /schemas/ids/{id}`` and
   ``GET /subjects/{s}/versions/latest``, for each worker count.
2. Compatibility-check time for a 100-field schema (Protobuf incl. protoc, Avro, JSON
   Schema), median of repeated runs, cold (first protoc compile) and warm (cached).

    python -m bench.bench_registry [--seconds 5] [--conns 16] [--workers 1,2] [--rounds 3] [--json out.json]
    python -m bench.bench_registry --compare /tmp/before --rounds 3 --seconds 4   # A/B, interleaved
"""

from __future__ import annotations

import argparse
import base64
import http.client
import json
import multiprocessing as mp
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: Every request authenticates, as Confluent clients with basic.auth.user.info do (the server
#: verifies the Argon2 hash once, then recognizes the credentials from its HMAC-keyed cache).
BENCH_USER, BENCH_PASSWORD = "bench", "bench-password-not-secret"
AUTH_HEADER = "Basic " + base64.b64encode(f"{BENCH_USER}:{BENCH_PASSWORD}".encode()).decode()


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
                conn.request("GET", path, headers={"Authorization": AUTH_HEADER})
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


def _wrk(port: int, path: str, seconds: float, conns: int) -> dict:
    """One wrk run (one client thread: its CPU stays small next to the server's)."""
    out = subprocess.run(["wrk", "-t1", f"-c{conns}", f"-d{seconds:g}s", "--latency", "-H",
                          f"Authorization: {AUTH_HEADER}",
                          f"http://127.0.0.1:{port}{path}"],
                         capture_output=True, text=True, timeout=seconds + 60, check=True).stdout
    unit = {"us": 1e-3, "ms": 1.0, "s": 1000.0}

    def ms(text: str) -> float:
        m = re.fullmatch(r"([\d.]+)(us|ms|s)", text)
        if m is None:
            raise ValueError(f"cannot read wrk latency {text!r} in:\n{out}")
        return float(m.group(1)) * unit[m.group(2)]

    pct = dict(re.findall(r"^\s+(50|99)%\s+(\S+)$", out, re.M))
    latency_max = re.search(r"^\s+Latency\s+\S+\s+\S+\s+(\S+)", out, re.M)
    requests = re.search(r"^\s+(\d+) requests in", out, re.M)
    rps = re.search(r"^Requests/sec:\s+([\d.]+)", out, re.M)
    if not (pct.keys() == {"50", "99"} and latency_max and requests and rps):
        raise ValueError(f"unexpected wrk output:\n{out}")
    errors = sum(int(n) for n in re.findall(r"(?:connect|read|write|timeout) (\d+)", out))
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    return {"requests": int(requests.group(1)), "errors": errors + (int(non2xx.group(1)) if non2xx else 0),
            "conns": conns, "load": "wrk", "rps": round(float(rps.group(1)), 1),
            "p50_ms": round(ms(pct["50"]), 3), "p99_ms": round(ms(pct["99"]), 3),
            "max_ms": round(ms(latency_max.group(1)), 3)}


def _python_load(port: int, path: str, seconds: float, conns: int) -> dict:
    ctx = mp.get_context("spawn")
    q: mp.Queue = ctx.Queue()
    p = ctx.Process(target=_load_worker, args=(port, path, seconds, conns, q))
    p.start()
    res = q.get(timeout=seconds + 60)
    p.join()
    lat = sorted(res["latencies"])
    n = len(lat)
    return {"requests": n, "errors": res["errors"], "conns": conns, "load": "python",
            "rps": round(n / res["elapsed"], 1), "p50_ms": round(lat[n // 2] * 1000, 3),
            "p99_ms": round(lat[int(n * 0.99) - 1] * 1000, 3), "max_ms": round(lat[-1] * 1000, 3)}


def _load(port: int, path: str, seconds: float, conns: int, load: str) -> dict:
    return _wrk(port, path, seconds, conns) if load == "wrk" else _python_load(port, path, seconds, conns)


class _Server:
    """A server process on a free port: the registry (``prism schema serve``; a checkout
    without that command gets plain uvicorn, one worker) or the bare ASGI baseline."""

    def __init__(self, root: Path, workers: int, tmp: str, *, bare_body: bytes | None = None) -> None:
        self.port = _free_port()
        env = {k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"}
        env["PYTHONPATH"] = str(root)
        common = ["--host", "127.0.0.1", "--port", str(self.port)]
        if bare_body is not None:
            body = Path(tmp) / "bare-body"
            body.write_bytes(bare_body)
            env["PRISM_BENCH_BARE_BODY"] = str(body)
            cmd = ["-m", "uvicorn", "bench._bare_asgi:app", *common, "--workers", str(workers), "--loop", "uvloop",
                   "--http", "httptools", "--log-level", "warning", "--no-access-log"]
            cwd = ROOT
        elif "def serve(" in (root / "app/schema/cli.py").read_text():
            db = Path(tmp) / f"bench-{self.port}.db"
            cmd = ["-m", "app.cli.main", "schema", "serve", *common, "--workers", str(workers),
                   "--store", f"sqlite:///{db}"]
            if "--users-file" in (root / "app/schema/cli.py").read_text():  # a checkout with authentication
                from app.security.http_auth import hash_password

                users = Path(tmp) / f"users-{self.port}.json"
                users.write_text(json.dumps([{"user": BENCH_USER, "hash": hash_password(BENCH_PASSWORD),
                                              "roles": ["admin"]}]))
                cmd += ["--users-file", str(users)]
            cwd = root
        else:
            if workers != 1:
                raise SystemExit(f"{root} has no 'prism schema serve': only --workers 1 can be compared")
            env["PRISM_REGISTRY_DB"] = f"sqlite:///{tmp}/bench-{self.port}.db"
            # uvloop and httptools named explicitly: "auto" silently falls back to asyncio/h11
            cmd = ["-m", "uvicorn", "app.schema.service:app", *common, "--loop", "uvloop", "--http", "httptools",
                   "--log-level", "warning", "--no-access-log"]
            cwd = root
        self.proc = subprocess.Popen([sys.executable, *cmd], cwd=cwd, env=env)
        deadline = time.time() + 30
        while True:
            try:
                self.request("GET", "/subjects")
                return
            except OSError:
                if time.time() > deadline or self.proc.poll() is not None:
                    self.stop()
                    raise RuntimeError("server did not start") from None
                time.sleep(0.1)

    def request(self, method: str, path: str, body: str | None = None) -> bytes:
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            c.request(method, path, body, {"Content-Type": "application/vnd.schemaregistry.v1+json",
                                           "Authorization": AUTH_HEADER})
            return c.getresponse().read()
        finally:
            c.close()

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=20)


def bench_get(seconds: float, conns: int, root: Path = ROOT, *, workers: int = 1, load: str = "wrk",
              bare: bool = False) -> dict:
    """GET load against a server running the code in ``root`` (another checkout for A/B runs);
    with ``bare``, also against the bare ASGI baseline serving the by-id body."""
    with tempfile.TemporaryDirectory() as tmp:
        server = _Server(root, workers, tmp)
        try:
            body = json.dumps({"schema": _proto(100), "schemaType": "PROTOBUF"})
            sid = json.loads(server.request("POST", "/subjects/bench.wide-value/versions", body))["id"]
            by_id = f"/schemas/ids/{sid}"
            by_id_body = server.request("GET", by_id)
            out = {name: {"path": path, "workers": workers, **_load(server.port, path, seconds, conns, load)}
                   for name, path in (("by_id", by_id), ("latest", "/subjects/bench.wide-value/versions/latest"))}
        finally:
            server.stop()
        if bare:
            server = _Server(root, workers, tmp, bare_body=by_id_body)
            try:
                out["bare"] = {"path": "/bare", "workers": workers, **_load(server.port, "/bare", seconds, conns, load)}
            finally:
                server.stop()
    return out


def run_get(seconds: float, conns: int, workers: list[int], rounds: int, load: str) -> dict:
    """Each worker count, registry then bare baseline, ``rounds`` times in turn (so the shared
    machine's load swings hit all alike); medians over rounds, plus ratios to the baseline."""
    runs: dict[str, list[dict]] = {}
    for _ in range(rounds):
        for w in workers:
            for name, res in bench_get(seconds, conns, workers=w, load=load, bare=True).items():
                runs.setdefault(f"w{w}/{name}", []).append(res)
    out: dict[str, dict] = {}
    for key, rs in runs.items():
        out[key] = {k: round(statistics.median(x[k] for x in rs), 3) for k in ("rps", "p50_ms", "p99_ms", "max_ms")}
        out[key] |= {"p99_ms_per_round": [x["p99_ms"] for x in rs], "rps_per_round": [x["rps"] for x in rs],
                     "errors": sum(x["errors"] for x in rs), "conns": conns, "load": load}
    for key in out:
        w = key.split("/")[0]
        if not key.endswith("/bare"):
            out[key]["rps_vs_bare"] = round(out[key]["rps"] / out[f"{w}/bare"]["rps"], 3)
    return out


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


def compare_get(seconds: float, threads: list[int], before: Path, rounds: int, load: str = "wrk") -> dict:
    """A/B: ``before`` (another checkout) and this tree take turns, round by round, so the
    shared machine's load swings hit both alike; medians over rounds are reported."""
    runs: dict[str, list[dict]] = {}
    for r in range(rounds):
        order = [("before", before), ("after", ROOT)]
        if r % 2:
            order.reverse()
        for n in threads:
            for variant, root in order:
                for path, res in bench_get(seconds, n, root, load=load).items():
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
    ap.add_argument("--conns", "--threads", dest="conns", type=int, default=16, help="concurrent connections")
    ap.add_argument("--workers", default="1,2", help="registry worker processes to measure, comma-separated")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds (medians are reported)")
    ap.add_argument("--load", choices=("wrk", "python"), default="wrk" if shutil.which("wrk") else "python")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--compare", type=Path, metavar="CHECKOUT",
                    help="A/B the GET paths against the code in another checkout (e.g. a git worktree)")
    ap.add_argument("--compare-threads", default="4,16", help="connection counts for --compare")
    args = ap.parse_args(argv)
    if args.load == "python":
        print("note: wrk not found (apt-get install wrk) - using the Python load client, which saturates "
              "itself at ~4-5k req/s on 2 cores", file=sys.stderr)
    meta = {"cpus": os.cpu_count(), "python": sys.version.split()[0], "seconds": args.seconds,
            "load_average_before": os.getloadavg()}
    if args.compare:
        result = meta | {"before": str(args.compare), "get_ab": compare_get(
            args.seconds, [int(x) for x in args.compare_threads.split(",")], args.compare, args.rounds, args.load)}
    else:
        result = meta | {"compat": bench_compat(), "get": run_get(
            args.seconds, args.conns, [int(x) for x in args.workers.split(",")], args.rounds, args.load)}
    result["load_average_after"] = os.getloadavg()
    print(json.dumps(result, indent=2))
    if "get" in result:
        print(f"\n{'workers/path':<14} {'req/s':>9} {'p50 ms':>7} {'p99 ms':>7} {'max ms':>7} {'vs bare':>8}")
        for key, r in result["get"].items():
            print(f"{key:<14} {r['rps']:>9.0f} {r['p50_ms']:>7.2f} {r['p99_ms']:>7.2f} {r['max_ms']:>7.1f} "
                  f"{r.get('rps_vs_bare', 1.0):>8.2f}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

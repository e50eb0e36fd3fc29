"""Release comparison (issue 14): the worker `prism run` runs, this tree against a previous
release, on the same embedded broker and the same backlog, in interleaved rounds.

    .venv/bin/python -m bench.bench_release --quick                       # smoke test, ~1-2 min
    .venv/bin/python -m bench.bench_release --n 20000 --rounds 3 --scale --latency \
        --json bench/results/release.json

Contenders, each a set of processes of its own, measured from outside:

* ``release`` - the previous release (``--baseline``, default ``d2afe54``), exported with
  ``git archive`` into a cache folder with its own venv (``make venv`` there, once; the
  repository itself is not touched: no worktree is registered in the shared ``.git``);
* ``head`` - this tree;
* ``head-2p`` (``--scale``) - this tree with two worker processes in one consumer group, what
  ``prism run --processes 2`` starts;
* ``plain`` - this tree's stages and outputs in a plain aiokafka consume -> produce loop
  (``bench/_plain_loop.py``): the framework-overhead baseline.

A worker is what ``prism run`` runs: ``python -m app.worker.faust_app
app.worker.pipeline:app_from_env`` with the topology in ``PRISM_TOPOLOGY`` and
``PRISM_EMBEDDED=1`` (the embedded broker's workarounds, as ``prism run`` applies them to the
broker it starts) - the exact command ``prism run --processes N`` gives its children. Each
version runs its own shipped ``topologies/orders-created.yaml`` with a fresh name (= fresh
consumer group and tables), a fresh source topic, the bench keys and the archive tap off (a
separate consumer; this measures the pipeline).

Backlog: ``bench_pipeline.make_messages`` (signed reviewed envelopes, JWT, 1 KB JSON), the
same N payloads - signed with the scope each version verifies (v2 here, the legacy scope for
the release: the same bytes without the security context covered) - written to each contender's own source topic before it starts (outputs are
named after the source topic, so contenders cannot share one).

Measure: a checker in this process reads ``<source>.v3`` and counts records; the steady rate
is the records between the 10 % and the 90 % marks over the time between them (start-up, group
join and the tail excluded), and CPU per message is the contender's processes' CPU time
(``/proc/<pid>/stat`` utime + stime, every thread) over the same window - the whole worker
process, not one thread. The broker's CPU per message over the same window is reported too:
on two cores the broker, not the worker, can be what bounds the rate. Rounds interleave the contenders (order rotated every round) so that
load swings on a shared machine hit them alike; ratios are taken within a round, and the
median round is reported.

``--broker kafka``: the same on one Apache Kafka node (``bench/_brokers.py``) instead of the embedded
broker. A worker then gets what ``prism run`` gives its children on a cluster - ``PRISM_EMBEDDED=0``,
``PRISM_BROKER_URL`` - so none of the embedded broker's workarounds are on, and this tree's topics
are created from the topology as ``prism run`` creates them (``topics()``, ``topic_configs()``).

``--latency``: end-to-end p50/p99 at half of ``head``'s measured maximum rate (load client in
its own process, send timestamp in a header, read back from ``.v3``) for a raw aiokafka
passthrough loop (``bench_pipeline.run_raw``), a ``head`` worker and a ``release`` worker at the
same rate, one after the other, each on its own topics; added = worker - raw loop.
``--latency-warmup S`` leaves the first S seconds of traffic of every run uncounted
(bench/_latency_client.py); ``--latency-rate``, ``--latency-rounds``, ``--trace``: see
BENCHMARKS.md, "Added latency: adaptive batches".
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from aiokafka import AIOKafkaConsumer, TopicPartition

from bench._brokers import BROKERS, BenchBroker, bench_broker, describe

ROOT = Path(__file__).resolve().parents[1]
PARTITIONS = 4
DEFAULT_BASELINE = "d2afe54"
WORKER_TARGET = "app.worker.pipeline:app_from_env"
#: the same worker with per-step latency stamps (`--trace`)
TRACED_TARGET = "bench._latency_trace:app_from_env"
_TICK = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Version:
    """A source tree with its own interpreter."""

    label: str
    root: Path
    python: Path


def signature_scope(version: Version | None) -> int:
    """The signature scope `version`'s worker verifies: scope v2 for this tree, the legacy scope
    for a release from before it (its verifier knows no `signature_scope` field and would send
    every v2-signed input to the DLQ, so no `.v3` mark would ever be reached)."""
    from app.security.signing import SCOPE_LEGACY, SCOPE_V2

    if version is None or version.root == ROOT:
        return SCOPE_V2
    signing = (version.root / "app" / "security" / "signing.py").read_text(encoding="utf-8")
    return SCOPE_V2 if "SCOPE_V2" in signing else SCOPE_LEGACY


def head_version() -> Version:
    return Version("head", ROOT, Path(sys.executable))


def release_version(rev: str, cache: Path, *, fresh: bool = False, python: Path | None = None) -> Version:
    """`rev` exported into `cache/prism-<sha>` with its own venv (built once, then reused).
    `python`: run the export with this interpreter instead (a recent revision whose dependencies
    are this tree's: the export's own folder comes first on its path, so its code is what runs)."""
    sha = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--verify", f"{rev}^{{commit}}"], check=True,
                         capture_output=True, text=True).stdout.strip()
    if python is not None:
        folder = cache / f"src-{sha[:12]}"
        if not (folder / "app").exists():
            folder.mkdir(parents=True, exist_ok=True)
            tar = subprocess.run(["git", "-C", str(ROOT), "archive", sha], check=True, capture_output=True).stdout
            subprocess.run(["tar", "-x", "-C", str(folder)], input=tar, check=True)
        return Version(rev, folder, python)
    folder = cache / f"prism-{sha[:12]}"
    stamp = folder / ".venv" / ".installed"
    if fresh and folder.exists():
        shutil.rmtree(folder)
    if not stamp.exists():
        if folder.exists():
            shutil.rmtree(folder)  # a half-built export from an interrupted run
        folder.mkdir(parents=True)
        tar = subprocess.run(["git", "-C", str(ROOT), "archive", sha], check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(folder)], input=tar, check=True)
        print(f"building the venv of {rev} ({sha[:12]}) in {folder} (once; reused by later runs)", flush=True)
        subprocess.run(["make", "-s", "venv", f"PY={sys.executable}"], cwd=folder, check=True,
                       stdout=subprocess.DEVNULL)
    return Version(rev, folder, folder / ".venv" / "bin" / "python")


def bench_topology(version: Version, out_dir: Path, keys: Any, topic: str, name: str) -> Path:
    """The version's shipped topology with a fresh name and source topic, the bench keys, no archive."""
    doc = yaml.safe_load((version.root / "topologies/orders-created.yaml").read_text())
    doc["name"] = name
    doc["sources"][0].update(topic=topic, partitions=PARTITIONS)
    for st in doc["stages"]:
        if "authenticate" in st:
            st["authenticate"]["jwks"] = str(keys.jwks_path)
        if "verify_signature" in st:
            st["verify_signature"]["keyring"] = str(keys.signing_path)
        if "enrich" in st and st["enrich"].get("schema", {}).get("path"):
            st["enrich"]["schema"]["path"] = str(version.root / "topologies" / st["enrich"]["schema"]["path"])
    doc.setdefault("archive", {})["enabled"] = False
    path = out_dir / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def _stat_ticks(path: str) -> int:
    """utime + stime from a /proc `stat` file (fields 14 and 15); 0 once the process or thread is gone."""
    try:
        fields = Path(path).read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return 0
    return int(fields[11]) + int(fields[12])


def cpu_seconds(pids: list[int]) -> float:
    """utime + stime of the processes (all their threads, also those that have exited), from /proc."""
    return sum(_stat_ticks(f"/proc/{pid}/stat") for pid in pids) / _TICK


def thread_cpu_seconds(pids: list[int]) -> tuple[float, float]:
    """utime + stime of the processes' main threads, and of all their other threads (a Faust
    worker's consumer thread, RocksDB's background threads), from /proc/<pid>/task."""
    main = other = 0
    for pid in pids:
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except FileNotFoundError:
            continue
        for tid in tids:
            ticks = _stat_ticks(f"/proc/{pid}/task/{tid}/stat")
            if tid == str(pid):
                main += ticks
            else:
                other += ticks
    return main / _TICK, other / _TICK


def contender_env() -> dict[str, str]:
    """This process's environment without PRISM_* variables: a contender gets only what its
    runner passes it, not the settings of whoever started the benchmark."""
    return {k: v for k, v in os.environ.items() if not k.startswith("PRISM_")}


def spawn(cmd: list[str], cwd: Path, env: dict[str, str], log_path: Path) -> subprocess.Popen[bytes]:
    """A contender process, output to `log_path`, killed with this one (PR_SET_PDEATHSIG)."""
    from app.broker.embedded import with_parent_death_signal

    with open(log_path, "wb") as log:  # the child holds its own copy of the descriptor
        return subprocess.Popen(with_parent_death_signal(cmd), cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                                stdout=log, stderr=subprocess.STDOUT)


class Contender:
    """How to start one contender's processes for a topology, and what to pass them."""

    def __init__(self, label: str, version: Version, processes: int = 1, plain: bool = False) -> None:
        self.label, self.version, self.processes, self.plain = label, version, processes, plain

    def start(self, topology: Path, bootstrap: str, name: str, data_dir: Path, n: int,
              log_dir: Path, extra_env: dict[str, str] | None = None,
              broker_env: Mapping[str, str] | None = None,
              target: str = WORKER_TARGET) -> list[subprocess.Popen[bytes]]:
        """`broker_env`: the broker's PRISM_* variables (`BenchBroker.worker_env`); default the
        embedded broker's."""
        procs = []
        base_env = contender_env()
        for i in range(self.processes):
            if self.plain:
                cmd = [str(self.version.python), "-m", "bench._plain_loop", str(topology), bootstrap,
                       f"prism-{name}", str(n), str(data_dir / "plain-stats.json")]
                env = base_env
            else:
                cmd = [str(self.version.python), "-m", "app.worker.faust_app", target, "--loglevel", "warning"]
                env = {**base_env, "PRISM_TOPOLOGY": str(topology), "PRISM_BOOTSTRAP": bootstrap,
                       "PRISM_DATA_DIR": str(data_dir / f"proc-{i}"), "PRISM_APP_ID": f"prism-{name}",
                       **(broker_env if broker_env is not None else {"PRISM_EMBEDDED": "1"}), **(extra_env or {})}
            data_dir.mkdir(parents=True, exist_ok=True)
            procs.append(spawn(cmd, self.version.root, env, log_dir / f"{name}-{i}.log"))
        return procs


async def wait_ready(ready: Path, procs: list[subprocess.Popen[bytes]], failure: str, timeout: float = 120.0) -> None:
    """Wait for a worker's ready file (`READY_FILE_ENV`); `failure` is raised if the first process
    exits first or `timeout` seconds pass."""
    deadline = time.monotonic() + timeout
    while not ready.exists():
        if time.monotonic() > deadline or procs[0].poll() is not None:
            raise RuntimeError(failure)
        await asyncio.sleep(0.1)


def stop(procs: list[subprocess.Popen[bytes]], timeout: float = 30.0) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for p in procs:
        try:
            p.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


async def read_from_start(bootstrap: str, topic: str) -> AIOKafkaConsumer:
    """A started consumer on every partition of `topic` from its first record, outside any group
    (a checker must not take partitions from the contender's group)."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                                fetch_max_wait_ms=20)  # Tansu answers long polls late (app/worker/offsets.py)
    await consumer.start()
    tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
    consumer.assign(tps)
    await consumer.seek_to_beginning(*tps)
    return consumer


def prism_identity(value: bytes) -> str:
    """Which input a Prism `.v3` output came from: the envelope's correlation id, set per input
    by `bench_pipeline.make_messages` and carried through the pipeline."""
    from app.envelope import decode

    return decode(value).header.metadata.correlation_id


async def read_back(bootstrap: str, topic: str, identity: Callable[[bytes], str], expected: set[str],
                    idle_s: float = 3.0, timeout_s: float = 120.0) -> dict[str, int]:
    """Every record of `topic`, identified: how many inputs are missing and how many came out more
    than once. Reads until the topic has been quiet for `idle_s` (the embedded broker's high
    watermarks are wrong, see app/worker/offsets.py, so "the end" is a quiet topic)."""
    consumer = await read_from_start(bootstrap, topic)
    seen: Counter[str] = Counter()
    quiet_since, t0 = time.monotonic(), time.monotonic()
    try:
        while time.monotonic() - quiet_since < idle_s and time.monotonic() - t0 < timeout_s:
            batch = await consumer.getmany(timeout_ms=200, max_records=5000)
            if any(batch.values()):
                quiet_since = time.monotonic()
            for records in batch.values():
                seen.update(identity(r.value or b"") for r in records)
    finally:
        await consumer.stop()
    return {"records": sum(seen.values()), "missing": len(expected - seen.keys()),
            "duplicates": sum(c - 1 for c in seen.values() if c > 1), "unexpected": len(seen.keys() - expected)}


async def measure(bootstrap: str, out_topic: str, n: int, procs: list[subprocess.Popen[bytes]],
                  broker_pid: int | None = None, timeout_s: float = 900.0) -> dict[str, float]:
    """Count `out_topic`'s records until `n`; the 10 %..90 % window's rate and CPU per message."""
    consumer = await read_from_start(bootstrap, out_topic)
    pids = [p.pid for p in procs]
    count, marks = 0, {}
    t_start = time.monotonic()
    try:
        while count < n:
            if time.monotonic() - t_start > timeout_s:
                raise TimeoutError(f"{out_topic}: {count} of {n} outputs after {timeout_s:.0f}s")
            if any(p.poll() not in (None, 0) for p in procs):
                raise RuntimeError(f"a contender process exited with {[p.poll() for p in procs]} "
                                   f"({count} of {n} outputs on {out_topic}); see its log")
            batch = await consumer.getmany(timeout_ms=100)
            count += sum(len(rs) for rs in batch.values())
            now = time.perf_counter()
            for mark in (0.1, 0.9):
                if mark not in marks and count >= mark * n:
                    marks[mark] = (now, cpu_seconds(pids), count, cpu_seconds([broker_pid] if broker_pid else []),
                                   thread_cpu_seconds(pids))
    finally:
        await consumer.stop()
    (t10, c10, k10, b10, (m10, o10)), (t90, c90, k90, b90, (m90, o90)) = marks[0.1], marks[0.9]
    k = max(k90 - k10, 1)
    return {"msgs_per_s": k / max(t90 - t10, 1e-9), "cpu_us_per_msg": (c90 - c10) / k * 1e6,
            "main_thread_cpu_us_per_msg": (m90 - m10) / k * 1e6, "other_threads_cpu_us_per_msg": (o90 - o10) / k * 1e6,
            "broker_cpu_us_per_msg": (b90 - b10) / k * 1e6, "window_msgs": k, "outputs": count}


async def create_topics(broker: BenchBroker, version: Version, topology: Path, topic: str) -> None:
    """The contender's topics. On Kafka this tree's worker gets them as `prism run` creates them
    (the topology's topics and configs); the release's topology is not read with this tree's
    loader, and the embedded broker keeps the plain declaration it always had."""
    from app.broker.admin import ensure_topics

    if broker.kind == "kafka" and version.root == ROOT:
        from app.topology import load_topology

        topo = load_topology(topology)
        await ensure_topics(broker.bootstrap, topo.topics(), configs=topo.topic_configs())
        return
    await ensure_topics(broker.bootstrap, {t: PARTITIONS for t in (topic, f"{topic}.v2", f"{topic}.v3", f"{topic}.dlq")})


async def run_one(c: Contender, broker: BenchBroker, tmp: Path, keys: Any, n: int) -> dict[str, Any]:
    from bench.bench_pipeline import make_messages, preload

    bootstrap = broker.bootstrap
    name = f"rel-{c.label}-{uuid.uuid4().hex[:6]}"
    topic = f"bench.rel.{uuid.uuid4().hex[:8]}"
    topology = bench_topology(c.version, tmp, keys, topic, name)
    await create_topics(broker, c.version, topology, topic)
    await preload(bootstrap, topic, make_messages(keys, topic, n, scope=signature_scope(c.version)))
    load_before = os.getloadavg()[0]
    procs = c.start(topology, bootstrap, name, tmp / name, n, tmp / "logs", broker_env=broker.worker_env)
    try:
        out = await measure(bootstrap, f"{topic}.v3", n, procs, broker.pid)
        if c.plain:  # it exits by itself after n inputs, once it has written its stage figures
            deadline = time.monotonic() + 30
            while procs[0].poll() is None and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
    finally:
        stop(procs)
    out["load_1m"] = round((load_before + os.getloadavg()[0]) / 2, 2)
    if c.version.root == ROOT and not c.plain:
        # exactly once? every input's `.v3` copy, counted by correlation id (after the CPU window)
        out["outputs"] = await read_back(bootstrap, f"{topic}.v3", prism_identity, {f"c-{i}" for i in range(n)})
    out["source_topic"] = topic  # what a caller checks the outputs of (bench_peers)
    stats = tmp / name / "plain-stats.json"
    if c.plain and stats.exists():
        out["stage_cpu_us_per_message"] = json.loads(stats.read_text())["stage_cpu_us_per_message"]
    return out


async def latency(broker: BenchBroker, tmp: Path, keys: Any, versions: list[Version], rate: float,
                  n: int, *, trace: bool = False, warmup_s: float = 0.0) -> dict[str, Any]:
    """End-to-end p50/p99 at `rate` msg/s: a raw passthrough loop, then a worker of each version
    (one after the other, each on its own fresh topics); added = worker - raw loop. `trace`:
    this tree's worker runs with `bench/_latency_trace.py`, and its per-step latencies are
    added to its result (``steps``). `warmup_s`: the first `rate` x `warmup_s` messages of every
    run (raw loop and workers alike) are sent and read back but not counted
    (bench/_latency_client.py says why)."""
    from app.broker.admin import ensure_topics
    from app.worker.faust_app import READY_FILE_ENV
    from bench._latency_trace import TRACE_ENV
    from bench.bench_pipeline import run_raw

    bootstrap = broker.bootstrap

    async def client(topic: str, out_topic: str, version: Version | None = None) -> dict[str, float]:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "bench._latency_client", bootstrap, topic, out_topic, str(rate), str(n),
            str(keys.folder), str(signature_scope(version)), str(warmup_s), stdout=asyncio.subprocess.PIPE,
            cwd=str(ROOT))
        out, _ = await asyncio.wait_for(proc.communicate(), 600)
        return dict(json.loads(out.decode().strip().splitlines()[-1]))

    raw_topic = f"bench.latraw.{uuid.uuid4().hex[:6]}"
    await ensure_topics(bootstrap, {raw_topic: PARTITIONS, raw_topic + ".raw-out": PARTITIONS})
    task = asyncio.create_task(run_raw(bootstrap, raw_topic, n + int(rate * warmup_s)))
    await asyncio.sleep(0.5)
    raw = await client(raw_topic, raw_topic + ".raw-out")
    await task
    out: dict[str, Any] = {"rate_msgs_per_s": rate, "warmup_s": warmup_s, "raw": raw}
    for version in versions:
        name = f"lat-{uuid.uuid4().hex[:6]}"
        topic = f"bench.lat.{uuid.uuid4().hex[:6]}"
        topology = bench_topology(version, tmp, keys, topic, name)
        await ensure_topics(bootstrap, {t: PARTITIONS for t in (topic, f"{topic}.v2", f"{topic}.v3", f"{topic}.dlq")})
        ready = tmp / f"{name}.ready"
        traced = trace and version.root == ROOT
        steps = tmp / f"{name}.steps.json"
        extra = {READY_FILE_ENV: str(ready)}
        if traced:  # the trace's own knobs (PRISM_TRACE_*) pass through to the traced worker
            extra.update({TRACE_ENV: str(steps), **{k: v for k, v in os.environ.items() if k.startswith("PRISM_TRACE_")}})
        procs = Contender(version.label, version).start(topology, bootstrap, name, tmp / name, n, tmp / "logs",
                                                        extra_env=extra, broker_env=broker.worker_env,
                                                        target=TRACED_TARGET if traced else WORKER_TARGET)
        try:
            await wait_ready(ready, procs, f"the latency worker did not get ready; see {tmp / 'logs'}")
            cpu0 = cpu_seconds([p.pid for p in procs])
            res = await client(topic, f"{topic}.v3", version)
            # the worker's CPU while it carried the offered rate: how busy it was, per message it
            # carried - the warm-up's records included (they were divided by N alone until
            # 2026-11-30: with a 1 s warm-up at 4,879 msg/s and N = 20,000 that overstated it 1.24x)
            carried = res.get("messages", n)
            res["worker_cpu_us_per_msg"] = (cpu_seconds([p.pid for p in procs]) - cpu0) / carried * 1e6
        finally:
            stop(procs)
        if traced and steps.exists():
            res["steps"] = json.loads(steps.read_text())
        res["load_1m"] = round(os.getloadavg()[0], 2)
        res["added_p50_ms"], res["added_p99_ms"] = res["p50_ms"] - raw["p50_ms"], res["p99_ms"] - raw["p99_ms"]
        out[version.label] = res
        print(f"latency at {rate:.0f} msg/s: {version.label} p50 {res['p50_ms']:.0f} ms / p99 {res['p99_ms']:.0f} ms, "
              f"raw loop {raw['p50_ms']:.0f} / {raw['p99_ms']:.0f} (load {res['load_1m']})", flush=True)
    return out


def latency_medians(runs: list[dict[str, Any]], versions: list[Version]) -> dict[str, Any]:
    """Several latency rounds: per version the median of each figure (added ms are per round, each
    against that round's own raw loop), and every round as measured."""
    keys = ("p50_ms", "p99_ms", "added_p50_ms", "added_p99_ms", "worker_cpu_us_per_msg", "load_1m")
    out: dict[str, Any] = {"rate_msgs_per_s": runs[0]["rate_msgs_per_s"], "rounds": runs,
                           "raw": {k: statistics.median(r["raw"][k] for r in runs) for k in ("p50_ms", "p99_ms")}}
    for v in versions:
        out[v.label] = {k: statistics.median(r[v.label][k] for r in runs) for k in keys}
    return out


def round_medians(rounds: list[dict[str, Any]], labels: list[str], keys: tuple[str, ...]) -> dict[str, Any]:
    """Per contender, the median over rounds of each figure in `keys`."""
    return {label: {k: statistics.median(r[label][k] for r in rounds) for k in keys} for label in labels}


def _median_round(rounds: list[dict[str, Any]], a: str, b: str, key: str) -> float | None:
    vals = [r[a][key] / r[b][key] for r in rounds if a in r and b in r and r[b][key]]
    return statistics.median(vals) if vals else None


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    from app.security.devkeys import ensure_dev_keys
    from bench.bench_pipeline import signing_floor

    head = head_version()
    contenders = [Contender("head", head)]
    if not args.no_release:
        contenders.insert(0, Contender("release", release_version(args.baseline, args.cache, fresh=args.fresh,
                                                                  python=args.baseline_python)))
    contenders.append(Contender("plain", head, plain=True))
    if args.scale:
        contenders.append(Contender("head-2p", head, processes=2))
    tmp = Path(tempfile.mkdtemp(prefix="prism-bench-release-"))
    (tmp / "logs").mkdir()
    keys = ensure_dev_keys(tmp / "keys")
    result: dict[str, Any] = {"n": args.n, "baseline": args.baseline, "partitions": PARTITIONS,
                              "payload": "1 KB JSON, signed (Ed25519), with JWT", "rounds": []}
    try:
        async with bench_broker(args.broker, tmp) as broker:
            result["broker"] = describe(broker)
            for r in range(0 if args.latency_rate else args.rounds):
                one: dict[str, Any] = {}
                order = contenders[r % len(contenders):] + contenders[:r % len(contenders)]
                for c in order:
                    one[c.label] = res = await run_one(c, broker, tmp, keys, args.n)
                    print(f"[round {r + 1}/{args.rounds}] {c.label}: {res['msgs_per_s']:.0f} msg/s, "
                          f"{res['cpu_us_per_msg']:.0f} us CPU/msg (main thread {res['main_thread_cpu_us_per_msg']:.0f}, "
                          f"other threads {res['other_threads_cpu_us_per_msg']:.0f}), broker {res['broker_cpu_us_per_msg']:.0f} us/msg "
                          f"(load {res['load_1m']})", flush=True)
                result["rounds"].append(one)
            rounds = result["rounds"]
            if rounds:  # not with --latency-rate alone
                result["ratios"] = {
                    "head_vs_release_msgs": _median_round(rounds, "head", "release", "msgs_per_s"),
                    "head_vs_release_cpu": _median_round(rounds, "head", "release", "cpu_us_per_msg"),
                    "head_vs_plain_cpu": _median_round(rounds, "head", "plain", "cpu_us_per_msg"),
                    "head2p_vs_head_msgs": _median_round(rounds, "head-2p", "head", "msgs_per_s"),
                    "head2p_vs_head_cpu": _median_round(rounds, "head-2p", "head", "cpu_us_per_msg"),
                }
                result["medians"] = round_medians(rounds, [c.label for c in contenders],
                                                  ("msgs_per_s", "cpu_us_per_msg", "main_thread_cpu_us_per_msg",
                                                   "other_threads_cpu_us_per_msg", "broker_cpu_us_per_msg"))
                floor = signing_floor(tmp / "keys")
                result["signatures_cpu_us_per_msg"] = floor["signatures_cpu_us_per_msg"]
                plain_stages = [r["plain"].get("stage_cpu_us_per_message", {}) for r in rounds]
                if plain_stages and all(plain_stages):
                    stages = {k: statistics.median(s.get(k, 0.0) for s in plain_stages) for k in plain_stages[0]}
                    med = result["medians"]
                    stage_sum = sum(stages.values())
                    result["breakdown_us_per_msg"] = {
                        "stages_without_signatures": stage_sum - floor["signatures_cpu_us_per_msg"],
                        "signatures": floor["signatures_cpu_us_per_msg"],
                        "consume_and_sends (plain loop minus stages)": med["plain"]["cpu_us_per_msg"] - stage_sum,
                        "framework (worker minus plain loop)": med["head"]["cpu_us_per_msg"] - med["plain"]["cpu_us_per_msg"],
                        "worker total": med["head"]["cpu_us_per_msg"],
                    }
                    result["plain_stage_cpu_us_per_message"] = stages
            if args.latency or args.latency_rate:
                rate = args.latency_rate or result["medians"]["head"]["msgs_per_s"] / 2
                versions = [c.version for c in contenders if c.label in ("head", "release")]
                runs = []
                for r in range(args.latency_rounds):
                    # alternate which version runs first: a load swing on a shared machine hits both alike
                    order = versions if r % 2 == 0 else versions[::-1]
                    runs.append(await latency(broker, tmp, keys, order, rate, min(args.n, max(500, int(rate * 15))),
                                              trace=args.trace, warmup_s=args.latency_warmup))
                result["latency_half_max"] = runs[0] if len(runs) == 1 else latency_medians(runs, versions)
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            print(f"kept {tmp}")
    report(result, args.json)
    return result


def report(result: dict[str, Any], path: Path | None) -> None:
    """Print the summary (everything but the per-round figures); write all of it to `path`."""
    print(json.dumps({k: v for k, v in result.items() if k != "rounds"}, indent=2))
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=2))


def backlog_args(ap: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """The options of every backlog benchmark (this one, bench_peers) added, `argv` parsed,
    `--quick` applied: the same backlog size and rounds mean the same thing in each."""
    ap.add_argument("--n", type=int, default=20_000, help="backlog messages per contender run")
    ap.add_argument("--broker", choices=BROKERS, default="embedded",
                    help="the embedded broker (Tansu), or one Apache Kafka node (bench/_brokers.py)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="1 round of 4,000 messages: checks the harness end to end")
    ap.add_argument("--keep", action="store_true", help="keep the temporary folder (logs, topologies)")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.quick:
        args.n, args.rounds = 4_000, 1
    return args


def run_on_uvloop(main_async: Callable[[argparse.Namespace], Awaitable[Any]], args: argparse.Namespace) -> int:
    """Run the benchmark on uvloop, as the worker runs: the checker shares the cores with it."""
    from app.worker.faust_app import use_uvloop

    use_uvloop()
    asyncio.run(main_async(args))
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--baseline", default=DEFAULT_BASELINE, help="the release to compare against (a git revision)")
    ap.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "prism-bench-release",
                    help="where the baseline's export and venv are kept between runs")
    ap.add_argument("--fresh", action="store_true", help="rebuild the baseline's export and venv")
    ap.add_argument("--no-release", action="store_true", help="skip the release contender")
    ap.add_argument("--baseline-python", type=Path, default=None,
                    help="run the baseline's export with this interpreter, no venv of its own (before/after "
                         "of a recent change: same dependencies)")
    ap.add_argument("--scale", action="store_true", help="also run this tree with 2 worker processes")
    ap.add_argument("--latency", action="store_true", help="added latency at half of head's rate vs a raw loop")
    ap.add_argument("--latency-rate", type=float, default=None,
                    help="only the latency phase, at this rate (msg/s): no backlog rounds (compare changes at one rate)")
    ap.add_argument("--latency-rounds", type=int, default=1,
                    help="latency phase rounds (each with its own raw loop; versions' order alternates): medians")
    ap.add_argument("--latency-warmup", type=float, default=0.0,
                    help="seconds of traffic at the offered rate sent first and not counted, in every latency run "
                         "(default 0: count from the first message, the method of the recorded figures)")
    ap.add_argument("--trace", action="store_true",
                    help="latency phase: where this tree's worker spends each message's time (bench/_latency_trace.py)")
    return run_on_uvloop(main_async, backlog_args(ap, argv))


if __name__ == "__main__":
    raise SystemExit(main())

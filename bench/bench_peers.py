"""Peers side by side (issue 14): Prism's worker against the Python stream processors a user
would otherwise pick, on the same embedded broker and the same backlog size, in interleaved
rounds.

    .venv/bin/python -m bench.bench_peers --quick                                  # harness check
    .venv/bin/python -m bench.bench_peers --n 20000 --rounds 3 --json bench/results/peers.json

Contenders, each its own process, started fresh for every run on fresh topics and a fresh group:

* ``prism`` - the worker ``prism run`` runs, on the shipped ``topologies/orders-created.yaml``,
  started and measured exactly as ``bench_release`` runs ``head`` (``bench_release.run_one``):
  signed reviewed envelopes (1 KB JSON payload, JWT, Ed25519) in, two re-signed layouts out;
* ``faust-tuned`` - a stock faust-streaming agent (``take_events`` + gathered sends, uvloop,
  5 ms linger, 256 KiB batches, 4 MiB fetches, root logger back at WARNING);
* ``quix`` - Quix Streams, ``app.dataframe(src).apply(transform).to_topic(dst)``;
* ``aiokafka`` - a raw aiokafka getmany -> send loop on uvloop, commit every second;
* ``confluent`` - a raw confluent-kafka (librdkafka) consume -> produce loop, commit every second;
* ``connect`` (``--broker kafka`` only) - Apache Kafka Connect: one distributed worker (its own JVM,
  ``tests/kafka/connect.py``) running a topic-to-topic connector with one task
  (``bench/connect_plugin/TopicSourceConnector.java``, compiled here with ``javac``: it reads the
  source topic like MirrorMaker 2's MirrorSourceTask and parses each value with Connect's
  JsonConverter), the single-message-transform chain ``InsertField$Value`` (a static field) +
  ``ReplaceField$Value`` (a field renamed) on the parsed document, and the worker's JsonConverter
  (``schemas.enable=false``) serializing it again - JSON parse, change, serialize, as the peers do.
  Why not MirrorMaker 2 itself: connect-mirror is not on Maven Central for Kafka 4.4.0, and its
  task hands records to the transforms as opaque bytes, which no stock transform parses. Connect's
  producer gets the peers' 5 ms linger and 256 KiB batches; the rest is Connect's defaults
  (positions flushed every second, as the raw loops commit).

``--broker kafka`` runs all of it on one Apache Kafka node instead of the embedded broker
(``bench/_brokers.py``); the prism contender then starts as ``prism run`` starts a worker on a
cluster (``bench_release.run_one``).

The peers (``bench/_peer_procs.py``) all call one function on every record: json.loads the
document, bump a field, json.dumps. Their input is the natural one for them, JSON: the very
1 KB document Prism finds inside each envelope (``bench_pipeline.payload_1kb``), under the same
keys. Prism does far more per message - envelope decode, JWT, signature verify, policy, dedup
table with changelog, enrich, two re-signed layouts, DLQ routing - so this is not a race on
equal work; it shows where Prism stands against what a user would run instead.

Quix Streams is not a Prism dependency and cannot share Prism's venv (it pins an older
confluent-kafka than Prism's test dependencies): the script builds a venv of its own for it,
once, in the cache folder (``--cache``), with ``QUIX_REQUIREMENT``. The other peers use
packages already in Prism's venv (faust-streaming, aiokafka, uvloop; confluent-kafka from the
dev extra).

Measure (``bench_release.measure``): a checker in this process counts the output records; the
steady rate is the records between the 10 % and 90 % marks over the time between them, CPU per
message is the contender process's utime + stime (every thread; none of the contenders starts
child processes) over the same window, and the broker's likewise. After the run, every output
record is read back and identified (Prism: the correlation id of the decoded envelope; peers:
the document's ``order_id``) to count missing and duplicated inputs. The load average of each
run is recorded: the machine is shared.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench._brokers import BenchBroker, bench_broker, describe
from bench._peer_procs import transform
from bench._timing import per_call_us
from bench.bench_pipeline import PAYLOADS, use_payload
from bench.bench_release import (
    PARTITIONS,
    ROOT,
    Contender,
    backlog_args,
    contender_env,
    head_version,
    measure,
    prism_identity,
    read_back,
    report,
    round_medians,
    run_on_uvloop,
    run_one,
    spawn,
    stop,
)

#: Quix Streams, pinned: the version its figures are for. Installed into a venv of its own.
QUIX_REQUIREMENT = "quixstreams==3.28.1"
CONTENDERS = ("prism", "faust-tuned", "quix", "aiokafka", "confluent", "connect")
#: Contenders that need a broker other than the embedded one (Kafka Connect needs Apache Kafka).
KAFKA_ONLY = ("connect",)
CONNECT_PLUGIN_SOURCE = ROOT / "bench" / "connect_plugin" / "TopicSourceConnector.java"
CONNECT_CONNECTOR = "prism.bench.TopicSourceConnector"


def quix_python(cache: Path, *, fresh: bool = False) -> Path:
    """The interpreter of a venv with Quix Streams (built once in `cache`, then reused)."""
    folder = cache / ("venv-" + QUIX_REQUIREMENT.replace("==", "-"))
    stamp = folder / ".installed"
    if fresh and folder.exists():
        shutil.rmtree(folder)
    if not stamp.exists():
        if folder.exists():
            shutil.rmtree(folder)  # a half-built venv from an interrupted run
        print(f"building a venv with {QUIX_REQUIREMENT} in {folder} (once; reused by later runs)", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(folder)], check=True)
        pip = subprocess.run([str(folder / "bin" / "python"), "-m", "pip", "install", "-q", QUIX_REQUIREMENT],
                             capture_output=True, text=True)
        if pip.returncode != 0:
            raise SystemExit(f"installing {QUIX_REQUIREMENT} failed:\n{pip.stdout}{pip.stderr}")
        stamp.touch()
    return folder / "bin" / "python"


def peer_value(i: int) -> bytes:
    """Input `i` of the peers: the JSON document that is the payload of Prism's input `i`."""
    from bench.bench_pipeline import payload_1kb

    return json.dumps(payload_1kb(i), separators=(",", ":")).encode()


def peer_identity(value: bytes) -> str:
    """Which input a peer's output came from (its document's order id)."""
    return str(json.loads(value)["order_id"])


def expected_identities(n: int) -> tuple[set[str], set[str]]:
    """The identities of inputs 0..n-1: (Prism's correlation ids, the peers' order ids)."""
    from bench.bench_pipeline import payload_1kb

    return {f"c-{i}" for i in range(n)}, {payload_1kb(i)["order_id"] for i in range(n)}


@dataclass(frozen=True)
class Peer:
    """A peer contender: which interpreter runs `bench._peer_procs` for it."""

    label: str
    python: Path

    def start(self, bootstrap: str, src: str, dst: str, group: str, state_dir: Path,
              log_dir: Path) -> list[subprocess.Popen[bytes]]:
        state_dir.mkdir(parents=True, exist_ok=True)
        cmd = [str(self.python), "-m", "bench._peer_procs", self.label, bootstrap, src, dst, group, str(state_dir)]
        return [spawn(cmd, ROOT, contender_env(), log_dir / f"{group}.log")]


async def _peer_topics(bootstrap: str, n: int) -> tuple[str, str]:
    """Fresh source and output topics, the backlog written to the source (the keys Prism's inputs get, too)."""
    from app.broker.admin import ensure_topics
    from bench.bench_pipeline import preload

    src = f"bench.peer.{uuid.uuid4().hex[:8]}"
    dst = f"{src}.out"
    await ensure_topics(bootstrap, {src: PARTITIONS, dst: PARTITIONS})
    await preload(bootstrap, src, [peer_value(i) for i in range(n)])
    return src, dst


async def run_peer(peer: Peer, broker: BenchBroker, tmp: Path, n: int) -> dict[str, Any]:
    """One run of a peer: fresh topics and group, the backlog written before it starts, measured
    like Prism's worker (`bench_release.measure`), then stopped and its output read back."""
    group = f"peer-{peer.label}-{uuid.uuid4().hex[:6]}"
    src, dst = await _peer_topics(broker.bootstrap, n)
    load_before = os.getloadavg()[0]
    procs = peer.start(broker.bootstrap, src, dst, group, tmp / group, tmp / "logs")
    try:
        out = await measure(broker.bootstrap, dst, n, procs, broker.pid)
    finally:
        stop(procs)
    out["load_1m"] = round((load_before + os.getloadavg()[0]) / 2, 2)
    out["output_topic"] = dst
    return out


@dataclass(frozen=True)
class ConnectSetup:
    """Kafka Connect's classpath and the compiled benchmark connector (built once per benchmark run)."""

    libs: Path
    plugin: Path
    version: str


def connect_setup(tmp: Path) -> ConnectSetup:
    """Fetch Connect's jars (`scripts/fetch-kafka.sh --connect`) and compile the benchmark connector."""
    from tests.kafka.cluster import DEFAULT_VERSION
    from tests.kafka.connect import compile_plugin, fetch_connect

    libs = fetch_connect()
    return ConnectSetup(libs, compile_plugin(libs, tmp / "connect-plugin", CONNECT_PLUGIN_SOURCE), DEFAULT_VERSION)


def connect_config(bootstrap: str, src: str, dst: str) -> dict[str, str]:
    """The connector: `src` -> `dst`, JSON parsed, two stock SMTs, JSON serialized."""
    from bench._peer_procs import BATCH_BYTES, FETCH_BYTES, LINGER_MS, MAX_RECORDS

    return {
        "connector.class": CONNECT_CONNECTOR, "tasks.max": "1",
        "source.topic": src, "target.topic": dst, "source.bootstrap.servers": bootstrap,
        "max.poll.records": str(MAX_RECORDS), "max.partition.fetch.bytes": str(FETCH_BYTES),
        "key.converter": "org.apache.kafka.connect.converters.ByteArrayConverter",
        "value.converter": "org.apache.kafka.connect.json.JsonConverter",
        "value.converter.schemas.enable": "false",
        "transforms": "stamp,rename",
        "transforms.stamp.type": "org.apache.kafka.connect.transforms.InsertField$Value",
        "transforms.stamp.static.field": "processed_by",
        "transforms.stamp.static.value": "kafka-connect",
        "transforms.rename.type": "org.apache.kafka.connect.transforms.ReplaceField$Value",
        # one field of the document renamed (`customer` in the historical payload, `customer_id`
        # in the schema-valid one: bench_pipeline.PAYLOADS)
        "transforms.rename.renames": "customer:customer_id,customer_id:customer",
        "producer.override.linger.ms": str(LINGER_MS), "producer.override.batch.size": str(BATCH_BYTES),
    }


async def run_connect(setup: ConnectSetup, broker: BenchBroker, tmp: Path, n: int) -> dict[str, Any]:
    """One run of Kafka Connect: a fresh worker JVM (own group and storage topics) started before the
    connector is created, so its start-up is outside the window; measured like the peers, with
    the Connect JVM as the contender process."""
    import asyncio

    from bench._brokers import BENCH_JVM_ARGS
    from tests.kafka.connect import ConnectWorker

    src, dst = await _peer_topics(broker.bootstrap, n)
    name = f"peer-connect-{uuid.uuid4().hex[:6]}"
    worker = ConnectWorker(setup.libs, tmp / name, broker.bootstrap, plugin=setup.plugin, heap="512m",
                           extra_jvm_args=BENCH_JVM_ARGS, start_timeout=180.0)
    worker.start()  # from the main thread: the JVM's parent-death signal follows the starting thread
    assert worker.process is not None
    load_before = os.getloadavg()[0]
    try:
        status, body = worker.request("PUT", f"/connectors/{name}/config", connect_config(broker.bootstrap, src, dst))
        if status not in (200, 201):
            raise RuntimeError(f"creating the connector failed: {status} {body}")
        counting = asyncio.create_task(measure(broker.bootstrap, dst, n, [worker.process], broker.pid))
        try:  # a task that fails does not end the JVM: watch its state while the outputs are counted
            await asyncio.to_thread(worker.wait_state, name, "RUNNING", timeout=120.0)
        except BaseException:
            counting.cancel()
            raise
        out = await counting
    finally:
        worker.stop()
    out["load_1m"] = round((load_before + os.getloadavg()[0]) / 2, 2)
    out["output_topic"] = dst
    return out


def _package_versions(python: Path, names: list[str]) -> dict[str, str]:
    code = ("import importlib.metadata as m, json, sys\n"
            "v = {}\n"
            "for n in sys.argv[1:]:\n"
            "    try: v[n] = m.version(n)\n"
            "    except m.PackageNotFoundError: pass\n"
            "print(json.dumps(v))")
    out = subprocess.run([str(python), "-c", code, *names], check=True, capture_output=True, text=True).stdout
    return dict(json.loads(out))


def confluent_available() -> bool:
    try:
        import confluent_kafka  # noqa: F401
    except ImportError:
        return False
    return True


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    from app.security.devkeys import ensure_dev_keys

    labels = [c for c in args.contenders.split(",") if c]
    unknown = set(labels) - set(CONTENDERS)
    if unknown:
        raise SystemExit(f"unknown contenders {sorted(unknown)}; choose from {', '.join(CONTENDERS)}")
    if "confluent" in labels and not confluent_available():
        print("confluent-kafka is not installed in this venv: skipping the confluent contender", flush=True)
        labels.remove("confluent")
    if args.broker == "embedded" and any(label in KAFKA_ONLY for label in labels):
        print(f"{', '.join(KAFKA_ONLY)}: Apache Kafka only (--broker kafka); skipped on the embedded broker", flush=True)
        labels = [label for label in labels if label not in KAFKA_ONLY]
    here = Path(sys.executable)
    pythons = {label: here for label in labels if label != "connect"}
    if "quix" in labels:
        pythons["quix"] = quix_python(args.cache, fresh=args.fresh)
    prism = Contender("prism", head_version())
    tmp = Path(tempfile.mkdtemp(prefix="prism-bench-peers-"))
    (tmp / "logs").mkdir()
    keys = ensure_dev_keys(tmp / "keys")
    use_payload(args.payload)
    expect_prism, expect_peer = expected_identities(args.n)
    result: dict[str, Any] = {
        "n": args.n, "partitions": PARTITIONS, "contenders": labels,
        "payload": {"prism": "signed reviewed envelope (Ed25519) with JWT around a 1 KB JSON document",
                    "peers": "the same 1 KB JSON document, bare", "document": args.payload},
        "versions": {"prism venv": _package_versions(here, ["faust-streaming", "aiokafka", "uvloop",
                                                              "confluent-kafka"]),
                     **({"quix venv": _package_versions(pythons["quix"], ["quixstreams", "confluent-kafka"])}
                        if "quix" in labels else {})},
        "rounds": []}
    try:
        setup = connect_setup(tmp) if "connect" in labels else None
        if setup is not None:
            result["versions"]["kafka connect"] = setup.version
        async with bench_broker(args.broker, tmp) as broker:
            result["broker"] = describe(broker)
            for r in range(args.rounds):
                one: dict[str, Any] = {}
                shift = r % len(labels)
                for label in labels[shift:] + labels[:shift]:
                    if label == "prism":
                        res = await run_one(prism, broker, tmp, keys, args.n)
                        res["check"] = await read_back(broker.bootstrap, f"{res['source_topic']}.v3",
                                                       prism_identity, expect_prism)
                    else:
                        if label == "connect":
                            assert setup is not None
                            res = await run_connect(setup, broker, tmp, args.n)
                        else:
                            res = await run_peer(Peer(label, pythons[label]), broker, tmp, args.n)
                        res["check"] = await read_back(broker.bootstrap, res["output_topic"], peer_identity,
                                                       expect_peer)
                    one[label] = res
                    chk = res["check"]
                    print(f"[round {r + 1}/{args.rounds}] {label}: {res['msgs_per_s']:.0f} msg/s, "
                          f"{res['cpu_us_per_msg']:.0f} us CPU/msg, broker {res['broker_cpu_us_per_msg']:.0f} us/msg, "
                          f"missing {chk['missing']}, duplicates {chk['duplicates']} (load {res['load_1m']})",
                          flush=True)
                result["rounds"].append(one)
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            print(f"kept {tmp}")
    rounds = result["rounds"]
    result["medians"] = round_medians(rounds, labels,
                                      ("msgs_per_s", "cpu_us_per_msg", "broker_cpu_us_per_msg", "load_1m"))
    for label in labels:
        result["medians"][label]["missing_total"] = sum(r[label]["check"]["missing"] for r in rounds)
        result["medians"][label]["duplicates_total"] = sum(r[label]["check"]["duplicates"] for r in rounds)
    if "prism" in labels:  # within-round ratios, median over rounds: load swings hit both alike
        result["prism_vs_peer"] = {
            label: {"msgs_per_s": statistics.median(r["prism"]["msgs_per_s"] / r[label]["msgs_per_s"] for r in rounds),
                    "cpu_us_per_msg": statistics.median(r["prism"]["cpu_us_per_msg"] / r[label]["cpu_us_per_msg"]
                                                        for r in rounds)}
            for label in labels if label != "prism"}
    # What the shared transform alone costs, so a reader can subtract it from the peers' CPU per
    # message and see their framework's share (wall time of one call, best-of-N median).
    sample = peer_value(0)
    result["transform_us_per_call"] = per_call_us(lambda: transform(sample))
    report(result, args.json)
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--contenders", default=",".join(CONTENDERS), help="comma-separated, from: " + ", ".join(CONTENDERS))
    ap.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "prism-bench-peers",
                    help="where the Quix Streams venv is kept between runs")
    ap.add_argument("--fresh", action="store_true", help="rebuild the Quix Streams venv")
    ap.add_argument("--payload", choices=sorted(PAYLOADS), default="valid",
                    help="valid: a document matching the shipped topology's schema (what production sends); "
                         "bench: the historical one, which takes validation's warn path in Prism")
    return run_on_uvloop(main_async, backlog_args(ap, argv))


if __name__ == "__main__":
    raise SystemExit(main())

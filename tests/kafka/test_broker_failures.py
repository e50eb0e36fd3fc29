"""Broker failures under load, on a three-node Apache Kafka cluster (RF 3, min.insync.replicas 2).

Why: a worker on a real cluster must survive what clusters do - a broker dying with the leadership
of the very partitions the worker reads and writes, and a rolling restart of every broker - without
losing an input that a producer was told is stored. These tests run a worker subprocess exactly
as ``prism run`` runs one against a cluster (``PRISM_BROKER_URL``, so none of the embedded broker's
workarounds; ``PRISM_REPLICATION_FACTOR=3`` so its table changelogs are replicated too) over a
backlog plus a live ``acks=all`` producer, and then re-read everything with an independent client
(librdkafka, tests/worker/independent.py):

* every input the producer was told succeeded is on ``.v3`` or the DLQ (0 lost);
* the duplicates (at-least-once: a batch whose writes were retried may be written twice) and the
  pause (the longest time the worker's ``.v3`` write counter did not move while inputs waited)
  are measured and printed in one line per scenario, so CI output shows them;
* ``/readyz`` says what happened while writes waited (app/worker/kafka_health.py) and is 200 again
  afterwards.

And a smoke run of the worker on the last 3.x Kafka (3.9.x), which is still widely deployed.
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from app.agents.dlq import error_context
from app.broker.admin import ensure_topics
from app.envelope import encode, new_envelope
from app.security.devkeys import DevKeys, ensure_dev_keys
from app.topology import Topology
from app.worker.faust_app import WorkerProcess
from tests.kafka.cluster import LEGACY_VERSION, ApacheKafka
from tests.kafka.fixtures import KafkaFactory, require_kafka_libs
from tests.worker import independent
from tests.worker.conftest import make_topology

PARTITIONS = 2
BACKLOG = 4_000
#: the live producer's rate (inputs/s): low enough for a busy 2-core machine to keep up with
LIVE_RATE = 250


@pytest.fixture(scope="module")
def dev_keys(tmp_path_factory: pytest.TempPathFactory) -> DevKeys:
    return ensure_dev_keys(tmp_path_factory.mktemp("dev-keys"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=3) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def _value(i: int, topic: str, valid: bool = True) -> tuple[bytes, list[tuple[str, bytes]]]:
    """A valid envelope, or (``valid=False``) one cut in half: DLQ ``bad_prism_envelope``."""
    good = encode(new_envelope(topic, {"i": i}, namespace="order-events"))
    if valid:
        return good, []
    return good[: len(good) // 2], [("prism-envelope-layout", b"reviewed")]


class Producer:
    """An ``acks=all`` librdkafka producer in a thread; remembers every input it was told is
    stored (topic/partition/offset, the key the worker's outputs carry in ``prism-source``)."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        from confluent_kafka import Producer as RdProducer

        self.topic = topic
        self.producer = RdProducer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
                                    "linger.ms": 5, "message.timeout.ms": 120_000})
        self.acked: set[str] = set()
        self.failed: list[str] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._n = 0

    def _on_delivery(self, err: Any, msg: Any) -> None:
        if err is not None:
            self.failed.append(str(err))
        else:
            self.acked.add(f"{msg.topic()}/{msg.partition()}/{msg.offset()}")

    def send(self, n: int, valid: bool = True) -> None:
        for _ in range(n):
            value, headers = _value(self._n, self.topic, valid)
            self.producer.produce(self.topic, value, key=str(self._n % 97).encode(), headers=headers,
                                  on_delivery=self._on_delivery)
            self._n += 1
            self.producer.poll(0)

    def flush(self) -> None:
        left = self.producer.flush(150)
        assert left == 0, f"{left} inputs not acknowledged within 150 s"

    def start_live(self, rate: int = LIVE_RATE) -> None:
        def run() -> None:
            began = time.monotonic()
            while not self._stop.is_set():
                due = int((time.monotonic() - began) * rate) - (self._n - BACKLOG)
                if due > 0:
                    self.send(min(due, rate))
                self.producer.poll(0.02)

        self._thread = threading.Thread(target=run, name="live-producer", daemon=True)
        self._thread.start()

    def stop_live(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
        self.flush()


class Outputs:
    """Which inputs ended on ``.v3`` or the DLQ and how often, from librdkafka records (the
    bookkeeping of tests/worker/test_crash_e2e.py's ArchiveWatcher, without its aiokafka consumer)."""

    def __init__(self) -> None:
        self.seen: Counter[str] = Counter()
        self.v3_ids: Counter[str] = Counter()
        self.dlq = 0

    def count(self, recs: list[Any]) -> None:
        for m in recs:
            h = {k: v for k, v in (m.headers() or []) if v is not None}
            if "prism.errors.offset" in h:
                self.dlq += 1
                self.seen[f"{h['prism.errors.topic'].decode()}/{h['prism.errors.partition'].decode()}/"
                          f"{h['prism.errors.offset'].decode()}"] += 1
            elif m.topic().endswith(".v3"):
                self.seen[h["prism-source"].decode()] += 1
                self.v3_ids[h["prism-message-id"].decode()] += 1


def _read_outputs(bootstrap: str, source: str, expected: int) -> Outputs:
    out = Outputs()
    for topic in (source + ".v3", source + ".dlq"):
        out.count(independent.consume_all(bootstrap, topic, PARTITIONS,
                                          expected=expected if topic.endswith(".v3") else 0, timeout=60))
    return out


@dataclass
class Sampler:
    """Samples the worker's ``.v3`` write counter (/metrics) and /readyz every 0.2 s in a thread."""

    port: int
    v3_topic: str
    progress: list[tuple[float, int]] = field(default_factory=list)
    ready: list[tuple[float, int, dict[str, Any]]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> None:
        threading.Thread(target=self._run, name="sampler", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        pattern = re.compile(r'^prism_messages_out_total\{[^}]*stage="publish"[^}]*topic="'
                             + re.escape(self.v3_topic) + r'"[^}]*\} ([0-9.e+]+)$', re.M)
        while not self._stop.wait(0.2):
            now = time.monotonic()
            try:
                _, text = _get(f"http://127.0.0.1:{self.port}/metrics")
                match = pattern.search(text)
                self.progress.append((now, int(float(match.group(1))) if match else 0))
                code, body = _get(f"http://127.0.0.1:{self.port}/readyz")
                self.ready.append((now, code, json.loads(body)))
            except (OSError, ValueError):
                continue  # the worker is busy or restarting its web server: next sample

    def written(self) -> int:
        return self.progress[-1][1] if self.progress else 0

    def longest_pause(self, since: float, until: float) -> float:
        """The longest stretch within [since, until] in which the counter did not move."""
        pts = [(t, n) for t, n in self.progress if since <= t <= until]
        longest, last_move, last_n = 0.0, since, None
        for t, n in pts:
            if last_n is not None and n > last_n:
                longest = max(longest, t - last_move)
                last_move = t
            last_n = n
        return max(longest, (pts[-1][0] if pts else until) - last_move)

    def rate(self, since: float, until: float) -> float:
        pts = [(t, n) for t, n in self.progress if since <= t <= until]
        if len(pts) < 2 or pts[-1][0] <= pts[0][0]:
            return 0.0
        return (pts[-1][1] - pts[0][1]) / (pts[-1][0] - pts[0][0])

    def written_between(self, since: float, until: float) -> int:
        """How many outputs the worker wrote within [since, until] (its write counter's rise)."""
        pts = [n for t, n in self.progress if since <= t <= until]
        return pts[-1] - pts[0] if len(pts) >= 2 else 0

    def recovered_after(self, since: float, baseline: float, window: float = 2.0) -> float | None:
        """Seconds after ``since`` until the ``window``-second write rate reached half of ``baseline``."""
        for t, _ in self.progress:
            if t >= since + window and self.rate(t - window, t) >= baseline / 2:
                return t - since
        return None

    def not_ready(self, since: float) -> list[str]:
        """The distinct reasons /readyz gave while it was not 200, after ``since``."""
        out: list[str] = []
        for t, code, body in self.ready:
            if t < since or code == 200:
                continue
            failed = {k: v.get("reason", "") for k, v in body.get("checks", {}).items() if not v.get("ok")}
            # "a write has waited 6 s", "... 7 s": one entry per distinct reason, not per second
            text = re.sub(r"waited \d+ s", "waited N s", "; ".join(f"{k}: {v}" for k, v in failed.items()))
            if text not in out:
                out.append(text)
        return out


@dataclass
class Run:
    """One worker on ``cluster`` with a topology, its topics at RF 3, a producer and a sampler."""

    cluster: ApacheKafka
    topo: Topology
    worker: WorkerProcess
    producer: Producer
    sampler: Sampler

    @property
    def source(self) -> str:
        return self.topo.sources[0].topic


@pytest.fixture
def run(kafka_cluster: ApacheKafka, tmp_path: Path, dev_keys: DevKeys) -> Iterator[Run]:
    cluster = kafka_cluster
    cluster.wait_in_sync()  # a previous scenario's restarted node has caught up
    topo = make_topology(tmp_path, dev_keys, partitions=PARTITIONS)
    source = topo.sources[0].topic
    bootstrap = cluster.bootstrap
    asyncio.run(ensure_topics(bootstrap, topo.topics(), replication_factor=3, configs=topo.topic_configs()))
    port = _free_port()
    env = {"PRISM_TOPOLOGY": str(tmp_path / "topology.yaml"), "PRISM_BOOTSTRAP": bootstrap,
           "PRISM_DATA_DIR": str(tmp_path / "data"), "PRISM_APP_ID": f"bf-{uuid.uuid4().hex[:8]}",
           "PRISM_BROKER_URL": bootstrap, "PRISM_REPLICATION_FACTOR": "3", "PRISM_WEB_PORT": str(port)}
    worker = WorkerProcess("app.worker.pipeline:app_from_env", log_path=tmp_path / "worker.log", env=env)
    producer = Producer(bootstrap, source)
    producer.send(BACKLOG)
    producer.flush()
    sampler = Sampler(port, source + ".v3")
    worker.start(timeout=120)
    sampler.start()
    try:
        yield Run(cluster, topo, worker, producer, sampler)
    finally:
        sampler.stop()
        producer.stop_live()
        worker.stop(timeout=60)


def _wait(what: str, check: Any, timeout: float, worker: WorkerProcess) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:.0f} s\n{worker.diagnose()}\n"
                                 f"worker log, last lines (schema and fetch-retry noise left out):\n"
                                 f"{_notable_log(worker)}")
        time.sleep(0.2)


def _notable_log(worker: WorkerProcess, lines: int = 80) -> str:
    """The worker log's last `lines` lines, without the per-record schema warnings and the
    per-100-ms fetch retries to a killed node (they drown what a stall's diagnosis needs)."""
    noise = ("schema_validation_failed", "Failed fetch messages from", "Unable connect to node")
    kept = [ln for ln in worker.log_tail(2_000_000).splitlines() if not any(n in ln for n in noise)]
    return "\n".join(kept[-lines:])


def _verdict(r: Run) -> tuple[int, int, int, int]:
    """(lost, inputs emitted twice, duplicate .v3 records, DLQ records) from a complete re-read
    by librdkafka of ``.v3`` and the DLQ."""
    deadline = time.monotonic() + 120
    while True:
        final = _read_outputs(r.cluster.bootstrap, r.source, len(r.producer.acked))
        missing = r.producer.acked - set(final.seen)
        if not missing or time.monotonic() > deadline:
            break
        time.sleep(2)  # the worker is still catching up
    if missing:
        print("missing outputs for", sorted(missing)[:20], "\n", r.worker.log_tail(5000))
    twice = sum(1 for n in final.seen.values() if n > 1)
    dup = sum(n - 1 for n in final.v3_ids.values() if n > 1)
    return len(missing), twice, dup, final.dlq


def _leaders(r: Run) -> Counter[int]:
    """How many of the source and ``.v3`` partitions each node leads."""
    leads: Counter[int] = Counter()
    for topic in (r.source, r.source + ".v3"):
        for p in range(PARTITIONS):
            leads[r.cluster.leader(topic, p)] += 1
    return leads


def _changelog_replicas(cluster: ApacheKafka, app_prefix: str) -> dict[str, int]:
    meta = cluster.metadata()
    return {name: len(t.partitions[0].replicas) for name, t in meta.topics.items()
            if name.startswith(app_prefix) and name.endswith("-changelog")}


def test_kill_9_partition_leader_under_load(run: Run, capsys: pytest.CaptureFixture[str]) -> None:
    r, cluster, sampler = run, run.cluster, run.sampler
    app_id = r.worker.env["PRISM_APP_ID"]
    replicas = _changelog_replicas(cluster, app_id)
    assert replicas and set(replicas.values()) == {3}, replicas  # PRISM_REPLICATION_FACTOR reached Faust
    r.producer.start_live()
    _wait("the worker well into the backlog", lambda: sampler.written() >= BACKLOG // 4, 90, r.worker)
    t_base = time.monotonic()
    time.sleep(3)
    baseline = sampler.rate(t_base, time.monotonic())
    leads = _leaders(r)
    victim, led = leads.most_common(1)[0]
    t_kill = time.monotonic()
    cluster.kill(victim)  # kill -9: no controlled shutdown, leadership moves after the session timeout
    for topic in (r.source, r.source + ".v3"):
        for p in range(PARTITIONS):
            cluster.wait_leader(topic, p, not_on=victim, timeout=60)
    t_moved = time.monotonic()
    time.sleep(8)  # under load with one broker down
    written_while_down = sampler.written_between(t_moved, time.monotonic())
    cluster.start_node(victim)
    t_back = time.monotonic()
    time.sleep(5)
    r.producer.stop_live()
    produced = len(r.producer.acked)
    _wait("every acknowledged input written", lambda: sampler.written() >= produced, 180, r.worker)
    _wait("/readyz 200 again", lambda: bool(sampler.ready) and sampler.ready[-1][1] == 200, 60, r.worker)
    t_end = time.monotonic()
    pause = sampler.longest_pause(t_kill, t_end)
    recovered = sampler.recovered_after(t_kill, baseline)
    said = sampler.not_ready(t_kill)
    lost, twice, dup, dlq = _verdict(r)
    with capsys.disabled():
        print(f"\nbroker kill -9: node {victim} led {led} of {2 * PARTITIONS} source/.v3 partitions; "
              f"{produced} inputs acked (acks=all), lost {lost}, inputs emitted twice {twice}, duplicate .v3 "
              f"records {dup}, DLQ {dlq}; longest pause {pause:.1f}s, throughput back (>=50% of "
              f"{baseline:.0f}/s) {recovered if recovered is None else round(recovered, 1)}s after the kill, "
              f"node down {t_back - t_kill:.1f}s; /readyz said: {said or 'nothing (200 throughout)'}")
    assert not r.producer.failed, r.producer.failed[:3]
    assert lost == 0
    # Liveness, not speed (throughput is measured and printed above, never asserted: a loaded CI
    # machine once kept it under half the baseline although writes went on): with the victim
    # down and leadership moved, the worker keeps writing.
    assert written_while_down > 0, ("no output written in the 8 s with one broker down",
                                    r.worker.log_tail(4000))
    if pause > 8:  # writes waited well past the stall threshold: /readyz must have said so
        assert any("kafka" in s for s in said), said
    assert "Kafka trouble" not in r.worker.log_tail(200_000) or "Kafka trouble over" in r.worker.log_tail(200_000)


def test_rolling_restart_under_load(run: Run, capsys: pytest.CaptureFixture[str]) -> None:
    r, cluster, sampler = run, run.cluster, run.sampler
    r.producer.start_live()
    _wait("the worker well into the backlog", lambda: sampler.written() >= BACKLOG // 4, 90, r.worker)
    t_base = time.monotonic()
    time.sleep(3)
    baseline = sampler.rate(t_base, time.monotonic())
    t0 = time.monotonic()
    cluster.rolling_restart(timeout=120)  # each node: SIGTERM (controlled shutdown), start, wait in sync
    restart_s = time.monotonic() - t0
    time.sleep(3)
    r.producer.stop_live()
    produced = len(r.producer.acked)
    _wait("every acknowledged input written", lambda: sampler.written() >= produced, 180, r.worker)
    _wait("/readyz 200 again", lambda: bool(sampler.ready) and sampler.ready[-1][1] == 200, 60, r.worker)
    pause = sampler.longest_pause(t0, time.monotonic())
    said = sampler.not_ready(t0)
    lost, twice, dup, dlq = _verdict(r)
    with capsys.disabled():
        print(f"\nrolling restart of 3 brokers ({restart_s:.0f}s): {produced} inputs acked (acks=all), lost {lost}, "
              f"inputs emitted twice {twice}, duplicate .v3 records {dup}, DLQ {dlq}; longest pause {pause:.1f}s "
              f"(baseline {baseline:.0f}/s); /readyz said: {said or 'nothing (200 throughout)'}")
    assert not r.producer.failed, r.producer.failed[:3]
    assert lost == 0


def test_worker_smoke_on_kafka_3_9(kafka_factory: KafkaFactory, tmp_path: Path, dev_keys: DevKeys) -> None:
    """The worker on the last 3.x line: a mixed batch (valid and invalid inputs) ends on ``.v3``
    and the DLQ as on 4.x, and SIGTERM stops it cleanly."""
    cluster = kafka_factory(libs=require_kafka_libs(LEGACY_VERSION))
    assert cluster.version.startswith("3.9."), cluster.version
    topo = make_topology(tmp_path, dev_keys, partitions=PARTITIONS)
    source = topo.sources[0].topic
    bootstrap = cluster.bootstrap
    asyncio.run(ensure_topics(bootstrap, topo.topics(), configs=topo.topic_configs()))
    producer = Producer(bootstrap, source)
    producer.send(150)
    producer.send(50, valid=False)
    producer.flush()
    env = {"PRISM_TOPOLOGY": str(tmp_path / "topology.yaml"), "PRISM_BOOTSTRAP": bootstrap,
           "PRISM_DATA_DIR": str(tmp_path / "data"), "PRISM_APP_ID": f"k39-{uuid.uuid4().hex[:8]}",
           "PRISM_BROKER_URL": bootstrap}
    worker = WorkerProcess("app.worker.pipeline:app_from_env", log_path=tmp_path / "worker.log", env=env)
    worker.start(timeout=120)
    try:
        deadline = time.monotonic() + 90
        watch = _read_outputs(bootstrap, source, 150)
        while len(watch.seen) < 200 and time.monotonic() < deadline:
            time.sleep(1)
            watch = _read_outputs(bootstrap, source, 150)
        assert set(watch.seen) == producer.acked, worker.log_tail()
        dlq = [m for m in independent.consume_all(bootstrap, source + ".dlq", PARTITIONS, expected=50, timeout=20)]
        assert len(dlq) == 50 and len(watch.v3_ids) == 150, (len(dlq), len(watch.v3_ids))
        reasons = Counter(error_context(list(m.headers() or [])).get("reason") for m in dlq)
        assert reasons == {"bad_prism_envelope": 50}, reasons
    finally:
        code = worker.stop(timeout=60)
    assert code == 0, worker.log_tail()


def _set_min_isr(cluster: ApacheKafka, topic: str, value: int) -> None:
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

    resource = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[
        ConfigEntry("min.insync.replicas", str(value), incremental_operation=AlterConfigOpType.SET)])
    with cluster.admin() as admin:
        for future in admin.incremental_alter_configs([resource]).values():
            future.result(timeout=30)


def test_writes_blocked_readyz_says_why_and_recovers(run: Run, capsys: pytest.CaptureFixture[str]) -> None:
    """Writes that cannot complete for longer than a leader election - here ``.v3`` asks for 3
    in-sync replicas and one broker is down - make /readyz say so (503, check ``kafka``) while it
    lasts, and 200 once the broker is back; nothing is lost meanwhile."""
    r, cluster, sampler = run, run.cluster, run.sampler
    r.producer.start_live()
    _wait("the worker well into the backlog", lambda: sampler.written() >= BACKLOG // 4, 90, r.worker)
    v3 = r.source + ".v3"
    leaders = {cluster.leader(t, p) for t in (r.source, v3) for p in range(PARTITIONS)}
    victim = next((n for n in cluster.nodes if n not in leaders), max(cluster.nodes))
    _set_min_isr(cluster, v3, 3)
    t_kill = time.monotonic()
    cluster.kill(victim)

    def reported() -> bool:
        # the writes' own report: when the victim also leads a source partition, /readyz first says
        # "fetching: broker unreachable", and the writes are reported once one has waited 5 s
        return any(code == 503 and "writes failing" in str(body.get("checks", {}).get("kafka", {}).get("reason", ""))
                   for t, code, body in sampler.ready if t > t_kill)

    _wait("/readyz reporting the blocked writes", reported, 60, r.worker)
    cluster.start_node(victim)
    _wait("/readyz 200 again", lambda: bool(sampler.ready) and sampler.ready[-1][1] == 200, 90, r.worker)
    t_clear = time.monotonic()
    _set_min_isr(cluster, v3, 2)
    r.producer.stop_live()
    produced = len(r.producer.acked)
    _wait("every acknowledged input written", lambda: sampler.written() >= produced, 180, r.worker)
    said = sampler.not_ready(t_kill)
    pause = sampler.longest_pause(t_kill, time.monotonic())
    lost, twice, dup, dlq = _verdict(r)
    log = r.worker.log_tail(500_000)
    with capsys.disabled():
        print(f"\nwrites blocked (min ISR 3, node {victim} down): {produced} inputs acked, lost {lost}, inputs emitted "
              f"twice {twice}, duplicate .v3 records {dup}, DLQ {dlq}; longest pause {pause:.1f}s, not ready "
              f"until {t_clear - t_kill:.1f}s after the kill; /readyz said: {said}")
    assert lost == 0
    assert any(s.startswith("kafka: writes failing") for s in said), said
    assert "Kafka trouble: writes failing" in log and "Kafka trouble over after" in log, log[-3000:]

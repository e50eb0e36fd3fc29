"""RocksDB tables recover EXACTLY after a restart on the embedded broker (and on Apache Kafka).

One worker (tests/tables/recovery_app.py, run as a subprocess) consumes 5000 records from a
4-partition topic into four RocksDB tables with changelogs, and is stopped cleanly. Then:

* (a) a new worker on the SAME data dir must start (no ``ConsistencyError``) and hold exactly
  the same tables, processing nothing again;
* (b) a new worker on an EMPTY data dir must rebuild exactly the same tables from the changelogs.

On this broker both fail without app/worker/offsets.py (docs/platform-notes.md: "ListOffsets(latest)
returns the wrong end"); ``test_without_the_workaround_the_broker_bug_breaks_restarts`` shows it.
The ``test_on_kafka_*`` twins run (a) and (b) on Apache Kafka, where the recovery's offset queries
go through the offsets probe's connection (app/worker/offsets.py) instead of the worker consumer's.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer

from app.broker.admin import ensure_topics
from app.broker.embedded import EmbeddedBroker
from app.worker.faust_app import WorkerProcess
from tests.support import committed_offsets, require, require_broker_binary

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
RECORDS = 5000
KEYS = 50
PARTITIONS = 4


def wait_for(condition: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    delay = 0.02
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(delay)
        delay = min(delay * 2, 0.2)


@dataclass
class Scenario:
    broker: Any  # EmbeddedBroker, or tests/kafka's ApacheKafka: anything with .bootstrap
    topic: str
    app_id: str
    base: Path
    first_data_dir: Path
    first: dict[str, Any]

    def worker(self, name: str, data_dir: Path, *, workaround: bool = True,
               stock_recovery: bool = False, standbys: int = 0,
               commit_interval: float = 0.5) -> tuple[WorkerProcess, Path]:
        snapshot = self.base / f"{name}.json"
        env = {"RT_APP_ID": self.app_id, "RT_BOOTSTRAP": self.broker.bootstrap, "RT_DATA_DIR": str(data_dir),
               "RT_TOPIC": self.topic, "RT_PARTITIONS": str(PARTITIONS), "RT_SNAPSHOT": str(snapshot),
               "RT_WORKAROUND": "1" if workaround else "0", "RT_RECOVERY": "stock" if stock_recovery else "prism",
               "RT_STANDBYS": str(standbys), "RT_COMMIT_INTERVAL": str(commit_interval)}
        process = WorkerProcess("tests.tables.recovery_app:build", log_path=self.base / f"{name}.log",
                                env=env, cwd=ROOT)
        return process, snapshot


def read_snapshot(path: Path, pid: int | None) -> dict[str, Any] | None:
    if not path.exists():
        return None
    data = json.loads(path.read_text())
    return data if data["pid"] == pid else None


async def produce_records(bootstrap: str, topic: str) -> None:
    """RECORDS records: key ``k<i % KEYS>`` (the same keys land on the same partitions each time)."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    await producer.start()
    try:
        futures = []
        for i in range(RECORDS):
            value = json.dumps({"id": f"msg-{i}", "seq": i // KEYS}).encode()
            futures.append(await producer.send(topic, value, key=f"k{i % KEYS}".encode()))
        await asyncio.gather(*futures)
    finally:
        await producer.stop()


def _require_rocksdict() -> None:
    try:
        import rocksdict  # noqa: F401
    except ImportError:
        require(False, "rocksdict is not installed (RocksDB tables need it)")


def first_run(broker: Any, base: Path, *, workaround: bool = True) -> Scenario:
    """A fresh topic with RECORDS records, consumed once into the tables by a first worker."""
    topic, app_id = f"recovery-{uuid.uuid4().hex[:8]}", f"recovery-app-{uuid.uuid4().hex[:8]}"
    asyncio.run(ensure_topics(broker.bootstrap, {topic: PARTITIONS}))
    asyncio.run(produce_records(broker.bootstrap, topic))
    scenario = Scenario(broker, topic, app_id, base, base / "data-first", {})
    process, snapshot = scenario.worker("first", scenario.first_data_dir, workaround=workaround)
    try:
        process.start(timeout=60)
        first = wait_for(lambda: (s := read_snapshot(snapshot, process.pid)) and
                         s["processed_this_run"] >= RECORDS and s, 60, "the first worker to process 5000")
    finally:
        code = process.stop()
    assert code == 0, f"first worker did not stop cleanly ({code}):\n{process.log_tail()}"
    scenario.first = first
    return scenario


@pytest.fixture(scope="module")
def scenario(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scenario]:
    require_broker_binary()
    _require_rocksdict()
    base = tmp_path_factory.mktemp("recovery")
    broker = EmbeddedBroker(log_dir=base)
    broker.start()
    try:
        yield first_run(broker, base)
    finally:
        broker.stop()


@pytest.fixture(scope="module")
def kafka_scenario(kafka: Any, tmp_path_factory: pytest.TempPathFactory) -> Scenario:
    """The same first run on Apache Kafka (``make_app(embedded=False)``: Faust's stock end
    offsets, asked through the offsets probe - app/worker/offsets.py)."""
    _require_rocksdict()
    return first_run(kafka, tmp_path_factory.mktemp("recovery-kafka"), workaround=False)


def assert_recovered_exactly(scenario: Scenario, name: str, data_dir: Path, *, workaround: bool = True) -> str:
    process, snapshot = scenario.worker(name, data_dir, workaround=workaround)
    try:
        process.start(timeout=60)  # returns after table recovery (ready file)
        recovered = wait_for(lambda: read_snapshot(snapshot, process.pid), 20, f"{name} snapshot")
        assert process.running, f"{name} worker died:\n{process.log_tail()}"
    finally:
        code = process.stop()
    log = process.log_path.read_text()
    assert "ConsistencyError" not in log and "Traceback" not in log, log[-4000:]
    assert code == 0
    first = scenario.first
    assert recovered["processed_this_run"] == 0, "committed offsets were not honoured"
    assert sum(recovered["counts"].values()) == RECORDS
    assert recovered["counts"] == first["counts"]
    assert recovered["counter_total"] == RECORDS
    assert recovered["counter_by_partition"] == first["counter_by_partition"]
    assert recovered["sequences"] == first["sequences"]
    assert recovered["dedup_ids"] == RECORDS
    assert recovered["emitted_ids"] == RECORDS  # the direct-write path recovers like Faust's own
    return log


def test_first_run_processed_everything_once(scenario: Scenario) -> None:
    first = scenario.first
    assert first["processed_this_run"] == RECORDS
    assert first["counts"] == {f"k{k}": RECORDS // KEYS for k in range(KEYS)}
    assert first["counter_total"] == RECORDS
    assert len(first["counter_by_partition"]) == PARTITIONS  # keys spread over all partitions
    assert first["duplicates_this_run"] == 0 and first["not_in_order_this_run"] == 0
    assert all(v == {"last": RECORDS // KEYS - 1, "seen": RECORDS // KEYS, "missing": 0, "duplicates": 0,
                     "regressions": 0} for v in first["sequences"].values())
    assert first["dedup_ids"] == RECORDS
    assert first["emitted_ids"] == RECORDS
    # flush_changelog stored each changelog partition's offset (RECORDS records over PARTITIONS)
    persisted = first["emitted_persisted_offsets"]
    assert len(persisted) == PARTITIONS and sum(o + 1 for o in persisted) == RECORDS, persisted


def test_restart_on_the_same_data_dir_recovers_exactly(scenario: Scenario) -> None:
    assert_recovered_exactly(scenario, "same-dir", scenario.first_data_dir)


def test_restart_on_an_empty_data_dir_replays_the_changelog_exactly(scenario: Scenario) -> None:
    assert_recovered_exactly(scenario, "empty-dir", scenario.base / "data-empty")


def test_without_the_workaround_the_broker_bug_breaks_restarts(scenario: Scenario) -> None:
    """The control experiment: stock Faust on this broker refuses to restart on its own data."""
    data_dir = scenario.base / "data-stock"
    shutil.copytree(scenario.first_data_dir, data_dir)  # leave the real data dir untouched
    process, _ = scenario.worker("stock", data_dir, workaround=False, stock_recovery=True)
    try:
        process.start(wait=False)
        wait_for(lambda: process.returncode is not None or "ConsistencyError" in process.log_tail(20000), 60,
                 "stock Faust to hit ConsistencyError")
    finally:
        process.stop()
    assert "ConsistencyError" in process.log_path.read_text()


def test_short_listoffsets_without_the_workaround_is_verified_not_fatal(scenario: Scenario) -> None:
    """The broker bug reached the way `PRISM_BROKER_URL` reaches it (no embedded-broker
    workaround): Prism's recovery sees the store "ahead", verifies the end with a fetch, keeps the
    store and recovers exactly - where stock Faust dies (the control above). This is what took
    the survivors down in a rebalance (issue 14)."""
    data_dir = scenario.base / "data-unflagged"
    shutil.copytree(scenario.first_data_dir, data_dir)
    log = assert_recovered_exactly(scenario, "unflagged", data_dir, workaround=False)
    assert "a fetch shows" in log and "wiped" not in log, log[-4000:]


def test_a_store_ahead_of_its_changelog_is_rebuilt_not_fatal(scenario: Scenario) -> None:
    """A correct broker whose changelog lacks what the local store holds (lost tail, re-created
    topic): the partition is wiped and rebuilt from the changelog, the worker keeps running."""
    from rocksdict import Options, Rdict

    data_dir = scenario.base / "data-ahead"
    shutil.copytree(scenario.first_data_dir, data_dir)
    [db_path] = [p for p in data_dir.rglob("*.db") if p.name.endswith("counts-1.db")]
    db = Rdict(str(db_path), options=Options(raw_mode=True))
    offset_key = b"__faust\0offset__"
    db[offset_key] = str(int(db[offset_key]) + 1000).encode()  # claims 1000 records the changelog lacks
    db[b'"ghost"'] = b"999"  # ... one of which the changelog never had
    db.close()
    log = assert_recovered_exactly(scenario, "ahead", data_dir)  # exact tables: the ghost is gone
    assert "ahead of the changelog; wiped" in log and "counts" in log, log[-4000:]


def test_empty_data_dir_without_the_workaround_replays_the_changelog_exactly(scenario: Scenario) -> None:
    """Without the embedded-broker transport, ListOffsets is short; the recovery verifies every
    end with a fetch, so a worker on an empty data dir still gets the changelog's last batch."""
    log = assert_recovered_exactly(scenario, "empty-unflagged", scenario.base / "data-empty-unflagged",
                                   workaround=False)
    assert "a fetch shows" in log, log[-4000:]


def test_on_kafka_restart_on_the_same_data_dir_recovers_exactly(kafka_scenario: Scenario) -> None:
    """Apache Kafka: the recovery's ListOffsets go through the offsets probe's connection; the
    ends it reads must be the changelogs' true ends (nothing re-read, nothing missing)."""
    log = assert_recovered_exactly(kafka_scenario, "kafka-same-dir", kafka_scenario.first_data_dir, workaround=False)
    assert "offsets probe" not in log, log[-4000:]  # the probe connected: no fallback warning


def test_on_kafka_restart_on_an_empty_data_dir_replays_the_changelog_exactly(kafka_scenario: Scenario) -> None:
    log = assert_recovered_exactly(kafka_scenario, "kafka-empty-dir", kafka_scenario.base / "data-empty",
                                   workaround=False)
    assert "offsets probe" not in log and "a fetch shows" not in log, log[-4000:]  # Kafka's ends are right


def _settled(snapshot: Path, process: WorkerProcess, sources: int, processed: int, what: str) -> dict[str, Any]:
    """The worker's snapshot once it holds `sources` source partitions, has processed `processed`
    records this run and its recovery is over: every active changelog partition paused in aiokafka."""

    def ready() -> dict[str, Any] | None:
        s = read_snapshot(snapshot, process.pid)
        if not s or len(s["sources"]) != sources or s["processed_this_run"] < processed:
            return None
        actives = [c for c in s["changelogs"] if c[1] in s["sources"]]
        return s if actives and all(c in s["paused"] for c in actives) else None

    return wait_for(ready, 90, what)


@pytest.mark.parametrize("standbys", [0, 1])
def test_on_kafka_a_worker_joining_and_leaving_recovers_with_the_changelogs_paused(
        kafka: Any, tmp_path_factory: pytest.TempPathFactory, standbys: int) -> None:
    """Rebalances with the pause in place (app/tables/recovery.py, ``_pause_changelogs``): worker A
    alone, B joins (each recovers its half), RECORDS more are processed by both, B leaves and A
    recovers B's partitions from the changelogs B wrote - from its own, older, store. Every
    recovery ends with the active changelog partitions paused in aiokafka and nothing else: not a
    source, not a standby partition (``standbys=1``: Faust keeps asking for those, so aiokafka must
    keep fetching them). The tables come out exact.

    Not held here: that a standby's local copy follows the active's writes within a given time -
    measured, it did not within 60 s, with this pause and without it alike (Faust applies standby
    records in batches of ``table_standby_buffer_size``)."""
    _require_rocksdict()
    base = tmp_path_factory.mktemp(f"rebalance-kafka-{standbys}")
    sc = first_run(kafka, base, workaround=False)
    first = sc.first["counter_by_partition"]
    a, snap_a = sc.worker("a", sc.first_data_dir, workaround=False, standbys=standbys)
    b, snap_b = sc.worker("b", base / "data-b", workaround=False, standbys=standbys)
    try:
        a.start(timeout=60)
        alone = _settled(snap_a, a, PARTITIONS, 0, "A alone")
        assert not [c for c in alone["paused"] if c[0] == sc.topic], alone["paused"]
        b.start(timeout=60)
        sa = _settled(snap_a, a, PARTITIONS // 2, 0, "A after B joined")
        sb = _settled(snap_b, b, PARTITIONS // 2, 0, "B after it joined")
        for s in (sa, sb):  # each recovered its half (B from nothing)
            assert {p: s["counter_by_partition"].get(str(p)) for p in s["sources"]} == \
                {p: first[str(p)] for p in s["sources"]}, s
            assert all(c[1] in s["sources"] for c in s["paused"]), s  # no source, no standby paused
            standby = [c for c in s["changelogs"] if c[1] not in s["sources"]]
            assert len(standby) == (len(s["changelogs"]) // 2 if standbys else 0), s
        asyncio.run(produce_records(kafka.bootstrap, sc.topic))  # RECORDS more, shared by A and B
        sa = _settled(snap_a, a, PARTITIONS // 2, 1, "A processing")
        sb = _settled(snap_b, b, PARTITIONS // 2, 1, "B processing")
        wait_for(lambda: (x := read_snapshot(snap_a, a.pid)) and (y := read_snapshot(snap_b, b.pid))
                 and x["processed_this_run"] + y["processed_this_run"] == RECORDS, 90, "A and B to process RECORDS")
        assert b.stop() == 0, b.log_tail()
        last = _settled(snap_a, a, PARTITIONS, 1, "A after B left")
        wait_for(lambda: (x := read_snapshot(snap_a, a.pid)) and x["counter_total"] == 2 * RECORDS and x, 60,
                 "A's counters to hold every record of both rounds")
        last = read_snapshot(snap_a, a.pid)
        assert last is not None
        assert last["counter_by_partition"] == {p: 2 * n for p, n in first.items()}, last
        assert last["counts"] == {f"k{k}": 2 * RECORDS // KEYS for k in range(KEYS)}
        assert a.running, a.log_tail()
    finally:
        b.stop()
        code = a.stop()
    log = a.log_path.read_text()
    assert "ConsistencyError" not in log and "Traceback" not in log, log[-4000:]
    assert code == 0


def _a_join_reads_nothing_again(broker: Any, base: Path, *, workaround: bool) -> None:
    """Worker A processes RECORDS with a commit timer that never fires (an hour), then B joins.
    The join revokes all of A's partitions: what A processed must be committed by that
    revocation (app/worker/offsets.py, ``OffsetsProbeConsumer.on_partitions_revoked``), so
    neither A nor B reads any of it again. Stock Faust 0.15.3 forgets the acknowledged offsets
    before its revocation commit: every record since the last timer commit was processed twice
    (all RECORDS here; 767-925 of 1,500 in the join-and-leave test below, at a 0.5 s timer)."""
    _require_rocksdict()
    topic, app_id = f"join-{uuid.uuid4().hex[:8]}", f"join-app-{uuid.uuid4().hex[:8]}"
    asyncio.run(ensure_topics(broker.bootstrap, {topic: PARTITIONS}))
    asyncio.run(produce_records(broker.bootstrap, topic))
    sc = Scenario(broker, topic, app_id, base, base / "data-a", {})
    a, snap_a = sc.worker("a", base / "data-a", workaround=workaround, commit_interval=3600)
    b, snap_b = sc.worker("b", base / "data-b", workaround=workaround, commit_interval=3600)
    try:
        a.start(timeout=60)
        wait_for(lambda: (s := read_snapshot(snap_a, a.pid)) and s["processed_this_run"] == RECORDS, 60,
                 "A to process RECORDS")
        assert asyncio.run(committed_offsets(broker.bootstrap, app_id, topic, PARTITIONS)) == dict.fromkeys(
            range(PARTITIONS), 0)  # the timer has not committed anything
        b.start(timeout=60)
        wait_for(lambda: sum(asyncio.run(committed_offsets(broker.bootstrap, app_id, topic, PARTITIONS)).values())
                 == RECORDS, 30, "the revocation to commit what A processed")
        sa = _settled(snap_a, a, PARTITIONS // 2, RECORDS, "A after B joined")
        sb = _settled(snap_b, b, PARTITIONS // 2, 0, "B after it joined")
        assert sa["processed_this_run"] == RECORDS and sb["processed_this_run"] == 0, (sa, sb)
        assert sa["counter_total"] + sb["counter_total"] == RECORDS, (sa, sb)
    finally:
        codes = b.stop(), a.stop()
    assert codes == (0, 0), (b.log_tail(), a.log_tail())


def test_a_worker_joining_reads_nothing_again(scenario: Scenario, tmp_path_factory: pytest.TempPathFactory) -> None:
    _a_join_reads_nothing_again(scenario.broker, tmp_path_factory.mktemp("join-embedded"), workaround=True)


def test_on_kafka_a_worker_joining_reads_nothing_again(kafka: Any, tmp_path_factory: pytest.TempPathFactory) -> None:
    _a_join_reads_nothing_again(kafka, tmp_path_factory.mktemp("join-kafka"), workaround=False)

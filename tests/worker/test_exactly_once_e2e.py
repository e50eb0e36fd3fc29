"""processing_guarantee exactly_once (app/worker/transactions.py) proven on Apache Kafka.

* kill -9 of a worker with >= 20k inputs in flight, a restart on the same data dir: read with
  ``isolation.level=read_committed`` (librdkafka), every input reached `.v3` exactly once - 0 lost,
  0 duplicates - and the dedup table's changelog (read_committed too) holds exactly the message ids
  of the committed outputs. The same test in at_least_once reports its duplicates for comparison.
  ``PRISM_EOS_ROUNDS`` (default 1) repeats the kill; BENCHMARKS.md records a 5-round run.
* zombie fencing: another producer takes a partition's transactional id (what the partition's next
  owner does); the worker's next transaction there is fenced, aborted and nothing of it is visible;
  the restarted worker reads the batch again - 0 lost, 0 duplicates.
* refusal: on the embedded broker (no transactions) the worker refuses exactly_once at start, in
  one line that says why and what to use instead; never a silent downgrade.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from app.broker.admin import ensure_topics
from app.errors import ConfigError
from app.worker.faust_app import WorkerProcess, make_app
from app.worker.transactions import check_transactions, transactional_id
from tests.worker import independent
from tests.worker.conftest import make_topology
from tests.worker.test_crash_e2e import ArchiveWatcher, N, _produce_backlog

ROUNDS = int(os.environ.get("PRISM_EOS_ROUNDS", "1"))
TARGET = "app.worker.pipeline:app_from_env"


class _Verdict:
    """What a complete read_committed re-read of `.v3`, the DLQ and the dedup changelog says.

    Every read goes to the end of every partition (`expected=0`, tests/worker/independent.py):
    the workers have stopped, so the end is all there is - and a test with fewer inputs than `N`
    does not wait out 3 s of quiet per topic."""

    def __init__(self, bootstrap: str, source: str, app_id: str, parts: int = 4) -> None:
        self.seen: Counter[str] = Counter()     # input coordinates -> copies in .v3 / DLQ
        self.v3_ids: Counter[str] = Counter()   # message ids -> copies in .v3
        for topic in (source + ".v3", source + ".dlq"):
            for m in independent.consume_all(bootstrap, topic, parts, expected=0, timeout=90, read_committed=True):
                h = dict(m.headers() or [])
                if "prism.errors.offset" in h:
                    self.seen[f"{h['prism.errors.topic'].decode()}/{h['prism.errors.partition'].decode()}/"
                              f"{h['prism.errors.offset'].decode()}"] += 1
                else:
                    self.seen[h["prism-source"].decode()] += 1
                    self.v3_ids[h["prism-message-id"].decode()] += 1
        self.stored = {f"{m.topic()}/{m.partition()}/{m.offset()}"
                       for m in independent.consume_all(bootstrap, source, parts, expected=0, timeout=60)}
        table: dict[bytes, bytes | None] = {}
        for m in independent.consume_all(bootstrap, f"{app_id}-dedup-{source}-changelog", parts, expected=0,
                                         timeout=60, read_committed=True):
            table[bytes(m.key() or b"")] = m.value()
        self.dedup_ids = {k.decode() for k, v in table.items() if v is not None}
        #: `.v3` records a consumer left at read_uncommitted would get: aborted transactions' too
        self.v3_uncommitted = len(independent.consume_all(bootstrap, source + ".v3", parts, expected=0, timeout=90))

    @property
    def lost(self) -> list[str]:
        return sorted(self.stored - set(self.seen))

    @property
    def duplicates(self) -> int:
        """Extra copies: inputs written more than once (to .v3 or the DLQ) and .v3 message ids seen twice."""
        return sum(n - 1 for n in self.seen.values() if n > 1) + sum(n - 1 for n in self.v3_ids.values() if n > 1)


async def _committed_watcher(bootstrap: str, source: str) -> ArchiveWatcher:
    watch = ArchiveWatcher(bootstrap, {source + ".dlq": 4, source + ".v3": 4})
    watch.consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                                      isolation_level="read_committed")
    await watch.start()
    return watch


async def _kill_round(bootstrap: str, tmp: Path, dev_keys, guarantee: str) -> tuple[_Verdict, int, float]:
    tmp.mkdir(parents=True, exist_ok=True)
    topo = make_topology(tmp, dev_keys, partitions=4)
    source = topo.sources[0].topic
    await ensure_topics(bootstrap, topo.topics())
    await _produce_backlog(bootstrap, source)
    app_id = f"eos-{uuid.uuid4().hex[:8]}"
    env = {"PRISM_TOPOLOGY": str(tmp / "topology.yaml"), "PRISM_BOOTSTRAP": bootstrap,
           "PRISM_DATA_DIR": str(tmp / "data"), "PRISM_APP_ID": app_id, "PRISM_BROKER_URL": bootstrap,
           "PRISM_PROCESSING_GUARANTEE": guarantee}
    watch = await _committed_watcher(bootstrap, source)
    first = WorkerProcess(TARGET, log_path=tmp / "w1.log", env=env)
    second = WorkerProcess(TARGET, log_path=tmp / "w2.log", env=env)
    t0 = time.monotonic()
    try:
        first.start(timeout=90)
        await watch.wait_until(2_000, 120, first)
        in_flight = N - len(watch.seen)
        first.kill()  # kill -9: an open transaction is left to be aborted by the next owner
        second.start(timeout=120)
        await watch.wait_until(N, 240, second)
        await asyncio.sleep(1.0)
    finally:
        first.kill()
        second.stop()
        await watch.consumer.stop()
    elapsed = time.monotonic() - t0
    verdict = _Verdict(bootstrap, source, app_id)
    if verdict.lost:
        print("lost:", verdict.lost[:20], "\nworker 2 log tail:", second.log_tail(3000))
    return verdict, in_flight, elapsed


@pytest.mark.parametrize("guarantee", ["exactly_once", "at_least_once"])
async def test_kill_9_under_load(kafka, tmp_path: Path, dev_keys, capsys, guarantee: str) -> None:
    """kill -9 with >= 20k inputs in flight, ROUNDS times: exactly_once has 0 lost and 0
    duplicates read_committed, and its dedup table matches the committed outputs; at_least_once
    has 0 lost and reports its duplicates."""
    results = []
    for r in range(ROUNDS):
        verdict, in_flight, elapsed = await _kill_round(kafka.bootstrap, tmp_path / f"round-{r}", dev_keys, guarantee)
        results.append(verdict)
        ids = set(verdict.v3_ids)
        with capsys.disabled():
            print(f"\n{guarantee} kill -9 round {r + 1}/{ROUNDS}: {N} inputs, {in_flight} in flight, "
                  f"lost {len(verdict.lost)}, duplicates {verdict.duplicates} (.v3 records read_uncommitted: "
                  f"{verdict.v3_uncommitted}), dedup table {len(verdict.dedup_ids)} "
                  f"ids (outputs without an id there: {len(ids - verdict.dedup_ids)}, ids without an output: "
                  f"{len(verdict.dedup_ids - ids)}), {elapsed:.0f}s")
        assert in_flight >= 20_000, in_flight
        assert len(verdict.stored) == N
        assert verdict.lost == []
        if guarantee == "exactly_once":
            assert verdict.duplicates == 0
            assert verdict.dedup_ids == ids  # the table restored read_committed is the outputs' ids
        assert len(verdict.v3_ids) == N


async def _produce_poison(bootstrap: str, topic: str, n: int) -> None:
    """`n` envelopes claiming a namespace no producer of the topology may publish: each goes to the
    DLQ (`namespace_not_allowed`) - inside the batch's transaction under exactly_once."""
    from app.envelope import encode, new_envelope

    p = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await p.start()
    try:
        await asyncio.gather(*[await p.send(topic, encode(new_envelope(topic, {"poison": i}, namespace="billing")),
                                            key=f"poison-{i}".encode()) for i in range(n)])
    finally:
        await p.stop()


async def _stopped_by_an_aborted_transaction(worker: WorkerProcess, log_path: Path,
                                             context: Callable[[], str] = str) -> str:
    """Wait (60 s at most) for `worker` to stop after its transaction was aborted; its log, which
    must carry the one error line that says so. `context`: what the caller knows, for a failure."""
    deadline = time.monotonic() + 60
    while worker.running and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    log = log_path.read_text(errors="replace")
    assert not worker.running, (f"a worker whose transaction was aborted must stop ({context()}); "
                                f"its log ends:\n{log[-4000:]}")
    assert "exactly_once: the transaction of a batch" in log, log[-3000:]
    return log


async def test_zombie_is_fenced(kafka, tmp_path: Path, dev_keys, capsys) -> None:
    """A producer that takes a partition's transactional id (as the partition's next owner does)
    fences the worker: its next transaction there aborts, nothing of it is visible, the worker stops
    with one error line, and the restarted worker processes the batch again - 0 lost, 0 duplicates.
    Poison messages among the fenced inputs reach the DLQ exactly once, inside the transactions."""
    bootstrap = kafka.bootstrap
    topo = make_topology(tmp_path, dev_keys, partitions=4)
    source = topo.sources[0].topic
    await ensure_topics(bootstrap, topo.topics())
    app_id = f"eos-z-{uuid.uuid4().hex[:8]}"
    env = {"PRISM_TOPOLOGY": str(tmp_path / "topology.yaml"), "PRISM_BOOTSTRAP": bootstrap,
           "PRISM_DATA_DIR": str(tmp_path / "data"), "PRISM_APP_ID": app_id, "PRISM_BROKER_URL": bootstrap,
           "PRISM_PROCESSING_GUARANTEE": "exactly_once"}
    n, poison = 4_000, 100
    await _produce_backlog(bootstrap, source, n // 2)
    watch = await _committed_watcher(bootstrap, source)
    worker = WorkerProcess(TARGET, log_path=tmp_path / "w1.log", env=env)
    again = WorkerProcess(TARGET, log_path=tmp_path / "w2.log", env=env)
    try:
        worker.start(timeout=90)
        await watch.wait_until(n // 2, 120, worker)
        # the zombie's successor: the same transactional id, a higher epoch
        successor = AIOKafkaProducer(bootstrap_servers=bootstrap, transactional_id=transactional_id(app_id, source, 0))
        await successor.start()
        await successor.stop()
        await _produce_poison(bootstrap, source, poison)
        await _produce_backlog(bootstrap, source, n // 2)  # partition 0's next batch is fenced
        log = await _stopped_by_an_aborted_transaction(worker, tmp_path / "w1.log")
        assert "ProducerFenced" in log, log[-3000:]
        again.start(timeout=120)
        await watch.wait_until(n + poison, 120, again)
        await asyncio.sleep(1.0)
    finally:
        worker.kill()
        again.stop()
        await watch.consumer.stop()
    verdict = _Verdict(bootstrap, source, app_id)
    dlq = len(verdict.seen) - len(verdict.v3_ids)
    with capsys.disabled():
        print(f"\nzombie fencing: {len(verdict.stored)} inputs ({poison} poison), lost {len(verdict.lost)}, "
              f"duplicates {verdict.duplicates}, DLQ {dlq}")
    assert len(verdict.stored) == n + poison
    assert verdict.lost == [] and verdict.duplicates == 0
    assert len(verdict.v3_ids) == n and dlq == poison
    assert verdict.dedup_ids == set(verdict.v3_ids)


def test_refused_on_the_embedded_broker(broker, tmp_path: Path, dev_keys) -> None:
    """No transactions on the embedded broker: the worker does not start, and says so in one line."""
    with pytest.raises(ConfigError, match="exactly_once needs Kafka transactions, and the embedded broker has none; "
                                          "use at_least_once"):
        make_app("x", broker.bootstrap, tmp_path / "d", embedded=True, processing_guarantee="exactly_once")
    topo = make_topology(tmp_path, dev_keys, partitions=1)
    env = {"PRISM_TOPOLOGY": str(tmp_path / "topology.yaml"), "PRISM_BOOTSTRAP": broker.bootstrap,
           "PRISM_DATA_DIR": str(tmp_path / "data"), "PRISM_EMBEDDED": "1",
           "PRISM_PROCESSING_GUARANTEE": "exactly_once"}
    worker = WorkerProcess(TARGET, log_path=tmp_path / "w.log", env=env)
    with pytest.raises(RuntimeError, match="exited with status 2"):
        worker.start(timeout=60)
    lines = [line for line in (tmp_path / "w.log").read_text().splitlines() if "exactly_once" in line]
    assert len(lines) == 1 and lines[0].startswith("error [bad_config]"), lines
    assert topo.processing_guarantee == "at_least_once"  # the default


def test_a_cluster_without_transactions_is_refused(broker) -> None:
    """A Kafka-protocol cluster that refuses InitProducerId (here the embedded one, reached as a
    cluster): the start-up probe refuses exactly_once in one line instead of downgrading."""
    with pytest.raises(ConfigError) as err:
        check_transactions(broker.bootstrap, f"probe-{uuid.uuid4().hex[:6]}", timeout=10)
    text = str(err.value)
    assert "\n" not in text and "refused them" in text and "use at_least_once" in text, text


@pytest.mark.parametrize("guarantee", ["exactly_once", "at_least_once"])
@pytest.mark.parametrize("processes", [2, 3])
async def test_rebalance_kill_one_add_one(kafka, tmp_path: Path, dev_keys, capsys, processes: int,
                                          guarantee: str) -> None:
    """`prism run --processes N` (N = 2, 3) with the topology's `processing_guarantee`: kill -9 of one
    worker (its partitions go to the survivors: a rebalance, and the new owners' producers fence the
    dead one's transactional ids), the supervisor adds it back (another rebalance). ROUNDS kills,
    rotating the victim. exactly_once: 0 lost, 0 duplicates read_committed, the dedup table matches."""
    from tests.worker.test_rebalance_e2e import PRODUCED, _status, _wait_seen
    from tests.worker.test_run_e2e import start_prism_run, stop, wait_for

    bootstrap = kafka.bootstrap
    topo = make_topology(tmp_path, dev_keys, partitions=4, processing_guarantee=guarantee)
    source = topo.sources[0].topic
    await ensure_topics(bootstrap, topo.topics())
    await _produce_backlog(bootstrap, source, PRODUCED)
    data, log = tmp_path / "data", tmp_path / "supervisor.log"
    status_file = data / topo.name / "supervisor.json"
    watch = await _committed_watcher(bootstrap, source)
    proc = start_prism_run(["--topology", str(tmp_path / "topology.yaml"), "--data-dir", str(data),
                            "--no-dev-keys", "--processes", str(processes)], log, {"PRISM_BROKER_URL": bootstrap})
    kills: list[int] = []
    try:
        await asyncio.to_thread(wait_for, lambda: (s := _status(status_file)) and s["ready"] and s, 300,
                                f"{processes} workers ready", proc, log)
        for round_ in range(ROUNDS):
            await watch.poll()
            target = 1_000 if round_ == 0 else min(PRODUCED, len(watch.seen) + 1_000)
            await _wait_seen(watch, target, 300, proc, log)
            st = _status(status_file)
            assert st is not None and st["ready"], st
            victim = st["children"][round_ % processes]
            kills.append(PRODUCED - len(watch.seen))
            os.kill(victim["pid"], 9)
            await asyncio.to_thread(
                wait_for, lambda v=victim, r=round_: (s := _status(status_file)) and s["ready"]
                and s["children"][v["index"]]["pid"] not in (None, v["pid"]) and s["restarts"] >= r + 1 and s,
                300, "the killed worker restarted and ready", proc, log)
        await _wait_seen(watch, PRODUCED, 400, proc, log)
        survivors = _status(status_file)
        await asyncio.sleep(1)
    finally:
        code = await asyncio.to_thread(stop, proc, 180)
        await watch.consumer.stop()
    app_id = f"prism-{topo.name}"
    verdict = _Verdict(bootstrap, source, app_id)
    ids = set(verdict.v3_ids)
    with capsys.disabled():
        print(f"\n{guarantee} rebalance, {processes} processes, {len(kills)} kill(s) (in flight {kills}): "
              f"{PRODUCED} inputs, lost {len(verdict.lost)}, duplicates {verdict.duplicates}, dedup table "
              f"{len(verdict.dedup_ids)} ids for {len(ids)} output ids, restarts {survivors and survivors['restarts']}")
    assert kills[0] >= 20_000, kills
    assert code == 0, log.read_text(errors="replace")[-4000:]
    assert len(verdict.stored) == PRODUCED and verdict.lost == []
    assert len(ids) == PRODUCED
    if guarantee == "exactly_once":
        assert verdict.duplicates == 0
        assert verdict.dedup_ids == ids


@pytest.mark.parametrize("guarantee", ["exactly_once", "at_least_once"])
async def test_broker_leader_kill(kafka_cluster, tmp_path: Path, dev_keys, capsys, guarantee: str) -> None:
    """Three brokers (RF 3, min ISR 2): kill -9 of the node leading the most source / `.v3`
    partitions while a worker works through the backlog, the node back after a while. ROUNDS kills.
    A transaction the failure makes fail is aborted and the worker stops; it is started again here
    (what the supervisor does) and the batch is read again. exactly_once: 0 lost, 0 duplicates."""
    cluster = kafka_cluster
    bootstrap = cluster.bootstrap
    results = []
    for round_ in range(ROUNDS):
        cluster.wait_in_sync()
        tmp = tmp_path / f"round-{round_}"
        tmp.mkdir()
        topo = make_topology(tmp, dev_keys, partitions=4)
        source = topo.sources[0].topic
        await ensure_topics(bootstrap, topo.topics(), replication_factor=3, configs=topo.topic_configs())
        await _produce_backlog(bootstrap, source)
        app_id = f"eos-l-{uuid.uuid4().hex[:8]}"
        env = {"PRISM_TOPOLOGY": str(tmp / "topology.yaml"), "PRISM_BOOTSTRAP": bootstrap,
               "PRISM_DATA_DIR": str(tmp / "data"), "PRISM_APP_ID": app_id, "PRISM_BROKER_URL": bootstrap,
               "PRISM_REPLICATION_FACTOR": "3", "PRISM_PROCESSING_GUARANTEE": guarantee}
        watch = await _committed_watcher(bootstrap, source)
        workers = [WorkerProcess(TARGET, log_path=tmp / "w0.log", env=env)]
        try:
            workers[0].start(timeout=120)
            await watch.wait_until(2_000, 120, workers[0])
            leads: Counter[int] = Counter(cluster.leader(t, p) for t in (source, source + ".v3") for p in range(4))
            victim = leads.most_common(1)[0][0]
            in_flight = N - len(watch.seen)
            cluster.kill(victim)
            await asyncio.sleep(10)  # under load with one broker down
            # from this (the main) thread: a node's parent-death signal follows the thread that
            # started it, and a thread-pool thread that exits would take the restarted broker down
            cluster.start_node(victim)
            deadline = time.monotonic() + 300
            while len(watch.seen) < N and time.monotonic() < deadline:
                if not workers[-1].running:  # stopped on an aborted transaction: start it again
                    workers.append(WorkerProcess(TARGET, log_path=tmp / f"w{len(workers)}.log", env=env))
                    workers[-1].start(timeout=180)
                await watch.poll()
            await asyncio.sleep(1.0)
        finally:
            for w in workers:
                w.stop(timeout=60)
            await watch.consumer.stop()
        verdict = _Verdict(bootstrap, source, app_id)
        ids = set(verdict.v3_ids)
        results.append(verdict)
        with capsys.disabled():
            print(f"\n{guarantee} broker leader kill round {round_ + 1}/{ROUNDS}: node {victim}, {N} inputs, "
                  f"{in_flight} in flight, lost {len(verdict.lost)}, duplicates {verdict.duplicates}, "
                  f"worker restarts {len(workers) - 1}, dedup table {len(verdict.dedup_ids)} ids for {len(ids)}")
        assert len(verdict.stored) == N and verdict.lost == []
        assert len(ids) == N
        if guarantee == "exactly_once":
            assert verdict.duplicates == 0
            assert verdict.dedup_ids == ids


def test_prism_run_refuses_exactly_once_on_the_embedded_broker(tmp_path: Path, dev_keys) -> None:
    """`prism run --processing-guarantee exactly_once` without a Kafka cluster: one error line, exit
    status non-zero, before any broker is started."""
    import subprocess
    import sys

    from tests.worker.conftest import ROOT

    make_topology(tmp_path, dev_keys, partitions=1)
    env = {k: v for k, v in os.environ.items() if k != "PRISM_BROKER_URL"}
    res = subprocess.run([sys.executable, "-m", "app.cli.main", "run", "--topology", str(tmp_path / "topology.yaml"),
                          "--data-dir", str(tmp_path / "data"), "--processing-guarantee", "exactly_once"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    out = res.stdout + res.stderr
    assert res.returncode != 0, out
    lines = [line for line in out.splitlines() if "exactly_once" in line]
    assert len(lines) == 1 and "the embedded broker has none; use at_least_once" in lines[0], out
    assert not (tmp_path / "data" / "broker").exists()  # refused before a broker was started


class _OpenTransactions:
    """Which partitions of `topic` have an open transaction: the last stable offset (what a
    read_committed ListOffsets answers) behind the high watermark. Both consumers stay
    connected, so one look takes a few milliseconds - the worker stays frozen only that long
    when nothing is open, and the next freeze lands in a different moment of its cycle."""

    def __init__(self, bootstrap: str, topic: str, parts: int) -> None:
        from aiokafka.structs import TopicPartition

        self.tps = [TopicPartition(topic, p) for p in range(parts)]
        self.consumers = {isolation: AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None,
                                                      isolation_level=isolation)
                          for isolation in ("read_committed", "read_uncommitted")}

    async def __aenter__(self) -> _OpenTransactions:
        for c in self.consumers.values():
            await c.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        for c in self.consumers.values():
            await c.stop()

    async def look(self) -> list[int]:
        ends = {isolation: await c.end_offsets(self.tps) for isolation, c in self.consumers.items()}
        return [tp.partition for tp in self.tps if ends["read_committed"][tp] < ends["read_uncommitted"][tp]]


async def test_a_transaction_that_times_out_is_aborted_and_its_batch_read_again(kafka, tmp_path: Path, dev_keys,
                                                                                capsys) -> None:
    """The worker is frozen (SIGSTOP) with a transaction open until the broker aborts it for its
    `transaction_timeout_ms`; resumed, the worker's next step in that transaction is refused, it
    stops with one error line, and the restarted worker reads the batch again: 0 lost, 0
    duplicates, the dedup table = the outputs."""
    bootstrap = kafka.bootstrap
    topo = make_topology(tmp_path, dev_keys, partitions=4, transaction_timeout_ms=2_000)
    source = topo.sources[0].topic
    await ensure_topics(bootstrap, topo.topics())
    app_id = f"eos-t-{uuid.uuid4().hex[:8]}"
    env = {"PRISM_TOPOLOGY": str(tmp_path / "topology.yaml"), "PRISM_BOOTSTRAP": bootstrap,
           "PRISM_DATA_DIR": str(tmp_path / "data"), "PRISM_APP_ID": app_id, "PRISM_BROKER_URL": bootstrap,
           "PRISM_PROCESSING_GUARANTEE": "exactly_once"}
    n = 12_000
    await _produce_backlog(bootstrap, source, n)
    watch = await _committed_watcher(bootstrap, source)
    worker = WorkerProcess(TARGET, log_path=tmp_path / "w1.log", env=env)
    again = WorkerProcess(TARGET, log_path=tmp_path / "w2.log", env=env)
    caught: list[int] = []
    freezes = committing = 0
    try:
        worker.start(timeout=90)
        await watch.wait_until(1_000, 120, worker)
        # Freeze until a transaction is caught open. Each freeze lands at a random moment of the
        # worker's cycle (chain, then a transaction of ~10-40 ms per partition), so it can take a
        # few; the backlog is topped up so transactions keep running until one is caught.
        async with _OpenTransactions(bootstrap, source + ".v3", 4) as probe:
            deadline = time.monotonic() + 120
            while not caught:
                assert time.monotonic() < deadline, f"no transaction was open in {freezes} freezes"
                if len(watch.seen) > n - 3_000:
                    await _produce_backlog(bootstrap, source, 4_000)
                    n += 4_000
                committed = len(watch.seen)
                os.kill(worker.pid, signal.SIGSTOP)
                freezes += 1
                caught = await probe.look()
                if caught:
                    # A transaction whose commit the worker sent just before the freeze also shows
                    # open, until the coordinator has written its markers: the broker never aborts
                    # that one, and the resumed worker rightly carries on. Only a transaction still
                    # open well after the freeze (and well inside its 2 s) is the frozen worker's.
                    await asyncio.sleep(0.8)
                    caught = sorted(set(caught) & set(await probe.look()))
                    committing += not caught  # open at the first look only: it was committing
                if caught:
                    # the broker aborts it once its 2 s are up: the stable offset reaches the high watermark
                    aborted_by = time.monotonic() + 60
                    while await probe.look():
                        assert time.monotonic() < aborted_by, "the broker did not abort the timed-out transaction"
                        await asyncio.sleep(0.2)
                os.kill(worker.pid, signal.SIGCONT)
                if not caught:  # one more transaction committed: the next freeze is in a later cycle
                    await watch.wait_until(committed + 1, 60, worker)
        resumed_at = len(watch.seen)
        log = await _stopped_by_an_aborted_transaction(
            worker, tmp_path / "w1.log",
            lambda: f"open on {caught} at freeze {freezes}; {len(watch.seen) - resumed_at} records committed since")
        again.start(timeout=120)
        await watch.wait_until(n, 180, again)
        await asyncio.sleep(1.0)
    finally:
        worker.kill()
        again.stop()
        await watch.consumer.stop()
    verdict = _Verdict(bootstrap, source, app_id)
    reason = next((line for line in log.splitlines() if "exactly_once: the transaction of a batch" in line), "")
    with capsys.disabled():
        print(f"\ntransaction timeout: open on .v3 partitions {caught} when frozen (freeze {freezes}; {committing} "
              f"caught committing, let go); {reason.strip()[-200:]}; "
              f"lost {len(verdict.lost)}, duplicates {verdict.duplicates}, .v3 records read_uncommitted "
              f"{verdict.v3_uncommitted}")
    assert verdict.lost == [] and verdict.duplicates == 0
    assert len(verdict.v3_ids) == n and verdict.v3_uncommitted > n  # the aborted batch's records are there
    assert verdict.dedup_ids == set(verdict.v3_ids)

"""exactly_once from the source topic to the Delta table, under kill -9 at random moments (issue 23).

The chain: source topic -> the worker with `processing_guarantee: exactly_once` (Kafka
transactions) -> `.v3` -> the worker's archive tap (`read_committed`, a roll every 1 s) ->
archive rolls -> `prism lake compact` -> Delta table.

* The worker is killed with SIGKILL while one of its transactions is open (the test waits for
  a `.v3` partition whose last stable offset is behind its high watermark, kills, and checks the
  transaction is still open after the kill), and started again; its successor's producer aborts
  what it left. Each kill also cuts an archive roll short.
* `prism lake compact --max-files 1` (one Delta commit per archive file) is then killed with
  SIGKILL 0-1 s after its 1st or 2nd commit (chosen at random) - mid decode, mid write, mid
  commit - three times; each killed run leaves work for the next. Those kills need archive files
  to cut into (at least three per kill): the backlog makes as many rolls as seconds the worker
  takes, which a faster worker made too few, so after it more inputs follow in waves of `WAVE`,
  each archived before the next (a roll of its own), until the archive holds enough files.

Then one compaction runs to the end, and the table must hold:

* exactly one row per message id committed to `.v3` (read back `read_committed` by librdkafka),
  and no other id;
* no row from an aborted transaction: every row's `.v3` coordinates (`source_partition`,
  `source_offset`) are those of a committed record carrying that row's message id - and aborted
  records do exist on `.v3` (read_uncommitted), so the check is not empty.

The random moments come from a seeded generator (``PRISM_CHAIN_SEED``, printed) so that a
failing run can be repeated.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka.structs import TopicPartition

from app.broker.admin import ensure_topics
from app.broker.embedded import with_parent_death_signal
from app.lake.archive import Archive
from app.worker.faust_app import WorkerProcess
from tests.worker import independent
from tests.worker.conftest import ROOT, make_topology
from tests.worker.test_crash_e2e import ArchiveWatcher, _produce_backlog

PARTITIONS = 4
#: inputs produced up front, for the worker kills to cut into
BACKLOG = 12_000
#: inputs per wave after the backlog, while the archive has too few files for the compaction kills
WAVE = 500
WORKER_KILLS = 3
COMPACT_KILLS = 3
#: Archive rolls before the compaction kills (each run commits one per Delta commit). A killed
#: run commits 1-2 files, then up to a second more of them before its SIGKILL: with 3 rolls a
#: kill (9), the third run once found so few left that it finished before it could be killed
#: (exactly_once's larger per-partition transactions made the rolls fewer). 6 a kill leaves work.
ROLLS_NEEDED = 6 * COMPACT_KILLS
TARGET = "app.worker.pipeline:app_from_env"
SEED = int(os.environ.get("PRISM_CHAIN_SEED", "20261127"))


class OpenTransactions:
    """Which `.v3` partitions have an open transaction: a read_committed ListOffsets answers the
    last stable offset, a read_uncommitted one the high watermark; they differ while one is open."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        self.committed = AIOKafkaConsumer(bootstrap_servers=bootstrap, isolation_level="read_committed")
        self.uncommitted = AIOKafkaConsumer(bootstrap_servers=bootstrap, isolation_level="read_uncommitted")

    async def start(self) -> None:
        await self.committed.start()
        await self.uncommitted.start()

    async def stop(self) -> None:
        await self.committed.stop()
        await self.uncommitted.stop()

    async def open(self) -> list[int]:
        stable, high = await asyncio.gather(self.committed.end_offsets(self.tps), self.uncommitted.end_offsets(self.tps))
        return [tp.partition for tp in self.tps if stable[tp] < high[tp]]


def _compact_cmd(archive: Path, table: str) -> list[str]:
    return with_parent_death_signal([sys.executable, "-m", "app.cli.main", "lake", "compact", str(archive), table,
                                     "--master", "local[2]", "--max-files", "1", "--json"])


def _archived_rows(archive: Path, topic: str) -> int:
    """Rows of `topic` in the archive's committed rolls (every manifest of every writer): what a
    compaction reads. Committed rolls never overlap (each continues after the last committed
    offset; a roll a kill cut short is discarded and read again), so this counts records once."""
    if not archive.is_dir():
        return 0
    a = Archive(str(archive))
    return sum(f.rows for w in a.writers() for m in a.manifests(w) for f in m.files if f.source_topic == topic)


def _archive_files(archive: Path) -> int:
    """Parquet files under the archive: what `prism lake compact --max-files 1` commits one by one."""
    return len(list(archive.rglob("*.parquet")))


async def _wait_archived(archive: Path, topic: str, n: int, timeout: float, worker: WorkerProcess) -> None:
    """Until the archive tap has committed `n` records of `topic` in its rolls (a roll every 1 s)."""
    deadline = time.monotonic() + timeout
    while (rows := _archived_rows(archive, topic)) < n:
        if time.monotonic() > deadline:
            raise AssertionError(f"the archive tap committed {rows} of {n} {topic} records in {timeout}s\n"
                                 f"{worker.log_tail(4000)}")
        await asyncio.sleep(0.1)


def _commits(table: str) -> int:
    log = Path(table) / "_delta_log"
    return len(list(log.glob("*.json"))) if log.is_dir() else 0


async def _killed_compactions(archive: Path, table: str, rng: random.Random, log: Path) -> list[str]:
    """Compactions until `COMPACT_KILLS` of them were SIGKILLed mid-work (at most 4x as many
    runs): each is killed 0-1 s after its 1st or 2nd Delta commit (chosen at random), so
    every killed run leaves work for the next. Returns what each kill cut short."""
    kills: list[str] = []
    for _ in range(4 * COMPACT_KILLS):
        if len(kills) >= COMPACT_KILLS:
            break
        before, commits = _commits(table), rng.randint(1, 2)
        with open(log, "ab") as out:
            proc = subprocess.Popen(_compact_cmd(archive, table), cwd=ROOT, stdin=subprocess.DEVNULL, stdout=out,
                                    stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 180
        while proc.poll() is None and _commits(table) < before + commits and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if proc.poll() is None:
            delay = rng.uniform(0.0, 1.0)
            await asyncio.sleep(delay)
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
                kills.append(f"{delay:.2f}s after commit {_commits(table) - 1}")
        await asyncio.to_thread(proc.wait)
    return kills


@pytest.mark.timeout(900)
async def test_kill_9_of_the_worker_and_the_compaction_one_row_per_committed_id(kafka, tmp_path: Path, dev_keys,
                                                                                capsys) -> None:
    rng = random.Random(SEED)
    archive = tmp_path / "archive"
    table = str(tmp_path / "lake" / "envelopes")
    topo = make_topology(tmp_path, dev_keys, partitions=PARTITIONS,
                         archive={"enabled": True, "path": str(archive), "roll_interval_s": 1})
    source = topo.sources[0].topic
    await ensure_topics(kafka.bootstrap, topo.topics())
    await _produce_backlog(kafka.bootstrap, source, BACKLOG)
    produced = BACKLOG
    # One stable archive writer id, as a StatefulSet pod has: each restarted worker continues (and
    # cleans up) the rolls its killed predecessor left.
    env = {"PRISM_TOPOLOGY": str(tmp_path / "topology.yaml"), "PRISM_BOOTSTRAP": kafka.bootstrap,
           "PRISM_DATA_DIR": str(tmp_path / "data"), "PRISM_APP_ID": f"chain-{uuid.uuid4().hex[:8]}",
           "PRISM_BROKER_URL": kafka.bootstrap, "PRISM_PROCESSING_GUARANTEE": "exactly_once",
           "PRISM_ARCHIVE": str(archive), "PRISM_ARCHIVE_WRITER_ID": "chain-0"}
    watch = ArchiveWatcher(kafka.bootstrap, {source + ".dlq": PARTITIONS, source + ".v3": PARTITIONS})
    watch.consumer = AIOKafkaConsumer(bootstrap_servers=kafka.bootstrap, group_id=None, enable_auto_commit=False,
                                      isolation_level="read_committed")
    await watch.start()
    txns = OpenTransactions(kafka.bootstrap, source + ".v3")
    await txns.start()
    compact_log = tmp_path / "compact.log"
    worker_kills: list[dict[str, object]] = []
    workers = [WorkerProcess(TARGET, log_path=tmp_path / f"w{i}.log", env=env) for i in range(WORKER_KILLS + 1)]
    try:
        workers[0].start(timeout=120)
        for i in range(WORKER_KILLS):
            # a random amount of progress, then the first moment a transaction is open
            await watch.wait_until(min(BACKLOG - 2_000, len(watch.seen) + rng.randint(300, 1_500)), 300, workers[i])
            deadline = time.monotonic() + 30
            while not await txns.open() and time.monotonic() < deadline:
                pass
            workers[i].kill()  # kill -9: the open transaction stays open, an archive roll is cut short
            worker_kills.append({"at": len(watch.seen), "left_open": await txns.open()})
            workers[i + 1].start(timeout=120)
        await watch.wait_until(BACKLOG, 400, workers[-1])
        for _ in range(ROLLS_NEEDED):  # each wave archived before the next: a roll of its own
            await _wait_archived(archive, source + ".v3", sum(watch.v3_ids.values()), 60, workers[-1])
            if _archive_files(archive) >= ROLLS_NEEDED:
                break
            await _produce_backlog(kafka.bootstrap, source, WAVE)
            produced += WAVE
            await watch.wait_until(produced, 120, workers[-1])
        # the tap takes the tail: every record read from .v3 is in a committed roll before the stop
        tail_started = time.monotonic()
        await _wait_archived(archive, source + ".v3", sum(watch.v3_ids.values()), 60, workers[-1])
        tail_s = time.monotonic() - tail_started
        code = workers[-1].stop(timeout=120)  # SIGTERM: the tap commits what it accepted
    finally:
        for w in workers:
            w.kill()
        await watch.consumer.stop()
        await txns.stop()
    assert code == 0, workers[-1].log_tail(4000)
    rolls = _archive_files(archive)
    assert rolls >= ROLLS_NEEDED, f"only {rolls} archive rolls: too few for the compaction kills"
    killed_compactions = await _killed_compactions(archive, table, rng, compact_log)
    # the last compaction runs to the end: whatever the killed ones left must not matter
    res = await asyncio.to_thread(subprocess.run, [*_compact_cmd(archive, table)[:-3], "--json"], cwd=ROOT,
                                  capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-4000:]

    committed = {(m.partition(), m.offset()): dict(m.headers() or [])["prism-message-id"].decode()
                 for m in independent.consume_all(kafka.bootstrap, source + ".v3", PARTITIONS, expected=produced,
                                                  timeout=90, read_committed=True)}
    # every record written, aborted ones too (read_uncommitted; `expected=0`: read to the end of each partition)
    written = len(independent.consume_all(kafka.bootstrap, source + ".v3", PARTITIONS, expected=0, timeout=90))
    from deltalake import DeltaTable

    rows = DeltaTable(table).to_pyarrow_table(columns=["message_id", "source_partition", "source_offset"]).to_pylist()
    ids = [r["message_id"] for r in rows]
    not_committed = [r for r in rows if committed.get((r["source_partition"], r["source_offset"])) != r["message_id"]]
    with capsys.disabled():
        print(f"\nexactly_once chain (seed {SEED}): {produced} inputs; worker kills {worker_kills}; compactions "
              f"killed {killed_compactions}; .v3 records written {written}, committed {len(committed)} "
              f"(aborted {written - len(committed)}); Delta rows {len(rows)}, distinct ids {len(set(ids))}, "
              f"table version {DeltaTable(table).version()}; the archive tap's tail committed in {tail_s:.1f}s")
    assert len(committed) == produced and len(set(committed.values())) == produced  # exactly once on .v3
    assert len(ids) == len(set(ids)), "a message id twice in the Delta table"
    assert set(ids) == set(committed.values())
    assert not_committed == [], not_committed[:10]  # no row of an aborted transaction
    assert any(k["left_open"] for k in worker_kills), worker_kills  # a kill did leave a transaction open
    assert written > len(committed), "no aborted records on .v3: the check above proved nothing"
    assert len(killed_compactions) == COMPACT_KILLS, killed_compactions

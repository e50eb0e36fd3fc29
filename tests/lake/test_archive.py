"""Archive sink: rolling by size and time, exactly-once offsets across crashes and restarts,
token stripping, and the same guarantees on an S3-compatible store (moto server)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections import Counter

import pyarrow.parquet as pq
import pytest

from app.errors import ArchiveError
from app.lake.archive import Archive, ArchiveSink, parse_data_file_name, read_archive_file
from tests.lake.conftest import TOKEN_CANARY, make_traffic, scan_for


class Crash(Exception):
    """Stands in for the process dying at a named point."""


def archived_offsets(location) -> Counter:
    """(topic, partition, offset) -> how many committed archive rows hold it."""
    archive = Archive(location)
    seen: Counter = Counter()
    for w in archive.writers():
        for m in archive.manifests(w):
            for f in m.files:
                t = read_archive_file(archive.store, f.path)
                assert t.num_rows == f.rows
                for tp, p, o in zip(t.column("source_topic").to_pylist(), t.column("source_partition").to_pylist(),
                                    t.column("source_offset").to_pylist(), strict=True):
                    seen[(tp, p, o)] += 1
    return seen


def expected_offsets(records) -> Counter:
    return Counter((r.source_topic, r.partition, r.offset) for r in records)


def test_rolls_by_size_and_names_carry_offset_ranges(tmp_path):
    traffic = make_traffic(300, dup_every=0)
    sink = ArchiveSink(str(tmp_path), writer_id="w1", max_file_bytes=20_000)
    sink.write(traffic.records)
    sink.close()
    archive = Archive(str(tmp_path))
    manifests = archive.manifests("w1")
    assert len(manifests) >= 3, "a 20 kB roll size must roll several times for ~100 kB of envelopes"
    assert [m.seq for m in manifests] == list(range(1, len(manifests) + 1))
    for m in manifests:
        for f in m.files:
            parsed = parse_data_file_name(f.path)
            assert parsed == {"writer": "w1", "seq": m.seq, "source_topic": f.source_topic, "partition": f.partition,
                              "first_offset": f.first_offset, "last_offset": f.last_offset}
            offsets = pq.read_table(os.path.join(tmp_path, f.path), columns=["source_offset"]).column(0).to_pylist()
            assert (min(offsets), max(offsets)) == (f.first_offset, f.last_offset)
            assert f.path.startswith(f"date={f.date}/namespace=orders/topic={f.topic}/")
    assert archived_offsets(str(tmp_path)) == expected_offsets(traffic.records)
    # the cumulative offsets of the last manifest are what a restart needs
    assert archive.committed_offsets() == {("prism.archive", 0): 149, ("prism.archive", 1): 149}


def test_rolls_by_time(tmp_path):
    now = [1000.0]
    traffic = make_traffic(10, dup_every=0)
    sink = ArchiveSink(str(tmp_path), max_file_age_s=30, clock=lambda: now[0])
    assert sink.write(traffic.records[:5]) == 5
    assert sink.maybe_roll() is None and sink.buffered_records == 5
    now[0] += 29.9
    assert sink.maybe_roll() is None
    now[0] += 0.2
    manifest = sink.maybe_roll()
    assert manifest is not None and sum(f.rows for f in manifest.files) == 5
    assert sink.buffered_records == 0 and sink.seconds_until_due() is None


def test_crash_between_files_and_manifest_loses_nothing_and_duplicates_nothing(tmp_path):
    traffic = make_traffic(120, dup_every=0)
    first, second = traffic.records[:60], traffic.records[60:]
    with ArchiveSink(str(tmp_path), writer_id="w1") as sink:
        sink.write(first)

    def crash(point: str) -> None:
        raise Crash(point)

    doomed = ArchiveSink(str(tmp_path), writer_id="w1", fault=crash)
    doomed.write(second)
    with pytest.raises(Crash):
        doomed.flush()
    # the roll's data files are on disk, but no manifest names them
    on_disk = {os.path.relpath(os.path.join(d, n), tmp_path) for d, _, ns in os.walk(tmp_path) for n in ns
               if n.endswith(".parquet")}
    committed = {f.path for m in Archive(str(tmp_path)).manifests("w1") for f in m.files}
    assert on_disk - committed, "the crashed roll should have left orphan files behind"

    restarted = ArchiveSink(str(tmp_path), writer_id="w1")
    offsets = restarted.committed_offsets()
    assert restarted.stats.orphans_removed == len(on_disk - committed)
    # the consumer seeks to offset + 1 per partition and gets the rest again (and some replays)
    redelivered = [r for r in traffic.records if r.offset > offsets.get((r.source_topic, r.partition), -1)]
    assert redelivered == second
    restarted.write(traffic.records)  # replaying everything is harmless too
    restarted.close()
    assert restarted.stats.skipped_already_committed == len(first)
    assert archived_offsets(str(tmp_path)) == expected_offsets(traffic.records)
    left = {os.path.relpath(os.path.join(d, n), tmp_path) for d, _, ns in os.walk(tmp_path) for n in ns
            if n.endswith(".parquet")}
    assert left == {f.path for m in Archive(str(tmp_path)).manifests("w1") for f in m.files}


def test_sigkill_at_a_random_point_then_resume_is_exactly_once(tmp_path):
    n = 3000
    root = str(tmp_path / "arch")
    child = subprocess.Popen([sys.executable, "-m", "tests.lake.archive_child", root, str(n)],
                             stdout=subprocess.PIPE, text=True, cwd=os.getcwd())
    assert child.stdout.readline().strip() == "ready"
    deadline = time.monotonic() + 30
    mdir = os.path.join(root, "_manifest", "child")
    while time.monotonic() < deadline:  # let a few rolls commit, then kill without warning
        if os.path.isdir(mdir) and sum(not x.endswith("pending.json") for x in os.listdir(mdir)) >= 3:
            break
        time.sleep(0.01)
    child.send_signal(signal.SIGKILL)
    child.wait()
    assert child.returncode == -signal.SIGKILL

    traffic = make_traffic(n, dup_every=0)
    sink = ArchiveSink(root, writer_id="child")
    offsets = sink.committed_offsets()
    assert offsets, "some rolls must have committed before the kill"
    resume = [r for r in traffic.records if r.offset > offsets.get((r.source_topic, r.partition), -1)]
    assert len(resume) < len(traffic.records)
    sink.write(resume)
    sink.close()
    assert archived_offsets(root) == expected_offsets(traffic.records)


def test_redelivery_without_restart_is_skipped_and_tokens_are_stripped(tmp_path):
    traffic = make_traffic(40, dup_every=0)
    commits = []
    sink = ArchiveSink(str(tmp_path), on_commit=commits.append)
    assert sink.write(traffic.records) == len(traffic.records)
    assert sink.write(traffic.records[:10]) == 0, "a rebalance replay of buffered offsets is dropped"
    sink.close()
    assert len(commits) == 1 and commits[0].offsets == sink.committed_offsets()
    assert sink.stats.tokens_stripped == 8  # every fifth of 40 envelopes carried one
    assert scan_for(str(tmp_path), [TOKEN_CANARY.encode()]) == []


def test_undecodable_bytes_are_archived_not_lost(tmp_path):
    traffic = make_traffic(20, dup_every=0, corrupt_at=(5,))
    with ArchiveSink(str(tmp_path)) as sink:
        sink.write(traffic.records)
    assert sink.stats.undecodable == 1
    rows = [r for m in Archive(str(tmp_path)).manifests("default") for f in m.files
            for r in read_archive_file(Archive(str(tmp_path)).store, f.path).to_pylist() if r["header_error"]]
    assert len(rows) == 1 and (rows[0]["source_topic"], rows[0]["source_partition"], rows[0]["source_offset"]) \
        in traffic.corrupt_offsets
    undecodable_file = next(f for m in Archive(str(tmp_path)).manifests("default") for f in m.files if f.namespace is None)
    assert rows[0]["message_id"] is None and "namespace=__HIVE_DEFAULT_PARTITION__" in undecodable_file.path


async def test_consume_async_iterable_rolls_on_idle_time(tmp_path):
    traffic = make_traffic(30, dup_every=0)
    sink = ArchiveSink(str(tmp_path), max_file_age_s=0.2)
    rolled_while_idle = asyncio.Event()
    sink.on_commit = lambda m: rolled_while_idle.set()

    async def source():
        yield traffic.records[:10]          # a batch
        for r in traffic.records[10:15]:    # single records
            yield r
        await asyncio.wait_for(rolled_while_idle.wait(), 5)  # idle: the time-based roll must fire
        yield traffic.records[15:]

    await sink.consume(source())
    assert sink.stats.rolls == 2
    assert archived_offsets(str(tmp_path)) == expected_offsets(traffic.records)


def test_invalid_writer_id_is_refused(tmp_path):
    with pytest.raises(ArchiveError, match="writer_id"):
        ArchiveSink(str(tmp_path), writer_id="a/b")


def test_s3_archive_restart_and_idempotency(s3_url):
    traffic = make_traffic(200, dup_every=0)

    def crash(point: str) -> None:
        raise Crash(point)

    with ArchiveSink(s3_url, writer_id="s3w", max_file_bytes=30_000) as sink:
        sink.write(traffic.records[:100])
    doomed = ArchiveSink(s3_url, writer_id="s3w", fault=crash)
    doomed.write(traffic.records[100:])
    with pytest.raises(Crash):
        doomed.flush()

    sink = ArchiveSink(s3_url, writer_id="s3w", max_file_bytes=30_000)
    offsets = sink.committed_offsets()
    assert sink.stats.orphans_removed > 0
    sink.write(r for r in traffic.records if r.offset > offsets[(r.source_topic, r.partition)])
    sink.close()
    assert archived_offsets(s3_url) == expected_offsets(traffic.records)
    store = Archive(s3_url).store
    listed = {f.path for f in store.list_files() if f.path.endswith(".parquet")}
    assert listed == {f.path for m in Archive(s3_url).manifests("s3w") for f in m.files}
    assert not [f for f in store.list_files("_manifest") if f.path.endswith(".pending.json")]

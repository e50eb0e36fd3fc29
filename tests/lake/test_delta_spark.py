"""The native delta-spark writer, with the real Delta jars (fetched once by Maven into the cache):

* `prism lake compact --writer delta-spark` writes the same table as the delta-rs path - rows,
  schema, partitioning, statistics, app transactions - and either writer continues a table the
  other made without redoing or losing a batch; optimize and vacuum work on it.
* two `prism lake compact --writer delta-spark` processes on one table at once, with overlapping
  batches: both finish, Delta's conflict detection makes the loser re-plan, no id is lost or doubled.
* the jar cache: verified, offline once cached, and where the jars cannot be had the message says why.

The test session's Spark has no Delta jars (and cannot get them after its start), so delta-spark
runs in child processes: one session for several compactions (tests/lake/delta_child.py), and the
real CLI for the concurrent test."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from app.lake import delta_jars, maintenance
from app.lake.archive import Archive, ArchiveRecord, ArchiveSink
from app.lake.compact import Compactor, app_id_for
from app.lake.delta_jars import DeltaJarsUnavailable
from app.lake.writers import make_writer
from tests.lake.conftest import make_traffic
from tests.support import require

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def jars() -> delta_jars.DeltaJars:
    """The Delta jars from the user's cache (fetched by Maven on the first run on a machine)."""
    require(shutil.which("java") is not None, "Java 17+ for Spark")
    try:
        return delta_jars.resolve()
    except DeltaJarsUnavailable as exc:
        require(False, f"the Delta jars: {exc}")
        raise


def _run_child(jobs: list[list[str]]) -> list[dict[str, Any]]:
    proc = subprocess.run([sys.executable, "-m", "tests.lake.delta_child", json.dumps(jobs)], cwd=ROOT,
                          capture_output=True, text=True, timeout=500)
    assert proc.returncode == 0, f"delta child failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    for r in results:
        assert r["exit_code"] == 0, r
    return results


def _json(result: dict[str, Any]) -> dict[str, Any]:
    return json.loads(result["stdout"][result["stdout"].index("{"):])


def _rows(table: str) -> list[dict]:
    return sorted(DeltaTable(table).to_pyarrow_table().to_pylist(), key=lambda r: r["message_id"])


def _ids(table: str) -> list[str]:
    return DeltaTable(table).to_pyarrow_table(columns=["message_id"]).column(0).to_pylist()


def _table_stats(table: str) -> dict[tuple, dict[str, Any]]:
    """Per partition: rows, and per column the min of the files' minValues, the max of their
    maxValues and the sum of their null counts (file boundaries differ between writers; these do not)."""
    actions = pa.table(DeltaTable(table).get_add_actions(flatten=True)).to_pylist()
    out: dict[tuple, dict[str, Any]] = {}
    for a in actions:
        key = (str(a["partition.date"]), a["partition.namespace"], a["partition.topic"])
        agg = out.setdefault(key, {"rows": 0, "min": {}, "max": {}, "nulls": {}, "files": 0})
        agg["rows"] += a["num_records"]
        agg["files"] += 1
        for k, v in a.items():
            kind, _, col = k.partition(".")
            if kind == "min" and v is not None:
                agg["min"].setdefault(col, []).append(v)
            elif kind == "max" and v is not None:
                agg["max"].setdefault(col, []).append(v)
            elif kind == "null_count" and v is not None:
                agg["nulls"][col] = agg["nulls"].get(col, 0) + v
    for agg in out.values():
        agg["min"] = {c: min(vs) for c, vs in agg["min"].items()}
        agg["max"] = {c: max(vs) for c, vs in agg["max"].items()}
    return out


@pytest.fixture(scope="module")
def made(jars, spark, tmp_path_factory) -> dict[str, Any]:
    """An archive (two writers, duplicates within and across them); tables made by each writer,
    one begun by delta-rs and continued by delta-spark; all delta-spark work in ONE child session."""
    root = tmp_path_factory.mktemp("delta-spark")
    archive = str(root / "archive")
    main = make_traffic(160, seed=41)
    with ArchiveSink(archive, writer_id="w1", max_file_bytes=30_000) as sink:
        sink.write(main.records)
    other = make_traffic(30, seed=42, source_topic="prism.archive.eu", dup_every=0)
    with ArchiveSink(archive, writer_id="w2") as sink:  # the same envelopes again from another writer, too
        sink.write(other.records + [ArchiveRecord(r.envelope_bytes, "prism.archive.eu", 1, 1000 + i)
                                    for i, r in enumerate(main.records[:20])])
    t = {name: str(root / name) for name in ("rs", "spark", "rs-then-spark")}
    reference = Compactor(spark, archive, t["rs"], writer="delta-rs", max_files=4).run()
    first = Compactor(spark, archive, t["rs-then-spark"], writer="delta-rs", max_files=4)
    plan = first.pending()
    first.run(plan=[(plan[0][0], plan[0][1][:1])])  # w1's first batch only
    results = _run_child([
        ["compact", archive, t["spark"], "--writer", "delta-spark", "--max-files", "4", "--json"],
        ["compact", archive, t["rs-then-spark"], "--writer", "auto", "--max-files", "4", "--json"],
        ["compact", archive, t["spark"], "--writer", "delta-spark", "--json"],  # a re-run: nothing to do
    ])
    return {"root": root, "archive": archive, "tables": t, "expected": main.ids | other.ids,
            "reference": reference, "results": results}


def test_delta_spark_writes_the_table_the_delta_rs_path_writes(made):
    t, results = made["tables"], made["results"]
    spark_run = _json(results[0])
    assert spark_run["writer"] == "delta-spark" and spark_run["exit_code"] == 0
    assert "writer: delta-spark" in results[0]["stderr"]
    assert spark_run["totals"] == made["reference"].to_dict()["totals"]

    # rows: every column of every row; one row per message id
    rows = _rows(t["spark"])
    assert len(rows) == len(made["expected"]) and rows == _rows(t["rs"])
    assert Counter(_ids(t["spark"])).most_common(1)[0][1] == 1

    # schema (types and nullability, message_id NOT NULL on both), partitioning, protocol
    a, b = DeltaTable(t["spark"]), DeltaTable(t["rs"])
    assert json.loads(a.schema().to_json()) == json.loads(b.schema().to_json())
    assert a.metadata().partition_columns == b.metadata().partition_columns == ["date", "namespace", "topic"]
    pa_, pb = a.protocol(), b.protocol()
    assert (pa_.min_reader_version, pa_.min_writer_version) == (pb.min_reader_version, pb.min_writer_version) == (1, 2)

    # app transactions: the same ids and versions, so either writer can continue the other's table
    archive = Archive(made["archive"])
    for w in ("w1", "w2"):
        assert a.transaction_version(app_id_for(w)) == b.transaction_version(app_id_for(w)) == \
            archive.manifest_seqs(w)[0][-1]

    # statistics: same rows per partition; where both writers record a column's min/max/null
    # count, they agree (delta-spark indexes the first 32 columns, the delta-rs path every
    # top-level primitive one and no max for strings over 32 characters)
    sa, sb = _table_stats(t["spark"]), _table_stats(t["rs"])
    assert sa.keys() == sb.keys()
    for part in sa:
        assert sa[part]["rows"] == sb[part]["rows"], part
        for kind in ("min", "max", "nulls"):
            common = sa[part][kind].keys() & sb[part][kind].keys()
            assert {c: sa[part][kind][c] for c in common} == {c: sb[part][kind][c] for c in common}, (part, kind)
        assert {"message_id", "published_at_ms", "published_at", "priority"} <= sa[part]["min"].keys() & \
            sb[part]["min"].keys()
        assert {"published_at_ms", "priority"} <= sa[part]["max"].keys() & sb[part]["max"].keys()


def test_either_writer_continues_the_others_table(spark, made):
    t, results = made["tables"], made["results"]
    # delta-spark continued a table delta-rs began: the batch delta-rs committed was not redone
    continued = _json(results[1])
    assert continued["writer"] == "delta-spark" and "auto: the Delta jars are on Spark's classpath" in \
        results[1]["stderr"]
    assert continued["batches"][0]["first_seq"] > 1
    assert _rows(t["rs-then-spark"]) == _rows(t["rs"])
    # a delta-spark re-run finds nothing to do; so does delta-rs on the delta-spark table
    assert _json(results[2])["batches"] == []
    version = DeltaTable(t["spark"]).version()
    assert Compactor(spark, made["archive"], t["spark"], writer="delta-rs").run().batches == []
    assert DeltaTable(t["spark"]).version() == version

    # new rolls: delta-rs continues the delta-spark table, equal to the delta-rs table continued too
    more = make_traffic(25, seed=43, day_ms=1_796_000_000_000, dup_every=0)
    with ArchiveSink(made["archive"], writer_id="w1") as sink:
        sink.write([ArchiveRecord(r.envelope_bytes, r.source_topic, r.partition, 10_000 + r.offset)
                    for r in more.records])
    added = Compactor(spark, made["archive"], t["spark"], writer="delta-rs").run()
    assert added.total("rows_written") == len(more.ids)
    Compactor(spark, made["archive"], t["rs"], writer="delta-rs").run()
    assert _rows(t["spark"]) == _rows(t["rs"])
    assert DeltaTable(t["spark"]).transaction_version(app_id_for("w1")) == \
        DeltaTable(t["rs"]).transaction_version(app_id_for("w1"))


def test_optimize_and_vacuum_on_the_delta_spark_table(made):
    table = str(made["root"] / "maint")
    shutil.copytree(made["tables"]["spark"], table)
    rows = _rows(table)
    before = maintenance.stats(table)
    out = maintenance.optimize(table)
    assert out["numFilesRemoved"] > 0
    after = maintenance.stats(table)
    assert after.rows == before.rows == len(rows) and after.files == after.partitions
    removed = maintenance.vacuum(table, retention_hours=0, force=True)["paths"]
    assert len([p for p in removed if p.endswith(".parquet")]) == out["numFilesRemoved"]  # (+ Hadoop's .crc files)
    assert _rows(table) == rows
    parts = _table_stats(table)
    assert all(p["files"] == 1 and "message_id" in p["min"] for p in parts.values())


def test_two_concurrent_compactions_of_one_table(jars, tmp_path):
    """Process A compacts writers east and west; process B, at the same time, a copy of west into
    the same table (the same app id and versions: two runs of one archive) - B's west batches
    overlap A's east batches in partitions and message ids. Both must finish; each id once."""
    east = make_traffic(90, seed=51, dup_every=0)
    west = make_traffic(60, seed=52, source_topic="prism.archive.w", dup_every=0)  # other source offsets
    shared = east.records[:30]  # archived by both writers: only dedup against the table catches them
    a_root, b_root = tmp_path / "archive-a", tmp_path / "archive-b"
    with ArchiveSink(str(a_root), writer_id="east", max_file_bytes=25_000) as sink:
        sink.write(east.records)
    with ArchiveSink(str(a_root), writer_id="west", max_file_bytes=25_000) as sink:
        sink.write(west.records + [ArchiveRecord(r.envelope_bytes, "prism.archive.w", 0, 5000 + i)
                                   for i, r in enumerate(shared)])
    (b_root / "_manifest").mkdir(parents=True)
    shutil.copytree(a_root / "_manifest" / "west", b_root / "_manifest" / "west")
    for m in Archive(str(a_root)).manifests("west"):
        for f in m.files:
            (b_root / f.path).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(a_root / f.path, b_root / f.path)
    table = str(tmp_path / "table")
    env = {**os.environ, "PRISM_SPARK_MASTER": "local[1]"}
    procs = [subprocess.Popen([sys.executable, "-m", "app.lake.compact", str(root), table, "--writer", "delta-spark",
                               "--max-files", "2", "--json"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
             for root in (a_root, b_root)]
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=500)
        replans = [ln for ln in err.splitlines() if "another writer committed first" in ln]
        assert p.returncode == 0, f"compaction failed ({p.returncode}):\n{replans}\n{out[-2000:]}\n{err[-5000:]}"
        outs.append((json.loads(out[out.index("{"):]), err))
    ids = _ids(table)
    assert Counter(ids).most_common(1)[0][1] == 1, "a message id twice"
    assert set(ids) == east.ids | west.ids, "a message id lost"
    dt = DeltaTable(table)
    assert dt.transaction_version(app_id_for("east")) == Archive(str(a_root)).manifest_seqs("east")[0][-1]
    assert dt.transaction_version(app_id_for("west")) == Archive(str(a_root)).manifest_seqs("west")[0][-1]
    written = sum(d["totals"]["rows_written"] for d, _ in outs)
    assert written == len(east.ids | west.ids), "each row committed by exactly one of the two"
    retries = sum(b["retries"] for d, _ in outs for b in d["batches"])
    print(f"concurrent compactions: {retries} commit(s) refused by Delta and re-planned; "
          f"{sum(len(d['batches']) for d, _ in outs)} batches")


def test_jar_cache_is_verified_and_works_offline(jars, tmp_path, monkeypatch):
    assert jars.coordinates == f"io.delta:delta-spark_{'.'.join(delta_jars.spark_version().split('.')[:2])}_2.13:" \
        f"{delta_jars.DELTA_JVM_VERSION}"
    names = {Path(j).name for j in jars.jars}
    assert f"delta-spark_{jars.coordinates.split(':')[1].removeprefix('delta-spark_')}-" \
        f"{delta_jars.DELTA_JVM_VERSION}.jar" in names and f"delta-storage-{delta_jars.DELTA_JVM_VERSION}.jar" in names
    shipped = delta_jars.pyspark_artifacts()
    assert {"hadoop-client-api", "scala-library", "antlr4-runtime"} <= shipped
    assert not any(n.startswith(("hadoop-client", "scala-library", "parquet-")) for n in names), names
    # the pinned JVM release belongs to the installed Python package's minor version
    from importlib.metadata import version

    assert version("delta-spark").split(".")[:2] == delta_jars.DELTA_JVM_VERSION.split(".")[:2]

    # a cached copy needs neither Maven nor the network
    cache = tmp_path / "cache"
    src = Path(jars.directory).parent
    shutil.copytree(src, cache / "delta" / src.name)
    monkeypatch.setenv("PRISM_CACHE_DIR", str(cache))
    offline = delta_jars.resolve(maven="/nonexistent/mvn")
    assert not offline.fetched and len(offline.jars) == len(jars.jars)
    # a damaged jar is not used
    with open(offline.jars[0], "r+b") as f:
        f.seek(100)
        f.write(b"\0\0\0\0")
    with pytest.raises(DeltaJarsUnavailable, match="not in the cache"):
        delta_jars.resolve(fetch=False)


def test_without_the_jars_auto_writes_with_delta_rs_and_says_why(spark, tmp_path, monkeypatch):
    from typer import Exit

    from app.lake.cli import _delta_jars

    monkeypatch.setenv("PRISM_CACHE_DIR", str(tmp_path / "empty-cache"))
    monkeypatch.setenv("PRISM_MAVEN", "/nonexistent/mvn")
    conf, note = _delta_jars("auto")
    assert conf is None and "Maven (mvn) is not installed" in note
    writer = make_writer(spark, str(tmp_path / "t"), "auto", jars_note=note)
    assert writer.name == "delta-rs"
    assert writer.reason.startswith("auto: the Delta jars are not on Spark's classpath (") and note in writer.reason
    with pytest.raises(Exit):
        _delta_jars("delta-spark")
    # Maven runs but cannot get them (here: a version that does not exist): Maven's reason is kept
    require(shutil.which("mvn") is not None, "Maven (apt-get install maven)")
    monkeypatch.delenv("PRISM_MAVEN")
    monkeypatch.setenv("PRISM_DELTA_VERSION", "0.0.1")
    conf, note = _delta_jars("auto")
    assert conf is None and "Maven could not fetch the Delta jars io.delta:delta-spark_" in note
    assert ":0.0.1" in note

"""`prism lake compact` end to end on one SparkSession: archive (both layouts, encrypted-looking
envelopes, duplicates within and across rolls and writers, a corrupt envelope, an unreadable
archive file) -> Delta via Spark + delta-rs -> read back with deltalake and with plain PySpark.
Then: a re-run adds nothing; a run killed before its commit plus a re-run gives the same table;
no token or key canary in any table file; additive schema evolution; maintenance and CLI."""

from __future__ import annotations

import json
import os
import shutil
from collections import Counter

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable
from typer.testing import CliRunner

from app.errors import LakeError, RetentionError, SchemaEvolutionError
from app.lake import maintenance
from app.lake.archive import Archive, ArchiveSink
from app.lake.cli import lake_app
from app.lake.compact import EXIT_QUARANTINED, Compactor, app_id_for, quarantine_paths
from app.lake.writers import DeltaRsWriter, jvm_class_loadable, make_writer, native_delta_available
from tests.lake.conftest import KEY_CANARY, TOKEN_CANARY, make_traffic, scan_for


class Crash(Exception):
    """Stands in for the compaction job dying at a named point."""


@pytest.fixture(scope="module")
def lake(tmp_path_factory):
    """An archive written by two sinks, plus the ids a correct table must hold."""
    root = tmp_path_factory.mktemp("lake")
    archive = str(root / "archive")
    main = make_traffic(600, corrupt_at=(50,))
    with ArchiveSink(archive, writer_id="w1", max_file_bytes=120_000) as sink:
        sink.write(main.records)
    other = make_traffic(40, seed=99, source_topic="prism.archive.eu", dup_every=0)
    cross_dups = main.records[:30]  # the same envelopes archived again by another writer
    with ArchiveSink(archive, writer_id="w2") as sink:
        sink.write(other.records[:20] + [type(r)(r.envelope_bytes, "prism.archive.eu", 0, 1000 + i)
                                         for i, r in enumerate(cross_dups)])
    lost = make_traffic(10, seed=5, source_topic="prism.archive.eu", dup_every=0)
    with ArchiveSink(archive, writer_id="w2") as sink:
        sink.write([type(r)(r.envelope_bytes, r.source_topic, 5, r.offset) for r in lost.records])
    last = Archive(archive).last_manifest("w2")
    assert last is not None and len(last.files) >= 1
    unreadable = last.files[0].path
    with open(os.path.join(archive, unreadable), "r+b") as f:  # bit rot: the footer is gone
        f.truncate(100)
    lost_ids = set()
    for f in last.files[1:]:  # ids in the other files of that roll survive
        lost_ids |= set(pq.read_table(os.path.join(archive, f.path), columns=["message_id"]).column(0).to_pylist())
    only_in_unreadable = lost.ids - lost_ids
    expected = main.ids | _ids_of(other.records[:20]) | lost_ids
    return {"root": root, "archive": archive, "expected": expected, "unreadable": unreadable,
            "only_in_unreadable": only_in_unreadable, "corrupt": main.corrupt_offsets}


def _ids_of(records) -> set[str]:
    from app.envelope import decode

    return {decode(r.envelope_bytes).message_id for r in records}


def _ids(table_uri: str) -> list[str]:
    return DeltaTable(table_uri).to_pyarrow_table(columns=["message_id"]).column(0).to_pylist()


def _sorted_rows(table_uri: str) -> list[dict]:
    t = DeltaTable(table_uri).to_pyarrow_table()
    return sorted(t.to_pylist(), key=lambda r: r["message_id"])


@pytest.fixture(scope="module")
def reference(spark, lake):
    """The table compacted in one uninterrupted run (several commits: 2 files per batch)."""
    table = str(lake["root"] / "reference")
    summary = Compactor(spark, lake["archive"], table, max_files=4).run()
    return table, summary


def test_compaction_end_to_end(spark, lake, reference):
    table, summary = reference
    assert summary.writer == "delta-rs" or native_delta_available(spark)
    ids = _ids(table)
    assert Counter(ids).most_common(1)[0][1] == 1, "one row per message id"
    assert set(ids) == lake["expected"]
    assert not (set(ids) & lake["only_in_unreadable"])

    totals = summary.to_dict()["totals"]
    assert totals["rows_written"] == len(lake["expected"])
    assert totals["quarantined_files"] == 1 and totals["quarantined_records"] == 1
    assert totals["duplicates"] == totals["rows_in"] - len(lake["expected"]) - 1 - sum(
        f.rows for m in Archive(lake["archive"]).manifests("w2") for f in m.files if f.path == lake["unreadable"])
    assert totals["duplicates"] >= 60 + 30  # redeliveries within w1 and the cross-writer copies
    assert summary.exit_code == EXIT_QUARANTINED
    assert len(summary.batches) >= 3
    dt = DeltaTable(table)
    assert dt.transaction_version(app_id_for("w1")) == Archive(lake["archive"]).manifest_seqs("w1")[0][-1]
    assert dt.transaction_version(app_id_for("w2")) == 2
    assert dt.metadata().partition_columns == ["date", "namespace", "topic"]

    # plain PySpark, no Delta jars: exactly the current version's files
    df = spark.read.parquet(*[u if "://" in u else f"file://{u}" for u in dt.file_uris()])
    row = df.selectExpr("count(*) AS n", "count(DISTINCT message_id) AS d").collect()[0]
    assert row.n == row.d == len(lake["expected"])
    full = maintenance.read_with_spark(spark, table)
    assert full.columns == [f.name for f in pa.schema(dt.schema().to_arrow())
                            if f.name not in ("date", "namespace", "topic")] + ["date", "namespace", "topic"]
    by_topic = {r["topic"]: r["n"] for r in full.groupBy("topic").count().withColumnRenamed("count", "n").collect()}
    arrow_by_topic = Counter(dt.to_pyarrow_table(columns=["topic"]).column(0).to_pylist())
    assert by_topic == dict(arrow_by_topic)

    # typed columns: encrypted rows keep ciphertext + metadata, signed rows their algorithm
    t = dt.to_pyarrow_table(columns=["encrypted", "encryption_algorithm", "encryption_key_id", "signed",
                                     "signature_algorithm", "source_layout", "payload"]).to_pylist()
    enc = [r for r in t if r["encrypted"]]
    assert enc and all(r["encryption_algorithm"] == "aes-256-gcm" and r["encryption_key_id"] == "orders-dek-1"
                       and len(r["payload"]) == 48 for r in enc)
    assert {r["signature_algorithm"] for r in t if r["signed"]} == {"ed25519"}
    assert {r["source_layout"] for r in t} == {"draft", "reviewed"}

    # quarantine: the unreadable file (reason + bytes) and the corrupt record (reason + bytes)
    q = os.path.join(lake["archive"], "_quarantine")
    _, reason_q, copy_q = quarantine_paths("w2", lake["unreadable"])
    with open(os.path.join(q, reason_q)) as f:
        reason = json.load(f)
    assert reason["archive_file"] == lake["unreadable"] and "not readable Parquet" in reason["reason"]
    assert os.path.getsize(os.path.join(q, copy_q)) == 100
    bad = [r for d, _, ns in os.walk(q) for n in ns if n.endswith(".records.parquet")
           for r in pq.read_table(os.path.join(d, n)).to_pylist()]
    assert [(b["source_topic"], b["source_partition"], b["source_offset"]) for b in bad] == list(lake["corrupt"])
    assert "sink could not decode" in bad[0]["reason"]


def test_second_run_adds_nothing(spark, lake, reference):
    table, _ = reference
    before = DeltaTable(table).version()
    again = Compactor(spark, lake["archive"], table).run()
    assert again.batches == [] and again.exit_code == 0
    assert DeltaTable(table).version() == before


def test_no_token_or_key_material_in_any_file(lake, reference):
    table, _ = reference
    needles = [TOKEN_CANARY.encode(), KEY_CANARY, b"CANARY-KEY", b"CANARY-TOKEN"]
    assert scan_for(table, needles) == []
    # the archive and the quarantine never saw a token (the sink strips it before writing)
    assert scan_for(lake["archive"], [TOKEN_CANARY.encode(), b"CANARY-TOKEN"]) == []


def test_killed_before_commit_then_rerun_gives_the_same_table(spark, lake, reference):
    table = str(lake["root"] / "crashed")
    calls = []

    def crash_on_second_batch(point: str) -> None:
        calls.append(point)
        if len(calls) == 2:
            raise Crash(point)

    with pytest.raises(Crash):
        Compactor(spark, lake["archive"], table, max_files=4, fault=crash_on_second_batch).run()
    dt = DeltaTable(table)
    assert dt.version() == 0, "only the first batch committed"
    staged = [os.path.join(d, n) for d, _, ns in os.walk(os.path.join(table, "ingest")) for n in ns
              if n.endswith(".parquet")]
    orphans = set(staged) - set(dt.file_uris())
    assert orphans, "the killed batch's files exist but are in no version"
    visible = set(_ids(table))
    assert visible < lake["expected"]

    # re-run through the CLI on the same SparkSession (which the command must not stop)
    result = CliRunner().invoke(lake_app, ["compact", lake["archive"], table, "--max-files", "4", "--json"])
    assert result.exit_code == EXIT_QUARANTINED, result.output
    doc = json.loads(result.stdout)  # stderr carries the "writer: ... - why" line
    assert doc["totals"]["rows_written"] == len(lake["expected"]) - len(visible)
    assert _sorted_rows(table) == _sorted_rows(reference[0])
    assert spark.range(3).count() == 3, "the test session's Spark must still be running"

    # vacuum refuses a short retention unless forced; forced, it removes the killed run's files only
    with pytest.raises(RetentionError):
        maintenance.vacuum(table, retention_hours=0)
    out = maintenance.vacuum(table, retention_hours=0, force=True)
    assert out["files"] == len(orphans) and not any(os.path.exists(p) for p in orphans)
    assert _sorted_rows(table) == _sorted_rows(reference[0])


def test_additive_schema_evolution(spark, lake):
    table = str(lake["root"] / "evolving")
    comp = Compactor(spark, lake["archive"], table)
    manifests = Archive(lake["archive"]).manifests("w1")
    df1, _ = comp.decoded("w1", manifests[:1])
    df2, _ = comp.decoded("w1", manifests[1:2])
    writer = DeltaRsWriter(spark, table)
    old = writer.append(df1.drop("labels", "conversion_notes"), app_id="evo", version=1)
    new = writer.append(df2, app_id="evo", version=2)
    assert old.committed and new.committed
    assert set(new.columns_added) == {"labels", "conversion_notes"}
    names = [f.name for f in DeltaTable(table).schema().fields]
    assert "labels" in names and "conversion_notes" in names
    rows = DeltaTable(table).to_pyarrow_table(columns=["archive_seq", "labels"]).to_pylist()
    assert all(r["labels"] is None for r in rows if r["archive_seq"] == 1)
    assert all(r["labels"] for r in rows if r["archive_seq"] == 2)
    # an older producer's batch without a column still appends (NULLs)
    df3, _ = comp.decoded("w1", manifests[2:3])
    assert writer.append(df3.drop("baggage"), app_id="evo", version=3).committed
    # re-committing a version is a no-op; a changed type is refused
    assert not writer.append(df3, app_id="evo", version=3).committed
    with pytest.raises(SchemaEvolutionError, match="priority"):
        writer.append(df3.withColumn("priority", df3["priority"].cast("string")), app_id="evo", version=4)
    assert DeltaTable(table).transaction_version("evo") == 3


def test_writer_choice_follows_the_classpath(spark, lake):
    assert jvm_class_loadable(spark, "org.apache.spark.sql.SparkSession"), "the probe itself must work"
    chosen = make_writer(spark, str(lake["root"] / "x"))
    assert chosen.name == ("delta-spark" if native_delta_available(spark) else "delta-rs")
    if not native_delta_available(spark):
        with pytest.raises(LakeError, match=r"io\.delta\.sql\.DeltaSparkSessionExtension"):
            make_writer(spark, str(lake["root"] / "x"), "delta-spark")


def test_maintenance_and_cli(lake, reference):
    table = str(lake["root"] / "maint")
    shutil.copytree(reference[0], table)
    before = maintenance.stats(table)
    parts = DeltaTable(table).to_pyarrow_table(columns=["date", "namespace", "topic"]).to_pylist()
    assert before.rows == len(lake["expected"]) and before.partitions == len({tuple(p.values()) for p in parts}) >= 4
    assert before.files > before.partitions
    out = maintenance.optimize(table)
    assert out["numFilesRemoved"] > 0
    after = maintenance.stats(table)
    assert after.rows == before.rows and after.files == after.partitions and after.versions == before.versions + 1
    z = maintenance.optimize(table, zorder=["published_at_ms", "message_id"])
    assert z["zorder"] == ["published_at_ms", "message_id"]
    with pytest.raises(LakeError, match="partition column"):
        maintenance.optimize(table, zorder=["date"])
    assert sorted(_ids(table)) == sorted(_ids(reference[0]))

    runner = CliRunner()
    res = runner.invoke(lake_app, ["stats", table, "--json"])
    assert res.exit_code == 0 and json.loads(res.output)["rows"] == before.rows
    res = runner.invoke(lake_app, ["vacuum", table, "--retention-hours", "1"])
    assert res.exit_code == 1 and "under the table's minimum" in res.output
    res = runner.invoke(lake_app, ["vacuum", table, "--dry-run", "--json"])
    assert res.exit_code == 0 and json.loads(res.output)["dry_run"] is True
    res = runner.invoke(lake_app, ["optimize", table, "--zorder", "nope", "--json"])
    assert res.exit_code == 1 and "unknown Z-order column" in res.output


def test_compaction_reads_an_s3_archive(spark, s3_url, tmp_path, monkeypatch):
    """Executors read the archive through pyarrow's S3 client: no Hadoop S3 jars involved."""
    creds = {k: os.environ[k] for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION")}
    for k, v in creds.items():  # Python workers get the driver's PythonFunction environment
        monkeypatch.setitem(spark.sparkContext.environment, k, v)
    traffic = make_traffic(60, seed=3)
    with ArchiveSink(s3_url, writer_id="s3") as sink:
        sink.write(traffic.records)
    table = str(tmp_path / "from-s3")
    summary = Compactor(spark, s3_url, table).run()
    assert summary.exit_code == 0 and summary.total("rows_written") == len(traffic.ids)
    assert sorted(_ids(table)) == sorted(traffic.ids)
    assert Compactor(spark, s3_url, table).run().batches == []


def test_partition_values_with_special_characters_round_trip(spark, tmp_path):
    from app.envelope import encode, new_envelope
    from app.lake.archive import ArchiveRecord

    names = [("acme/eu west", "orders:created%20=x"), ("ns~ü", "t.1")]
    records = [ArchiveRecord(encode(new_envelope(topic, {"i": i}, namespace=ns)), "tap", 0, i)
               for i, (ns, topic) in enumerate(names * 3)]
    archive, table = str(tmp_path / "archive"), str(tmp_path / "table")
    with ArchiveSink(archive) as sink:
        sink.write(records)
    assert Compactor(spark, archive, table).run().exit_code == 0
    rows = DeltaTable(table).to_pyarrow_table(columns=["namespace", "topic"]).to_pylist()
    assert Counter((r["namespace"], r["topic"]) for r in rows) == Counter(names * 3)
    via_spark = maintenance.read_with_spark(spark, table).select("namespace", "topic").collect()
    assert Counter((r.namespace, r.topic) for r in via_spark) == Counter(names * 3)
    # another writer archives the same envelopes: dedup against the table reads those partitions' files
    with ArchiveSink(archive, writer_id="again") as sink:
        sink.write(ArchiveRecord(r.envelope_bytes, "tap2", 0, r.offset) for r in records)
    again = Compactor(spark, archive, table).run()
    assert again.total("rows_written") == 0 and again.total("duplicates") == len(records)
    assert Compactor(spark, archive, table).run().batches == [], "an all-duplicate batch is recorded too"


def test_relative_paths_compact_like_absolute_ones(spark, lake, reference, monkeypatch):
    """`prism lake compact var/archive var/lake/envelopes` printed a 59-line Spark traceback
    (Spark read the relative table path as a table name); absolute paths worked."""
    monkeypatch.chdir(lake["root"])
    result = CliRunner().invoke(lake_app, ["compact", "archive", "relative/envelopes", "--json"])
    assert result.exit_code == EXIT_QUARANTINED, result.output
    assert _sorted_rows(str(lake["root"] / "relative/envelopes")) == _sorted_rows(reference[0])
    stats = CliRunner().invoke(lake_app, ["stats", "relative/envelopes", "--json"])
    assert stats.exit_code == 0 and json.loads(stats.stdout)["rows"] == len(lake["expected"]), stats.output


def test_a_spark_failure_is_one_error_line(spark, lake, monkeypatch):
    def explode(self, **_kwargs):
        raise RuntimeError("[SOMETHING_BAD] the JVM said no\n\tat org.apache.spark.Foo(Foo.scala:1)\n" * 30)

    monkeypatch.setattr(Compactor, "run", explode)
    result = CliRunner().invoke(lake_app, ["compact", lake["archive"], str(lake["root"] / "never")])
    assert result.exit_code == 1
    lines = [line for line in result.stderr.splitlines() if line.strip() and not line.startswith("writer:")]
    assert len(lines) == 1 and lines[0].startswith("error [lake_error] compaction failed: RuntimeError: "
                                                   "[SOMETHING_BAD] the JVM said no"), result.stderr
    assert "Traceback" not in result.output and "fix:" in lines[0]


def test_absolute_url_only_touches_local_paths(tmp_path, monkeypatch):
    from app.lake.storage import absolute_url

    monkeypatch.chdir(tmp_path)
    assert absolute_url("var/lake") == str(tmp_path / "var/lake")
    assert absolute_url("file://" + str(tmp_path / "x")) == str(tmp_path / "x")
    assert absolute_url("/abs/path") == "/abs/path"
    for remote in ("s3://bucket/prefix?endpoint_override=h:1", "gs://b/p", "abfss://c@a.dfs.core.windows.net/p"):
        assert absolute_url(remote) == remote

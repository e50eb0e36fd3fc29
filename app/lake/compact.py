"""`prism lake compact`: committed archive rolls -> the typed, deduplicated Delta table.

    python -m app.lake.compact ARCHIVE_URL TABLE_URL            # local[*]
    spark-submit --py-files prism_app.zip app/lake/compact.py ARCHIVE_URL TABLE_URL

Plan, per archive writer (each writer's rolls are numbered 1, 2, 3, ...):

1. `version` = the Delta app transaction recorded for `prism.lake.compact:<writer>`; the
   work is every committed manifest with a higher sequence number (a directory listing is
   never trusted: only manifests name files that count).
2. Batches of at most `max_files` files. Spark spreads the file list over executors;
   `mapInArrow` reads each file with pyarrow and decodes its envelopes with the Prism
   decoder (`app.lake.decode`), writing undecodable records and unreadable files to the
   quarantine location (deterministic names: a re-run overwrites, never duplicates).
3. Dedup by `message_id`: within the batch (the copy archived first wins, so a re-run picks
   the same row) and against the table's rows in the same (date, namespace, topic) partitions.
4. One Delta commit carrying the app transaction `(app id, last manifest seq)`.

A run killed anywhere before step 4 leaves no visible trace, and the next run redoes the same
batch; a re-run after step 4 finds nothing new. Exit codes: 0 all good, 3 committed but some
input was quarantined, 1 failed (details on stderr), 2 usage error.
"""

from __future__ import annotations

import contextlib
import json
import logging
import random
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

from app.errors import ArchiveError
from app.lake.archive import Archive, Manifest, read_archive_file
from app.lake.decode import decode_archive_table
from app.lake.schema import PROVENANCE_ORDER, spark_schema
from app.lake.spark import default_parallelism
from app.lake.storage import Store, absolute_url
from app.lake.writers import ConcurrentCommitError, Fault, Partition, make_writer

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)

APP_ID_PREFIX = "prism.lake.compact:"
QUARANTINE_DIR = "_quarantine"
EXIT_OK, EXIT_FAILED, EXIT_QUARANTINED = 0, 1, 3
_DECODE_CHUNK = 20_000
#: Tries per batch when Delta's conflict detection refuses a commit (another compaction won).
COMMIT_ATTEMPTS = 10


@dataclass(slots=True)
class BatchSummary:
    """One committed (or skipped) batch of one archive writer's rolls."""

    archive_writer: str
    first_seq: int
    last_seq: int
    files: int
    rows_in: int
    rows_written: int = 0
    duplicates: int = 0
    quarantined_records: int = 0
    quarantined_files: int = 0
    tokens_dropped: int = 0
    committed: bool = False
    table_version: int | None = None
    columns_added: list[str] = field(default_factory=list)
    retries: int = 0  # commits refused by Delta's conflict detection, then re-planned
    seconds: float = 0.0


@dataclass(slots=True)
class CompactSummary:
    archive: str
    table: str
    quarantine: str
    writer: str
    writer_reason: str = ""
    batches: list[BatchSummary] = field(default_factory=list)
    seconds: float = 0.0

    def total(self, name: str) -> int:
        return sum(getattr(b, name) for b in self.batches)

    @property
    def exit_code(self) -> int:
        quarantined = self.total("quarantined_records") + self.total("quarantined_files")
        return EXIT_QUARANTINED if quarantined else EXIT_OK

    def to_dict(self) -> dict[str, Any]:
        totals = {k: self.total(k) for k in ("files", "rows_in", "rows_written", "duplicates",
                                               "quarantined_records", "quarantined_files", "tokens_dropped")}
        return {"archive": self.archive, "table": self.table, "quarantine": self.quarantine,
                "writer": self.writer, "writer_reason": self.writer_reason, "seconds": round(self.seconds, 3),
                "exit_code": self.exit_code,
                "totals": totals, "batches": [asdict(b) for b in self.batches]}


def app_id_for(archive_writer: str) -> str:
    return APP_ID_PREFIX + archive_writer


# --------------------------------------------------------------------------- executor side


def quarantine_paths(archive_writer: str, archive_file: str) -> tuple[str, str, str]:
    """(records, unreadable-reason, unreadable-copy) paths, relative to the quarantine root."""
    base = f"{archive_writer}/{archive_file}"
    return f"{base}.records.parquet", f"{base}.unreadable.json", f"{base}.unreadable"


def _decode_files(batches: Iterator[pa.RecordBatch], *, archive_url: str, quarantine_url: str,
                  tokens: Any) -> Iterator[pa.RecordBatch]:
    """`mapInArrow` body: file list rows in, typed table rows out (runs on executors)."""
    archive = Store(archive_url)
    quarantine = Store(quarantine_url)
    for batch in batches:
        for row in batch.to_pylist():
            path, writer, seq = row["path"], row["writer"], row["seq"]
            records_q, reason_q, copy_q = quarantine_paths(writer, path)
            try:
                table = read_archive_file(archive, path)
            except ArchiveError as exc:
                reason = {"archive_file": path, "archive_writer": writer, "archive_seq": seq,
                          "rows_in_manifest": row["rows"], "reason": str(exc)}
                quarantine.write_atomic(reason_q, json.dumps(reason, indent=1).encode())
                with contextlib.suppress(ArchiveError):  # missing bytes: the reason file is all there is
                    quarantine.write_atomic(copy_q, archive.read(path))
                continue
            bad: list[pa.Table] = []
            for start in range(0, table.num_rows, _DECODE_CHUNK):
                out = decode_archive_table(table.slice(start, _DECODE_CHUNK), archive_file=path,
                                           writer=writer, seq=seq)
                if out.tokens_dropped:
                    tokens.add(out.tokens_dropped)
                if out.quarantined.num_rows:
                    bad.append(out.quarantined)
                yield from out.rows.to_batches()
            if bad:
                buf = pa.BufferOutputStream()
                pq.write_table(pa.concat_tables(bad), buf, compression="zstd")
                quarantine.write_atomic(records_q, buf.getvalue().to_pybytes())


# --------------------------------------------------------------------------- driver side


def plan_batches(manifests: list[Manifest], max_files: int) -> list[list[Manifest]]:
    """Consecutive manifests grouped so that a batch holds at most `max_files` files
    (a single larger manifest still forms its own batch)."""
    batches: list[list[Manifest]] = []
    current: list[Manifest] = []
    n = 0
    for m in manifests:
        if current and n + len(m.files) > max_files:
            batches.append(current)
            current, n = [], 0
        current.append(m)
        n += len(m.files)
    if current:
        batches.append(current)
    return batches


def dedup(df: DataFrame) -> DataFrame:
    """One row per message_id: the copy archived first (deterministic across re-runs)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    w = Window.partitionBy("message_id").orderBy(*PROVENANCE_ORDER)
    return df.withColumn("_rank", F.row_number().over(w)).where(F.col("_rank") == 1).drop("_rank")


class Compactor:
    """Runs the plan in the module docstring. `fault` is a crash-test hook (named points)."""

    def __init__(self, spark: SparkSession, archive_url: str, table_url: str, *, quarantine_url: str | None = None,
                 writer: str = "auto", max_files: int = 2000, storage_options: dict[str, str] | None = None,
                 fault: Fault | None = None, jars_note: str = "") -> None:
        if max_files <= 0:
            raise ArchiveError(f"max_files must be positive, not {max_files}", path="max_files",
                               hint="give the number of archive files per Delta commit, e.g. 2000")
        self.spark = spark
        # local paths absolute before Spark or delta-rs see them (app/lake/storage.py absolute_url)
        archive_url, table_url = absolute_url(archive_url), absolute_url(table_url)
        quarantine_url = absolute_url(quarantine_url) if quarantine_url else None
        self.archive = Archive(archive_url)
        self.archive_url = archive_url
        self.quarantine_url = quarantine_url or self.archive.store.child_url(QUARANTINE_DIR)
        self.quarantine = Store(self.quarantine_url)
        self.table_url = table_url
        self.table = make_writer(spark, table_url, writer, storage_options, jars_note=jars_note)
        self.max_files = max_files
        self.fault = fault

    def pending(self) -> list[tuple[str, list[list[Manifest]]]]:
        """(archive writer, batches) still to compact."""
        out = []
        for w in self.archive.writers():
            done = self.table.transaction_version(app_id_for(w)) or 0
            manifests = self.archive.manifests(w, after=done)
            if manifests:
                out.append((w, plan_batches(manifests, self.max_files)))
        return out

    def run(self, on_batch: Callable[[BatchSummary], None] | None = None,
            plan: list[tuple[str, list[list[Manifest]]]] | None = None) -> CompactSummary:
        started = time.perf_counter()
        summary = CompactSummary(self.archive.store.url_for_messages, self.table_url,
                                 self.quarantine.url_for_messages, self.table.name, self.table.reason)
        for writer, batches in plan if plan is not None else self.pending():
            for batch in batches:
                result = self.run_batch(writer, batch)
                summary.batches.append(result)
                if on_batch is not None:
                    on_batch(result)
        summary.seconds = time.perf_counter() - started
        return summary

    def decoded(self, writer: str, manifests: list[Manifest]) -> tuple[DataFrame, Any]:
        """The batch's decoded rows (lazy) and the accumulator counting dropped auth tokens."""
        files = [{"path": f.path, "writer": writer, "seq": m.seq, "rows": f.rows} for m in manifests for f in m.files]
        tokens = self.spark.sparkContext.accumulator(0)
        slices = max(1, min(len(files), 4 * default_parallelism(self.spark)))
        file_df = self.spark.createDataFrame(files, "path string, writer string, seq long, rows long")
        file_df = file_df.repartition(slices) if slices > 1 else file_df.coalesce(1)
        fn = partial(_decode_files, archive_url=self.archive_url, quarantine_url=self.quarantine_url, tokens=tokens)
        return file_df.mapInArrow(fn, spark_schema()), tokens

    def run_batch(self, writer: str, manifests: list[Manifest]) -> BatchSummary:
        started = time.perf_counter()
        files = [f for m in manifests for f in m.files]
        s = BatchSummary(writer, manifests[0].seq, manifests[-1].seq, len(files), sum(f.rows for f in files))
        self._clear_quarantine(writer, {f.path for f in files})  # leftovers of a killed run of this batch

        partitions: set[Partition] = {(f.date, f.namespace, f.topic) for f in files if f.namespace and f.topic}
        for attempt in range(1, COMMIT_ATTEMPTS + 1):
            # Planned afresh on every attempt: the dedup against the table must see what the
            # concurrent writer that beat us committed (and a fresh accumulator counts tokens once).
            try:
                self.table.prepare(spark_schema())
                df, tokens = self.decoded(writer, manifests)
                df = dedup(df)
                existing = self.table.existing_ids(partitions)
                if existing is not None:
                    df = df.join(existing, on="message_id", how="left_anti")
                result = self.table.append(df, app_id=app_id_for(writer), version=s.last_seq, fault=self.fault)
                break
            except ConcurrentCommitError as exc:
                if attempt == COMMIT_ATTEMPTS:
                    raise
                s.retries += 1
                log.warning("%s rolls %d-%d: another writer committed first (%s); re-planning the batch "
                            "against the new table version (attempt %d of %d)", writer, s.first_seq, s.last_seq,
                            exc, attempt + 1, COMMIT_ATTEMPTS)
                time.sleep(random.uniform(0.5, 1.5) * min(attempt, 4))  # two losers should not collide again at once

        s.committed, s.table_version = result.committed, result.table_version
        s.rows_written = result.rows_added
        s.columns_added = list(result.columns_added)
        s.tokens_dropped = tokens.value
        rows_in_bad_files = self._count_quarantine(writer, files, s)
        if result.committed:
            s.duplicates = s.rows_in - rows_in_bad_files - s.quarantined_records - s.rows_written
        s.seconds = time.perf_counter() - started
        log.info("compacted %s rolls %d-%d: %d rows in, %d written, %d duplicates, %d quarantined",
                 writer, s.first_seq, s.last_seq, s.rows_in, s.rows_written, s.duplicates,
                 s.quarantined_records + s.quarantined_files)
        return s

    def _quarantine_entries(self, writer: str) -> dict[str, int]:
        return {f.path: f.size for f in self.quarantine.list_files(writer)}

    def _clear_quarantine(self, writer: str, paths: set[str]) -> None:
        for rel in self._quarantine_entries(writer):
            if _archive_path_of(rel) in paths:
                self.quarantine.delete(rel)

    def _count_quarantine(self, writer: str, files: list[Any], s: BatchSummary) -> int:
        entries = self._quarantine_entries(writer)
        rows_in_bad_files = 0
        for f in files:
            records_q, reason_q, _ = quarantine_paths(writer, f.path)
            if reason_q in entries:
                s.quarantined_files += 1
                rows_in_bad_files += f.rows
            if records_q in entries:
                with self.quarantine.fs.open_input_file(self.quarantine.full(records_q)) as fh:
                    s.quarantined_records += pq.ParquetFile(fh).metadata.num_rows
        return rows_in_bad_files


def _archive_path_of(quarantine_rel: str) -> str:
    """The archive file a quarantine entry `<writer>/<archive path>.<suffix>` belongs to."""
    rest = quarantine_rel.split("/", 1)[1]
    for suffix in (".records.parquet", ".unreadable.json", ".unreadable"):
        if rest.endswith(suffix):
            return rest[: -len(suffix)]
    return rest


def compact(spark: SparkSession, archive_url: str, table_url: str, **kwargs: Any) -> CompactSummary:
    """Convenience wrapper: `Compactor(...).run()`."""
    return Compactor(spark, archive_url, table_url, **kwargs).run()


def main(argv: list[str] | None = None) -> int:
    """`python -m app.lake.compact` / spark-submit entry: the same options as `prism lake compact`."""
    from app.lake.cli import lake_app

    try:
        lake_app(["compact", *(argv if argv is not None else sys.argv[1:])], standalone_mode=True)
    except SystemExit as exc:
        return int(exc.code or 0)
    return 0


__all__ = ["BatchSummary", "CompactSummary", "Compactor", "app_id_for", "compact", "dedup", "plan_batches"]

if __name__ == "__main__":
    raise SystemExit(main())

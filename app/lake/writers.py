"""Two Delta writers behind one interface; both produce the same table format.

* `DeltaSparkWriter` - the native path: `df.write.format("delta")` with `txnAppId` /
  `txnVersion` (Delta's idempotent-write options) and `mergeSchema`. Used when the JVM class
  `io.delta.sql.DeltaSparkSessionExtension` is loadable, i.e. the cluster was started with
  `--packages io.delta:delta-spark_2.13:<version>` (or the jars are installed).
* `DeltaRsWriter` - no Delta jars needed (PyPI ships none, and Maven is unreachable on some
  machines): Spark writes plain Parquet files in parallel into a per-run folder inside the
  table, then the driver builds one `AddAction` per file from its footer and delta-rs makes
  ONE atomic commit. Files of a run that dies before that commit are in no log version, so no
  reader sees them, and `vacuum` removes them.

Both record the batch as a Delta app transaction `(app_id, version)`: a batch whose version is
not above the table's recorded version for that app id is not written again. Both evolve the
schema additively: new columns are added to the table, columns the batch lacks are written as
NULL, and a changed column type is refused (`SchemaEvolutionError`).
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import posixpath
import re
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.parquet as pq

from app.errors import LakeError, SchemaEvolutionError
from app.lake.schema import PARTITION_COLUMNS
from app.lake.storage import Store

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)

NATIVE_CLASS = "io.delta.sql.DeltaSparkSessionExtension"
INGEST_DIR = "ingest"
HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"
#: Delta truncates string statistics; a prefix is a valid minimum, a longer max is skipped.
STATS_STRING_PREFIX = 32
TABLE_DESCRIPTION = "Prism envelopes compacted from the archive (app.lake)"
_SAFE = re.compile(r"[^A-Za-z0-9_.-]+")

Partition = tuple[str, str | None, str | None]
Fault = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class CommitResult:
    """What one `append` did. `committed` is False when the batch was already in the table."""

    writer: str
    committed: bool
    table_version: int | None
    files_added: int = 0
    rows_added: int = 0
    bytes_added: int = 0
    columns_added: tuple[str, ...] = field(default_factory=tuple)


class TableWriter(ABC):
    """Appends DataFrames to one Delta table, idempotently per (app_id, version)."""

    name: str
    #: Why this writer was chosen, for the one line `prism lake compact` prints (set by make_writer).
    reason: str = ""

    def __init__(self, spark: SparkSession, table_uri: str, storage_options: dict[str, str] | None = None) -> None:
        self.spark = spark
        self.table_uri = table_uri.rstrip("/")
        self.storage_options = storage_options

    @abstractmethod
    def transaction_version(self, app_id: str) -> int | None:
        """The highest version recorded for `app_id`, None if none (or the table is absent)."""

    @abstractmethod
    def existing_ids(self, partitions: Iterable[Partition]) -> DataFrame | None:
        """`message_id`s already in the given (date, namespace, topic) partitions; None if none."""

    def prepare(self, schema: Any) -> None:
        """Called before a batch is planned; the delta-spark writer creates the table here.
        The delta-rs path creates it with its first commit (its commits are not re-planned)."""
        return None

    @abstractmethod
    def append(self, df: DataFrame, *, app_id: str, version: int, fault: Fault | None = None) -> CommitResult:
        """Write `df` and commit it with the app transaction, unless already committed."""

    # shared by both writers ------------------------------------------------------------------
    def _delta_table(self) -> Any:
        from deltalake import DeltaTable

        if not DeltaTable.is_deltatable(self.table_uri, storage_options=self.storage_options):
            return None
        return DeltaTable(self.table_uri, storage_options=self.storage_options)

    def _reconcile(self, df: DataFrame, table_fields: dict[str, Any] | None) -> tuple[DataFrame, list[Any]]:
        """Add the table's columns the batch lacks (as typed NULLs); list the batch's new columns.

        Raises `SchemaEvolutionError` when a column exists on both sides with different types.
        """
        from pyspark.sql import functions as F

        if table_fields is None:
            return df, []
        batch_fields = {f["name"]: f for f in _delta_fields(_arrow_schema(df))}
        conflicts = [
            f"{name}: table {_type_str(tf['type'])}, batch {_type_str(batch_fields[name]['type'])}"
            for name, tf in table_fields.items()
            if name in batch_fields and _type_str(tf["type"]) != _type_str(batch_fields[name]["type"])
        ]
        if conflicts:
            raise SchemaEvolutionError(
                f"batch columns conflict with table {self.table_uri}: {'; '.join(conflicts)}",
                hint="only additive changes are automatic; add a new column instead of changing a type",
            )
        new = [name for name in batch_fields if name not in table_fields]
        missing = [name for name in table_fields if name not in batch_fields]
        if missing:
            table_arrow = _arrow_of(table_fields)
            from pyspark.sql.pandas.types import from_arrow_type

            for name in missing:
                df = df.withColumn(name, F.lit(None).cast(from_arrow_type(table_arrow.field(name).type)))
        return df, [batch_fields[n] for n in new]


# --------------------------------------------------------------------------- native delta-spark


def jvm_class_loadable(spark: SparkSession, name: str) -> bool:
    """True when the driver JVM can load `name` through Spark's class loader (which sees
    `--jars` / `--packages`); False also for Spark Connect sessions, which have no JVM here."""
    try:
        jvm = spark._jvm  # type: ignore[attr-defined]
        jvm.org.apache.spark.util.Utils.classForName(name, True, False)
        return True
    except Exception:
        return False


def native_delta_available(spark: SparkSession) -> bool:
    """True when the Delta Lake JVM classes are on the driver's classpath."""
    return jvm_class_loadable(spark, NATIVE_CLASS)


class ConcurrentCommitError(LakeError):
    """Delta's optimistic concurrency refused this commit because another writer committed first
    (`ConcurrentAppendException` on partitions this batch read, `ConcurrentTransactionException`
    for the same app id, `ProtocolChangedException` when both created the table, ...). Nothing of
    the batch is visible; the caller re-plans it against the new table version and tries again."""

    code = "delta_concurrent_commit"


def _delta_conflicts() -> tuple[type[BaseException], ...]:
    """Delta's commit-conflict exceptions as PySpark raises them. They must be listed one by one:
    in delta-spark 4.4.1 the converted `ConcurrentAppendException` & co. are NOT subclasses of the
    exported `DeltaConcurrentModificationException` (the test of two concurrent compactions found it)."""
    import delta.exceptions as dx  # importing it installs the JVM -> Python exception conversion

    return tuple(getattr(dx, name) for name in dx.__all__)


class DeltaSparkWriter(TableWriter):
    """The native path (see the module docstring). Needs the Delta jars on the classpath."""

    name = "delta-spark"

    def __init__(self, spark: SparkSession, table_uri: str, storage_options: dict[str, str] | None = None) -> None:
        super().__init__(spark, table_uri, storage_options)
        self.store = Store(table_uri)

    def transaction_version(self, app_id: str) -> int | None:
        # Delta's own writer re-checks (txnAppId/txnVersion), so this read is an optimization;
        # delta-rs reads any table delta-spark writes, as long as it can reach the storage.
        try:
            dt_ = self._delta_table()
        except Exception as exc:  # e.g. no credentials for delta-rs on this driver
            log.info("delta-rs cannot read %s (%s); relying on Delta's txn check", self.table_uri, exc)
            return None
        return None if dt_ is None else dt_.transaction_version(app_id)

    def existing_ids(self, partitions: Iterable[Partition]) -> DataFrame | None:
        # Read through Delta (not a file list): when this DataFrame is part of the write, Delta
        # records the partitions it read, so a concurrent append to them fails our commit with
        # ConcurrentAppendException instead of both commits keeping the same message id.
        from pyspark.sql import functions as F

        parts = list(partitions)
        if not parts or not self._is_table():
            return None
        dates = sorted({dt.date.fromisoformat(p[0]) for p in parts})
        namespaces = sorted({p[1] for p in parts if p[1] is not None})
        topics = sorted({p[2] for p in parts if p[2] is not None})
        return (self.spark.read.format("delta").load(self.table_uri)
                .where(F.col("date").isin(dates) & F.col("namespace").isin(namespaces) & F.col("topic").isin(topics))
                .select("message_id"))

    def _is_table(self) -> bool:
        jvm = self.spark._jvm  # type: ignore[attr-defined]
        return bool(jvm.io.delta.tables.DeltaTable.isDeltaTable(self.spark._jsparkSession, self.table_uri))  # type: ignore[attr-defined]

    def _history(self, limit: int) -> list[dict[str, Any]]:
        """The newest `limit` commits (newest first), [] when there is no table yet."""
        from delta.tables import DeltaTable

        if not self._is_table():
            return []
        return [r.asDict(recursive=True) for r in DeltaTable.forPath(self.spark, self.table_uri).history(limit).collect()]

    def prepare(self, schema: Any) -> None:
        # The table exists BEFORE a batch is planned, so the dedup always reads it through Delta:
        # a plan made on "no table yet" would skip the dedup, and no conflict check could catch
        # a concurrent writer that created the table and committed the same ids meanwhile.
        if not self._is_table():
            self._create(schema)

    def _create(self, schema: Any) -> None:
        """Create the table with the batch's schema as declared. A DataFrame write would create it
        with every column nullable (Delta's rule for path writes), while the delta-rs path keeps
        `message_id NOT NULL`: creating it explicitly gives both writers the same schema."""
        from delta.tables import DeltaTable
        from pyspark.errors import AnalysisException

        try:
            (DeltaTable.createIfNotExists(self.spark).location(self.table_uri).addColumns(schema)
             .partitionedBy(*PARTITION_COLUMNS).comment(TABLE_DESCRIPTION).execute())
        except _delta_conflicts() as exc:  # both created it; the other's commit won
            raise ConcurrentCommitError(f"{type(exc).__name__}: {self.table_uri} was created by another writer") from exc
        except AnalysisException as exc:
            # Another compaction is creating the table right now: its _delta_log exists, its first
            # commit does not yet. Like a lost commit race: re-plan once that commit is there.
            if exc.getCondition() != "DELTA_CREATE_TABLE_WITH_NON_EMPTY_LOCATION" or \
                    not self._has_log_dir():
                raise
            raise ConcurrentCommitError(f"{self.table_uri} is being created by another writer") from exc

    def _has_log_dir(self) -> bool:
        import pyarrow.fs as pafs

        info = self.store.fs.get_file_info(self.store.full("_delta_log"))
        return info.type != pafs.FileType.NotFound or bool(self.store.list_files("_delta_log"))

    def append(self, df: DataFrame, *, app_id: str, version: int, fault: Fault | None = None) -> CommitResult:
        done = self.transaction_version(app_id)
        if done is not None and done >= version:
            return CommitResult(self.name, False, None)
        # Delta skips a write whose (txnAppId, txnVersion) is already recorded without telling the
        # caller; a token in the commit's userMetadata says afterwards whether THIS call committed.
        token = f"prism.lake:{app_id}:v{version}:{uuid.uuid4().hex}"
        try:
            head = self._history(1)
            if not head:
                self._create(df.schema)
                head = self._history(1)
            if fault is not None:  # delta-spark writes and commits in one call; the closest crash point
                fault("files-written")
            (df.write.format("delta").mode("append")
             .option("txnAppId", app_id).option("txnVersion", version).option("mergeSchema", "true")
             .option("userMetadata", token).save(self.table_uri))
        except _delta_conflicts() as exc:
            raise ConcurrentCommitError(f"{type(exc).__name__} on {self.table_uri}: "
                                        f"{str(exc).strip().splitlines()[0][:300]}") from exc
        since = head[0]["version"] if head else -1
        newest = self._history(1)
        latest = newest[0]["version"] if newest else since
        ours = [c for c in self._history(max(1, latest - since)) if c.get("userMetadata") == token]
        if not ours:
            return CommitResult(self.name, False, latest)
        metrics = ours[0].get("operationMetrics") or {}
        return CommitResult(self.name, True, ours[0]["version"], int(metrics.get("numFiles", 0)),
                            int(metrics.get("numOutputRows", 0)), int(metrics.get("numOutputBytes", 0)))


# --------------------------------------------------------------------------- Spark files + delta-rs commit


class DeltaRsWriter(TableWriter):
    """Spark writes the Parquet files, delta-rs commits them once (see the module docstring)."""

    name = "delta-rs"

    def __init__(self, spark: SparkSession, table_uri: str, storage_options: dict[str, str] | None = None) -> None:
        super().__init__(spark, table_uri, storage_options)
        self.store = Store(table_uri)

    def transaction_version(self, app_id: str) -> int | None:
        dt_ = self._delta_table()
        return None if dt_ is None else dt_.transaction_version(app_id)

    def existing_ids(self, partitions: Iterable[Partition]) -> DataFrame | None:
        parts = sorted(set(partitions), key=str)
        dt_ = self._delta_table()
        if dt_ is None or not parts:
            return None
        refuse_unsupported_features(dt_)
        filters = [[(c, "=", v) for c, v in zip(PARTITION_COLUMNS, p, strict=True) if v is not None] for p in parts]
        uris = dt_.file_uris(file_pruning_predicate=filters)
        if not uris:
            return None
        return self.spark.read.parquet(*[_spark_path(u) for u in uris]).select("message_id")

    def append(self, df: DataFrame, *, app_id: str, version: int, fault: Fault | None = None) -> CommitResult:
        from deltalake import Schema as DeltaSchema
        from deltalake.transaction import CommitProperties, Transaction, create_table_with_add_actions

        dt_ = self._delta_table()
        if dt_ is not None and (dt_.transaction_version(app_id) or 0) >= version:
            return CommitResult(self.name, False, dt_.version())
        table_fields = None if dt_ is None else {f["name"]: f for f in json.loads(dt_.schema().to_json())["fields"]}
        df, new_fields = self._reconcile(df, table_fields)
        if table_fields is not None:  # the table's column order first, new columns after
            df = df.select(*table_fields.keys(), *[f["name"] for f in new_fields])

        stage = f"{INGEST_DIR}/{_SAFE.sub('_', app_id)}-v{version}-{uuid.uuid4().hex[:8]}"
        (df.write.mode("errorifexists").partitionBy(*PARTITION_COLUMNS)
         .option("mapreduce.fileoutputcommitter.marksuccessfuljobs", "false")
         .parquet(self.store.uri(stage)))
        actions = self._add_actions(stage)
        if fault is not None:
            fault("files-written")

        commit = CommitProperties(app_transactions=[Transaction(app_id, version)],
                                  custom_metadata={"prism.lake.stage": stage})
        if dt_ is None:
            create_table_with_add_actions(
                self.table_uri, DeltaSchema.from_arrow(_arrow_schema(df)), actions, mode="error",
                partition_by=list(PARTITION_COLUMNS), storage_options=self.storage_options,
                commit_properties=commit, name="prism_envelopes",
                description=TABLE_DESCRIPTION)
        else:
            dt_.update_incremental()
            if (dt_.transaction_version(app_id) or 0) >= version:  # another run won the race
                return CommitResult(self.name, False, dt_.version())
            if new_fields:
                from deltalake import Field as DeltaField

                dt_.alter.add_columns([DeltaField.from_json(json.dumps(f)) for f in new_fields])
            dt_.create_write_transaction(actions, mode="append", schema=dt_.schema(),
                                         partition_by=list(PARTITION_COLUMNS), commit_properties=commit)
        after = self._delta_table()
        return CommitResult(self.name, True, after.version() if after else None, len(actions),
                            sum(_num_records(a) for a in actions), sum(a.size for a in actions),
                            tuple(f["name"] for f in new_fields))

    def _add_actions(self, stage: str) -> list[Any]:
        from deltalake.transaction import AddAction

        actions = []
        now_ms = int(dt.datetime.now(dt.UTC).timestamp() * 1000)
        for f in self.store.list_files(stage):
            name = posixpath.basename(f.path)
            if name.startswith((".", "_")):
                if name.endswith(".crc") and self.store.local:
                    self.store.delete(f.path)  # Hadoop's local checksum files: noise in a table folder
                continue
            with self.store.fs.open_input_file(self.store.full(f.path)) as fh:
                meta = pq.ParquetFile(fh).metadata
            actions.append(AddAction(
                path=f.path,  # raw relative path: delta-rs does the URL-encoding itself
                size=f.size,
                partition_values=_partition_values(f.path[len(stage) + 1:]),
                modification_time=now_ms,
                data_change=True,
                stats=json.dumps(footer_stats(meta), separators=(",", ":")),
            ))
        return actions


# --------------------------------------------------------------------------- choosing


def make_writer(spark: SparkSession, table_uri: str, prefer: str = "auto",
                storage_options: dict[str, str] | None = None, *, jars_note: str = "") -> TableWriter:
    """`auto` takes the native path when the Delta jars are loadable, else delta-rs.

    `jars_note` is what the caller knows about the jars (where they came from, or why they could
    not be had); it goes into the writer's `reason` and into the error for `delta-spark`.
    """
    if prefer not in ("auto", "delta-spark", "delta-rs"):
        raise LakeError(f"unknown Delta writer {prefer!r}", hint="use auto, delta-spark or delta-rs")
    native = native_delta_available(spark)
    note = f" ({jars_note})" if jars_note else ""
    if prefer == "delta-spark" and not native:
        raise LakeError(
            f"the delta-spark writer needs the JVM class {NATIVE_CLASS}, which is not on the classpath{note}",
            hint="let `prism lake compact` fetch the Delta jars (needs Maven and Maven Central once), start Spark "
                 "with --jars/--packages io.delta:delta-spark_... (see docs/lakehouse.md), or use --writer delta-rs")
    writer: TableWriter
    if prefer == "delta-spark" or (prefer == "auto" and native):
        writer = DeltaSparkWriter(spark, table_uri, storage_options)
        writer.reason = ("--writer delta-spark" if prefer == "delta-spark"
                         else "auto: the Delta jars are on Spark's classpath") + note
    else:
        writer = DeltaRsWriter(spark, table_uri, storage_options)
        writer.reason = ("--writer delta-rs" if prefer == "delta-rs"
                         else "auto: the Delta jars are not on Spark's classpath") + note
    return writer


def refuse_unsupported_features(dt_: Any) -> None:
    """Plain Parquet readers cannot apply deletion vectors or column mapping: refuse, don't misread."""
    proto = dt_.protocol()
    features = set(proto.reader_features or [])
    bad = features & {"deletionVectors", "columnMapping", "v2Checkpoint"}
    if bad:
        raise LakeError(f"table {dt_.table_uri} uses reader feature(s) {sorted(bad)} that a plain Parquet "
                        "read of its file list would get wrong",
                        hint="read it with delta-spark or delta-rs instead of the file list")


# --------------------------------------------------------------------------- helpers


def _arrow_schema(df: DataFrame) -> pa.Schema:
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(df.schema, timezone="UTC")


def _spark_path(uri: str) -> str:
    return uri if "://" in uri else f"file://{uri}"


def _delta_fields(schema: pa.Schema) -> list[dict[str, Any]]:
    from deltalake import Schema as DeltaSchema

    return json.loads(DeltaSchema.from_arrow(schema).to_json())["fields"]


def _arrow_of(fields: dict[str, dict[str, Any]]) -> pa.Schema:
    from deltalake import Schema as DeltaSchema

    doc = {"type": "struct", "fields": list(fields.values())}
    return pa.schema(DeltaSchema.from_json(json.dumps(doc)).to_arrow())


def _type_str(t: Any) -> str:
    """A comparable form of a Delta type (nullability of nested elements ignored)."""
    if isinstance(t, str):
        return t
    kind = t.get("type")
    if kind == "array":
        return f"array<{_type_str(t['elementType'])}>"
    if kind == "map":
        return f"map<{_type_str(t['keyType'])},{_type_str(t['valueType'])}>"
    if kind == "struct":
        return "struct<" + ",".join(f"{f['name']}:{_type_str(f['type'])}" for f in t["fields"]) + ">"
    return json.dumps(t, sort_keys=True)


def _partition_values(rel: str) -> dict[str, str | None]:
    values: dict[str, str | None] = {}
    for segment in rel.split("/")[:-1]:
        key, sep, raw = segment.partition("=")
        if not sep:
            raise LakeError(f"unexpected directory {segment!r} in a staged data file path {rel!r}",
                            hint="the staging folder must contain only Hive-style partition directories")
        value = unquote(raw)
        values[unquote(key)] = None if value == HIVE_NULL else value
    missing = [c for c in PARTITION_COLUMNS if c not in values]
    if missing:
        raise LakeError(f"staged file {rel!r} lacks partition directories {missing}")
    return values


def _num_records(action: Any) -> int:
    return int(json.loads(action.stats).get("numRecords", 0))


def footer_stats(meta: pq.FileMetaData) -> dict[str, Any]:
    """Delta file statistics (numRecords, minValues, maxValues, nullCount) from a Parquet footer.

    Only top-level primitive columns get min/max (as Delta collects them); binary columns get
    null counts only; a column whose statistics are missing in any row group is left out
    (a missing statistic only disables skipping, a wrong one would lose rows).
    """
    schema = meta.schema.to_arrow_schema()
    mins: dict[str, Any] = {}
    maxs: dict[str, Any] = {}
    nulls: dict[str, int] = {}
    top_level = {meta.schema.column(j).path: j for j in range(meta.num_columns)}
    for f in schema:
        j = top_level.get(f.name)
        if j is None:  # nested column (map/list/struct): several leaves, no Delta min/max
            continue
        lo = hi = None
        null_count = 0
        ok_minmax = ok_nulls = True
        for r in range(meta.num_row_groups):
            st = meta.row_group(r).column(j).statistics
            if st is None:
                ok_minmax = ok_nulls = False
                break
            if st.has_null_count:
                null_count += st.null_count
            else:
                ok_nulls = False
            if st.has_min_max:
                lo = st.min if lo is None else min(lo, st.min)
                hi = st.max if hi is None else max(hi, st.max)
            elif st.num_values:  # values present but no min/max recorded
                ok_minmax = False
        if ok_nulls:
            nulls[f.name] = null_count
        if not ok_minmax or lo is None:
            continue
        lo_j, hi_j = _stat_json(f.type, lo, is_max=False), _stat_json(f.type, hi, is_max=True)
        if lo_j is not None:
            mins[f.name] = lo_j
        if hi_j is not None:
            maxs[f.name] = hi_j
    return {"numRecords": meta.num_rows, "minValues": mins, "maxValues": maxs, "nullCount": nulls}


def _stat_json(t: pa.DataType, v: Any, *, is_max: bool) -> Any:
    if pa.types.is_timestamp(t):
        ts = v if isinstance(v, dt.datetime) else dt.datetime.fromtimestamp(v / 1e6, dt.UTC)
        if ts.tzinfo is None:
            ts = ts.replace(tzinfo=dt.UTC)
        if is_max and ts.microsecond % 1000:  # Delta stats have millisecond precision: round a max up
            ts = ts + dt.timedelta(microseconds=1000 - ts.microsecond % 1000)
        ts = ts.astimezone(dt.UTC)
        return ts.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ts.microsecond // 1000:03d}Z"
    if pa.types.is_date(t):
        return v.isoformat() if isinstance(v, dt.date) else (dt.date(1970, 1, 1) + dt.timedelta(days=int(v))).isoformat()
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        s = v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)
        if len(s) <= STATS_STRING_PREFIX:
            return s
        return None if is_max else s[:STATS_STRING_PREFIX]
    if pa.types.is_integer(t) or pa.types.is_floating(t):
        return v
    return None  # booleans, binary, decimals: no min/max (Delta skips them too)

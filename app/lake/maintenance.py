"""Table maintenance with delta-rs: optimize (small-file compaction, Z-order), vacuum, stats,
and a plain-PySpark reader for machines without the Delta jars.

delta-rs does these on the driver without Spark, on any table either writer produced. On a
cluster with delta-spark, `OPTIMIZE ... ZORDER BY` and `VACUUM` in Spark SQL are equivalent.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

import pyarrow as pa

from app.errors import LakeError, RetentionError
from app.lake.schema import PARTITION_COLUMNS
from app.lake.storage import absolute_url
from app.lake.writers import refuse_unsupported_features

if TYPE_CHECKING:
    from deltalake import DeltaTable
    from pyspark.sql import DataFrame, SparkSession

#: Delta's default `delta.deletedFileRetentionDuration` (interval 1 week).
DEFAULT_RETENTION_HOURS = 168.0
_INTERVAL = re.compile(r"interval\s+(\d+(?:\.\d+)?)\s+(second|minute|hour|day|week)s?", re.IGNORECASE)
_UNIT_HOURS = {"second": 1 / 3600, "minute": 1 / 60, "hour": 1.0, "day": 24.0, "week": 168.0}


#: The longest vacuum retention taken: about 114 years. delta-rs takes whole hours as an
#: unsigned 64-bit number and turns them into milliseconds; a longer one would overflow there.
MAX_RETENTION_HOURS = 1_000_000.0
#: delta-rs's own bounds for an optimize target file size (bytes).
MAX_TARGET_SIZE = 2**63 - 1


def open_table(table_uri: str, storage_options: dict[str, str] | None = None) -> DeltaTable:
    from deltalake import DeltaTable

    table_uri = absolute_url(table_uri)
    if not DeltaTable.is_deltatable(table_uri, storage_options=storage_options):
        raise LakeError(f"{table_uri} is not a Delta table (no readable _delta_log)",
                        hint="run `prism lake compact` first, or check the table URL")
    return DeltaTable(table_uri, storage_options=storage_options)


def check_target_size(target_size: int | None) -> None:
    """`--target-size` in range; checked before the table is opened (and here, not left to
    delta-rs: its refusal is an OverflowError or ValueError)."""
    if target_size is not None and not 1 <= target_size <= MAX_TARGET_SIZE:
        raise LakeError(f"target size of {target_size} bytes is out of range", path="--target-size",
                        hint=f"give a file size in bytes from 1 to {MAX_TARGET_SIZE}, e.g. 268435456 (256 MiB)")


def check_zorder_columns(zorder: list[str] | None) -> None:
    """What can be said of `--zorder` without the table: not a partition column."""
    bad = [c for c in zorder or [] if c in PARTITION_COLUMNS]
    if bad:
        raise LakeError(f"cannot Z-order by partition column(s) {bad}", path="--zorder",
                        hint="partitions are already separated; pick data columns such as published_at_ms")


def check_retention_hours(retention_hours: float) -> None:
    """A finite number of hours in range (NaN passed every comparison of `vacuum` and then
    failed in math.ceil)."""
    if not (math.isfinite(retention_hours) and 0 <= retention_hours <= MAX_RETENTION_HOURS):
        raise LakeError(f"retention of {retention_hours:g} hours is not a number of hours from 0 to "
                        f"{MAX_RETENTION_HOURS:g}", path="--retention-hours",
                        hint=f"e.g. --retention-hours {DEFAULT_RETENTION_HOURS:g} (Delta's default, 7 days)")


def optimize(table_uri: str, *, zorder: list[str] | None = None, target_size: int | None = None,
             storage_options: dict[str, str] | None = None) -> dict[str, Any]:
    """Rewrite small files into larger ones, optionally Z-ordered by `zorder` columns."""
    check_target_size(target_size)
    check_zorder_columns(zorder)
    dt = open_table(table_uri, storage_options)
    if zorder:
        known = {f.name for f in dt.schema().fields}
        unknown = [c for c in zorder if c not in known]
        if unknown:
            raise LakeError(f"unknown Z-order column(s) {unknown}", hint=f"choose from {sorted(known)}")
        metrics = dt.optimize.z_order(zorder, target_size=target_size)
    else:
        metrics = dt.optimize.compact(target_size=target_size)
    return {"table": table_uri, "version": dt.version(), "zorder": zorder or [], **dict(metrics)}


def min_retention_hours(dt: DeltaTable) -> float:
    """The table's `delta.deletedFileRetentionDuration`, or Delta's default of 7 days."""
    raw = (dt.metadata().configuration or {}).get("delta.deletedFileRetentionDuration")
    m = _INTERVAL.fullmatch(raw.strip()) if raw else None
    return float(m[1]) * _UNIT_HOURS[m[2].lower()] if m else DEFAULT_RETENTION_HOURS


def vacuum(table_uri: str, *, retention_hours: float = DEFAULT_RETENTION_HOURS, force: bool = False,
           dry_run: bool = False, full: bool = True, storage_options: dict[str, str] | None = None) -> dict[str, Any]:
    """Delete files no current version needs that are older than the retention.

    Like Delta, a retention under the table's minimum (7 days by default) is refused unless
    `force`: readers of older versions, or a job still writing, may need those files.
    `full=True` (Delta's default VACUUM mode) also removes files no commit ever referenced,
    e.g. those of a compaction run killed before its commit.
    """
    check_retention_hours(retention_hours)
    dt = open_table(table_uri, storage_options)
    minimum = min_retention_hours(dt)
    if retention_hours < minimum and not force:
        raise RetentionError(
            f"retention of {retention_hours:g} hours is under the table's minimum of {minimum:g} hours",
            hint="concurrent readers and writers may still need those files; pass --force if you are sure")
    files = dt.vacuum(retention_hours=math.ceil(retention_hours), dry_run=dry_run,
                      enforce_retention_duration=False, full=full)
    return {"table": table_uri, "dry_run": dry_run, "retention_hours": retention_hours, "full": full,
            "files": len(files), "paths": sorted(files)}


@dataclass(frozen=True, slots=True)
class TableStats:
    table: str
    version: int
    versions: int
    rows: int
    files: int
    bytes: int
    partitions: int
    columns: int
    partition_columns: list[str]
    min_reader_version: int
    min_writer_version: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def stats(table_uri: str, storage_options: dict[str, str] | None = None) -> TableStats:
    """Rows, files, bytes and partitions of the current version; how many versions exist."""
    dt = open_table(table_uri, storage_options)
    actions = pa.table(dt.get_add_actions(flatten=True))
    part_cols = [f"partition.{c}" for c in dt.metadata().partition_columns]
    partitions = len(set(zip(*(actions.column(c).to_pylist() for c in part_cols), strict=True))) if part_cols and actions.num_rows else 0
    rows = sum(v or 0 for v in actions.column("num_records").to_pylist()) if actions.num_rows else 0
    size = sum(actions.column("size_bytes").to_pylist()) if actions.num_rows else 0
    proto = dt.protocol()
    return TableStats(table_uri, dt.version(), len(dt.history()), rows, actions.num_rows, size, partitions,
                      len(dt.schema().fields), list(dt.metadata().partition_columns),
                      proto.min_reader_version, proto.min_writer_version)


def read_with_spark(spark: SparkSession, table_uri: str, storage_options: dict[str, str] | None = None) -> DataFrame:
    """The current version as a plain-PySpark DataFrame, without the Delta jars.

    Reads exactly the files of the current version (`DeltaTable.file_uris()`), adding the
    partition columns from the log (Delta files do not contain them). Tables whose readers
    must apply deletion vectors or column mapping are refused rather than misread. One
    `union` per partition: right for checks and modest tables; large ones want delta-spark.
    """
    from pyspark.sql import functions as F
    from pyspark.sql.pandas.types import from_arrow_schema, from_arrow_type

    dt = open_table(table_uri, storage_options)
    refuse_unsupported_features(dt)
    schema = pa.schema(dt.schema().to_arrow())
    part_cols = list(dt.metadata().partition_columns)
    actions = pa.table(dt.get_add_actions(flatten=True)).to_pylist()
    root = dt.table_uri.rstrip("/")
    groups: dict[tuple[Any, ...], list[str]] = {}
    for a in actions:
        # `path` is URL-encoded as in the log; Spark wants the literal file name (which may hold
        # Spark's own %-escapes of partition values, e.g. namespace=a%2Fb).
        groups.setdefault(tuple(a[f"partition.{c}"] for c in part_cols), []).append(f"{root}/{unquote(a['path'])}")
    data_cols = [f.name for f in schema if f.name not in part_cols]
    data_schema = from_arrow_schema(pa.schema([schema.field(c) for c in data_cols]))
    frames = []
    for values, paths in groups.items():
        # An explicit schema: files written before an additive schema change read the new columns as NULL.
        df = spark.read.schema(data_schema).parquet(*paths)
        for c, v in zip(part_cols, values, strict=True):
            df = df.withColumn(c, F.lit(v).cast(from_arrow_type(schema.field(c).type)))
        frames.append(df.select(*data_cols, *part_cols))
    if not frames:
        return spark.createDataFrame([], from_arrow_schema(schema)).select(*data_cols, *part_cols)
    out = frames[0]
    for df in frames[1:]:
        out = out.unionByName(df)
    return out

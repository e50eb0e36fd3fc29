"""The lakehouse: archive sink (envelope bytes -> rolling Parquet) and the Spark job that compacts
the archive into a typed, deduplicated Delta table (see docs/lakehouse.md).

Importing this package does not import Spark; `app.lake.compact`, `app.lake.writers` and
`app.lake.maintenance.read_with_spark` do, when used.
"""

from app.lake.archive import Archive, ArchiveFile, ArchiveRecord, ArchiveSink, ArchiveStats, Manifest

__all__ = ["Archive", "ArchiveFile", "ArchiveRecord", "ArchiveSink", "ArchiveStats", "Manifest"]

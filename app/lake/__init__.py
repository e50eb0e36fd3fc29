"""The lakehouse: archive sink (envelope bytes -> rolling Parquet) and the Spark job that compacts
the archive into a typed, deduplicated Delta table (see docs/lakehouse.md).

Importing this package does not import Spark; `app.lake.compact`, `app.lake.writers` and
`app.lake.maintenance.read_with_spark` do, when used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from app.lake.archive import Archive, ArchiveFile, ArchiveRecord, ArchiveSink, ArchiveStats, Manifest

__all__ = ["Archive", "ArchiveFile", "ArchiveRecord", "ArchiveSink", "ArchiveStats", "Manifest"]


def __getattr__(name: str) -> Any:
    """The archive names load (with pyarrow, ~0.2 s) on first use: every `prism` command imports
    :mod:`app.lake.cli` to mount `prism lake`, most of them never touch the archive."""
    if name in __all__:
        from app.lake import archive

        return getattr(archive, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

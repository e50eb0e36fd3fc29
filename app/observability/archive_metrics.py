"""The worker's archive tap on `/metrics`: what it committed to the archive, read at scrape time.

Why a collector and not counters incremented by the tap: the sink already keeps its totals
(`ArchiveSink.stats`), so reading them when Prometheus scrapes costs the archive path nothing
and cannot drift from what the sink reports elsewhere. A worker without an archive tap (archive
disabled, or no archive location) exports the families without samples, so "no archive here"
is never confused with "an archive that wrote nothing".

    prism_archive_records_total        records committed to the archive (in completed rolls)
    prism_archive_rolls_total          rolls committed (one manifest each)
    prism_archive_files_total          Parquet files committed
    prism_archive_bytes_total          bytes of those files
    prism_archive_undecodable_total    records that could not be decoded (not archived)
    prism_archive_buffered_records     records accepted, waiting for the next roll

A stalled tap shows as `rolls_total` not increasing while the pipeline emits; the pod (and
with it the writer id, `PRISM_ARCHIVE_WRITER_ID`) comes from the scrape target's labels.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

if TYPE_CHECKING:
    from app.lake.archive import ArchiveSink

#: (metric name without `_total`, ArchiveStats field, help)
_COUNTERS = (
    ("prism_archive_records", "records_written", "Records committed to the archive (completed rolls)"),
    ("prism_archive_rolls", "rolls", "Archive rolls committed (one manifest each)"),
    ("prism_archive_files", "files", "Parquet files committed to the archive"),
    ("prism_archive_bytes", "bytes", "Bytes of the Parquet files committed to the archive"),
    ("prism_archive_undecodable", "undecodable", "Records the archive tap could not decode (not archived)"),
)


class ArchiveCollector:
    """`prism_archive_*` from `sink()` (None: no archive tap in this worker)."""

    def __init__(self, sink: Callable[[], ArchiveSink | None]) -> None:
        self.sink = sink

    def collect(self) -> Iterable[Metric]:
        sink = self.sink()
        for name, attr, doc in _COUNTERS:
            fam = CounterMetricFamily(name, doc)
            if sink is not None:
                fam.add_metric([], float(getattr(sink.stats, attr)))
            yield fam
        buffered = GaugeMetricFamily("prism_archive_buffered_records",
                                     "Records accepted by the archive tap, waiting for the next roll")
        if sink is not None:
            # the sink's buffers may change under a roll running in a thread: skip one scrape
            with contextlib.suppress(RuntimeError):
                buffered.add_metric([], float(sink.buffered_records))
        yield buffered

"""Per-source sequence tracking (LNMP ``sequence``: a monotonically increasing u64 per entity).

For each source the table keeps the highest sequence seen and running totals, and every new
value is classified against it:

========== ============================== =========================================
status     condition (``last`` = highest)  meaning
========== ============================== =========================================
ok         first value, or ``last + 1``    in order
gap        ``> last + 1``                  ``seq - last - 1`` values missing (lost, or
                                           still in flight on another path)
duplicate  ``== last``                     redelivery of the latest value
regression ``< last``                      late/out-of-order or replayed value, or a
                                           producer that restarted its counter
========== ============================== =========================================

``last`` only moves forward (ok and gap), so one stray low value cannot make every following
in-order value look like a gap. A regression cannot tell a late arrival from a counter reset
without per-value history; the verdict carries ``last`` so a caller can apply its own policy.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from app.tables.base import current_partition, make_table

__all__ = ["MAX_SEQUENCE", "FaustSequenceTracker", "SequenceStatus", "SequenceTracker", "SequenceVerdict",
           "SourceStats"]

#: Largest value of a u64.
MAX_SEQUENCE = 2**64 - 1


class SequenceStatus(StrEnum):
    OK = "ok"
    GAP = "gap"
    DUPLICATE = "duplicate"
    REGRESSION = "regression"


@dataclass(frozen=True, slots=True)
class SequenceVerdict:
    """Classification of one observed sequence value."""

    status: SequenceStatus
    sequence: int
    #: Highest sequence seen before this one (``None`` for a source's first value).
    last: int | None
    #: Values skipped (``gap`` only).
    missing: int = 0

    @property
    def in_order(self) -> bool:
        return self.status is SequenceStatus.OK


@dataclass(frozen=True, slots=True)
class SourceStats:
    """What the table knows about one source."""

    last: int
    seen: int
    missing: int
    duplicates: int
    regressions: int

    @classmethod
    def from_value(cls, value: Any) -> SourceStats:
        return cls(last=int(value["last"]), seen=int(value["seen"]), missing=int(value["missing"]),
                   duplicates=int(value["duplicates"]), regressions=int(value["regressions"]))

    def to_value(self) -> dict[str, int]:
        return {"last": self.last, "seen": self.seen, "missing": self.missing,
                "duplicates": self.duplicates, "regressions": self.regressions}


class SequenceTracker:
    """Classifies sequence values per source. ``backend``: mapping ``source -> stats dict``."""

    def __init__(self, backend: MutableMapping[str, Any]) -> None:
        self.backend = backend

    @staticmethod
    def _validate(source: str, sequence: int) -> None:
        if not isinstance(source, str) or not source:
            raise ValueError(f"source must be a non-empty string, got {source!r}")
        if isinstance(sequence, bool) or not isinstance(sequence, int):
            raise ValueError(f"sequence must be an integer, got {type(sequence).__name__}")
        if not 0 <= sequence <= MAX_SEQUENCE:
            raise ValueError(f"sequence {sequence} is outside the u64 range 0..{MAX_SEQUENCE}")

    def observe(self, source: str, sequence: int) -> SequenceVerdict:
        """Classify ``sequence`` for ``source`` and record it."""
        self._validate(source, sequence)
        value = self.backend.get(source)
        if value is None:
            self.backend[source] = SourceStats(sequence, 1, 0, 0, 0).to_value()
            return SequenceVerdict(SequenceStatus.OK, sequence, None)
        stats = SourceStats.from_value(value)
        last = stats.last
        missing = 0
        if sequence == last + 1:
            status, new_last = SequenceStatus.OK, sequence
        elif sequence > last:
            status, new_last, missing = SequenceStatus.GAP, sequence, sequence - last - 1
        elif sequence == last:
            status, new_last = SequenceStatus.DUPLICATE, last
        else:
            status, new_last = SequenceStatus.REGRESSION, last
        self.backend[source] = SourceStats(
            last=new_last,
            seen=stats.seen + 1,
            missing=stats.missing + missing,
            duplicates=stats.duplicates + (status is SequenceStatus.DUPLICATE),
            regressions=stats.regressions + (status is SequenceStatus.REGRESSION),
        ).to_value()
        return SequenceVerdict(status, sequence, last, missing)

    def last(self, source: str) -> int | None:
        value = self.backend.get(source)
        return None if value is None else int(value["last"])

    def stats(self, source: str) -> SourceStats | None:
        value = self.backend.get(source)
        return None if value is None else SourceStats.from_value(value)

    def snapshot(self) -> dict[str, SourceStats]:
        """All sources (on a Faust table: the partitions this worker holds)."""
        return {key: SourceStats.from_value(value) for key, value in self.backend.items() if value is not None}


class FaustSequenceTracker(SequenceTracker):
    """:class:`SequenceTracker` on a RocksDB-backed Faust table with a changelog.

    Call :meth:`observe` inside the agent; a source's messages must stay on one partition (which
    per-source ordering needs anyway: Kafka orders only within a partition).
    """

    def __init__(self, app: Any, name: str = "sequences", *, partitions: int | None = None) -> None:
        self.table = make_table(app, name, partitions=partitions,
                                help="source -> last sequence and gap/duplicate/regression totals")
        super().__init__(self.table)

    def observe(self, source: str, sequence: int) -> SequenceVerdict:
        current_partition()  # fail clearly outside an agent instead of deep inside Faust
        return super().observe(source, sequence)

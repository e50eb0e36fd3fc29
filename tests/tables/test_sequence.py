"""SequenceTracker core: ok / gap(n) / duplicate / regression, u64 bounds, running totals."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.tables.sequence import MAX_SEQUENCE, SequenceStatus, SequenceTracker, SequenceVerdict, SourceStats

OK, GAP, DUP, REG = SequenceStatus.OK, SequenceStatus.GAP, SequenceStatus.DUPLICATE, SequenceStatus.REGRESSION


def test_classification_table() -> None:
    tracker = SequenceTracker({})
    assert tracker.observe("s", 5) == SequenceVerdict(OK, 5, None)  # first value of a source
    assert tracker.observe("s", 6) == SequenceVerdict(OK, 6, 5)
    assert tracker.observe("s", 9) == SequenceVerdict(GAP, 9, 6, missing=2)
    assert tracker.observe("s", 9) == SequenceVerdict(DUP, 9, 9)
    assert tracker.observe("s", 7) == SequenceVerdict(REG, 7, 9)  # late arrival of a missing one
    assert tracker.observe("s", 10) == SequenceVerdict(OK, 10, 9)  # last did not move back
    assert tracker.stats("s") == SourceStats(last=10, seen=6, missing=2, duplicates=1, regressions=1)


def test_sources_are_independent() -> None:
    tracker = SequenceTracker({})
    tracker.observe("a", 1)
    assert tracker.observe("b", 100).status is OK
    assert tracker.observe("a", 2).in_order
    assert tracker.last("a") == 2 and tracker.last("b") == 100 and tracker.last("c") is None
    assert set(tracker.snapshot()) == {"a", "b"}


def test_u64_bounds() -> None:
    tracker = SequenceTracker({})
    assert tracker.observe("s", 0).status is OK
    assert tracker.observe("s", MAX_SEQUENCE) == SequenceVerdict(GAP, MAX_SEQUENCE, 0, missing=MAX_SEQUENCE - 1)
    assert tracker.observe("s", MAX_SEQUENCE).status is DUP
    for bad in (-1, MAX_SEQUENCE + 1):
        with pytest.raises(ValueError, match="outside the u64 range"):
            tracker.observe("s", bad)


@pytest.mark.parametrize("source, sequence, match", [
    ("", 1, "source must be a non-empty string"),
    (None, 1, "source must be a non-empty string"),
    ("s", True, "sequence must be an integer"),
    ("s", 1.0, "sequence must be an integer"),
    ("s", "1", "sequence must be an integer"),
])
def test_invalid_input(source: Any, sequence: Any, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        SequenceTracker({}).observe(source, sequence)


def test_values_are_plain_json_types() -> None:
    backend: dict[str, Any] = {}
    SequenceTracker(backend).observe("s", 3)
    assert backend == {"s": {"last": 3, "seen": 1, "missing": 0, "duplicates": 0, "regressions": 0}}


@given(st.lists(st.integers(min_value=0, max_value=200), min_size=1, max_size=200))
def test_matches_a_reference_model(sequences: list[int]) -> None:
    tracker = SequenceTracker({})
    last: int | None = None
    missing = duplicates = regressions = 0
    for seq in sequences:
        verdict = tracker.observe("src", seq)
        if last is None or seq == last + 1:
            expected = OK
        elif seq > last + 1:
            expected = GAP
            missing += seq - last - 1
        elif seq == last:
            expected = DUP
            duplicates += 1
        else:
            expected = REG
            regressions += 1
        assert verdict.status is expected
        last = seq if last is None else max(last, seq)
    assert tracker.stats("src") == SourceStats(last, len(sequences), missing, duplicates, regressions)

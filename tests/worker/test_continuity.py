"""OffsetTracker: the bookkeeping that notices records the consumer never handed over."""

from __future__ import annotations

from app.worker.continuity import Hole, OffsetTracker


def test_consecutive_offsets_take_the_fast_path() -> None:
    t = OffsetTracker()
    t.start_at("t", 0, 5)
    assert [t.advance("t", 0, o) for o in (5, 6, 7)] == [True, True, True]
    assert t.observe("t", 0, 8) is None


def test_unknown_partition_is_not_the_fast_path() -> None:
    t = OffsetTracker()
    assert not t.advance("t", 0, 0)
    assert not t.known("t", 0)
    assert t.observe("t", 0, 0) is None  # nothing to compare with: no hole
    assert t.advance("t", 0, 1)


def test_a_skipped_offset_is_reported_once() -> None:
    t = OffsetTracker()
    t.start_at("t", 3, 0)
    for o in range(56):
        assert t.advance("t", 3, o)
    assert not t.advance("t", 3, 57)
    hole = t.observe("t", 3, 57)
    assert hole == Hole("t", 3, 56, 57)
    assert str(hole) == "t[3] offset 56"
    assert t.advance("t", 3, 58)


def test_a_missing_first_record_is_a_hole_from_the_start_offset() -> None:
    t = OffsetTracker()
    t.start_at("t", 1, 10)
    assert not t.advance("t", 1, 13)
    assert t.observe("t", 1, 13) == Hole("t", 1, 10, 13)
    assert str(Hole("t", 1, 10, 13)) == "t[1] offset 10..12"


def test_a_redelivery_moves_the_expectation_back_without_a_hole() -> None:
    t = OffsetTracker()
    t.start_at("t", 0, 0)
    for o in range(10):
        t.advance("t", 0, o)
    assert not t.advance("t", 0, 4)  # Faust sought back to the committed offset
    assert t.observe("t", 0, 4) is None
    assert t.advance("t", 0, 5)


def test_forgotten_partitions_start_afresh() -> None:
    t = OffsetTracker()
    t.start_at("a", 0, 0)
    t.start_at("a", 1, 0)
    t.forget([("a", 0)])
    assert not t.known("a", 0) and t.known("a", 1)
    assert len(t) == 1

"""The recovery decision of app/tables/recovery.py, without a broker: which partitions keep their
local store, which get a corrected end offset, which are wiped and rebuilt."""

from __future__ import annotations

from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from app.tables.recovery import AheadOfChangelog, plan_recovery, reconcile

A, B, C, D = ("cl", 0), ("cl", 1), ("cl", 2), ("cl", 3)


def test_nothing_ahead_nothing_to_do() -> None:
    assert plan_recovery({A: 10, B: None, C: -1}, {A: 10, B: 5, C: 7}) == []
    assert plan_recovery({A: 3}, {A: 10}) == []


def test_store_ahead_of_the_changelog_is_named() -> None:
    # the measured case: persisted 2812, ListOffsets says 2717
    assert plan_recovery({B: 2812}, {B: 2717}) == [AheadOfChangelog(B, 2812, 2717)]


def test_empty_changelog_with_a_local_store_is_ahead() -> None:
    # Faust's own check skips a highwater of 0 (falsy); a local store beyond an empty or
    # one-record changelog is still ahead of it
    assert plan_recovery({A: 5, B: 5}, {A: -1, B: 0}) == [AheadOfChangelog(A, 5, -1), AheadOfChangelog(B, 5, 0)]


def test_unknown_end_never_wipes() -> None:
    assert plan_recovery({A: 5}, {}) == []
    assert plan_recovery({A: 5}, {A: None}) == []


def test_only_the_partitions_asked_for() -> None:
    assert plan_recovery({A: 9, B: 9}, {A: 1, B: 1}, [B]) == [AheadOfChangelog(B, 9, 1)]


def test_short_listoffsets_is_corrected_and_the_store_kept() -> None:
    # the embedded broker's bug through PRISM_BROKER_URL: the fetch sees the true end
    corrected, rebuild = reconcile({B: 2812}, {B: 2717}, {B: 2812})
    assert corrected == {B: 2812} and rebuild == []


def test_real_loss_is_rebuilt() -> None:
    # the fetch confirms the changelog ends before the store: wipe and rebuild
    corrected, rebuild = reconcile({A: 500}, {A: 300}, {A: 300})
    assert corrected == {} and rebuild == [AheadOfChangelog(A, 500, 300)]


def test_partly_short_still_rebuilt_against_the_verified_end() -> None:
    corrected, rebuild = reconcile({A: 500}, {A: 300}, {A: 400})
    assert corrected == {A: 400} and rebuild == [AheadOfChangelog(A, 500, 400)]


def test_unverifiable_falls_back_to_the_listed_end() -> None:
    corrected, rebuild = reconcile({A: 500, B: 10}, Counter({A: 300, B: 20}), {})
    assert corrected == {} and rebuild == [AheadOfChangelog(A, 500, 300)]


def test_a_fetch_never_lowers_the_end() -> None:
    # a verified end below the listed one (a stale answer) is ignored, never used to wipe more
    corrected, rebuild = reconcile({A: 350}, {A: 300}, {A: 100})
    assert corrected == {} and rebuild == [AheadOfChangelog(A, 350, 300)]


offsets = st.one_of(st.none(), st.integers(min_value=-1, max_value=10_000))
tps = st.sampled_from([A, B, C, D])


@given(st.dictionaries(tps, offsets), st.dictionaries(tps, offsets), st.dictionaries(tps, st.integers(-1, 10_000)))
def test_after_reconcile_no_kept_store_is_ahead(persisted, listed, verified) -> None:
    corrected, rebuild = reconcile(persisted, listed, verified)
    ends = {**listed, **corrected}
    wiped = {a.tp for a in rebuild}
    for tp, mine in persisted.items():
        end = ends.get(tp)
        if tp not in wiped and mine is not None and end is not None:
            assert mine <= end  # what Faust then checks can never fail
    for tp, end in corrected.items():  # corrections only ever raise the end
        assert listed[tp] is not None and end > listed[tp]

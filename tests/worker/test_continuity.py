"""OffsetTracker: the bookkeeping that notices records the consumer never handed over."""

from __future__ import annotations

import asyncio
import time

import pytest

from app.worker.continuity import Hole, HoleFetcher, OffsetTracker


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


class _SilentBroker:
    """Accepts connections and never answers: a broker (or a coordinator) that hangs."""

    def __init__(self) -> None:
        self.server: asyncio.AbstractServer | None = None
        self.writers: list[asyncio.StreamWriter] = []

    async def __aenter__(self) -> str:
        async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.writers.append(writer)
            await reader.read()  # read requests forever, answer none

        self.server = await asyncio.start_server(hold, "127.0.0.1", 0)
        return f"127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        for w in self.writers:
            w.close()
        self.server.close()


async def test_start_offset_read_is_bounded_and_starts_afresh_after_a_hang() -> None:
    """A hung offset read used to hold the partition's first batch (and the worker) silently;
    now it raises after `timeout_s`, naming what it read, and drops the client so that the
    caller's retry makes a new connection and coordinator lookup."""
    async with _SilentBroker() as bootstrap:
        fetcher = HoleFetcher(bootstrap, group_id="g", timeout_s=0.5)
        t0 = time.monotonic()
        with pytest.raises(TimeoutError, match=r"could not read the start offset of src\[3\] from the broker within 0.5s"):
            await fetcher.expected_start("src", 3)
        assert time.monotonic() - t0 < 10
        assert fetcher._consumer is None
        with pytest.raises(TimeoutError, match=r"could not read src\[1\] offset 5..9 from the broker within 0.5s"):
            await fetcher.fetch(Hole("src", 1, 5, 10))
        await fetcher.stop()

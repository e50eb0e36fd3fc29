"""`install_direct_drain`: Faust's fetch loop with batch-source records appended straight to
their list - checked against a stand-in for Faust's consumer (the attributes the loop uses,
Faust's own round-robin scheduler), without a broker. What it must keep from Faust's loop:
read offsets and gaps, the conductor path for other topics and whenever the handler could
wait, a rebalance abandoning the rest of a fetch, a fetch made while flow is stopped seeking
back instead of delivering."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from types import SimpleNamespace
from typing import Any

from faust.transport.utils import DefaultSchedulingStrategy
from faust.types import TP

from app.worker.batch_source import BatchBuffer, install_direct_drain


class _Stop(Exception):
    pass


class FakeConsumer:
    """What the loop reads of Faust's consumer; `fetches` are the scripted results of
    `_wait_next_records` (a callable entry runs first, e.g. to start a rebalance)."""

    consumer_stopped_errors = (_Stop,)

    def __init__(self, fetches: list[Any], *, direct_topics: set[str], buffer_size: int = 100) -> None:
        self.fetches = list(fetches)
        self._stopped = asyncio.Event()
        self._read_offset: defaultdict[TP, int | None] = defaultdict(lambda: None)
        self._commit_every = None
        self._n_acked = 0
        self._buffered_partitions: set[TP] = set()
        self.flow_active = True
        self.should_stop = False
        self.suspend_flow = asyncio.Event()
        self.scheduler = DefaultSchedulingStrategy()
        self.delivered: list[tuple[str, int, int]] = []  # through the conductor callback
        self.gaps: list[tuple[TP, int, int]] = []
        self.seeks = 0
        self.highwaters: list[TP] = []
        flow = SimpleNamespace(active=True)
        flow.is_active = lambda: flow.active
        self.app = SimpleNamespace(
            consumer_generation_id=1, flow_control=flow,
            producer=SimpleNamespace(buffer=SimpleNamespace(size=0, max_messages=10)),
            topics=SimpleNamespace(acks_enabled_for=lambda topic: True),
            monitor=SimpleNamespace(track_tp_end_offset=lambda tp, hw: self.highwaters.append(tp)))
        self.transport = SimpleNamespace(app=SimpleNamespace(should_stop=True))
        self.buffer = BatchBuffer(buffer_size)
        self.sources = [SimpleNamespace(names=frozenset(direct_topics), buffer=self.buffer)]
        self.on_deliver: Any = None

    async def _drain_messages(self, fetcher: Any) -> None:  # Faust's loop, replaced by the install
        raise AssertionError("Faust's own loop ran")

    async def sleep(self, _: float) -> None:
        await asyncio.sleep(0)

    async def _wait_next_records(self, timeout: float) -> tuple[dict[TP, list[Any]] | None, set[TP] | None]:
        if not self.fetches:
            self._stopped.set()
            return None, None
        fetch = self.fetches.pop(0)
        if callable(fetch):
            fetch = fetch(self)
        return fetch, None

    def _to_message(self, tp: TP, record: Any) -> Any:
        return SimpleNamespace(topic=tp.topic, partition=tp.partition, offset=record, tp=tp,
                               generation_id=self.app.consumer_generation_id)

    def highwater(self, tp: TP) -> int:
        return 0

    async def perform_seek(self) -> None:
        self.seeks += 1

    async def _add_gap(self, tp: TP, start: int, end: int) -> None:
        self.gaps.append((tp, start, end))

    async def commit(self) -> None:
        pass

    async def callback(self, message: Any) -> None:
        self.delivered.append((message.topic, message.partition, message.offset))
        if self.on_deliver is not None:
            self.on_deliver(self, message)

    async def wait_first(self, *coros: Any) -> None:
        tasks = [asyncio.ensure_future(c) for c in coros]
        _, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for t in pending:
            t.cancel()


def _run(consumer: FakeConsumer) -> None:
    async def main() -> None:
        install_direct_drain(consumer, consumer.sources)
        assert consumer._prism_direct_drain
        await asyncio.wait_for(consumer._drain_messages(SimpleNamespace(_stopped=asyncio.Event())), 5)
    asyncio.run(main())


def _buffered(consumer: FakeConsumer) -> list[tuple[str, int, int]]:
    return [(m.topic, m.partition, m.offset) for m in consumer.buffer._items]


A0, A1, B0 = TP("a", 0), TP("a", 1), TP("b", 0)


def test_batch_source_records_go_to_the_list_partition_by_partition() -> None:
    c = FakeConsumer([{A0: [0, 1, 2], A1: [5, 6]}, {A0: [3]}], direct_topics={"a"})
    _run(c)
    assert _buffered(c) == [("a", 0, 0), ("a", 0, 1), ("a", 0, 2), ("a", 1, 5), ("a", 1, 6), ("a", 0, 3)]
    assert c.delivered == []  # no conductor round trip
    assert dict(c._read_offset) == {A0: 3, A1: 6}
    assert c.highwaters == [A0, A1, A0]  # once per partition per fetch, not per record


def test_other_topics_take_faust_path_in_its_round_robin_order() -> None:
    c = FakeConsumer([{A0: [0, 1], B0: [7, 8]}], direct_topics={"a"})
    _run(c)
    assert _buffered(c) == [("a", 0, 0), ("a", 0, 1)]
    assert c.delivered == [("b", 0, 7), ("b", 0, 8)]
    assert dict(c._read_offset) == {A0: 1, B0: 8}


def test_already_read_records_are_dropped_and_gaps_recorded() -> None:
    c = FakeConsumer([{A0: [0, 1]}, {A0: [0, 4]}], direct_topics={"a"})  # 0 was read already
    _run(c)
    assert _buffered(c) == [("a", 0, 0), ("a", 0, 1), ("a", 0, 4)]
    assert c.gaps == [(A0, 2, 4)]


def test_a_full_list_or_stopped_flow_takes_the_conductor_path() -> None:
    c = FakeConsumer([{A0: [0, 1, 2]}], direct_topics={"a"}, buffer_size=2)
    _run(c)
    assert _buffered(c) == [("a", 0, 0), ("a", 0, 1)]
    assert c.delivered == [("a", 0, 2)]  # the handler would have waited for room

    c = FakeConsumer([{A0: [0, 1]}], direct_topics={"a"})
    c.app.flow_control.active = False
    _run(c)
    assert _buffered(c) == [] and c.delivered == [("a", 0, 0), ("a", 0, 1)]

    c = FakeConsumer([{A0: [0]}], direct_topics={"a"})
    c.app.producer.buffer.size = 11  # over the producer buffer's limit: the handler waits for its ebb
    _run(c)
    assert c.delivered == [("a", 0, 0)]


def test_a_rebalance_during_an_await_abandons_the_rest_of_the_fetch() -> None:
    c = FakeConsumer([{A0: [0, 1], B0: [7, 8, 9]}], direct_topics={"a"})

    def rebalance(consumer: FakeConsumer, message: Any) -> None:
        consumer.app.consumer_generation_id += 1  # as Faust's on_partitions_revoked/assigned

    c.on_deliver = rebalance
    _run(c)
    # round robin: a0@0, b0@7 (delivered; the generation changes meanwhile), then nothing more
    assert _buffered(c) == [("a", 0, 0)]
    assert c.delivered == [("b", 0, 7)]
    assert dict(c._read_offset) == {A0: 0, B0: 7}


def test_a_fetch_made_while_flow_is_stopped_seeks_back_instead_of_delivering() -> None:
    def stopped(consumer: FakeConsumer) -> dict[TP, list[int]]:
        consumer.flow_active = False
        return {A0: [0, 1]}

    c = FakeConsumer([stopped], direct_topics={"a"})
    _run(c)
    assert c.seeks == 1 and _buffered(c) == [] and c.delivered == []

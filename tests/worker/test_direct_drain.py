"""`install_direct_drain`: Faust's fetch loop with batch-source records appended straight to
their list - checked against a stand-in for Faust's consumer (the attributes the loop uses,
Faust's own round-robin scheduler), without a broker. What it must keep from Faust's loop:
read offsets and gaps, the conductor path for other topics and whenever the handler could
wait, a rebalance abandoning the rest of a fetch, a fetch made while flow is stopped seeking
back instead of delivering, and records a buffer dropped while flow was active (mode's
`FlowControlEvent.resume()` clears it after Faust's seek) read again from the partition."""

from __future__ import annotations

import asyncio
from collections import defaultdict, deque
from types import SimpleNamespace
from typing import Any

from faust.transport.utils import DefaultSchedulingStrategy
from faust.types import TP

from app.worker.batch_source import BatchBuffer, install_direct_drain


class _Stop(Exception):
    pass


class Rec(int):
    """A fetched record as the loop sees it: its offset (aiokafka's `ConsumerRecord.offset`)."""

    @property
    def offset(self) -> int:
        return int(self)


class FakeClient:
    """aiokafka's consumer as `rewind_to` reads it: assigned partitions, positions, seek."""

    def __init__(self, positions: dict[tuple[str, int], int]) -> None:
        self.positions = positions
        self.seeks: list[tuple[str, int, int]] = []
        state = lambda ktp: SimpleNamespace(has_valid_position=True, position=self.positions[tuple(ktp)])  # noqa: E731
        self._subscription = SimpleNamespace(
            assigned_partitions=lambda: {tuple(tp) for tp in self.positions},
            subscription=SimpleNamespace(assignment=SimpleNamespace(state_value=state)))

    def seek(self, ktp: Any, offset: int) -> None:
        self.seeks.append((ktp.topic, ktp.partition, offset))
        self.positions[(ktp.topic, ktp.partition)] = offset


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
        flow = SimpleNamespace(active=True, _queues=[])
        flow.is_active = lambda: flow.active

        def resume() -> None:  # mode's FlowControlEvent.resume: active, then every queue cleared
            flow.active = True
            for queue in flow._queues:
                queue.clear()

        flow.resume = resume
        #: receivers of Faust's `on_rebalance_complete` (the drain holds the sources until the seek)
        self.rebalance_complete: list[Any] = []
        self.app = SimpleNamespace(tables=SimpleNamespace(_changelog_queue=None),
            consumer_generation_id=1, flow_control=flow,
            on_rebalance_complete=SimpleNamespace(connect=self.rebalance_complete.append),
            producer=SimpleNamespace(buffer=SimpleNamespace(size=0, max_messages=10)),
            topics=SimpleNamespace(acks_enabled_for=lambda topic: True),
            monitor=SimpleNamespace(track_tp_end_offset=lambda tp, hw: self.highwaters.append(tp)))
        self.transport = SimpleNamespace(app=SimpleNamespace(should_stop=True))
        self.buffer = BatchBuffer(buffer_size)
        self.sources = [SimpleNamespace(names=frozenset(direct_topics), buffer=self.buffer)]
        self.on_deliver: Any = None
        self.client = FakeClient({})

        async def call_thread(fn: Any) -> Any:
            return await fn()

        self._thread = SimpleNamespace(_ensure_consumer=lambda: self.client, call_thread=call_thread)

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
        return {tp: [Rec(r) for r in recs] for tp, recs in fetch.items()}, None

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
    assert len(c.rebalance_complete) == 1  # the sources are held from a recovery's end until its seek


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


def _clear(consumer: FakeConsumer, position: dict[tuple[str, int], int]) -> None:
    """mode's `FlowControlEvent.resume()`: flow active again, every managed queue cleared; the
    partitions' fetch positions are where the records taken so far left them."""
    consumer.client.positions.update(position)
    consumer.buffer.clear()


def test_records_a_clear_drops_while_flow_is_active_are_read_again_before_anything_after_them() -> None:
    def resumed_while_fetching(consumer: FakeConsumer) -> dict[TP, list[int]]:
        _clear(consumer, {("a", 0): 5})  # 0..2 buffered and cleared; 3, 4 in this fetch
        return {A0: [3, 4]}

    c = FakeConsumer([{A0: [0, 1, 2]}, resumed_while_fetching, {A0: [0, 1, 2, 3, 4]}], direct_topics={"a"})
    _run(c)
    assert c.client.seeks == [("a", 0, 0)]  # back to the first record dropped
    # 3 and 4 were not handed on after a hole: they come again, in order, after 0..2
    assert _buffered(c) == [("a", 0, n) for n in range(5)]
    assert c.gaps == [] and c.seeks == 0


def test_a_clear_during_the_loops_own_await_reads_the_rest_of_the_fetch_again_too() -> None:
    def resume(consumer: FakeConsumer, message: Any) -> None:  # the conductor's handler awaited
        consumer.on_deliver = None  # once
        _clear(consumer, {("a", 0): 3, ("b", 0): 10})

    # round robin: a0@0 (listed), b0@7 (conductor: the clear drops a0@0), then the rest abandoned
    c = FakeConsumer([{A0: [0, 1, 2], B0: [7, 8, 9]}, {A0: [0, 1, 2]}, {B0: [8, 9]}], direct_topics={"a"})
    c.on_deliver = resume
    _run(c)
    assert sorted(c.client.seeks) == [("a", 0, 0), ("b", 0, 8)]
    assert _buffered(c) == [("a", 0, 0), ("a", 0, 1), ("a", 0, 2)]
    assert c.delivered == [("b", 0, 7), ("b", 0, 8), ("b", 0, 9)]  # each once, in order


def test_a_partition_a_seek_already_moved_back_is_not_sought_and_keeps_what_it_fetched_since() -> None:
    def resumed(consumer: FakeConsumer) -> dict[TP, list[int]]:
        # the taker had 0 already; Faust's seek moved a0 back to 0 after 1, 2 were listed, and
        # this fetch took 0 again: 1 is next anyway (0 comes twice - the seek's at-least-once)
        consumer.buffer._items.pop(0)
        _clear(consumer, {("a", 0): 1})
        return {A0: [0]}

    c = FakeConsumer([{A0: [0, 1, 2]}, resumed, {A0: [1, 2]}], direct_topics={"a"})
    _run(c)
    assert c.client.seeks == []  # read from 1 next anyway
    assert _buffered(c) == [("a", 0, 0), ("a", 0, 1), ("a", 0, 2)]


def test_a_clear_while_flow_is_suspended_is_left_to_the_rebalances_seek() -> None:
    def revoked(consumer: FakeConsumer) -> dict[TP, list[int]]:
        consumer.app.flow_control.active = False  # Faust's on_partitions_revoked: suspend, then clear
        _clear(consumer, {("a", 0): 3})
        consumer.app.flow_control.active = True
        return {}

    c = FakeConsumer([{A0: [0, 1, 2]}, revoked], direct_topics={"a"})
    _run(c)
    assert c.client.seeks == [] and _buffered(c) == []


def test_a_clear_during_a_records_own_await_hands_on_neither_it_nor_the_rest() -> None:
    # a1 was just sought to its committed offset 3 (Faust's read offset then names the *next*
    # record, not the last one read): its 3 must be read again too, not taken as handed on
    c = FakeConsumer([{A0: [0, 1, 2]}, {A0: [5, 6], A1: [3, 4]}, {A0: [0, 1, 2, 5, 6], A1: [3, 4]}],
                     direct_topics={"a"})
    c._read_offset[A1] = 3

    async def gap_then_resume(tp: TP, start: int, end: int) -> None:  # a5's gap awaits; the resume clears
        c.gaps.append((tp, start, end))
        if len(c.gaps) == 1:
            _clear(c, {("a", 0): 7, ("a", 1): 5})

    c._add_gap = gap_then_resume  # type: ignore[method-assign]
    _run(c)
    assert sorted(c.client.seeks) == [("a", 0, 0), ("a", 1, 3)]
    assert _buffered(c) == [("a", 0, 0), ("a", 0, 1), ("a", 0, 2), ("a", 0, 5), ("a", 0, 6), ("a", 1, 3), ("a", 1, 4)]


def test_events_a_resume_clears_from_an_agents_queue_are_read_again() -> None:
    """A sink's stream queue (a Faust agent's, not a batch buffer) cleared by flow control's
    resume: the loop reads the partitions of its events again from the lowest one."""
    event = lambda p, o: SimpleNamespace(message=SimpleNamespace(tp=TP("s", p), offset=o))  # noqa: E731
    agent_queue = SimpleNamespace(_queue=deque([event(0, 4), event(0, 5), event(1, 9)]))
    agent_queue.clear = agent_queue._queue.clear

    def resumed(consumer: FakeConsumer) -> dict[TP, list[int]]:
        consumer.client.positions.update({("s", 0): 6, ("s", 1): 10})
        consumer.app.flow_control.resume()
        return {}

    c = FakeConsumer([resumed, {TP("s", 0): [4, 5], TP("s", 1): [9]}], direct_topics={"a"})
    c.app.flow_control._queues.append(agent_queue)
    _run(c)
    assert sorted(c.client.seeks) == [("s", 0, 4), ("s", 1, 9)] and not agent_queue._queue
    assert c.delivered == [("s", 0, 4), ("s", 1, 9), ("s", 0, 5)]  # round robin, each once

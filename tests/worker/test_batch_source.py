"""The batch source's buffer and its conductor hook, without a broker (the end-to-end
guarantees - crash, SIGTERM, continuity, rebalance - are the e2e tests in this folder)."""

from __future__ import annotations

import asyncio
import gc
import weakref
from types import SimpleNamespace
from typing import Any

import pytest

from app.worker.batch_source import (
    BatchBuffer,
    BatchSource,
    CurrentMessage,
    already_at_log_start,
    install_handler_hook,
    install_seek_uncommitted,
)


async def test_take_returns_at_most_max_n_in_arrival_order() -> None:
    buf = BatchBuffer(100)
    for i in range(7):
        buf.put(i)
    assert await buf.take(5, within=0.5) == [0, 1, 2, 3, 4]
    assert await buf.take(5, within=0) == [5, 6]
    assert len(buf) == 0


async def test_take_waits_for_the_first_then_at_most_within_for_more() -> None:
    buf = BatchBuffer(100)
    loop = asyncio.get_running_loop()
    loop.call_later(0.01, buf.put, "a")
    started = loop.time()
    batch = await asyncio.wait_for(buf.take(10, within=0.05), 2)
    assert batch == ["a"]
    assert loop.time() - started >= 0.05  # waited for more once it had one


async def test_take_returns_as_soon_as_the_batch_is_full() -> None:
    buf = BatchBuffer(100)
    loop = asyncio.get_running_loop()
    buf.put(0)
    for i in range(1, 3):
        loop.call_soon(buf.put, i)
    # `within` is far longer than the test may take: only a full batch ends the wait
    assert await asyncio.wait_for(buf.take(3, within=30), 2) == [0, 1, 2]


async def test_adaptive_take_does_not_wait_for_messages_not_yet_fetched() -> None:
    """Issue 29 (latency): with the default `within` a batch is what is buffered when the taker
    asks - a message arriving a moment later goes to the next batch instead of holding this one
    (the former 20 ms fill wait held every message of a light stream)."""
    buf = BatchBuffer(100)
    loop = asyncio.get_running_loop()
    buf.put("a")
    loop.call_soon(buf.put, "b")  # the next fetch: after the taker's turn
    assert await buf.take(500) == ["a"]  # awaited directly: a wait_for task would let "b" in first
    assert await asyncio.wait_for(buf.take(500), 2) == ["b"]


async def test_adaptive_take_gets_the_whole_fetch_appended_while_it_waited() -> None:
    """A waiting taker wakes only when the fetch loop yields, after it appended the whole fetch
    (it appends without awaiting): one fetch, one batch - not one batch per message."""
    buf = BatchBuffer(100)
    taker = asyncio.ensure_future(buf.take(500))
    await asyncio.sleep(0)  # the taker now waits for a first message
    assert not taker.done()
    for i in range(5):  # one fetch, appended in one go
        buf.put(i)
    assert await asyncio.wait_for(taker, 2) == [0, 1, 2, 3, 4]


async def test_adaptive_batches_grow_while_the_chain_is_busy() -> None:
    """Under load batches fill by themselves: what arrives while the chain works on one batch is
    the next batch, up to `batch_size` - no fill wait needed for full batches at full load."""
    gate = asyncio.Event()
    seen: list[list[int]] = []

    async def start(batch, previous):
        seen.append([m.offset for m in batch])
        if len(seen) == 1:
            await gate.wait()  # the chain is busy with the first batch

        async def finish() -> None:
            if previous is not None:
                await previous
        return finish()

    src = _source(start)
    src.split_partitions = False
    src.within = BatchSource.__init__.__kwdefaults__["within"]  # the default: adaptive
    task = asyncio.ensure_future(src.run())
    try:
        src.buffer.put(_msg(0, 0))
        for _ in range(100):
            if seen:
                break
            await asyncio.sleep(0.01)
        assert seen == [[0]]  # taken at once, alone
        for o in range(1, 16):  # 15 more arrive while the chain is busy
            src.buffer.put(_msg(0, o))
        gate.set()
        for _ in range(100):
            if sum(len(b) for b in seen) == 16:
                break
            await asyncio.sleep(0.01)
        assert seen == [[0], list(range(1, 11)), list(range(11, 16))]  # batch_size 10, then the rest
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_full_buffer_blocks_the_producer_until_a_take_makes_room() -> None:
    buf = BatchBuffer(2)
    buf.put(1)
    buf.put(2)
    assert buf.full()
    waiter = asyncio.ensure_future(buf.wait_room())
    await asyncio.sleep(0)
    assert not waiter.done()
    assert await buf.take(1, within=0) == [1]
    await asyncio.wait_for(waiter, 1)
    assert not buf.full()


async def test_clear_drops_everything_and_makes_room() -> None:
    buf = BatchBuffer(2)
    buf.put(1)
    buf.put(2)
    buf.clear()
    assert len(buf) == 0 and not buf.full()
    await asyncio.wait_for(buf.wait_room(), 1)
    taker = asyncio.ensure_future(buf.take(1, within=0))
    await asyncio.sleep(0.01)
    assert not taker.done()  # nothing left to take
    buf.put(3)
    assert await asyncio.wait_for(taker, 1) == [3]


def _fetched(partition: int, offset: int) -> Any:
    return SimpleNamespace(tp=("t", partition), partition=partition, offset=offset)


def test_a_clear_tells_the_lowest_offset_dropped_per_partition() -> None:
    buf = BatchBuffer(10)
    told: list[dict[Any, int]] = []
    buf.on_dropped = told.append
    buf.clear()  # nothing dropped: nothing told
    for m in (_fetched(1, 7), _fetched(0, 4), _fetched(1, 5), _fetched(0, 6)):
        buf.put(m)
    buf.clear()
    assert told == [{("t", 1): 5, ("t", 0): 4}]


async def test_the_handler_leaves_a_message_to_the_rewind_pending_for_its_partition() -> None:
    # a message that waited on flow control while its resume cleared the buffer: the partition's
    # pending rewind reads it again after what the clear dropped - put now, it would come first
    resumed = asyncio.Event()
    rewinds = {("t", 0): 3}
    app = SimpleNamespace(flow_control=SimpleNamespace(acquire=resumed.wait),
                          producer=SimpleNamespace(buffer=SimpleNamespace(wait_until_ebb=_done)),
                          consumer=SimpleNamespace(_prism_rewinds=rewinds))
    source = BatchSource.__new__(BatchSource)
    source.app, source.buffer = app, BatchBuffer(10)
    handler = source.handler()
    waiting = [asyncio.ensure_future(handler(m)) for m in (_fetched(0, 2), _fetched(0, 3), _fetched(0, 9), _fetched(1, 9))]
    await asyncio.sleep(0)
    resumed.set()
    await asyncio.gather(*waiting)
    assert [(m.partition, m.offset) for m in source.buffer._items] == [(0, 2), (1, 9)]


async def _done() -> None:
    return None


def test_buffer_size_must_be_positive() -> None:
    with pytest.raises(ValueError, match="maxsize"):
        BatchBuffer(0)


def test_current_message_is_what_faust_tables_read_and_can_be_weakly_referenced() -> None:
    msg = SimpleNamespace(topic="t", partition=3)
    current = CurrentMessage(msg)
    ref = weakref.ref(current)  # Faust keeps the current event as a weak reference
    assert ref().message.partition == 3
    del current
    gc.collect()
    assert ref() is None


class _Conductor:
    def __init__(self) -> None:
        self.built: list[str] = []

    def _build_handler(self, tp: object, channels: object) -> str:
        self.built.append("faust")
        return "faust-handler"


def test_hook_builds_the_batch_handler_only_for_batch_source_topics() -> None:
    conductor = _Conductor()
    install_handler_hook(conductor)
    install_handler_hook(conductor)  # idempotent
    source = SimpleNamespace(names=frozenset({"orders"}), handler=lambda: "batch-handler")
    conductor._prism_batch_sources.append(source)
    assert conductor._build_handler(SimpleNamespace(topic="orders", partition=0), {"chan"}) == "batch-handler"
    assert conductor._build_handler(SimpleNamespace(topic="other", partition=0), {"chan"}) == "faust-handler"
    with pytest.raises(RuntimeError, match="no other subscriber"):
        conductor._build_handler(SimpleNamespace(topic="orders", partition=1), {"chan", "agent"})


def test_ack_all_keeps_fausts_ack_bookkeeping(tmp_path) -> None:
    """`ack_all` against `Consumer.ack` on two real (unstarted) Faust consumers fed the same
    messages: already acknowledged, below the committed offset, repeated offsets, a topic whose
    acks are off, and the commit waiter woken."""
    from faust.types import TP
    from faust.types.tuples import ConsumerMessage

    from app.worker.batch_source import ack_all
    from app.worker.faust_app import make_app

    def consumer(name: str):  # type: ignore[no-untyped-def]
        app = make_app(f"t-ack-{name}", "127.0.0.1:1", tmp_path / name, embedded=True)
        app.topics._acking_topics.add("src")  # what the started conductor's index holds; "quiet": acks off
        c = app.consumer
        c._committed_offset[TP("src", 1)] = 10
        return c

    def messages(c):  # type: ignore[no-untyped-def]
        out = []
        for topic, part, offset in [("src", 0, 0), ("src", 0, 1), ("src", 0, 1), ("src", 1, 9), ("src", 1, 10),
                                    ("src", 1, 12), ("quiet", 0, 5), ("src", 0, 2)]:
            m = ConsumerMessage(topic, part, offset, 1.0, 0, [], b"k", b"v", None, 1, 1, TP(topic, part),
                                generation_id=0)
            m.tracked = True
            c._unacked_messages.add(m)
            out.append(m)
        out[-1].acked = True  # acknowledged before: skipped by both
        return out

    one, many = consumer("one"), consumer("many")
    ones, manys = messages(one), messages(many)
    for m in ones:
        one.ack(m)
    waiter = many._waiting_for_ack = many.loop.create_future()
    assert ack_all(many, manys) == 4
    assert waiter.done()
    for attr in ("_acked", "_acked_index"):
        assert {tp: v for tp, v in getattr(many, attr).items() if v} == \
            {tp: v for tp, v in getattr(one, attr).items() if v}, attr
    assert many._n_acked == one._n_acked == 4
    assert [m.acked for m in manys] == [m.acked for m in ones] == [True] * 8
    assert {(m.topic, m.partition, m.offset) for m in many._unacked_messages} == \
        {(m.topic, m.partition, m.offset) for m in one._unacked_messages}


def test_split_by_partition_keeps_each_partitions_order_and_release_wakes_waiters() -> None:
    """exactly_once: a batch is one partition's transaction (`_by_partition`); a committed batch's
    messages stop being tracked without a Faust ack (`release_all`), and a rebalance waiting for
    the tracked messages is woken."""
    from app.worker.batch_source import _by_partition, release_all

    msgs = [SimpleNamespace(partition=p, offset=o, acked=False) for p, o in ((0, 1), (1, 7), (0, 2), (2, 3), (1, 8))]
    assert [[(m.partition, m.offset) for m in part] for part in _by_partition(msgs)] == [
        [(0, 1), (0, 2)], [(1, 7), (1, 8)], [(2, 3)]]

    class Tracked:
        acked = False

    async def scenario() -> None:
        waiter = asyncio.get_running_loop().create_future()
        tracked = [Tracked() for _ in range(3)]
        consumer = SimpleNamespace(_unacked_messages=set(tracked), _waiting_for_ack=waiter)
        release_all(consumer, tracked[:2])
        assert consumer._unacked_messages == {tracked[2]} and tracked[0].acked and not tracked[2].acked
        assert waiter.done()

    asyncio.run(scenario())


def _source(start, *, depth: int = 2) -> BatchSource:
    """A split-partition BatchSource over a stand-in app: only what `run` reads."""
    src = object.__new__(BatchSource)
    consumer = SimpleNamespace(_unacked_messages=set())
    src.app = SimpleNamespace(consumer=consumer, consumer_generation_id=1,
                              flow_control=SimpleNamespace(is_active=lambda: True))
    src.buffer, src.start, src.batch_size, src.within = BatchBuffer(100), start, 10, 0.0
    src.depth, src.split_partitions = depth, True
    return src


class _Msg(SimpleNamespace):
    __hash__ = object.__hash__  # the consumer's unacked set holds messages


def _msg(partition: int, offset: int) -> _Msg:
    return _Msg(partition=partition, offset=offset, generation_id=1, tracked=False)


async def test_split_partitions_finish_side_by_side_and_each_partition_in_order() -> None:
    """exactly_once: partition 1's transaction must not wait behind partition 0's, but partition
    0's second batch waits for its first (a partition's transactions commit in order)."""
    release = {0: asyncio.Event()}
    finished: list[tuple[int, int]] = []
    previous_of: dict[tuple[int, int], object] = {}

    async def start(part, previous):
        key = (part[0].partition, part[0].offset)
        previous_of[key] = previous

        async def finish() -> None:
            if previous is not None:
                await previous
            if key == (0, 0):
                await release[0].wait()
            finished.append(key)

        return finish()

    src = _source(start, depth=3)
    task = asyncio.ensure_future(src.run())
    try:
        for m in (_msg(0, 0), _msg(1, 0)):
            src.buffer.put(m)
        await asyncio.sleep(0.05)
        assert finished == [(1, 0)]  # partition 1 done while partition 0's first batch waits
        for m in (_msg(0, 1), _msg(1, 1)):
            src.buffer.put(m)
        await asyncio.sleep(0.05)
        assert finished == [(1, 0), (1, 1)]
        assert previous_of[(0, 1)] is not None and not previous_of[(0, 1)].done()  # chained to (0, 0)
        release[0].set()
        for _ in range(100):
            if len(finished) == 4:
                break
            await asyncio.sleep(0.01)
        assert finished == [(1, 0), (1, 1), (0, 0), (0, 1)]
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_take_per_partition_bounds_each_partition_not_the_whole_take() -> None:
    """exactly_once (issue 29, a live stream): `max_n` is each partition's transaction's bound. A
    shared bound split a backlog of 4 partitions into transactions of a quarter of it, whose
    fixed cost then outgrew the rate the worker keeps up with. What a partition has beyond
    `max_n` stays buffered, in order, and comes first in the next take."""
    buf = BatchBuffer(100)
    msgs = [_msg(p, o) for o in range(4) for p in (0, 1, 2)]  # 12 messages, interleaved
    for m in msgs:
        buf.put(m)
    batch = await buf.take(3, per_partition=True)
    assert [(m.partition, m.offset) for m in batch] == [(p, o) for o in range(3) for p in (0, 1, 2)]
    assert [(m.partition, m.offset) for m in await buf.take(3, per_partition=True)] == [(0, 3), (1, 3), (2, 3)]
    assert len(buf) == 0 and not buf._nonempty.is_set()
    for m in [_msg(0, o) for o in range(5)] + [_msg(1, 0)]:
        buf.put(m)
    assert [(m.partition, m.offset) for m in await buf.take(2, per_partition=True)] == [(0, 0), (0, 1), (1, 0)]
    assert [m.offset for m in await buf.take(2)] == [2, 3]  # the rest kept its order; a shared bound
    assert [m.offset for m in await buf.take(2)] == [4]


async def test_split_partitions_take_up_to_batch_size_per_partition() -> None:
    """The exactly_once source loop takes `batch_size` messages of each partition at once."""
    seen: list[list[tuple[int, int]]] = []

    async def start(part, previous):
        seen.append([(m.partition, m.offset) for m in part])

        async def finish() -> None:
            if previous is not None:
                await previous
        return finish()

    src = _source(start)  # batch_size 10
    for o in range(10):
        for p in range(3):
            src.buffer.put(_msg(p, o))
    task = asyncio.ensure_future(src.run())
    try:
        for _ in range(100):
            if len(seen) == 3:
                break
            await asyncio.sleep(0.01)
        assert seen == [[(p, o) for o in range(10)] for p in range(3)]  # one take, three whole transactions
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


# --------------------------------------------------------------------------- install_seek_uncommitted
# Issue 31: every uncommitted batch-source partition is read from the start of its log; a
# partition already there is not sought (a seek waits for the fetch in flight: 1.5 s on Kafka).


def _state(*, reset: int | None = None, reset_to: int | None = None, consumed_to: int | None = None) -> Any:
    """aiokafka's own partition state, driven the way its fetcher drives it."""
    from aiokafka.consumer.subscription_state import TopicPartitionState

    state = TopicPartitionState(assignment=None)
    if reset is not None:
        state.await_reset(reset)
    if reset_to is not None:
        state.reset_to(reset_to)
    if consumed_to is not None:
        state.consumed_to(consumed_to)
    return state


async def test_already_at_log_start_only_where_no_record_was_taken() -> None:
    from aiokafka.consumer.fetcher import OffsetResetStrategy as R

    assert already_at_log_start(_state(reset=R.EARLIEST))                       # the reset goes there
    assert already_at_log_start(_state(reset=R.EARLIEST, reset_to=0))           # reset there, nothing taken
    assert not already_at_log_start(_state(reset=R.EARLIEST, reset_to=0, consumed_to=500))  # a dropped fetch's end
    assert not already_at_log_start(_state(reset=R.EARLIEST, reset_to=120))    # log start above 0 (retention)
    assert not already_at_log_start(_state(reset=R.LATEST))                     # would go to the end
    assert not already_at_log_start(_state())                                   # no position yet: sought as before


class _SeekClient:
    def __init__(self, states: dict[Any, Any]) -> None:
        self.states = states
        self.sought: list[Any] = []
        self._subscription = SimpleNamespace(subscription=SimpleNamespace(
            assignment=SimpleNamespace(state_value=states.__getitem__)))

    async def seek_to_beginning(self, *tps: Any) -> None:
        self.sought.extend(tps)


async def test_perform_seek_rewinds_the_moved_uncommitted_partitions_only() -> None:
    from aiokafka.consumer.fetcher import OffsetResetStrategy as R
    from aiokafka.structs import TopicPartition as TP

    src, other = "orders", "unrelated"
    states = {TP(src, 0): _state(reset=R.EARLIEST, reset_to=0),                  # fresh: already there
              TP(src, 1): _state(reset=R.EARLIEST, reset_to=0, consumed_to=700),  # fetched and dropped: rewind
              TP(src, 2): _state(reset=R.EARLIEST, reset_to=40),                  # log start 40: rewind (as before)
              TP(src, 3): _state(reset=R.EARLIEST, reset_to=0, consumed_to=90)}   # committed: Faust's own seek
    client = _SeekClient(states)
    seeks: list[str] = []

    async def faust_perform_seek() -> None:
        seeks.append("faust")

    async def call_thread(fun: Any) -> Any:
        return await fun()

    thread = SimpleNamespace(call_thread=call_thread, _ensure_consumer=lambda: client)
    consumer = SimpleNamespace(perform_seek=faust_perform_seek, _thread=thread,
                               _committed_offset={TP(src, 3): 90},
                               assignment=lambda: {*states, TP(other, 0)})
    install_seek_uncommitted(consumer, [SimpleNamespace(names=frozenset({src}))])
    install_seek_uncommitted(consumer, [SimpleNamespace(names=frozenset({src}))])  # once only
    await consumer.perform_seek()
    assert seeks == ["faust"]
    assert sorted(client.sought) == [TP(src, 1), TP(src, 2)]


class _PauseClient:
    """aiokafka's pause surface, in memory: what `hold_until_seek` and `set_fetching` touch."""

    def __init__(self, assigned: set[Any]) -> None:
        self.assigned, self._paused = set(assigned), set[Any]()
        self._subscription = SimpleNamespace(assigned_partitions=lambda: set(self.assigned))

    def paused(self) -> set[Any]:
        return set(self._paused)

    def pause(self, *tps: Any) -> None:
        self._paused.update(tps)

    def resume(self, *tps: Any) -> None:
        self._paused.difference_update(tps)


async def test_the_sources_are_held_until_the_seek_and_only_what_the_hold_paused_is_resumed() -> None:
    """The post-recovery seek's window (`hold_until_seek`): the batch sources' partitions are
    paused in aiokafka until the seek is done, then fetched again - except one the operator
    (or a blocked worker) paused, before or during the hold."""
    from aiokafka.structs import TopicPartition as TP

    from app.worker.batch_source import hold_until_seek, release_seek_hold, set_fetching

    src, table = "orders", "app-dedup-orders-changelog"
    client = _PauseClient({TP(src, 0), TP(src, 1), TP(src, 2), TP(table, 0)})
    client.pause(TP(src, 2))  # the management API's pause, re-applied at the assignment

    async def call_thread(fun: Any) -> Any:
        return await fun()

    consumer = SimpleNamespace(_thread=SimpleNamespace(call_thread=call_thread, _ensure_consumer=lambda: client),
                               assignment=lambda: {TP(src, p) for p in range(3)} | {TP(table, 0)})
    await hold_until_seek(consumer, frozenset({src}))
    assert client.paused() == {TP(src, 0), TP(src, 1), TP(src, 2)}  # the sources only, not the changelog
    await hold_until_seek(consumer, frozenset({src}))  # Faust announces a recovery's end twice
    assert consumer._prism_seek_hold == {TP(src, 0), TP(src, 1)}  # never the operator's
    await set_fetching(consumer, [TP(src, 1)], paused=True)  # paused meanwhile (a blocked worker)
    await release_seek_hold(consumer)
    assert client.paused() == {TP(src, 1), TP(src, 2)}
    assert consumer._prism_seek_hold == set()
    await release_seek_hold(consumer)  # nothing held: nothing changes
    assert client.paused() == {TP(src, 1), TP(src, 2)}


async def test_perform_seek_releases_the_hold_after_the_seeks() -> None:
    from aiokafka.structs import TopicPartition as TP

    src = "orders"
    client = _PauseClient({TP(src, 0)})
    order: list[str] = []

    async def call_thread(fun: Any) -> Any:
        return await fun()

    async def faust_perform_seek() -> None:
        order.append(f"seek, paused={sorted(p.partition for p in client.paused())}")

    consumer = SimpleNamespace(perform_seek=faust_perform_seek, _committed_offset={TP(src, 0): 5},
                               _thread=SimpleNamespace(call_thread=call_thread, _ensure_consumer=lambda: client),
                               assignment=lambda: {TP(src, 0)})
    install_seek_uncommitted(consumer, [SimpleNamespace(names=frozenset({src}))])
    from app.worker.batch_source import hold_until_seek

    await hold_until_seek(consumer, frozenset({src}))
    await consumer.perform_seek()
    assert order == ["seek, paused=[0]"] and client.paused() == set()

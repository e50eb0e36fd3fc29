"""Source topics handed to the stage chain in whole batches, beneath Faust's per-event path.

Faust delivers every fetched record through its conductor to each subscribed channel: it wraps
the record in an `Event`, decodes key and value, puts it on the channel's queue; the agent's
stream takes it off again, checks flow control and the consumer generation, tracks it for
acknowledgement, calls two sensors, sets the task-local current event, and after the body
acknowledges it and calls two more sensors. `take_events` then gathers the events into a list.
For Prism, whose chain works on whole batches anyway, all of that is per-record overhead
between the fetch and the chain (BENCHMARKS.md, "Release comparison").

:class:`BatchSource` keeps what Faust is good at and takes out only that path:

* **Faust still owns** the consumer group (subscription, rebalances, flow control), fetching,
  offset tracking and commits, the tables and their changelogs, the web server and shutdown.
  The source topic is registered with the conductor as a channel, so the consumer subscribes
  to it exactly as if an agent read it.
* **For this topic's partitions** the conductor's per-partition handler appends the fetched
  `Message` to a list (:class:`BatchBuffer`); no `Event`, no channel queue, no stream. The
  handler keeps the conductor's two waits (flow control, the producer buffer's ebb) and blocks
  while the buffer is full, which stops the fetch loop as a full stream queue would.
* **One task per source topic** takes up to ``batch_size`` messages (exactly_once: of each
  partition, :meth:`BatchBuffer.take`'s ``per_partition``) - what has been fetched
  when the chain is ready for another batch (below) - drops those from an earlier consumer
  generation or taken while flow control is suspended (a rebalance: they will be fetched again
  from the committed offset, exactly what the stream does), tracks the rest for
  acknowledgement and runs the batch through the chain. The caller acknowledges each message
  once its outputs are written (`consumer.ack`), so commits never pass an unwritten message:
  at-least-once holds.
* **Batches overlap** (``depth``, 2 by default): while the broker acknowledges one batch's
  writes, the chain runs over the next - the worker no longer sits idle for a round trip per
  batch. The writes, dedup records and acknowledgements still happen in batch order.

**Adaptive batches** (``within``, 0 by default): a batch does not wait to fill. Once the buffer
holds a message, the taker takes everything buffered, up to ``batch_size``. The fetch loop appends
a whole fetch before it next awaits, so under light input a batch is what one fetch returned and
its messages are not held back for later ones; under heavy input the buffer fills while the
chain works on the batch before, so batches grow by themselves up to ``batch_size`` (a backlog
is read in full batches, as before). The former fixed wait (20 ms for 500 messages) held every
message of a light stream for the whole wait: most of what the worker added to a hop's p50
(BENCHMARKS.md, issue 29). A positive ``within`` restores it (``take``'s contract is Faust's
``take_events``').

Rebalance and shutdown go through Faust's usual sequence: flow control is suspended and cleared
(:meth:`BatchBuffer.clear`: buffered, untracked messages are dropped), then Faust waits until
every tracked message is acknowledged (`stream_wait_empty`), i.e. for the batch in flight,
before it commits and gives the partitions up or stops.

**A message dropped while flow control is active is fetched again** (:func:`install_direct_drain`,
``rewinds``). mode's ``FlowControlEvent.resume()`` clears every queue it manages, and Faust's
recovery calls it *after* it resumed the stream partitions and sought them to the committed
offsets (``Recovery._resume_streams``: ``resume_partitions``, ``perform_seek``,
``flow_control.resume()``). Records fetched in between were put in the buffer, cleared, and no
seek followed: the offset tracker repaired them as a hole when a later record arrived, and when
they were a partition's last records nothing did - the partition stalled until the stall watch
rewound it 60 s later (found by the fresh-clone CI run: a second worker of a group, started after
a clean stop, read 609 of 900 records; on a loaded machine a hole in about one start in ten, a
stall in two of ~80). The loop seeks such partitions back before its next fetch, with whatever
of the fetch in hand it had not handed on yet. A clear while flow control is suspended (a
rebalance or a stop) still relies on the seek that ends the rebalance, as Faust does.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from typing import Any

__all__ = ["BatchBuffer", "BatchSource", "CurrentMessage", "ack_all", "hold_until_seek", "install_seek_uncommitted",
           "lowest_offsets", "release_all", "release_seek_hold", "rewind_to", "set_fetching", "set_source_fetching"]

log = logging.getLogger("prism.worker")


class CurrentMessage:
    """What Faust's tables read from the current event: `.message` (its topic, partition,
    offset, timestamp). Set as the task-local current event while a message's table writes
    run, so they route to the message's partition and changelog partition."""

    __slots__ = ("__weakref__", "message")

    def __init__(self, message: Any) -> None:
        self.message = message


class BatchBuffer:
    """The fetched messages of one source topic, waiting for the chain.

    `put` never waits (it is on the fetch loop's path); the handler waits for room with
    :meth:`wait_room` only when :meth:`full`. Managed by Faust's flow control, which calls
    :meth:`clear` on every rebalance and at shutdown."""

    def __init__(self, maxsize: int) -> None:
        if maxsize < 1:
            raise ValueError("maxsize must be >= 1")
        self.maxsize = maxsize
        self._items: list[Any] = []
        self._nonempty = asyncio.Event()
        self._room = asyncio.Event()
        self._room.set()
        self._want = 0  # a taker waiting for this many items (0: none)
        self._enough = asyncio.Event()
        #: told of every clear that dropped messages: ``{tp: lowest offset dropped}``
        #: (:func:`install_direct_drain` sets it, to fetch them again when no seek will)
        self.on_dropped: Callable[[dict[Any, int]], None] | None = None

    def __len__(self) -> int:
        return len(self._items)

    def full(self) -> bool:
        return len(self._items) >= self.maxsize

    def put(self, message: Any) -> None:
        items = self._items
        items.append(message)
        if len(items) == 1:
            self._nonempty.set()
        if self._want and len(items) >= self._want:
            self._enough.set()
        if len(items) >= self.maxsize:
            self._room.clear()

    async def wait_room(self) -> None:
        await self._room.wait()

    def clear(self) -> None:
        """Drop everything buffered (flow control's clear on a rebalance or at shutdown): none
        of it was tracked or acknowledged, so the committed offsets still lie before it. The
        consumer fetches it again: after a seek to the committed offsets (a rebalance), or
        because :attr:`on_dropped` rewinds the partitions (a clear with no seek after it)."""
        dropped, self._items = self._items, []
        self._nonempty.clear()
        self._room.set()
        if dropped and self.on_dropped is not None:
            self.on_dropped(lowest_offsets(dropped))

    async def take(self, max_n: int, within: float = 0.0, *, per_partition: bool = False) -> list[Any]:
        """Up to `max_n` messages: waits for the first, then at most `within` seconds for the
        batch to fill (Faust's `take_events` contract). ``within=0``: what is buffered now, not
        waiting for more (the adaptive batches of the module docstring).

        ``per_partition``: `max_n` bounds each partition's messages instead of the whole take
        (exactly_once, whose batch is one partition's transaction): a partition's batch grows
        with what accumulated while its previous transaction ran, as with at_least_once, instead
        of `max_n` being shared by every partition of the fetch (BENCHMARKS.md, "exactly_once on
        a live stream"). What a partition has beyond `max_n` stays buffered, in order."""
        while not self._items:
            await self._nonempty.wait()
        if len(self._items) < max_n and within > 0:
            self._want = max_n
            self._enough.clear()
            try:
                await asyncio.wait_for(self._enough.wait(), within)
            except TimeoutError:
                pass
            finally:
                self._want = 0
        items = self._items
        if per_partition and len(items) > max_n:
            batch, self._items = _per_partition(items, max_n)
        else:
            batch, self._items = items[:max_n], items[max_n:]
        if not self._items:
            self._nonempty.clear()
        if len(self._items) < self.maxsize:
            self._room.set()
        return batch


#: runs a batch through the chain; returns the coroutine that writes its outputs and
#: acknowledges it, after awaiting the previous batch's (the second argument) if any
Start = Callable[[list[Any], Awaitable[None] | None], Awaitable[Coroutine[Any, Any, None]]]


class BatchSource:
    """One source topic read beneath the conductor's per-event path (see the module docstring).

    Construct before the app starts; :meth:`run` is the task that feeds ``start``. ``depth``
    batches may be in flight: the chain runs over the next batch while the broker acknowledges
    the writes of the one before (1: strictly one after the other)."""

    def __init__(self, app: Any, topic: Any, start: Start, *, batch_size: int, within: float = 0.0,
                 buffer_size: int | None = None, depth: int = 2, split_partitions: bool = False) -> None:
        if depth < 1:
            raise ValueError("depth must be >= 1")
        #: one batch per source partition (exactly_once: a batch is one partition's transaction)
        self.split_partitions = split_partitions
        self.app = app
        self.topic = topic
        self.start = start
        self.batch_size = batch_size
        self.within = within
        self.depth = depth
        self.buffer = BatchBuffer(buffer_size or max(int(app.conf.stream_buffer_maxsize), batch_size))
        self.names = frozenset(topic.topics)
        app.flow_control.manage_queue(self.buffer)  # cleared with the agents' queues on a rebalance
        conductor = app.topics
        install_handler_hook(conductor)
        conductor._prism_batch_sources.append(self)
        conductor.add(topic)  # the consumer subscribes to it as for an agent's channel
        install_direct_drain(app.consumer, conductor._prism_batch_sources)
        # a later source joins the loop's rewinds too (install_direct_drain runs once per consumer)
        self.buffer.on_dropped = getattr(app.consumer, "_prism_on_dropped", None)

    def handler(self) -> Callable[[Any], Awaitable[None]]:
        """The conductor's per-partition callback for this topic (built per assignment)."""
        app = self.app
        acquire_flow_control = app.flow_control.acquire
        wait_until_producer_ebb = app.producer.buffer.wait_until_ebb
        buffer = self.buffer
        put, full = buffer.put, buffer.full
        rewinds: dict[Any, int] = getattr(app.consumer, "_prism_rewinds", {})

        async def on_message(message: Any) -> None:
            await acquire_flow_control()
            await wait_until_producer_ebb()
            while full():
                await buffer.wait_room()
            if rewinds and message.offset >= rewinds.get(message.tp, message.offset + 1):
                # The buffer was cleared while this waited (flow control's resume): the rewind
                # pending for its partition reads it again, after what the clear dropped.
                return
            put(message)

        return on_message

    async def run(self) -> None:
        """Take batches and process them until cancelled (at app shutdown, after Faust's wait
        for the batches in flight)."""
        app = self.app
        consumer = app.consumer
        flow = app.flow_control
        inflight: deque[asyncio.Future[None]] = deque()
        last_of: dict[int, asyncio.Future[None]] = {}  # split_partitions: each partition's last batch
        running: set[asyncio.Future[None]] = set()     # split_partitions: every batch not finished yet
        try:
            while True:
                while inflight and inflight[0].done():
                    inflight.popleft().result()  # a failed batch raises here
                batch = await self.buffer.take(self.batch_size, self.within, per_partition=self.split_partitions)
                generation = app.consumer_generation_id
                if not flow.is_active():
                    continue  # a rebalance or shutdown began: these are fetched again
                current = [m for m in batch if m.generation_id == generation]
                if not current:
                    continue
                unacked = consumer._unacked_messages
                for m in current:
                    if not m.tracked:
                        m.tracked = True
                        unacked.add(m)
                if self.split_partitions:
                    # One batch per partition, finished concurrently: each waits only for the
                    # previous batch of *its* partition (exactly_once: a partition's transactions
                    # commit in order; partitions have their own producers, so nothing orders them
                    # across partitions). Serialising them all put one partition's transaction
                    # round trips behind every other's (p50 latency x12, BENCHMARKS.md).
                    parts = []
                    for part in _by_partition(current):
                        key = part[0].partition
                        finish = await self.start(part, last_of.get(key))
                        fut = last_of[key] = asyncio.ensure_future(finish)
                        parts.append(fut)
                        running.add(fut)
                        fut.add_done_callback(running.discard)
                    inflight.append(asyncio.ensure_future(_all_of(parts)))
                else:
                    finish = await self.start(current, inflight[-1] if inflight else None)
                    inflight.append(asyncio.ensure_future(finish))
                while len(inflight) >= self.depth:
                    await inflight.popleft()
                for key in [k for k, f in last_of.items() if f.done()]:
                    del last_of[key]
        finally:
            for fut in inflight:
                fut.cancel()
            for fut in list(running):  # every partition's batch, not only each one's last
                fut.cancel()


async def _all_of(futures: list[asyncio.Future[None]]) -> None:
    """Wait for every future (not only until the first fails, as `gather` does), then raise the
    first failure: a fetch's batches are done only when all of its partitions' are."""
    await asyncio.wait(futures)
    for fut in futures:
        fut.result()


def _per_partition(items: list[Any], max_n: int) -> tuple[list[Any], list[Any]]:
    """`items` split into (the first `max_n` of each partition, the rest), both in their order."""
    taken: dict[int, int] = {}
    batch: list[Any] = []
    rest: list[Any] = []
    for m in items:
        n = taken.get(m.partition, 0)
        if n < max_n:
            taken[m.partition] = n + 1
            batch.append(m)
        else:
            rest.append(m)
    return batch, rest


def _by_partition(messages: list[Any]) -> list[list[Any]]:
    """`messages` split by partition, each part in fetch order (a partition's offsets ascending)."""
    parts: dict[int, list[Any]] = {}
    for m in messages:
        parts.setdefault(m.partition, []).append(m)
    return list(parts.values())


def lowest_offsets(messages: Iterable[Any]) -> dict[Any, int]:
    """The lowest offset of `messages` per partition (``message.tp``)."""
    low: dict[Any, int] = {}
    for m in messages:
        tp, offset = m.tp, m.offset
        if offset < low.get(tp, offset + 1):
            low[tp] = offset
    return low


def merge_lowest(into: dict[Any, int], offsets: dict[Any, int]) -> None:
    """Keep the lower offset per partition of `into` and `offsets` in `into`."""
    for tp, offset in offsets.items():
        if offset < into.get(tp, offset + 1):
            into[tp] = offset


async def rewind_to(consumer: Any, lowest: dict[Any, int]) -> dict[Any, int]:
    """Seek every partition of `lowest` still assigned whose fetch position lies past its offset
    back to that offset; return where each assigned one will be read from next.

    Runs in the consumer thread (aiokafka lives there), so it cannot interleave with the fetch
    that hands records out: the position it compares is final. A partition without a valid
    position (awaiting a reset) is sought too - an explicit position is never behind the
    dropped records. A partition no longer assigned is left to its new owner."""
    from aiokafka.structs import TopicPartition

    async def run() -> dict[Any, int]:
        client = consumer._thread._ensure_consumer()
        assigned = client._subscription.assigned_partitions()
        assignment = client._subscription.subscription.assignment if assigned else None
        after: dict[Any, int] = {}
        for tp, offset in lowest.items():
            ktp = TopicPartition(tp.topic, tp.partition)
            if assignment is None or ktp not in assigned:
                continue
            state = assignment.state_value(ktp)
            if state.has_valid_position and state.position <= offset:
                after[tp] = state.position  # a seek already moved it back: read from there anyway
            else:
                client.seek(ktp, offset)
                after[tp] = offset
        return after

    return await consumer._thread.call_thread(run)


def release_all(consumer: Any, messages: Iterable[Any]) -> None:
    """Stop tracking `messages` without acknowledging them to Faust (exactly_once: their offsets
    were committed in the batch's transaction, and Faust must not commit them again outside it).
    Wakes a rebalance or shutdown waiting for the tracked messages (`wait_empty`), as an ack does."""
    from mode.utils.futures import notify

    unacked = consumer._unacked_messages
    for m in messages:
        m.acked = True
        unacked.discard(m)
    notify(consumer._waiting_for_ack)


def ack_all(consumer: Any, messages: Iterable[Any]) -> int:
    """``consumer.ack(m)`` for every message, under one acquisition of Faust's ack lock and with
    one wake-up of a commit waiting for acknowledgements, instead of one of each per message.
    Faust 0.15.3's bookkeeping, step for step (``Consumer.ack``); returns how many were newly
    acknowledged. A test holds it to ``Consumer.ack`` on the same messages."""
    from faust.types.tuples import ack_lock
    from mode.utils.futures import notify

    committed_offset, acked_index, acked = consumer._committed_offset, consumer._acked_index, consumer._acked
    unacked = consumer._unacked_messages
    enabled_for = consumer.app.topics.acks_enabled_for
    enabled: dict[str, bool] = {}
    n = 0
    with ack_lock:
        try:
            for m in messages:
                if m.acked:
                    continue
                m.acked = True
                topic = m.topic
                on = enabled.get(topic)
                if on is None:
                    on = enabled[topic] = enabled_for(topic)
                if not on:
                    continue
                tp, offset = m.tp, m.offset
                committed = committed_offset[tp]
                if committed is None or offset >= committed:
                    index = acked_index[tp]
                    if offset not in index:
                        unacked.discard(m)
                        index.add(offset)
                        acked[tp].append(offset)
                        n += 1
        finally:
            consumer._n_acked += n
            notify(consumer._waiting_for_ack)
    return n


def install_handler_hook(conductor: Any) -> None:
    """Make the conductor build :meth:`BatchSource.handler` for the partitions of batch-source
    topics, and its own handler for every other topic (sinks' agents, table changelogs)."""
    if getattr(conductor, "_prism_batch_sources", None) is not None:
        return
    conductor._prism_batch_sources = []
    original = conductor._build_handler

    def build_handler(tp: Any, channels: Any) -> Any:
        for source in conductor._prism_batch_sources:
            if tp.topic in source.names:
                if len(channels) != 1:
                    # Another channel (an agent) on the same topic would get nothing from this
                    # handler: refuse instead of silently starving it.
                    raise RuntimeError(f"topic {tp.topic} is a batch source and may have no other subscriber")
                return source.handler()
        return original(tp, channels)

    conductor._build_handler = build_handler


async def set_source_fetching(consumer: Any, source_topics: set[str], *, paused: bool) -> None:
    """Pause/resume the source partitions in the consumer's aiokafka client - the one place the
    worker's blocking (app/worker/worker_state.py) and the management API's pause do it.

    Why not Faust's `consumer.pause_partitions`: it only narrows the set Faust asks aiokafka
    for, aiokafka keeps fetching the partition and DROPS records fetched for partitions not
    asked for (`Fetcher.fetched_records`), which loses them (measured: a record produced
    while paused never arrived after resume). aiokafka's own pause stops the fetch itself."""
    await set_fetching(consumer, [tp for tp in consumer.assignment() if tp.topic in source_topics], paused=paused)


async def set_fetching(consumer: Any, tps: Iterable[Any], *, paused: bool,
                       still: Callable[[Any], bool] | None = None) -> set[Any]:
    """Pause/resume `tps` (Faust TPs) in the consumer's aiokafka client, where aiokafka decides
    what it fetches: a paused partition is left out of every fetch request. The sources'
    pause above and the table changelogs' after their recovery (app/tables/recovery.py) both
    go through here.

    Runs in the consumer thread's loop, where aiokafka lives, as one step with no await in it:
    `still(client)` (optional) is asked there first and nothing changes when it says False -
    the check and the change cannot be split by a rebalance. Partitions aiokafka no longer has
    assigned are skipped (its pause and resume raise on them; a new assignment starts with every
    partition fetched). Returns the partitions changed."""
    from aiokafka.structs import TopicPartition

    wanted = [TopicPartition(tp.topic, tp.partition) for tp in tps]

    async def apply() -> set[Any]:
        client = consumer._thread._ensure_consumer()
        if still is not None and not still(client):
            return set()
        current = client._subscription.assigned_partitions()
        mine = [tp for tp in wanted if tp in current]
        if paused:
            client.pause(*mine)
        else:
            client.resume(*mine)
        held = getattr(consumer, "_prism_seek_hold", None)
        if held:  # an explicit pause or resume is the partition's state from now on (`hold_until_seek`)
            held.difference_update(mine)
        return set(mine)

    return set(await consumer._thread.call_thread(apply))


async def hold_until_seek(consumer: Any, source_topics: frozenset[str]) -> None:
    """Stop aiokafka fetching the batch sources' partitions until the seek that ends the
    rebalance is done (:func:`release_seek_hold`, run by `perform_seek`).

    Why: Faust's ``Recovery._resume_streams`` makes the stream partitions active
    (``resume_partitions``) and only then seeks them to the committed offsets - a round trip
    per assigned partition (aiokafka's ``seek_to_committed``), ~0.1-0.3 s. Flow control is
    already active then (the recovery resumed it to read the changelogs), so records fetched in
    that window were processed, and the seek then sent the partition back to the committed
    offset: everything processed in the window was processed again (measured: 500-1,000 records
    per partition at a join or a leave under a live stream). Worse, the read-offset bookkeeping
    the seek reset then recorded the re-read range as a "gap" as well as acknowledging it, and
    Faust's commit, which counts consecutive acknowledged offsets, advanced by one or two
    offsets per commit from then on - a partition's committed offset stalled for the rest of
    the assignment (`OffsetsProbeConsumer._new_offset`). Paused in aiokafka, nothing of the
    partitions is fetched until the seek has put them where they are read from.

    Only partitions nobody else has paused are held (the management API's pause, a blocked
    worker: :func:`set_source_fetching`), and an explicit pause or resume meanwhile takes a
    partition out of the hold, so the release never resumes what someone else paused. Runs in
    the consumer thread, as one step. Faust announces the end of a recovery twice
    (``on_rebalance_complete``): the hold accumulates."""
    async def apply() -> None:
        client = consumer._thread._ensure_consumer()
        held: set[Any] = getattr(consumer, "_prism_seek_hold", None) or set()
        others = client.paused() - held
        mine = [tp for tp in client._subscription.assigned_partitions()
                if tp.topic in source_topics and tp not in others and tp not in held]
        client.pause(*mine)
        consumer._prism_seek_hold = held | set(mine)

    await consumer._thread.call_thread(apply)


async def release_seek_hold(consumer: Any) -> None:
    """Fetch the partitions :func:`hold_until_seek` held again (those still assigned)."""
    if not getattr(consumer, "_prism_seek_hold", None):
        return

    async def apply() -> None:
        client = consumer._thread._ensure_consumer()
        held, consumer._prism_seek_hold = consumer._prism_seek_hold, set()
        current = client._subscription.assigned_partitions()
        client.resume(*[tp for tp in held if tp in current])

    await consumer._thread.call_thread(apply)


def install_seek_uncommitted(consumer: Any, sources: list[BatchSource]) -> None:
    """Make Faust's ``perform_seek`` rewind *every* batch-source partition, those without a
    committed offset included: to the committed offset, or else to the start of the log.

    Why (issue 31, the exactly_once restart stall): records fetched while flow control is
    stopped, or after a rebalance began, are dropped on the promise that the seek which follows
    fetches them again - Faust's ``getmany`` and the loop below both do it. But
    ``perform_seek`` seeks only partitions with a committed offset above 0 (aiokafka's
    ``seek_to_committed``); a partition with none keeps the position the dropped fetch left,
    which can be its end. Its records were then never processed and nothing noticed: the offset
    tracker (app/worker/continuity.py) sees a hole only when a *later* record arrives, and on a
    backlog read to its end none does. Seen after kill -9 restarts of exactly_once workers,
    where a new owner's first fetch often races table recovery. With ``auto_offset_reset``
    ``earliest`` (the worker's), the start of the log is exactly where an uncommitted
    partition's first record is; dedup absorbs what is read twice.

    A partition whose position is already where a rewind would put it is not sought
    (:func:`already_at_log_start`): aiokafka applies a seek only once the fetch in flight to the
    broker returns, and on Apache Kafka that is a long poll on the empty changelogs (Faust's
    ``fetch_max_wait_ms``, 1.5 s) - every worker start waited it for nothing
    (docs/testing.md, "One worker start, phase by phase")."""
    if getattr(consumer, "_prism_seek_uncommitted", False):
        return
    consumer._prism_seek_uncommitted = True
    original = consumer.perform_seek

    async def perform_seek() -> None:
        try:
            await seek()
        finally:
            await release_seek_hold(consumer)  # the partitions are where they are read from (`hold_until_seek`)

    async def seek() -> None:
        await original()
        names = frozenset().union(*(s.names for s in sources))
        committed = consumer._committed_offset
        uncommitted = sorted(tp for tp in consumer.assignment() if tp.topic in names and committed.get(tp) is None)
        if not uncommitted:
            return
        from aiokafka.structs import TopicPartition

        tps = [TopicPartition(tp.topic, tp.partition) for tp in uncommitted]

        async def rewind() -> list[Any]:
            # in the consumer thread, where aiokafka lives (Faust's consumer offers no seek)
            client = consumer._thread._ensure_consumer()
            assignment = client._subscription.subscription.assignment
            moved = [tp for tp in tps if not already_at_log_start(assignment.state_value(tp))]
            if moved:
                await client.seek_to_beginning(*moved)
            return moved

        moved = await consumer._thread.call_thread(rewind)
        log.info("no committed offset for %s: read from the start of the log (%s)",
                 ", ".join(f"{tp.topic}[{tp.partition}]" for tp in uncommitted),
                 f"rewound {len(moved)}, the rest were there" if moved else "all were there")

    consumer.perform_seek = perform_seek


def already_at_log_start(state: Any) -> bool:
    """True when aiokafka's partition state (``TopicPartitionState``) will read the partition
    from the start of its log without a seek: its position is offset 0 - at or below every log
    start, and a position below the log start is reset to it (``auto_offset_reset`` earliest:
    the worker's) - or it already awaits a reset to the earliest offset.

    Why this is enough for issue 31: aiokafka advances a position only when the consumer takes
    the fetched records; a position still at 0 took none, so no dropped fetch can have moved it,
    and records fetched but not yet taken are delivered from offset 0. Any other position (a log
    start above 0 after retention, or a dropped fetch's end) is rewound as before."""
    from aiokafka.consumer.fetcher import OffsetResetStrategy

    if state.awaiting_reset:
        return bool(state.reset_strategy == OffsetResetStrategy.EARLIEST)
    return bool(state.has_valid_position and state.position == 0)


def install_direct_drain(consumer: Any, sources: list[BatchSource]) -> None:
    """Give `consumer` a fetch loop that appends the records of batch-source partitions to their
    list itself, and hands every other record to the conductor as Faust does.

    Faust's loop (`Consumer._drain_messages` over `Consumer.getmany`) handles each record on its
    own: an async generator step, a round-robin scheduler step, the partition's high watermark
    read through the consumer thread's objects, then ``await self.wait_first(callback(message),
    self.suspend_flow.wait())`` - two coroutines and a copied context - and the conductor's
    handler takes an `asyncio.Lock` to look the partition's callback up before
    :meth:`BatchSource.handler` appends the record. That was a fifth of the worker's CPU
    (BENCHMARKS.md, "Release comparison").

    This loop does what those two do - Faust 0.15.3's, step for step - with the per-record work
    moved to where it changes:

    * the fetch is Faust's own (`_wait_next_records`: flow control, active partitions, the
      consumer thread), and a fetch made while flow control is stopped seeks back to the
      committed offsets, as `getmany` does;
    * flow control and the consumer generation are checked before the first record and again
      after every await - the only points where they can change (Faust checks them per record,
      between which nothing else runs) - and a change abandons the rest of the fetch, as
      `getmany` does; the producer buffer's size likewise;
    * the high watermark is tracked, and the partition's activity checked, once per partition
      per fetch instead of per record (the value cannot change within one fetch);
    * when every fetched partition is a batch source's, their records are taken partition by
      partition; otherwise in Faust's round-robin order (its fairness between agents' topics);
    * per record, as Faust: read-offset and gap bookkeeping, `commit_every`, yielding every 100
      records; a batch-source record is appended directly when nothing could make the handler
      wait (flow control active, the list not full, the producer buffer not over its limit),
      otherwise it takes Faust's path, handler and all, so back-pressure and a rebalance
      abandoning the delivery behave exactly as before.

    Installed only when the consumer has the private attributes the loop uses; otherwise the
    conductor path stays (a log line says so)."""
    if getattr(consumer, "_prism_direct_drain", False):
        return
    needed = ("_drain_messages", "_read_offset", "_add_gap", "_commit_every", "_n_acked", "suspend_flow",
              "wait_first", "_wait_next_records", "_to_message", "_buffered_partitions", "perform_seek",
              "scheduler", "highwater", "callback")
    if not all(hasattr(consumer, name) for name in needed):
        log.warning("Faust's consumer lacks %s: batch sources take the conductor path",
                    [n for n in needed if not hasattr(consumer, n)])
        return
    consumer._prism_direct_drain = True
    install_seek_uncommitted(consumer, sources)
    app = consumer.app

    async def hold(sender: Any = None, **_: Any) -> None:
        # Faust sends it where a recovery ends, before `_resume_streams` resumes and seeks the
        # stream partitions: held until that seek is done (`hold_until_seek`; released by
        # `perform_seek`, install_seek_uncommitted)
        try:
            await hold_until_seek(consumer, frozenset().union(*(s.names for s in sources)))
        except Exception as exc:  # the consumer is stopping: what was held is read again, as before
            log.warning("could not hold the source partitions until the seek: %r", exc)

    app.on_rebalance_complete.connect(hold)
    flow = app.flow_control
    pbuf = app.producer.buffer
    #: the lowest offset per partition of records a buffer dropped while flow control was active:
    #: no seek will fetch them again (module docstring), so the loop below rewinds them itself,
    #: before its next fetch - it is the only taker of fetched records, so nothing interleaves.
    rewinds: dict[Any, int] = {}

    def on_dropped(lowest: dict[Any, int]) -> None:
        if flow.is_active():
            merge_lowest(rewinds, lowest)
        # suspended: a rebalance or a stop, and the seek that ends a rebalance reads them again

    consumer._prism_on_dropped = on_dropped
    consumer._prism_rewinds = rewinds  # the handler (conductor path) leaves a message to a pending rewind
    for source in sources:
        source.buffer.on_dropped = on_dropped
    install_resume_rewinds(flow, rewinds, skip=getattr(app.tables, "_changelog_queue", None))

    def direct_buffer(topic: str) -> BatchBuffer | None:
        for source in sources:
            if topic in source.names:
                return source.buffer
        return None

    async def drain_messages(fetcher: Any) -> None:
        callback = consumer.callback
        consumer_should_stop = consumer._stopped.is_set
        fetcher_should_stop = fetcher._stopped.is_set
        get_read_offset = consumer._read_offset.__getitem__
        set_read_offset = consumer._read_offset.__setitem__
        acks_enabled_for = app.topics.acks_enabled_for
        commit_every = consumer._commit_every
        to_message = consumer._to_message
        highwater = consumer.highwater
        buffers: dict[str, BatchBuffer | None] = {}
        yield_every = 100
        num_since_yield = 0
        sleep = asyncio.sleep

        async def rewind() -> dict[Any, int]:
            lowest = dict(rewinds)
            rewinds.clear()
            after = await rewind_to(consumer, lowest)
            for tp, position in after.items():
                set_read_offset(tp, position or None)  # as Faust's seek: the next record read is not "already read"
            log.info("records dropped unprocessed with no seek after them are read again: %s",
                     ", ".join(f"{tp.topic}[{tp.partition}] from offset {o}" for tp, o in sorted(after.items())))
            return after

        try:
            while not (consumer_should_stop() or fetcher_should_stop()):
                await consumer.sleep(0)
                if consumer.should_stop:
                    continue
                if rewinds:
                    await rewind()
                records, active = await consumer._wait_next_records(1.0)
                generation = app.consumer_generation_id
                if records is None or consumer.should_stop:
                    continue
                if rewinds and consumer.flow_active:  # a buffer was cleared while this fetch was in flight
                    records = _after_rewind(records, await rewind(), set_read_offset)
                    if not records:
                        continue
                if not consumer.flow_active:
                    try:  # fetched while flow control stopped: Faust seeks back to the committed offsets
                        await consumer.perform_seek()
                    except Exception as exc:
                        log.warning("exception performing seek when flow not active %s", exc)
                    continue
                for tp in records:
                    if tp.topic not in buffers:
                        buffers[tp.topic] = direct_buffer(tp.topic)
                if all(buffers[tp.topic] is not None for tp in records):
                    pairs: Any = ((tp, r) for tp, recs in records.items() for r in recs)
                else:
                    pairs = consumer.scheduler.iterate(records)
                monitor = app.monitor
                buffered = consumer._buffered_partitions
                taken: dict[Any, bool] = {}  # tp -> active (and its high watermark tracked)
                handed: dict[Any, int] = {}  # tp -> the last offset of this fetch handed on
                # Flow, generation and the producer buffer only change while this loop awaits:
                # checked now and after every await, not per record.
                live = consumer.flow_active and app.consumer_generation_id == generation
                ebb = pbuf.size <= pbuf.max_messages
                awaited = False
                for tp, record in pairs:
                    if awaited:  # has a rebalance begun, has the producer buffer filled meanwhile?
                        live = consumer.flow_active and app.consumer_generation_id == generation
                        ebb = pbuf.size <= pbuf.max_messages
                        awaited = False
                    if not live:
                        break  # a rebalance began: the rest is fetched again (as Faust's getmany)
                    take = taken.get(tp)
                    if take is None:
                        take = taken[tp] = active is None or tp in active or tp in buffered
                        if take:
                            monitor.track_tp_end_offset(tp, highwater(tp))
                    if not take:
                        continue
                    message = to_message(tp, record)
                    num_since_yield += 1
                    if num_since_yield > yield_every:
                        await sleep(0)
                        num_since_yield = 0
                        awaited = True
                    offset = message.offset
                    r_offset = get_read_offset(tp)
                    if r_offset is not None and offset < r_offset:
                        continue  # Faust drops these too (already read)
                    gap = offset - (r_offset or 0)
                    if gap > 1 and r_offset and acks_enabled_for(message.topic):
                        await consumer._add_gap(tp, r_offset + 1, offset)
                        awaited = True
                    if commit_every is not None and consumer._n_acked >= commit_every:
                        consumer._n_acked = 0
                        await consumer.commit()
                        awaited = True
                    if rewinds:
                        # A buffer was cleared during one of the awaits above (flow control's
                        # resume): this record and the rest of the fetch are read again after what
                        # the clear dropped, in order - not handed on past a hole.
                        merge_lowest(rewinds, _unread(records, handed))
                        break
                    buf = buffers[tp.topic]
                    if buf is not None and ebb and flow.is_active() and not buf.full():
                        buf.put(message)
                    else:
                        await consumer.wait_first(callback(message), consumer.suspend_flow.wait())
                        awaited = True
                    set_read_offset(tp, offset)
                    handed[tp] = offset
        except consumer.consumer_stopped_errors:
            if consumer.transport.app.should_stop:
                return
            raise
        except asyncio.CancelledError:
            if consumer.transport.app.should_stop:
                return
            raise

    consumer._drain_messages = drain_messages


def install_resume_rewinds(flow: Any, rewinds: dict[Any, int], *, skip: Any = None) -> None:
    """Make flow control's resume note, before it clears its queues, the lowest offset per
    partition of the events in the queues of Faust's own agents (the sinks': their streams'
    channel and outbox queues), so that the fetch loop reads those partitions again from there.

    Why: mode's ``FlowControlEvent.resume()`` clears every queue it manages, also after Faust's
    post-recovery seek (module docstring). An event dropped from an agent's queue is never
    acknowledged: Faust's commit guard holds the partition's commits before a hole wider than one
    offset - the event waits for the next start - and passes a one-offset hole, which loses it for
    that agent. The batch buffers report their own clears (:attr:`BatchBuffer.on_dropped`);
    `skip` is the table manager's changelog queue, whose events recovery reads on its own terms."""
    if getattr(flow, "_prism_resume_rewinds", False):
        return
    flow._prism_resume_rewinds = True
    original = flow.resume

    def resume() -> None:
        for queue in list(getattr(flow, "_queues", ())):
            if queue is skip or isinstance(queue, BatchBuffer):
                continue
            events = getattr(queue, "_queue", None)  # asyncio.Queue's deque (mode clears it)
            if events:
                merge_lowest(rewinds, lowest_offsets(
                    m for m in (getattr(e, "message", None) for e in events) if hasattr(m, "tp")))
        original()

    flow.resume = resume


def _after_rewind(records: dict[Any, list[Any]], after: dict[Any, int],
                  set_read_offset: Callable[[Any, int | None], None]) -> dict[Any, list[Any]]:
    """`records` (one fetch, taken before a rewind) without those the rewound partitions will
    hand out again: a partition now read from offset `p` keeps only its records below `p` (taken
    after a seek had already moved it back), and its read offset lets the first of them through."""
    out = dict(records)
    for tp, position in after.items():
        recs = out.get(tp)
        if not recs:
            continue
        kept = [r for r in recs if r.offset < position]
        if kept:
            out[tp] = kept
            set_read_offset(tp, kept[0].offset or None)
        else:
            del out[tp]
    return out


def _unread(records: dict[Any, list[Any]], handed: dict[Any, int]) -> dict[Any, int]:
    """The first offset per partition of `records` (one fetch) not handed on: after the last one
    `handed` names, or the partition's first. (Not Faust's read offset: after a seek it holds
    the offset to read next, after a record the one just read.)"""
    rest: dict[Any, int] = {}
    for tp, recs in records.items():
        last = handed.get(tp)
        for r in recs:
            if last is None or r.offset > last:
                rest[tp] = r.offset
                break
    return rest

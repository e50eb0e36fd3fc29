"""Write a batch's output records with one producer call per topic-partition, not per record.

Why: the worker writes two or three records per input (`.v2`, `.v3`, DLQ copies). Through
`producer.send` each record costs a coroutine, a partitioner call, a size check, an append
to the accumulator and its own delivery future that the batch then gathers - ~19 µs of CPU
per record measured against the embedded broker with 1.5 KB records, against ~9.5 µs when
the same records are appended to aiokafka `BatchBuilder`s (one per topic-partition) and
handed over with one `send_batch` each (BENCHMARKS.md, "Release comparison").

What stays exactly as `send` does it, so the bytes on the wire and their placement do not
change:

* the partition: aiokafka's own partitioner over the same partition lists (`_partition`);
* the record: the same key, value, headers and millisecond timestamp, the same producer
  serializers and compression (the builder comes from the producer, `create_batch`);
* the size limit: a record larger than `max_request_size` (or than `limit_for(topic)`, the
  topic's limit from `app/worker/limits.py`) is refused before it is queued, with aiokafka's
  `MessageSizeTooLargeError` - a last guard: the worker checks sizes before it gets here. Its
  size is aiokafka's estimate, taken here unless the caller hands over the one it measured
  (`OutRecord`'s `size`; the worker's size fit measures every output once, issue 29) -
  the check itself is the same either way, against the limit in force at the send;
* the order: per topic-partition, records are appended in item order, and batches of one
  topic-partition are handed over in order.

Written in one compiled call per batch: with `prism_native` in use (`app/native.py`) and a real
aiokafka producer without compression or serializers (the worker's), each topic-partition's
records are collected as they are placed and written into Kafka v2 record batches by
`prism_native.record_batch` - each record's headers from its tail when the size fit wrote one
(`OutRecord`) -, the bytes aiokafka's `DefaultRecordBatchBuilder` writes for them,
batch boundaries included (a record that would make a batch reach its size starts the next one;
the first record of a batch always goes in) - and handed to aiokafka as :class:`ClosedBatch`es,
which the producer seals with its id, epoch and base sequence when it drains them (`seal_batch`:
those fields and the CRC). Why: aiokafka's `BatchBuilder.append`, a Python wrapper over its
compiled builder, cost ~2 µs per record, two records per message (issue 29; BENCHMARKS.md,
"Produce path"). Otherwise (no module, a stale one, compression, serializers, a stand-in
producer) every record goes through aiokafka's own builder as before.

Sent at once: every batch is closed before it is handed over. aiokafka holds an open batch in
its accumulator for ``linger_ms`` (5 ms for the worker's producer) in case later ``send`` calls
add to it; these batches are complete when handed over, so the linger only delayed them - and,
since a partition's next ``send_batch`` waits until the batch before it has left the
accumulator, the next batch's hand-over too (issue 29, latency). A closed batch is also one no
other ``send`` to the same partition can append to, so each batch holds exactly its items.

What a batch may hold is bounded by its destination: Kafka checks a topic's `max.message.bytes`
against the whole record batch a producer sends to a partition, not against each record, so a
builder never grows past `limit_for(topic)` (the smaller of that and the producer's
`max_request_size`; `app/worker/limits.py`). A batch the broker still refuses for its size (the
limit was lowered at run time, or the broker's own `message.max.bytes` is lower) says nothing
about any one record in it: its items fail with :class:`BatchTooLargeError`, which the caller
retries with ``split=True`` - every record in a batch of its own - and only a record refused
alone is too large.

What changes is failure granularity: a delivery failure fails every item with a record in that
batch, and the caller (`AtLeastOnce.write_all`, app/worker/at_least_once.py) retries those items - a record that did reach
the broker may then be written twice, which at-least-once already allows (and dedup by message
id downstream removes). An item whose record is refused up front sends nothing more, as
before. The producer must be started; records go through the same accumulator as `send`, so
`flush()` (which Faust calls before committing offsets) covers them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from aiokafka.errors import MessageSizeTooLargeError
from aiokafka.partitioner import DefaultPartitioner
from aiokafka.record.default_records import DefaultRecordBatchBuilder

from app import native as _native
from app.bindings.partitioner import Partitioner, murmur2

#: `prism_native.record_batch` / `seal_batch` when the compiled module is in use, else None
#: (module docstring, "Written in one compiled call per batch").
_record_batch: Callable[..., tuple[bytearray, int]] | None = getattr(_native.module, "record_batch", None)
_seal_batch: Callable[[bytearray, int, int, int], None] | None = getattr(_native.module, "seal_batch", None)

#: Partitioners that place a keyed record by Kafka's rule, which `send_batched` then applies
#: itself (one hash per key per call): aiokafka's default and its compiled-hash twin.
_KAFKA_PLACEMENT = (DefaultPartitioner, Partitioner)

__all__ = ["BatchTooLargeError", "ClosedBatch", "OutRecord", "RefusedUpFront", "bounded_batch", "is_size_refusal", "retrieved",
           "send_batched"]

#: (topic, key, value, timestamp_ms or None, headers, size or None, tail or None): `size` is the
#: record's `DefaultRecordBatchBuilder.estimate_size_in_bytes(key, value, headers)` when the
#: caller has measured it already (the worker's `SizeFitter.fit` does, for every output), None
#: otherwise - `send_batched` then measures it itself. Either way the same number meets the same
#: limit. `tail` is the second half of `prism_native.record_tail(key, value, headers)` when the
#: caller wrote it (the size fit does, with the compiled module, whose size is the first half):
#: the record's headers as its batch holds them, which the compiled batch writer copies instead
#: of reading the header objects (app/worker/size_fit.py, why); aiokafka's builder ignores it.
OutRecord = tuple[str, bytes | None, bytes | None, int | None, Sequence[tuple[str, bytes]], int | None, bytes | None]


class RefusedUpFront(MessageSizeTooLargeError):
    """A record larger than its destination's limit, refused before anything was queued: the
    producer's state is untouched (unlike a broker's refusal, which leaves a sequence gap)."""


class BatchTooLargeError(Exception):
    """The broker refused a record batch of several records for its size: retry them split.

    Not a verdict on any record (module docstring): never a reason to dead-letter one."""

    def __init__(self, topic: str, records: int, cause: BaseException) -> None:
        super().__init__(f"the broker refused a batch of {records} records for {topic} for its size ({cause})")
        self.topic = topic
        self.records = records
        self.cause = cause


class ClosedBatch:
    """A complete record batch from `prism_native.record_batch`, as aiokafka's producer takes a
    `BatchBuilder` (`send_batch`): closed, so no `send` adds to it; the accumulator reads its
    `record_count()` for the sequence numbers, gives it the producer state when it drains it
    (`_set_producer_state`), and the sender takes its bytes (`_build`), sealed then with that
    state - the default, -1/-1/0, is what aiokafka's builder writes for a producer without one."""

    __slots__ = ("_buffer", "_count", "_sealed", "_state")

    def __init__(self, buffer: bytearray, count: int) -> None:
        self._buffer = buffer
        self._count = count
        self._state = (-1, -1, 0)
        self._sealed = False

    def append(self, *, timestamp: int | None, key: bytes | None, value: bytes | None,
               headers: Sequence[tuple[str, bytes | None]] = ()) -> None:
        """Closed: nothing joins it (what `BatchBuilder.append` returns for a closed batch)."""
        return None

    def close(self) -> None:
        """Already closed (written complete)."""

    def closed(self) -> bool:
        return True

    def record_count(self) -> int:
        return self._count

    def size(self) -> int:
        return len(self._buffer)

    def _set_producer_state(self, producer_id: int, producer_epoch: int, base_sequence: int) -> None:
        self._state = (producer_id, producer_epoch, base_sequence)
        self._sealed = False

    def _build(self) -> bytearray:
        if not self._sealed:
            assert _seal_batch is not None  # made only when the compiled module is in use
            _seal_batch(self._buffer, *self._state)
            self._sealed = True
        return self._buffer


def retrieved(fut: asyncio.Future[Any]) -> None:
    """Done-callback for a delivery nobody awaits any more (its transaction is failing or being
    aborted): take its outcome, so that asyncio does not log "Future exception was never
    retrieved" for an error the transaction's own failure already reports."""
    if not fut.cancelled():
        fut.exception()


def is_size_refusal(err: BaseException) -> bool:
    """The broker's or the producer's refusal of a record or batch for its size."""
    from aiokafka.errors import MessageSizeTooLargeError, RecordListTooLargeError, RecordTooLargeError

    return isinstance(err, MessageSizeTooLargeError | RecordTooLargeError | RecordListTooLargeError)


def bounded_batch(producer: Any, max_bytes: int) -> Any:
    """An empty `BatchBuilder` like ``producer.create_batch()`` (same compression, serializers,
    transactional flag) that holds at most `max_bytes` - the destination's limit - instead of
    the producer's `max_batch_size` when that is larger. A first record always goes in (the
    caller checks a record's own size against the limit first)."""
    from aiokafka.producer.message_accumulator import BatchBuilder

    acc = getattr(producer, "_message_accumulator", None)
    if acc is None or acc._batch_size <= max_bytes:
        return producer.create_batch()  # the producer's own batches already fit
    txn = acc._txn_manager
    return BatchBuilder(min(acc._batch_size, max_bytes), acc._compression_type,
                        is_transactional=txn is not None and txn.transactional_id is not None,
                        key_serializer=producer._key_serializer, value_serializer=producer._value_serializer)


async def send_batched(producer: Any, items: Sequence[Sequence[OutRecord]], *,
                       handed_over: asyncio.Future[None] | None = None,
                       limit_for: Callable[[str], int] | None = None,
                       split: bool = False,
                       on_queued: Callable[[list[BaseException | None]], Awaitable[None]] | None = None,
                       ) -> list[BaseException | None]:
    """Queue every item's records, then await the deliveries; per item None or its error.

    Batches are bounded by `limit_for(topic)` (module docstring); with `split` every record
    goes in a batch of its own (the retry of a batch the broker refused for its size).

    `producer` is a started `aiokafka.AIOKafkaProducer` (Faust's is `app.producer._ensure_producer()`).
    `handed_over`, if given, is resolved once every record is queued, before the deliveries are
    awaited (the worker starts the next batch's writes then, keeping batch order).
    `on_queued`, if given, is awaited once every record is queued, before `handed_over` is
    resolved and before the deliveries are awaited, with a copy of the per-item errors so far:
    the items refused up front (:class:`RefusedUpFront`), None for every item fully queued.
    Why: exactly_once queues the dedup changelog of the queued items then, in the same
    transaction, so that its produce round trip overlaps the outputs' (app/worker/exactly_once.py).
    """
    errors: list[BaseException | None] = [None] * len(items)
    if not items:
        if on_queued is not None:
            await on_queued([])
        if handed_over is not None and not handed_over.done():
            handed_over.set_result(None)
        return errors
    metadata = producer.client.cluster
    partitioner = producer._partitioner
    # aiokafka's default partitioner hashes the key with a pure-Python murmur2 (~3.8 µs for a
    # 36-byte key) and every message writes its key twice (.v2, .v3): hash each key once per
    # call, with the compiled hash when prism_native is in use (app/bindings/partitioner.py),
    # and place it exactly as the partitioner would. A custom partitioner is called as is.
    hashes: dict[bytes, int] | None = {} if type(partitioner) in _KAFKA_PLACEMENT else None
    max_request = producer._max_request_size
    estimate = DefaultRecordBatchBuilder.estimate_size_in_bytes
    acc = getattr(producer, "_message_accumulator", None)
    # compiled batches (module docstring): a real aiokafka producer whose builder would write
    # uncompressed records as given
    compiled = (_record_batch is not None and acc is not None and acc._compression_type == 0
                and producer._key_serializer is None and producer._value_serializer is None)
    transactional = compiled and acc._txn_manager is not None and acc._txn_manager.transactional_id is not None
    # topic -> (all partitions, available ones, its limit): looked up once per call and topic
    # (two records per message), one dict lookup per record
    known: dict[str, tuple[list[int], list[int], int]] = {}
    open_batches: dict[tuple[str, int], tuple[Any, set[int]]] = {}  # tp -> (builder, owning items)
    # compiled: tp -> (its records in order, each one's item, the batch size)
    queued: dict[tuple[str, int], tuple[list[OutRecord], list[int], int]] = {}
    sent: list[tuple[asyncio.Future[Any], set[int], str, int]] = []  # (delivery, owners, topic, records)

    async def send(tp: tuple[str, int], batch: Any, owners: set[int]) -> None:
        batch.close()  # complete: ready to send now, no linger (module docstring, "Sent at once")
        # record_count(): the records appended (aiokafka counts them; a refused append adds none)
        sent.append((await producer.send_batch(batch, tp[0], partition=tp[1]), owners, tp[0],
                     batch.record_count()))

    async def hand_over(tp: tuple[str, int]) -> None:
        await send(tp, *open_batches.pop(tp))

    async def append(tp: tuple[str, int], i: int, limit: int, ts_ms: int | None, key: bytes | None,
                     value: bytes | None, headers: Sequence[tuple[str, bytes | None]]) -> None:
        """Item `i`'s record into `tp`'s open aiokafka batch (raises if it is refused)."""
        entry = open_batches.get(tp)
        if entry is not None and split:
            await hand_over(tp)  # one record per batch
            entry = None
        if entry is None:
            entry = open_batches[tp] = (bounded_batch(producer, limit), set())
        if entry[0].append(timestamp=ts_ms, key=key, value=value, headers=headers) is None:
            if entry[1]:
                await hand_over(tp)  # full: send it, start the next one with this record
                entry = open_batches[tp] = (bounded_batch(producer, limit), set())
                appended = entry[0].append(timestamp=ts_ms, key=key, value=value, headers=headers)
            else:
                appended = None
            if appended is None:
                del open_batches[tp]  # nothing in it: never hand over an empty batch
                raise RefusedUpFront(f"the record for {tp[0]} does not fit an empty batch")
        entry[1].add(i)

    for i, records in enumerate(items):
        try:
            for record in records:
                topic, key, value, ts_ms, headers, size, _ = record
                dest = known.get(topic)
                if dest is None:
                    await producer.client._wait_on_metadata(topic)  # as `send` does, once per topic
                    dest = known[topic] = (list(metadata.partitions_for_topic(topic)),
                                           list(metadata.available_partitions_for_topic(topic)),
                                           max_request if limit_for is None else min(max_request, limit_for(topic)))
                parts, available, limit = dest
                if size is None:  # not measured by the caller (OutRecord)
                    size = estimate(key, value, headers)
                if size > limit:
                    raise RefusedUpFront(
                        f"the record for {topic} is {size} bytes when serialized, larger "
                        f"than its limit ({limit}; the producer's max_request_size is {max_request})")
                if key is not None and hashes is not None:
                    h = hashes.get(key)
                    if h is None:
                        h = hashes[key] = murmur2(key) & 0x7FFFFFFF
                    tp = (topic, parts[h % len(parts)])
                else:
                    tp = (topic, partitioner(key, parts, available))
                if compiled:
                    batch = queued.get(tp)
                    if batch is None:
                        # the batch size `bounded_batch` gives; 0 with `split`: only a batch's
                        # first record goes in (`record_batch` refuses one reaching the size)
                        batch = queued[tp] = ([], [], 0 if split else min(acc._batch_size, limit))
                    batch[0].append(record)
                    batch[1].append(i)
                    continue
                await append(tp, i, limit, ts_ms, key, value, headers)
        except Exception as exc:  # refused before it was queued: the item failed, sends nothing more
            errors[i] = exc
    for tp, (recs, owner, cap) in queued.items():
        start = 0
        while start < len(recs):
            assert _record_batch is not None  # `compiled`
            try:
                buf, n = _record_batch(recs, start, cap, transactional)
            except Exception:
                # a record the compiled writer does not take (not bytes, say): the rest of this
                # partition goes through aiokafka's builder, which refuses that item alone
                for (topic, key, value, ts_ms, headers, _, _), i in zip(recs[start:], owner[start:], strict=True):
                    try:
                        await append(tp, i, known[topic][2], ts_ms, key, value, headers)
                    except Exception as exc:
                        errors[i] = exc
                break
            await send(tp, ClosedBatch(buf, n), set(owner[start:start + n]))
            start += n
    for tp in list(open_batches):
        await hand_over(tp)
    if on_queued is not None:
        try:
            await on_queued(list(errors))
        except BaseException:
            for f, *_ in sent:  # the transaction fails: nobody awaits these deliveries any more
                f.add_done_callback(retrieved)
            raise
    if handed_over is not None and not handed_over.done():
        handed_over.set_result(None)
    results = await asyncio.gather(*(f for f, *_ in sent), return_exceptions=True)
    for (_, owners, topic, n), r in zip(sent, results, strict=True):
        if isinstance(r, BaseException):
            if n > 1 and is_size_refusal(r):
                r = BatchTooLargeError(topic, n, r)
            for i in owners:
                if errors[i] is None:
                    errors[i] = r
    return errors

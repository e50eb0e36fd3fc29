"""Dedup window keyed by ``message_id``.

Design choice: a *plain* table ``message_id -> [first_seen_ms, partition]`` with the window
checked at lookup time, not a Faust windowed table (``app.Table(...).tumbling(...)``). Why:

* exact semantics: "seen within ``window`` seconds of its first sighting", independent of
  window boundaries. A tumbling window forgets everything at each boundary (a duplicate one
  second after the boundary passes), so a correct check has to read the current *and* the
  previous window - two lookups with window-tuple keys - and still gets a 1x-2x window;
* Faust's windowed cleanup pops expired keys from the local store without writing tombstones
  to the changelog, so a replay from the changelog brings them back;
* one RocksDB ``get`` per message and a trivially testable core.

Expiry: entries older than the window are treated as absent immediately (so correctness never
depends on cleanup timing), and are physically removed by :class:`FaustDedupWindow`: a timer
scans the table (reads are allowed anywhere) and queues expired ids per partition; the agent then
deletes them while processing an event *of that partition*, a few per event, with ordinary table
deletes, so the tombstones land in the right changelog partition. That is why each value records
its partition.

The clock is processing time (the worker's), not the producer's timestamp: duplicates come
from redelivery and retries, and producer metadata is untrusted.

Writes from the worker's dedup stage (:meth:`FaustDedupWindow.record`, once per emitted
message) skip Faust's per-write table machinery: the value goes straight into the table's
RocksDB store and the changelog record is queued, then :meth:`FaustDedupWindow.flush_changelog`
sends the batch's records through the app's producer - the same keys, values and partitions
Faust would write, so recovery reads them like its own - and stores the persisted changelog
offset per partition once they are acknowledged, as Faust does after its own sends.
Measured (bench/bench_pipeline.py, BENCHMARKS.md): a write through ``Table.__setitem__`` cost
60-110 µs in the worker (a future, the producer buffer, two RocksDB puts and callbacks per key);
the direct write and send cost ~15-20 µs. The stage's read (:meth:`FaustDedupWindow.seen` with
the partition) and the write go to the partition's RocksDB database itself, where Faust's store
would route them by the current event. ``check`` and the expiry deletes keep Faust's path.

Encoding: the Faust table stores raw bytes - the id's UTF-8 as key, 12 bytes
(``>qi``: first_seen_ms, partition) as value - not Faust's default JSON. Every write is
serialized twice (store and changelog) and every read once, per message, and JSON made
those the larger part of the stage's cost in the worker. Entries written in the earlier
JSON encoding are still read (and expired) correctly.
"""

from __future__ import annotations

import asyncio
import functools
import json
import struct
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, MutableMapping
from dataclasses import dataclass
from typing import Any

from app.tables.base import current_partition, make_table

try:  # the RocksDB binding Faust's store uses (faust-streaming[rocksdict])
    from rocksdict import WriteBatch as _WriteBatch
except ImportError:  # pragma: no cover - the memory store needs none
    _WriteBatch = None

__all__ = ["DedupVerdict", "DedupWindow", "FaustDedupWindow", "StagedRow"]


@dataclass(frozen=True, slots=True)
class DedupVerdict:
    """Outcome of :meth:`DedupWindow.check`."""

    duplicate: bool
    #: Epoch seconds of the first sighting inside the window (``now`` for a new id).
    first_seen: float


class DedupWindow:
    """Remembers message ids for ``window`` seconds after their first sighting.

    Args:
        backend: any mutable mapping ``str -> [first_seen_ms, partition]`` (a dict in tests, a
            Faust table in the worker).
        window: seconds an id is remembered.
        clock: epoch-seconds clock used when ``now`` is not given (injectable for tests).
    """

    def __init__(self, backend: MutableMapping[str, Any], window: float, *,
                 clock: Callable[[], float] = time.time) -> None:
        if not window > 0:
            raise ValueError(f"dedup window must be > 0 seconds, got {window!r}")
        self.backend = backend
        self.window = float(window)
        self.clock = clock

    @staticmethod
    def _validate(message_id: str) -> None:
        if not isinstance(message_id, str) or not message_id:
            raise ValueError(f"message_id must be a non-empty string, got {message_id!r}")

    # -- storage hooks: a mapping of lists here, raw bytes in FaustDedupWindow ---------------
    def entry(self, message_id: str) -> tuple[int, int] | None:
        """The stored ``(first_seen_ms, partition)`` of ``message_id``, live or expired."""
        entry = self.backend.get(message_id)
        return None if entry is None else (int(entry[0]), int(entry[1]))

    def _store(self, message_id: str, first_seen_ms: int, partition: int) -> None:
        self.backend[message_id] = [first_seen_ms, partition]

    def _delete(self, key: Any) -> None:
        del self.backend[key]

    def _scan(self) -> Iterator[tuple[Any, int, int]]:
        """``(stored key, first_seen_ms, partition)`` of every entry."""
        for key, value in self.backend.items():
            if value is not None:
                yield key, int(value[0]), int(value[1])

    # -- the window ----------------------------------------------------------------------------
    def _is_live(self, first_seen_ms: int, now: float) -> bool:
        """Inside the window; an expired entry counts as never seen, even before the sweep."""
        return now * 1000 - first_seen_ms < self.window * 1000

    def _live_entry(self, message_id: str, now: float) -> tuple[int, int] | None:
        entry = self.entry(message_id)
        return entry if entry is not None and self._is_live(entry[0], now) else None

    def check(self, message_id: str, now: float | None = None, *, partition: int = 0) -> DedupVerdict:
        """Check-and-record: a duplicate if seen inside the window, otherwise remember it now."""
        self._validate(message_id)
        now = self.clock() if now is None else now
        live = self._live_entry(message_id, now)
        if live is not None:
            return DedupVerdict(duplicate=True, first_seen=live[0] / 1000)
        self._store(message_id, int(now * 1000), int(partition))
        return DedupVerdict(duplicate=False, first_seen=now)

    def record(self, message_id: str, now: float | None = None, *, partition: int = 0) -> None:
        """Remember ``message_id`` as first seen ``now`` without reading it first.

        For a caller that has already established the id is not live (the dedup stage checks
        with :meth:`seen`, then records once the outputs are written): one table write instead
        of a read and a write.
        """
        self.record_many([(message_id, partition)], now)

    def record_many(self, entries: Iterable[tuple[str, int]], now: float | None = None) -> None:
        """:meth:`record` for each ``(message_id, partition)``, all first seen ``now``."""
        first_seen_ms = int((self.clock() if now is None else now) * 1000)
        for message_id, partition in entries:
            self._validate(message_id)
            self._store(message_id, first_seen_ms, int(partition))

    def seen(self, message_id: str, now: float | None = None, *, partition: int | None = None) -> bool:
        """Read-only: is ``message_id`` inside the window? (``partition``: where a partitioned
        store keeps it; a plain mapping ignores it.)"""
        self._validate(message_id)
        return self._live_entry(message_id, self.clock() if now is None else now) is not None

    def expired(self, now: float | None = None) -> list[tuple[Any, int]]:
        """Scan for ``(stored key, partition)`` of entries past the window."""
        limit_ms = ((self.clock() if now is None else now) - self.window) * 1000
        return [(key, partition) for key, first_ms, partition in self._scan() if first_ms <= limit_ms]

    def discard(self, key: Any, now: float | None = None) -> bool:
        """Delete the entry under ``key`` (as :meth:`expired` returned it) if it is still expired;
        False if absent or live again."""
        value = self._entry_at(key)
        if value is None:
            return False
        if self._is_live(value[0], self.clock() if now is None else now):
            return False  # re-recorded since it was queued for expiry
        self._delete(key)
        return True

    def _entry_at(self, key: Any) -> tuple[int, int] | None:
        return self.entry(key)

    def purge(self, now: float | None = None) -> int:
        """Delete every expired entry (use on plain mappings; Faust tables use the sweep)."""
        now = self.clock() if now is None else now
        return sum(self.discard(key, now) for key, _ in self.expired(now))

    def __len__(self) -> int:
        return len(self.backend)


_ENTRY = struct.Struct(">qi")  # first_seen_ms, partition


async def _know_partitions(producer: Any, topic: str, partitions: Iterable[int]) -> None:
    """Refresh the producer's metadata when it does not know one of `partitions` of `topic`.

    Why: `send_batch(..., partition=p)` asserts that `p` is in the producer's cached metadata,
    and aiokafka refreshes that cache only every `metadata_max_age_ms` (5 minutes). A worker
    that started while the changelog topic was still being created (two workers of a group
    starting at once, on the embedded broker) cached it with fewer partitions, and every flush
    failed with "Unrecognized partition" until the cache aged - the batch, and the worker, held
    for minutes (seen in the rebalance test)."""
    known = producer.client.cluster.partitions_for_topic(topic)
    if known is None or any(p not in known for p in partitions):
        await producer.client.force_metadata_update()
#: exactly_once: (key, value or None for a tombstone, partition) of a batch's changelog records
StagedRow = tuple[bytes, bytes | None, int]


def _decode_entry(raw: bytes) -> tuple[int, int]:
    if len(raw) == _ENTRY.size:
        first_ms, partition = _ENTRY.unpack(raw)
        return first_ms, partition
    first_ms, partition = json.loads(raw)  # written by a version that used Faust's JSON codec
    return int(first_ms), int(partition)


class FaustDedupWindow(DedupWindow):
    """:class:`DedupWindow` on a RocksDB-backed Faust table with a changelog.

    Create it while defining the app (it registers a timer). Call :meth:`check` from inside the
    agent that processes the messages; the input must be keyed (partitioned) by ``message_id``.

    Args:
        app: the ``faust.App``.
        name: table name (changelog topic ``<app_id>-<name>-changelog``).
        window: seconds an id is remembered.
        partitions: partition count of the source topic.
        sweep_interval: seconds between expiry scans.
        max_deletes_per_event: expired ids deleted per processed event (bounds added latency).
        clock: epoch-seconds clock (injectable for tests).
    """

    def __init__(self, app: Any, name: str = "dedup", *, window: float = 3600.0, partitions: int | None = None,
                 sweep_interval: float = 60.0, max_deletes_per_event: int = 64,
                 clock: Callable[[], float] = time.time) -> None:
        self.table = make_table(app, name, partitions=partitions, raw=True,
                                help=f"message_id -> (first_seen_ms, partition) for a {window:g}s dedup window")
        super().__init__(self.table, window, clock=clock)
        self.max_deletes_per_event = max_deletes_per_event
        self._pending: defaultdict[int, list[bytes]] = defaultdict(list)
        self._app = app
        #: changelog records written to the store by `record`, not yet sent: (key, value, partition)
        self._unsent: list[tuple[bytes, bytes, int]] = []
        #: highest acknowledged changelog offset per changelog partition, not yet stored
        self._acked: dict[Any, int] = {}
        self._inflight: set[asyncio.Future[Any]] = set()
        # Faust passes the app to timer functions that take parameters: register a zero-arg one.
        app.timer(sweep_interval, name=f"{name}-expiry-scan")(self._scan_timer)

    # -- raw-bytes storage (see the module docstring) --------------------------------------------
    def entry(self, message_id: str) -> tuple[int, int] | None:
        return self._entry_at(message_id.encode())

    def _entry_at(self, key: bytes) -> tuple[int, int] | None:
        # The store itself, as `record` writes it: `Table.get` would look the key up twice when
        # present (`in`, then `[]`) behind the table's sensor hooks, on every message's check.
        raw = self.table.data.get(key)
        return None if raw is None else _decode_entry(raw)

    def _store(self, message_id: str, first_seen_ms: int, partition: int) -> None:
        self.table[message_id.encode()] = _ENTRY.pack(first_seen_ms, partition)

    def _partition_db(self, partition: int) -> Any:
        """The RocksDB database of `partition`, or None for a store that has none (the memory
        store). Faust's RocksDB store keeps one per partition and, inside an agent, routes a
        read or write to the current event's; with the partition known, the worker's per-message
        read and write go to it directly, not through the store's mapping layers (key encoding,
        the current-event lookup, the key index: ~5 % of the worker's CPU in a profile)."""
        db_for = getattr(self.table.data, "_db_for_partition", None)
        return None if db_for is None else db_for(partition)

    def seen(self, message_id: str, now: float | None = None, *, partition: int | None = None) -> bool:
        """:meth:`DedupWindow.seen`; with ``partition``, one ``get`` on that partition's database
        (where Faust's own read inside the agent would look: the current event's partition)."""
        db = None if partition is None else self._partition_db(partition)
        if db is None:
            return super().seen(message_id, now)
        self._validate(message_id)
        raw = db.get(message_id.encode())
        return raw is not None and self._is_live(_decode_entry(raw)[0], self.clock() if now is None else now)

    def _scan(self) -> Iterator[tuple[bytes, int, int]]:
        for key, raw in self.table.items():
            if raw is not None:
                yield (key, *_decode_entry(raw))

    async def _scan_timer(self) -> None:
        await self.scan_expired()

    async def scan_expired(self, now: float | None = None) -> int:
        """Timer: queue expired ids per partition (reads only; deletes happen in the agent).

        Yields to the event loop every few thousand entries so a large table does not stall
        the agents. Returns the number of ids queued.
        """
        limit_ms = ((self.clock() if now is None else now) - self.window) * 1000
        pending: defaultdict[int, list[bytes]] = defaultdict(list)
        for index, (key, first_ms, partition) in enumerate(self._scan()):
            if first_ms <= limit_ms:
                pending[partition].append(key)
            if index % 5000 == 4999:
                await asyncio.sleep(0)
        self._pending = pending
        return sum(len(keys) for keys in pending.values())

    @property
    def pending_expiry(self) -> int:
        """Expired ids queued for deletion by the agent."""
        return sum(len(keys) for keys in self._pending.values())

    def check(self, message_id: str, now: float | None = None, *, partition: int | None = None) -> DedupVerdict:
        """Check-and-record inside an agent; first deletes a few expired ids of this partition.

        ``partition`` defaults to the current event's; pass it only outside Faust (tests).
        """
        part = current_partition() if partition is None else partition
        self._drain(part, now)
        return super().check(message_id, now, partition=part)

    def record(self, message_id: str, now: float | None = None, *, partition: int | None = None) -> None:
        """:meth:`DedupWindow.record` inside an agent (the current event routes the store write),
        draining a few expired ids first like :meth:`check`. The changelog record is only queued:
        call :meth:`flush_changelog` before the batch's source offsets may be committed."""
        self.record_many([(message_id, current_partition() if partition is None else partition)], now)

    def record_many(self, entries: Iterable[tuple[str, int]], now: float | None = None) -> None:
        """:meth:`record` for a batch's ids: one RocksDB write batch per partition instead of
        one write per id (measured: ~1.2 instead of ~3 µs an id), the expiry drain once per
        partition with the quota of as many single records."""
        first_seen_ms = int((self.clock() if now is None else now) * 1000)
        by_partition: dict[int, list[tuple[bytes, bytes]]] = {}
        validate, pack = self._validate, _ENTRY.pack
        for message_id, partition in entries:
            validate(message_id)
            part = int(partition)
            rows = by_partition.get(part)
            if rows is None:
                rows = by_partition[part] = []
            rows.append((message_id.encode(), pack(first_seen_ms, part)))
        unsent = self._unsent
        for part, rows in by_partition.items():
            self._drain(part, now, quota=self.max_deletes_per_event * len(rows))
            db = self._partition_db(part)
            if db is not None and _WriteBatch is not None and getattr(self.table.data, "use_rocksdict", False):
                wb = _WriteBatch(raw_mode=True)
                for key, value in rows:
                    wb.put(key, value)
                db.write(wb)  # the RocksDB store alone, as `record`: no changelog record, no callbacks
            else:
                data = self.table.data
                for key, value in rows:
                    data[key] = value
            unsent.extend((key, value, part) for key, value in rows)

    @property
    def unsent(self) -> int:
        """Changelog records written locally by :meth:`record` and not yet acknowledged by Kafka."""
        return len(self._unsent)

    async def flush_changelog(self, *, wait: bool = True) -> None:
        """Send the queued changelog records; with `wait`, also wait until the broker has
        acknowledged every record sent so far (raising the first error; failed records are
        queued again).

        `wait=False` is what the worker uses, like Faust's own table writes: Faust flushes the
        producer before it commits source offsets (at-least-once), so the records are durable
        before the inputs that made them count as done, and the batch does not pay a round trip.
        A record whose send fails is queued again and resent by the next flush (a changelog record
        written twice is harmless: same key, same value). Acknowledged offsets become each
        partition's persisted offset (what lets a restart on the same data directory skip
        replaying what RocksDB already holds), stored at the next flush.
        """
        self._store_persisted_offsets()
        batch, self._unsent = self._unsent, []
        if batch:
            await self._send_changelog(batch)
        if wait and self._inflight:  # this flush's records and any still in flight from earlier ones
            results = await asyncio.gather(*self._inflight, return_exceptions=True)
            self._store_persisted_offsets()
            errors = [r for r in results if isinstance(r, BaseException)]
            if errors:
                raise errors[0]

    async def _send_changelog(self, batch: list[tuple[bytes, bytes, int]]) -> None:
        """Hand `batch` to the aiokafka producer beneath Faust's, one `send_batch` per changelog
        partition (`app/worker/batch_send.py` explains why: half the CPU of one `send` per
        record). The records are the ones `send(topic, key, value, partition)` wrote - no
        headers, the producer's clock as timestamp. Records not handed over when a call raises
        are queued again."""
        topic = self.table.changelog_topic.get_topic_name()
        producer = self._app.producer._ensure_producer()
        by_partition: dict[int, list[tuple[bytes, bytes, int]]] = {}
        for record in batch:
            by_partition.setdefault(record[2], []).append(record)
        await _know_partitions(producer, topic, by_partition)
        queues = list(by_partition.values())
        for j, records in enumerate(queues):
            builder, in_builder, k = producer.create_batch(), [], 0
            try:
                while k < len(records):
                    key, value, _ = records[k]
                    if builder.append(timestamp=None, key=key, value=value, headers=[]) is None:
                        if not in_builder:
                            raise RuntimeError(f"a {len(key) + len(value)}-byte changelog record does not fit "
                                               "an empty producer batch")
                        await self._hand_over(producer, topic, builder, in_builder)
                        builder, in_builder = producer.create_batch(), []
                        continue  # the same record again, into the fresh batch
                    in_builder.append(records[k])
                    k += 1
                if in_builder:
                    await self._hand_over(producer, topic, builder, in_builder)
                    in_builder = []
            except BaseException:
                # not handed to the producer (appended to an unsent batch, or not yet): next flush
                self._unsent[:0] = in_builder + records[k:] + [r for rest in queues[j + 1:] for r in rest]
                raise

    async def _hand_over(self, producer: Any, topic: str, builder: Any,
                         records: list[tuple[bytes, bytes, int]]) -> None:
        # Complete: ready to send at once. An open builder lingers in the accumulator for the
        # producer's linger (5 ms), and a lingering batch is left out of the produce request the
        # sender builds meanwhile - it went out alone, a request of its own per batch of ids
        # (as the outputs are: app/worker/batch_send.py, module docstring, "Sent at once").
        builder.close()
        fut = await producer.send_batch(builder, topic, partition=records[0][2])
        self._inflight.add(fut)
        fut.add_done_callback(functools.partial(self._changelog_sent, list(records)))

    def _changelog_sent(self, records: list[tuple[bytes, bytes, int]], fut: asyncio.Future[Any]) -> None:
        self._inflight.discard(fut)
        if fut.cancelled() or fut.exception() is not None:
            self._unsent.extend(records)
            return
        md = fut.result()  # the batch's metadata: its first record's offset
        last = md.offset + len(records) - 1
        if last > self._acked.get(md.topic_partition, -1):
            self._acked[md.topic_partition] = last

    # -- exactly_once: staged in the batch's transaction, applied once it commits ---------------
    def stage_many(self, entries: Iterable[tuple[str, int]], now: float | None = None) -> list[StagedRow]:
        """What :meth:`record_many` would write for a batch's ids - and the tombstones of expired
        ids due for deletion on those partitions - without writing anything.

        Why (processing_guarantee exactly_once, app/worker/transactions.py): the rows go to the
        changelog inside the batch's transaction and into RocksDB only after it commits
        (:meth:`apply_staged`). Written first, an aborted transaction would leave the local store
        remembering ids whose outputs were never committed, and the re-read input would be dropped
        as a duplicate - a loss. Until then the dedup stage's `pending` set covers the ids.
        Tombstones come before the puts, so an expired id recorded again ends up recorded."""
        current = self.clock() if now is None else now
        first_seen_ms = int(current * 1000)
        puts: list[StagedRow] = []
        counts: dict[int, int] = {}
        validate, pack = self._validate, _ENTRY.pack
        for message_id, partition in entries:
            validate(message_id)
            part = int(partition)
            counts[part] = counts.get(part, 0) + 1
            puts.append((message_id.encode(), pack(first_seen_ms, part), part))
        tombstones: list[StagedRow] = []
        for part, n in counts.items():
            queue = self._pending.get(part)
            if not queue:
                continue
            quota = self.max_deletes_per_event * n
            due, self._pending[part] = queue[:quota], queue[quota:]
            for key in due:
                value = self._entry_at(key)
                if value is not None and not self._is_live(value[0], current):
                    tombstones.append((key, None, part))
        return tombstones + puts

    def stage_removals(self, entries: Iterable[tuple[str, int]]) -> list[StagedRow]:
        """Tombstones for ids staged by :meth:`stage_many` in the same transaction whose outputs then
        failed after all (dead-lettered instead): sent after the puts, the changelog's last word on
        each id is its removal, and :meth:`apply_staged` of the puts followed by these leaves the
        ids absent - a re-send of those messages must not be dropped as a duplicate.

        Why the put goes out at all: exactly_once queues the changelog as soon as the outputs are
        queued, before their deliveries are known (app/worker/exactly_once.py), so that its produce
        round trip overlaps theirs; an output failing after it was queued is rare."""
        validate = self._validate
        rows: list[StagedRow] = []
        for message_id, partition in entries:
            validate(message_id)
            rows.append((message_id.encode(), None, int(partition)))
        return rows

    async def send_staged(self, producer: Any, rows: list[StagedRow]) -> list[tuple[asyncio.Future[Any], int]]:
        """Hand `rows` to `producer` (the batch's transactional producer), one `send_batch` per
        changelog partition and full producer batch; returns (delivery future, records in it)."""
        topic = self.table.changelog_topic.get_topic_name()
        by_partition: dict[int, list[StagedRow]] = {}
        for row in rows:
            by_partition.setdefault(row[2], []).append(row)
        await _know_partitions(producer, topic, by_partition)
        sent: list[tuple[asyncio.Future[Any], int]] = []
        for part, records in by_partition.items():
            builder, n = producer.create_batch(), 0
            for key, value, _ in records:
                if builder.append(timestamp=None, key=key, value=value, headers=[]) is None:
                    if not n:
                        raise RuntimeError(f"a {len(key) + len(value or b'')}-byte changelog record does not fit "
                                           "an empty producer batch")
                    sent.append((await producer.send_batch(builder, topic, partition=part), n))
                    builder, n = producer.create_batch(), 0
                    if builder.append(timestamp=None, key=key, value=value, headers=[]) is None:
                        raise RuntimeError("a changelog record does not fit an empty producer batch")
                n += 1
            if n:
                sent.append((await producer.send_batch(builder, topic, partition=part), n))
        return sent

    def apply_staged(self, rows: list[StagedRow], sent: list[tuple[asyncio.Future[Any], int]]) -> None:
        """The committed transaction's rows into RocksDB, then each changelog partition's persisted
        offset: the offset of the transaction's commit marker (its last record's + 1).

        Why the marker: in exactly_once only the partition's transactional producer writes this
        changelog partition (one writer: its records, then its marker), so the marker is the last
        offset this store reflects; table recovery (`read_committed`) then starts after it and
        has nothing to wait for. Data first, offset second: a crash between the two replays
        records the store already holds, which is harmless (same key, same value)."""
        by_partition: dict[int, list[StagedRow]] = {}
        for row in rows:
            by_partition.setdefault(row[2], []).append(row)
        data = self.table.data
        for part, records in by_partition.items():
            db = self._partition_db(part)
            if db is not None and _WriteBatch is not None and getattr(data, "use_rocksdict", False):
                wb = _WriteBatch(raw_mode=True)
                for key, value, _ in records:
                    if value is None:
                        wb.delete(key)
                    else:
                        wb.put(key, value)
                db.write(wb)
            else:
                for key, value, _ in records:
                    if value is None:
                        data.pop(key, None)
                    else:
                        data[key] = value
        ends: dict[Any, int] = {}
        for fut, n in sent:
            md = fut.result()
            marker = md.offset + n  # last record's offset + 1
            if marker > ends.get(md.topic_partition, -1):
                ends[md.topic_partition] = marker
        for tp, offset in ends.items():
            data.set_persisted_offset(tp, offset)

    def _store_persisted_offsets(self) -> None:
        acked, self._acked = self._acked, {}
        for tp, offset in acked.items():
            self.table.data.set_persisted_offset(tp, offset)

    def _drain(self, partition: int, now: float | None, quota: int | None = None) -> None:
        queue = self._pending.get(partition)
        if not queue:
            return
        n = self.max_deletes_per_event if quota is None else quota
        batch, self._pending[partition] = queue[:n], queue[n:]
        for key in batch:
            self.discard(key, now)

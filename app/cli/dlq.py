"""`prism dlq replay`: put dead-lettered records back where they were read, once.

What a replay writes. Each selected DLQ record is re-produced onto its source topic **at the
partition it was read from** (`prism.errors.partition`), with its original key, value (secrets
masked), headers and timestamp, minus the `prism.errors.*` context headers. Why the partition
and not the key: dedup is per source partition (the dedup window is a partitioned Faust table),
and a record without a key used to land wherever the producer's partitioner put it - a second
replay of the same message then met an empty window on another partition and was emitted again.
On its own partition a replayed message meets its earlier copy's id.

The `prism-dlq-attestation` header stays: the masked token cannot authenticate the record again,
the worker-signed attestation of the identity verified before the failure does
(app/security/attestation.py). Records are re-produced byte for byte, because the attestation is
bound to the record's value, key and remaining headers.

The ledger. Dedup alone is not enough: its window is finite and inputs without an attested id
get a new id at their new offset. So every replay is recorded in a compacted topic,
`<dlq topic>.replayed` (one partition), keyed by the DLQ record's `PARTITION@OFFSET`, with a JSON
value (`LedgerEntry`): the DLQ value's SHA-256, where the record came from and where the replay
landed, when, by whom, and whether it was forced. A record whose key and digest are in the ledger
is skipped ("already replayed") unless `--force`; a digest that differs means the DLQ topic was
recreated and the offset now holds another record, which is not skipped. Being a topic, the
ledger survives the CLI process and is shared by every machine that replays. It holds no token
or payload, so the source topics' short retention does not apply: it is compacted, never
expired, so a DLQ record stays replayed for as long as the DLQ keeps it.

Exactly one send. Each replay writes the ledger twice: a `pending` entry *before* the send
(acknowledged; it names the target partition's end offset at that moment and the SHA-256 of the
value about to be sent), then the `done` entry once the send is acknowledged. A run killed
between the two leaves `pending`; the next run reads the target partition from that offset and
looks for the record (same key, timestamp and value digest - no marker header is added, since
the attestation covers the headers). Found: the `done` entry is written and nothing is sent,
`--force` or not ("recovered"). Not found: it was never sent, and is replayed. The range no
longer there (retention deleted it): skipped as `unconfirmed`; `--force` sends it, said to be
possibly a second copy. Ledger records are validated field by field (types and bounds); one
that is not a valid entry is skipped with one warning per ledger, never fatal.

What is never replayed (docs/operations.md, "DLQ replay"), `--force` or not:

* `foreign_source`: the record's `prism.errors.topic` is not the source whose DLQ it was read
  from. The target topic always comes from the topology the operator named, never from a
  header: whoever can write a DLQ topic must not be able to steer records into other topics.
  A sink's dead letter (its recorded topic is an output, `<source>.v3`) is one of these too.
* `bad_coordinates`: the recorded partition is missing, not a number, or not a partition of
  the source topic.
* `truncated`: the DLQ copy was cut to fit the DLQ topic (`prism.errors.value.truncated`, ...)
  and no whole copy is stored by reference: its headers or key were cut too, or it was written
  without `dlq.overflow`; the whole record is only in the source topic, at the recorded offset.

A copy whose value alone was cut and whose whole value is stored by reference
(`prism.errors.value.ref`, app/worker/dlq_overflow.py) is replayed whole: the value is read from
the reference, its SHA-256 must equal `prism.errors.value.sha256` (else skipped as
`ref_mismatch`; unreadable: `ref_unreadable`), and the record must fit the source topic's limit
- its `max.message.bytes`, else the worker's producer limit (`PRISM_MAX_REQUEST_BYTES`, 4 MiB by
default) - or it is skipped as `too_large` with both sizes: replaying it could only fail again. The value
is read only from the topology's `dlq.overflow` store, and only by a reference of the form the
worker writes (`<store>/sha256/<2 hex>/<64 hex>`, no symbolic link followed): any other reference
- one a producer forged into a record written before the worker dropped producers'
`prism.errors.*` headers - is skipped as `ref_refused`, never opened.
"""

from __future__ import annotations

import asyncio
import getpass
import hashlib
import json
import re
import socket
import time
from collections import Counter, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, Literal

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from rich.console import Console
from rich.progress import Progress

from app.agents.dlq import (
    HEADERS_TRUNCATED,
    KEY_SHA256,
    VALUE_REF,
    VALUE_SHA256,
    VALUE_TRUNCATED,
    error_context,
    strip_error_headers,
)
from app.decimal_text import decimal
from app.errors import ConfigError, PrismError
from app.topology import Source, Topology
from app.worker.limits import WriteLimits, max_request_from_env, record_size
from app.worker.offsets import true_end_offsets

#: The ledger topic of a DLQ topic is its name plus this.
LEDGER_SUFFIX = ".replayed"
#: Created with these configs: latest entry per DLQ record kept, none ever expired.
LEDGER_CONFIGS = {"cleanup.policy": "compact"}
LEDGER_VERSION = 1
_MAX_OFFSET = 2**63 - 1
_REF = re.compile(r"^(\d{1,19})@(\d{1,19})$")
_RANGE = re.compile(r"^(\d{1,19})@(\d{1,19})-(\d{1,19})$")
#: Sends in flight before the ledger entries of a chunk are written.
_CHUNK = 500

Action = Literal["replayed", "would_replay", "skipped"]


class BadSelector(ConfigError):
    """A `--record`, `--range` or `--source` the replay cannot act on (exit 2, nothing sent)."""

    code = "bad_selector"


def ledger_topic(dlq_topic: str) -> str:
    """Where the replays of `dlq_topic` are recorded."""
    return dlq_topic + LEDGER_SUFFIX


def ledger_topics(topology: Topology) -> dict[str, int]:
    """Every ledger topic of `topology` with its partition count (one), for `prism topics create`."""
    return {ledger_topic(s.topic + topology.dlq.topic_suffix): 1 for s in topology.sources}


# --------------------------------------------------------------------------- selection


@dataclass(frozen=True, slots=True)
class Selection:
    """Which DLQ records a replay considers: `records` (PARTITION, OFFSET) and inclusive `ranges`
    (PARTITION, FIRST, LAST); both empty means every record. `--reason` filters on top."""

    records: frozenset[tuple[int, int]] = frozenset()
    ranges: tuple[tuple[int, int, int], ...] = ()

    @property
    def everything(self) -> bool:
        return not self.records and not self.ranges

    def matches(self, partition: int, offset: int) -> bool:
        return self.everything or (partition, offset) in self.records or any(
            p == partition and first <= offset <= last for p, first, last in self.ranges)


def _fix(option: str) -> str:
    if option == "--range":
        return "write it as --range 0@40-49 (partition 0, offsets 40 to 49, both included)"
    return f"write {option} as `prism dlq list` prints a record, e.g. 0@42 (partition 0, offset 42)"


def _check(option: str, raw: str, partitions: int, dlq_topic: str, partition: int, *offsets: int) -> None:
    if partition >= partitions:
        raise BadSelector(f"{option} {raw!r}: {dlq_topic} has partitions 0..{partitions - 1}, not {partition}",
                          path=option, hint="use a partition `prism dlq list` shows")
    if any(o > _MAX_OFFSET for o in offsets):
        raise BadSelector(f"{option} {raw!r}: an offset is larger than Kafka's largest ({_MAX_OFFSET})",
                          path=option, hint=_fix(option))


def parse_ref(raw: str, partitions: int, dlq_topic: str, option: str = "--record") -> tuple[int, int]:
    """One `PARTITION@OFFSET` of `dlq_topic` (which has `partitions`). Raises `BadSelector`."""
    m = _REF.match(raw.strip())
    if not m:
        raise BadSelector(f"{option} {raw!r} is not PARTITION@OFFSET", path=option, hint=_fix(option))
    part, off = int(m.group(1)), int(m.group(2))
    _check(option, raw, partitions, dlq_topic, part, off)
    return part, off


def parse_selection(records: Sequence[str], ranges: Sequence[str], partitions: int, dlq_topic: str) -> Selection:
    """`--record P@O` and `--range P@FIRST-LAST` values, checked against the DLQ topic's
    `partitions`. Raises `BadSelector` naming the value, the option and the fix."""
    refs = {parse_ref(raw, partitions, dlq_topic) for raw in records}
    spans: list[tuple[int, int, int]] = []
    for raw in ranges:
        m = _RANGE.match(raw.strip())
        if not m:
            raise BadSelector(f"--range {raw!r} is not PARTITION@FIRST-LAST", path="--range", hint=_fix("--range"))
        part, first, last = int(m.group(1)), int(m.group(2)), int(m.group(3))
        _check("--range", raw, partitions, dlq_topic, part, first, last)
        if last < first:
            raise BadSelector(f"--range {raw!r} ends before it starts", path="--range",
                              hint=f"write the lower offset first: {part}@{last}-{first}")
        spans.append((part, first, last))
    return Selection(frozenset(refs), tuple(spans))


def choose_sources(topology: Topology, source: str | None, selection_given: bool) -> list[Source]:
    """The sources a replay acts on: `--source`, else all - but a `--record`/`--range` names a
    record of one DLQ topic, so with several sources it needs `--source`."""
    if source is not None:
        chosen = [s for s in topology.sources if s.topic == source]
        if not chosen:
            raise BadSelector(f"--source {source!r} is not a source of topology {topology.name!r}", path="--source",
                              hint="use one of " + ", ".join(s.topic for s in topology.sources))
        return chosen
    if selection_given and len(topology.sources) > 1:
        raise BadSelector(f"--record/--range name records of one DLQ topic, and topology {topology.name!r} has "
                          f"{len(topology.sources)} sources", path="--source",
                          hint="add --source TOPIC (one of " + ", ".join(s.topic for s in topology.sources) + ")")
    return list(topology.sources)


# --------------------------------------------------------------------------- reading


def _consumer(bootstrap: str, settings: Any, *, fetch_max_bytes: int | None = None) -> AIOKafkaConsumer:
    """The group-less, `read_committed` consumer every DLQ and ledger read uses (`read_to_end`)."""
    limits = {} if fetch_max_bytes is None else {"fetch_max_bytes": fetch_max_bytes,
                                                  "max_partition_fetch_bytes": min(fetch_max_bytes, 1 << 20)}
    return AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None, auto_offset_reset="earliest",
                            enable_auto_commit=False, isolation_level="read_committed", **limits,
                            **(settings.aiokafka_kwargs() if settings else {}))


class Unreadable(PrismError):
    """Records the Kafka client cannot decode (a header name that is not UTF-8: aiokafka decodes
    header names, and one such record fails its whole batch - every read from any offset of it)."""

    code = "dlq_unreadable"


#: what the client raises on a record it cannot decode (app/cli/dlq.py `_read_spans`)
_UNDECODABLE = (UnicodeDecodeError,)


async def _probe_bad(consumer: AIOKafkaConsumer, tp: TopicPartition, offset: int) -> bool:
    """Whether a read from `offset` of `tp` fails to decode (before it returns a record)."""
    consumer.seek(tp, offset)
    for _ in range(20):
        try:
            got = await consumer.getmany(tp, timeout_ms=500, max_records=1)
        except _UNDECODABLE:
            return True
        if got.get(tp) or await consumer.position(tp) > offset:
            return False
    return False


async def _skip_unreadable(consumer: AIOKafkaConsumer, tp: TopicPartition, stop: int,
                           take: Callable[[list[Any]], None]) -> tuple[int, int] | None:
    """After a read of `tp` failed to decode: hand the good records before the bad batch to
    `take`, one by one (the failed read returned none of them), and find where the bad batch ends
    (any read from inside it fails: exponential steps, then bisection - a few reads, not one per
    offset). Returns the offsets [first, after) skipped, the consumer placed at `after`; None when
    the records up to `stop` read after all."""
    start = await consumer.position(tp)
    consumer.seek(tp, start)  # drop the failed fetch
    idle = 0
    while await consumer.position(tp) < stop:
        try:
            got = await consumer.getmany(tp, timeout_ms=500, max_records=1)
        except _UNDECODABLE:
            break
        idle = 0 if got.get(tp) else idle + 1
        if idle > 20:  # the broker stopped answering: the caller's deadline decides
            return None
        take([r for r in got.get(tp, []) if r.offset < stop])
    else:
        return None
    first = await consumer.position(tp)
    bad, step = first, 1
    good = min(first + step, stop)
    while good < stop and await _probe_bad(consumer, tp, good):
        bad, step = good, step * 2
        good = min(first + step, stop)
    while good - bad > 1:
        mid = (bad + good) // 2
        if await _probe_bad(consumer, tp, mid):
            bad = mid
        else:
            good = mid
    consumer.seek(tp, good)
    return first, good


async def _read_spans(consumer: AIOKafkaConsumer, topic: str, spans: Mapping[TopicPartition, tuple[int, int]],
                      timeout: float, take: Callable[[list[Any]], None],
                      skipped: list[tuple[int, int, int]] | None = None) -> None:
    """Hand every record of ``spans`` (partition -> [first, stop) offsets) to ``take``, batch by
    batch, in offset order per partition; raise rather than return a partial read (`read_to_end`).
    The one fetch loop of every DLQ and ledger read: the whole topic, a window, one record.

    One partition per fetch call: a record the client cannot decode raises out of the call, and a
    call over several partitions dropped the records it had already taken from the others (their
    positions moved on: lost without a word). Such records - one with a header name that is not
    UTF-8 made every DLQ page of its pipeline a 500, `prism dlq list` a traceback - are skipped
    with the offsets of their batch appended to `skipped` (partition, first, after), or, without
    `skipped`, raise `Unreadable`."""
    pending = {tp for tp, (first, stop) in spans.items() if first < stop}
    for tp in pending:
        consumer.seek(tp, spans[tp][0])
    deadline = time.monotonic() + timeout
    while pending:
        if time.monotonic() > deadline:
            where = ", ".join(f"partition {tp.partition} at {await consumer.position(tp)} of {spans[tp][1]}"
                              for tp in sorted(pending))
            raise PrismError(f"could not read {topic} to its end within {timeout:.0f} s ({where})",
                             path=topic, hint="check the broker and the consumer's read permission, then retry")
        for tp in sorted(pending):
            stop = spans[tp][1]
            try:
                recs = (await consumer.getmany(tp, timeout_ms=500 // len(pending) + 1, max_records=5000)).get(tp, [])
            except _UNDECODABLE:
                cut = await _skip_unreadable(consumer, tp, stop, take)
                if cut is None:
                    continue
                if skipped is None:
                    where = f"offset {cut[0]}" if cut[1] - cut[0] == 1 else f"offsets {cut[0]}-{cut[1] - 1}"
                    raise Unreadable(f"{topic} partition {tp.partition} {where}: the Kafka client cannot decode "
                                     "a record there (a header name that is not UTF-8)", path=topic,
                                     hint="find who writes such records to the topic (the console's DLQ page "
                                          "skips them and says where)") from None
                skipped.append((tp.partition, *cut))
                continue
            take([r for r in recs if r.offset < stop] if recs and recs[-1].offset >= stop else recs)
        pending = {tp for tp in pending if await consumer.position(tp) < spans[tp][1]}


async def read_to_end(bootstrap: str, topic: str, partitions: int, *, settings: Any = None,
                      timeout: float = 120.0, take: Callable[[list[Any]], None] | None = None) -> list[Any]:
    """Every record of `topic`, read up to the end offsets taken at the start.

    Why not "until quiet": a ledger read short by one entry replays that record again, so this
    reads to the true end (corrected for the embedded broker, app/worker/offsets.py) and raises
    rather than returning a partial read. A topic that does not exist reads as empty and is not
    created: a consumer naming it would create it on a broker that auto-creates topics, and
    reading (`prism dlq list`, a replay with nothing to replay) must leave nothing behind.

    `read_committed`: an `exactly_once` worker writes its DLQ records inside the batch's
    transaction, and a batch cut short is aborted and processed again - read uncommitted, the
    DLQ (and the console's DLQ pages) held the aborted copy besides the committed one, and a
    replay put the failed record back twice. Without transactions it reads the same records.

    With `take`, each batch is handed to it as it is read and nothing is kept (the list returned
    is empty): a caller that keeps only some records holds only those."""
    if not await topic_exists(bootstrap, topic, settings=settings):
        return []
    consumer = _consumer(bootstrap, settings)
    await consumer.start()
    out: list[Any] = []
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        begin = await consumer.beginning_offsets(tps)
        ends = await true_end_offsets(consumer, tps)
        await _read_spans(consumer, topic, {tp: (begin.get(tp, 0), ends.get(tp, 0)) for tp in tps}, timeout,
                          take or out.extend)
    finally:
        await consumer.stop()
    return out


async def read_spans(bootstrap: str, topic: str, partitions: int, spans: Sequence[tuple[int, int, int]], *,
                     settings: Any = None, timeout: float = 60.0) -> list[Any]:
    """The records of `topic` in `spans` - (partition, first, stop): offsets [first, stop) - each
    cut to the log, each record once, in (partition, offset) order, through one consumer; spans of
    partitions the topic does not have, and a
    topic that does not exist, read as nothing. `Unreadable` when the client cannot decode a
    batch they cover. What `read_record` and a replay of chosen records read, instead of the
    whole topic."""
    wanted = [(p, max(0, a), b) for p, a, b in spans if 0 <= p < partitions and max(0, a) < b]
    if not wanted or not await topic_exists(bootstrap, topic, settings=settings):
        return []
    consumer = _consumer(bootstrap, settings)
    await consumer.start()
    found: list[Any] = []
    try:
        tps = sorted({TopicPartition(topic, p) for p, _, _ in wanted})
        consumer.assign(tps)
        begin = await consumer.beginning_offsets(tps)
        end = await true_end_offsets(consumer, tps)
        # rounds of at most one span per partition (what `_read_spans` reads at once)
        rounds: list[dict[TopicPartition, tuple[int, int]]] = []
        for p, a, b in sorted(wanted):
            tp = TopicPartition(topic, p)
            first, stop = max(a, begin.get(tp, 0)), min(b, end.get(tp, 0))
            if first < stop:
                free = next((r for r in rounds if tp not in r), None)
                if free is None:
                    rounds.append(free := {})
                free[tp] = (first, stop)
        for spans_of_round in rounds:
            await _read_spans(consumer, topic, spans_of_round, timeout, found.extend)
    finally:
        await consumer.stop()
    once = {(r.partition, r.offset): r for r in found}  # spans may overlap: each record once
    return [once[k] for k in sorted(once)]


async def read_record(bootstrap: str, topic: str, partitions: int, partition: int, offset: int, *,
                      settings: Any = None, timeout: float = 30.0) -> Any | None:
    """The record at `partition`@`offset` of `topic`, or None (no such topic, partition or offset:
    deleted by retention, beyond the end, a transaction marker or an aborted record); `Unreadable`
    when the client cannot decode the batch holding it. Reads that one offset - `prism dlq show`
    and the console's record page read the whole topic to find one record, so a flooded DLQ made
    every record view cost its whole size."""
    found = await read_spans(bootstrap, topic, partitions, [(partition, offset, offset + 1)], settings=settings,
                             timeout=timeout)
    return next((r for r in found if (r.partition, r.offset) == (partition, offset)), None)


def record_bytes(rec: Any) -> int:
    """What one record holds in memory, roughly: its key, value and headers (names and values)."""
    return len(rec.key or b"") + len(rec.value or b"") + sum(len(k) + len(v or b"") for k, v in rec.headers or ())


@dataclass
class PartitionWindow:
    """Where a window read one partition: offsets [`first`, `stop`) of the log's [`begin`, `end`)."""

    partition: int
    begin: int
    end: int
    stop: int
    first: int

    @property
    def older(self) -> int:
        """Offsets of this partition before the window (the next page reads them)."""
        return max(0, self.first - self.begin)


@dataclass
class Window:
    """The newest records of a topic below a cursor, bounded in records and bytes (`read_window`)."""

    topic: str
    records: list[Any] = field(default_factory=list)
    partitions: list[PartitionWindow] = field(default_factory=list)
    #: the byte bound dropped records of the window (the oldest first)
    cut_by_bytes: bool = False
    #: (partition, first, after): offsets skipped because the client cannot decode a record there
    unreadable: list[tuple[int, int, int]] = field(default_factory=list)

    @property
    def total(self) -> int:
        """Offsets in the topic (records, plus any transaction markers)."""
        return sum(p.end - p.begin for p in self.partitions)

    @property
    def older(self) -> int:
        return sum(p.older for p in self.partitions)

    @property
    def next_cursor(self) -> dict[int, int]:
        """The cursor of the next (older) page: each partition's first offset in this window,
        for the partitions that have older records."""
        return {p.partition: p.first for p in self.partitions if p.older}


def parse_cursor(raw: str, partitions: int, topic: str, option: str = "--before") -> dict[int, int]:
    """A window cursor - `P@O` entries, comma-separated, as `Window.next_cursor` writes them (a
    page's "older" link): read each named partition below offset O. Raises `BadSelector`."""
    out: dict[int, int] = {}
    for part in raw.split(","):
        if not part.strip():
            continue
        if len(out) >= partitions:
            raise BadSelector(f"{option} names more partitions than {topic} has ({partitions})", path=option,
                              hint="use the link of the page (one P@O per partition)")
        p, o = parse_ref(part, partitions, topic, option=option)
        if p in out:
            raise BadSelector(f"{option} names partition {p} twice", path=option, hint="one P@O per partition")
        out[p] = o
    return out


def _shares(room: Mapping[int, int], budget: int) -> dict[int, int]:
    """`budget` records spread over partitions with `room` offsets each: equal shares, and what a
    partition cannot use goes to the others (water-filling), so a window of a topic whose records
    sit in one partition is as deep as one whose records are spread."""
    shares = dict.fromkeys(room, 0)
    open_ = {p for p, r in room.items() if r > 0}
    while budget > 0 and open_:
        each = max(1, budget // len(open_))
        for p in sorted(open_):
            give = min(each, room[p] - shares[p], budget)
            shares[p] += give
            budget -= give
            if shares[p] >= room[p]:
                open_.discard(p)
            if budget <= 0:
                break
    return shares


async def read_window(bootstrap: str, topic: str, partitions: int, *, settings: Any = None,
                      before: Mapping[int, int] | None = None, max_records: int = 5000,
                      max_bytes: int = 16 << 20, timeout: float = 60.0) -> Window:
    """The newest records of `topic` below `before` (partition -> offset, a page's cursor: a partition
    it does not name is not read; None: below the end of each partition), at most `max_records` offsets read and at most `max_bytes` of keys, values and
    headers kept (the oldest are dropped first, by timestamp across partitions), whatever the
    topic holds. Why: the console's DLQ page read the whole topic for each view, and a producer
    flooding the DLQ made every view cost memory and time proportional to it (200k records:
    see docs/operations.md, "Console"). The `Window` says what it read of what is there, and the
    cursor of the next, older, page. A topic that does not exist reads as empty, uncreated."""
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    window = Window(topic)
    if not await topic_exists(bootstrap, topic, settings=settings):
        return window
    consumer = _consumer(bootstrap, settings, fetch_max_bytes=max(1 << 20, min(max_bytes, 16 << 20)))
    await consumer.start()
    try:
        consumer.assign(tps)
        begin = await consumer.beginning_offsets(tps)
        ends = await true_end_offsets(consumer, tps)
        # a cursor names every partition with older records (`Window.next_cursor`): one it leaves
        # out has none left, and is not read again from its end
        below = {tp: ends.get(tp, 0) if before is None else before.get(tp.partition, begin.get(tp, 0)) for tp in tps}
        upper = {tp: max(begin.get(tp, 0), min(ends.get(tp, 0), below[tp])) for tp in tps}
        shares = _shares({tp.partition: upper[tp] - begin.get(tp, 0) for tp in tps}, max_records)
        spans = {tp: (upper[tp] - shares[tp.partition], upper[tp]) for tp in tps}
        kept: dict[int, deque[Any]] = {tp.partition: deque() for tp in tps}
        held = 0

        def take(recs: list[Any]) -> None:
            nonlocal held
            for r in recs:
                kept[r.partition].append(r)
                held += record_bytes(r)
            while held > max_bytes:  # drop the oldest record kept (by time, then offset)
                q = min((q for q in kept.values() if q), key=lambda q: (q[0].timestamp or 0, q[0].offset))
                r = q.popleft()
                held -= record_bytes(r)
                cut_at[r.partition] = r.offset + 1

        cut_at: dict[int, int] = {}
        await _read_spans(consumer, topic, spans, timeout, take, window.unreadable)
        window.cut_by_bytes = bool(cut_at)
        for tp in tps:
            first = max(spans[tp][0], cut_at.get(tp.partition, 0))
            window.partitions.append(PartitionWindow(tp.partition, begin.get(tp, 0), ends.get(tp, 0), upper[tp],
                                                     first))
            window.records.extend(kept[tp.partition])
    finally:
        await consumer.stop()
    return window


async def topic_exists(bootstrap: str, topic: str, *, settings: Any = None) -> bool:
    """Whether `topic` exists, by listing (never describing: naming a missing topic in a Metadata
    request creates it on the embedded broker, and a dry run must not create anything)."""
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, **(settings.aiokafka_kwargs() if settings else {}))
    await admin.start()
    try:
        return topic in set(await admin.list_topics())
    finally:
        await admin.close()


# --------------------------------------------------------------------------- ledger


#: Bounds of the ledger's text fields (a forged entry cannot make a report or a page huge).
_MAX_TEXT = 512
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_MAX_REPLAYS = 1_000_000


class LedgerEntryError(ValueError):
    """A ledger record that is not a valid ledger entry (why, for the one warning)."""


@dataclass(frozen=True, slots=True)
class LedgerEntry:
    """One ledger record's value (JSON), keyed by the DLQ record's `PARTITION@OFFSET`.

    `state` is `done` once the replayed record is acknowledged, or `pending`: written (and
    acknowledged) *before* the send, naming where to look for it (`pending_from`, the target
    partition's end offset then) and what was sent (`sent_sha256`). A later run that finds a
    pending entry looks there instead of sending again (module docs, "Exactly one send")."""

    dlq_topic: str
    dlq_partition: int
    dlq_offset: int
    #: SHA-256 of the DLQ value: tells this record from another at the same offset of a recreated topic
    value_sha256: str
    source_topic: str
    source_partition: int
    source_offset: int | None
    replayed_partition: int
    #: -1 while `pending`
    replayed_offset: int
    replayed_at_ms: int
    by: str
    forced: bool
    #: how many times this DLQ record has been replayed, this one included
    replays: int
    v: int = LEDGER_VERSION
    state: str = "done"
    pending_from: int | None = None
    sent_sha256: str | None = None

    @property
    def key(self) -> str:
        return f"{self.dlq_partition}@{self.dlq_offset}"

    @property
    def pending(self) -> bool:
        return self.state == "pending"

    def encode(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def parse(cls, raw: bytes) -> LedgerEntry:
        """`raw` as a ledger entry, every field checked (type and bounds), or `LedgerEntryError`
        saying what is wrong. Whoever can write the ledger topic can write anything to it: a
        `"replays": "2"` used to crash `prism dlq replay`, a deeply nested value every replay."""
        from app.untrusted_json import loads_untrusted

        try:
            doc = loads_untrusted(raw, what="ledger entry", max_depth=2, max_bytes=16 * 1024)
        except ValueError as exc:  # JsonInputError: a PrismError too, whose message is enough here
            raise LedgerEntryError(f"not JSON: {getattr(exc, 'message', exc)}") from None
        if not isinstance(doc, dict):
            raise LedgerEntryError("not a JSON object")
        if doc.get("v") != LEDGER_VERSION:
            raise LedgerEntryError(f"version {str(doc.get('v'))[:20]!r}, not {LEDGER_VERSION}")
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(doc) - names)
        if unknown:
            raise LedgerEntryError(f"unknown field(s) {', '.join(u[:40] for u in unknown[:5])}")
        optional = {"source_offset", "v", "state", "pending_from", "sent_sha256"}
        missing = sorted(n for n in names - optional if n not in doc)
        if missing:
            raise LedgerEntryError(f"missing field(s) {', '.join(missing)}")

        def count(name: str, low: int = 0, high: int = _MAX_OFFSET, *, none_ok: bool = False) -> None:
            val = doc.get(name)
            if val is None and none_ok:
                return
            if type(val) is not int or not low <= val <= high:  # bool is not a count
                raise LedgerEntryError(f"{name} must be a whole number {low}..{high}, not {str(val)[:40]!r}")

        def text(name: str, *, none_ok: bool = False) -> None:
            val = doc.get(name)
            if val is None and none_ok:
                return
            if not isinstance(val, str) or not 0 < len(val) <= _MAX_TEXT or not val.isprintable():
                raise LedgerEntryError(f"{name} must be 1-{_MAX_TEXT} printable characters")

        for name in ("dlq_topic", "source_topic", "by"):
            text(name)
        for name in ("dlq_partition", "source_partition", "replayed_partition"):
            count(name, 0, 2**31 - 1)
        for name in ("dlq_offset", "replayed_at_ms"):
            count(name)
        count("source_offset", none_ok=True)
        count("replays", 1, _MAX_REPLAYS)
        if not isinstance(doc["forced"], bool):
            raise LedgerEntryError(f"forced must be true or false, not {str(doc['forced'])[:40]!r}")
        for name in ("value_sha256", "sent_sha256"):
            val = doc.get(name)
            if (val is not None or name == "value_sha256") and not (isinstance(val, str) and _HEX64.match(val)):
                raise LedgerEntryError(f"{name} must be 64 lower-case hex digits")
        state = doc.get("state", "done")
        if state == "done":
            count("replayed_offset")
        elif state == "pending":
            count("replayed_offset", -1, -1)
            count("pending_from")
            if doc.get("sent_sha256") is None:
                raise LedgerEntryError("a pending entry needs sent_sha256")
        else:
            raise LedgerEntryError(f"state must be done or pending, not {str(state)[:40]!r}")
        return cls(**doc)

    @classmethod
    def decode(cls, raw: bytes) -> LedgerEntry | None:
        """`parse`, or None for a record that is not a valid entry."""
        try:
            return cls.parse(raw)
        except LedgerEntryError:
            return None


def read_ledger(records: Sequence[Any], problems: list[str] | None = None) -> dict[str, LedgerEntry]:
    """DLQ `PARTITION@OFFSET` -> its latest ledger entry (a compacted topic: the last one wins).

    A record that is not a valid entry is skipped - it only means its DLQ record is not known as
    replayed - and, with `problems`, described there (offset, key, why) for one warning. A
    tombstone (no value) is skipped silently: compaction writes those."""
    out: dict[str, LedgerEntry] = {}
    for rec in records:
        if not rec.value:
            continue
        key = rec.key.decode(errors="replace")[:40] if rec.key is not None else None
        try:
            entry = LedgerEntry.parse(rec.value)
            if key != entry.key:
                raise LedgerEntryError(f"its key {key!r} is not the entry's {entry.key!r}")
        except LedgerEntryError as exc:
            if problems is not None:
                problems.append(f"offset {rec.offset} (key {key!r}): {exc}")
            continue
        out[entry.key] = entry
    return out


def ledger_warning(ledger_name: str, problems: Sequence[str]) -> str:
    """The one warning for a ledger's invalid records."""
    first = "; ".join(problems[:3]) + (f"; and {len(problems) - 3} more" if len(problems) > 3 else "")
    return (f"{len(problems)} record(s) of {ledger_name} are not valid ledger entries and were skipped ({first}); "
            "their DLQ records are treated as not replayed - find who writes to the ledger topic and restrict it "
            "(only `prism dlq replay` and the console should)")


def _operator() -> str:
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "?"
    return f"{user}@{socket.gethostname()}"


# --------------------------------------------------------------------------- plan and run


@dataclass(slots=True)
class Outcome:
    """What happened to one selected DLQ record."""

    dlq_topic: str
    dlq_partition: int
    dlq_offset: int
    reason: str
    action: Action
    #: for `skipped`: already_replayed | foreign_source | bad_coordinates | truncated |
    #: ref_refused | ref_unreadable | ref_mismatch | too_large | unconfirmed | pending_sent (dry run); for a
    #: forced replay: forced; for the send of an interrupted replay, found and recorded: recovered
    why: str = ""
    detail: str = ""
    target_topic: str = ""
    target_partition: int | None = None
    target_offset: int | None = None
    #: how often the ledger says this record was replayed before this run
    replays_before: int = 0
    #: a truncated copy's whole value is replayed from this reference (`prism.errors.value.ref`)
    value_ref: str = ""


@dataclass(slots=True)
class ReplayReport:
    dry_run: bool
    forced: bool
    outcomes: list[Outcome] = field(default_factory=list)
    #: selected and replayable, left for a later run by --limit
    limited: int = 0
    ledgers: dict[str, str] = field(default_factory=dict)
    #: one line per ledger that held records which are not valid entries (skipped)
    warnings: list[str] = field(default_factory=list)

    def count(self, action: Action) -> int:
        return sum(1 for o in self.outcomes if o.action == action)

    def skipped_by_why(self) -> Counter[str]:
        return Counter(o.why for o in self.outcomes if o.action == "skipped")

    def to_json(self) -> dict[str, Any]:
        return {"dry_run": self.dry_run, "forced": self.forced, "ledgers": self.ledgers,
                "replayed": self.count("replayed"), "would_replay": self.count("would_replay"),
                "skipped": dict(self.skipped_by_why()), "limited": self.limited,
                "warnings": self.warnings, "records": [asdict(o) for o in self.outcomes]}


def _header(rec: Any, name: str) -> bytes | None:
    for k, v in rec.headers or ():
        if k == name:
            return v
    return None


def classify(rec: Any, source: Source, ledger: dict[str, LedgerEntry], *, force: bool, unsent: bool = True) -> Outcome:
    """Whether one DLQ record of `source` may be replayed, and where to (module docs). `unsent`
    is for a `pending` ledger entry: whether its interrupted send is known not to have happened."""
    ctx = error_context(list(rec.headers or []))
    out = Outcome(rec.topic, rec.partition, rec.offset, ctx.get("reason", ""), "would_replay",
                  target_topic=source.topic)
    recorded = ctx.get("topic")
    if recorded != source.topic:
        stage = ctx.get("stage", "")
        kind = f"a dead letter of stage {stage} " if stage.startswith("sink:") else ""
        out.action, out.why = "skipped", "foreign_source"
        out.detail = (f"{kind}its headers name source topic {recorded!r}, but this is the DLQ of {source.topic!r}: "
                      "never replayed (a replay writes only to the topology's own source)")
        return out
    try:
        partition = int(ctx["partition"])
    except (KeyError, ValueError):
        partition = -1
    if not 0 <= partition < source.partitions:
        out.action, out.why = "skipped", "bad_coordinates"
        out.detail = (f"recorded partition {ctx.get('partition')!r} is not a partition of {source.topic} "
                      f"(0..{source.partitions - 1}): never replayed")
        return out
    out.target_partition = partition
    ref = _header(rec, VALUE_REF)
    cut_beyond_value = any(_header(rec, h) is not None for h in (HEADERS_TRUNCATED, KEY_SHA256))
    if cut_beyond_value or (_header(rec, VALUE_TRUNCATED) is not None and not ref):
        out.action, out.why = "skipped", "truncated"
        what = "its headers or key were cut too" if cut_beyond_value else "no whole copy was stored (dlq.overflow)"
        out.detail = (f"the DLQ copy was cut to fit the DLQ topic and {what}; the whole record is in {source.topic} "
                      f"partition {partition} offset {ctx.get('offset', '?')} (while its retention keeps it)")
        return out
    if ref:
        out.value_ref = ref.decode(errors="replace")
    done = ledger.get(f"{rec.partition}@{rec.offset}")
    if done is None or done.value_sha256 != hashlib.sha256(rec.value or b"").hexdigest():
        return out
    when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(done.replayed_at_ms / 1000))
    if done.pending:  # an interrupted replay; `_find_pending_sends` looked for its send (not found)
        return _after_interrupted(out, done, when, source, force, unsent)
    where = f"{done.replayed_partition}@{done.replayed_offset}"
    if not force:
        out.action, out.why = "skipped", "already_replayed"
        out.detail = (f"already replayed {when} by {done.by} to {source.topic} {where}"
                      f"{f' ({done.replays} times)' if done.replays > 1 else ''}; --force replays it again")
        return out
    out.why, out.detail = "forced", f"replayed again (--force); before: {when} by {done.by} to {where}"
    out.replays_before = done.replays
    return out


def _after_interrupted(out: Outcome, pending: LedgerEntry, when: str, source: Source, force: bool,
                       unsent: bool) -> Outcome:
    """A record whose ledger entry is still `pending`: its replay of `when` was interrupted after
    the entry was written. `unsent`: the target partition, read from where that replay would have
    put it, does not hold it (so it was never sent); else it could not be told (the range is gone)."""
    before = pending.replays - 1
    who = f"the replay of {when} by {pending.by}"
    if unsent and before == 0:
        out.detail = f"{who} was interrupted before its send"
        return out
    if unsent:
        if not force:
            out.action, out.why = "skipped", "already_replayed"
            out.detail = (f"replayed {before} time(s) before ({who} was interrupted before its send); "
                          "--force replays it again")
            return out
        out.why, out.detail, out.replays_before = "forced", f"replayed again (--force); {who} had not sent it", before
        return out
    if not force:
        out.action, out.why = "skipped", "unconfirmed"
        out.detail = (f"{who} was interrupted between recording and confirming its send, and {source.topic} partition "
                      f"{pending.replayed_partition} no longer holds offsets from {pending.pending_from} to tell whether "
                      f"it was sent; look for it on the outputs - --force sends it (again, if it was sent)")
        return out
    out.why, out.replays_before = "forced", pending.replays
    out.detail = f"replayed again (--force); {who} may have sent it already (unconfirmed)"
    return out


async def replay(topology: Topology, bootstrap: str, *, settings: Any = None, reason: str | None = None,
                 records: Sequence[str] = (), ranges: Sequence[str] = (), source: str | None = None,
                 limit: int = 0, dry_run: bool = False, force: bool = False,
                 console: Console | None = None, by: str | None = None) -> ReplayReport:
    """Replay the selected DLQ records of `topology` (module docs). Every selector is checked,
    and every selected DLQ topic read, before anything is written; a `--record` that is not in
    the DLQ is an error, not a silent no-op. `by`: who replays, for the ledger (default: the
    OS user at this host; the operator console passes its authenticated user)."""
    selection_given = bool(records or ranges)
    sources = choose_sources(topology, source, selection_given)
    suffix = topology.dlq.topic_suffix
    selections = {s.topic: parse_selection(records, ranges, s.partitions, s.topic + suffix) for s in sources}
    report = ReplayReport(dry_run=dry_run, forced=force)
    #: (ledger topic, done entry) of sends an interrupted replay made, confirmed by this run
    confirms: list[tuple[str, LedgerEntry]] = []
    plans: list[tuple[Source, str, list[tuple[Any, Outcome]]]] = []
    #: (dlq topic, partition, offset) -> the whole value read from a truncated copy's reference
    values: dict[tuple[str, int, int], bytes] = {}
    source_limits: WriteLimits | None = None
    left = limit or None
    #: reason -> count of the records the other selectors chose (`--reason` that matches none)
    reasons_seen: dict[str, int] = {}
    with Progress(console=console or Console(stderr=True, emoji=False), transient=True) as progress:
        for s in sources:
            dlq, ledger_name = s.topic + suffix, ledger_topic(s.topic + suffix)
            report.ledgers[dlq] = ledger_name
            task = progress.add_task(f"reading {dlq} and {ledger_name}", total=None)
            chosen = selections[s.topic]
            # chosen records and ranges are read where they are, not with the whole DLQ (the
            # console's Replay of one record read all of a flooded DLQ)
            dlq_records = await read_to_end(bootstrap, dlq, s.partitions, settings=settings) if chosen.everything \
                else await read_spans(bootstrap, dlq, s.partitions, [(p, o, o + 1) for p, o in chosen.records]
                                      + [(p, a, b + 1) for p, a, b in chosen.ranges], settings=settings)
            present = {(r.partition, r.offset) for r in dlq_records}
            missing = sorted(selections[s.topic].records - present)
            if missing:
                raise BadSelector(f"no record at {', '.join(f'{p}@{o}' for p, o in missing)} in {dlq}",
                                  path="--record", hint="deleted by retention, or beyond the end: list the records "
                                                        "with `prism dlq list`")
            for part, first, last in selections[s.topic].ranges:
                if not any(part == p and first <= o <= last for p, o in present):
                    raise BadSelector(f"no record in {part}@{first}-{last} of {dlq}", path="--range",
                                      hint="list the records with `prism dlq list`")
            # a missing ledger reads as empty; it is created only when there is something to write
            ledger_records = await read_to_end(bootstrap, ledger_name, 1, settings=settings)
            problems: list[str] = []
            ledger = read_ledger(ledger_records, problems)
            if problems:
                report.warnings.append(ledger_warning(ledger_name, problems))
            selected = []
            for rec in sorted(dlq_records, key=lambda r: (r.partition, r.offset)):
                if not selections[s.topic].matches(rec.partition, rec.offset):
                    continue
                rec_reason = error_context(list(rec.headers or [])).get("reason", "")
                reasons_seen[rec_reason] = reasons_seen.get(rec_reason, 0) + 1
                if reason is None or rec_reason == reason:
                    selected.append(rec)
            sent = await _find_pending_sends(bootstrap, settings, s, ledger, selected)
            progress.remove_task(task)
            chosen: list[tuple[Any, Outcome]] = []
            for rec in selected:
                ref_key = f"{rec.partition}@{rec.offset}"
                if isinstance(sent.get(ref_key), int):  # an interrupted replay did send it: record, never resend
                    outcome = _recovered(rec, s, ledger[ref_key], int(sent[ref_key]), dry_run)  # type: ignore[arg-type]
                    if not dry_run:
                        confirms.append((ledger_name, replace(ledger[ref_key], state="done", pending_from=None,
                                                              replayed_offset=int(sent[ref_key]))))  # type: ignore[arg-type]
                    report.outcomes.append(outcome)
                    continue
                outcome = classify(rec, s, ledger, force=force, unsent=ref_key in sent and sent[ref_key] is None)
                if outcome.value_ref and outcome.action != "skipped":
                    if source_limits is None:
                        source_limits = await _source_limits(topology, bootstrap, settings)
                    whole = await _resolve_ref(rec, outcome, topology, source_limits.limit_for(s.topic))
                    if whole is not None:
                        values[(rec.topic, rec.partition, rec.offset)] = whole
                if outcome.action != "skipped":
                    if left is not None and left <= 0:
                        report.limited += 1
                        continue
                    if left is not None:
                        left -= 1
                    chosen.append((rec, outcome))
                report.outcomes.append(outcome)
            plans.append((s, ledger_name, chosen))
    check_reason(reason, reasons_seen, [s.topic + suffix for s in sources])
    if dry_run or not (confirms or any(chosen for _, _, chosen in plans)):
        return report  # nothing to write: nothing is created either (not even the ledger topic)
    from app.broker.admin import ensure_topics

    names = sorted({name for name, _ in confirms} | {name for _, name, chosen in plans if chosen})
    await ensure_topics(bootstrap, dict.fromkeys(names, 1), settings=settings,
                        configs=dict.fromkeys(names, LEDGER_CONFIGS))
    # aiokafka's default max_request_size (1 MiB) would refuse a whole value read back by reference
    big = max((len(v) for v in values.values()), default=0)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all",
                                **({"max_request_size": big + 64 * 1024} if big > 960 * 1024 else {}),
                                **(settings.aiokafka_kwargs() if settings else {}))
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                                **(settings.aiokafka_kwargs() if settings else {}))
    await producer.start()
    try:
        if confirms:
            await asyncio.gather(*[await producer.send(name, e.encode(), key=e.key.encode(), partition=0)
                                   for name, e in confirms])
        await consumer.start()
        await asyncio.sleep(0)  # let its no-group task start: stopping it unstarted raises CancelledError
        for s, ledger_name, chosen in plans:
            for i in range(0, len(chosen), _CHUNK):
                await _replay_chunk(producer, consumer, s, ledger_name, chosen[i:i + _CHUNK], by=by, values=values)
    finally:
        await consumer.stop()
        await producer.stop()
    return report


def check_reason(reason: str | None, seen: Mapping[str, int], dlqs: Sequence[str]) -> None:
    """`--reason` that no selected DLQ record has, refused - by `prism dlq replay` and `prism dlq
    list` alike (one check, one message). A typo used to replay nothing ("would replay 0") or
    list nothing, exit 0, as if the DLQ held no such failure. `seen`: reason -> count of the
    records the command's other selectors chose (before --since / --limit, which select by time
    and count, not by what failed). The error names the reasons that do exist (most frequent
    first, each shortened: a reason is whatever the DLQ topic holds), or that there are none."""
    if reason is None or seen.get(reason, 0) > 0:
        return
    where = ", ".join(dlqs)
    if not seen:
        raise BadSelector(f"no DLQ record has reason {_short(reason)}: {where} has no records (to select)",
                          path="--reason", hint="drop --reason: nothing has been dead-lettered there (or retention "
                                                "deleted it); `prism dlq list` lists what there is")
    ranked = sorted(seen.items(), key=lambda kv: (-kv[1], kv[0]))
    shown = ", ".join(f"{_short(r) if r else '(none)'} ({n})" for r, n in ranked[:_MAX_REASONS])
    more = f" and {len(ranked) - _MAX_REASONS} more" if len(ranked) > _MAX_REASONS else ""
    raise BadSelector(f"no DLQ record has reason {_short(reason)}; the reasons in {where} are {shown}{more}",
                      path="--reason", hint="pass one of those reasons (`prism dlq list` shows each record's)")


#: how many existing reasons a `--reason` error lists, and how long each may be
_MAX_REASONS, _MAX_REASON_CHARS = 10, 60


def _short(text: str) -> str:
    return repr(text if len(text) <= _MAX_REASON_CHARS else text[:_MAX_REASON_CHARS] + "...")


async def _source_limits(topology: Topology, bootstrap: str, settings: Any) -> WriteLimits:
    """The source topics' size limits, as the worker computes them: its producer limit
    (`PRISM_MAX_REQUEST_BYTES`, else faust_app's default) and each topic's `max.message.bytes`."""
    from app.broker.admin import read_max_message_bytes
    from app.worker.faust_app import TUNED_SETTINGS

    max_request = max_request_from_env() or int(TUNED_SETTINGS["producer_max_request_size"])
    topics = [s.topic for s in topology.sources]
    values, why = await read_max_message_bytes(bootstrap, topics, settings=settings)
    return WriteLimits(max_request).with_broker(values, why)


async def _resolve_ref(rec: Any, outcome: Outcome, topology: Topology, limit: int) -> bytes | None:
    """The whole value a truncated copy's reference names, verified and checked against the source
    topic's `limit`; None (and `outcome` skipped with why) when it cannot be replayed."""
    from app.worker.dlq_overflow import OverflowStore, RefRefused, RefTooLarge, read_ref

    expected = (_header(rec, VALUE_SHA256) or b"").decode(errors="replace")
    cfg = topology.dlq.overflow
    try:
        configured = OverflowStore(cfg.path, writable=False) if cfg is not None else None
        whole = await asyncio.to_thread(read_ref, outcome.value_ref, expected, configured, max_bytes=limit)
    except RefRefused as exc:  # outside the configured store (or none is): never opened
        outcome.action, outcome.why = "skipped", "ref_refused"
        outcome.detail = f"{exc.message}: never replayed; fix: {exc.hint}"
        return None
    except RefTooLarge as exc:
        outcome.action, outcome.why = "skipped", "too_large"
        outcome.detail = (f"the whole value is over the {limit}-byte limit of {outcome.target_topic} "
                          f"({exc.message}): it would be refused again - raise the topic's max.message.bytes and PRISM_MAX_REQUEST_BYTES "
                          "first")
        return None
    except ValueError as exc:
        outcome.action, outcome.why, outcome.detail = "skipped", "ref_mismatch", f"{exc}: never replayed"
        return None
    except PrismError as exc:
        outcome.action, outcome.why = "skipped", "ref_unreadable"
        outcome.detail = f"the whole value could not be read from {outcome.value_ref}: {exc}"
        return None
    size = record_size(rec.key, whole, strip_error_headers(list(rec.headers or [])))
    if size > limit:
        outcome.action, outcome.why = "skipped", "too_large"
        outcome.detail = (f"the whole record ({size} bytes, value {len(whole)} bytes from {outcome.value_ref}) is "
                          f"over the {limit}-byte limit of {outcome.target_topic}: it would be refused again - raise "
                          "the topic's max.message.bytes and PRISM_MAX_REQUEST_BYTES first")
        return None
    note = f"whole value ({len(whole)} bytes) from {outcome.value_ref}, SHA-256 verified"
    outcome.detail = f"{outcome.detail}; {note}" if outcome.detail else note
    return whole


async def _replay_chunk(producer: AIOKafkaProducer, consumer: AIOKafkaConsumer, source: Source, ledger_name: str,
                        chunk: list[tuple[Any, Outcome]], *, by: str | None = None,
                        values: dict[tuple[str, int, int], bytes] | None = None) -> None:
    """Replay a chunk with exactly one send per record (module docs, "Exactly one send"):
    1. the target partitions' end offsets; 2. a `pending` ledger entry per record, naming that
    offset and the digest of what will be sent, acknowledged; 3. the sends, acknowledged;
    4. the `done` entries. `values`: the whole values of truncated copies, read by reference."""
    whole = values or {}
    by, now = by or _operator(), int(time.time() * 1000)
    targets = sorted({int(o.target_partition or 0) for _, o in chunk})
    ends = await true_end_offsets(consumer, [TopicPartition(source.topic, p) for p in targets])
    pendings: list[LedgerEntry] = []
    for rec, outcome in chunk:
        ctx = error_context(list(rec.headers or []))
        sent_value = whole.get((rec.topic, rec.partition, rec.offset), rec.value) or b""
        pendings.append(LedgerEntry(
            dlq_topic=rec.topic, dlq_partition=rec.partition, dlq_offset=rec.offset,
            value_sha256=hashlib.sha256(rec.value or b"").hexdigest(), source_topic=source.topic,
            source_partition=int(ctx["partition"]),
            source_offset=decimal(ctx.get("offset")),
            replayed_partition=int(outcome.target_partition or 0), replayed_offset=-1, replayed_at_ms=now, by=by,
            forced=outcome.why == "forced", replays=outcome.replays_before + 1, state="pending",
            pending_from=int(ends.get(TopicPartition(source.topic, int(outcome.target_partition or 0)), 0)),
            sent_sha256=hashlib.sha256(sent_value).hexdigest()))
    await asyncio.gather(*[await producer.send(ledger_name, e.encode(), key=e.key.encode(), partition=0)
                           for e in pendings])
    sends = [await producer.send(source.topic, whole.get((rec.topic, rec.partition, rec.offset), rec.value),
                                 key=rec.key, partition=outcome.target_partition,
                                 headers=strip_error_headers(list(rec.headers or [])), timestamp_ms=rec.timestamp)
             for rec, outcome in chunk]
    metas = await asyncio.gather(*sends)
    done = []
    for (_, outcome), meta, pending in zip(chunk, metas, pendings, strict=True):
        outcome.action, outcome.target_offset = "replayed", meta.offset
        entry = replace(pending, state="done", pending_from=None, replayed_partition=meta.partition,
                        replayed_offset=meta.offset)
        done.append(await producer.send(ledger_name, entry.encode(), key=entry.key.encode(), partition=0))
    await asyncio.gather(*done)


async def _find_pending_sends(bootstrap: str, settings: Any, source: Source, ledger: dict[str, LedgerEntry],
                              selected: Sequence[Any]) -> dict[str, int | str | None]:
    """For each selected DLQ record whose ledger entry is `pending` (its replay was interrupted):
    the source offset its send landed at, None when the target partition - read from the entry's
    `pending_from` to its end - does not hold it (never sent), or "unknown" when that range is no
    longer there to read. The send is recognized as the record it was: same key, same timestamp,
    value with the entry's `sent_sha256` (a replay adds no header: the attestation covers them)."""
    wanted: dict[str, tuple[Any, LedgerEntry]] = {}
    for rec in selected:
        entry = ledger.get(f"{rec.partition}@{rec.offset}")
        if entry is not None and entry.pending and entry.value_sha256 == hashlib.sha256(rec.value or b"").hexdigest():
            wanted[entry.key] = (rec, entry)
    if not wanted:
        return {}
    out: dict[str, int | str | None] = dict.fromkeys(wanted)
    by_part: dict[int, list[tuple[str, Any, LedgerEntry]]] = {}
    for key, (rec, entry) in wanted.items():
        by_part.setdefault(entry.replayed_partition, []).append((key, rec, entry))
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                                auto_offset_reset="earliest", **(settings.aiokafka_kwargs() if settings else {}))
    await consumer.start()
    try:
        tps = [TopicPartition(source.topic, p) for p in by_part]
        consumer.assign(tps)
        begins = await consumer.beginning_offsets(tps)
        ends = await true_end_offsets(consumer, tps)
        for tp in tps:
            items = by_part[tp.partition]
            start = min(e.pending_from or 0 for _, _, e in items)
            for key, _, entry in items:
                if (entry.pending_from or 0) < begins.get(tp, 0):
                    out[key] = "unknown"  # unless found below
            consumer.seek(tp, max(start, begins.get(tp, 0)))
            deadline = time.monotonic() + 120
            while await consumer.position(tp) < ends.get(tp, 0) and time.monotonic() < deadline:
                batch = await consumer.getmany(tp, timeout_ms=500, max_records=5000)
                for r in batch.get(tp, []):
                    for key, rec, entry in items:
                        if (r.offset >= (entry.pending_from or 0) and r.key == rec.key
                                and r.timestamp == rec.timestamp
                                and hashlib.sha256(r.value or b"").hexdigest() == entry.sent_sha256):
                            out[key] = r.offset
            if await consumer.position(tp) < ends.get(tp, 0):
                raise PrismError(f"could not read {source.topic} partition {tp.partition} to its end to check "
                                 "an interrupted replay", path=source.topic,
                                 hint="check the broker and the read permission on the source topic, then retry")
    finally:
        await consumer.stop()
    return out


def _recovered(rec: Any, source: Source, pending: LedgerEntry, offset: int, dry_run: bool) -> Outcome:
    """The outcome of a record an interrupted replay sent (found at `offset`): recorded, not resent."""
    when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(pending.replayed_at_ms / 1000))
    out = Outcome(rec.topic, rec.partition, rec.offset, error_context(list(rec.headers or [])).get("reason", ""),
                  "skipped" if dry_run else "replayed", why="pending_sent" if dry_run else "recovered",
                  target_topic=source.topic, target_partition=pending.replayed_partition, target_offset=offset)
    out.detail = (f"the interrupted replay of {when} by {pending.by} sent it (offset {offset}); "
                  + ("a replay records it, without sending it again" if dry_run else "recorded now, not sent again"))
    return out


# --------------------------------------------------------------------------- output


_MAX_LINES = 50


def print_report(report: ReplayReport, console: Console) -> None:
    """What was replayed (where to), what was skipped and why, and the totals. Plain text: record
    data is never read as markup."""

    def say(text: str) -> None:
        console.print(text, markup=False, highlight=False, soft_wrap=True)

    for dlq, ledger in report.ledgers.items():
        rows = [o for o in report.outcomes if o.dlq_topic == dlq]
        say(f"{dlq} -> {rows[0].target_topic if rows else dlq.rsplit('.', 1)[0]} (ledger {ledger})")
        for action in ("replayed", "would_replay", "skipped"):
            picked = [o for o in rows if o.action == action]
            for o in picked[:_MAX_LINES]:
                ref = f"{o.dlq_partition}@{o.dlq_offset}"
                label = action.replace("_", " ")
                if action == "skipped":
                    say(f"  {label:<12} {ref:<10} {o.why}: {o.detail}")
                else:
                    to = f"{o.target_topic} partition {o.target_partition}"
                    to += f" offset {o.target_offset}" if o.target_offset is not None else ""
                    say(f"  {label:<12} {ref:<10} {o.reason or '?'} -> {to}" + (f"; {o.detail}" if o.detail else ""))
            if len(picked) > _MAX_LINES:
                say(f"  ... and {len(picked) - _MAX_LINES} more {action.replace('_', ' ')} (--json lists all)")
    for warning in report.warnings:
        say(f"warning: {warning}")
    skipped = report.skipped_by_why()
    verb = "would replay" if report.dry_run else "replayed"
    n = report.count("would_replay" if report.dry_run else "replayed")
    forced = sum(1 for o in report.outcomes if o.why == "forced")
    line = f"{verb} {n} record(s)" + (f" ({forced} again, forced)" if forced else "")
    if skipped:
        line += f"; skipped {sum(skipped.values())}: " + ", ".join(f"{k} {v}" for k, v in sorted(skipped.items()))
    if report.limited:
        line += f"; {report.limited} more left by --limit"
    say(line)

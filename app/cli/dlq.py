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
expired, so a DLQ record stays replayed for as long as the DLQ keeps it. The ledger entry is
written after the replayed record is acknowledged; a crash in between leaves a record replayed
but not recorded (a later replay sends it again, and dedup on its partition absorbs it while its
id is in the window).

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
default) - or it is skipped as `too_large` with both sizes: replaying it could only fail again.
"""

from __future__ import annotations

import asyncio
import getpass
import hashlib
import json
import re
import socket
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
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
from app.errors import ConfigError, PrismError
from app.topology import Source, Topology
from app.worker.limits import WriteLimits, max_request_from_env, record_size

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


async def read_to_end(bootstrap: str, topic: str, partitions: int, *, settings: Any = None,
                      timeout: float = 120.0) -> list[Any]:
    """Every record of `topic`, read up to the end offsets taken at the start.

    Why not "until quiet": a ledger read short by one entry replays that record again, so this
    reads to the true end (corrected for the embedded broker, app/worker/offsets.py) and raises
    rather than returning a partial read."""
    from app.worker.offsets import true_end_offsets

    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None, auto_offset_reset="earliest",
                                enable_auto_commit=False, **(settings.aiokafka_kwargs() if settings else {}))
    await consumer.start()
    out: list[Any] = []
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await true_end_offsets(consumer, tps)
        pending = {tp for tp in tps if await consumer.position(tp) < ends.get(tp, 0)}
        deadline = time.monotonic() + timeout
        while pending:
            if time.monotonic() > deadline:
                where = ", ".join(f"partition {tp.partition} at {await consumer.position(tp)} of {ends[tp]}"
                                  for tp in sorted(pending))
                raise PrismError(f"could not read {topic} to its end within {timeout:.0f} s ({where})",
                                 path=topic, hint="check the broker and the consumer's read permission, then retry")
            batch = await consumer.getmany(*pending, timeout_ms=500, max_records=5000)
            for recs in batch.values():
                out.extend(recs)
            pending = {tp for tp in pending if await consumer.position(tp) < ends[tp]}
    finally:
        await consumer.stop()
    return out


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


@dataclass(frozen=True, slots=True)
class LedgerEntry:
    """One ledger record's value (JSON), keyed by the DLQ record's `PARTITION@OFFSET`."""

    dlq_topic: str
    dlq_partition: int
    dlq_offset: int
    #: SHA-256 of the DLQ value: tells this record from another at the same offset of a recreated topic
    value_sha256: str
    source_topic: str
    source_partition: int
    source_offset: int | None
    replayed_partition: int
    replayed_offset: int
    replayed_at_ms: int
    by: str
    forced: bool
    #: how many times this DLQ record has been replayed, this one included
    replays: int
    v: int = LEDGER_VERSION

    @property
    def key(self) -> str:
        return f"{self.dlq_partition}@{self.dlq_offset}"

    def encode(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, raw: bytes) -> LedgerEntry | None:
        """None for anything that is not a ledger entry of this version (skipped, never fatal:
        an unreadable entry only means its record is not known as replayed)."""
        try:
            doc = json.loads(raw)
            return cls(**doc) if isinstance(doc, dict) and doc.get("v") == LEDGER_VERSION else None
        except (ValueError, TypeError):
            return None


def read_ledger(records: Sequence[Any]) -> dict[str, LedgerEntry]:
    """DLQ `PARTITION@OFFSET` -> its latest ledger entry (a compacted topic: the last one wins)."""
    out: dict[str, LedgerEntry] = {}
    for rec in records:
        entry = LedgerEntry.decode(rec.value) if rec.value else None
        if entry is not None and rec.key is not None and rec.key.decode(errors="replace") == entry.key:
            out[entry.key] = entry
    return out


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
    #: ref_unreadable | ref_mismatch | too_large; for a forced replay: forced
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

    def count(self, action: Action) -> int:
        return sum(1 for o in self.outcomes if o.action == action)

    def skipped_by_why(self) -> Counter[str]:
        return Counter(o.why for o in self.outcomes if o.action == "skipped")

    def to_json(self) -> dict[str, Any]:
        return {"dry_run": self.dry_run, "forced": self.forced, "ledgers": self.ledgers,
                "replayed": self.count("replayed"), "would_replay": self.count("would_replay"),
                "skipped": dict(self.skipped_by_why()), "limited": self.limited,
                "records": [asdict(o) for o in self.outcomes]}


def _header(rec: Any, name: str) -> bytes | None:
    for k, v in rec.headers or ():
        if k == name:
            return v
    return None


def classify(rec: Any, source: Source, ledger: dict[str, LedgerEntry], *, force: bool) -> Outcome:
    """Whether one DLQ record of `source` may be replayed, and where to (module docs)."""
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
    if done is not None and done.value_sha256 == hashlib.sha256(rec.value or b"").hexdigest():
        when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(done.replayed_at_ms / 1000))
        where = f"{done.replayed_partition}@{done.replayed_offset}"
        if not force:
            out.action, out.why = "skipped", "already_replayed"
            out.detail = (f"already replayed {when} by {done.by} to {source.topic} {where}"
                          f"{f' ({done.replays} times)' if done.replays > 1 else ''}; --force replays it again")
            return out
        out.why, out.detail = "forced", f"replayed again (--force); before: {when} by {done.by} to {where}"
        out.replays_before = done.replays
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
    plans: list[tuple[Source, str, list[tuple[Any, Outcome]]]] = []
    #: (dlq topic, partition, offset) -> the whole value read from a truncated copy's reference
    values: dict[tuple[str, int, int], bytes] = {}
    source_limits: WriteLimits | None = None
    left = limit or None
    with Progress(console=console or Console(stderr=True), transient=True) as progress:
        for s in sources:
            dlq, ledger_name = s.topic + suffix, ledger_topic(s.topic + suffix)
            report.ledgers[dlq] = ledger_name
            task = progress.add_task(f"reading {dlq} and {ledger_name}", total=None)
            dlq_records = await read_to_end(bootstrap, dlq, s.partitions, settings=settings)
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
            if dry_run and not await topic_exists(bootstrap, ledger_name, settings=settings):
                ledger_records: list[Any] = []
            else:
                if not dry_run:
                    from app.broker.admin import ensure_topics

                    await ensure_topics(bootstrap, {ledger_name: 1}, settings=settings,
                                        configs={ledger_name: LEDGER_CONFIGS})
                ledger_records = await read_to_end(bootstrap, ledger_name, 1, settings=settings)
            ledger = read_ledger(ledger_records)
            progress.remove_task(task)
            chosen: list[tuple[Any, Outcome]] = []
            for rec in sorted(dlq_records, key=lambda r: (r.partition, r.offset)):
                if not selections[s.topic].matches(rec.partition, rec.offset):
                    continue
                if reason is not None and error_context(list(rec.headers or [])).get("reason") != reason:
                    continue
                outcome = classify(rec, s, ledger, force=force)
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
    if dry_run:
        return report
    # aiokafka's default max_request_size (1 MiB) would refuse a whole value read back by reference
    big = max((len(v) for v in values.values()), default=0)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all",
                                **({"max_request_size": big + 64 * 1024} if big > 960 * 1024 else {}),
                                **(settings.aiokafka_kwargs() if settings else {}))
    await producer.start()
    try:
        for s, ledger_name, chosen in plans:
            for i in range(0, len(chosen), _CHUNK):
                await _replay_chunk(producer, s, ledger_name, chosen[i:i + _CHUNK], force=force, by=by,
                                    values=values)
    finally:
        await producer.stop()
    return report


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
    from app.worker.dlq_overflow import OverflowStore, read_ref

    expected = (_header(rec, VALUE_SHA256) or b"").decode(errors="replace")
    cfg = topology.dlq.overflow
    try:
        configured = OverflowStore(cfg.path) if cfg is not None else None
        whole = await asyncio.to_thread(read_ref, outcome.value_ref, expected, configured)
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


async def _replay_chunk(producer: AIOKafkaProducer, source: Source, ledger_name: str,
                        chunk: list[tuple[Any, Outcome]], *, force: bool, by: str | None = None,
                        values: dict[tuple[str, int, int], bytes] | None = None) -> None:
    """Send a chunk of replays, then - once every one is acknowledged - their ledger entries.
    `values`: the whole values of truncated copies, read back from their references."""
    whole = values or {}
    sends = [await producer.send(source.topic, whole.get((rec.topic, rec.partition, rec.offset), rec.value),
                                 key=rec.key, partition=outcome.target_partition,
                                 headers=strip_error_headers(list(rec.headers or [])), timestamp_ms=rec.timestamp)
             for rec, outcome in chunk]
    metas = await asyncio.gather(*sends)
    by, now = by or _operator(), int(time.time() * 1000)
    entries = []
    for (rec, outcome), meta in zip(chunk, metas, strict=True):
        outcome.action, outcome.target_offset = "replayed", meta.offset
        ctx = error_context(list(rec.headers or []))
        entry = LedgerEntry(dlq_topic=rec.topic, dlq_partition=rec.partition, dlq_offset=rec.offset,
                            value_sha256=hashlib.sha256(rec.value or b"").hexdigest(), source_topic=source.topic,
                            source_partition=int(ctx["partition"]),
                            source_offset=int(ctx["offset"]) if ctx.get("offset", "").isdigit() else None,
                            replayed_partition=meta.partition, replayed_offset=meta.offset, replayed_at_ms=now,
                            by=by, forced=outcome.why == "forced",
                            replays=outcome.replays_before + 1)
        entries.append(await producer.send(ledger_name, entry.encode(), key=entry.key.encode(), partition=0))
    await asyncio.gather(*entries)


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

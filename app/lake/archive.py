"""The archive sink: envelope bytes from the pipeline's archive tap -> rolling Parquet files.

Layout under the archive root (a local directory or an object-store URL, see `app.lake.storage`)::

    date=2026-11-21/namespace=orders/topic=orders.created/
        <writer>~<seq>~<source topic>~p<partition>~o<first>-<last>.parquet
    _manifest/<writer>/<seq>.json            a committed roll (the commit point)
    _manifest/<writer>/<seq>.pending.json    a roll in progress (its intent)

Exactly-once without a transactional broker (the embedded broker has no transactions,
docs/platform-notes.md): a *roll* writes every buffered record and is committed by ONE atomic
write, its manifest. The order is intent -> data files -> manifest -> drop the intent:

* crash before the manifest: the roll never happened. Its data files are named in the
  intent and deleted at restart; its records were not acknowledged, so the consumer
  (seeking to `committed_offsets()` + 1) delivers them again -> nothing lost;
* crash after the manifest: the roll is durable; the restart only drops the stale intent,
  and records at or below the committed offsets are skipped -> nothing written twice.

Every manifest also carries its writer's cumulative committed offsets, so a restart reads one
manifest per writer, not the whole history. The compaction job reads the same manifests
(never a directory listing), so an uncommitted file is never compacted even before cleanup.
File names repeat the source offset range so that a human (or a repair tool) can tell what a
file holds without opening it.

Why one file per (output partition, source partition) in a roll: the name can then carry one
contiguous offset range. Several sinks (one per worker) may share a root; each needs its own
stable `writer_id`, which also keys the compaction job's Delta app transaction.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import logging
import re
import time
from collections.abc import AsyncIterable, Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any
from urllib.parse import quote, unquote

import pyarrow as pa
import pyarrow.parquet as pq

from app.decimal_text import decimal
from app.envelope import decode, detect_layout, encode
from app.errors import ArchiveError, EnvelopeError
from app.lake.storage import Store, temp_leftovers

log = logging.getLogger(__name__)

MANIFEST_DIR = "_manifest"
MANIFEST_FORMAT = 1
HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"
_WRITER_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_NAME_RE = re.compile(r"(?P<writer>[^~]+)~(?P<seq>\d{12})~(?P<src>[^~]+)~p(?P<part>\d+)~o(?P<first>\d+)-(?P<last>\d+)\.parquet")
_EPOCH = dt.date(1970, 1, 1)
_DAY_MS = 86_400_000

#: Columns of every archive file. `header_error` is set only for bytes the sink could not
#: decode; they are archived anyway (never lose a record) and quarantined by the compactor.
ARCHIVE_SCHEMA = pa.schema([
    pa.field("envelope", pa.binary(), nullable=False),
    pa.field("message_id", pa.string()),
    pa.field("namespace", pa.string()),
    pa.field("topic", pa.string()),
    pa.field("published_at_ms", pa.int64()),
    pa.field("date", pa.date32(), nullable=False),
    pa.field("source_topic", pa.string(), nullable=False),
    pa.field("source_partition", pa.int32(), nullable=False),
    pa.field("source_offset", pa.int64(), nullable=False),
    pa.field("header_error", pa.string()),
])


@dataclass(frozen=True, slots=True)
class ArchiveRecord:
    """One record from the archive tap: envelope bytes plus where they came from."""

    envelope_bytes: bytes
    source_topic: str
    partition: int
    offset: int


@dataclass(frozen=True, slots=True)
class ArchiveFile:
    """One data file of a committed roll (a manifest entry)."""

    path: str
    rows: int
    bytes: int
    source_topic: str
    partition: int
    first_offset: int
    last_offset: int
    date: str
    namespace: str | None
    topic: str | None


@dataclass(frozen=True, slots=True)
class Manifest:
    """A committed roll: its files and the writer's cumulative committed offsets."""

    writer: str
    seq: int
    created_at_ms: int
    files: tuple[ArchiveFile, ...]
    offsets: dict[tuple[str, int], int]

    def to_json(self) -> bytes:
        doc = {
            "format": MANIFEST_FORMAT,
            "writer": self.writer,
            "seq": self.seq,
            "created_at_ms": self.created_at_ms,
            "files": [asdict(f) for f in self.files],
            "offsets": [{"topic": t, "partition": p, "offset": o} for (t, p), o in sorted(self.offsets.items())],
        }
        return json.dumps(doc, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, data: bytes, where: str) -> Manifest:
        try:
            doc = json.loads(data)
            if doc.get("format") != MANIFEST_FORMAT:
                raise ArchiveError(f"manifest {where} has format {doc.get('format')!r}, expected {MANIFEST_FORMAT}",
                                   hint="compact it with the Prism version that wrote it")
            return cls(
                writer=doc["writer"],
                seq=int(doc["seq"]),
                created_at_ms=int(doc["created_at_ms"]),
                files=tuple(ArchiveFile(**f) for f in doc["files"]),
                offsets={(o["topic"], int(o["partition"])): int(o["offset"]) for o in doc["offsets"]},
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise ArchiveError(f"manifest {where} is not a valid Prism archive manifest: {exc}",
                               hint="restore it from backup; without it its files are never compacted") from exc


@dataclass(slots=True)
class ArchiveStats:
    """Counters since the sink was created."""

    records_written: int = 0
    skipped_already_committed: int = 0
    tokens_stripped: int = 0
    undecodable: int = 0
    rolls: int = 0
    files: int = 0
    bytes: int = 0
    orphans_removed: int = 0


# --------------------------------------------------------------------------- naming


def partition_dir(date: str, namespace: str | None, topic: str | None) -> str:
    """Hive-style `date=…/namespace=…/topic=…` with Spark-compatible %-escaping."""
    return f"date={date}/namespace={_escape(namespace)}/topic={_escape(topic)}"


def data_file_name(writer: str, seq: int, source_topic: str, partition: int, first: int, last: int) -> str:
    return f"{writer}~{seq:012d}~{_escape(source_topic)}~p{partition}~o{first}-{last}.parquet"


def parse_data_file_name(name: str) -> dict[str, Any] | None:
    """The writer, roll sequence, source topic/partition and offset range a file name carries."""
    m = _NAME_RE.fullmatch(name.rsplit("/", 1)[-1])
    if not m:
        return None
    return {"writer": m["writer"], "seq": int(m["seq"]), "source_topic": unquote(m["src"]),
            "partition": int(m["part"]), "first_offset": int(m["first"]), "last_offset": int(m["last"])}


def manifest_path(writer: str, seq: int, *, pending: bool = False) -> str:
    return f"{MANIFEST_DIR}/{writer}/{seq:012d}{'.pending' if pending else ''}.json"


def _escape(value: str | None) -> str:
    if not value:
        return HIVE_NULL
    return quote(value, safe="").replace("~", "%7E")


def _date_of(ms: int) -> dt.date:
    return _EPOCH + dt.timedelta(days=ms // _DAY_MS)


# --------------------------------------------------------------------------- reading an archive


class Archive:
    """Read side of an archive root: writers, manifests, committed offsets."""

    def __init__(self, location: str | Store) -> None:
        self.store = location if isinstance(location, Store) else Store(location)

    def writers(self) -> list[str]:
        return self.store.list_dirs(MANIFEST_DIR)

    def manifest_seqs(self, writer: str) -> tuple[list[int], list[int]]:
        """(committed seqs, pending seqs) of one writer, ascending."""
        committed, pending = [], []
        for f in self.store.list_files(f"{MANIFEST_DIR}/{writer}", recursive=False):
            name = f.path.rsplit("/", 1)[-1]
            stem, _, ext = name.partition(".")
            if decimal(stem) is None:  # not one of ours ("²" passes isdigit() and fails int())
                continue
            if ext == "json":
                committed.append(int(stem))
            elif ext == "pending.json":
                pending.append(int(stem))
        return sorted(committed), sorted(pending)

    def read_manifest(self, writer: str, seq: int) -> Manifest:
        rel = manifest_path(writer, seq)
        return Manifest.from_json(self.store.read(rel), rel)

    def manifests(self, writer: str, after: int | None = None) -> list[Manifest]:
        """Committed manifests of `writer` with seq > `after`, oldest first."""
        seqs = [s for s in self.manifest_seqs(writer)[0] if after is None or s > after]
        return [self.read_manifest(writer, s) for s in seqs]

    def last_manifest(self, writer: str) -> Manifest | None:
        committed, _ = self.manifest_seqs(writer)
        return self.read_manifest(writer, committed[-1]) if committed else None

    def committed_offsets(self) -> dict[tuple[str, int], int]:
        """Highest committed source offset per (topic, partition), over all writers."""
        out: dict[tuple[str, int], int] = {}
        for w in self.writers():
            m = self.last_manifest(w)
            if m is None:
                continue
            for tp, off in m.offsets.items():
                if off > out.get(tp, -1):
                    out[tp] = off
        return out


# --------------------------------------------------------------------------- the sink


@dataclass(slots=True)
class _Buffer:
    date: str
    namespace: str | None
    topic: str | None
    source_topic: str
    partition: int
    cols: dict[str, list[Any]] = field(default_factory=lambda: {f.name: [] for f in ARCHIVE_SCHEMA})
    first: int = -1
    last: int = -1


class ArchiveSink:
    """Writes `ArchiveRecord`s to rolling Parquet files with exactly-once offsets (module doc).

    Use it synchronously (`write(batch)`, `flush()`, `close()`) or hand `consume()` an async
    iterable. After each committed roll, `on_commit(manifest)` runs: that is when the worker
    may commit the consumer offsets (`offset + 1` of `committed_offsets()`).
    """

    def __init__(
        self,
        location: str | Store,
        *,
        writer_id: str = "default",
        max_file_bytes: int = 64 * 1024 * 1024,
        max_file_age_s: float = 60.0,
        compression: str = "zstd",
        on_commit: Callable[[Manifest], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        fault: Callable[[str], None] | None = None,
    ) -> None:
        if not _WRITER_RE.fullmatch(writer_id):
            raise ArchiveError(f"writer_id {writer_id!r} is not valid",
                               hint="use 1-64 characters from A-Z a-z 0-9 _ . - (e.g. the worker's name)")
        if max_file_bytes <= 0 or max_file_age_s <= 0:
            raise ArchiveError("max_file_bytes and max_file_age_s must be positive")
        self.archive = Archive(location)
        self.store = self.archive.store
        self.writer_id = writer_id
        self.max_file_bytes = max_file_bytes
        self.max_file_age_s = max_file_age_s
        self.compression = compression
        self.on_commit = on_commit
        self.stats = ArchiveStats()
        self._clock = clock
        #: Test hook: called with "files-written" between the data files and the manifest.
        self._fault = fault
        self._opened = False
        self._seq = 0
        self._own_offsets: dict[tuple[str, int], int] = {}
        self._committed: dict[tuple[str, int], int] = {}
        self._high: dict[tuple[str, int], int] = {}
        self._buffers: dict[tuple[str, str | None, str | None, str, int], _Buffer] = {}
        self._buffered_bytes = 0
        self._first_at: float | None = None
        self._tokens_in_roll = 0

    # -- lifecycle ---------------------------------------------------------------------------
    def open(self) -> None:
        """Recover: drop what an interrupted roll left and load the committed offsets."""
        if self._opened:
            return
        committed, pending = self.archive.manifest_seqs(self.writer_id)
        last = committed[-1] if committed else 0
        for seq in pending:
            self._discard_pending(seq, rolled_back=seq > last)
        own = self.archive.read_manifest(self.writer_id, last) if committed else None
        self._seq = last
        self._own_offsets = dict(own.offsets) if own else {}
        self._committed = self.archive.committed_offsets()
        self._high = dict(self._committed)
        self._opened = True

    def _discard_pending(self, seq: int, *, rolled_back: bool) -> None:
        rel = manifest_path(self.writer_id, seq, pending=True)
        if rolled_back:
            try:
                intent = json.loads(self.store.read(rel))
                paths = list(intent["files"])
            except (ArchiveError, ValueError, KeyError) as exc:
                raise ArchiveError(f"intent {rel} of an interrupted roll is unreadable: {exc}",
                                   hint="delete the files of that roll (named ~<seq>~) and the intent by hand") from exc
            for path in paths:
                for leftover in [path, *temp_leftovers(self.store, path)]:
                    if self.store.delete(leftover):
                        self.stats.orphans_removed += 1
            for leftover in temp_leftovers(self.store, manifest_path(self.writer_id, seq)):
                self.store.delete(leftover)  # a manifest whose atomic write never completed
            log.info("archive %s: rolled back interrupted roll %d (%d files)", self.writer_id, seq, len(paths))
        self.store.delete(rel)

    def close(self) -> None:
        """Commit what is buffered."""
        self.flush()

    def __enter__(self) -> ArchiveSink:
        self.open()
        return self

    def __exit__(self, exc_type: object, *_: object) -> None:
        if exc_type is None:
            self.close()

    # -- offsets ------------------------------------------------------------------------------
    def committed_offsets(self) -> dict[tuple[str, int], int]:
        """Highest durable source offset per (topic, partition); resume at offset + 1."""
        self.open()
        return dict(self._committed)

    @property
    def buffered_records(self) -> int:
        return sum(len(b.cols["envelope"]) for b in self._buffers.values())

    # -- writing ------------------------------------------------------------------------------
    def write(self, batch: Iterable[ArchiveRecord]) -> int:
        """Buffer a batch, rolling whenever the size limit is reached (and at the end if the
        time limit is); returns how many records were accepted."""
        n = 0
        for rec in batch:
            n += self.add((rec,))
            if self._buffered_bytes >= self.max_file_bytes:
                self.flush()
        self.maybe_roll()
        return n

    def add(self, batch: Iterable[ArchiveRecord]) -> int:
        """Buffer without rolling. Records at or below a known offset are skipped."""
        self.open()
        accepted = 0
        for rec in batch:
            tp = (rec.source_topic, rec.partition)
            if rec.offset <= self._high.get(tp, -1):
                self.stats.skipped_already_committed += 1
                continue
            self._high[tp] = rec.offset
            self._buffer(rec)
            accepted += 1
        return accepted

    def _buffer(self, rec: ArchiveRecord) -> None:
        data = rec.envelope_bytes
        msg_id = ns = topic = None
        published: int | None = None
        error: str | None = None
        try:
            env = decode(data)
            md = env.header.metadata
            msg_id, ns, topic, published = md.message_id or None, md.namespace or None, md.topic or None, md.published_at_ms
            sec = env.security
            if sec is not None and sec.HasField("auth_token"):
                # The tap should have stripped it; never let a token reach storage.
                layout = detect_layout(data)
                sec.ClearField("auth_token")
                data = encode(env, layout)
                self.stats.tokens_stripped += 1
                self._tokens_in_roll += 1
        except EnvelopeError as exc:
            error = f"{exc.code}: {exc}"
            self.stats.undecodable += 1
        date = _date_of(published) if published else dt.datetime.now(dt.UTC).date()
        key = (date.isoformat(), ns, topic, rec.source_topic, rec.partition)
        buf = self._buffers.get(key)
        if buf is None:
            buf = self._buffers[key] = _Buffer(*key)
            buf.first = rec.offset
        c = buf.cols
        c["envelope"].append(data)
        c["message_id"].append(msg_id)
        c["namespace"].append(ns)
        c["topic"].append(topic)
        c["published_at_ms"].append(published)
        c["date"].append(date)
        c["source_topic"].append(rec.source_topic)
        c["source_partition"].append(rec.partition)
        c["source_offset"].append(rec.offset)
        c["header_error"].append(error)
        buf.last = rec.offset
        self._buffered_bytes += len(data) + 96
        if self._first_at is None:
            self._first_at = self._clock()

    def roll_due(self) -> bool:
        if not self._buffers:
            return False
        if self._buffered_bytes >= self.max_file_bytes:
            return True
        return self._first_at is not None and self._clock() - self._first_at >= self.max_file_age_s

    def seconds_until_due(self) -> float | None:
        """Seconds until the time-based roll (None when nothing is buffered)."""
        if self._first_at is None:
            return None
        return max(0.0, self.max_file_age_s - (self._clock() - self._first_at))

    def maybe_roll(self) -> Manifest | None:
        return self.flush() if self.roll_due() else None

    def flush(self) -> Manifest | None:
        """Commit everything buffered as one roll; None when nothing was buffered."""
        self.open()
        if not self._buffers:
            return None
        seq = self._seq + 1
        buffers = list(self._buffers.values())
        planned = [(b, f"{partition_dir(b.date, b.namespace, b.topic)}/"
                       f"{data_file_name(self.writer_id, seq, b.source_topic, b.partition, b.first, b.last)}")
                   for b in buffers]
        intent = json.dumps({"writer": self.writer_id, "seq": seq, "files": [p for _, p in planned]}).encode()
        self.store.write_atomic(manifest_path(self.writer_id, seq, pending=True), intent)

        files: list[ArchiveFile] = []
        for buf, rel in planned:
            data = self._parquet_bytes(buf)
            self.store.write_atomic(rel, data)
            files.append(ArchiveFile(rel, len(buf.cols["envelope"]), len(data), buf.source_topic, buf.partition,
                                     buf.first, buf.last, buf.date, buf.namespace, buf.topic))
        if self._fault is not None:
            self._fault("files-written")

        offsets = dict(self._own_offsets)
        for f in files:
            tp = (f.source_topic, f.partition)
            offsets[tp] = max(offsets.get(tp, -1), f.last_offset)
        manifest = Manifest(self.writer_id, seq, int(time.time() * 1000), tuple(files), offsets)
        self.store.write_atomic(manifest_path(self.writer_id, seq), manifest.to_json())
        # Committed. Everything below only tidies up or reports.
        self.store.delete(manifest_path(self.writer_id, seq, pending=True))
        self._seq = seq
        self._own_offsets = offsets
        for tp, off in offsets.items():
            if off > self._committed.get(tp, -1):
                self._committed[tp] = off
        self.stats.rolls += 1
        self.stats.files += len(files)
        self.stats.records_written += sum(f.rows for f in files)
        self.stats.bytes += sum(f.bytes for f in files)
        self._buffers.clear()
        self._buffered_bytes = 0
        self._first_at = None
        if self._tokens_in_roll:
            log.warning("archive %s: stripped %d auth token(s) the archive tap let through (roll %d)",
                        self.writer_id, self._tokens_in_roll, seq)
            self._tokens_in_roll = 0
        if self.on_commit is not None:
            self.on_commit(manifest)
        return manifest

    def _parquet_bytes(self, buf: _Buffer) -> bytes:
        table = pa.Table.from_pydict(buf.cols, schema=ARCHIVE_SCHEMA)
        out = pa.BufferOutputStream()
        pq.write_table(table, out, compression=self.compression)
        return out.getvalue().to_pybytes()

    # -- async ----------------------------------------------------------------------------------
    async def consume(self, source: AsyncIterable[ArchiveRecord | Sequence[ArchiveRecord]]) -> None:
        """Archive everything `source` yields (records or batches), rolling by size and time.

        File I/O runs in a worker thread so the event loop keeps serving the consumer.
        """
        await asyncio.to_thread(self.open)
        it = source.__aiter__()
        pending: asyncio.Future[Any] | None = None
        try:
            while True:
                if pending is None:
                    pending = asyncio.ensure_future(it.__anext__())
                done, _ = await asyncio.wait({pending}, timeout=self.seconds_until_due())
                if not done:  # idle: the time-based roll is due
                    await asyncio.to_thread(self.flush)
                    continue
                fut, pending = pending, None
                try:
                    item = fut.result()
                except StopAsyncIteration:
                    break
                self.add([item] if isinstance(item, ArchiveRecord) else item)
                if self.roll_due():
                    await asyncio.to_thread(self.flush)
        finally:
            if pending is not None:
                pending.cancel()
        await asyncio.to_thread(self.flush)


def read_archive_file(store: Store, rel: str) -> pa.Table:
    """Read one archive data file completely (all or nothing), checking its columns."""
    try:
        with store.fs.open_input_file(store.full(rel)) as f:
            table = pq.read_table(f)
    except FileNotFoundError as exc:
        raise ArchiveError(f"archive file {rel!r} is missing", hint="restore it or remove its manifest entry") from exc
    except (OSError, pa.ArrowException) as exc:
        raise ArchiveError(f"archive file {rel!r} is not readable Parquet: {exc}") from exc
    missing = [n for n in ("envelope", "source_topic", "source_partition", "source_offset") if n not in table.column_names]
    if missing:
        raise ArchiveError(f"archive file {rel!r} lacks column(s) {missing}",
                           hint="only files written by app.lake.archive.ArchiveSink can be compacted")
    return table


__all__ = [
    "ARCHIVE_SCHEMA",
    "Archive",
    "ArchiveFile",
    "ArchiveRecord",
    "ArchiveSink",
    "ArchiveStats",
    "Manifest",
    "data_file_name",
    "parse_data_file_name",
    "partition_dir",
    "read_archive_file",
]

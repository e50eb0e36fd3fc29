"""The sink contract: what a Kafka Connect-style sink connector does, and nothing more.

A sink takes decoded records from a topology output topic (`<source>.v3` by default) and
writes them to one backend. The contract every sink keeps:

* **Explicit lifecycle.** `start()` connects and prepares the backend (table, stream,
  bucket); `stop()` closes; `healthy()` is a cheap liveness probe. A sink whose backend is
  down at start-up is not broken: every write re-opens what a failure closed, so a worker
  never has to restart because a backend restarted.
* **Idempotent writes.** `write_batch(records)` may be called again with records it already
  wrote (at-least-once delivery replays after a crash, a rebalance, a timeout whose write
  did land). Each backend turns the envelope's `message_id` into a server-side uniqueness
  rule, so a replay never produces a second copy (see each module, and docs/sinks.md).
* **Byte-exact envelopes.** Records carry the exact bytes read from Kafka (`raw`), which the
  worker signed. Backends that store bytes store these, never a re-encoding, so signatures
  still verify downstream.
* **Two phases.** `encode(record)` is pure and raises a `PrismError` for a record this
  backend can never hold (a poison message: it goes to the DLQ at once, whatever the outage
  policy); `write_encoded(items)` does the I/O and raises `SinkError` (transient) for
  anything the backend did, so the delivery loop (`app.sinks.delivery`) can retry it.
* **Backend size limits.** `size_problem(item)` says (`SizeLimitError`, reason `too_large`)
  when an encoded item is over what the backend accepts - NATS's `max_payload` as the server
  announced it, Redis's `proto-max-bulk-len`, PostgreSQL's jsonb maximum; S3 has no practical
  one. Such a record could never be written: it goes to the DLQ at once instead of failing -
  and under `on_outage: wait` holding - the batch forever.
"""

from __future__ import annotations

import abc
import asyncio
import logging
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, Generic, TypeVar
from urllib.parse import urlsplit, urlunsplit

from app.envelope.codec import Layout, decode, detect_layout
from app.envelope.model import Envelope
from app.errors import PrismError, SinkError, SizeLimitError

log = logging.getLogger("prism.sinks")

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class SinkRecord:
    """One envelope as read from a Kafka topic: decoded header, exact bytes, and where it came
    from (what the DLQ reports and what offsets the consumer commits)."""

    envelope: Envelope
    raw: bytes
    topic: str
    partition: int
    offset: int
    layout: Layout
    key: bytes | None = None
    headers: tuple[tuple[str, bytes], ...] = ()
    timestamp_ms: int | None = None

    @classmethod
    def from_bytes(cls, raw: bytes, *, topic: str = "", partition: int = 0, offset: int = 0,
                   key: bytes | None = None, headers: Sequence[tuple[str, bytes]] = (),
                   timestamp_ms: int | None = None) -> SinkRecord:
        """Decode `raw` (header-only: the payload stays a lazy view) and keep the bytes.

        Raises the codec's `EnvelopeError` subclasses for bytes that are not an envelope."""
        layout = detect_layout(raw)
        return cls(decode(raw, layout=layout), bytes(raw), topic, partition, offset, layout, key,
                   tuple(headers), timestamp_ms)

    @property
    def message_id(self) -> str:
        return self.envelope.message_id


@dataclass
class SinkStats:
    """What a sink did. The runner reports these; tests and the benchmark read them."""

    received: int = 0         # records handed to the sink
    written: int = 0          # records the backend now holds because of this sink
    duplicates: int = 0       # records the backend already had (replays), not written again
    rejected: int = 0         # poison records (encode failed) sent to the DLQ
    dlq: int = 0              # records sent to the DLQ (poison + outage policy `dlq`)
    batches: int = 0          # successful write_encoded calls
    failed_attempts: int = 0  # write attempts that raised
    outages: int = 0          # times the backend went from working to failing
    aborted: int = 0          # batches abandoned unwritten at shutdown/rebalance (redelivered later)
    in_outage: bool = False
    last_error: str = ""
    write_seconds: float = 0.0

    def as_dict(self) -> dict[str, object]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


@dataclass(frozen=True, slots=True)
class WriteOutcome:
    """How many items were new to the backend and how many it already had."""

    written: int
    duplicates: int = 0


class Sink(abc.ABC, Generic[T]):
    """Base class of every sink. Subclasses implement `encode`, `_open`, `_write`, `_close`
    and `_ping`; this class adds timeouts, reconnect-after-failure and error wrapping, so
    every backend fails the same way (`SinkError`, transient, no secrets in the text)."""

    kind: ClassVar[str]

    def __init__(self, name: str, *, timeout_s: float = 10.0, secrets: Sequence[str] = ()) -> None:
        self.name = name
        self.timeout_s = timeout_s
        self.stats = SinkStats()
        self._secrets = [s for s in secrets if s]
        self._open_done = False
        self._lock = asyncio.Lock()

    # -- what subclasses implement ---------------------------------------------------------
    @abc.abstractmethod
    def encode(self, record: SinkRecord) -> T:
        """Pure: the backend form of one record. Raise a `PrismError` when the backend can
        never hold it (poison message)."""

    @abc.abstractmethod
    async def _open(self) -> None:
        """Connect and prepare the backend (idempotent: runs again after every failure)."""

    @abc.abstractmethod
    async def _write(self, items: Sequence[T]) -> WriteOutcome:
        """Write every item, idempotently, before returning."""

    @abc.abstractmethod
    async def _close(self) -> None:
        """Release connections. Must not raise."""

    @abc.abstractmethod
    async def _ping(self) -> None:
        """Raise when the backend does not answer."""

    # -- size limits (module docs) -----------------------------------------------------------
    def max_item_bytes(self) -> int | None:
        """The largest item (`item_size`) the backend accepts; None: no practical limit or not known."""
        return None

    def item_size(self, item: T) -> int:
        """The bytes of `item` the backend compares with `max_item_bytes`."""
        return 0

    #: where `max_item_bytes` comes from, for the DLQ reason
    limit_source: ClassVar[str] = ""

    def size_problem(self, item: T) -> PrismError | None:
        """A `SizeLimitError` when `item` is over the backend's limit, else None."""
        limit = self.max_item_bytes()
        if limit is None:
            return None
        size = self.item_size(item)
        if size <= limit:
            return None
        return SizeLimitError(f"{self.kind} sink {self.name!r}: the record is {size} bytes, over the backend's "
                              f"{limit}-byte limit ({self.limit_source})", path=f"sinks.{self.name}",
                              hint="raise the backend's limit (and the sink's setting), or have producers send "
                                   "smaller messages; the record is in the DLQ")

    async def refresh_limits(self) -> None:
        """Learn limits the backend announces on connect (NATS); a no-op for configured ones."""

    # -- lifecycle -------------------------------------------------------------------------
    async def start(self) -> None:
        """Connect and prepare the backend. Raises `SinkError` when it is unreachable; the
        sink stays usable and connects again on the next write."""
        async with self._lock:
            await self._ensure_open()

    async def stop(self) -> None:
        async with self._lock:
            self._open_done = False
            await self._close()

    async def healthy(self) -> bool:
        """True when the backend answers a ping within the timeout."""
        try:
            async with self._lock:
                await self._ensure_open()
                await asyncio.wait_for(self._ping(), min(self.timeout_s, 2.0))
        except Exception:
            return False
        return True

    # -- writing ---------------------------------------------------------------------------
    async def write_batch(self, records: Sequence[SinkRecord]) -> None:
        """Encode and write `records`; idempotent. Raises the `PrismError` of the first poison
        record, or `SinkError` when the backend failed (nothing or part of the batch may have
        landed; writing the batch again is always safe)."""
        self.stats.received += len(records)
        await self.write_encoded([self.encode(r) for r in records])

    async def write_encoded(self, items: Sequence[T]) -> WriteOutcome:
        """Write already-encoded items (the delivery loop encodes once, retries this)."""
        if not items:
            return WriteOutcome(0)
        async with self._lock:
            started = time.perf_counter()
            try:
                await self._ensure_open()
                outcome = await asyncio.wait_for(self._write(items), self.timeout_s)
            except SinkError:
                await self._reset()
                raise
            except Exception as exc:
                await self._reset()
                raise self.error(f"writing {len(items)} record(s) failed", exc) from exc
            self.stats.write_seconds += time.perf_counter() - started
            self.stats.batches += 1
            self.stats.written += outcome.written
            self.stats.duplicates += outcome.duplicates
            return outcome

    # -- helpers for subclasses ------------------------------------------------------------
    def error(self, what: str, exc: BaseException | None = None, *, hint: str | None = None) -> SinkError:
        """A `SinkError` naming this sink and the backend's reason, with secrets removed."""
        reason = f": {type(exc).__name__}: {exc}" if exc is not None else ""
        text = self.scrub(f"{self.kind} sink {self.name!r}: {what}{reason}")
        if len(text) > 500:
            text = text[:500] + "..."
        return SinkError(text, path=f"sinks.{self.name}",
                         hint=hint or f"check that the {self.kind} backend is up and reachable; writes are retried")

    def scrub(self, text: str) -> str:
        for s in self._secrets:
            text = text.replace(s, "***")
        return text

    async def _ensure_open(self) -> None:
        if self._open_done:
            return
        try:
            await asyncio.wait_for(self._open(), self.timeout_s)
        except SinkError:
            await self._close()
            raise
        except Exception as exc:
            await self._close()
            raise self.error("cannot connect or prepare the backend", exc) from exc
        self._open_done = True

    async def _reset(self) -> None:
        """After a failure, drop connections so the next attempt starts clean (a half-broken
        connection after a server restart is the usual cause of a second failure)."""
        self._open_done = False
        await self._close()


def url_secrets(url: str | None) -> list[str]:
    """The password in a URL/DSN, so error messages can mask it."""
    if not url:
        return []
    try:
        parts = urlsplit(url)
    except ValueError:
        return []
    return [parts.password] if parts.password else []


#: a libpq keyword/value connection string's password (`host=db password=secret`, quoted or not)
_CONNINFO_PASSWORD = re.compile(r"(?i)(\bpassword\s*=\s*)('(?:[^'\\]|\\.)*'|[^\s']\S*)")


def redact_credentials(text: str) -> str:
    """`text` (a URL, a DSN, any configured string) with a password in it replaced: a URL's
    (``redis://:pw@host``, ``postgresql://u:pw@host``) and a libpq keyword string's
    (``password=pw``). For what is shown or served, not only what is logged."""
    if "://" in text:
        try:
            urlsplit(text)
        except ValueError:
            pass  # not a URL: shown as it is (redact_url would replace it whole)
        else:
            text = redact_url(text)
    if "=" in text and "password" in text.lower():
        text = _CONNINFO_PASSWORD.sub(lambda m: f"{m.group(1)}***", text)
    return text


def redact_url(url: str) -> str:
    """`url` with its password replaced, for logs and reports."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparseable url>"
    if not parts.password:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


"""Migration tooling for RFC-031 "Migration Path from Current Systems", phases 1-3.

* **Phase 1, dual-write** - `DualWriter` publishes every message twice: the legacy Redis
  shape `{"meta": {...}, "payload": ...}` for consumers not migrated yet, and the Prism
  envelope through a `PrismClient`. Both carry the same message id, so a consumer that reads
  both can de-duplicate.
* **Phase 2, dual-read** - `is_prism_envelope(data)` and `read_any(data)` let one consumer
  read either shape (detection by `app.formats.detect`, the same rules the pipeline uses).
* **Phase 3, cutover** - `Migration` / `migrate()` move a live Redis stream to Kafka (or
  NATS/PostgreSQL) with no loss and no duplicates: catch up, switch producers, drain.

How `Migration` gets exactly-once out of at-least-once parts:

1. The source is read through a consumer group (`prism-migrate` by default). An entry is
   XACKed only after the target confirmed its write, so a crash never loses one: on restart
   the migrator re-reads its pending entries first.
2. A re-read entry may already be in the target (the crash hit between the target write
   and the XACK). Target writes are therefore keyed by message id: Kafka has no
   idempotent producer on the embedded broker, so on start the migrator reads the target
   topic from the last checkpoint to its end and remembers the message ids it finds;
   PostgreSQL inserts are `ON CONFLICT (message_id) DO NOTHING`; JetStream drops a repeated
   `Nats-Msg-Id` inside the stream's duplicate window.
3. After every batch a checkpoint (target offsets, counters) is written to the source
   Redis, next to the stream, so the re-scan in 2. only covers the last batch.
4. Prism entries are forwarded byte for byte (their signatures stay valid); legacy entries
   are converted once, with a message id derived from the stream entry id when they carry
   none, so a re-run gives the same id.

Ordering: a 1-partition target topic (the default the SDK creates) keeps the stream's
order. During the switch, messages still in Redis can land after the first ones producers
wrote to Kafka directly; pause producers across the switch if strict order matters.
"""

from __future__ import annotations

import inspect
import json
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from ..bindings import redis as rb
from ..envelope.codec import Layout, decode, detect_layout
from ..envelope.ids import uuid7_from_seed
from ..envelope.model import Envelope
from ..errors import ConfigError, MigrationError, PrismError
from ..formats import legacy
from ..formats.detect import InputShape, detect, normalize
from .backends import backend_for_url
from .backends.base import Backend, Outgoing, redact_url
from .backends.kafka import KafkaBackend, read_partitions
from .backends.redis import RedisBackend
from .client import PrismClient
from .options import PrismPublishOptions

log = logging.getLogger("prism.sdk.migration")

PRISM_SHAPES = frozenset({InputShape.PRISM_DRAFT, InputShape.PRISM_REVIEWED})


# --------------------------------------------------------------------------- phase 2: dual-read


def is_prism_envelope(data: bytes | bytearray | memoryview, headers: Sequence[tuple[str, bytes | str]] | None = None
                      ) -> bool:
    """True when `data` is a complete Prism envelope (either layout).

    Legacy JSON, CloudEvents, LNMP and raw bytes are False, and so are broken envelopes
    (`read_any` raises a precise `FormatError` for those instead of guessing)."""
    if detect(data, headers) not in PRISM_SHAPES:
        return False
    try:
        decode(data)
    except PrismError:
        return False
    return True


@dataclass(slots=True)
class AnyMessage:
    """What `read_any` found: the shape, the payload bytes, and an envelope for either shape."""

    shape: InputShape
    envelope: Envelope
    notes: list[str] = field(default_factory=list)

    @property
    def is_prism(self) -> bool:
        return self.shape in PRISM_SHAPES

    @property
    def payload(self) -> bytes:
        """The payload bytes (decompressed); encrypted envelopes need `app.security.encryption`."""
        return self.envelope.payload_bytes()

    def json(self) -> Any:
        return self.envelope.payload_json()


def read_any(data: bytes | bytearray | memoryview, headers: Sequence[tuple[str, bytes | str]] | None = None, *,
             topic: str = "legacy", namespace: str = "legacy") -> AnyMessage:
    """Read a message of either shape (RFC-031 Phase 2): a Prism envelope, or the legacy Redis
    `{"meta", "payload"}` JSON (or any other shape `app.formats.detect` knows). For a legacy
    message the payload is exactly the producer's `payload` member; `topic`/`namespace` fill
    the envelope fields the legacy shape does not carry. Raises `FormatError` subclasses for
    malformed input."""
    result = normalize(data, headers, topic=topic, namespace=namespace)
    return AnyMessage(result.shape, result.envelope, result.notes)


# --------------------------------------------------------------------------- phase 1: dual-write


class DualWriter:
    """Publish each message in the legacy Redis shape AND as a Prism envelope (Phase 1).

    `legacy_mode="pubsub"` (RFC-031's example) PUBLISHes the legacy JSON on channel
    `legacy_topic(topic)`; `"stream"` XADDs it as field `data` to that key instead. The
    envelope goes through `client` (any backend). Both copies carry one message id.

    Encrypted messages are refused: the legacy shape has no place for encryption metadata,
    so the plaintext would be published next to the ciphertext.
    """

    def __init__(self, client: PrismClient, legacy_url: str, *, legacy_mode: str = "pubsub",
                 legacy_topic: Callable[[str], str] | None = None) -> None:
        if legacy_mode not in ("pubsub", "stream"):
            raise ConfigError(f"legacy_mode must be 'pubsub' or 'stream', got {legacy_mode!r}", path="DualWriter")
        self.client = client
        self.legacy_url = legacy_url
        self.legacy_mode = legacy_mode
        self.legacy_topic = legacy_topic or (lambda t: t)
        self._redis: Any = None

    async def __aenter__(self) -> DualWriter:
        import redis.asyncio as aredis

        self._redis = aredis.Redis.from_url(self.legacy_url, decode_responses=False)
        await self.client.connect()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._redis is not None:
            r, self._redis = self._redis, None
            await r.aclose()

    async def publish(self, topic: str, payload: Any, options: PrismPublishOptions | None = None) -> str:
        """Publish both copies; returns the shared message id. The legacy copy goes first:
        consumers not migrated yet are the ones that must not miss anything."""
        if options is not None and options.encryption is not None:
            raise ConfigError("dual-write of an encrypted message would publish its plaintext in the legacy shape",
                              path="DualWriter.publish(options.encryption)",
                              hint="encrypt only once every consumer reads Prism envelopes (Phase 3)")
        if self._redis is None:
            await self.__aenter__()
        env = self.client.build_envelope(topic, payload, options)
        legacy_bytes = legacy.to_redis_json(env)
        target = self.legacy_topic(topic)
        if self.legacy_mode == "pubsub":
            await self._redis.publish(target, legacy_bytes)
        else:
            await self._redis.xadd(target, {"data": legacy_bytes})
        o = options or PrismPublishOptions()
        return await self.client.publish_envelope(env, signing_key=o.signing_key, key=o.key)


# --------------------------------------------------------------------------- phase 3: live migration


@dataclass(slots=True)
class MigrationReport:
    """What one run of a migration did (the checkpoint keeps the total over resumed runs)."""

    topic: str
    to_topic: str
    source: str
    target: str
    copied: int = 0
    duplicates_skipped: int = 0
    legacy_converted: int = 0
    batches: int = 0
    resumed: bool = False
    known_target_ids: int = 0
    caught_up_after_s: float | None = None
    elapsed_s: float = 0.0
    source_pending: int = 0
    target_offsets: dict[int, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class Migration:
    """Move a live Redis stream to another backend (module docstring). Use `run()`, or drive
    the phases yourself: `start()`, `catch_up()`, switch producers, `drain()`, `close()`."""

    def __init__(
        self,
        from_url: str,
        to_url: str,
        topic: str,
        *,
        to_topic: str | None = None,
        group: str = "prism-migrate",
        namespace: str = "migrated",
        batch_size: int = 500,
        poll_ms: int = 200,
        dedup_window: int = 1_000_000,
    ) -> None:
        source = backend_for_url(from_url)
        if not isinstance(source, RedisBackend):
            raise ConfigError(f"migration source must be a Redis stream (redis://...), got {source.scheme}://",
                              path="--from", hint="e.g. --from redis://127.0.0.1:6379/0")
        target = backend_for_url(to_url)
        if isinstance(target, RedisBackend):
            raise ConfigError("migration target must be kafka://, nats:// or postgresql://", path="--to")
        if batch_size < 1:
            raise ConfigError(f"batch_size must be >= 1, got {batch_size}", path="batch_size")
        self.source: RedisBackend = source
        self.target: Backend = target
        self.topic = topic
        self.to_topic = to_topic or topic
        self.group = group
        self.namespace = namespace
        self.batch_size = batch_size
        self.poll_ms = poll_ms
        self.dedup_window = dedup_window
        self.key = source.key(topic)
        self.consumer = f"{group}-migrator"
        # Next to the stream, under the same key prefix: one place to find (and clean up) both.
        self.checkpoint_key = f"{source.prefix}prism-migrate:{group}:{topic}"
        self.report = MigrationReport(topic, self.to_topic, redact_url(from_url), redact_url(to_url))
        self._written: OrderedDict[str, None] = OrderedDict()
        self._recovering = True
        self._copied_before = 0
        self._started_at = 0.0
        self._started = False

    # -- lifecycle ---------------------------------------------------------------------------------------
    async def start(self) -> Migration:
        from redis.exceptions import ResponseError

        if self._started:
            return self
        self._started_at = time.monotonic()
        await self.source.connect()
        await self.target.connect()
        r = self.source.client
        try:
            await r.xgroup_create(self.key, self.group, id="0", mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise MigrationError(f"cannot create consumer group {self.group!r} on {self.key!r}: {exc}") from exc
        # Entries a crashed predecessor (any consumer of this group) held are ours now.
        cursor: Any = "0-0"
        while True:
            # (redis-py drops the cursor from JUSTID replies, so the entries come along.)
            res = await r.xautoclaim(self.key, self.group, self.consumer, 0, cursor, count=1000)
            cursor = res[0]
            if cursor in (b"0-0", "0-0"):
                break
        checkpoint = await self._load_checkpoint()
        if isinstance(self.target, KafkaBackend):
            await self.target.ensure_topic(self.to_topic)
            start = {int(p): o for p, o in checkpoint.get("offsets", {}).items()} if checkpoint else None
            records = await read_partitions(self.target, self.to_topic, start)
            for rec in records:
                mid = _header(rec.headers, "prism-message-id")
                if mid is None:
                    try:
                        mid = decode(rec.value).message_id
                    except PrismError:
                        continue  # not an envelope: nothing we could have written
                self._remember(mid)
                self.report.target_offsets[rec.partition] = rec.offset + 1
            self.report.known_target_ids = len(self._written)
        self._started = True
        log.info("migration %s -> %s started (resumed=%s, %d target ids known)", self.key, self.to_topic,
                 self.report.resumed, self.report.known_target_ids)
        return self

    async def close(self) -> None:
        self.report.elapsed_s = round(time.monotonic() - self._started_at, 3) if self._started_at else 0.0
        if self.source.client is not None:
            try:
                pending = await self.source.client.xpending(self.key, self.group)
                self.report.source_pending = int(pending.get("pending", 0))
            except Exception:  # reporting only
                log.debug("could not read the pending count of %s", self.key)
        await self.target.close()
        await self.source.close()

    async def __aenter__(self) -> Migration:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- checkpoint ------------------------------------------------------------------------------------------
    async def _load_checkpoint(self) -> dict[str, Any] | None:
        raw = await self.source.client.hgetall(self.checkpoint_key)
        if not raw:
            return None
        doc = {k.decode(): v.decode() for k, v in raw.items()}
        if doc.get("to_topic") != self.to_topic or doc.get("target_scheme") != self.target.scheme:
            raise MigrationError(
                f"checkpoint {self.checkpoint_key!r} belongs to a migration to {doc.get('target_scheme')}:"
                f"{doc.get('to_topic')}, not {self.target.scheme}:{self.to_topic}",
                path=self.checkpoint_key, hint="use another --group for a different target, or delete the checkpoint")
        self.report.resumed = True
        self._copied_before = int(doc.get("copied", 0))
        return {"offsets": json.loads(doc.get("offsets", "{}"))}

    async def _save_checkpoint(self) -> None:
        if isinstance(self.target, KafkaBackend):
            for (topic, partition), offset in self.target.last_offsets.items():
                if topic == self.to_topic:
                    self.report.target_offsets[partition] = max(offset + 1, self.report.target_offsets.get(partition, 0))
        await self.source.client.hset(self.checkpoint_key, mapping={
            "to_topic": self.to_topic, "target_scheme": self.target.scheme,
            "offsets": json.dumps({str(p): o for p, o in self.report.target_offsets.items()}),
            "copied": str(self._copied_before + self.report.copied), "updated_ms": str(int(time.time() * 1000)),
        })

    def _remember(self, message_id: str) -> None:
        self._written[message_id] = None
        if len(self._written) > self.dedup_window:
            self._written.popitem(last=False)

    # -- one batch -----------------------------------------------------------------------------------------
    async def _read(self, block_ms: int | None) -> list[tuple[bytes, dict[bytes, bytes] | None]]:
        r = self.source.client
        if self._recovering:
            res = await r.xreadgroup(self.group, self.consumer, {self.key: "0"}, count=self.batch_size)
            entries = res[0][1] if res else []
            if entries:
                return entries
            self._recovering = False
        res = await r.xreadgroup(self.group, self.consumer, {self.key: ">"}, count=self.batch_size, block=block_ms)
        return res[0][1] if res else []

    def _convert(self, entry_id: bytes, fields: dict[bytes, bytes]) -> Outgoing:
        named = {k.decode("utf-8", "replace"): v for k, v in fields.items()}
        if rb.ENVELOPE_FIELD in named:
            env = rb.decode_stream_fields(fields)
            wire = bytes(named[rb.ENVELOPE_FIELD])
            return Outgoing(self.to_topic, env, detect_layout(wire), wire=wire)
        entry_ms = int(entry_id.split(b"-", 1)[0])
        content_type = None
        if len(named) == 1:
            value = bytes(next(iter(named.values())))
        else:
            content_type = "application/json"
            try:
                value = json.dumps({k: bytes(v).decode("utf-8") for k, v in named.items()}).encode()
            except UnicodeDecodeError:
                raise MigrationError(f"legacy entry {entry_id.decode()} has several fields and binary values",
                                     path=f"{self.key} {entry_id.decode()}",
                                     hint="convert it by hand; the migrator maps multi-field entries to JSON") from None
        result = normalize(value, topic=self.topic, namespace=self.namespace, now_ms=entry_ms,
                           default_content_type=content_type)
        env = result.envelope
        if any(n.startswith("metadata.message_id generated") for n in result.notes):
            # Deterministic: migrating the same entry twice must give the same id.
            env.header.metadata.message_id = uuid7_from_seed(entry_ms, f"{self.key}/{entry_id.decode()}".encode())
        self.report.legacy_converted += 1
        return Outgoing(self.to_topic, env, Layout.REVIEWED)

    async def step(self, block_ms: int | None = None) -> int:
        """Copy one batch; returns how many source entries it took (0: none were waiting)."""
        if not self._started:
            await self.start()
        entries = await self._read(block_ms)
        if not entries:
            return 0
        items: list[Outgoing] = []
        batch_ids: set[str] = set()
        for entry_id, fields in entries:
            if not fields:
                continue  # deleted (XDEL/trim) while pending: nothing to copy
            try:
                item = self._convert(entry_id, fields)
            except PrismError as exc:
                raise MigrationError(f"stream entry {entry_id.decode()} of {self.key!r} cannot be migrated: {exc}",
                                     path=f"{self.key} {entry_id.decode()}",
                                     hint="fix or XDEL the entry, then run the migration again (it resumes)") from exc
            mid = item.envelope.message_id
            if mid in self._written or mid in batch_ids:
                self.report.duplicates_skipped += 1
                continue
            batch_ids.add(mid)
            items.append(item)
        if items:
            await self._write(items)
            for item in items:
                self._remember(item.envelope.message_id)
            self.report.copied += len(items)
        await self._commit([entry_id for entry_id, _ in entries])
        self.report.batches += 1
        return len(entries)

    async def _write(self, items: list[Outgoing]) -> None:
        try:
            await self.target.publish(items)
        except PrismError as exc:
            raise MigrationError(f"the target refused a batch of {len(items)}: {exc}",
                                 hint="fix the target and run again; the batch stays pending on the source") from exc

    async def _commit(self, entry_ids: list[bytes]) -> None:
        await self.source.client.xack(self.key, self.group, *entry_ids)
        await self._save_checkpoint()

    # -- phases --------------------------------------------------------------------------------------------
    async def catch_up(self) -> MigrationReport:
        """Copy until a read reaches the end of the stream (fewer entries than a batch)."""
        while True:
            n = await self.step(block_ms=None)
            if n < self.batch_size and not self._recovering:  # a short read of NEW entries: at the end
                break
        if self.report.caught_up_after_s is None:
            self.report.caught_up_after_s = round(time.monotonic() - self._started_at, 3)
        return self.report

    async def drain(self, idle_seconds: float = 2.0, *, follow: bool = False) -> MigrationReport:
        """Keep copying until the source has been quiet for `idle_seconds` (producers have
        switched); with `follow`, keep copying until cancelled."""
        last = time.monotonic()
        while follow or time.monotonic() - last < idle_seconds:
            if await self.step(block_ms=self.poll_ms):
                last = time.monotonic()
        return self.report

    async def run(self, on_caught_up: Callable[[], Awaitable[Any] | Any] | None = None, *,
                  idle_seconds: float = 2.0, follow: bool = False) -> MigrationReport:
        """The whole cutover: start, catch up, `on_caught_up()` (switch the producers), drain."""
        try:
            await self.start()
            await self.catch_up()
            if on_caught_up is not None:
                result = on_caught_up()
                if inspect.isawaitable(result):
                    await result
            await self.drain(idle_seconds, follow=follow)
        finally:
            await self.close()
        return self.report


async def migrate(from_url: str, to_url: str, topic: str, *,
                  on_caught_up: Callable[[], Awaitable[Any] | Any] | None = None, idle_seconds: float = 2.0,
                  follow: bool = False, **kwargs: Any) -> MigrationReport:
    """Move the live Redis stream `topic` to `to_url` (see `Migration`)."""
    return await Migration(from_url, to_url, topic, **kwargs).run(on_caught_up, idle_seconds=idle_seconds,
                                                                   follow=follow)


def _header(headers: Any, name: str) -> str | None:
    for n, v in headers or ():
        if n == name and v is not None:
            return bytes(v).decode("utf-8", "replace")
    return None


__all__ = ["AnyMessage", "DualWriter", "Migration", "MigrationReport", "is_prism_envelope", "migrate", "read_any"]

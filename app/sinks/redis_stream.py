"""Redis Streams sink (`XADD`) and source (`XREADGROUP` + `XACK`).

**Sink.** Each record is one stream entry with the binding's field map
(`app.bindings.redis.encode_stream_fields`: `envelope`, `layout`, `message_id`, `topic`,
...), where `envelope` is the exact bytes the worker signed. The stream key is the
envelope's topic unless `stream` is configured; `maxlen` trims approximately
(`MAXLEN ~`), as Redis recommends for throughput.

**Idempotency.** Streams have no uniqueness constraint, so a Lua script makes
check-and-append atomic: it returns early when the dedup key
`prism:dedup:stream:{<stream>}:<layout>:<message_id>` exists, otherwise XADDs and sets the
key (value: the entry id, TTL `dedup_ttl_s`). Scripts run without interleaving, so two
concurrent replays cannot both append. The `{<stream>}` hash tag puts the dedup key in the
stream's cluster slot, so the script stays valid on Redis Cluster.

**Size limit.** Redis refuses an argument longer than its `proto-max-bulk-len` (512 MB by
default); `max_bulk_bytes` (set it to the server's value) makes an entry with a larger field -
the envelope - go to the DLQ as `too_large` rather than failing its batch on every retry.

**Durability.** Redis acknowledges XADD from memory. What survives a Redis restart is what
its persistence (AOF/RDB) kept; the sink's part - never losing a record it was handed, even
while Redis is down - holds either way (`on_outage: wait` waits for the server). The local
test server runs without persistence, so a restart also empties the stream and forgets the
dedup keys and consumer groups; `RedisStreamSource` re-creates its group when that happens.

**Source.** `RedisStreamSource` is the reading half with consumer groups: it first re-reads
its own pending entries (delivered before a crash but never acknowledged), then new ones
(`>`), and `ack()`s entries after the caller processed them - at-least-once on the read side.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from redis.exceptions import ResponseError

from app.bindings.redis import ENVELOPE_FIELD, channel_for, decode_stream_fields, encode_stream_fields
from app.envelope.model import Envelope
from app.errors import PrismError, SinkError
from app.sinks import _redis
from app.sinks.base import Sink, SinkRecord, WriteOutcome, url_secrets
from app.topology import RedisStreamSinkSpec

# KEYS[1] stream, KEYS[2] dedup key; ARGV[1] ttl s, ARGV[2] maxlen ('0': none), ARGV[3..] fields.
# Returns the new entry id, or false (nil) for a replay.
XADD_ONCE = """
if redis.call('EXISTS', KEYS[2]) == 1 then return false end
local id
if ARGV[2] ~= '0' then
  id = redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[2], '*', unpack(ARGV, 3))
else
  id = redis.call('XADD', KEYS[1], '*', unpack(ARGV, 3))
end
redis.call('SET', KEYS[2], id, 'EX', ARGV[1])
return id
"""


@dataclass(frozen=True, slots=True)
class StreamItem:
    stream: str
    dedup_key: str
    fields: list[bytes | str]  # flattened field/value pairs


def dedup_key(stream: str, layout: str, message_id: str) -> str:
    return f"prism:dedup:stream:{{{stream}}}:{layout}:{message_id}"


class RedisStreamSink(Sink[StreamItem]):
    kind = "redis-stream"

    def __init__(self, name: str, *, url: str = "redis://127.0.0.1:6379/0", stream: str | None = None,
                 maxlen: int | None = None, dedup_ttl_s: int = 86_400, timeout_s: float = 10.0,
                 max_bulk_bytes: int = 512 * 1024 * 1024) -> None:
        super().__init__(name, timeout_s=timeout_s, secrets=url_secrets(url))
        self.url = url
        self.stream = stream
        self.maxlen = maxlen
        self.dedup_ttl_s = dedup_ttl_s
        self.max_bulk_bytes = max_bulk_bytes
        self._client: Any = None
        self._script: Any = None

    limit_source = "Redis's proto-max-bulk-len, the sink's max_bulk_bytes"

    def max_item_bytes(self) -> int | None:
        return self.max_bulk_bytes

    def item_size(self, item: StreamItem) -> int:
        return max((len(f) for f in item.fields), default=0)  # the limit is per argument

    @classmethod
    def from_spec(cls, spec: RedisStreamSinkSpec) -> RedisStreamSink:
        return cls(spec.name, url=spec.url, stream=spec.stream, maxlen=spec.maxlen, dedup_ttl_s=spec.dedup_ttl_s,
                   timeout_s=spec.timeout_ms / 1000, max_bulk_bytes=spec.max_bulk_bytes)

    def encode(self, record: SinkRecord) -> StreamItem:
        stream = self.stream or channel_for(record.envelope)
        fields = encode_stream_fields(record.envelope, record.layout)
        fields[ENVELOPE_FIELD] = record.raw  # the signed bytes, not a re-encoding
        flat: list[bytes | str] = []
        for k, v in fields.items():
            flat += [k, v]
        return StreamItem(stream, dedup_key(stream, record.layout.value, record.message_id), flat)

    async def _open(self) -> None:
        self._client = _redis.client(self.url, timeout_s=self.timeout_s)
        self._script = self._client.register_script(XADD_ONCE)
        await self._client.ping()

    async def _write(self, items: Sequence[StreamItem]) -> WriteOutcome:
        pipe = self._client.pipeline(transaction=False)
        maxlen = str(self.maxlen or 0)
        for it in items:
            await self._script(keys=[it.stream, it.dedup_key], args=[self.dedup_ttl_s, maxlen, *it.fields],
                               client=pipe)
        results = await pipe.execute()
        dup = sum(1 for r in results if r is None)
        return WriteOutcome(len(items) - dup, dup)

    async def _close(self) -> None:
        c, self._client = self._client, None
        await _redis.close(c)

    async def _ping(self) -> None:
        await self._client.ping()


# --------------------------------------------------------------------------- source


@dataclass(frozen=True, slots=True)
class StreamDelivery:
    """One entry read from a consumer group. `envelope` is None when the entry is not a valid
    Prism entry; `error` then says why (ack it, or leave it pending for inspection)."""

    entry_id: bytes
    raw: bytes
    envelope: Envelope | None
    error: PrismError | None = None
    fields: dict[bytes, bytes] = field(default_factory=dict)


class RedisStreamSource:
    """Read a stream through a consumer group; `ack()` what was processed.

    `start_id` is where a newly created group starts (`0`: the whole stream, `$`: new
    entries only). A group lost with the server's memory is re-created the same way.
    """

    def __init__(self, url: str, stream: str, group: str, consumer: str, *, start_id: str = "0",
                 timeout_s: float = 10.0) -> None:
        self.url = url
        self.stream = stream
        self.group = group
        self.consumer = consumer
        self.start_id = start_id
        self.timeout_s = timeout_s
        self._client: Any = None
        self._pending_first = True
        self._secrets = url_secrets(url)

    async def start(self) -> None:
        try:
            self._client = _redis.client(self.url, timeout_s=self.timeout_s)
            await self._ensure_group()
        except Exception as exc:
            await self.stop()
            raise self._error("cannot connect or create the consumer group", exc) from exc
        self._pending_first = True

    async def _ensure_group(self) -> None:
        try:
            await self._client.xgroup_create(self.stream, self.group, id=self.start_id, mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    async def read(self, count: int = 100, block_ms: int = 1000) -> list[StreamDelivery]:
        """Entries for this consumer: first its own unacknowledged ones (after a restart),
        then new ones, waiting up to `block_ms` for them. Raises `SinkError` when Redis is
        unreachable (call again: the client reconnects)."""
        if self._client is None:
            await self.start()
        try:
            if self._pending_first:
                got = await self._xread("0", count, None)
                if got:
                    return got
                self._pending_first = False
            return await self._xread(">", count, block_ms)
        except ResponseError as exc:
            if "NOGROUP" not in str(exc):
                raise self._error("XREADGROUP failed", exc) from exc
            await self._ensure_group()  # the server lost the group (restart without persistence)
            self._pending_first = True
            return []
        except Exception as exc:
            await self.stop()
            raise self._error("XREADGROUP failed", exc) from exc

    async def _xread(self, start: str, count: int, block_ms: int | None) -> list[StreamDelivery]:
        resp = await self._client.xreadgroup(self.group, self.consumer, {self.stream: start}, count=count,
                                             block=block_ms)
        out: list[StreamDelivery] = []
        for _stream, entries in resp or []:
            for entry_id, fields in entries:
                if not fields:  # pending entry deleted from the stream (trimmed): nothing to deliver
                    out.append(StreamDelivery(entry_id, b"", None, SinkError("entry was trimmed", path="stream")))
                    continue
                raw = bytes(fields.get(ENVELOPE_FIELD.encode(), b""))
                try:
                    env = decode_stream_fields(fields)
                except PrismError as exc:
                    out.append(StreamDelivery(entry_id, raw, None, exc, dict(fields)))
                else:
                    out.append(StreamDelivery(entry_id, raw, env, None, dict(fields)))
        return out

    async def ack(self, deliveries: Sequence[StreamDelivery | bytes]) -> int:
        """XACK the given entries; returns how many were pending."""
        ids = [d.entry_id if isinstance(d, StreamDelivery) else d for d in deliveries]
        if not ids:
            return 0
        if self._client is None:
            await self.start()
        try:
            return int(await self._client.xack(self.stream, self.group, *ids))
        except Exception as exc:
            await self.stop()
            raise self._error("XACK failed", exc) from exc

    async def stop(self) -> None:
        c, self._client = self._client, None
        with contextlib.suppress(Exception):
            await _redis.close(c)

    def _error(self, what: str, exc: BaseException) -> SinkError:
        text = f"redis-stream source {self.stream!r}/{self.group!r}: {what}: {type(exc).__name__}: {exc}"
        for s in self._secrets:
            text = text.replace(s, "***")
        return SinkError(text[:500], path=f"redis stream {self.stream}",
                         hint="check that Redis is up; call read() again to reconnect")

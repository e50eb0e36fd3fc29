"""Redis backend: Redis **Streams**, `redis://[:password@]host:port/db[?param=value...]`.

Why Streams and not Pub/Sub (which RFC-031 draws for Redis): Pub/Sub delivers to whoever
is connected at that instant and forgets; a consumer that restarts, is slow, or subscribes
a second late loses messages, and there is nothing to acknowledge. The SDK promises the
same at-least-once consumer semantics on every backend, so it uses Streams: `XADD` stores
the entry (fields per `app.bindings.redis.encode_stream_fields`), consumer groups
(`XREADGROUP`) share the work, `XACK` acknowledges. Pub/Sub with self-contained envelope
bytes remains available through `app.bindings.redis.encode_pubsub` and the sinks.

URL parameters (everything else goes to redis-py):

| parameter       | default | meaning                                                          |
|-----------------|---------|------------------------------------------------------------------|
| `prefix`        | ""      | stream key = prefix + topic                                      |
| `maxlen`        | 0       | `XADD MAXLEN ~ n` trimming (0: keep everything)                  |
| `claim_idle_ms` | 30000   | pending entries idle this long are claimed from dead consumers   |

Acknowledgement model: `ack()` is `XACK`. `nack()` leaves the entry pending and this
consumer `XCLAIM`s it back on its next fetch (delivery count +1). Closing a subscription
marks its unsettled entries as idle for `claim_idle_ms`, so the next consumer of the group
claims them at once instead of waiting. Entries of a consumer that died are claimed
(`XAUTOCLAIM`) by any live consumer of the group once idle for `claim_idle_ms`.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
import uuid
from collections.abc import Sequence
from typing import Any

from ...bindings import _common as c
from ...bindings import redis as rb
from ...envelope.codec import encode as encode_envelope
from ...envelope.model import Envelope
from ...errors import ConfigError, PublishError, SubscribeError
from ...security.signing import VerificationKeys
from .base import (
    Backend,
    BackendSubscription,
    Delivery,
    Outgoing,
    PlainTemplates,
    RawMessage,
    SubscribeSettings,
    int_param,
    redact_url,
)


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes | bytearray) else str(v)


class RedisBackend(Backend):
    scheme = "redis"

    def __init__(self, url: str) -> None:
        super().__init__(url)
        from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

        parts = urlsplit(url)
        try:
            parts.port  # noqa: B018 - one host: a port that is no number or out of range raises here
        except ValueError as exc:  # in redis-py's from_url at connect, as a traceback, before
            raise ConfigError(f"the Redis URL's port is not usable: {exc}", path=redact_url(url),
                              hint="write redis://host:port/db, e.g. redis://127.0.0.1:6379/0") from None
        params = dict(parse_qsl(parts.query, keep_blank_values=True))
        self.prefix = params.pop("prefix", "")
        self.maxlen = int_param(params, "maxlen", 0, url)
        self.claim_idle_ms = int_param(params, "claim_idle_ms", 30_000, url, minimum=1)
        self._client_url = urlunsplit(parts._replace(query=urlencode(params)))
        self.client: Any = None
        self._plain_fields = PlainTemplates(rb.encode_stream_fields, [rb._WIRE_NAMES[c.MESSAGE_ID]], str.encode)

    def key(self, topic: str) -> str:
        return self.prefix + topic

    async def connect(self) -> None:
        import redis.asyncio as aredis

        # Binary envelopes: a decoding client would corrupt them (app.bindings.redis).
        self.client = aredis.Redis.from_url(self._client_url, decode_responses=False)
        try:
            await self.client.ping()
        except Exception as exc:
            await self.client.aclose()
            self.client = None
            raise PublishError(f"cannot connect to Redis: {exc!r}", path=redact_url(self.url),
                               hint="check the URL and that Redis runs") from exc

    async def close(self) -> None:
        if self.client is not None:
            client, self.client = self.client, None
            await client.aclose()

    def _fields(self, item: Outgoing) -> dict[str, bytes]:
        if item.plain:
            # Same entry as encode_stream_fields: the topic's fields with this id and envelope.
            fields = self._plain_fields.get(item.envelope, item.layout)
            fields[rb.ENVELOPE_FIELD] = item.wire if item.wire is not None else \
                encode_envelope(item.envelope, item.layout)
            return fields
        fields = rb.encode_stream_fields(item.envelope, item.layout, sign_with=item.sign_with)
        if item.wire is not None:
            fields[rb.ENVELOPE_FIELD] = item.wire
        return fields

    def _xadd_kwargs(self) -> dict[str, Any]:
        return {"maxlen": self.maxlen, "approximate": True} if self.maxlen else {}

    async def publish(self, items: Sequence[Outgoing]) -> None:
        if self.client is None:
            raise PublishError("the Redis backend is not connected", hint="use the client inside `async with`")
        try:
            if len(items) == 1:
                await self.client.xadd(self.key(items[0].topic), self._fields(items[0]), **self._xadd_kwargs())
                return
            pipe = self.client.pipeline(transaction=False)
            for item in items:
                pipe.xadd(self.key(item.topic), self._fields(item), **self._xadd_kwargs())
            await pipe.execute()
        except PublishError:
            raise
        except Exception as exc:
            raise PublishError(f"Redis did not confirm the XADD: {exc!r}", path=redact_url(self.url),
                               hint="the message may or may not be stored; retry with the same message_id") from exc

    async def publish_bytes(self, topic: str, value: bytes) -> None:
        await self.client.xadd(self.key(topic), {"payload": value}, **self._xadd_kwargs())

    def subscription(self, topic: str, settings: SubscribeSettings) -> BackendSubscription:
        return _RedisSubscription(self, topic, settings)

    async def topic_exists(self, topic: str) -> bool:
        return _text(await self.client.type(self.key(topic))) != "none"

    async def sample(self, topic: str, limit: int) -> list[RawMessage]:
        key = self.key(topic)
        kind = _text(await self.client.type(key))
        if kind == "none":
            return []
        if kind != "stream":
            raise ConfigError(f"Redis key {key!r} is a {kind}, not a stream", path=key,
                              hint="the SDK reads Redis Streams; Pub/Sub channels keep no history to sample")
        return [raw_entry(entry_id, fields) for entry_id, fields in await self.client.xrange(key, count=limit)]


def raw_entry(entry_id: Any, fields: dict[Any, Any]) -> RawMessage:
    """A stream entry as a `RawMessage`: the `envelope` field (or the only field of a legacy
    entry) is the value, the other fields are the headers."""
    named = {_text(k): bytes(v) for k, v in fields.items()}
    if rb.ENVELOPE_FIELD in named:
        value = named.pop(rb.ENVELOPE_FIELD)
    elif len(named) == 1:
        value = named.popitem()[1]
    else:
        value = b""
    return RawMessage(value, sorted(named.items()), _text(entry_id))


class _RedisDelivery(Delivery):
    backend = "redis"
    __slots__ = ("entry_id", "fields", "redelivered", "sub")

    def __init__(self, sub: _RedisSubscription, entry_id: bytes, fields: dict[bytes, bytes], redelivered: bool) -> None:
        self.sub, self.entry_id, self.fields, self.redelivered = sub, entry_id, fields, redelivered

    def decode(self, verify_with: VerificationKeys | None) -> Envelope:
        return rb.decode_stream_fields(self.fields, verify_with=verify_with)

    @property
    def ref(self) -> str:
        return _text(self.entry_id)

    async def ack(self) -> None:
        await self.sub.ack(self.entry_id)

    async def nack(self) -> None:
        self.sub.nack(self.entry_id)


class _RedisSubscription(BackendSubscription):
    def __init__(self, backend: RedisBackend, topic: str, settings: SubscribeSettings) -> None:
        self.backend, self.settings = backend, settings
        self.key = backend.key(topic)
        self.group = settings.group
        self.consumer = f"{settings.group}-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self._retry: list[bytes] = []
        self._outstanding: set[bytes] = set()
        self._next_autoclaim = 0.0
        self.claim_idle_ms = settings.claim_idle_ms or backend.claim_idle_ms

    @property
    def _r(self) -> Any:
        return self.backend.client

    async def start(self) -> None:
        from redis.exceptions import ResponseError

        try:
            # From the start of the stream, like Kafka's auto_offset_reset=earliest: a group
            # created after the producer wrote still sees those messages.
            await self._r.xgroup_create(self.key, self.group, id="0", mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise SubscribeError(f"cannot create consumer group {self.group!r} on {self.key!r}: {exc}") from exc

    def _deliveries(self, entries: Any, redelivered: bool) -> list[Delivery]:
        out: list[Delivery] = []
        for entry_id, fields in entries or ():
            if fields is None:
                continue  # deleted from the stream while pending
            self._outstanding.add(entry_id)
            out.append(_RedisDelivery(self, entry_id, fields, redelivered))
        return out

    async def fetch(self, max_messages: int, timeout: float) -> list[Delivery]:
        try:
            if self._retry:
                ids, self._retry = self._retry[:max_messages], self._retry[max_messages:]
                claimed = await self._r.xclaim(self.key, self.group, self.consumer, 0, ids)
                out = self._deliveries(claimed, True)
                if out:
                    return out
            now = time.monotonic()
            if now >= self._next_autoclaim:
                self._next_autoclaim = now + self.claim_idle_ms / 2000
                res = await self._r.xautoclaim(self.key, self.group, self.consumer, self.claim_idle_ms,
                                               "0-0", count=max_messages)
                out = self._deliveries(res[1], True)
                if out:
                    return out
            block = int(timeout * 1000)
            res = await self._r.xreadgroup(self.group, self.consumer, {self.key: ">"}, count=max_messages,
                                           block=block if block > 0 else None)
        except Exception as exc:
            raise SubscribeError(f"reading Redis stream {self.key!r} failed: {exc!r}",
                                 path=redact_url(self.backend.url)) from exc
        return self._deliveries(res[0][1] if res else (), False)

    async def ack(self, entry_id: bytes) -> None:
        if entry_id not in self._outstanding:
            return
        self._outstanding.discard(entry_id)
        try:
            await self._r.xack(self.key, self.group, entry_id)
        except Exception as exc:
            raise SubscribeError(f"XACK of {_text(entry_id)} on {self.key!r} failed: {exc!r}",
                                 hint="the entry stays pending and will be redelivered") from exc

    def nack(self, entry_id: bytes) -> None:
        if entry_id in self._outstanding:
            self._outstanding.discard(entry_id)
            self._retry.append(entry_id)

    async def close(self) -> None:
        unsettled = list(self._outstanding) + self._retry
        self._outstanding.clear()
        self._retry = []
        if self._r is None:
            return
        with contextlib.suppress(Exception):
            if unsettled:
                # Make them claimable by the group's other consumers right away.
                await self._r.xclaim(self.key, self.group, self.consumer, 0, unsettled,
                                     idle=self.claim_idle_ms + 1, justid=True)
            else:
                pending = await self._r.xpending_range(self.key, self.group, "-", "+", 1, consumername=self.consumer)
                if not pending:
                    await self._r.xgroup_delconsumer(self.key, self.group, self.consumer)

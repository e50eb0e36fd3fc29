"""Redis Pub/Sub sink: `PUBLISH <channel> <envelope bytes>`.

The message is the exact envelope bytes the worker signed (RFC-031 "Redis: Envelope as
Pub/Sub Message" - Pub/Sub has no headers, so the message is self-contained). The channel
is the envelope's topic unless `channel` is configured.

**What at-least-once means here.** Redis Pub/Sub keeps nothing: a message reaches the
subscribers connected at the moment of PUBLISH and is then gone. So the guarantee is
"published at least once while subscribers are connected". PUBLISH returns how many
subscribers received the message; with `min_subscribers: N` a PUBLISH that reached fewer
than N counts as *not delivered* and is retried under the outage policy (`wait` holds the
stream until a subscriber is back, which is what makes a Redis restart lossless for a
subscriber that reconnects). With the default 0, a message published while nobody listens
is simply gone - use the Redis Streams sink when you need storage.

**Size limit.** Redis refuses an argument longer than its `proto-max-bulk-len` (512 MB by
default); `max_bulk_bytes` (set it to the server's value) makes a larger message go to the DLQ
as `too_large` rather than failing its batch on every retry.

**Idempotency.** A replayed record must not be published twice. A Lua script checks a dedup
key `prism:dedup:pubsub:{<channel>}:<layout>:<message_id>`, publishes, and sets the key with
a TTL (`dedup_ttl_s`) only when the publish counted as delivered - atomically, because
scripts run without interleaving. Replays inside the TTL are dropped. The keys live in Redis
memory: a Redis restart without persistence forgets them (and every subscriber lost its
connection anyway); subscribers that must never see a duplicate also dedup by message_id.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from app.bindings.redis import channel_for
from app.sinks import _redis
from app.sinks.base import Sink, SinkRecord, WriteOutcome, url_secrets
from app.topology import RedisPubSubSinkSpec

# KEYS[1] dedup key; ARGV: channel, message, ttl seconds, min subscribers.
# Returns -1 for a replay, else the number of subscribers that received the message.
PUBLISH_ONCE = """
if redis.call('EXISTS', KEYS[1]) == 1 then return -1 end
local n = redis.call('PUBLISH', ARGV[1], ARGV[2])
if n >= tonumber(ARGV[4]) then redis.call('SET', KEYS[1], '1', 'EX', ARGV[3]) end
return n
"""


@dataclass(frozen=True, slots=True)
class PubSubItem:
    channel: str
    data: bytes
    dedup_key: str


def dedup_key(channel: str, layout: str, message_id: str) -> str:
    return f"prism:dedup:pubsub:{{{channel}}}:{layout}:{message_id}"


class RedisPubSubSink(Sink[PubSubItem]):
    kind = "redis-pubsub"

    def __init__(self, name: str, *, url: str = "redis://127.0.0.1:6379/0", channel: str | None = None,
                 min_subscribers: int = 0, dedup_ttl_s: int = 86_400, timeout_s: float = 10.0,
                 max_bulk_bytes: int = 512 * 1024 * 1024) -> None:
        super().__init__(name, timeout_s=timeout_s, secrets=url_secrets(url))
        self.url = url
        self.channel = channel
        self.min_subscribers = min_subscribers
        self.dedup_ttl_s = dedup_ttl_s
        self.max_bulk_bytes = max_bulk_bytes
        self._client: Any = None
        self._script: Any = None

    limit_source = "Redis's proto-max-bulk-len, the sink's max_bulk_bytes"

    def max_item_bytes(self) -> int | None:
        return self.max_bulk_bytes

    def item_size(self, item: PubSubItem) -> int:
        return len(item.data)

    @classmethod
    def from_spec(cls, spec: RedisPubSubSinkSpec) -> RedisPubSubSink:
        return cls(spec.name, url=spec.url, channel=spec.channel, min_subscribers=spec.min_subscribers,
                   dedup_ttl_s=spec.dedup_ttl_s, timeout_s=spec.timeout_ms / 1000, max_bulk_bytes=spec.max_bulk_bytes)

    def encode(self, record: SinkRecord) -> PubSubItem:
        channel = self.channel or channel_for(record.envelope)
        return PubSubItem(channel, record.raw, dedup_key(channel, record.layout.value, record.message_id))

    async def _open(self) -> None:
        self._client = _redis.client(self.url, timeout_s=self.timeout_s)
        self._script = self._client.register_script(PUBLISH_ONCE)
        await self._client.ping()

    async def _write(self, items: Sequence[PubSubItem]) -> WriteOutcome:
        pipe = self._client.pipeline(transaction=False)
        for it in items:
            if self.dedup_ttl_s > 0:
                await self._script(keys=[it.dedup_key],
                                   args=[it.channel, it.data, self.dedup_ttl_s, self.min_subscribers], client=pipe)
            else:
                pipe.publish(it.channel, it.data)
        results = await pipe.execute()
        dup = sum(1 for n in results if n == -1)
        short = sum(1 for n in results if n != -1 and n < self.min_subscribers)
        if short:
            # The ones that did reach enough subscribers set their dedup key: the retry of
            # this batch publishes only the others.
            raise self.error(f"{short} of {len(items)} message(s) reached fewer than {self.min_subscribers} "
                             "subscriber(s)", hint="start a subscriber, or set min_subscribers: 0")
        return WriteOutcome(len(items) - dup, dup)

    async def _close(self) -> None:
        c, self._client = self._client, None
        await _redis.close(c)

    async def _ping(self) -> None:
        await self._client.ping()

"""Redis Pub/Sub and Streams sinks against the real local Redis: byte-exact round trips,
idempotent replays, consumer groups, and a Redis restart in the middle of the stream."""

from __future__ import annotations

import asyncio
import contextlib
import uuid

import pytest
import redis.asyncio as aioredis

from app.bindings.redis import ENVELOPE_FIELD, decode_pubsub
from app.security.signing import VerificationKeys, verify
from app.sinks.delivery import Delivery, OutagePolicy
from app.sinks.redis_pubsub import RedisPubSubSink
from app.sinks.redis_stream import RedisStreamSink, RedisStreamSource
from tests.sinks.conftest import WORKER_KEY, make_records
from tests.sinks.helpers import Feeder, wait_for
from tests.sinks.services import outage, require_restartable

pytestmark = pytest.mark.integration
FAST = OutagePolicy("wait", backoff_initial_s=0.05, backoff_max_s=0.5)


class Subscriber:
    """A Pub/Sub subscriber that, like a real service, reconnects and re-subscribes when Redis
    goes away; it records every message it receives."""

    def __init__(self, url: str, channel: str) -> None:
        self.url, self.channel = url, channel
        self.received: list[bytes] = []
        self.subscribed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Subscriber:
        self._task = asyncio.create_task(self._run())
        await asyncio.wait_for(self.subscribed.wait(), 10)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task

    async def _run(self) -> None:
        while True:
            client = aioredis.from_url(self.url, decode_responses=False, socket_connect_timeout=1)
            try:
                ps = client.pubsub()
                await ps.subscribe(self.channel)
                self.subscribed.set()
                while True:
                    msg = await ps.get_message(ignore_subscribe_messages=True, timeout=0.5)
                    if msg is not None and msg["type"] == "message":
                        self.received.append(msg["data"])
            except (OSError, aioredis.ConnectionError, aioredis.TimeoutError):
                self.subscribed.clear()
                await asyncio.sleep(0.05)
            finally:
                with contextlib.suppress(Exception):
                    await client.aclose()


# --------------------------------------------------------------------------- Pub/Sub


async def test_pubsub_publishes_the_signed_bytes_exactly_once(redis_url: str) -> None:
    recs = make_records(30)
    channel = recs[0].envelope.topic
    sink = RedisPubSubSink("ps", url=redis_url, min_subscribers=1)
    async with Subscriber(redis_url, channel) as sub:
        await sink.write_batch(recs)
        await sink.write_batch(recs[:20])  # replay: dropped by the dedup keys
        await wait_for(lambda: len(sub.received) >= 30, "30 messages")
        await asyncio.sleep(0.2)  # a duplicate would arrive right behind the originals
    await sink.stop()
    assert sub.received == [r.raw for r in recs]
    assert sink.stats.written == 30 and sink.stats.duplicates == 20
    env = decode_pubsub(sub.received[0])  # self-contained: no headers needed
    assert env.message_id == recs[0].message_id
    verify(sub.received[0], VerificationKeys.of([WORKER_KEY]))  # signature intact


async def test_pubsub_without_subscribers_counts_as_not_delivered(redis_url: str) -> None:
    recs = make_records(3)
    sink = RedisPubSubSink("ps", url=redis_url, min_subscribers=1, channel=f"nobody-{uuid.uuid4().hex}")
    with pytest.raises(Exception, match="fewer than 1 subscriber"):
        await sink.write_batch(recs)
    await sink.stop()


async def test_pubsub_survives_redis_restart_mid_stream(redis_url: str) -> None:
    require_restartable("redis")
    recs = make_records(300)
    channel = recs[0].envelope.topic
    sink = RedisPubSubSink("ps", url=redis_url, min_subscribers=1, timeout_s=2)
    async with Subscriber(redis_url, channel) as sub:
        feeder = Feeder(Delivery(sink, FAST, dlq=None), recs).start()
        await wait_for(lambda: feeder.delivered >= 100, "100 published")
        # Pub/Sub keeps nothing: what was published before the shutdown must already be with
        # the subscriber. The sink's job is everything after, which it holds until a
        # subscriber is back.
        await feeder.pause()
        await wait_for(lambda: len(sub.received) == feeder.delivered, "subscriber caught up")
        async with outage("redis"):
            feeder.resume()
            await wait_for(lambda: sink.stats.failed_attempts >= 2, "sink retrying")
        await feeder.done()
        await wait_for(lambda: len(sub.received) >= 300, "all 300 received", timeout=30)
        await asyncio.sleep(0.2)
    await sink.stop()
    assert sorted(sub.received) == sorted(r.raw for r in recs)  # every message, once
    assert sink.stats.outages >= 1 and not sink.stats.in_outage


# --------------------------------------------------------------------------- Streams


async def test_stream_round_trip_through_a_consumer_group(redis_url: str) -> None:
    recs = make_records(50)
    stream = f"sink-test-{uuid.uuid4().hex}"
    sink = RedisStreamSink("rs", url=redis_url, stream=stream)
    await sink.start()
    await sink.write_batch(recs)
    await sink.write_batch(recs)  # replay: no second entry
    src = RedisStreamSource(redis_url, stream, "g1", "c1")
    try:
        got = await src.read(count=100, block_ms=100)
        assert [d.raw for d in got] == [r.raw for r in recs]  # byte-exact, in order
        assert [d.envelope.message_id for d in got] == [r.message_id for r in recs]
        assert got[0].fields[b"layout"] == b"reviewed" and got[0].fields[b"message_id"] == recs[0].message_id.encode()
        assert await src.ack(got[:10]) == 10
        # the 40 unacked entries come back to this consumer after a restart (pending list)
        await src.stop()
        src2 = RedisStreamSource(redis_url, stream, "g1", "c1")
        again = await src2.read(count=100, block_ms=100)
        assert [d.raw for d in again] == [r.raw for r in recs[10:]]
        assert await src2.ack(again) == 40
        assert await src2.read(count=100, block_ms=50) == []
        await src2.stop()
        client = aioredis.from_url(redis_url)
        assert await client.xlen(stream) == 50
        await client.delete(stream)
        await client.aclose()
    finally:
        await src.stop()
        await sink.stop()
    assert sink.stats.written == 50 and sink.stats.duplicates == 50


async def test_stream_dedup_is_per_layout_and_survives_a_new_sink_instance(redis_url: str) -> None:
    recs = make_records(5)
    stream = f"sink-test-{uuid.uuid4().hex}"
    first, second = RedisStreamSink("a", url=redis_url, stream=stream), RedisStreamSink("b", url=redis_url, stream=stream)
    await first.write_batch(recs)
    await second.write_batch(recs)  # another worker replaying the same records: server-side dedup
    client = aioredis.from_url(redis_url)
    assert await client.xlen(stream) == 5
    # the stream holds the signed bytes as received, not a re-encoding (protobuf does not fix
    # map-entry order, so a re-encoding could differ byte-wise and break the signature)
    stored = [fields[ENVELOPE_FIELD.encode()] for _id, fields in await client.xrange(stream)]
    await client.delete(stream)
    await client.aclose()
    await first.stop()
    await second.stop()
    assert second.stats.duplicates == 5 and second.stats.written == 0
    assert stored == [r.raw for r in recs]


async def test_stream_survives_redis_restart_mid_stream(redis_url: str) -> None:
    require_restartable("redis")
    recs = make_records(300)
    stream = f"sink-test-{uuid.uuid4().hex}"
    sink = RedisStreamSink("rs", url=redis_url, stream=stream, timeout_s=2)
    seen: list[str] = []
    stop = asyncio.Event()

    async def consume() -> None:
        src = RedisStreamSource(redis_url, stream, "g", "c", timeout_s=2)
        while not stop.is_set():
            try:
                got = await src.read(count=50, block_ms=100)
                seen.extend(d.envelope.message_id for d in got if d.envelope is not None)
                await src.ack(got)
            except Exception:  # Redis is down: a real consumer retries
                await asyncio.sleep(0.05)
        await src.stop()

    consumer = asyncio.create_task(consume())
    feeder = Feeder(Delivery(sink, FAST, dlq=None), recs).start()
    try:
        await wait_for(lambda: feeder.delivered >= 100, "100 written")
        # The local Redis runs without persistence: the shutdown empties the stream. What the
        # sink wrote before must already be consumed; the sink's job is the rest.
        await feeder.pause()
        await wait_for(lambda: len(seen) == feeder.delivered, "consumer caught up")
        async with outage("redis"):
            feeder.resume()
            await wait_for(lambda: sink.stats.failed_attempts >= 2, "sink retrying")
        await feeder.done()
        await wait_for(lambda: len(seen) >= 300, "all 300 consumed", timeout=30)
    finally:
        stop.set()
        await consumer
        await sink.stop()
    assert sorted(seen) == sorted(r.message_id for r in recs)  # zero loss, no duplicates
    assert sink.stats.outages >= 1
    client = aioredis.from_url(redis_url)
    await client.delete(stream)
    await client.aclose()

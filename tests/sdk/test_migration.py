"""RFC-031 migration phases: dual-write, dual-read, and the live Redis -> Kafka cutover with
no loss and no duplicates (including a crash between the target write and the XACK)."""

from __future__ import annotations

import asyncio
import json
import os

import pytest
import redis.asyncio as aredis

from app.envelope import Layout, encode, new_envelope
from app.errors import ConfigError, FormatError
from app.formats.detect import InputShape
from app.sdk import EncryptionOptions, PrismClient, PrismPublishOptions
from app.sdk.migration import DualWriter, Migration, is_prism_envelope, read_any
from app.security.signing import SigningKey, VerificationKeys

KEY = SigningKey.hmac_sha256("producer", os.urandom(32))


def plain(url: str) -> str:
    return url.split("?", 1)[0]


# --------------------------------------------------------------------------- dual-read (no server)


def test_is_prism_envelope_and_read_any_read_both_shapes():
    env = new_envelope("orders", {"order_id": 7}, namespace="shop", correlation_id="c-7")
    legacy = b'{"meta":{"message_id":"m-7","correlation_id":"c-7"},"payload":{"order_id": 7}}'
    for wire in (encode(env, Layout.REVIEWED), encode(env, Layout.DRAFT)):
        assert is_prism_envelope(wire)
        got = read_any(wire)
        assert got.is_prism and got.envelope.message_id == env.message_id and got.json() == {"order_id": 7}
    assert not is_prism_envelope(legacy)
    old = read_any(legacy, topic="orders", namespace="shop")
    assert old.shape is InputShape.REDIS_JSON and not old.is_prism
    assert old.payload == b'{"order_id": 7}'  # the producer's bytes, exactly
    assert (old.envelope.message_id, old.envelope.metadata.correlation_id) == ("m-7", "c-7")
    assert not is_prism_envelope(b"just bytes") and read_any(b"just bytes").payload == b"just bytes"
    truncated = encode(env)[:-5]
    assert not is_prism_envelope(truncated)
    with pytest.raises(FormatError, match="does not decode"):
        read_any(truncated)


# --------------------------------------------------------------------------- dual-write


@pytest.mark.integration
async def test_dual_writer_publishes_the_legacy_shape_and_the_envelope_with_one_id(redis_url, topic):
    r = aredis.Redis.from_url(plain(redis_url))
    pubsub = r.pubsub()
    await pubsub.subscribe(f"legacy.{topic}")
    async with PrismClient(redis_url, namespace="shop") as client, \
            DualWriter(client, plain(redis_url), legacy_topic=lambda t: f"legacy.{t}") as writer:
        mid = await writer.publish(topic, {"order_id": 1}, PrismPublishOptions(correlation_id="c-1", signing_key=KEY))
        with pytest.raises(ConfigError, match="plaintext"):
            await writer.publish(topic, {"x": 1}, PrismPublishOptions(encryption=EncryptionOptions(provider=None)))
        async with asyncio.timeout(10):
            legacy_msg = None
            while legacy_msg is None:
                legacy_msg = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1)
            async with client.subscribe(topic, group="new", verify_with=VerificationKeys.of([KEY])) as sub:
                new_msg = await sub.receive(timeout=5)
    await pubsub.aclose()
    await r.aclose()
    data = legacy_msg["data"]
    assert json.loads(data)["payload"] == {"order_id": 1}  # what the old consumer parses today
    old = read_any(data, topic=topic, namespace="shop")
    assert old.envelope.message_id == mid == new_msg.message_id  # one id: dual readers can de-duplicate
    assert old.envelope.metadata.correlation_id == new_msg.metadata.correlation_id == "c-1"
    assert new_msg.payload() == old.json() == {"order_id": 1}


# --------------------------------------------------------------------------- the cutover


async def read_everything(url: str, topic: str, expected: int, *, verify: bool = False) -> list[str]:
    ids: list[str] = []
    kwargs = {"verify_with": VerificationKeys.of([KEY])} if verify else {}
    async with PrismClient(url, namespace="readers") as client, \
            client.subscribe(topic, group="after-cutover", **kwargs) as sub:
        async with asyncio.timeout(30):
            while len(ids) < expected:
                for msg in await sub.receive_batch(500, timeout=1):
                    ids.append(msg.message_id)
                    await msg.ack()
        # and nothing more arrives
        assert await sub.receive_batch(10, timeout=1.0) == []
    return ids


@pytest.mark.integration
async def test_live_redis_to_kafka_cutover_delivers_every_message_exactly_once(redis_url, kafka_url, topic):
    published: list[str] = []
    on_kafka = asyncio.Event()
    stop = asyncio.Event()

    async def producer() -> None:
        """Keeps publishing through the whole migration; switches backend when told."""
        async with PrismClient(redis_url, namespace="shop", signing_key=KEY) as old, \
                PrismClient(kafka_url, namespace="shop", signing_key=KEY) as new:
            i = 0
            while not stop.is_set():
                client = new if on_kafka.is_set() else old
                published.append(await client.publish(topic, {"i": i, "via": client.backend.scheme}))
                i += 1
                await asyncio.sleep(0.003)

    task = asyncio.create_task(producer())
    while len(published) < 150:  # a backlog exists before the migration starts
        await asyncio.sleep(0.01)
    after_switch: list[int] = []

    async def switch_producers() -> None:
        on_kafka.set()
        after_switch.append(len(published))

    async with asyncio.timeout(60):
        report = await Migration(redis_url, kafka_url, topic, batch_size=50, poll_ms=100).run(
            switch_producers, idle_seconds=1.0)
        while len(published) < after_switch[0] + 100:  # keep going on Kafka for a while
            await asyncio.sleep(0.01)
        stop.set()
        await task

    on_redis = after_switch[0]
    assert report.copied >= 150 and report.duplicates_skipped == 0 and report.source_pending == 0
    assert report.caught_up_after_s is not None and report.batches >= 3
    ids = await read_everything(kafka_url, topic, len(published), verify=True)  # signatures survived the move
    assert len(ids) == len(published) == len(set(ids))  # exactly once: no loss, no duplicate
    assert set(ids) == set(published)
    assert report.copied <= on_redis + 5  # only what producers wrote to Redis was migrated


@pytest.mark.integration
async def test_a_crash_between_target_write_and_xack_creates_no_duplicate(redis_url, kafka_url, topic):
    async with PrismClient(redis_url, namespace="shop") as client:
        published = await client.publish_batch([(topic, {"i": i}) for i in range(30)])

    crashing = Migration(redis_url, kafka_url, topic, batch_size=10)

    async def crash(entry_ids):  # the process dies after Kafka confirmed, before XACK + checkpoint
        raise RuntimeError("simulated crash")

    crashing._commit = crash  # type: ignore[method-assign]
    await crashing.start()
    with pytest.raises(RuntimeError, match="simulated crash"):
        await crashing.step()
    await crashing.close()

    report = await Migration(redis_url, kafka_url, topic, batch_size=10).run(idle_seconds=0.3)
    assert report.known_target_ids == 10  # found by reading the target from the checkpoint
    assert report.duplicates_skipped == 10 and report.copied == 20 and report.source_pending == 0
    ids = await read_everything(kafka_url, topic, 30)
    assert sorted(ids) == sorted(published)

    again = await Migration(redis_url, kafka_url, topic, batch_size=10).run(idle_seconds=0.3)
    assert again.resumed and again.copied == 0  # re-running a finished migration is a no-op


@pytest.mark.integration
async def test_legacy_entries_are_converted_with_stable_ids_into_postgres(redis_url, pg_url, topic):
    r = aredis.Redis.from_url(plain(redis_url))
    key = PrismClient(redis_url).backend.key(topic)
    await r.xadd(key, {"data": b'{"meta":{"message_id":"legacy-1","correlation_id":"c"},"payload":{"n":1}}'})
    await r.xadd(key, {"data": b'{"payload":{"n":2}}'})               # no id: derived from the entry id
    await r.xadd(key, {"order_id": b"3", "status": b"paid"})            # a multi-field legacy entry
    async with PrismClient(redis_url, namespace="shop") as client:
        prism_id = await client.publish(topic, {"n": 4})
    await r.aclose()

    first = await Migration(redis_url, pg_url, topic, group="run-1", namespace="shop").run(idle_seconds=0.2)
    second = await Migration(redis_url, pg_url, topic, group="run-2", namespace="shop").run(idle_seconds=0.2)
    assert first.copied == second.copied == 4 and first.legacy_converted == 3

    async with PrismClient(pg_url, namespace="readers") as reader, \
            reader.subscribe(topic, group="g") as sub, asyncio.timeout(20):
        got = await sub.receive_batch(10, timeout=5)
        assert await sub.receive_batch(10, timeout=0.5) == []  # the second run inserted nothing new
    by_payload = {json.dumps(m.payload(), sort_keys=True): m for m in got}
    assert set(by_payload) == {'{"n": 1}', '{"n": 2}', '{"order_id": "3", "status": "paid"}', '{"n": 4}'}
    assert by_payload['{"n": 1}'].message_id == "legacy-1"
    assert by_payload['{"n": 4}'].message_id == prism_id
    assert by_payload['{"n": 2}'].namespace == "shop" and by_payload['{"n": 2}'].topic == topic


def test_migration_refuses_unsupported_pairs():
    with pytest.raises(ConfigError, match="source must be a Redis stream"):
        Migration("kafka://h:9092", "redis://h", "t")
    with pytest.raises(ConfigError, match="target must be"):
        Migration("redis://h", "redis://h", "t")

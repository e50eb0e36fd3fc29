"""ack/nack redelivery semantics, the same contract on every backend, plus each backend's
own mechanics (Kafka seek-back, Redis pending/claim, JetStream NAK, PostgreSQL row locks)."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from app.sdk import PrismClient

pytestmark = pytest.mark.integration


async def drain(sub, wait: float = 1.5) -> list:
    """Everything the subscription still delivers within `wait` seconds (acked)."""
    out = []
    while True:
        msg = await sub.receive(timeout=wait)
        if msg is None:
            return out
        out.append(msg.payload())
        await msg.ack()


async def test_nack_redelivers_ack_settles_and_close_returns_unsettled(backend_url, topic):
    async with PrismClient(backend_url, namespace="acks") as client:
        await client.publish_batch([(topic, {"n": "a"}), (topic, {"n": "b"})])
        async with asyncio.timeout(30):
            async with client.subscribe(topic, group="workers") as sub:
                first = await sub.receive(timeout=10)
                assert first.payload() == {"n": "a"}
                await first.nack()
                seen = Counter()
                while seen["a"] < 1 or seen["b"] < 1:
                    msg = await sub.receive(timeout=10)
                    assert msg is not None, f"only got {dict(seen)} after a nack"
                    seen[msg.payload()["n"]] += 1
                    await msg.ack()
                assert seen == Counter({"a": 1, "b": 1})  # a came back once, b was not duplicated

            await client.publish(topic, {"n": "c"})
            async with client.subscribe(topic, group="workers") as sub:
                held = await sub.receive(timeout=10)
                assert held.payload() == {"n": "c"}  # a and b were acked: never again
                # closing with `held` unsettled gives it back to the backend

            async with client.subscribe(topic, group="workers") as sub:
                again = await sub.receive(timeout=10)
                assert again is not None and again.message_id == held.message_id
                await again.ack()
                assert await drain(sub, wait=1.0) == []


async def test_kafka_nack_rewinds_the_partition_and_commits_only_a_contiguous_prefix(kafka_url, topic):
    async with PrismClient(kafka_url, namespace="acks") as client:
        await client.publish_batch([(topic, {"i": i}) for i in range(5)])
        async with asyncio.timeout(30):
            async with client.subscribe(topic, group="g") as sub:
                batch = await sub.receive_batch(5, timeout=10)
                while len(batch) < 5:
                    batch += await sub.receive_batch(5 - len(batch), timeout=5)
                assert [m.payload()["i"] for m in batch] == [0, 1, 2, 3, 4]
                await batch[0].ack()
                await batch[3].ack()      # not committed yet: 1 and 2 are still open
                await batch[2].nack()     # rewinds to offset 2: 2, 3, 4 come again
                again = [await sub.receive(timeout=10) for _ in range(3)]
                assert [m.payload()["i"] for m in again] == [2, 3, 4]
                await batch[4].ack()      # a stale delivery: ignored
                # commit stops before offset 1, which is still unsettled
            async with client.subscribe(topic, group="g") as sub:
                redelivered = await sub.receive_batch(5, timeout=10)
                while len(redelivered) < 4:
                    redelivered += await sub.receive_batch(5, timeout=5)
                assert [m.payload()["i"] for m in redelivered] == [1, 2, 3, 4]
                for m in redelivered:
                    await m.ack()
            async with client.subscribe(topic, group="g") as sub:
                assert await drain(sub, wait=1.0) == []


async def test_redis_marks_redeliveries_and_claims_from_a_dead_consumer(redis_url, topic):
    async with PrismClient(redis_url, namespace="acks") as client:
        await client.publish(topic, {"n": 1})
        async with asyncio.timeout(30):
            crashed = client.subscribe(topic, group="g")
            msg = await crashed.receive(timeout=5)
            assert msg is not None and not msg.redelivered
            crashed._closed = True  # the process "dies": no close(), nothing settled

            async with client.subscribe(topic, group="g") as sub:  # claim_idle_ms=2000 in the fixture URL
                claimed = await sub.receive(timeout=1)
                while claimed is None:
                    claimed = await sub.receive(timeout=1)
                assert claimed.message_id == msg.message_id and claimed.redelivered
                await claimed.ack()
            pending = await client.backend.client.xpending(client.backend.key(topic), "g")
            assert pending["pending"] == 0


async def test_nats_nak_is_a_redelivery(nats_url, topic):
    async with PrismClient(nats_url, namespace="acks") as client:
        await client.publish(topic, {"n": 1})
        async with asyncio.timeout(20), client.subscribe(topic, group="g") as sub:
            msg = await sub.receive(timeout=5)
            await msg.nack()
            again = await sub.receive(timeout=5)
            assert again.message_id == msg.message_id and again.redelivered
            await again.ack()
            assert await drain(sub, wait=1.0) == []


async def test_postgres_competing_consumers_never_share_a_row(pg_url, topic):
    async with PrismClient(pg_url, namespace="acks") as client:
        await client.publish_batch([(topic, {"i": i}) for i in range(6)])
        async with asyncio.timeout(20):
            one = client.subscribe(topic, group="g", batch_size=3)
            two = client.subscribe(topic, group="g", batch_size=3)
            a = await one.receive_batch(3, timeout=5)
            b = await two.receive_batch(3, timeout=5)
            assert sorted(m.payload()["i"] for m in a + b) == [0, 1, 2, 3, 4, 5]  # SKIP LOCKED
            for m in a:
                await m.ack()
            await b[0].ack()
            await b[1].nack()
            await b[2].ack()  # batch settled: commit, the nacked row is free again
            back = await one.receive(timeout=5)
            assert back.message_id == b[1].message_id
            await back.ack()
            await one.close()
            await two.close()
        conn = client.backend._pub
        rows = await (await conn.execute("SELECT count(*) AS n FROM prism_events WHERE topic = %s AND consumed",
                                         (topic,))).fetchone()
        assert rows["n"] == 6


async def test_an_unreadable_record_is_handed_to_the_consumer_to_drop(kafka_url, topic):
    from app.bindings import kafka as kb
    from app.errors import BindingError

    async with PrismClient(kafka_url, namespace="acks") as client:
        good = client.build_envelope(topic, {"n": "good"})
        rec = kb.encode(client.build_envelope(topic, {"n": "relabelled"}))
        forged = [(n, b"someone-else" if n == "prism-message-id" else v) for n, v in rec.headers]
        await client.backend.ensure_topic(topic)
        await client.backend._producer.send_and_wait(topic, rec.value, headers=forged)
        await client.publish_envelope(good)
        async with asyncio.timeout(20), client.subscribe(topic, group="g") as sub:
            with pytest.raises(BindingError, match="prism-message-id") as info:
                await sub.receive(timeout=10)
            assert info.value.delivery.ref == "0:0"
            await info.value.delivery.ack()  # dropped (after dead-lettering it, in real life)
            nxt = await sub.receive(timeout=10)
            assert nxt.message_id == good.message_id
            await nxt.ack()
        async with asyncio.timeout(20), client.subscribe(topic, group="g") as sub:
            assert await drain(sub, wait=1.0) == []  # both offsets committed

"""`SyncPrismClient`: the same API, blocking, from plain code, threads and running loops."""

from __future__ import annotations

import asyncio
import threading

import pytest

from app.errors import ConfigError, SchemaAssertionError
from app.sdk import PrismPublishOptions, SyncPrismClient

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("name", ["redis", "kafka"])
def test_sync_publish_subscribe_ack_nack(name, request, topic):
    url = request.getfixturevalue(f"{name}_url")
    with SyncPrismClient(url, namespace="sync") as client:
        ids = [client.publish(topic, {"i": 0}, PrismPublishOptions(priority=7))]
        ids += client.publish_batch([(topic, {"i": 1}), (topic, {"i": 2})])
        seen = []
        with client.subscribe(topic, group="sync-workers") as sub:
            nacked = False
            for msg in sub:
                if msg.payload()["i"] == 1 and not nacked:
                    msg.nack()
                    nacked = True
                    continue
                seen.append(msg.message_id)
                msg.ack()
                if len(seen) == 3:
                    break
        assert sorted(seen) == sorted(ids)
        with client.subscribe(topic, group="sync-workers") as sub:
            assert sub.receive(timeout=1.0) is None  # everything was acked
    with pytest.raises(ConfigError, match="closed"):
        client.publish(topic, {"late": True})


def test_sync_client_from_threads_and_inside_a_running_loop(redis_url, topic):
    client = SyncPrismClient(redis_url, namespace="sync")
    try:
        ids: list[str] = []
        lock = threading.Lock()

        def worker(n: int) -> None:
            for i in range(5):
                mid = client.publish(topic, {"thread": n, "i": i})
                with lock:
                    ids.append(mid)

        threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

        async def inside_a_loop() -> str:
            return client.publish(topic, {"from": "a running loop"})  # blocks this loop, does not nest it

        ids.append(asyncio.run(inside_a_loop()))
        sub = client.subscribe(topic, group="g", expected_version="v9")
        got = []
        while len(got) < len(ids):
            with pytest.raises(SchemaAssertionError) as info:  # no schema context: every message mismatches
                sub.receive(timeout=5)
            got.append(info.value.delivery.message_id)
            info.value.delivery.ack()  # the error's delivery is the blocking wrapper
        assert sorted(got) == sorted(ids) and len(set(got)) == 21
        sub.close()
    finally:
        client.close()
        client.close()  # idempotent


def test_sync_commit_makes_the_acks_durable_before_it_returns(kafka_url, topic):
    """Kafka acks wait for the background commit (`commit_interval_ms`, 5 minutes here);
    `commit()` sends them at once."""
    with SyncPrismClient(kafka_url + "&commit_interval_ms=300000", namespace="sync") as client:
        client.publish_batch([(topic, {"i": i}) for i in range(3)])
        with client.subscribe(topic, group="sync-committer") as sub:
            msgs = sub.receive_batch(3, timeout=10)
            while len(msgs) < 3:
                msgs += sub.receive_batch(3 - len(msgs), timeout=5)
            for msg in msgs:
                msg.ack()
            consumer, tp = sub._sub._inner.consumer, msgs[0].received._delivery.tp
            assert client._loop.run(consumer.committed(tp)) is None
            sub.commit()
            assert client._loop.run(consumer.committed(tp)) == 3

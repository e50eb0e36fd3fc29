"""The Kafka backend's consumer (app/sdk/backends/kafka.py): acks recorded in memory and
committed in batches, only ever the contiguous acked prefix, committed before a partition is
revoked and on close, redelivered after a kill -9 between ack and commit; `read_committed`
by default. Each broker test runs on the embedded broker and on Apache Kafka (`any_broker`).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from app.errors import ConfigError
from app.sdk import PrismClient
from app.sdk.options import PrismPublishOptions
from tests.brokers import BrokerUnderTest

ROOT = Path(__file__).resolve().parents[2]
NEVER_MS = 300_000  # a commit interval no test outlives: commits then come only from what the test does


def url_of(broker: BrokerUnderTest, extra: str = "") -> str:
    """The SDK URL of `broker`. Apache Kafka refuses session timeouts under its
    `group.min.session.timeout.ms` (6 s); the embedded broker holds a new group's first join for
    half the session timeout, so it gets a short one."""
    params = "session_timeout_ms=2000&heartbeat_interval_ms=500" if broker.embedded else \
        "session_timeout_ms=6000&heartbeat_interval_ms=1000"
    return f"kafka://{broker.bootstrap}?{params}{extra}"


def group() -> str:
    return f"g-{uuid.uuid4().hex[:10]}"


def count_commits(sub: Any) -> list[dict[Any, int]]:
    """Every OffsetCommit the subscription's consumer sends from now on, as the offsets it
    carries (the wrapper sits on aiokafka's `commit`, below the SDK)."""
    consumer = sub._inner.consumer
    calls: list[dict[Any, int]] = []
    real = consumer.commit

    async def commit(offsets: Any = None) -> Any:
        calls.append(dict(offsets or {}))
        return await real(offsets)

    consumer.commit = commit
    return calls


async def receive(sub: Any, n: int) -> list[Any]:
    got: list[Any] = []
    while len(got) < n:
        got += await sub.receive_batch(n - len(got), timeout=5)
    return got


async def drain(sub: Any, wait: float = 1.5) -> list[Any]:
    """Everything the subscription still delivers within `wait` seconds of quiet (acked)."""
    out = []
    while (msg := await sub.receive(timeout=wait)) is not None:
        out.append(msg)
        await msg.ack()
    return out


async def committed(bootstrap: str, grp: str, topic: str, partition: int = 0) -> int | None:
    """The group's committed offset as the broker has it (an OffsetFetch from a consumer that
    never joins the group)."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=grp, enable_auto_commit=False)
    await consumer.start()
    try:
        return await consumer.committed(TopicPartition(topic, partition))
    finally:
        await consumer.stop()


async def until(what: str, check: Callable[[], Awaitable[bool]], timeout: float = 30) -> None:
    """Poll `check` until it holds; fail with `what` after `timeout` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not await check():
        if loop.time() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(0.05)


# --------------------------------------------------------------------------- options


@pytest.mark.parametrize("query", ["commit_interval_ms=5", "commit_interval_ms=300001", "commit_interval_ms=x",
                                   "isolation_level=serializable", "isolation_level=READ_COMMITTED"])
def test_bad_url_options_are_refused_when_the_client_is_created(query: str) -> None:
    with pytest.raises(ConfigError) as info:
        PrismClient(f"kafka://127.0.0.1:9?{query}")
    assert query.partition("=")[0] in str(info.value)


@pytest.mark.parametrize("kwargs", [{"commit_interval_ms": 0}, {"commit_interval_ms": 9},
                                    {"commit_interval_ms": "500"}, {"commit_interval_ms": True},
                                    {"commit_interval_ms": 2.5}, {"commit_every": 0}, {"commit_every": -1},
                                    {"commit_every": "10"}, {"isolation_level": "dirty"},
                                    {"isolation_level": ""},
                                    # a NaN poll interval made `async for` poll without ever waiting
                                    {"poll_interval": float("nan")}, {"poll_interval": 0}, {"poll_interval": -1},
                                    {"poll_interval": float("inf")}, {"poll_interval": "1"},
                                    {"ack_wait_s": float("nan")}, {"ack_wait_s": 0}, {"claim_idle_ms": 0},
                                    {"claim_idle_ms": 1.5}, {"claim_idle_ms": True}])
def test_bad_subscribe_options_are_refused(kwargs: dict[str, Any]) -> None:
    client = PrismClient("kafka://127.0.0.1:9")
    with pytest.raises(ConfigError) as info:
        client.subscribe("t", group="g", **kwargs)
    name = next(iter(kwargs))
    assert f"subscribe({name}=)" in str(info.value)


@pytest.mark.parametrize(("args", "where"), [((0, 1.0), "receive_batch(max_messages=)"),
                                             ((1, float("nan")), "receive(timeout=)"),
                                             ((1, -0.5), "receive(timeout=)"),
                                             ((1, float("inf")), "receive(timeout=)")])
async def test_bad_receive_arguments_are_refused_before_anything_is_fetched(args: tuple[Any, Any],
                                                                            where: str) -> None:
    """Refused before the subscription starts (no broker listens at port 9): a NaN time-out
    never passed its deadline and polled without waiting."""
    sub = PrismClient("kafka://127.0.0.1:9").subscribe("t", group="g")
    with pytest.raises(ConfigError) as info:
        await sub.receive_batch(*args)
    assert where in str(info.value) and sub._inner is None


def test_read_committed_is_the_default_and_both_places_can_change_it() -> None:
    client = PrismClient("kafka://127.0.0.1:9")
    assert client.backend.subscription("t", client.subscribe("t", group="g").settings).isolation_level == \
        "read_committed"
    assert client.backend.commit_interval_ms == 500
    other = PrismClient("kafka://127.0.0.1:9?isolation_level=read_uncommitted&commit_interval_ms=250")
    inner = other.backend.subscription("t", other.subscribe("t", group="g").settings)
    assert (inner.isolation_level, inner.commit_interval_s) == ("read_uncommitted", 0.25)
    inner = other.backend.subscription(
        "t", other.subscribe("t", group="g", isolation_level="read_committed", commit_interval_ms=1000).settings)
    assert (inner.isolation_level, inner.commit_interval_s) == ("read_committed", 1.0)


async def test_the_producer_places_keys_with_the_compiled_hash_partitioner(monkeypatch: pytest.MonkeyPatch) -> None:
    """The SDK's producer gets `app.bindings.partitioner.Partitioner` (aiokafka's placement, the
    hash compiled when prism_native is in use; tests/bindings/test_partitioner.py proves the
    placement the same), and nothing else of its settings changes."""
    import aiokafka

    from app.bindings.partitioner import Partitioner

    made: list[dict[str, Any]] = []

    class Producer:
        def __init__(self, **kwargs: Any) -> None:
            made.append(kwargs)

        async def start(self) -> None:
            pass

    monkeypatch.setattr(aiokafka, "AIOKafkaProducer", Producer)
    client = PrismClient("kafka://127.0.0.1:9?linger_ms=3&acks=1")
    await client.backend.connect()
    (kwargs,) = made
    assert type(kwargs.pop("partitioner")) is Partitioner
    assert kwargs == {"bootstrap_servers": "127.0.0.1:9", "acks": 1, "linger_ms": 3, "enable_idempotence": False}


# --------------------------------------------------------------------------- batched commits

integration = pytest.mark.integration


@integration
async def test_acks_send_nothing_and_the_background_commit_sends_them_together(any_broker, topic):
    n = 300
    url = url_of(any_broker, "&commit_interval_ms=200")
    async with PrismClient(url, namespace="acks") as client:
        await client.publish_batch([(topic, {"i": i}) for i in range(n)])
        grp = group()
        async with asyncio.timeout(90), client.subscribe(topic, group=grp) as sub:
            msgs = await receive(sub, n)
            calls = count_commits(sub)
            for m in msgs:
                await m.ack()
            assert calls == []  # 300 acks, not one round trip among them
            await until("the background commit of all 300 acks",
                        lambda: _committed_is(any_broker.bootstrap, grp, topic, n))
            assert 1 <= len(calls) <= 3, calls  # one commit carries them all (3: a slow broker's retries)
            assert calls[-1] == {msgs[0]._delivery.tp: n}
        async with asyncio.timeout(30), client.subscribe(topic, group=grp) as sub:
            assert await drain(sub, wait=1.0) == []


async def _committed_is(bootstrap: str, grp: str, topic: str, offset: int) -> bool:
    return await committed(bootstrap, grp, topic) == offset


@integration
async def test_commit_every_n_acks_and_an_explicit_commit(any_broker, topic):
    url = url_of(any_broker, f"&commit_interval_ms={NEVER_MS}")
    async with PrismClient(url, namespace="acks") as client:
        await client.publish_batch([(topic, {"i": i}) for i in range(40)])
        grp = group()
        async with asyncio.timeout(90), client.subscribe(topic, group=grp, commit_every=10) as sub:
            msgs = await receive(sub, 40)
            calls = count_commits(sub)
            for m in msgs[:25]:
                await m.ack()
            assert calls == []
            await until("the commit after 10 acks", lambda: _committed_is(any_broker.bootstrap, grp, topic, 25))
            assert len(calls) == 1
            for m in msgs[25:30]:  # fewer than commit_every: they wait for the timer...
                await m.ack()
            await sub.commit()     # ...or for this: one round trip, done when it returns
            assert len(calls) == 2 and await committed(any_broker.bootstrap, grp, topic) == 30
            await sub.commit()     # nothing new acked: nothing sent
            assert len(calls) == 2


@integration
async def test_an_out_of_order_ack_never_commits_past_an_unacked_message(any_broker, topic):
    url = url_of(any_broker, f"&commit_interval_ms={NEVER_MS}")
    async with PrismClient(url, namespace="acks") as client:
        await client.publish_batch([(topic, {"i": i}) for i in range(5)])
        grp = group()
        async with asyncio.timeout(90):
            async with client.subscribe(topic, group=grp) as sub:
                msgs = await receive(sub, 5)
                calls = count_commits(sub)
                for i in (4, 3, 1):
                    await msgs[i].ack()
                await sub.commit()
                assert calls == [] and await committed(any_broker.bootstrap, grp, topic) is None  # 0 is open
                await msgs[0].ack()
                await sub.commit()
                assert await committed(any_broker.bootstrap, grp, topic) == 2  # 0 and 1; 2 is open
                # closing commits again (nothing new) and leaves 2 unsettled: 2, 3 and 4 come back
            assert calls == [{msgs[0]._delivery.tp: 2}]
            async with client.subscribe(topic, group=grp) as sub:
                again = await drain(sub)
                assert [m.payload()["i"] for m in again] == [2, 3, 4]


@integration
async def test_close_commits_what_was_acked(any_broker, topic):
    url = url_of(any_broker, f"&commit_interval_ms={NEVER_MS}")
    async with PrismClient(url, namespace="acks") as client:
        await client.publish_batch([(topic, {"i": i}) for i in range(6)])
        grp = group()
        async with asyncio.timeout(90):
            async with client.subscribe(topic, group=grp) as sub:
                for m in await receive(sub, 4):
                    await m.ack()
            assert await committed(any_broker.bootstrap, grp, topic) == 4
            async with client.subscribe(topic, group=grp) as sub:
                assert [m.payload()["i"] for m in await drain(sub)] == [4, 5]


@integration
async def test_a_failed_commit_is_retried_and_an_explicit_one_raises_a_typed_error(kafka_broker, kafka_url, topic,
                                                                                     caplog):
    """The broker refuses a commit (a rebalance, a dropped connection): the background commit
    logs it and sends the same acks on its next tick; `commit()` raises `SubscribeError`."""
    from aiokafka.errors import CommitFailedError, KafkaConnectionError

    from app.errors import SubscribeError

    async with PrismClient(kafka_url + "&commit_interval_ms=50", namespace="acks") as client:
        await client.publish_batch([(topic, {"i": i}) for i in range(10)])
        grp = group()
        async with asyncio.timeout(60), client.subscribe(topic, group=grp) as sub:
            msgs = await receive(sub, 10)
            consumer = sub._inner.consumer
            real, failures = consumer.commit, [KafkaConnectionError("connection reset"), CommitFailedError("rebalanced")]

            async def flaky(offsets: Any = None) -> Any:
                if failures:
                    raise failures.pop(0)
                return await real(offsets)

            consumer.commit = flaky
            for m in msgs[:5]:
                await m.ack()
            await until("the retried commit", lambda: _committed_is(kafka_broker.bootstrap, grp, topic, 5))
            assert failures == [] and "background commit" in caplog.text and "failed" in caplog.text
            failures.append(CommitFailedError("rebalanced"))
            for m in msgs[5:]:
                await m.ack()
            with pytest.raises(SubscribeError, match="committing the acked offsets") as info:
                await sub.commit()
            assert "again" in info.value.hint
            await sub.commit()  # the acks are still recorded: the next commit sends them
            assert await committed(kafka_broker.bootstrap, grp, topic) == 10


@integration
async def test_kill_9_between_ack_and_commit_redelivers_and_loses_nothing(any_broker, topic):
    """A consumer process acks 20 messages, of which the first 8 are committed, and is killed
    with SIGKILL before the other 12 are: the group gets exactly those 12 again."""
    url = url_of(any_broker, f"&commit_interval_ms={NEVER_MS}")
    grp = group()
    async with PrismClient(url, namespace="acks") as client:
        ids = await client.publish_batch([(topic, {"i": i}) for i in range(20)])
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "tests.sdk.kafka_ack_proc", url, topic, grp, "20", "8",
            stdout=asyncio.subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(ROOT)})
        try:
            async with asyncio.timeout(90):
                line = await proc.stdout.readline()
            assert line, f"the consumer process exited ({await proc.wait()}) before acking"
            seen = json.loads(line)
        finally:
            if proc.returncode is None:
                proc.send_signal(signal.SIGKILL)  # between the acks and their commit
            await proc.wait()
        assert seen["committed"] + seen["acked"] == ids
        assert await committed(any_broker.bootstrap, grp, topic) == 8
        async with asyncio.timeout(90), client.subscribe(topic, group=grp) as sub:
            redelivered = await receive(sub, 12)  # after the dead member's session times out
            for m in redelivered:
                await m.ack()
            redelivered += await drain(sub)
        assert [m.message_id for m in redelivered] == seen["acked"]  # all of them, each once, in order
        assert seen["committed"] + [m.message_id for m in redelivered] == ids  # nothing lost


@integration
async def test_a_revoked_partition_is_committed_before_it_goes(any_broker, topic):
    """Consumer A acks everything of both partitions but its timer never fires; B joins the
    group. A's rebalance listener commits before giving a partition up, so B starts after A's
    acks and receives nothing."""
    url = url_of(any_broker, f"&commit_interval_ms={NEVER_MS}&partitions=2")
    grp = group()
    async with PrismClient(url, namespace="acks") as client:
        await client.publish_batch([(topic, {"i": i}, PrismPublishOptions(key=f"k{i}".encode()))
                                    for i in range(20)])
        async with asyncio.timeout(120):
            a = client.subscribe(topic, group=grp)
            msgs = await receive(a, 20)
            calls = count_commits(a)
            for m in msgs:
                await m.ack()
            ends: dict[int, int] = {}
            for m in msgs:
                tp = m._delivery.tp
                ends[tp.partition] = max(ends.get(tp.partition, 0), m._delivery.record.offset + 1)
            assert len(ends) == 2 and calls == []
            b = client.subscribe(topic, group=grp)
            b_task = asyncio.create_task(drain(b, wait=0.5))  # B polls, so it joins

            async def both_committed() -> bool:
                return all([await committed(any_broker.bootstrap, grp, topic, p) == end for p, end in ends.items()])

            await until("A's commit of both partitions on revocation", both_committed, timeout=60)
            assert calls, "the offsets were committed, but not by A's revocation commit"
            assert sum(len(c) for c in calls) == 2
            await until("B's assignment", lambda: _assigned(b))
            assert await b_task == []  # B's first quiet 0.5 s may end before it joined...
            assert await drain(b, wait=1.5) == []  # ...so it drains again, assigned: nothing after A's acks
            await b.close()
            await a.close()


async def _assigned(sub: Any) -> bool:
    return sub._inner is not None and bool(sub._inner.consumer.assignment())


# --------------------------------------------------------------------------- isolation (Apache Kafka)


@integration
async def test_read_committed_hides_aborted_transactions(kafka, topic):
    """An exactly_once worker's aborted batch: a transactional producer writes three envelopes
    and aborts, then two and commits. The default subscription reads the two; one with
    `read_uncommitted` reads all five."""
    from aiokafka import AIOKafkaProducer

    from app.bindings import kafka as kb

    async with PrismClient(f"kafka://{kafka.bootstrap}", namespace="eos") as client:
        await client.backend.ensure_topic(topic)
        aborted = [client.build_envelope(topic, {"n": f"aborted-{i}"}) for i in range(3)]
        kept = [client.build_envelope(topic, {"n": f"kept-{i}"}) for i in range(2)]
        producer = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap, transactional_id=f"tx-{uuid.uuid4().hex}")
        await producer.start()
        try:
            for envs, commit in ((aborted, False), (kept, True)):
                await producer.begin_transaction()
                for env in envs:
                    rec = kb.encode(env)
                    await producer.send_and_wait(topic, rec.value, key=rec.key, headers=rec.headers)
                await (producer.commit_transaction() if commit else producer.abort_transaction())
        finally:
            await producer.stop()
        async with asyncio.timeout(90):
            async with client.subscribe(topic, group=group()) as sub:
                assert [m.message_id for m in await drain(sub, wait=3)] == [e.message_id for e in kept]
            async with client.subscribe(topic, group=group(), isolation_level="read_uncommitted") as sub:
                assert [m.message_id for m in await drain(sub, wait=3)] == [e.message_id for e in aborted + kept]

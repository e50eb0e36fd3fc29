"""Kafka backend (aiokafka): `kafka://host:port[,host:port][?param=value...]`.

Records follow `app.bindings.kafka` (envelope value, `prism-*` headers, `traceparent`,
key = correlation id unless given, timestamp = published_at_ms).

URL parameters:

| parameter               | default | meaning                                                       |
|-------------------------|---------|---------------------------------------------------------------|
| `partitions`            | 1       | partitions of topics the SDK creates (existing ones untouched)|
| `create_topics`         | 1       | create a missing topic before first use (0: never)            |
| `acks`                  | all     | producer acks (`all`, `1`, `0`)                               |
| `linger_ms`             | 0       | producer linger                                               |
| `session_timeout_ms`    | 6000    | consumer group session timeout                                |
| `heartbeat_interval_ms` | 1000    | consumer heartbeat                                            |
| `commit_interval_ms`    | 500     | longest wait between an ack and its background commit         |
| `isolation_level`       | read_committed | or `read_uncommitted` (see "Isolation" below)          |
| `security`              | -       | `env`: SASL/SSL from `PRISM_SECURITY_PROTOCOL` & co.          |

Why create topics explicitly: the embedded broker (and many clusters) auto-create a topic
named in a Metadata request with a default partition count, so the first publish or
subscribe would silently decide the partition count. Why a 6 s session timeout: the
embedded broker holds a new group's first join for half of it (docs/platform-notes.md).

Acknowledgements: `ack()` marks the offset done and moves the partition's acked position to
the end of the contiguous prefix of done offsets, in memory, with no I/O; so a commit never
skips a message that is still being processed (an out-of-order ack waits for the ones before
it). A background task commits the acked positions every `commit_interval_ms` (and as soon as
`commit_every` acks are waiting, when set); `Subscription.commit()` flushes them at once, and
they are committed before a partition is revoked (rebalance listener) and on `close()`. Why not
commit on every ack: each commit is a broker round trip, which caps a consumer at one record
per round trip (~150 records/s where a commit takes 6.7 ms) and costs ~230 µs of CPU per record
even on loopback (BENCHMARKS.md); Kafka's own clients commit on a timer too
(`auto.commit.interval.ms`). A crash
between an ack and its commit redelivers the message: at-least-once, as with every backend.
`nack()` seeks the partition back to the message: it and everything after it on that
partition are fetched again (deliveries already handed out for those offsets become stale
and are skipped). A revoked partition's un-acked messages go to its new owner.

Isolation: subscriptions read `read_committed` unless told otherwise (`isolation_level`), so
the records of aborted transactions - an `exactly_once` worker's cut-short batches - are never
handed out. The SDK cannot see the topology that writes a topic, so it does not guess from it;
`read_committed` is harmless on topics written without transactions (it then reads exactly
what `read_uncommitted` reads).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from ...bindings import _common as c
from ...bindings import kafka as kb
from ...broker.metadata import partitions_of
from ...envelope.codec import Layout
from ...envelope.codec import encode as encode_envelope
from ...envelope.model import Envelope
from ...errors import PublishError, SubscribeError
from ...security.signing import VerificationKeys, sign
from .base import (
    DEFAULT_COMMIT_INTERVAL_MS,
    DEFAULT_ISOLATION_LEVEL,
    Backend,
    BackendSubscription,
    Delivery,
    Outgoing,
    PlainTemplates,
    PlainWire,
    RawMessage,
    SubscribeSettings,
    check_commit_interval,
    check_isolation_level,
    int_param,
    redact_url,
    reject_unknown,
    split_url,
)

log = logging.getLogger("prism.sdk.kafka")
_REVIEWED = Layout.REVIEWED
_KNOWN = ("partitions", "create_topics", "acks", "linger_ms", "session_timeout_ms", "heartbeat_interval_ms",
          "commit_interval_ms", "isolation_level", "security")


_ID_HEADER = kb.PREFIX + c.MESSAGE_ID


def _split_id_header(headers: list[tuple[str, bytes]]) -> tuple[tuple[tuple[str, bytes], ...], str,
                                                                  tuple[tuple[str, bytes], ...]]:
    """(headers before the message id's, its name, headers after it) of a plain envelope's
    header list: every other header of a plain envelope depends only on its topic and namespace
    (the same reasoning as `PlainTemplates`)."""
    i = [name for name, _ in headers].index(_ID_HEADER)  # the binding writes it once, always
    return tuple(headers[:i]), _ID_HEADER, tuple(headers[i + 1:])


class KafkaBackend(Backend):
    scheme = "kafka"

    def __init__(self, url: str) -> None:
        super().__init__(url)
        parts, params = split_url(url)
        # the one parser of bootstrap lists (PRISM_BROKER_URL's): `kafka://no such:1` was handed to
        # aiokafka as it was; credentials (never used: security=env) are not a host to check or show
        from ...broker.admin import parse_bootstrap

        self.bootstrap = parse_bootstrap(parts.netloc.rpartition("@")[2], redact_url(url))
        self.partitions = int_param(params, "partitions", 1, url, minimum=1)
        self.create_topics = bool(int_param(params, "create_topics", 1, url))
        acks_raw = params.pop("acks", "all")
        self.acks: Any = "all" if acks_raw == "all" else int_param({"acks": acks_raw}, "acks", 1, url)
        self.linger_ms = int_param(params, "linger_ms", 0, url)
        self.session_timeout_ms = int_param(params, "session_timeout_ms", 6000, url, minimum=1)
        self.heartbeat_interval_ms = int_param(params, "heartbeat_interval_ms", 1000, url, minimum=1)
        self.commit_interval_ms = check_commit_interval(
            int_param(params, "commit_interval_ms", DEFAULT_COMMIT_INTERVAL_MS, url), redact_url(url))
        self.isolation_level = check_isolation_level(params.pop("isolation_level", DEFAULT_ISOLATION_LEVEL),
                                                     redact_url(url))
        self._client_kwargs: dict[str, Any] = {}
        self._settings = None
        if params.pop("security", "") == "env":
            from ...broker.admin import BrokerSettings

            self._settings = BrokerSettings.from_env()
            self._client_kwargs = self._settings.aiokafka_kwargs()
        reject_unknown(params, url, _KNOWN)
        self._producer: Any = None
        self._plain_headers = PlainTemplates(kb.headers_for, [_ID_HEADER], str.encode)
        self._known_topics: set[str] = set()
        self._topic_lock = asyncio.Lock()
        #: (topic, partition) -> offset of the last record this backend produced there.
        self.last_offsets: dict[tuple[str, int], int] = {}

    async def connect(self) -> None:
        from aiokafka import AIOKafkaProducer

        from ...bindings.partitioner import Partitioner

        # Partitioner: aiokafka's default placement with Kafka's key hash compiled when
        # prism_native is in use - the same partition for every key (app/bindings/partitioner.py),
        # ~3.8 µs less per keyed publish of a 36-byte correlation id (issue 29).
        self._producer = AIOKafkaProducer(bootstrap_servers=self.bootstrap, acks=self.acks, linger_ms=self.linger_ms,
                                          enable_idempotence=False, partitioner=Partitioner(),
                                          **self._client_kwargs)
        try:
            await self._producer.start()
        except Exception as exc:
            with contextlib.suppress(Exception):
                await self._producer.stop()
            self._producer = None
            raise PublishError(f"cannot connect to Kafka at {redact_url(self.bootstrap)}: {exc!r}",
                               path=redact_url(self.url), hint="check the URL and that the broker runs") from exc

    async def close(self) -> None:
        if self._producer is not None:
            producer, self._producer = self._producer, None
            await producer.stop()

    async def ensure_topic(self, topic: str) -> None:
        """Create `topic` with `partitions` partitions when missing (once per client)."""
        if not self.create_topics or topic in self._known_topics:
            return
        from ...broker.admin import TopicPartitionMismatch, ensure_topics

        async with self._topic_lock:
            if topic in self._known_topics:
                return
            # An existing topic with another partition count is fine: the SDK never alters topics.
            with contextlib.suppress(TopicPartitionMismatch):
                await ensure_topics(self.bootstrap, {topic: self.partitions}, settings=self._settings)
            self._known_topics.add(topic)

    def _record(self, item: Outgoing) -> kb.KafkaRecord:
        return kb.KafkaRecord(*self._parts(item))

    def _parts(self, item: Outgoing) -> tuple[bytes | None, bytes, list[tuple[str, bytes]], int | None]:
        """(key, value, headers, timestamp_ms) of `kafka.encode`, minus its merge with caller
        headers, which the SDK never passes. A plain envelope (`Outgoing.plain`) has no key
        (no correlation id, no caller key) and re-uses its topic's headers."""
        env = item.envelope
        value = item.wire
        if value is None:
            value = sign(env, item.sign_with, item.layout) if item.sign_with is not None else \
                encode_envelope(env, item.layout)
        ts = env.published_at_ms
        if item.plain:
            return None, value, self._plain_headers.get(env, item.layout), ts if ts > 0 else None
        return kb.partition_key(env, item.key), value, kb.headers_for(env, item.layout), ts if ts > 0 else None

    async def publish(self, items: Sequence[Outgoing]) -> None:
        if self._producer is None:
            raise PublishError("the Kafka backend is not connected", hint="use the client inside `async with`")
        for topic in {i.topic for i in items}:
            if topic not in self._known_topics:  # ensure_topic's own first check, without a coroutine
                await self.ensure_topic(topic)
        try:
            if len(items) == 1:
                item = items[0]
                key, value, headers, ts = self._parts(item)
                md = await self._producer.send_and_wait(item.topic, value, key=key, headers=headers,
                                                        timestamp_ms=ts)
                self.last_offsets[(item.topic, md.partition)] = md.offset
                return
            futures = []
            for item in items:
                rec = self._record(item)
                futures.append(await self._producer.send(item.topic, rec.value, key=rec.key, headers=rec.headers,
                                                         timestamp_ms=rec.timestamp_ms))
            for item, md in zip(items, await asyncio.gather(*futures), strict=True):
                key = (item.topic, md.partition)
                self.last_offsets[key] = max(md.offset, self.last_offsets.get(key, -1))
        except PublishError:
            raise
        except Exception as exc:
            raise PublishError(f"Kafka did not confirm the publish: {exc!r}", path=redact_url(self.url),
                               hint="the message may or may not be stored; retry with the same message_id") from exc

    async def publish_plain(self, plain: PlainWire, message_id: bytes, ms: int, wire: bytes,  # type: ignore[override]
                            value: bytes) -> None:
        """`publish([Outgoing(topic, env, Layout.REVIEWED, wire=wire, plain=True)])` of the plain
        envelope `plain.envelope(message_id, ms, value)`: the same record (`_parts` of that item;
        tests/sdk/test_publish_path.py), without the envelope object, the list, the `Outgoing`
        and the batch branches (issue 29: the default publish's hot path).

        The binding's headers come from `plain.kafka_headers`, the topic's header list split around
        the message id (`_split_id_header`, built by `kb.headers_for` on the first publish), so
        a publish builds one list and one tuple for them. `producer.send` then its future is
        `send_and_wait` without its extra coroutine."""
        topic = plain.topic
        if topic not in self._known_topics:
            await self.ensure_topic(topic)
        producer = self._producer
        if producer is None:
            raise PublishError("the Kafka backend is not connected", hint="use the client inside `async with`")
        split = plain.kafka_headers
        if split is None:
            split = plain.kafka_headers = _split_id_header(
                kb.headers_for(plain.envelope(message_id.decode(), ms, value), _REVIEWED))
        before, name, after = split
        try:
            md = await (await producer.send(topic, wire, headers=[*before, (name, message_id), *after],
                                            timestamp_ms=ms if ms > 0 else None))
        except Exception as exc:
            raise PublishError(f"Kafka did not confirm the publish: {exc!r}", path=redact_url(self.url),
                               hint="the message may or may not be stored; retry with the same message_id") from exc
        self.last_offsets[(topic, md.partition)] = md.offset

    async def publish_bytes(self, topic: str, value: bytes) -> None:
        await self.ensure_topic(topic)
        await self._producer.send_and_wait(topic, value)

    def subscription(self, topic: str, settings: SubscribeSettings) -> BackendSubscription:
        return _KafkaSubscription(self, topic, settings)

    def consumer(self, **kwargs: Any) -> Any:
        from aiokafka import AIOKafkaConsumer

        return AIOKafkaConsumer(bootstrap_servers=self.bootstrap, enable_auto_commit=False,
                                auto_offset_reset="earliest", **self._client_kwargs, **kwargs)

    async def topic_exists(self, topic: str) -> bool:
        consumer = self.consumer(group_id=None)
        await consumer.start()
        try:
            return bool(await partitions_of(consumer, topic))  # a metadata fetch never creates it
        finally:
            await consumer.stop()

    async def sample(self, topic: str, limit: int) -> list[RawMessage]:
        records = await read_partitions(self, topic, None, limit=limit)
        return [RawMessage(bytes(r.value or b""), [(n, bytes(v or b"")) for n, v in r.headers or ()],
                           f"{r.partition}:{r.offset}") for r in records]


async def read_partitions(backend: KafkaBackend, topic: str, start: dict[int, int] | None, *,
                          limit: int | None = None, idle_polls: int = 3) -> list[Any]:
    """Read `topic` from `start` (partition -> offset; None: the beginning) to its current end.

    The end is the high watermark seen in fetch responses, not ListOffsets, which the
    embedded broker answers wrongly (docs/platform-notes.md). A partition counts as finished when
    its position reached that watermark, or after `idle_polls` empty polls.
    """
    from aiokafka import TopicPartition

    consumer = backend.consumer(group_id=None)
    await consumer.start()
    out: list[Any] = []
    try:
        parts = sorted(await partitions_of(consumer, topic))  # never auto-creates the topic
        if not parts:
            return out
        tps = [TopicPartition(topic, p) for p in parts]
        consumer.assign(tps)
        for tp in tps:
            if start and tp.partition in start:
                consumer.seek(tp, start[tp.partition])
            else:
                await consumer.seek_to_beginning(tp)
        empty = 0
        while tps and empty < idle_polls and (limit is None or len(out) < limit):
            batch = await consumer.getmany(timeout_ms=300, max_records=None if limit is None else limit - len(out))
            got = sum(len(v) for v in batch.values())
            for recs in batch.values():
                out.extend(recs)
            empty = 0 if got else empty + 1
            done = True
            for tp in tps:
                hw = consumer.highwater(tp)
                if hw is None or await consumer.position(tp) < hw:
                    done = False
            if done:
                break
    finally:
        await consumer.stop()
    out.sort(key=lambda r: (r.partition, r.offset))
    return out if limit is None else out[:limit]


class _PartitionState:
    __slots__ = ("acked_to", "committed", "epoch", "pending")

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch
        #: offset -> [epoch delivered in, acked?], in delivery (= offset) order.
        self.pending: OrderedDict[int, list[Any]] = OrderedDict()
        #: the offset to commit: one past the contiguous acked prefix (None: nothing acked yet).
        self.acked_to: int | None = None
        #: the offset this subscription last committed for the partition.
        self.committed: int | None = None


class _KafkaDelivery(Delivery):
    backend = "kafka"
    __slots__ = ("epoch", "record", "sub", "tp")

    def __init__(self, sub: _KafkaSubscription, tp: Any, record: Any, epoch: int) -> None:
        self.sub, self.tp, self.record, self.epoch = sub, tp, record, epoch

    def decode(self, verify_with: VerificationKeys | None) -> Envelope:
        return kb.decode(self.record, verify_with=verify_with)

    @property
    def stale(self) -> bool:
        st = self.sub.states.get(self.tp)
        entry = st.pending.get(self.record.offset) if st is not None else None
        return entry is None or entry[0] != self.epoch

    @property
    def ref(self) -> str:
        return f"{self.tp.partition}:{self.record.offset}"

    def header(self, name: str) -> bytes | None:
        for key, value in self.record.headers or ():
            if key.lower() == name:
                return bytes(value) if value is not None else None
        return None

    async def ack(self) -> None:
        self.sub.ack(self)

    async def nack(self) -> None:
        self.sub.nack(self)


class _KafkaSubscription(BackendSubscription):
    """One consumer-group member. Acks only move in-memory positions; `_committer` (a task
    of this subscription) commits them, and so do `commit()`, the rebalance listener before a
    partition goes, and `close()`. Every commit runs under `_commit_lock`, one at a time."""

    def __init__(self, backend: KafkaBackend, topic: str, settings: SubscribeSettings) -> None:
        self.backend, self.topic, self.settings = backend, topic, settings
        self.states: dict[Any, _PartitionState] = {}
        self.consumer: Any = None
        self.commit_interval_s = (settings.commit_interval_ms or backend.commit_interval_ms) / 1000
        self.commit_every = settings.commit_every
        self.isolation_level = settings.isolation_level or backend.isolation_level
        #: commit requests sent (OffsetCommit round trips) and acks since the last one
        self.commit_requests = 0
        self._acks_waiting = 0
        self._epochs = itertools.count()
        self._commit_lock = asyncio.Lock()
        self._wake = asyncio.Event()
        self._committer: asyncio.Task[None] | None = None
        self._closing = False

    def _state(self, tp: Any) -> _PartitionState:
        st = self.states.get(tp)
        if st is None:
            # A fresh epoch per state: deliveries from before a partition was revoked and
            # assigned again are stale, never mistaken for the new ones at the same offsets.
            st = self.states[tp] = _PartitionState(next(self._epochs))
        return st

    async def start(self) -> None:
        from aiokafka import ConsumerRebalanceListener

        sub = self

        class _Listener(ConsumerRebalanceListener):
            async def on_partitions_revoked(self, revoked: Any) -> None:
                # Commit what was acked before the partitions go: their new owner starts there.
                mine = [tp for tp in revoked if tp in sub.states]
                if mine:
                    try:
                        await sub._commit(mine)
                    except Exception as exc:
                        log.warning("committing acked offsets of %s before they were revoked failed (%r); "
                                    "their new owner gets those messages again", mine, exc)
                for tp in revoked:
                    sub.states.pop(tp, None)

            async def on_partitions_assigned(self, assigned: Any) -> None:
                for tp in assigned:
                    sub._state(tp)

        await self.backend.ensure_topic(self.topic)
        b = self.backend
        self.consumer = b.consumer(group_id=self.settings.group, session_timeout_ms=b.session_timeout_ms,
                                   heartbeat_interval_ms=min(b.heartbeat_interval_ms, b.session_timeout_ms // 3 or 1),
                                   max_poll_records=self.settings.batch_size, isolation_level=self.isolation_level)
        try:
            await self.consumer.start()
            self.consumer.subscribe([self.topic], listener=_Listener())
        except Exception as exc:
            await self.close()
            raise SubscribeError(f"cannot subscribe to Kafka topic {self.topic!r}: {exc!r}",
                                 path=redact_url(b.url), hint="check the URL and that the broker runs") from exc
        self._committer = asyncio.create_task(self._commit_loop(), name=f"prism-sdk-commit:{self.topic}")

    async def fetch(self, max_messages: int, timeout: float) -> list[Delivery]:
        try:
            batch = await self.consumer.getmany(timeout_ms=int(timeout * 1000), max_records=max_messages)
        except Exception as exc:
            raise SubscribeError(f"fetching from Kafka topic {self.topic!r} failed: {exc!r}") from exc
        out: list[Delivery] = []
        for tp, records in batch.items():
            st = self._state(tp)
            epoch, pending = st.epoch, st.pending
            for rec in records:
                pending[rec.offset] = [epoch, False]
                out.append(_KafkaDelivery(self, tp, rec, epoch))
        return out  # per-partition order kept: Kafka orders nothing across partitions

    def ack(self, d: _KafkaDelivery) -> None:
        """Mark `d` done and advance its partition's acked position over the contiguous done
        prefix - no I/O; the committer sends it."""
        st = self.states.get(d.tp)
        entry = st.pending.get(d.record.offset) if st is not None else None
        if st is None or entry is None or entry[0] != d.epoch:
            return  # re-queued by a nack or a rebalance: the new delivery is the one to ack
        entry[1] = True
        pending = st.pending
        acked_to = None
        while pending:
            offset, (_, done) = next(iter(pending.items()))
            if not done:
                break
            pending.popitem(last=False)
            acked_to = offset + 1
        if acked_to is not None:
            st.acked_to = acked_to  # only ever grows: the prefix only moves forward
        self._acks_waiting += 1
        if self.commit_every is not None and self._acks_waiting >= self.commit_every:
            self._wake.set()

    def nack(self, d: _KafkaDelivery) -> None:
        st = self.states.get(d.tp)
        entry = st.pending.get(d.record.offset) if st is not None else None
        if st is None or entry is None or entry[0] != d.epoch:
            return
        st.epoch = next(self._epochs)
        for offset in [o for o in st.pending if o >= d.record.offset]:
            del st.pending[offset]
        self.consumer.seek(d.tp, d.record.offset)

    async def _commit(self, only: Any = None) -> int:
        """Commit the acked positions that moved since their last commit (of the partitions
        in `only`, default all); returns how many partitions were committed. Raises what
        aiokafka raises (`CommitFailedError` after a rebalance, connection errors)."""
        async with self._commit_lock:
            consumer = self.consumer
            if consumer is None:
                return 0
            assigned = consumer.assignment()
            offsets = {tp: st.acked_to for tp, st in self.states.items()
                       if st.acked_to is not None and st.acked_to != st.committed and tp in assigned
                       and (only is None or tp in only)}
            if not offsets:
                return 0
            if only is None:
                self._acks_waiting = 0
            self.commit_requests += 1
            await consumer.commit(offsets)
            for tp, offset in offsets.items():
                st = self.states.get(tp)
                if st is not None:
                    st.committed = offset
            return len(offsets)

    async def _commit_loop(self) -> None:
        """Commit every `commit_interval_s`, or sooner when `commit_every` acks are waiting.
        A failed commit is logged and tried again next time: its offsets are still acked in
        memory, and a revoked partition's are dropped by the listener (its new owner reads
        them again - at-least-once)."""
        failures = 0
        while not self._closing:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.commit_interval_s):
                    await self._wake.wait()
            self._wake.clear()
            try:
                await self._commit()
                failures = 0
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                failures += 1
                if failures == 1 or failures % 100 == 0:
                    log.warning("background commit of %s for group %r failed (%r), %d time(s) in a row; "
                                "acked offsets stay pending and are committed on the next try",
                                self.topic, self.settings.group, exc, failures,
                                extra={"event": "sdk_commit_failed", "topic": self.topic,
                                       "group": self.settings.group})

    async def commit(self) -> None:
        try:
            await self._commit()
        except Exception as exc:
            raise SubscribeError(f"committing the acked offsets of Kafka topic {self.topic!r} failed: {exc!r}",
                                 path=redact_url(self.backend.url),
                                 hint="after a rebalance the partition has a new owner, which gets those messages "
                                      "again (at-least-once); otherwise check the broker and call commit() again"
                                 ) from exc

    async def close(self) -> None:
        """Stop the committer, commit what was acked, leave the group. Un-acked messages
        are not committed, so the group gets them again."""
        self._closing = True
        if self._committer is not None:
            task, self._committer = self._committer, None
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self.consumer is not None:
            try:
                await self._commit()
            except Exception as exc:
                log.warning("the final commit of %s for group %r failed (%r); messages acked since the last "
                            "commit will be delivered again", self.topic, self.settings.group, exc)
            consumer, self.consumer = self.consumer, None
            with contextlib.suppress(Exception):
                await consumer.stop()

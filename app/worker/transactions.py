"""`processing_guarantee: exactly_once`: a batch's writes and its input offsets in one Kafka transaction.

What commits together, per batch (docs/operations.md, "Processing guarantees"): the batch's
`.v2`/`.v3` outputs, its DLQ records, the dedup table's changelog records and the consumed
offsets of its input partition (``send_offsets_to_transaction``). A consumer reading with
``isolation.level=read_committed`` then sees every input's outputs exactly once, and the dedup
table restored from its changelog holds exactly the ids whose outputs were committed.

Why not Faust's own ``exactly_once``: Faust 0.15.3 runs a transactional producer per partition
through its ``TransactionManager`` and commits from its commit loop, on its own schedule and with
its own ``producer.send`` per record; Prism's batches are written beneath Faust's producer
(`app/worker/batch_send.py`) and acknowledged by Prism (`app/worker/batch_source.py`), so a
Faust transaction would neither contain those writes nor end at a batch boundary. Faust keeps
``at_least_once`` internally; the batch path owns the transactions.

Why one producer per source partition (Kafka Streams' ``exactly_once`` "eos-v1", one producer
per task), ``transactional.id = <app id>-<topic>-<partition>``: zombie fencing needs the new owner
of a partition to use the *same* transactional id as the old one - ``InitProducerId`` then bumps
the epoch, aborts whatever the old owner left open and fences its producer. An id per process, or
per partition *set*, would differ between the old and the new owner, and nothing would fence a
zombie. KIP-447's one-producer-per-process alternative (eos-v2) fences by consumer generation and
needs ``TxnOffsetCommit`` v3 with the group's member id and generation; aiokafka 0.14 sends only v0.
So a batch holds the records of one source partition (`BatchSource(split_partitions=True)`), and
its Merkle tree (signature scope batch) never spans two transactions.

Ordering on a rebalance: the producers of newly assigned partitions are initialised *before*
Faust restores tables and seeks to the committed offsets (:meth:`PartitionProducers.wrap_rebalance`).
``InitProducerId`` waits until the previous owner's transaction is complete (committed or
aborted), so the offsets and changelog read afterwards are the settled ones - the guarantee Kafka
Streams gets from the same order.

Failures: a transaction that is fenced, times out or fails to commit is aborted (when the producer
still can) and the worker stops with one error line; nothing of the batch is visible to
``read_committed`` readers, its dedup ids were never applied to the local store, and its offsets
were not committed - the restarted worker (``prism run`` restarts it; Kafka Streams closes the task
"dirty" and rejoins) reads the batch again from the committed offsets.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import threading
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from app.broker.admin import BrokerSettings
from app.errors import ConfigError

__all__ = [
    "AT_LEAST_ONCE",
    "EXACTLY_ONCE",
    "GUARANTEES",
    "GUARANTEE_ENV",
    "PartitionProducers",
    "TransactionFailed",
    "check_guarantee",
    "check_transactions",
    "install_read_committed",
    "transactional_id",
]

log = logging.getLogger("prism.worker")

AT_LEAST_ONCE = "at_least_once"
EXACTLY_ONCE = "exactly_once"
GUARANTEES = (AT_LEAST_ONCE, EXACTLY_ONCE)
#: Overrides the topology's `processing_guarantee` for `app_from_env` (`prism run --processing-guarantee`).
GUARANTEE_ENV = "PRISM_PROCESSING_GUARANTEE"
#: Kafka's default `transaction.max.timeout.ms` is 15 min; a batch's transaction takes milliseconds.
#: 30 s bounds how long a dead worker's open transaction holds back `read_committed` readers
#: (the last stable offset) when no new owner fences it sooner.
TRANSACTION_TIMEOUT_MS = 30_000
#: ms aiokafka waits before retrying a transactional producer's request (its default: 100). Kafka
#: 3.6+ verifies a transaction's first write to a partition and its offset commit with the
#: transaction coordinator (KIP-890); two such checks of one transactional id in flight at once
#: on a broker answer one of them with a retriable error (NOT_ENOUGH_REPLICAS on a write,
#: COORDINATOR_NOT_AVAILABLE on the offsets). Measured at 700 msg/s on Apache Kafka 4.4, 2-7 %
#: of the transactions met one; at 100 ms each it was the p90 of the commit (BENCHMARKS.md, issue
#: 29). 20 ms is what aiokafka itself waits after CONCURRENT_TRANSACTIONS; in a real outage the
#: retries of these few producers come 5x as often, until the delivery timeout.
TRANSACTION_RETRY_BACKOFF_MS = 20


class TransactionFailed(Exception):
    """A batch's transaction was aborted (or could not be committed): nothing of it is visible."""


def check_guarantee(value: str, *, where: str = "processing_guarantee") -> str:
    if value not in GUARANTEES:
        import difflib

        close = difflib.get_close_matches(value.replace("-", "_").lower(), GUARANTEES, n=1, cutoff=0.6)
        raise ConfigError(f"{where}={value!r} is not a processing guarantee"
                          + (f" - did you mean {close[0]!r}?" if close else ""), path=where,
                          hint="use at_least_once (the default) or exactly_once")
    return value


def transactional_id(app_id: str, topic: str, partition: int) -> str:
    """The transactional id of the producer that owns `topic[partition]`: the same in every
    process of the group, so the next owner fences the previous one (module docstring). Kafka
    limits nothing here but readability; a long topic name is shortened with a hash."""
    tid = f"{app_id}-{topic}-{partition}"
    if len(tid) > 200:
        tid = f"{app_id[:80]}-{hashlib.sha256(topic.encode()).hexdigest()[:16]}-{partition}"
    return tid


def refusal(why: str) -> str:
    """The one line a worker that cannot have transactions says instead of starting."""
    return (f"processing_guarantee exactly_once needs Kafka transactions, and {why}; use at_least_once "
            "(consumers dedup by message_id) or a Kafka cluster with transactions enabled")


def check_transactions(bootstrap: str, app_id: str, settings: BrokerSettings | None = None,
                       timeout: float = 20.0) -> None:
    """Refuse `exactly_once` at start-up, in one line, when the cluster does not give transactions
    (no `InitProducerId`, a transaction coordinator that does not answer, an ACL that denies the
    transactional id): never a silent downgrade to at-least-once.

    Probes with the producer the worker would use (same bootstrap and credentials, a
    transactional id of the app's own) in a thread of its own: the caller may be building a Faust
    app whose event loop must not be replaced."""
    result: list[BaseException | None] = []

    async def probe() -> None:
        from aiokafka import AIOKafkaProducer

        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, transactional_id=f"{app_id}-probe",
                                    request_timeout_ms=int(timeout * 1000),
                                    **(settings.aiokafka_kwargs() if settings is not None else {}))
        try:
            await asyncio.wait_for(producer.start(), timeout)  # InitProducerId
        finally:
            await producer.stop()

    def run() -> None:
        try:
            asyncio.run(probe())
            result.append(None)
        except BaseException as exc:  # reported below, in the caller's thread
            result.append(exc)

    thread = threading.Thread(target=run, name="prism-transactions-probe", daemon=True)
    thread.start()
    thread.join(timeout + 5)
    exc = result[0] if result else TimeoutError(f"no answer within {timeout:g}s")
    if exc is not None:
        why = f"the cluster at {bootstrap} refused them ({type(exc).__name__}: {exc})".replace("\n", " ")
        raise ConfigError(refusal(why), path=GUARANTEE_ENV)


def install_read_committed(app: Any) -> None:
    """Make Faust's consumer read with ``isolation_level=read_committed`` while Faust itself stays
    at-least-once.

    Why: under exactly_once the dedup changelog holds aborted records (a batch whose transaction
    was fenced or timed out); a table restored from it with ``read_uncommitted`` would remember
    ids whose outputs were never committed, and the redelivered input would be dropped as a
    duplicate - a loss. Faust picks the isolation level from ``consumer.in_transaction`` when it
    creates the aiokafka consumer, the only place it reads it; this holds that flag up for exactly
    that call. `app._prism_read_committed` tells table recovery (app/tables/recovery.py) that
    changelog ends are stable offsets and may be commit markers."""
    thread = app.consumer._thread
    original = thread._create_worker_consumer

    def create_worker_consumer(transport: Any) -> Any:
        consumer = thread.consumer
        before = consumer.in_transaction
        consumer.in_transaction = True
        try:
            return original(transport)
        finally:
            consumer.in_transaction = before

    thread._create_worker_consumer = create_worker_consumer
    app._prism_read_committed = True


class PartitionProducers:
    """The transactional producers of the source partitions this worker owns, one per partition.

    `producer_for(topic, partition)` returns the started producer (created on first use, e.g. a
    partition never seen in a rebalance callback); `wrap_rebalance(app)` creates them for newly
    assigned partitions before Faust's recovery and seek, and closes them for revoked ones."""

    def __init__(self, app_id: str, bootstrap: str, *, sources: Iterable[str], settings: BrokerSettings | None,
                 max_request_size: int, max_batch_size: int, linger_ms: int = 0,
                 transaction_timeout_ms: int = TRANSACTION_TIMEOUT_MS) -> None:
        self.app_id = app_id
        self.bootstrap = bootstrap
        self.sources = frozenset(sources)
        self.kwargs: dict[str, Any] = {
            "max_request_size": max_request_size, "max_batch_size": max_batch_size, "linger_ms": linger_ms,
            "transaction_timeout_ms": transaction_timeout_ms, "retry_backoff_ms": TRANSACTION_RETRY_BACKOFF_MS,
            **(settings.aiokafka_kwargs() if settings is not None else {})}
        self._producers: dict[tuple[str, int], Any] = {}
        self._starting: dict[tuple[str, int], asyncio.Future[Any]] = {}
        #: transactions committed and aborted (tests, /status)
        self.committed = 0
        self.aborted = 0

    async def producer_for(self, topic: str, partition: int) -> Any:
        key = (topic, partition)
        producer = self._producers.get(key)
        if producer is not None:
            return producer
        pending = self._starting.get(key)
        if pending is None:
            pending = self._starting[key] = asyncio.ensure_future(self._start(topic, partition))
        try:
            return await asyncio.shield(pending)
        finally:
            if pending.done():
                self._starting.pop(key, None)

    async def _start(self, topic: str, partition: int) -> Any:
        from aiokafka import AIOKafkaProducer

        producer = AIOKafkaProducer(bootstrap_servers=self.bootstrap,
                                    transactional_id=transactional_id(self.app_id, topic, partition), **self.kwargs)
        try:
            await producer.start()  # InitProducerId: fences the previous owner, settles its transaction
        except BaseException:
            await producer.stop()
            raise
        self._producers[(topic, partition)] = producer
        return producer

    async def close(self, keys: Iterable[tuple[str, int]]) -> None:
        """Stop the producers of `keys` (revoked partitions, or a fenced producer). An open
        transaction is aborted by the broker when the next owner initialises the same id."""
        for key in list(keys):
            producer = self._producers.pop(key, None)
            if producer is not None:
                try:
                    await producer.stop()
                except Exception as exc:  # a fenced producer may refuse to flush: it is gone either way
                    log.debug("stopping the transactional producer of %s failed: %r", key, exc)

    async def close_all(self) -> None:
        await self.close(list(self._producers))

    def wrap_rebalance(self, app: Any) -> None:
        """Run :meth:`on_assigned` before Faust's table recovery on every rebalance (module docstring)."""
        tables = app.tables
        original: Callable[..., Awaitable[Any]] = tables.on_rebalance

        async def on_rebalance(assigned: Any, revoked: Any, newly_assigned: Any, generation_id: int = 0) -> Any:
            await self.close([(tp.topic, tp.partition) for tp in revoked])
            await self.on_assigned((tp.topic, tp.partition) for tp in assigned)
            return await original(assigned, revoked, newly_assigned, generation_id)

        tables.on_rebalance = on_rebalance

    async def on_assigned(self, tps: Iterable[tuple[str, int]]) -> None:
        wanted = [(t, p) for t, p in tps if t in self.sources and (t, p) not in self._producers]
        if wanted:
            await asyncio.gather(*(self.producer_for(t, p) for t, p in wanted))

    async def run(self, producer: Any, body: Callable[[asyncio.Future[None]], Awaitable[None]],
                  offsets: dict[Any, int], group_id: str, *, also_in: Iterable[Any] = ()) -> None:
        """One transaction: begin, `body(handed_over)` (sends everything; resolves `handed_over`
        once its records are queued in the producer), the input `offsets` (the next offset to
        read, per TopicPartition), commit. Any failure aborts it (if the producer still can) and
        raises :class:`TransactionFailed`.

        Round trips (BENCHMARKS.md, issue 29, "where exactly_once's added latency goes"): the
        offsets go to the coordinators (`AddOffsetsToTxn`, `TxnOffsetCommit`) as soon as the
        records are queued, while their `Produce` requests are in flight, instead of after the
        writes were acknowledged - two round trips off every transaction. What commits is the
        same: a transaction's offsets and records are visible together at its `EndTxn` or not
        at all, whatever order they reached the broker in. They are queued after the records so
        that aiokafka's first coordinator request of the transaction is `AddPartitionsToTxn`,
        whose `CONCURRENT_TRANSACTIONS` (the previous transaction's markers still being written)
        it retries after 20 ms, where `AddOffsetsToTxn`'s waits its full `retry_backoff_ms`.
        `also_in`: partitions the body writes to besides its outputs (the dedup changelog, queued
        once the outputs are queued), registered up front so that one `AddPartitionsToTxn` covers
        them whatever the sender's timing."""
        await producer.begin_transaction()
        _register_partitions(producer, also_in)
        handed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        offsets_sent = asyncio.ensure_future(_offsets_once_queued(producer, handed, offsets, group_id))
        try:
            await body(handed)
            if not handed.done():
                handed.set_result(None)
            await offsets_sent
            await producer.commit_transaction()
        except BaseException as exc:
            self.aborted += 1
            why = _why(producer, exc)  # before the abort, which starts a fresh waiter
            await _settle(offsets_sent)
            try:
                await asyncio.wait_for(producer.abort_transaction(), 10)
            except BaseException as abort_exc:  # fenced: the new owner's init aborted it already
                log.debug("abort after %r failed: %r", exc, abort_exc)
            if isinstance(exc, asyncio.CancelledError):
                raise
            raise TransactionFailed(why) from exc
        self.committed += 1


def _why(producer: Any, exc: BaseException) -> str:
    """What failed the transaction, for the worker's one error line. aiokafka's sender records a
    transaction's fatal or abortable error (`ProducerFenced`, `InvalidProducerEpoch`, an
    authorization failure) on its transaction manager, where the caller's next call sees only a
    symptom - `send_batch` raising "Can't send messages while not in transaction" once the state is
    FATAL_ERROR. The recorded error comes first, the symptom after it: an operator reading
    "IllegalOperation" alone would look for a bug in Prism instead of the partition's new owner."""
    said = _named(exc)
    manager = getattr(producer, "_txn_manager", None)
    waiter = manager.wait_for_transaction_end() if manager is not None else None
    if waiter is None or not waiter.done() or waiter.cancelled():
        return said
    recorded = waiter.exception()
    if recorded is None or recorded is exc:
        return said
    return f"{_named(recorded)} (then {said})"


def _named(exc: BaseException) -> str:
    """`Type: text`, once: aiokafka's errors already begin their text with their type's name."""
    text, name = str(exc), type(exc).__name__
    return text if text.startswith(name) else f"{name}: {text}"


async def _offsets_once_queued(producer: Any, handed: asyncio.Future[None], offsets: dict[Any, int],
                               group_id: str) -> None:
    await handed
    await producer.send_offsets_to_transaction(offsets, group_id)


async def _settle(task: asyncio.Future[None]) -> None:
    """Stop `task` (the offsets of a transaction being aborted) and collect its outcome, so that
    neither a pending task nor an unretrieved exception outlives the transaction. The abort that
    follows still drains offsets aiokafka had queued: it sends them, then `EndTxn(abort)`."""
    if not task.done():
        task.cancel()
    await asyncio.wait([task])
    if not task.cancelled():
        task.exception()


def _register_partitions(producer: Any, tps: Iterable[Any]) -> None:
    """Add `tps` to the open transaction before anything is written to them (aiokafka's own
    `_append_batch` does this at each write; the sender sends one `AddPartitionsToTxn` for all the
    partitions pending when it looks). Only partitions the producer's metadata knows: an unknown
    one would be retried every `retry_backoff_ms` until it exists, where its first write fetches
    the metadata first. A producer without aiokafka's transaction manager (a test double) skips it."""
    manager = getattr(producer, "_txn_manager", None)
    if manager is None:
        return
    cluster = producer.client.cluster
    for tp in tps:
        known = cluster.partitions_for_topic(tp.topic)
        if known is not None and tp.partition in known:
            manager.maybe_add_partition_to_txn(tp)

"""Workaround for the embedded broker's wrong ``ListOffsets(latest)`` answer.

The bug
    Tansu 0.6.0 (the embedded broker) answers ``ListOffsets`` with timestamp ``-1`` (latest)
    with the *base offset of the partition's last record batch* instead of the high watermark
    (the offset after the last record). A partition holding offsets 0..2999 written in batches
    may report 2979. Every ``AIOKafkaConsumer.end_offsets()`` is therefore short by up to a
    batch. The high watermark carried in every ``Fetch`` response is right.

Why Faust tables break on it
    Faust's table recovery (``faust/tables/recovery.py``, ``Recovery._build_highwaters``) asks
    ``consumer.highwaters(*changelog_tps)``, which the aiokafka driver implements with
    ``AIOKafkaConsumer.end_offsets()`` (``AIOKafkaConsumerThread._highwaters``). With the short
    answer:

    * on an empty data dir, recovery stops at the wrong end and the table comes back missing
      the changelog's last batch (measured: 4998 of 5000 increments);
    * on the worker's own RocksDB data dir, the persisted changelog offset is *higher* than the
      "highwater", and Faust refuses to start with ``ConsistencyError`` ("persisted offset ... is
      higher than the last offset in that topic (highwater)").

The workaround
    For each partition we still ask ``ListOffsets(latest)`` - on this broker it is a valid offset
    at or just below the true end - and then send one ``Fetch`` per leader from exactly that
    offset. The response carries the true high watermark (and at most one record batch of data,
    which we discard). The result is ``max(listed, fetched_highwater)``; a partition whose fetch
    fails falls back to the listed value, i.e. never worse than stock. It is installed only for
    the embedded broker, by swapping in a consumer-thread subclass whose ``highwaters()`` uses it
    (``install_listoffsets_workaround``, called by ``make_app(embedded=True)``); Faust itself is
    not patched or forked, and a real Kafka cluster keeps the stock end offsets. Cost: one
    ListOffsets plus one Fetch per broker per recovery, a few milliseconds.

    Proof: tests/broker/test_offsets.py compares the result with the records actually written
    (and shows ListOffsets is short); tests/tables/test_recovery.py restarts a worker with four
    RocksDB tables on its own data dir and on an empty one and compares every table with what was
    processed, and runs stock Faust as the control (it dies with ``ConsistencyError``).

    Only ``Consumer.highwaters`` is affected in Faust 0.15.3 (checked: it is the only caller of
    ``end_offsets``); ``Consumer.highwater(tp)`` (lag, commit checks) already reads the fetch
    response's high watermark.

The offsets probe (every broker, Apache Kafka included)
    Brokers answer one connection's requests in order, and the worker consumer's connection
    nearly always has a long-poll ``Fetch`` in flight (Faust hard-codes ``fetch_max_wait_ms=1500``;
    Prism bounds it since, ``KAFKA_FETCH_MAX_WAIT_MS``, and the queries stay off that connection).
    Every offset query of Faust's table recovery - ``highwaters()``, ``earliest_offsets()`` and
    the recovery's end-offset check (``app/tables/recovery.py``) - waited behind it: on Apache
    Kafka worker starts came in ~1.5 s quanta (docs/testing.md, "One worker start"). They now
    run on a separate group-less "probe" consumer connection (``OffsetsProbeConsumerThread``,
    ``install_offsets_probe``, called by ``make_app`` for every Kafka broker; the embedded
    broker's transport extends it). The probe asks what Faust would: ``ListOffsets`` with the
    worker consumer's ``isolation_level`` (under Prism's exactly_once, ``read_committed``: the
    last stable offset) and its credentials; with Faust's ``in_transaction`` the highwaters are
    the consumer's last stable offsets as before (no request). It is stopped with the consumer
    thread; when it cannot connect, a ``BrokerError`` is logged and the queries fall back to the
    worker consumer's own connection (Faust's behaviour, slower), never a hang or a crash.

    The same consumer thread bounds every offset commit (app/worker/commit_bound.py), and
    subscribes only once the metadata lists every topic (Faust creates
    the changelogs just before; see ``OffsetsProbeConsumerThread.subscribe`` for the race).

A second embedded-broker quirk handled by the same consumer-thread subclass
    Tansu numbers a group's first generation 0, where Kafka starts at 1. aiokafka only sends
    ``LeaveGroup`` on close when ``generation > 0``, so the first worker of a new group left
    silently and the next worker's join waited a full session timeout for the ghost member to
    expire (measured: +5 s on every restart). :func:`leave_group_on_close` makes close send the
    ``LeaveGroup`` for generation 0 too.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any, TypeVar

from aiokafka import AIOKafkaConsumer
from aiokafka.client import AIOKafkaClient
from aiokafka.errors import for_code
from aiokafka.protocol.fetch import FetchRequest

from app.broker.metadata import await_topics_known, track_topics
from app.errors import BrokerError
from app.worker.commit_bound import bounded_commit, commit_from_worker

__all__ = [
    "fetch_high_watermarks",
    "install_listoffsets_workaround",
    "install_offsets_probe",
    "leave_group_on_close",
    "listoffsets_workaround_installed",
    "offsets_probe_installed",
    "paused_in_aiokafka",
    "start_offsets_probe",
    "true_end_offsets",
]

#: Faust's per-partition consumer state that a revocation forgets (after its commit: see
#: ``OffsetsProbeConsumer.on_partitions_revoked``)
REVOKED_PARTITION_STATE = ("_gap", "_acked", "_acked_index", "_read_offset", "_committed_offset")

log = logging.getLogger(__name__)

TPT = TypeVar("TPT")  # aiokafka TopicPartition or Faust TP: both are (topic, partition) tuples

_READ_UNCOMMITTED = 0
#: After the probe failed to connect, the offset queries use the worker consumer for this long.
PROBE_RETRY_SECONDS = 30.0
#: How long a subscribe waits for the broker's metadata to list topics Faust just created.
SUBSCRIBE_METADATA_WAIT_SECONDS = 10.0
#: The embedded broker answers an empty Fetch when ``max_wait`` or ``min_bytes`` is 0, so ask for
#: one byte and wait at most this long; partitions with data answer at once.
_FETCH_MAX_WAIT_MS = 100
_ATTEMPTS = 3


async def fetch_high_watermarks(
    client: AIOKafkaClient,
    start_offsets: Mapping[TPT, int],
    *,
    max_wait_ms: int = _FETCH_MAX_WAIT_MS,
    isolation_level: int = _READ_UNCOMMITTED,
) -> dict[TPT, int]:
    """Return the high watermark of each partition as reported in a ``Fetch`` response.

    Args:
        client: a started aiokafka client (e.g. a consumer's) whose metadata knows the topics.
        start_offsets: partition -> a valid offset to fetch from (ideally at most one batch below
            the end, such as the embedded broker's ``ListOffsets(latest)`` answer). The fetched
            records themselves are discarded.
        max_wait_ms: broker-side wait when a partition has no data at that offset.

    Returns:
        partition -> high watermark, only for partitions whose fetch succeeded; the caller
        decides what to do with the others (they are logged).
    """
    result: dict[TPT, int] = {}
    pending: dict[TPT, int] = dict(start_offsets)
    for _attempt in range(_ATTEMPTS):
        if not pending:
            break
        by_node: dict[int, dict[str, list[tuple[int, int, int]]]] = defaultdict(lambda: defaultdict(list))
        keys: dict[tuple[str, int], TPT] = {}
        unknown_leader = False
        for tp, offset in pending.items():
            topic, partition = tp[0], tp[1]  # type: ignore[index]
            keys[(topic, partition)] = tp
            node = client.cluster.leader_for_partition(_aiokafka_tp(topic, partition))
            if node is None or node < 0:
                unknown_leader = True
                continue
            # Partition max bytes 1: brokers still return the first batch (KIP-74); we only need
            # the partition header with its high watermark.
            by_node[node][topic].append((partition, max(offset, 0), 1))
        if unknown_leader:
            await client.force_metadata_update()
        for node, topics in by_node.items():
            request = FetchRequest(max_wait_ms, 1, 1 << 20, isolation_level, list(topics.items()))
            try:
                response = await client.send(node, request)
            except Exception as exc:
                log.warning("high-watermark fetch to node %s failed: %r", node, exc)
                continue
            for topic, partitions in response.topics:
                for partition, error_code, highwater, *_rest in partitions:
                    tp_key = keys.get((topic, partition))
                    if tp_key is None:
                        continue
                    if error_code == 0 and highwater is not None and highwater >= 0:
                        result[tp_key] = int(highwater)
                        pending.pop(tp_key, None)
                    else:
                        log.warning("high-watermark fetch for %s[%s] answered %s", topic, partition,
                                    for_code(error_code).__name__)
    for tp in pending:
        log.warning("no high watermark from a fetch for %s; falling back to ListOffsets", tp)
    return result


async def true_end_offsets(consumer: AIOKafkaConsumer, partitions: Iterable[TPT]) -> dict[TPT, int]:
    """``consumer.end_offsets()`` corrected for the embedded broker (see the module docstring).

    ``ListOffsets(latest)`` gives a lower bound and a safe fetch position; one ``Fetch`` from there
    gives the true high watermark. Falls back to the listed value for a partition whose fetch
    failed, i.e. never worse than stock behaviour.
    """
    tps = list(partitions)
    if not tps:
        return {}
    listed: Mapping[Any, int] = await consumer.end_offsets(tps)
    start = {tp: int(listed[tp]) for tp in tps if listed.get(tp) is not None}
    # ``_client`` is aiokafka's own client of this consumer: same connections, same auth, and
    # the metadata already knows the partitions' leaders after ``end_offsets``.
    fetched = await fetch_high_watermarks(consumer._client, start)
    corrected: dict[TPT, int] = {}
    for tp in tps:
        values = [v for v in (start.get(tp), fetched.get(tp)) if v is not None]
        if values:
            corrected[tp] = max(values)
    if log.isEnabledFor(logging.DEBUG):
        for tp in tps:
            if fetched.get(tp) is not None and fetched.get(tp) != start.get(tp):
                log.debug("end offset of %s: ListOffsets said %s, fetch high watermark is %s",
                          tp, start.get(tp), fetched.get(tp))
    return corrected


def leave_group_on_close(consumer: AIOKafkaConsumer) -> None:
    """Make ``consumer.stop()`` leave its group also when the generation is 0 (Tansu's first).

    Wraps the coordinator's leave step, which ``close()`` runs after heartbeats have stopped, so
    no heartbeat can race with the leave. Call it on a started consumer, before ``stop()``.
    """
    from aiokafka.errors import KafkaError
    from aiokafka.protocol.group import LeaveGroupRequest

    coordinator = getattr(consumer, "_coordinator", None)
    original = getattr(coordinator, "_maybe_leave_group", None)
    if coordinator is None or original is None or getattr(coordinator, "_prism_leave_patched", False):
        return

    async def maybe_leave_group() -> None:
        if coordinator.generation == 0 and getattr(coordinator, "_group_instance_id", None) is None:
            try:
                await coordinator._send_req(LeaveGroupRequest(coordinator.group_id, coordinator.member_id))
            except KafkaError as exc:
                log.warning("LeaveGroup (generation 0) failed: %r", exc)
            coordinator.reset_generation()
            return
        await original()

    coordinator._maybe_leave_group = maybe_leave_group
    coordinator._prism_leave_patched = True


def paused_in_aiokafka(consumer: AIOKafkaConsumer | None, tp: Any) -> bool:
    """True when aiokafka's current assignment has `tp` paused (it is left out of every fetch).
    A read of aiokafka's state from outside its thread, as Faust's livelock check makes; False
    when there is no consumer or assignment, or the state cannot be read."""
    if consumer is None:
        return False
    try:
        assignment = consumer._subscription.subscription.assignment
        state = assignment.state_value(_aiokafka_tp(tp[0], tp[1])) if assignment is not None else None
    except Exception:  # no subscription yet, or changed under us: report as Faust would
        return False
    return bool(state is not None and state.paused)


def _aiokafka_tp(topic: str, partition: int) -> Any:
    from aiokafka.structs import TopicPartition

    return TopicPartition(topic, partition)


# --------------------------------------------------------------------------- Faust binding


def _faust_classes() -> tuple[type, type, type, type]:
    """Build the Faust driver subclasses lazily (importing faust is slow and not always needed).

    Returns the probe transport (every Kafka broker) and the embedded broker's consumer thread,
    consumer and transport (the probe plus the embedded-only workarounds).
    """
    from faust.transport.drivers import aiokafka as faust_aiokafka

    base_thread = faust_aiokafka.AIOKafkaConsumerThread
    base_consumer = faust_aiokafka.Consumer
    base_transport = faust_aiokafka.Transport
    for owner, attr in ((base_thread, "highwaters"), (base_thread, "earliest_offsets"), (base_thread, "subscribe"),
                        (base_thread, "call_thread"), (base_thread, "on_thread_stop"),
                        (base_thread, "_ensure_consumer"), (base_thread, "commit"), (base_thread, "_commit"),
                        (base_thread, "verify_event_path"),
                        (base_consumer, "_new_consumer_thread"), (base_consumer, "_commit_offsets"),
                        (base_consumer, "on_partitions_revoked"), (base_consumer, "_new_offset")):
        if not hasattr(owner, attr):  # pragma: no cover - guards a Faust upgrade
            raise RuntimeError(
                f"faust {owner.__name__} has no {attr!r}: the offset queries in "
                "app/worker/offsets.py must be re-checked against this Faust version")
    # the per-partition state `OffsetsProbeConsumer.on_partitions_revoked` forgets (instance
    # attributes: declared on the class, set in __init__)
    declared = {name for cls in base_consumer.__mro__ for name in getattr(cls, "__annotations__", {})}
    missing = [a for a in (*REVOKED_PARTITION_STATE, "_active_partitions", "_paused_partitions") if a not in declared]
    takes_handler = any("on_partitions_revoked" in inspect.signature(cls.__init__).parameters
                        for cls in base_consumer.__mro__ if "__init__" in vars(cls))
    if missing or not takes_handler:
        raise RuntimeError(  # pragma: no cover - guards a Faust upgrade
            f"faust Consumer no longer declares {missing or 'on_partitions_revoked'}: its revocation in "
            "app/worker/offsets.py must be re-checked against this Faust version")

    class OffsetsProbeConsumerThread(base_thread):  # type: ignore[misc, valid-type]
        """Faust's consumer thread with the table recovery's offset queries on their own connection.

        Why: a broker answers the requests of one connection in order, and the worker consumer's
        connection nearly always has a long-poll ``Fetch`` in flight (Faust hard-codes
        ``fetch_max_wait_ms=1500``). Faust asks ``highwaters()`` and ``earliest_offsets()`` on that
        connection, so each query of a recovery waited out the fetch queued before it: on Apache
        Kafka a worker start came in ~1.5 s quanta (measured in-process: 5.2-6.8 s, 4.6 s of it
        three queries waiting; 0.56-0.86 s through the probe - docs/testing.md).
        Here they go through a small group-less "probe" consumer with its own connection, with the
        worker consumer's credentials and ``isolation_level``. What is asked is Faust's stock query
        (``ListOffsets``; with ``in_transaction`` the consumer's last stable offsets, no request).

        The probe starts on the first query, is stopped with the thread, and never takes a start
        down with it: when it cannot connect (:class:`~app.errors.BrokerError`, bounded by the
        request timeout), the queries fall back to the worker consumer's connection - Faust's own
        behaviour, slower - with a WARNING, and the probe is tried again after
        ``PROBE_RETRY_SECONDS``.
        """

        _offsets_probe: AIOKafkaConsumer | None = None
        _probe_lock: asyncio.Lock | None = None
        _probe_retry_at: float = 0.0
        _probe_closed: bool = False
        #: the last offset commit timed out (read by ``OffsetsProbeConsumer._commit_offsets``)
        commit_timed_out: bool = False

        async def commit(self, offsets: Mapping[Any, int]) -> bool:
            """Faust's offset commit, bounded on both sides of the thread (app/worker/commit_bound.py)."""
            n = len(offsets)
            result = await commit_from_worker(
                lambda: self.call_thread(bounded_commit, lambda: self._commit(offsets), n), n, self.thread_loop)
            self.commit_timed_out = result is None
            return bool(result)

        async def subscribe(self, topics: Iterable[str]) -> None:
            """Faust's subscribe, once the worker consumer's metadata knows every topic.

            Why: Faust creates the tables' changelog topics just before it subscribes, and on
            Apache Kafka a new topic reaches the brokers' metadata a moment later. Joined before
            that, the group's assignment leaves the changelog out ("Ignoring missing topic"),
            aiokafka's metadata snapshot says it has 0 partitions, and the first table write
            fails the worker with Faust's ``PartitionsMismatch`` before the rebalance that would
            fix it. Seen once the recovery stopped waiting out long polls (the 4.6 s it took
            before had hidden it). Bounded: a topic still unknown after
            ``SUBSCRIBE_METADATA_WAIT_SECONDS`` is named in a WARNING and the subscribe goes on.
            """
            wanted = set(topics)

            async def wait() -> list[str]:
                return await await_topics_known(self._ensure_consumer()._client, wanted,
                                                SUBSCRIBE_METADATA_WAIT_SECONDS)

            missing = await self.call_thread(wait)
            if missing:
                log.warning("subscribing although the broker's metadata does not list %s yet (waited %ss); the "
                            "group rebalances once it does", ", ".join(missing), SUBSCRIBE_METADATA_WAIT_SECONDS)
            await super().subscribe(wanted)

        def _create_worker_consumer(self, transport: Any) -> Any:
            # Faust hard-codes fetch_max_wait_ms=1500. aiokafka keeps one fetch in flight per
            # broker, and a partition whose fetched records the worker has not taken for 100 ms
            # (its prefetch backoff) no longer holds the next fetch back: it goes out for the
            # other partitions alone. When those are idle - measured: the LNMP sequence table's
            # changelog, which aiokafka fetched after recovery until the changelogs were paused
            # in aiokafka (app/tables/recovery.py); still: a source partition that receives
            # nothing - the broker holds it the whole max wait, and the busy source partitions
            # are not fetched until it returns: 1.5 s stalls of a live stream, after which a
            # worker at half its maximum stayed behind for the rest of a latency round
            # (BENCHMARKS.md, "A live stream counted, and its 1.5 s fetch stalls"; the idle cost:
            # "What the fetch bound costs an idle worker", "Changelogs paused after their
            # recovery"). The bound caps such a stall; a fetch with data returns at once either way.
            consumer = super()._create_worker_consumer(transport)
            if not hasattr(consumer, "_fetch_max_wait_ms"):  # pragma: no cover - guards an aiokafka upgrade
                raise RuntimeError("aiokafka consumer has no _fetch_max_wait_ms; re-check app/worker/offsets.py")
            consumer._fetch_max_wait_ms = self.fetch_max_wait_ms()
            return consumer

        def fetch_max_wait_ms(self) -> int:
            """The worker consumer's fetch long-poll bound (read when the consumer is created)."""
            return KAFKA_FETCH_MAX_WAIT_MS

        def verify_event_path(self, now: float, tp: Any) -> None:
            # Faust's livelock check logs an ERROR ("Aiokafka stopped fetching from ...") every
            # few seconds for any assigned partition aiokafka has not fetched within
            # stream_processing_timeout (300 s). A partition paused in aiokafka on purpose - the
            # tables' changelogs after their recovery (app/tables/recovery.py), the sources of a
            # blocked or paused worker (batch_source.set_source_fetching) - is not fetched
            # because it must not be: not a stall to report.
            if paused_in_aiokafka(self._consumer, tp):
                return None
            return super().verify_event_path(now, tp)

        async def highwaters(self, *partitions: Any) -> Mapping[Any, int]:
            return await self.call_thread(self._probe_highwaters, partitions)

        async def _probe_highwaters(self, partitions: Iterable[Any]) -> Mapping[Any, int]:
            consumer = self._ensure_consumer()
            if self.consumer.in_transaction:  # stock: the last stable offsets the fetches reported
                return {tp: consumer.last_stable_offset(tp) for tp in partitions}
            tps = list(partitions)
            return dict(await (await self._offsets_consumer(tps)).end_offsets(tps))

        async def earliest_offsets(self, *partitions: Any) -> Mapping[Any, int]:
            return await self.call_thread(self._probe_earliest, partitions)

        async def _probe_earliest(self, partitions: Iterable[Any]) -> Mapping[Any, int]:
            tps = list(partitions)
            if not tps:
                return {}
            return dict(await (await self._offsets_consumer(tps)).beginning_offsets(tps))

        async def verified_end_offsets(self, partitions: Iterable[Any]) -> Mapping[Any, int]:
            """:func:`true_end_offsets` on the probe's connection (the table recovery's check)."""
            tps = list(partitions)

            async def query() -> Mapping[Any, int]:
                return await true_end_offsets(await self._offsets_consumer(tps), tps)

            return await self.call_thread(query)

        async def _offsets_consumer(self, partitions: Iterable[Any] = ()) -> AIOKafkaConsumer:
            """The probe, started on first use and tracking ``partitions``' topics; the worker
            consumer itself when the probe cannot connect (see the class docstring)."""
            if self._probe_lock is None:
                self._probe_lock = asyncio.Lock()
            async with self._probe_lock:
                if self._offsets_probe is None and not self._probe_closed \
                        and time.monotonic() >= self._probe_retry_at:
                    try:
                        probe = await start_offsets_probe(self._probe_kwargs())
                    except BrokerError as exc:
                        self._probe_retry_at = time.monotonic() + PROBE_RETRY_SECONDS
                        log.warning("%s. The table recovery's offset queries use the worker consumer's own "
                                    "connection meanwhile (each waits behind its long-poll fetch); the probe "
                                    "is tried again in %ss", exc, PROBE_RETRY_SECONDS)
                    else:
                        if self._probe_closed:  # the thread stopped while the probe connected
                            await probe.stop()
                        else:
                            self._offsets_probe = probe
                probe = self._offsets_probe
            if probe is None:
                return self._ensure_consumer()
            await track_topics(probe, {tp[0] for tp in partitions})
            return probe

        def _probe_kwargs(self) -> dict[str, Any]:
            conf = self.app.conf
            transport = self.transport
            kwargs: dict[str, Any] = {}
            if getattr(faust_aiokafka, "_AIOKAFKA_HAS_API_VERSION", False):  # pragma: no cover - old aiokafka
                kwargs["api_version"] = conf.consumer_api_version
            return dict(
                kwargs,
                bootstrap_servers=faust_aiokafka.server_list(transport.url, transport.default_port),
                client_id=f"{conf.broker_client_id}-offsets",
                request_timeout_ms=int(conf.broker_request_timeout * 1000),
                metadata_max_age_ms=conf.consumer_metadata_max_age_ms,
                connections_max_idle_ms=conf.consumer_connections_max_idle_ms,
                enable_auto_commit=False,
                # ListOffsets(latest) answers the last stable offset under read_committed: the
                # probe asks what the worker consumer would (Prism's exactly_once reads committed).
                isolation_level=getattr(self._ensure_consumer(), "_isolation_level", "read_uncommitted"),
                **faust_aiokafka.credentials_to_aiokafka_auth(conf.broker_credentials, conf.ssl_context),
            )

        @property
        def offsets_probe(self) -> AIOKafkaConsumer | None:
            """The started probe, if any (diagnostics and tests)."""
            return self._offsets_probe

        async def on_thread_stop(self) -> None:
            self._probe_closed = True
            try:
                await super().on_thread_stop()
            finally:
                probe, self._offsets_probe = self._offsets_probe, None
                if probe is not None:
                    await probe.stop()

    class OffsetsProbeConsumer(base_consumer):  # type: ignore[misc, valid-type]
        def _new_consumer_thread(self) -> Any:
            return OffsetsProbeConsumerThread(self, loop=self.loop, beacon=self.beacon)

        #: offsets of a commit that timed out, per partition: sent again by the next commit
        _recommit: dict[Any, int] | None = None

        async def on_partitions_revoked(self, revoked: set[Any]) -> None:
            """Faust's revocation with its two halves in the right order: the app's handler
            first (wait for the streams, then commit what they acknowledged), then forget the
            revoked partitions' acknowledged and committed offsets.

            Why: Faust 0.15.3 (``Consumer.on_partitions_revoked``) forgets them *first* (since
            faust-streaming PR #95; its issue #502 is the symptom), so the handler's "wait for
            the streams, then commit" found nothing of the revoked partitions to commit, and
            whatever was acknowledged since the last timer commit - up to
            ``broker_commit_interval`` (2.8 s) of records - was read and processed again by the
            partition's next owner, on every rebalance, a clean join or leave included (eager
            rebalancing revokes everything). Seen: 767-925 of 1,500 records of one partition
            processed twice when a second worker left cleanly (tests/tables/test_recovery.py,
            the join-and-leave rebalance); 5,580 of 24,000 across one join and one leave under
            load (docs/operations.md, "What a rebalance does"). Kafka Connect and Kafka Streams
            commit in ``onPartitionsRevoked``; drain first, forget second. A commit made before
            the handler would not do: what the streams acknowledge while it is in flight would
            still be forgotten (measured: 50 records at one join). Under exactly_once nothing is
            acknowledged to Faust (offsets commit inside each transaction)."""
            from faust.utils.tracing import traced_from_parent_span

            span = self.app._start_span_from_rebalancing("on_partitions_revoked")
            tracing = traced_from_parent_span(span)
            with span:
                if self._active_partitions is not None:  # as Faust: no more records of them
                    self._active_partitions.difference_update(revoked)
                self._paused_partitions.difference_update(revoked)
                try:
                    await tracing(self._on_partitions_revoked, partitions=revoked)(revoked)
                finally:
                    for tp in revoked:  # as Faust, after the handler's commit instead of before
                        for name in REVOKED_PARTITION_STATE:
                            getattr(self, name).pop(tp, None)

        def _new_offset(self, tp: Any) -> int | None:
            """Faust's, then the partition's acknowledged offsets kept unique and above what
            this commit takes.

            Why: Faust 0.15.3 merges a partition's "gaps" (offsets it expects never to be
            delivered) into its list of acknowledged offsets; an offset that was acknowledged
            as well is then listed twice. Its commit takes the first run of consecutive
            offsets, so it stops at the copy, removes as many entries as the run had and
            forgets the run's offsets from its index - leaving the copy behind, and letting a
            re-delivery of an offset acknowledge it again. From then on every commit of the
            partition advanced by one or two offsets (seen at a rebalance under a live stream,
            a gap recorded over records read again: a partition's committed offset stayed ~2,000
            records behind, BENCHMARKS.md "Records processed twice at a rebalance"). With the
            list cleaned, the next commit takes everything consecutive again."""
            offset = super()._new_offset(tp)
            acked = self._acked.get(tp)
            if offset is not None and acked:
                rest = sorted({o for o in acked if o >= offset})
                if len(rest) != len(acked):
                    acked[:] = rest
                    self._acked_index[tp] = set(rest)
            return offset

        def _filter_committable_offsets(self, tps: Iterable[Any]) -> dict[Any, int]:
            """Faust's, plus the offsets of a commit that timed out that nothing newer replaces.

            Why: Faust drops a partition's acknowledged offsets from its list once a commit takes
            them, and records them as committed even when the commit failed; a partition that gets
            nothing new afterwards would never have them committed (app/worker/commit_bound.py)."""
            tps = set(tps)
            offsets = dict(super()._filter_committable_offsets(tps))
            pending = self._recommit
            if pending:
                assigned = self.assignment()
                for tp in list(pending):
                    if tp not in assigned:
                        del pending[tp]  # revoked: its new owner reads from the committed offset
                    elif tp in tps and offsets.get(tp, -1) < pending[tp]:
                        offsets[tp] = pending[tp]
            return offsets

        async def _commit_offsets(self, offsets: Mapping[Any, int], start_new_transaction: bool = True) -> bool:
            did = await super()._commit_offsets(offsets, start_new_transaction=start_new_transaction)
            if self._recommit is None:
                self._recommit = {}
            if did:
                for tp, offset in offsets.items():
                    if self._recommit.get(tp, offset + 1) <= offset:
                        del self._recommit[tp]
            elif getattr(self._thread, "commit_timed_out", False):
                for tp, offset in offsets.items():
                    self._recommit[tp] = max(offset, self._recommit.get(tp, offset))
            return bool(did)

    class OffsetsProbeTransport(base_transport):  # type: ignore[misc, valid-type]
        Consumer = OffsetsProbeConsumer

    class TrueHighwaterConsumerThread(OffsetsProbeConsumerThread):  # type: ignore[misc, valid-type]
        """Consumer thread for the embedded broker: the probe above, true ``highwaters()``,
        LeaveGroup at generation 0, a 20 ms fetch wait."""

        def fetch_max_wait_ms(self) -> int:
            # Tansu does not complete a waiting fetch when data arrives; it answers at about
            # half the max wait. Faust hard-codes fetch_max_wait_ms=1500, which puts ~700 ms
            # on every hop; measured: 500 ms -> data visible after 222 ms, 20 ms -> after 4 ms.
            return EMBEDDED_FETCH_MAX_WAIT_MS

        async def _probe_highwaters(self, partitions: Iterable[Any]) -> Mapping[Any, int]:
            consumer = self._ensure_consumer()
            if self.consumer.in_transaction:  # stock behaviour; the embedded broker has no transactions
                return {tp: consumer.last_stable_offset(tp) for tp in partitions}
            tps = list(partitions)
            return await true_end_offsets(await self._offsets_consumer(tps), tps)

        async def on_thread_stop(self) -> None:
            if self._consumer is not None:
                leave_group_on_close(self._consumer)
            await super().on_thread_stop()

    class TrueHighwaterConsumer(OffsetsProbeConsumer):  # type: ignore[misc, valid-type]
        def _new_consumer_thread(self) -> Any:
            return TrueHighwaterConsumerThread(self, loop=self.loop, beacon=self.beacon)

    class TrueHighwaterTransport(OffsetsProbeTransport):  # type: ignore[misc, valid-type]
        Consumer = TrueHighwaterConsumer

    return OffsetsProbeTransport, TrueHighwaterConsumerThread, TrueHighwaterConsumer, TrueHighwaterTransport


async def start_offsets_probe(kwargs: Mapping[str, Any]) -> AIOKafkaConsumer:
    """Start a group-less consumer for offset queries, or raise :class:`~app.errors.BrokerError`.

    Bounded: aiokafka's bootstrap tries each server once, and the whole start is cut at the
    request timeout (``kwargs["request_timeout_ms"]``), so a broker that does not answer is an
    error after that, never a hang. A probe that failed to start is stopped (its client may hold
    a connection and the metadata task).
    """
    probe = AIOKafkaConsumer(**kwargs)
    timeout = max(float(kwargs.get("request_timeout_ms", 40_000)) / 1000, 1.0)
    try:
        await asyncio.wait_for(probe.start(), timeout)
    except BaseException as exc:
        await probe.stop()  # also when cancelled (the thread stopping): never a leaked client
        if not isinstance(exc, Exception):
            raise
        servers = kwargs.get("bootstrap_servers")
        raise BrokerError(
            f"the worker's offsets probe (a second, group-less consumer connection for the table "
            f"recovery's offset queries) could not connect to {servers} within {timeout:g}s: "
            f"{type(exc).__name__}: {exc}".rstrip(": "),
            path="app.worker.offsets.start_offsets_probe",
            hint="check that the broker is reachable from the worker and accepts one more connection "
                 "with the worker's credentials (max.connections.per.ip, quotas)") from exc
    return probe


#: Fetch long-poll bound on the embedded broker (see TrueHighwaterConsumerThread).
EMBEDDED_FETCH_MAX_WAIT_MS = 20
#: Fetch long-poll bound on Apache Kafka (see OffsetsProbeConsumerThread._create_worker_consumer):
#: what a fetch of idle partitions alone can hold the source partitions back. An idle worker
#: fetches ~20 times a second instead of ~0.7.
KAFKA_FETCH_MAX_WAIT_MS = 50

_CLASSES: tuple[type, type, type, type] | None = None


def _classes() -> tuple[type, type, type, type]:
    global _CLASSES
    if _CLASSES is None:
        _CLASSES = _faust_classes()
    return _CLASSES


def install_listoffsets_workaround(app: Any) -> None:
    """Make ``app``'s consumer derive changelog end offsets from a fetch.

    Call it right after creating the app, before anything starts it (``make_app`` does this when
    ``embedded=True``). It replaces the app's consumer transport with a subclass of Faust's
    aiokafka transport whose consumer thread overrides ``highwaters()``; producer, topics and
    everything else are untouched.
    """
    _install(app, _classes()[3], "the ListOffsets workaround")


def install_offsets_probe(app: Any) -> None:
    """Send ``app``'s table-recovery offset queries through a probe connection (any Kafka broker).

    ``make_app`` calls it for every broker reached through ``PRISM_BROKER_URL``; the embedded
    broker's :func:`install_listoffsets_workaround` includes the probe. Nothing else of Faust's
    consumer changes: stock end offsets, stock fetch wait (see ``OffsetsProbeConsumerThread``).
    """
    _install(app, _classes()[0], "the offsets probe")


def _install(app: Any, transport_cls: type, what: str) -> None:
    scheme = str(app.conf.broker_consumer[0].scheme)
    if scheme != "kafka":
        raise ValueError(f"{what} applies to the kafka:// transport, not {scheme}://")
    if getattr(app, "_consumer", None) is not None:
        raise RuntimeError(f"install {what} before the app's consumer is created")
    app.transport = transport_cls(app.conf.broker_consumer, app)


def listoffsets_workaround_installed(app: Any) -> bool:
    """True when ``app`` uses the fetch-derived end offsets (for assertions and diagnostics)."""
    return isinstance(app.transport, _classes()[3])


def offsets_probe_installed(app: Any) -> bool:
    """True when ``app``'s recovery offset queries use the probe connection (Kafka or embedded)."""
    return isinstance(app.transport, _classes()[0])

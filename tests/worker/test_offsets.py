"""The offsets probe of app/worker/offsets.py on Apache Kafka: the table recovery's offset queries
on their own connection, not behind the worker consumer's 1.5 s long-poll fetch.

What was measured before (docs/testing.md, "One worker start"): Faust asks ``highwaters()`` and
``earliest_offsets()`` - and Prism's recovery its end-offset check - on the worker consumer's
connection, where the broker answers them only after the ``Fetch`` queued before them has waited
its ``fetch_max_wait_ms=1500``: in-process starts on Kafka came in ~1.5 s quanta (2.1-6.6 s).
The tests here hold the opposite: the recovery passes in well under one long poll, the queries
are sent by the probe's client, the probe asks with the worker consumer's isolation level, it is
stopped with the worker, and a probe that cannot connect is a typed error - and not the end of a
worker start, which then falls back to Faust's own (slower) path.

The embedded broker's side (fetch-derived end offsets, its 20 ms fetch wait): tests/broker/test_offsets.py.
SASL_SSL and mutual TLS: tests/kafka/test_worker_security.py (the worker starts with only the
recipe's ACLs, and its probe served the recovery).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.client import AIOKafkaClient

from app.errors import BrokerError
from app.worker import offsets
from app.worker.offsets import KAFKA_FETCH_MAX_WAIT_MS, offsets_probe_installed, start_offsets_probe
from tests.worker.conftest import make_topology
from tests.worker.harness import RunningPipeline

pytestmark = pytest.mark.integration

#: Faust's hard-coded long poll (Prism bounds it: 50 ms on Apache Kafka, 20 ms on the embedded broker).
LONG_POLL_S = 1.5


class _Requests:
    """Every request sent by any aiokafka client in this process: (client id, request, seconds).

    The worker consumer runs on its own thread (Faust's consumer thread), so the list is
    appended to from there; ``list.append`` is atomic."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, Any, float]] = []

    def by(self, client_id: str, kind: str) -> list[tuple[Any, float]]:
        return [(r, s) for c, r, s in list(self.sent) if c == client_id and type(r).__name__.startswith(kind)]


@pytest.fixture
def requests(monkeypatch: pytest.MonkeyPatch) -> Iterator[_Requests]:
    seen = _Requests()
    original = AIOKafkaClient.send

    async def send(self: AIOKafkaClient, node_id: Any, request: Any, **kwargs: Any) -> Any:
        started = time.monotonic()
        try:
            return await original(self, node_id, request, **kwargs)
        finally:
            seen.sent.append((self._client_id, request, time.monotonic() - started))

    monkeypatch.setattr(AIOKafkaClient, "send", send)
    yield seen


class _Marks(logging.Handler):
    """When Faust's recovery logged its phases (monotonic seconds)."""

    PHASES = ("Highwater for active changelog partitions", "Worker ready", "Recovery complete")

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.at: dict[str, float] = {}

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        for phase in self.PHASES:
            if phase in message:
                self.at.setdefault(phase, time.monotonic())

    async def wait_for(self, phase: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while phase not in self.at:
            if time.monotonic() > deadline:
                raise AssertionError(f"Faust's recovery did not log {phase!r} within {timeout:g}s; seen: {self.at}")
            await asyncio.sleep(0.01)


@pytest.fixture
def marks() -> Iterator[_Marks]:
    handler = _Marks()
    # mode names a service's logger after the module of its class: Prism's recovery subclass
    # (app/tables/recovery.py) logs Faust's phase lines as "app.tables.recovery"
    loggers = [logging.getLogger(name) for name in ("app.tables.recovery", "faust.tables.recovery")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
    try:
        yield handler
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.removeHandler(handler)
            logger.setLevel(level)


def _listoffsets_timestamps(request: Any) -> set[int]:
    """The timestamps a ListOffsets request asks for: -1 latest, -2 earliest."""
    topics = request._topics if hasattr(request, "_topics") else request.topics  # aiokafka 0.14: built per version
    out: set[int] = set()
    for _topic, partitions in topics:
        for entry in partitions:
            out.add(int(entry[1]))
    return out


async def test_the_recovery_on_kafka_does_not_wait_out_the_long_poll(kafka, tmp_path: Path, dev_keys,
                                                                     requests: _Requests, marks: _Marks,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    # Faust's own 1.5 s long poll, which the worker consumer has without Prism's bound
    # (test_the_worker_consumers_fetches_on_kafka_are_bounded): the probe must not wait behind it
    monkeypatch.setattr(offsets, "KAFKA_FETCH_MAX_WAIT_MS", int(LONG_POLL_S * 1000))
    topo = make_topology(tmp_path, dev_keys, partitions=2)
    rp = RunningPipeline(topo, kafka.bootstrap, tmp_path / "w", embedded=False)
    app = rp.pipeline.app
    assert offsets_probe_installed(app)
    thread = app.consumer._thread
    async with rp:
        worker_client = thread._ensure_consumer()._client._client_id
        # the long poll is there (Faust's 1500 ms, set above) - what the recovery's queries
        # would have queued behind
        assert thread._ensure_consumer()._fetch_max_wait_ms == int(LONG_POLL_S * 1000)
        probe = thread.offsets_probe
        assert probe is not None, "the recovery's offset queries did not start the probe"
        probe_client = probe._client._client_id
        assert probe_client != worker_client
        # the in-process start returns once the worker's services run; the recovery goes on
        await marks.wait_for("Recovery complete", timeout=30)
        recovered = marks.at["Recovery complete"] - marks.at["Highwater for active changelog partitions"]
        # the probe asked both ends of the changelogs (highwaters, earliest_offsets) and sent the
        # recovery's end-offset check (a Fetch from its client, not the worker consumer's)
        asked = set().union(*(_listoffsets_timestamps(r) for r, _ in requests.by(probe_client, "OffsetRequest")))
        assert {-1, -2} <= asked, asked
        assert requests.by(probe_client, "FetchRequest"), "the end-offset check was not sent by the probe"
        # every query the probe sent was answered at once, none near a long poll
        slowest = max(s for _, s in requests.by(probe_client, "OffsetRequest") + requests.by(probe_client, "Fetch"))
        assert slowest < LONG_POLL_S / 2, f"a probe request took {slowest:.2f}s"
        # before: 3.1 s of a 3.7-4.0 s start here, in quanta of one long poll (docs/testing.md)
        assert recovered < LONG_POLL_S * 2 / 3, f"Highwater -> Recovery complete took {recovered:.2f}s"
    # stopped with the worker: closed, no connection and no metadata task left behind
    assert thread.offsets_probe is None
    assert probe._closed
    assert not any(conn.connected() for conn in probe._client._conns.values())
    assert probe._client._sync_task is None or probe._client._sync_task.done()


async def test_the_worker_consumers_fetches_on_kafka_are_bounded(kafka, tmp_path: Path, dev_keys,
                                                                  requests: _Requests, marks: _Marks) -> None:
    """A fetch that finds no data returns after `KAFKA_FETCH_MAX_WAIT_MS`, not Faust's 1.5 s: such
    a fetch of idle partitions alone (the LNMP sequences changelog, which Faust keeps fetching)
    held a live stream's source partitions back for its whole long poll (app/worker/offsets.py,
    `OffsetsProbeConsumerThread._create_worker_consumer`)."""
    topo = make_topology(tmp_path, dev_keys, partitions=2)
    rp = RunningPipeline(topo, kafka.bootstrap, tmp_path / "w", embedded=False)
    thread = rp.pipeline.app.consumer._thread
    async with rp:
        consumer = thread._ensure_consumer()
        assert consumer._fetch_max_wait_ms == KAFKA_FETCH_MAX_WAIT_MS < 1500
        await marks.wait_for("Recovery complete", timeout=30)
        worker_client = consumer._client._client_id
        before = len(requests.by(worker_client, "Fetch"))
        await asyncio.sleep(2.0)  # nothing sent: every fetch waits out its long poll
        idle = [s for _, s in requests.by(worker_client, "Fetch")[before:]]
    assert len(idle) >= 10, f"{len(idle)} fetches in 2 s of an idle stream"
    assert max(idle) < 0.5, f"a fetch of an idle stream took {max(idle):.2f}s"


async def _open_transaction_topic(bootstrap: str, committed: int, pending: int) -> tuple[str, AIOKafkaProducer]:
    """A fresh topic with ``committed`` records in a committed transaction, then ``pending`` in one
    left open (the producer is returned: its ``stop()`` aborts it)."""
    topic = f"lso-{uuid.uuid4().hex[:8]}"
    from app.broker.admin import ensure_topics

    await ensure_topics(bootstrap, {topic: 1})
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, transactional_id=f"lso-{uuid.uuid4().hex[:8]}")
    await producer.start()
    async with producer.transaction():
        for i in range(committed):
            await producer.send(topic, b"c%d" % i, partition=0)
    await producer.begin_transaction()
    for i in range(pending):
        await producer.send(topic, b"p%d" % i, partition=0)
    await producer.flush()
    return topic, producer


@pytest.mark.parametrize("guarantee", ["exactly_once", "at_least_once"])
async def test_the_probe_reads_ends_with_the_worker_consumers_isolation_level(kafka, tmp_path: Path, dev_keys,
                                                                              guarantee: str) -> None:
    """Under exactly_once the worker consumer reads ``read_committed`` and Faust's highwaters are
    its ``ListOffsets(latest)`` - the last stable offset: a changelog with an open transaction
    ends before it. The probe must answer the same; at_least_once reads to the high watermark."""
    from faust.types import TP

    topic, producer = await _open_transaction_topic(kafka.bootstrap, committed=2, pending=3)
    try:
        topo = make_topology(tmp_path, dev_keys, partitions=1)
        async with RunningPipeline(topo, kafka.bootstrap, tmp_path / "w", embedded=False,
                                   processing_guarantee=guarantee) as rp:
            app = rp.pipeline.app
            thread = app.consumer._thread
            worker_level = thread._ensure_consumer()._isolation_level
            assert worker_level == ("read_committed" if guarantee == "exactly_once" else "read_uncommitted")
            ends = await app.consumer.highwaters(TP(topic, 0))
            assert thread.offsets_probe is not None
            assert thread.offsets_probe._isolation_level == worker_level
            # 2 committed records and their commit marker (offsets 0-2), then the open transaction (3-5)
            expected = 3 if guarantee == "exactly_once" else 6
            assert ends[TP(topic, 0)] == expected, ends
            assert (await app.consumer.earliest_offsets(TP(topic, 0)))[TP(topic, 0)] == 0
    finally:
        await producer.stop()


async def test_a_probe_that_cannot_connect_falls_back_to_the_worker_consumer(kafka, tmp_path: Path, dev_keys,
                                                                              caplog: pytest.LogCaptureFixture) -> None:
    """Not a hang and not a failed start: the BrokerError is logged, the queries go the stock way."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]  # closed again: connections are refused
    topo = make_topology(tmp_path, dev_keys, partitions=1)
    rp = RunningPipeline(topo, kafka.bootstrap, tmp_path / "w", embedded=False)
    thread = rp.pipeline.app.consumer._thread
    kwargs = thread._probe_kwargs
    thread._probe_kwargs = lambda: {**kwargs(), "bootstrap_servers": [f"127.0.0.1:{dead}"]}
    with caplog.at_level(logging.WARNING, logger="app.worker.offsets"):
        async with rp:
            assert thread.offsets_probe is None
            await rp.send(b'{"not": "an order"}')
            await rp.wait_read(1, timeout=60)  # the worker runs: the start did not fail
    warnings = [r.getMessage() for r in caplog.records if r.name == "app.worker.offsets"]
    assert any(f"could not connect to ['127.0.0.1:{dead}']" in w and "fix:" in w and "tried again in" in w
               for w in warnings), warnings


async def test_start_offsets_probe_refused_is_a_broker_error_at_once() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    started = time.monotonic()
    with pytest.raises(BrokerError, match=f"could not connect to 127.0.0.1:{dead}") as err:
        await start_offsets_probe({"bootstrap_servers": f"127.0.0.1:{dead}", "request_timeout_ms": 30_000})
    assert time.monotonic() - started < 5
    assert err.value.hint and "reachable" in err.value.hint


async def test_start_offsets_probe_on_a_silent_server_is_a_broker_error_after_the_timeout() -> None:
    """A server that accepts and never answers: bounded by the request timeout, not a hang."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                accepted.append(listener.accept()[0])
            except TimeoutError:
                continue

    acceptor = threading.Thread(target=accept, name="silent-broker", daemon=True)
    acceptor.start()
    try:
        started = time.monotonic()
        with pytest.raises(BrokerError, match=r"within 1s"):
            await start_offsets_probe({"bootstrap_servers": f"127.0.0.1:{port}", "request_timeout_ms": 1000})
        elapsed = time.monotonic() - started
        assert 0.9 <= elapsed < 5, elapsed
        assert accepted, "the probe never connected: the test did not exercise a silent broker"
    finally:
        stop.set()
        acceptor.join(5)
        for conn in accepted:
            conn.close()
        listener.close()
    await asyncio.sleep(0)  # the stopped probe's closed transport callbacks run inside the test


def _revocation_fixture(handler: Any) -> tuple[Any, Any, Any]:
    """A stand-in for Faust's consumer with the state a revocation touches, two partitions."""
    import contextlib
    from types import SimpleNamespace

    from faust.types import TP

    gone, kept = TP("src", 0), TP("src", 1)
    app = SimpleNamespace(_start_span_from_rebalancing=lambda name: contextlib.nullcontext())
    consumer = SimpleNamespace(
        app=app, _active_partitions={gone, kept}, _paused_partitions={gone}, _on_partitions_revoked=handler,
        _gap={gone: [3], kept: [9]}, _acked={gone: [5, 6], kept: [11]}, _acked_index={gone: {5, 6}, kept: {11}},
        _read_offset={gone: 6, kept: 11}, _committed_offset={gone: 5, kept: 11})
    return consumer, gone, kept


async def test_a_revocation_commits_what_was_acknowledged_before_it_forgets_the_partitions() -> None:
    """The app's revocation handler (Faust's: wait for the streams, then commit) must still see
    the revoked partitions' acknowledged offsets; they are forgotten after it. Stock Faust 0.15.3
    forgot them first, so its commit had nothing of them to commit (docs/operations.md, "What a
    rebalance does"). Also when the handler fails, the partitions are forgotten."""
    consumer_cls = offsets._faust_classes()[0].Consumer
    seen: list[tuple[Any, ...]] = []

    async def handler(revoked: Any) -> None:
        seen.append((set(revoked), dict(consumer._acked), dict(consumer._committed_offset),
                     set(consumer._active_partitions)))

    consumer, gone, kept = _revocation_fixture(handler)
    await consumer_cls.on_partitions_revoked(consumer, {gone})
    assert seen == [({gone}, {gone: [5, 6], kept: [11]}, {gone: 5, kept: 11}, {kept})]
    for name in offsets.REVOKED_PARTITION_STATE:
        assert getattr(consumer, name) == {kept: getattr(consumer, name)[kept]}, name
    assert consumer._active_partitions == {kept} and consumer._paused_partitions == set()

    async def failing(revoked: Any) -> None:
        raise RuntimeError("the handler failed")

    consumer, gone, kept = _revocation_fixture(failing)
    with pytest.raises(RuntimeError, match="the handler failed"):
        await consumer_cls.on_partitions_revoked(consumer, {gone})
    assert all(gone not in getattr(consumer, name) for name in offsets.REVOKED_PARTITION_STATE)


def test_a_gap_over_acknowledged_offsets_does_not_slow_the_commits_down() -> None:
    """Faust 0.15.3 merges a partition's gaps into its acknowledged offsets; an offset both
    acknowledged and in a gap was listed twice, its commit stopped at the copy and left it
    behind, and every later commit advanced by one or two offsets (seen after a rebalance under
    a live stream). The partition's list is cleaned after each commit, so the next takes
    everything consecutive again."""
    from collections import defaultdict

    from faust.types import TP
    from intervaltree import IntervalTree

    consumer_cls = offsets._faust_classes()[0].Consumer
    consumer = object.__new__(consumer_cls)  # the commit bookkeeping only, no service
    consumer._acked, consumer._acked_index = defaultdict(list), defaultdict(set)
    consumer._gap, consumer._committed_offset = defaultdict(IntervalTree), defaultdict(lambda: None)
    tp = TP("src", 0)
    consumer._committed_offset[tp] = 466
    consumer._acked[tp] = list(range(466, 1904))  # 466..1903 processed and acknowledged
    consumer._acked_index[tp] = set(consumer._acked[tp])
    consumer._gap[tp].addi(467, 470)  # and 467..469 recorded as a gap as well
    first = consumer_cls._new_offset(consumer, tp)  # Faust's: stops at the copy of 467
    consumer._committed_offset[tp] = first
    second = consumer_cls._new_offset(consumer, tp)
    assert (first, second) == (468, 1904)  # stock Faust: 468, 469, 470, ...
    assert consumer._acked[tp] == [] and consumer._acked_index[tp] == set()


def test_new_offset_keeps_faust_s_answer_on_a_clean_list() -> None:
    """No gap, no copy: the override changes nothing (a hole still holds the commit back)."""
    from collections import defaultdict

    from faust.types import TP
    from intervaltree import IntervalTree

    consumer_cls = offsets._faust_classes()[0].Consumer
    consumer = object.__new__(consumer_cls)
    consumer._acked, consumer._acked_index = defaultdict(list), defaultdict(set)
    consumer._gap, consumer._committed_offset = defaultdict(IntervalTree), defaultdict(lambda: None)
    tp = TP("src", 0)
    consumer._committed_offset[tp] = 10
    consumer._acked[tp] = [10, 11, 12, 14, 15]  # 13 not acknowledged yet
    consumer._acked_index[tp] = set(consumer._acked[tp])
    assert consumer_cls._new_offset(consumer, tp) == 13
    assert consumer._acked[tp] == [14, 15] and consumer._acked_index[tp] == {14, 15}

"""`BatchRunner` (app/worker/batch_runner.py), the hot path, without a broker: the shipped
orders-created chain and publisher over fetched messages, a recording delivery in place of
the broker writes. What it hands over, in which order, how it routes the counters, what it
does with records the consumer skipped and with inputs over the size limit."""

from __future__ import annotations

from collections import Counter
from collections.abc import Awaitable, Coroutine
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from faust.streams import _current_event
from faust.types import Message as FaustMessage

from app.agents.chain import Chain
from app.agents.dedup import Dedup
from app.agents.dlq import DlqRecord
from app.agents.publish import Publisher
from app.envelope import decode, encode, new_envelope
from app.security.devkeys import DevKeys
from app.security.signing import load_signing_keyring
from app.tables.dedup import DedupWindow
from app.worker.batch_runner import BatchRunner
from app.worker.continuity import OffsetTracker
from app.worker.delivery import Batch, BatchEnd
from app.worker.limits import WriteLimits, record_size
from app.worker.pipeline import build_stages, resolve_schema
from app.worker.size_fit import SizeFitter
from tests.worker.conftest import make_topology
from tests.worker.fake_delivery import FakeConsumer, RecordingObserver, worker


class RecordingDelivery:
    """Takes each batch and ends it at once, as a delivery whose writes all succeeded."""

    def __init__(self) -> None:
        self.batches: list[Batch] = []

    def deliver(self, batch: Batch, previous: Awaitable[None] | None, end: BatchEnd) -> Coroutine[Any, Any, None]:
        self.batches.append(batch)

        async def finish() -> None:
            end.count(batch)
            end.account(batch)
        return finish()

    async def close(self) -> None: ...


class Counters:
    """The topic counters table: records each write with the partition Faust would route it to
    (the current event's), which must be the partition it counts."""

    def __init__(self) -> None:
        self.writes: list[tuple[str, str, int, int, int]] = []

    def incr(self, topic: str, outcome: str, n: int, *, partition: int) -> None:
        event = _current_event.get()
        routed = event().message.partition if event is not None else -1
        self.writes.append((topic, outcome, n, partition, routed))


class Holes:
    """The hole fetcher: every partition starts at offset 0; `records` are what the broker has."""

    def __init__(self, records: list[Any], *, fail: bool = False) -> None:
        self.records, self.fail = records, fail
        self.fetched: list[Any] = []

    async def expected_start(self, topic: str, partition: int) -> int:
        if self.fail:
            raise ConnectionError("broker gone")
        return 0

    async def fetch(self, hole: Any) -> list[Any]:
        self.fetched.append(hole)
        return [r for r in self.records if hole.start <= r.offset < hole.end]


def _runner(tmp_path: Path, keys: DevKeys, holes: Holes | None = None,
            ) -> tuple[BatchRunner, RecordingDelivery, Counters, FakeConsumer, Any, RecordingObserver, str]:
    topo = make_topology(tmp_path, keys, partitions=2)
    src = topo.sources[0].topic
    keyring = load_signing_keyring(keys.signing_path)
    stages = build_stages(topo, keyring=keyring, schema=resolve_schema(topo.stage("enrich"), topo.base_dir,
                                                                       validate=True),
                          dedup_window=lambda window_s: DedupWindow({}, window=window_s))
    chain = Chain(stages, dlq_topic_for=lambda t: t + topo.dlq.topic_suffix)
    publisher = Publisher(topo, worker_key=keyring.signing[topo.outputs.signing_key_id or keyring.worker_key_id])
    app, consumer, state, observer = worker()
    outputs = tuple(publisher._output_topics(src))
    fitter = SizeFitter(app, WriteLimits(256 * 1024, output_topics=outputs), write_topics=(*outputs, src + ".dlq"),
                        source_outputs={src: outputs}, overflow=None, stats=state.stats, bootstrap="unused:9",
                        settings=None)
    fitter.limits_read.set()  # as after the broker answered
    delivery, counters = RecordingDelivery(), Counters()
    dedup = next(s for s in chain.stages if isinstance(s, Dedup))
    runner = BatchRunner(app, publisher=publisher, delivery=delivery, state=state, fitter=fitter,  # type: ignore[arg-type]
                         offsets=OffsetTracker(), hole_fetcher=holes or Holes([]), counters=counters,  # type: ignore[arg-type]
                         sequences=SimpleNamespace(observe=lambda s, n: SimpleNamespace(status="ok")),  # type: ignore[arg-type]
                         dedups={id(chain): dedup}, observe=observer)
    runner.chain = chain  # type: ignore[attr-defined]
    return runner, delivery, counters, consumer, chain, observer, src


def _fetched(src: str, partition: int, offset: int, value: bytes) -> FaustMessage:
    return FaustMessage(src, partition, offset, 0.0, 0, [], b"k%d" % offset, value, None)


def _good(src: str, i: int) -> bytes:
    return encode(new_envelope(src, {"i": i}, namespace="order-events"))


def _forbidden(src: str) -> bytes:
    """An envelope in a namespace no producer may publish here: the chain dead-letters it."""
    return encode(new_envelope(src, {"i": -1}, namespace="billing"))


@pytest.fixture
def keys(dev_keys: DevKeys) -> DevKeys:
    return dev_keys


async def test_a_batch_runs_the_chain_in_order_and_hands_one_signed_fitted_batch_over(tmp_path: Path,
                                                                                      keys: DevKeys) -> None:
    runner, delivery, counters, _, chain, _, src = _runner(tmp_path, keys)
    too_big = b"x" * (runner.fitter.input_limit_for(src) + 1)
    fetched = [_fetched(src, 0, 0, _good(src, 0)), _fetched(src, 1, 0, _forbidden(src)),
               _fetched(src, 0, 1, too_big), _fetched(src, 1, 1, _good(src, 1))]
    await runner.process(chain, fetched)
    [b] = delivery.batches
    assert b.records == fetched and b.repaired == []
    assert [(m.partition, m.offset) for m, _ in b.pending] == [(0, 0), (1, 0), (0, 1), (1, 1)]  # input order
    kinds = ["dlq" if isinstance(item, DlqRecord) else sorted(e.topic for e in item) for _, item in b.pending]
    assert kinds == [[src + ".v2", src + ".v3"], "dlq", "dlq", [src + ".v2", src + ".v3"]]
    assert b.pending[2][1].reason == "too_large" and runner.stats.too_large == 1  # the chain did not run
    assert b.outcomes == {(src, 0, "emitted"): 1, (src, 0, "dlq"): 1, (src, 1, "dlq"): 1, (src, 1, "emitted"): 1}
    # one counter write per (partition, outcome), routed to the partition it counts
    assert sorted(counters.writes) == [(src, "dlq", 1, 0, 0), (src, "dlq", 1, 1, 1), (src, "emitted", 1, 0, 0),
                                       (src, "emitted", 1, 1, 1)]
    assert _current_event.get() is None  # no stand-in left behind
    assert runner.stats.read == 4
    # one signature for the batch (scope batch): every output carries the same one
    sigs = [decode(e.record.value).security.signature for _, item in b.pending if isinstance(item, list)
            for e in item if e.topic.endswith(".v3")]
    assert len(sigs) == 2 and sigs[0] and sigs[0] == sigs[1]


async def test_records_the_consumer_skipped_are_fetched_and_run_first(tmp_path: Path, keys: DevKeys) -> None:
    src_holder: list[Any] = []
    holes = Holes(src_holder)
    runner, delivery, _, _, chain, _, src = _runner(tmp_path, keys, holes)
    src_holder.extend(SimpleNamespace(topic=src, partition=0, offset=o, value=_good(src, o), key=b"k", headers=[],
                                      timestamp=0) for o in range(3))
    await runner.process(chain, [_fetched(src, 0, 0, _good(src, 0))])
    await runner.process(chain, [_fetched(src, 0, 3, _good(src, 3))])  # 1 and 2 never arrived
    second = delivery.batches[1]
    assert [m.offset for m in second.repaired] == [1, 2]
    assert [m.offset for m, _ in second.pending] == [1, 2, 3]  # repaired first, in order
    assert runner.stats.holes_repaired == 2 and runner.stats.read == 4 and second.size == 3


async def test_stopping_while_the_broker_does_not_answer_abandons_the_batch(tmp_path: Path, keys: DevKeys) -> None:
    runner, delivery, _, consumer, chain, observer, src = _runner(tmp_path, keys, Holes([], fail=True))
    runner.state.app.should_stop = True  # the start offset cannot be read and the worker is stopping
    m = _fetched(src, 0, 0, _good(src, 0))
    consumer._unacked_messages.add(m)
    await (await runner.start(chain, [m], None))
    assert delivery.batches == [] and observer.abandoned == 1 and runner.stats.abandoned_batches == 1
    assert not consumer._unacked_messages and runner.stats.read == 0 and _current_event.get() is None


async def test_outputs_are_held_to_their_exact_size_and_new_limits_are_followed(tmp_path: Path, keys: DevKeys) -> None:
    """`SizeFitter.fit` measures every output exactly (a record of exactly the limit fits, one
    byte less of limit sends the message to the DLQ as too_large), and the input limit, asked
    once per message and remembered, follows the limits when they are replaced (re-read, lowered)."""
    runner, delivery, _, _, chain, _, src = _runner(tmp_path, keys)
    fitter = runner.fitter
    roomy = fitter.input_limit_for(src)
    await runner.process(chain, [_fetched(src, 0, 0, _good(src, 0))])
    [(msg, item)] = delivery.batches[0].pending
    assert isinstance(item, list)
    v3 = next(e for e in item if e.topic == src + ".v3")
    size = record_size(v3.record.key, v3.record.value, v3.record.headers)
    for limit, fits in ((size, True), (size - 1, False)):
        fitter.limits = WriteLimits(fitter.limits.max_request_size, {src + ".v3": limit},
                                    output_topics=fitter.limits.output_topics)
        pending: list[Any] = [(msg, list(item))]
        outcomes = Counter({(src, 0, "emitted"): 1})
        fitter.fit(chain, pending, outcomes, None)
        assert isinstance(pending[0][1], list) is fits, limit
        if not fits:
            dlq = pending[0][1]
            assert dlq.reason == "too_large" and any(f"would be {size} bytes".encode() in v for _, v in dlq.headers)
            assert outcomes == {(src, 0, "emitted"): 0, (src, 0, "dlq"): 1}
        # the input limit follows the limits now in force, not the ones first asked about
        assert fitter.input_limit_for(src) == fitter.limits.input_limit_for(fitter.source_outputs[src]) < roomy


async def _until(condition: Any, timeout: float = 5.0) -> None:
    """Wait for `condition()` (the timer of held counts), failing after `timeout` seconds."""
    import asyncio

    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        assert loop.time() < deadline, "condition not met in time"
        await asyncio.sleep(0.005)


async def test_held_counts_are_written_once_per_interval_with_the_same_sums(tmp_path: Path, keys: DevKeys) -> None:
    """at_least_once (`count_every_s`): three finished batches make no counter write and no
    metric pass of their own; the interval's flush writes each (partition, outcome) once with
    the batches' sum, routed to its partition, one metric pass over all results in order, and
    only then `read` - a reader that sees read == n sees all n counted."""
    runner, _, counters, _, chain, observer, src = _runner(tmp_path, keys)
    runner.count_every_s = 3600.0  # the timer does not fire in this test: the flush is called
    batches = [[_fetched(src, 0, 0, _good(src, 0)), _fetched(src, 1, 0, _forbidden(src))],
               [_fetched(src, 0, 1, _good(src, 1))],
               [_fetched(src, 1, 1, _good(src, 2)), _fetched(src, 0, 2, _forbidden(src))]]
    for b in batches:
        await runner.process(chain, b)
    assert counters.writes == [] and runner.stats.read == 0 and observer.counted == []
    assert observer.finished == 3  # no longer in flight: pause and shutdown need not wait for the count
    runner.flush_counts()
    assert sorted(counters.writes) == [(src, "dlq", 1, 0, 0), (src, "dlq", 1, 1, 1), (src, "emitted", 1, 1, 1),
                                       (src, "emitted", 2, 0, 0)]
    assert observer.counted == [(src, [(0, 0), (1, 0), (0, 1), (1, 1), (0, 2)])]
    assert runner.stats.read == 5 and _current_event.get() is None
    runner.flush_counts()  # nothing held: nothing written twice
    assert len(counters.writes) == 4 and runner.stats.read == 5


async def test_held_counts_are_written_by_the_interval_timer(tmp_path: Path, keys: DevKeys) -> None:
    runner, _, counters, _, chain, _, src = _runner(tmp_path, keys)
    runner.count_every_s = 0.02
    await runner.process(chain, [_fetched(src, 0, 0, _good(src, 0))])
    await runner.process(chain, [_fetched(src, 0, 1, _good(src, 1))])
    await _until(lambda: runner.stats.read == 2)
    assert counters.writes == [(src, "emitted", 2, 0, 0)]  # both batches in one write


async def test_every_offset_commit_counts_the_held_batches_first(tmp_path: Path, keys: DevKeys) -> None:
    """`hold_counts_until_commit`: Faust's commit (periodic, `commit_every`, a rebalance's, the
    last one at shutdown) finds every acknowledged batch counted before it picks its offsets -
    no commit covers a message whose counts are still held."""
    from app.worker.batch_runner import hold_counts_until_commit

    runner, _, counters, _, chain, _, src = _runner(tmp_path, keys)
    runner.count_every_s = 3600.0
    seen_at_commit: list[tuple[int, int]] = []

    class Consumer:
        async def commit(self, *args: Any, **kwargs: Any) -> bool:
            seen_at_commit.append((len(counters.writes), runner.stats.read))
            return True

    consumer = Consumer()
    hold_counts_until_commit(consumer, runner)
    await runner.process(chain, [_fetched(src, 0, 0, _good(src, 0)), _fetched(src, 1, 0, _good(src, 1))])
    assert counters.writes == []
    assert await consumer.commit() is True
    assert seen_at_commit == [(2, 2)]


async def test_without_an_interval_each_batch_is_counted_before_its_acknowledgement(tmp_path: Path,
                                                                                   keys: DevKeys) -> None:
    """`count_every_s` 0 (exactly_once, where the counts belong to the batch's transaction):
    counted by each batch itself, nothing held."""
    runner, _, counters, _, chain, observer, src = _runner(tmp_path, keys)
    assert runner.count_every_s == 0
    await runner.process(chain, [_fetched(src, 0, 0, _good(src, 0))])
    assert counters.writes == [(src, "emitted", 1, 0, 0)] and runner.stats.read == 1
    assert runner._held == [] and observer.counted == []


async def test_each_message_runs_as_itself_with_its_partition_as_the_current_event(tmp_path: Path,
                                                                                   keys: DevKeys) -> None:
    """Faust's tables route a write by the current event: while the chain runs a message, the
    stand-in is its own topic's and partition's - when partitions alternate, and when the next
    message has the same partition number in another topic (a batch source can read several
    topics; the stand-in is looked up only when the partition changes). The `Message` the chain
    gets is the record as fetched: headers without the valueless ones, the timestamp in ms."""
    runner, _, _, _, chain, _, src = _runner(tmp_path, keys)
    other = src + ".other"
    seen: list[tuple[str, int, str, int, list[tuple[str, bytes]], int | None]] = []
    run = chain.run

    def spy(msg: Any) -> Any:
        current = _current_event.get()().message  # type: ignore[misc]
        seen.append((current.topic, current.partition, msg.topic, msg.partition, list(msg.headers),
                     msg.timestamp_ms))
        return run(msg)

    chain.run = spy  # type: ignore[method-assign]
    fetched = [_fetched(src, 0, 0, _good(src, 0)), _fetched(other, 0, 0, _forbidden(src)),
               _fetched(src, 0, 1, _good(src, 1)), _fetched(src, 1, 0, _good(src, 2)),
               _fetched(other, 0, 1, _forbidden(src)), _fetched(src, 1, 1, _good(src, 3))]
    fetched[2] = FaustMessage(src, 0, 1, 1764495000.123, 0, [("a", b"1"), ("gone", None), ("b", b"")],
                              b"k", _good(src, 1), None)
    fetched[3] = FaustMessage(src, 1, 0, None, 0, None, b"k", _good(src, 2), None)  # type: ignore[arg-type]
    await runner.process(chain, fetched)
    assert [(t, p) for t, p, *_ in seen] == [(m.topic, m.partition) for m in fetched]
    assert [(t, p) for _, _, t, p, _, _ in seen] == [(m.topic, m.partition) for m in fetched]
    assert [h for *_, h, _ in seen] == [[], [], [("a", b"1"), ("b", b"")], [], [], []]
    assert [ts for *_, ts in seen] == [None, None, 1764495000123, None, None, None]
    assert _current_event.get() is None


async def test_an_input_is_measured_with_its_key_and_every_header(tmp_path: Path, keys: DevKeys) -> None:
    """The input limit holds key + value + each header's name and value: an input of exactly the
    limit runs the chain, one byte more - in the value or in a header - goes to the DLQ as
    too_large without running it."""
    runner, delivery, _, _, chain, _, src = _runner(tmp_path, keys)
    limit = runner.fitter.input_limit_for(src)
    headers = [("h1", b"abc"), ("name", b"")]  # 9 bytes
    value = b"x" * (limit - 2 - 9)  # key b"k<offset>": 2 bytes
    fetched = [FaustMessage(src, 0, 0, 0.0, 0, headers, b"k0", value, None),
               FaustMessage(src, 0, 1, 0.0, 0, [*headers, ("", b"y")], b"k1", value, None),
               FaustMessage(src, 0, 2, 0.0, 0, headers, b"k2", value + b"x", None),
               FaustMessage(src, 0, 3, 0.0, 0, [], b"k3", value + b"x" * 9, None)]
    await runner.process(chain, fetched)
    reasons = [item.reason if isinstance(item, DlqRecord) else "emitted" for _, item in delivery.batches[0].pending]
    assert reasons[1:3] == ["too_large", "too_large"] and reasons[0] != "too_large" and reasons[3] != "too_large"
    assert runner.stats.too_large == 2

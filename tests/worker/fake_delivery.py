"""Broker-free parts for the delivery and batch runner unit tests: a producer that fails chosen
records (the aiokafka batch API, `tests/worker/test_batch_send.py`), a Faust-like consumer with
the acknowledgement bookkeeping `ack_all`/`release_all` touch, and a fitter without a broker.
The end-to-end tests (`*_e2e.py`) run the same code on real brokers."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from types import SimpleNamespace
from typing import Any

from faust.types import Message as FaustMessage

from app.agents.base import Message
from app.agents.dlq import DlqRecord
from app.agents.publish import Emission
from app.bindings.kafka import KafkaRecord
from app.worker.delivery import Batch
from app.worker.worker_state import WorkerState
from tests.worker.test_batch_send import FakeAiokafka


class FailingProducer(FakeAiokafka):
    """Fails a batch holding a chosen value with the error `fail_with[value]` - `times[value]`
    times (default: always)."""

    def __init__(self, fail_with: dict[bytes, BaseException] | None = None, times: dict[bytes, int] | None = None,
                 room: int = 100) -> None:
        super().__init__(room=room)
        self.fail_with = dict(fail_with or {})
        self.times = dict(times or {})

    async def send_batch(self, batch: Any, topic: str, *, partition: int) -> asyncio.Future[None]:
        self.batches.append((topic, list(batch.records)))
        fut = asyncio.get_running_loop().create_future()
        err = next((self.fail_with[v] for v in batch.records if v in self.fail_with), None)
        if err is not None:
            value = next(v for v in batch.records if v in self.fail_with)
            left = self.times.get(value)
            if left is not None:
                self.times[value] = left - 1
                if left - 1 <= 0:
                    del self.fail_with[value]
            fut.set_exception(err)
        else:
            fut.set_result(None)
        return fut

    def written(self, topic: str) -> list[bytes]:
        return [v for t, vs in self.batches for v in vs if t == topic]


class FaustProducer:
    """Faust's producer as the worker sees it: the aiokafka producer beneath."""

    def __init__(self, inner: FakeAiokafka) -> None:
        self.inner = inner

    def _ensure_producer(self) -> FakeAiokafka:
        return self.inner


class FakeConsumer:
    """The parts of Faust's consumer that acknowledging and releasing messages touch."""

    def __init__(self) -> None:
        self._committed_offset: dict[Any, int | None] = defaultdict(lambda: None)
        self._acked_index: dict[Any, set[int]] = defaultdict(set)
        self._acked: dict[Any, list[int]] = defaultdict(list)
        self._unacked_messages: set[Any] = set()
        self._n_acked = 0
        self._waiting_for_ack: asyncio.Future[None] | None = None
        self.app = SimpleNamespace(topics=SimpleNamespace(acks_enabled_for=lambda topic: True))

    def acked_offsets(self) -> list[int]:
        return sorted(o for offsets in self._acked.values() for o in offsets)


class FakeFitter:
    """`SizeFitter` without a broker: no limit these records reach; counts its calls."""

    def __init__(self) -> None:
        self.limits = SimpleNamespace(limit_for=lambda topic: 1 << 30)
        self.refusals = 0
        self.fits = 0

    async def after_refusal(self) -> None:
        self.refusals += 1

    def fit(self, chain: Any, pending: Any, outcomes: Any, observed: Any) -> None:
        self.fits += 1

    def fit_dlq(self, rec: DlqRecord) -> DlqRecord:
        return rec

    def lower(self, rec: DlqRecord, err: BaseException) -> DlqRecord:
        return rec


class FakeChain:
    """What a delivery asks of the chain: a DLQ copy for a message whose outputs failed."""

    def dlq_for_publish_failure(self, msg: Message, cause: Exception, *, late: bool = False) -> Any:
        return SimpleNamespace(dlq=DlqRecord(msg.topic + ".dlq", msg.key, b"dlq:" + msg.value, headers=[]))


class RecordingEnd:
    """The runner's side of `BatchEnd`, recording the order of the calls."""

    def __init__(self, consumer: FakeConsumer) -> None:
        self.consumer = consumer
        self.calls: list[tuple[str, int]] = []

    def count(self, batch: Batch) -> None:
        # counted before the acknowledgement: nothing of this batch is acknowledged yet
        self.calls.append(("count", len(self.consumer.acked_offsets())))

    def account(self, batch: Batch) -> None:
        self.calls.append(("account", len(self.consumer.acked_offsets())))


class RecordingObserver:
    paused: set[str] = set()

    def __init__(self) -> None:
        self.abandoned = 0
        self.blocked: list[str | None] = []
        self.finished = 0
        #: (topic, [(partition, offset) of each observed message]) per `count_batches` call
        self.counted: list[tuple[str, list[tuple[int, int]]]] = []

    def batch_started(self) -> None: ...

    def batch_done(self, chain: Any, topic: str, observed: Any) -> None: ...

    def batch_finished(self) -> None:
        self.finished += 1

    def count_batches(self, chain: Any, topic: str, observed: Any) -> None:
        self.counted.append((topic, [(m.partition, m.offset) for m, _ in observed]))

    def batch_abandoned(self) -> None:
        self.abandoned += 1

    def set_blocked(self, reason: str | None) -> None:
        self.blocked.append(reason)


def worker(max_attempts: int = 3) -> tuple[Any, FakeConsumer, WorkerState, RecordingObserver]:
    """A fake Faust app, its consumer and the worker state over them."""
    consumer = FakeConsumer()
    app = SimpleNamespace(should_stop=False, consumer=consumer, producer=None, conf=SimpleNamespace(id="g"))
    topology = SimpleNamespace(name="t", sources=[],
                               dlq=SimpleNamespace(max_attempts=max_attempts, backoff_initial_ms=1, backoff_max_ms=2))
    observer = RecordingObserver()
    state = WorkerState(app, topology, observe=observer)  # type: ignore[arg-type]
    state.set_fetching = _no_fetching  # type: ignore[method-assign]
    return app, consumer, state, observer


async def _no_fetching(*, paused: bool) -> None:
    """No consumer thread to pause here (the blocked path is tested end to end in test_write_limits.py)."""


def batch(consumer: FakeConsumer, n: int, *, topic: str = "src", partition: int = 0, start: int = 0) -> Batch:
    """`n` fetched messages, each with a .v2 and a .v3 output whose values name them."""
    records, pending = [], []
    for i in range(start, start + n):
        fm = FaustMessage(topic, partition, i, 0.0, 0, [], b"k", b"m%d" % i, None)
        consumer._unacked_messages.add(fm)
        records.append(fm)
        msg = Message(topic=topic, partition=partition, offset=i, value=b"m%d" % i, key=b"k", headers=[])
        pending.append((msg, [Emission(f"{topic}.{layout}", KafkaRecord(key=b"k", value=b"%s-%d" % (
            layout.encode(), i), headers=[], timestamp_ms=1000)) for layout in ("v2", "v3")]))
    from collections import Counter

    return Batch(FakeChain(), records, [], pending, Counter(), {}, None, None, None)  # type: ignore[arg-type]

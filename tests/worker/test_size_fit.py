"""`SizeFitter.fit` (app/worker/size_fit.py) with the send behind it (`send_all`,
app/worker/delivery.py), without a broker: every output record is measured once on its way to
the broker - by the fit, which keeps the size on the output (`Emission.size`) - and the send holds
that size to the limit in force when it sends, exactly as it did when it measured the record
again itself (issue 29). An output over its topic's limit still goes to the DLQ as too_large at
the fit; nothing over a limit is appended at the send - lowered limits, a producer limit below
the topic's, and DLQ copies included. The real chain's too_large copy is in test_batch_runner.py."""

from __future__ import annotations

import array
import itertools
from collections import Counter
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka.errors import RecordTooLargeError

from app.agents.base import Message
from app.agents.dlq import DlqRecord
from app.agents.publish import Emission
from app.bindings.kafka import KafkaRecord
from app.worker import batch_send, delivery, size_fit
from app.worker.batch_send import RefusedUpFront
from app.worker.delivery import send_all
from app.worker.limits import WriteLimits, record_size
from app.worker.size_fit import SizeFitter
from tests.support import require
from tests.worker.fake_delivery import FakeChain, FaustProducer, worker
from tests.worker.test_batch_send import FakeAiokafka

SRC = "src"
V2, V3, DLQ = SRC + ".v2", SRC + ".v3", SRC + ".dlq"
HEADERS = [("prism-message-id", b"m" * 36), ("prism-source", b"src/0/1")]
ROOMY = 1 << 20


def _fitter(topic_limits: dict[str, int] | None = None) -> SizeFitter:
    app, _, state, _ = worker()
    fitter = SizeFitter(app, WriteLimits(ROOMY, dict(topic_limits or {}), output_topics=(V2, V3)),  # type: ignore[arg-type]
                        write_topics=(V2, V3, DLQ), source_outputs={SRC: (V2, V3)}, overflow=None, stats=state.stats,
                        bootstrap="unused:9", settings=None)
    fitter.limits_read.set()
    return fitter


def _message(i: int) -> tuple[Message, list[Emission]]:
    """A message (~3 KB: its DLQ copy, `FakeChain`'s, is over a 1,200-byte DLQ limit) and its two
    outputs, ~1.4 and ~1.6 KB (over `WriteLimits.lowered`'s 1 KiB floor; the .v3 the larger)."""
    msg = Message(topic=SRC, partition=0, offset=i, value=b"m%d-" % i * 1000, key=b"k%d" % i, headers=[])
    return msg, [Emission(t, KafkaRecord(key=msg.key, value=b"%s-%d-" % (t.encode(), i) * n, headers=list(HEADERS),
                                         timestamp_ms=1000 + i)) for t, n in ((V2, 150), (V3, 170))]


def _size(e: Emission) -> int:
    return record_size(e.record.key, e.record.value, e.record.headers)


def _producer(max_request: int = ROOMY) -> FakeAiokafka:
    p = FakeAiokafka(room=100)
    p._max_request_size = max_request
    return p


def _outcomes(pending: list[Any]) -> Counter[tuple[str, int, str]]:
    return Counter({(SRC, 0, "emitted"): len(pending)})


@pytest.fixture
def measured(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """How often the fit and the send each measure a record (aiokafka's size estimate, or at the
    fit `prism_native.record_tail`, which gives it with the record's headers written ahead)."""
    calls = {"fit": 0, "send": 0}
    real = size_fit._size
    real_tail = size_fit._tail

    def fit_size(key: Any, value: Any, headers: Any) -> int:
        calls["fit"] += 1
        return real(key, value, headers)

    def fit_tail(key: Any, value: Any, headers: Any) -> tuple[int, bytes]:
        calls["fit"] += 1
        assert real_tail is not None
        return real_tail(key, value, headers)

    if real_tail is not None:
        monkeypatch.setattr(size_fit, "_tail", fit_tail)

    def send_size(key: Any, value: Any, headers: Any) -> int:
        calls["send"] += 1
        return real(key, value, headers)

    monkeypatch.setattr(size_fit, "_size", fit_size)
    monkeypatch.setattr(batch_send, "DefaultRecordBatchBuilder", SimpleNamespace(estimate_size_in_bytes=send_size))
    return calls


async def test_each_output_is_measured_once_on_its_way_to_the_broker(measured: dict[str, int]) -> None:
    fitter = _fitter()
    pending: list[Any] = [_message(i) for i in range(4)]
    dlq = DlqRecord(DLQ, b"k", b"d" * 100, [("prism.errors.reason", b"schema_invalid")], None, "schema_invalid")
    pending.append((Message(topic=SRC, partition=0, offset=4, value=b"m4", key=b"k4", headers=[]), dlq))
    fitter.fit(FakeChain(), pending, _outcomes(pending), None)  # type: ignore[arg-type]
    assert measured == {"fit": 8, "send": 0}
    assert all(e.size == _size(e) for _, item in pending[:4] for e in item)  # kept on each output
    p = _producer()
    errors = await send_all(FaustProducer(p), [item for _, item in pending], fitter.limits.limit_for)
    assert errors == [None] * 5
    # the send measured the DLQ copy only (the fit cuts a DLQ copy down, it does not keep its size)
    assert measured == {"fit": 8, "send": 1}
    assert [t for t, _ in p.batches] == [V2, V3, DLQ] and len(p.batches[0][1]) == 4


@pytest.mark.parametrize("compiled", [True, False])
async def test_each_output_keeps_its_size_and_with_the_module_its_headers_written_ahead(
        compiled: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """With `prism_native` the fit keeps the record's size (aiokafka's estimate, the same number)
    and its headers as a record batch holds them (`Emission.tail`, what the compiled batch writer
    copies); without it the size alone. A record the compiled call does not take (a value of
    two-byte items, which aiokafka's estimate counts by its length) is measured by the estimate,
    without a tail. `send_all` hands each output's own size and tail to `send_batched` (a DLQ
    copy: neither)."""
    if compiled:
        require(size_fit._tail is not None, "prism_native is not built or is stale (make native: needs cargo)")
    else:
        monkeypatch.setattr(size_fit, "_tail", None)
    fitter = _fitter()
    pending: list[Any] = [_message(i) for i in range(3)]
    value = memoryview(array.array("H", [1, 2, 3]))
    odd = Emission(V2, KafkaRecord(key=b"k", value=value, headers=list(HEADERS), timestamp_ms=1))  # type: ignore[arg-type]
    pending.append((pending[2][0], [odd]))
    fitter.fit(FakeChain(), pending, _outcomes(pending), None)  # type: ignore[arg-type]
    outputs = [e for _, item in pending[:3] for e in item]
    assert all(e.size == _size(e) for e in outputs) and odd.size == _size(odd) and odd.tail is None
    if compiled:
        assert all(e.tail == _header_tail(e.record.headers) for e in outputs)
    else:
        assert all(e.tail is None for e in outputs)
    handed: list[Any] = []

    async def capture(producer: Any, items: list[Any], **kwargs: Any) -> list[None]:
        handed.extend(items)
        return [None] * len(items)

    monkeypatch.setattr(delivery, "send_batched", capture)
    dlq = DlqRecord(DLQ, b"k", b"d", [("prism.errors.reason", b"schema_invalid")], None, "schema_invalid")
    await send_all(FaustProducer(_producer()), [item for _, item in pending[:3]] + [dlq], fitter.limits.limit_for)
    assert [[(r[0], r[5], r[6]) for r in item] for item in handed[:3]] == \
        [[(e.topic, e.size, e.tail) for e in item] for _, item in pending[:3]]
    assert all(r[6] is e.tail for item, (_, es) in zip(handed[:3], pending[:3], strict=True)
               for r, e in zip(item, es, strict=True))
    assert handed[3] == [(DLQ, b"k", b"d", None, dlq.headers, None, None)]


def _varint(n: int) -> bytes:
    z, out = (n << 1) ^ (n >> 63), bytearray()
    while z >= 0x80:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


def _header_tail(headers: list[tuple[str, bytes | None]]) -> bytes:
    """A record's headers as a Kafka v2 record batch holds them, written independently of the
    compiled code: the header count, then each key (UTF-8) and value, every length a zigzag
    varint (-1 for a null value)."""
    def field(b: bytes | None) -> bytes:
        return _varint(-1) if b is None else _varint(len(b)) + b

    return _varint(len(headers)) + b"".join(field(k.encode()) + field(v) for k, v in headers)


#: Each case: (limit of .v3 at the fit, at the send, the producer's max_request_size), as
#: offsets from the .v3 record's size (None: roomy). -1 anywhere at the send: over by one byte.
CASES = list(itertools.product([None, 0], [None, 0, -1], [None, 0, -1]))


@pytest.mark.parametrize(("at_fit", "at_send", "max_request"), CASES)
async def test_the_send_holds_a_fitted_output_to_the_limit_in_force_then_as_if_it_measured_it(
        at_fit: int | None, at_send: int | None, max_request: int | None) -> None:
    """The fit's limit (`WriteLimits.limit_for`) and the send's (`min(max_request_size, limit_for)`
    of the limits in force at the send: re-read, or lowered after a refusal) may differ. With the
    size the fit kept, the send refuses exactly what it refused when it measured each record
    itself - the same errors, the same records appended - and exactly what is over its limit."""
    msg, outputs = _message(0)
    size = _size(outputs[1])
    fitter = _fitter(None if at_fit is None else {V3: size + at_fit})
    pending: list[Any] = [(msg, outputs)]
    fitter.fit(FakeChain(), pending, _outcomes(pending), None)  # type: ignore[arg-type]
    assert pending[0][1] is outputs and outputs[1].size == size  # within the fit's limit: not dead-lettered
    fitter.limits = WriteLimits(ROOMY, {} if at_send is None else {V3: size + at_send}, output_topics=(V2, V3))
    results = []
    for keep_size in (True, False):  # the fit's sizes, and the send measuring every record again
        items = [[Emission(e.topic, e.record, e.size if keep_size else None) for e in outputs]]
        p = _producer(ROOMY if max_request is None else size + max_request)
        errors = await send_all(FaustProducer(p), items, fitter.limits.limit_for)
        results.append(([None if e is None else (type(e), str(e)) for e in errors], p.batches))
    assert results[0] == results[1]
    [error], batches = results[0]
    if at_send == -1 or max_request == -1:
        assert error is not None and error[0] is RefusedUpFront and f"is {size} bytes" in error[1]
        assert batches == [(V2, [outputs[0].record.value])]  # .v2 went before; nothing of .v3
    else:
        assert error is None and batches == [(V2, [outputs[0].record.value]), (V3, [outputs[1].record.value])]


@pytest.mark.parametrize("over", [0, 1])
async def test_an_output_over_its_topics_limit_goes_to_the_dlq_as_too_large_and_the_copy_is_sent(over: int) -> None:
    """At the limit: the output is sent. One byte over: the message's outputs are replaced by its
    DLQ copy at the fit (counted too_large, its outcome moved), cut to the DLQ's limit, and that
    copy - measured at the send, as every DLQ copy - is what is written."""
    msg, outputs = _message(0)
    size = _size(outputs[1])
    fitter = _fitter({V3: size - over, DLQ: 1200})
    pending: list[Any] = [(msg, outputs)]
    outcomes = _outcomes(pending)
    fitter.fit(FakeChain(), pending, outcomes, None)  # type: ignore[arg-type]
    p = _producer()
    errors = await send_all(FaustProducer(p), [item for _, item in pending], fitter.limits.limit_for)
    assert errors == [None]
    if not over:
        assert pending[0][1] is outputs and fitter.stats.too_large == 0
        assert [t for t, _ in p.batches] == [V2, V3]
        return
    copy = pending[0][1]
    assert isinstance(copy, DlqRecord) and fitter.stats.too_large == 1
    assert outcomes == {(SRC, 0, "emitted"): 0, (SRC, 0, "dlq"): 1}
    assert record_size(copy.key, copy.value, copy.headers) <= 1200 and fitter.stats.dlq_truncated == 1
    assert p.batches == [(DLQ, [copy.value])]


async def test_a_dlq_copy_over_a_limit_lowered_after_a_refusal_is_refused_up_front_and_its_refit_goes() -> None:
    """`SizeFitter.lower`: the broker refused a DLQ copy alone; its topic's limit falls below it.
    The copy fitted before is now over the limit in force and the send refuses it before queuing
    anything; the copy fitted again under the lowered limit is written."""
    fitter = _fitter({DLQ: 4000})
    big = DlqRecord(DLQ, b"k", b"d" * 10_000, [("prism.errors.reason", b"too_large")], None, "too_large")
    first = fitter.fit_dlq(big)
    again = fitter.lower(first, RecordTooLargeError())
    assert record_size(again.key, again.value, again.headers) < record_size(first.key, first.value, first.headers)
    p = _producer()
    errors = await send_all(FaustProducer(p), [first, again], fitter.limits.limit_for)
    assert isinstance(errors[0], RefusedUpFront) and errors[1] is None
    assert p.batches == [(DLQ, [again.value])]

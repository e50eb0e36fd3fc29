"""Write limits (app/worker/limits.py), DLQ copies cut to their topic's limit
(app.agents.dlq.fit_dlq_record), and a worker whose DLQ cannot be written: it says so, stops
fetching, reports not ready, recovers when the DLQ comes back, and stops promptly meanwhile."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.errors import MessageSizeTooLargeError, TopicAuthorizationFailedError
from aiokafka.structs import TopicPartition

from app.agents.dlq import (
    HEADERS_TRUNCATED,
    KEY_SHA256,
    PREFIX,
    VALUE_LENGTH,
    VALUE_SHA256,
    VALUE_TRUNCATED,
    DlqRecord,
    fit_dlq_record,
)
from app.broker.admin import ensure_topics, read_max_message_bytes
from app.demo.runner import read_all
from app.envelope import encode, new_envelope
from app.worker import delivery as delivery_mod
from app.worker.faust_app import InProcessWorker
from app.worker.limits import OUTPUT_OVERHEAD, WriteLimits, record_size
from app.worker.observe import Observer
from app.worker.pipeline import PipelineApp
from tests.worker.conftest import make_topology

CONTEXT = [(PREFIX + "reason", b"too_large"), (PREFIX + "topic", b"orders"), (PREFIX + "offset", b"7")]


def _rec(value: bytes, headers: list[tuple[str, bytes]] | None = None, key: bytes | None = b"k") -> DlqRecord:
    return DlqRecord("orders.dlq", key, value, [*(headers or []), *CONTEXT], None, "too_large")


# -- the limits ------------------------------------------------------------------------------

def test_limit_is_the_smaller_of_producer_and_topic() -> None:
    lim = WriteLimits(4 << 20, output_topics=("a.v2", "a.v3")).with_broker({"a.v2": 1 << 20, "a.v3": None},
                                                                            {"a.v3": "not reported"})
    assert lim.limit_for("a.v2") == 1 << 20
    assert lim.limit_for("a.v3") == 4 << 20 and lim.unknown == {"a.v3": "not reported"}
    assert lim.output_limit == 1 << 20 and lim.input_limit == (1 << 20) - OUTPUT_OVERHEAD
    assert WriteLimits(64 << 20).input_limit == 16 << 20  # never above the envelope codec's limit
    line = lim.describe(["a.v2", "a.v3"])
    assert "a.v2: 1048576 (max.message.bytes=1048576)" in line and "configured limit used" in line
    assert lim.lowered("a.v3", 10).limit_for("a.v3") == 1024 and "a.v3" not in lim.lowered("a.v3", 5000).unknown


def test_record_size_is_what_aiokafka_checks() -> None:
    headers = [("h", b"v" * 10)]
    size = record_size(b"key", b"x" * 1000, headers)
    assert 1000 + 3 + 1 + 10 < size < 1000 + 3 + 1 + 10 + 100


# -- DLQ copies that fit ---------------------------------------------------------------------

def test_a_dlq_copy_that_fits_is_unchanged() -> None:
    rec = _rec(b"v" * 100)
    assert fit_dlq_record(rec, 10_000) is rec


@pytest.mark.parametrize("limit", [2_000, 10_000, 65_536, 1 << 20])
@pytest.mark.parametrize("over", [1, 2, 1000, 5 << 20])
def test_the_value_is_cut_to_fit_exactly_and_described(limit: int, over: int) -> None:
    base = record_size(b"k", b"", [*CONTEXT])
    value = bytes(range(256)) * ((limit - base + over) // 256 + 1)
    value = value[: limit - base + over]
    rec = _rec(value)
    assert record_size(rec.key, rec.value, rec.headers) > limit  # each case is over the limit by `over` bytes
    fitted = fit_dlq_record(rec, limit)
    assert record_size(fitted.key, fitted.value, fitted.headers) <= limit
    hdrs = dict(fitted.headers)
    assert hdrs[VALUE_TRUNCATED] == b"true" and int(hdrs[VALUE_LENGTH]) == len(value)
    assert hdrs[VALUE_SHA256] == hashlib.sha256(value).hexdigest().encode()
    assert value.startswith(fitted.value) and len(fitted.value) > limit - base - 200
    assert all(h in fitted.headers for h in CONTEXT)  # the reason and context always stay


def test_headers_and_key_too_large_are_replaced_but_the_context_stays() -> None:
    big = [("x-big", b"h" * 50_000)]
    fitted = fit_dlq_record(_rec(b"v" * 10, big), 4_000)
    hdrs = dict(fitted.headers)
    assert HEADERS_TRUNCATED in hdrs and hdrs.get("x-big", b"") == b""
    assert all(h in fitted.headers for h in CONTEXT)
    assert record_size(fitted.key, fitted.value, fitted.headers) <= 4_000
    fitted = fit_dlq_record(_rec(b"v", key=b"k" * 50_000), 4_000)
    assert fitted.key is None and KEY_SHA256 in dict(fitted.headers)
    assert record_size(fitted.key, fitted.value, fitted.headers) <= 4_000


def test_permanent_errors() -> None:
    assert delivery_mod.is_permanent(MessageSizeTooLargeError())
    assert delivery_mod.is_permanent(TopicAuthorizationFailedError())
    assert not delivery_mod.is_permanent(ConnectionError())


# -- the broker's view -----------------------------------------------------------------------

async def test_topic_limits_fall_back_where_the_broker_does_not_report_them(broker) -> None:
    topic = f"lim-{uuid.uuid4().hex[:8]}"
    await ensure_topics(broker.bootstrap, {topic: 1})
    values, why = await read_max_message_bytes(broker.bootstrap, [topic])
    # the embedded broker reports only configs set on a topic: either a value or a reason
    assert (values[topic] is not None and values[topic] > 0) or why[topic]


# -- a DLQ that cannot be written ------------------------------------------------------------

async def test_an_unwritable_dlq_blocks_loudly_recovers_and_never_holds_shutdown(
        broker, tmp_path: Path, dev_keys: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    topo = make_topology(tmp_path, dev_keys, partitions=1)
    source = topo.sources[0].topic
    dlq = source + topo.dlq.topic_suffix
    await ensure_topics(broker.bootstrap, topo.topics())
    real = delivery_mod.send_batched
    broken = {"on": True}

    async def send(producer: Any, items: Any, **kw: Any) -> list[BaseException | None]:
        if broken["on"] and any(r[0] == dlq for recs in items for r in recs):
            keep = [None if all(r[0] != dlq for r in recs) else TopicAuthorizationFailedError("no ACL")
                    for recs in items]
            out = await real(producer, [recs if k is None else [] for recs, k in zip(items, keep, strict=True)], **kw)
            return [k or o for k, o in zip(keep, out, strict=True)]
        return await real(producer, items, **kw)

    monkeypatch.setattr(delivery_mod, "send_batched", send)
    observer = Observer()
    app_id = f"blk-{uuid.uuid4().hex[:8]}"
    p = PipelineApp(topo, bootstrap=broker.bootstrap, data_dir=tmp_path / "d", app_id=app_id, embedded=True,
                    observe=observer)
    worker = InProcessWorker(p.app)
    producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, max_request_size=8 << 20)
    await producer.start()
    await worker.start()
    try:
        caplog.set_level(logging.ERROR, logger="prism.worker")
        await (await producer.send(source, b"x" * (p.limits.input_limit + 1)))
        deadline = time.monotonic() + 30
        while p.blocked is None and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        assert p.blocked is not None and "no ACL" in p.blocked
        ready = observer.health.readiness()
        assert not ready.ok and "no ACL" in ready.checks["writes"]["reason"]
        assert any("cannot write its DLQ" in r.getMessage() for r in caplog.records)
        # the DLQ comes back: the record is written, the worker fetches again, a good message flows
        broken["on"] = False
        await (await producer.send(source, encode(new_envelope(source, {"i": 1}, namespace="order-events"))))
        deadline = time.monotonic() + 30
        while (p.blocked is not None or p.stats.read < 2) and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        assert p.blocked is None and p.stats.read == 2 and observer.health.readiness().checks.get("writes") is None
        # blocked again, then stopped: the stop does not wait for the write
        broken["on"] = True
        await (await producer.send(source, b"y" * (p.limits.input_limit + 1)))
        deadline = time.monotonic() + 30
        while p.blocked is None and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        assert p.blocked is not None
        t0 = time.monotonic()
        await worker.stop(timeout=30)
        assert time.monotonic() - t0 < 15 and p.stats.abandoned_batches >= 1
    finally:
        await worker.stop()
        await producer.stop()
    out = await read_all(broker.bootstrap, {dlq: 1, source + ".v3": 1}, expected_total=2, timeout=10)
    assert len(out[dlq]) == 1 and len(out[source + ".v3"]) == 1
    # the abandoned message was not committed past: a restart reads it again
    c = AIOKafkaConsumer(bootstrap_servers=broker.bootstrap, group_id=app_id, enable_auto_commit=False)
    await c.start()
    try:
        assert await c.committed(TopicPartition(source, 0)) == 2
    finally:
        await c.stop()

"""NATS JetStream sink and pull source against the real local nats-server: byte-exact data
with Prism headers, Nats-Msg-Id de-duplication, and a server kill/restart mid-stream."""

from __future__ import annotations

import nats
import pytest

from app.sinks.delivery import Delivery, OutagePolicy
from app.sinks.nats import NatsJetStreamSource, NatsSink
from tests.sinks.conftest import make_records
from tests.sinks.helpers import Feeder, wait_for
from tests.sinks.services import outage, require_restartable

pytestmark = pytest.mark.integration
FAST = OutagePolicy("wait", backoff_initial_s=0.05, backoff_max_s=0.5)


async def _stored(url: str, stream: str) -> int:
    nc = await nats.connect(url)
    try:
        info = await nc.jetstream().stream_info(stream)
        return int(info.state.messages)
    finally:
        await nc.close()


async def _drain(url: str, stream: str, subject: str, durable: str) -> list:
    src = NatsJetStreamSource(url, stream, durable, subject)
    out = []
    try:
        while True:
            got = await src.fetch(200, timeout_s=0.5)
            if not got:
                return out
            out += got
            await src.ack(got)
    finally:
        await src.stop()


async def test_round_trip_byte_exact_with_headers_and_server_dedup(nats_url: str, nats_stream: str) -> None:
    recs = make_records(60)
    subject = recs[0].envelope.topic
    sink = NatsSink("n", url=nats_url, stream=nats_stream, stream_subjects=[subject])
    await sink.start()
    await sink.write_batch(recs)
    await sink.write_batch(recs[:40])  # replay: JetStream drops it by Nats-Msg-Id
    await sink.stop()
    assert sink.stats.written == 60 and sink.stats.duplicates == 40
    assert await _stored(nats_url, nats_stream) == 60
    got = await _drain(nats_url, nats_stream, subject, "d1")
    assert [d.raw for d in got] == [r.raw for r in recs]
    assert [d.envelope.message_id for d in got] == [r.message_id for r in recs]
    hdrs = got[0].msg.headers
    assert hdrs["Nats-Msg-Id"] == recs[0].message_id and hdrs["Prism-Envelope-Layout"] == "reviewed"
    assert hdrs["traceparent"].startswith("00-" + recs[0].envelope.observability.trace_id)


async def test_unacked_messages_are_redelivered_to_the_durable(nats_url: str, nats_stream: str) -> None:
    recs = make_records(10)
    subject = recs[0].envelope.topic
    sink = NatsSink("n", url=nats_url, stream=nats_stream, stream_subjects=[subject])
    await sink.write_batch(recs)
    await sink.stop()
    src = NatsJetStreamSource(nats_url, nats_stream, "d2", subject, ack_wait_s=0.5)
    first = await src.fetch(10)
    assert [d.raw for d in first] == [r.raw for r in recs]
    await src.ack(first[:4])
    await src.stop()  # crash: six delivered, never acked

    src = NatsJetStreamSource(nats_url, nats_stream, "d2", subject, ack_wait_s=0.5)
    again: dict[str, bytes] = {}
    try:
        for _ in range(20):  # they come back once the 0.5 s ack wait has passed
            got = await src.fetch(20, timeout_s=0.5)
            await src.ack(got)
            again.update((d.envelope.message_id, d.raw) for d in got)
            if len(again) >= 6:
                break
    finally:
        await src.stop()
    assert again == {r.message_id: r.raw for r in recs[4:]}


async def test_stream_is_not_created_without_subjects(nats_url: str, nats_stream: str) -> None:
    sink = NatsSink("n", url=nats_url, stream=nats_stream)
    with pytest.raises(Exception, match="no subjects are known"):
        await sink.start()
    assert not await sink.healthy()
    await sink.stop()


async def test_survives_nats_restart_mid_stream(nats_url: str, nats_stream: str) -> None:
    require_restartable("nats")
    recs = make_records(400)
    subject = recs[0].envelope.topic
    sink = NatsSink("n", url=nats_url, stream=nats_stream, stream_subjects=[subject], timeout_s=2)
    await sink.start()
    feeder = Feeder(Delivery(sink, FAST, dlq=None), recs).start()
    try:
        await wait_for(lambda: feeder.delivered >= 100, "100 published")
        async with outage("nats"):  # kill -TERM the server; the feeder keeps going
            await wait_for(lambda: sink.stats.failed_attempts >= 1, "sink retrying")
            assert feeder.delivered < 400
        await feeder.done()
    finally:
        await sink.stop()
    assert sink.stats.outages >= 1
    assert await _stored(nats_url, nats_stream) == 400  # file storage kept everything; no duplicates
    got = await _drain(nats_url, nats_stream, subject, "after")
    assert sorted(d.envelope.message_id for d in got) == sorted(r.message_id for r in recs)

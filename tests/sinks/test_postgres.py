"""PostgreSQL sink and queue against the real local server: byte-exact round trips through
JSONB, ON CONFLICT idempotency, the SKIP LOCKED queue, and a server restart mid-stream."""

from __future__ import annotations

import psycopg
import pytest

from app.envelope import Layout, encode, new_envelope
from app.sinks.base import SinkRecord
from app.sinks.delivery import Delivery, OutagePolicy
from app.sinks.postgres import PostgresQueue, PostgresSink
from tests.sinks.conftest import make_records
from tests.sinks.helpers import Feeder, wait_for
from tests.sinks.services import outage, require_restartable

pytestmark = pytest.mark.integration
FAST = OutagePolicy("wait", backoff_initial_s=0.05, backoff_max_s=0.5)


async def _rows(dsn: str, schema: str) -> list[tuple[str, bool]]:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        cur = await conn.execute(f"SELECT message_id, consumed FROM {schema}.prism_events ORDER BY id")
        return [(r[0], r[1]) for r in await cur.fetchall()]


async def test_rows_round_trip_byte_exact_and_replays_are_no_ops(pg_dsn: str, pg_schema: str) -> None:
    recs = make_records(40)
    sink = PostgresSink("pg", dsn=pg_dsn, schema=pg_schema)
    await sink.start()
    await sink.write_batch(recs)
    await sink.write_batch(recs[:25])  # replay
    await sink.write_batch(recs[30:] + recs[30:])  # duplicates inside one batch
    await sink.stop()
    assert sink.stats.written == 40 and sink.stats.duplicates == 25 + 20
    assert [m for m, _ in await _rows(pg_dsn, pg_schema)] == [r.message_id for r in recs]

    queue = PostgresQueue(pg_dsn, schema=pg_schema)
    try:
        claim = await queue.claim(100)
        # The JSONB document gives back the exact bytes the worker signed.
        assert [e.wire(Layout.REVIEWED) for e in claim.events] == [r.raw for r in recs]
    finally:
        await queue.stop()  # closing the connection releases an open claim


async def test_draft_layout_input_round_trips_too(pg_dsn: str, pg_schema: str) -> None:
    recs = make_records(5, layout=Layout.DRAFT)
    sink = PostgresSink("pg", dsn=pg_dsn, schema=pg_schema)
    await sink.write_batch(recs)
    await sink.stop()
    queue = PostgresQueue(pg_dsn, schema=pg_schema)
    try:
        claim = await queue.claim(10)
        assert [e.wire(Layout.DRAFT) for e in claim.events] == [r.raw for r in recs]
        await claim.release()
    finally:
        await queue.stop()


async def test_queue_claims_are_exclusive_and_acks_consume(pg_dsn: str, pg_schema: str) -> None:
    recs = make_records(30)
    sink = PostgresSink("pg", dsn=pg_dsn, schema=pg_schema)
    await sink.write_batch(recs)
    await sink.stop()
    a, b = PostgresQueue(pg_dsn, schema=pg_schema), PostgresQueue(pg_dsn, schema=pg_schema)
    try:
        ca = await a.claim(10)
        cb = await b.claim(10)  # SKIP LOCKED: the next 10, without waiting for `a`
        ids_a = {e.message_id for e in ca.events}
        ids_b = {e.message_id for e in cb.events}
        assert len(ids_a) == len(ids_b) == 10 and not ids_a & ids_b
        assert await ca.ack() == 10
        await cb.release()  # back to the queue
        assert await a.pending() == 20
        rest = await b.claim(100)
        assert {e.message_id for e in rest.events} == {r.message_id for r in recs} - ids_a
        assert await rest.ack() == 20
        assert await a.pending() == 0
        with pytest.raises(Exception, match="already acked or released"):
            await rest.ack()
    finally:
        await a.stop()
        await b.stop()
    assert all(consumed for _, consumed in await _rows(pg_dsn, pg_schema))


async def test_queue_filters_by_topic(pg_dsn: str, pg_schema: str) -> None:
    one, two = make_records(3), make_records(4)
    sink = PostgresSink("pg", dsn=pg_dsn, schema=pg_schema)
    await sink.write_batch(one + two)
    await sink.stop()
    q = PostgresQueue(pg_dsn, schema=pg_schema, topic=two[0].envelope.topic)
    try:
        claim = await q.claim(10)
        assert [e.message_id for e in claim.events] == [r.message_id for r in two]
        assert await claim.ack() == 4
    finally:
        await q.stop()


async def test_a_record_jsonb_cannot_hold_is_poison_not_an_outage(pg_dsn: str, pg_schema: str) -> None:
    env = new_envelope("orders.bad", b"x", namespace="order-events")
    env.metadata.correlation_id = "nul\x00byte"  # valid protobuf, impossible in JSONB
    bad = SinkRecord.from_bytes(encode(env), topic="orders.bad.v3", partition=0, offset=7)
    good = make_records(3)
    dead: list = []

    async def dlq(recs) -> None:
        dead.extend(recs)

    sink = PostgresSink("pg", dsn=pg_dsn, schema=pg_schema)
    result = await Delivery(sink, FAST, dlq=dlq).deliver([good[0], bad, *good[1:]])
    await sink.stop()
    assert result.written == 3 and result.dlq == 1 and not result.aborted
    assert [m for m, _ in await _rows(pg_dsn, pg_schema)] == [r.message_id for r in good]
    (rec,) = dead
    headers = dict(rec.headers)
    assert rec.topic == "orders.bad.dlq" and rec.value == bad.raw
    assert headers["prism.errors.stage"] == b"sink:pg" and headers["prism.errors.offset"] == b"7"
    assert headers["prism.errors.reason"] == b"bad_binding"
    assert b"U+0000" in headers["prism.errors.exception.message"]


async def test_survives_postgres_restart_mid_stream(pg_dsn: str, pg_schema: str) -> None:
    require_restartable("postgres")
    recs = make_records(400)
    sink = PostgresSink("pg", dsn=pg_dsn, schema=pg_schema, timeout_s=3)
    feeder = Feeder(Delivery(sink, FAST, dlq=None), recs).start()
    try:
        await wait_for(lambda: feeder.delivered >= 100, "100 written")
        async with outage("postgres"):  # the feeder keeps going: batches now wait
            await wait_for(lambda: sink.stats.failed_attempts >= 2, "sink retrying")
            assert feeder.delivered < 400
        await feeder.done()
    finally:
        await sink.stop()
    rows = await _rows(pg_dsn, pg_schema)
    assert sorted(m for m, _ in rows) == sorted(r.message_id for r in recs)  # zero loss, no duplicates
    assert sink.stats.outages >= 1 and not sink.stats.in_outage
    assert all(not r.aborted for r in feeder.results)

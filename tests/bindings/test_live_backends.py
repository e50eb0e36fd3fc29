"""The bindings against the real local servers: what the pure tests cannot prove.

* PostgreSQL: the DDL runs, JSONB's own normalisation (key order, number rewriting) still
  gives back byte-exact payloads, `ON CONFLICT` makes inserts idempotent, the GIN index
  serves a containment query on an inline JSON payload.
* Redis: stream fields and Pub/Sub bytes through a real server.
* NATS: headers through nats-py and the server unchanged (values are trimmed/rewritten by
  clients otherwise), and JetStream de-duplicates by `Nats-Msg-Id`.

Each test skips locally when its server is down but FAILS under CI=true.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest
from hypothesis import HealthCheck, given, settings

from app.bindings import nats as nb
from app.bindings import postgres as pg
from app.bindings import redis as rb
from app.envelope import Layout, new_envelope
from tests import servers
from tests.bindings.strategies import binding_envelopes, subject_topics, wire_equivalent
from tests.support import require

pytestmark = pytest.mark.integration


def unavailable(what: str, exc: Exception) -> None:
    require(False, f"{what} unavailable: {exc}")


# --------------------------------------------------------------------------- PostgreSQL


@pytest.fixture(scope="module")
def pg_conn():
    psycopg = pytest.importorskip("psycopg")
    try:
        conn = psycopg.connect(servers.pg_dsn(), autocommit=True, connect_timeout=3)
    except Exception as exc:
        unavailable(f"PostgreSQL at {servers.pg_dsn()}", exc)
    schema = f"prism_bindings_{uuid.uuid4().hex[:10]}"  # private schema: concurrent tests never collide
    conn.execute(f"CREATE SCHEMA {schema}")
    conn.execute(f"SET search_path TO {schema}")
    conn.execute(pg.DDL)
    conn.execute(pg.DDL)  # IF NOT EXISTS: running it twice is harmless
    yield conn
    conn.execute(f"DROP SCHEMA {schema} CASCADE")
    conn.close()


def _select(conn, message_id):
    from psycopg.rows import dict_row

    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute("SELECT message_id, topic, envelope, published_at FROM prism_events WHERE message_id = %s",
                    (message_id,))
        return cur.fetchone()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(env=binding_envelopes())
def test_postgres_jsonb_round_trip_is_exact(pg_conn, env):
    row = pg.encode(env)
    # Hypothesis re-uses message ids across examples; start each example from a clean slate.
    pg_conn.execute("DELETE FROM prism_events WHERE message_id = %s", (row.message_id,))
    pg_conn.execute(pg.INSERT_SQL, row.params())
    pg_conn.execute(pg.INSERT_SQL, row.params())  # redelivery: ON CONFLICT DO NOTHING
    count = pg_conn.execute("SELECT count(*) FROM prism_events WHERE message_id = %s", (row.message_id,)).fetchone()
    assert count[0] == 1
    stored = _select(pg_conn, row.message_id)
    out = pg.decode(stored)
    assert out == env
    assert bytes(out.payload.value) == bytes(env.payload.value)


def test_postgres_gin_containment_query_on_inline_json(pg_conn):
    env = new_envelope("orders.paid", {"order_id": 4711, "status": "paid"}, namespace="order-events")
    pg_conn.execute(pg.INSERT_SQL, pg.encode(env).params())
    hits = pg_conn.execute(
        "SELECT message_id FROM prism_events WHERE envelope @> %s::jsonb",
        ('{"payload": {"json": {"order_id": 4711}}, "metadata": {"namespace": "order-events"}}',),
    ).fetchall()
    assert hits == [(env.message_id,)]
    indexes = {r[0] for r in pg_conn.execute("SELECT indexname FROM pg_indexes WHERE tablename = 'prism_events' "
                                             "AND schemaname = current_schema()").fetchall()}
    assert {"idx_events_topic_consumed", "idx_events_envelope"} <= indexes


# --------------------------------------------------------------------------- Redis


@pytest.fixture(scope="module")
def redis_client():
    redis = pytest.importorskip("redis")
    client = redis.Redis.from_url(servers.redis_url(), decode_responses=False, socket_connect_timeout=3)
    try:
        client.ping()
    except Exception as exc:
        unavailable(f"Redis at {servers.redis_url()}", exc)
    yield client
    client.close()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(env=binding_envelopes())
def test_redis_stream_round_trip(redis_client, env):
    key = f"prism-test:bindings:{uuid.uuid4().hex}"
    try:
        entry_id = redis_client.xadd(key, rb.encode_stream_fields(env, Layout.REVIEWED))
        [(got_id, fields)] = redis_client.xrange(key)
        assert got_id == entry_id
        assert rb.decode_stream_fields(fields) == env
    finally:
        redis_client.delete(key)


def test_redis_pubsub_round_trip(redis_client):
    env = new_envelope("orders.created", {"order_id": 1}, namespace="order-events")
    channel = f"prism-test:{uuid.uuid4().hex}"
    sub = redis_client.pubsub()
    sub.subscribe(channel)
    try:
        assert sub.get_message(timeout=2)["type"] in ("subscribe", b"subscribe")
        assert redis_client.publish(channel, rb.encode_pubsub(env, Layout.DRAFT)) == 1
        msg = sub.get_message(timeout=2)
        assert rb.decode_pubsub(msg["data"]) == wire_equivalent(env, Layout.DRAFT)
    finally:
        sub.close()


# --------------------------------------------------------------------------- NATS


async def _nats():
    nats_mod = pytest.importorskip("nats")
    try:
        return await nats_mod.connect(servers.nats_url(), connect_timeout=2, max_reconnect_attempts=0, allow_reconnect=False)
    except Exception as exc:
        unavailable(f"NATS at {servers.nats_url()}", exc)


async def test_nats_headers_survive_a_real_server():
    nc = await _nats()
    try:
        envs = [new_envelope(topic, payload, namespace=ns, correlation_id=" spaced out ")
                for topic, payload, ns in [("orders.created", {"a": 1}, "order-events"),
                                           ("orders.eu", b"\x00\x01", "équipe\r\nX-Injected: yes")]]
        obs = envs[0].ensure_observability()
        obs.trace_id, obs.span_id, obs.trace_flags = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331", 1
        prefix = f"prism.test.{uuid.uuid4().hex}"
        sub = await nc.subscribe(f"{prefix}.>")
        for env in envs:
            msg = nb.encode(env, Layout.REVIEWED, subject=f"{prefix}.{env.topic}", headers={"App-Tenant": "acme"})
            await nc.publish(msg.subject, msg.data, headers=msg.headers)
        for env in envs:
            got = await sub.next_msg(timeout=2)
            assert got.headers["App-Tenant"] == "acme"
            assert "X-Injected" not in got.headers
            assert nb.decode(got) == env
        await sub.unsubscribe()
    finally:
        await nc.close()


@given(env=binding_envelopes(topics=subject_topics))
@settings(max_examples=25, deadline=None)
def test_nats_random_envelopes_round_trip(env):
    async def run():
        nc = await _nats()
        try:
            subject = f"prism.test.{uuid.uuid4().hex}"
            sub = await nc.subscribe(subject)
            msg = nb.encode(env, Layout.DRAFT, subject=subject)
            await nc.publish(msg.subject, msg.data, headers=msg.headers)
            got = await sub.next_msg(timeout=2)
            assert nb.decode(got) == wire_equivalent(env, Layout.DRAFT)
        finally:
            await nc.close()

    asyncio.run(run())


async def test_jetstream_deduplicates_by_nats_msg_id():
    nc = await _nats()
    js = nc.jetstream()
    stream = f"PRISM_TEST_{uuid.uuid4().hex[:10].upper()}"
    subject = f"prism.dedup.{stream.lower()}"
    try:
        await js.add_stream(name=stream, subjects=[subject], storage="memory")
        env = new_envelope("orders.created", {"order_id": 2}, namespace="order-events")
        msg = nb.encode(env, subject=subject)
        first = await js.publish(msg.subject, msg.data, headers=msg.headers)
        again = await js.publish(msg.subject, msg.data, headers=msg.headers)  # redelivered publish
        assert not first.duplicate and again.duplicate
        assert (await js.stream_info(stream)).state.messages == 1
    finally:
        try:
            await js.delete_stream(stream)
        finally:
            await nc.close()

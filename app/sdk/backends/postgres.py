"""PostgreSQL backend: the `prism_events` table of RFC-031 as a queue,
`postgresql://user@host:port/db[?param=value...]`.

Rows follow `app.bindings.postgres` (JSONB envelope, `message_id UNIQUE` so a re-published
message is an `ON CONFLICT DO NOTHING`, `consumed` flag). Every publish also sends
`NOTIFY prism_events, '<topic>'` in the same statement, so waiting subscribers wake at once
instead of polling; they still poll every `poll_ms` for rows written by other writers.

URL parameters (everything else goes to libpq):

| parameter | default | meaning                                                             |
|-----------|---------|---------------------------------------------------------------------|
| `schema`  | -       | use (and create) this schema: `search_path` is set to it            |
| `create`  | 1       | create the schema/table/indexes when missing (`app.bindings.postgres.DDL`) |
| `poll_ms` | 500     | a waiting subscriber re-checks this often without a notification    |

Queue semantics (the "consumed flag" pattern): a fetch claims up to `batch_size` unconsumed
rows of the topic with `SELECT ... FOR UPDATE SKIP LOCKED` inside a transaction, so
competing consumers never get the same row. `ack()` sets `consumed = TRUE`, `nack()` leaves
the row as it is; when every row of the batch is settled the transaction commits and the
locks go (a nacked row is then fetched again). A consumer that dies loses its connection,
PostgreSQL rolls its transaction back, and its rows are free at once. Caveat: acks become
durable at that commit, and the `consumed` flag is per row, not per group - every
subscriber of a topic competes for the same rows whatever `group` it names. A row above a
subscriber's clearance is therefore not consumed by it (`withhold`): it stays for a subscriber
that has the clearance, and the withholding subscription remembers its id and never claims it
again (a new subscription sees it once more, and audits the refusal once more).

Signatures: the table stores JSON, not the signed bytes, so envelopes published here are
signed over their deterministic encoding (`app.sdk._canonical`) and verified the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Sequence
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from ...bindings import postgres as pg
from ...envelope.model import Envelope
from ...errors import PublishError, SubscribeError
from ...security.signing import VerificationKeys, verify
from .._canonical import canonical_wire, sign_canonical
from .base import (
    Backend,
    BackendSubscription,
    Delivery,
    Outgoing,
    RawMessage,
    SubscribeSettings,
    int_param,
    redact_url,
)

CHANNEL = "prism_events"
INSERT_NOTIFY_SQL = (
    "WITH ins AS ("
    f"INSERT INTO {pg.TABLE} (message_id, topic, envelope, published_at) VALUES (%s, %s, %s::jsonb, %s) "
    "ON CONFLICT (message_id) DO NOTHING RETURNING topic) "
    f"SELECT pg_notify('{CHANNEL}', topic) FROM ins"
)
CLAIM_SQL = (
    f"SELECT id, message_id, topic, envelope, published_at FROM {pg.TABLE} "
    "WHERE topic = %s AND NOT consumed AND NOT (id = ANY(%s)) ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED"
)
#: Of the rows a subscription withheld, those another subscriber has consumed since (forgotten).
CONSUMED_SQL = f"SELECT id FROM {pg.TABLE} WHERE id = ANY(%s) AND consumed"
#: Withheld row ids a subscription remembers before it prunes the consumed ones.
WITHHELD_PRUNE_AT = 10_000
ACK_SQL = f"UPDATE {pg.TABLE} SET consumed = TRUE WHERE id = %s"
#: Open batches (connections holding row locks) per subscription before fetch waits.
MAX_OPEN_BATCHES = 4


class PostgresBackend(Backend):
    scheme = "postgresql"

    def __init__(self, url: str) -> None:
        super().__init__(url)
        parts = urlsplit(url)
        params = dict(parse_qsl(parts.query, keep_blank_values=True))
        self.schema = params.pop("schema", None)
        self.create = bool(int_param(params, "create", 1, url))
        self.poll_s = int_param(params, "poll_ms", 500, url, minimum=1) / 1000
        scheme = "postgresql" if parts.scheme in ("postgres", "postgresql") else parts.scheme
        self.dsn = urlunsplit(parts._replace(scheme=scheme, query=urlencode(params)))
        self._pub: Any = None
        self._pub_lock = asyncio.Lock()
        #: (topic, namespace) -> the document text of a plain envelope around its message id,
        #: time and payload (`_document_template`); () when that topic's does not fit.
        self._doc_templates: dict[tuple[str, str], tuple[str, ...]] = {}

    async def new_connection(self, *, autocommit: bool) -> Any:
        """A connection with the backend's schema on its search_path."""
        import psycopg
        from psycopg import sql
        from psycopg.rows import dict_row

        try:
            conn = await psycopg.AsyncConnection.connect(self.dsn, autocommit=True, row_factory=dict_row,
                                                         connect_timeout=5)
        except Exception as exc:
            raise PublishError(f"cannot connect to PostgreSQL: {exc}", path=redact_url(self.url),
                               hint="check the URL and that PostgreSQL accepts connections") from exc
        if self.schema:
            await conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(self.schema)))
        if not autocommit:
            await conn.set_autocommit(False)
        return conn

    async def connect(self) -> None:
        self._pub = await self.new_connection(autocommit=True)
        if self.create:
            await self._create()

    async def _create(self) -> None:
        import psycopg
        from psycopg import sql

        for attempt in range(3):
            try:
                if self.schema:
                    await self._pub.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(
                        sql.Identifier(self.schema)))
                await self._pub.execute(pg.DDL)
                return
            except (psycopg.errors.UniqueViolation, psycopg.errors.DuplicateObject):
                # Two clients ran IF NOT EXISTS at once; the catalog race loser retries.
                if attempt == 2:
                    raise

    async def close(self) -> None:
        if self._pub is not None:
            conn, self._pub = self._pub, None
            await conn.close()

    def _row(self, item: Outgoing) -> tuple[Any, ...]:
        if item.sign_with is not None:
            sign_canonical(item.envelope, item.sign_with)
        if item.plain:
            return self._plain_row(item.envelope)
        return pg.encode(item.envelope).params()

    def _plain_row(self, env: Envelope) -> tuple[Any, ...]:
        """`pg.encode(env).params()` for a plain envelope (`Outgoing.plain`): the document's
        metadata part is the topic's text with the message id and time filled in, so per
        publish only the payload member is worked out, by the binding, which is told the
        text comes from the SDK's JSON encoder (`encoder_json_payload_doc`)."""
        md = env.header.metadata
        key = (md.topic, md.namespace)
        parts = self._doc_templates.get(key)
        if parts is None:
            row = pg.encode(env)  # the binding's full path, checks included
            if len(self._doc_templates) >= 1024:
                self._doc_templates.clear()
            self._doc_templates[key] = _document_template(row.envelope, md.message_id, md.published_at_ms)
            return row.params()
        if not parts:  # this topic's document does not fit the template: general path
            return pg.encode(env).params()
        ts = md.published_at_ms
        text = "".join((parts[0], _DOC_JSON.encode(md.message_id), parts[1], _DOC_JSON.encode(str(ts)), parts[2],
                        _DOC_JSON.encode(pg.encoder_json_payload_doc(env.payload.value)), "}"))
        return md.message_id, md.topic, text, pg.published_at(ts)

    async def publish(self, items: Sequence[Outgoing]) -> None:
        if self._pub is None:
            raise PublishError("the PostgreSQL backend is not connected", hint="use the client inside `async with`")
        rows = [self._row(i) for i in items]
        try:
            async with self._pub_lock:
                if len(rows) == 1:
                    await self._pub.execute(INSERT_NOTIFY_SQL, rows[0])
                    return
                async with self._pub.transaction(), self._pub.cursor() as cur:
                    await cur.executemany(INSERT_NOTIFY_SQL, rows)
        except Exception as exc:
            raise PublishError(f"PostgreSQL refused the insert: {exc}", path=redact_url(self.url),
                               hint="inserts are idempotent on message_id; retrying is safe") from exc

    async def publish_bytes(self, topic: str, value: bytes) -> None:
        """Baseline for the benchmark: a row of the same table holding only the payload (hex)."""
        async with self._pub_lock:
            await self._pub.execute(
                f"INSERT INTO {pg.TABLE} (message_id, topic, envelope) VALUES (gen_random_uuid()::text, %s, "
                "jsonb_build_object('raw', %s::text))", (topic, value.hex()))

    def subscription(self, topic: str, settings: SubscribeSettings) -> BackendSubscription:
        return _PgSubscription(self, topic, settings)

    async def topic_exists(self, topic: str) -> bool:
        """A topic is its rows in the one events table: it exists once a row names it."""
        import psycopg

        try:
            cur = await self._pub.execute(f"SELECT 1 FROM {pg.TABLE} WHERE topic = %s LIMIT 1", (topic,))
        except psycopg.errors.UndefinedTable:
            return False
        return await cur.fetchone() is not None

    async def sample(self, topic: str, limit: int) -> list[RawMessage]:
        import psycopg

        try:
            cur = await self._pub.execute(
                f"SELECT id, message_id, topic, envelope, published_at FROM {pg.TABLE} WHERE topic = %s "
                "ORDER BY id LIMIT %s", (topic, limit))
        except psycopg.errors.UndefinedTable:
            return []
        out = []
        for row in await cur.fetchall():
            env = pg.decode(row)
            out.append(RawMessage(canonical_wire(env), [], str(row["id"]), env))
        return out


#: `EventRow.envelope_json`'s serializer: a dict's text is `{` + its members' texts + `}`, so
#: the document can be assembled from the texts of its parts.
_DOC_JSON = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)
_ID_SLOT, _TS_SLOT = "\x01prism-message-id\x01", "\x01prism-published-at\x01"


def _document_template(doc: dict[str, Any], message_id: str, published_at_ms: int) -> tuple[str, ...]:
    """(text before the message id, between id and time, between time and payload) of the
    JSON text of `doc`, a plain envelope's document, or () when it is not `{metadata, payload}`
    with those two values appearing exactly once."""
    if list(doc) != ["metadata", pg.PAYLOAD_KEY]:
        return ()
    meta = dict(doc["metadata"])
    if meta.get("message_id") != message_id or meta.get("published_at_ms") != str(published_at_ms):
        return ()
    meta["message_id"], meta["published_at_ms"] = _ID_SLOT, _TS_SLOT
    text = _DOC_JSON.encode({"metadata": meta, pg.PAYLOAD_KEY: None})
    id_slot, ts_slot, tail = _DOC_JSON.encode(_ID_SLOT), _DOC_JSON.encode(_TS_SLOT), "null}"
    if text.count(id_slot) != 1 or text.count(ts_slot) != 1 or not text.endswith(tail) \
            or text.index(id_slot) > text.index(ts_slot):
        return ()
    before_id, rest = text[: -len(tail)].split(id_slot)
    between, before_payload = rest.split(ts_slot)
    return before_id, between, before_payload


class _Batch:
    """Rows claimed by one fetch; their locks live as long as this transaction."""

    def __init__(self, sub: _PgSubscription, conn: Any, ids: list[int]) -> None:
        self.sub, self.conn = sub, conn
        self.open = set(ids)
        self.lock = asyncio.Lock()

    async def settle(self, row_id: int, consumed: bool) -> None:
        async with self.lock:
            if row_id not in self.open:
                return
            try:
                if consumed:
                    await self.conn.execute(ACK_SQL, (row_id,))
                self.open.discard(row_id)
                if not self.open:
                    await self.conn.commit()
                    self.sub.release(self)
            except Exception as exc:
                self.sub.discard(self)
                raise SubscribeError(f"settling row {row_id} failed: {exc}",
                                     hint="the batch was rolled back; its rows will be delivered again") from exc


class _PgDelivery(Delivery):
    backend = "postgresql"
    __slots__ = ("batch", "row")

    def __init__(self, batch: _Batch, row: dict[str, Any]) -> None:
        self.batch, self.row = batch, row

    def decode(self, verify_with: VerificationKeys | None) -> Envelope:
        env = pg.decode(self.row)
        if verify_with is not None:
            verify(canonical_wire(env), verify_with)
        return env

    @property
    def ref(self) -> str:
        return str(self.row["id"])

    async def ack(self) -> None:
        await self.batch.settle(self.row["id"], True)

    async def nack(self) -> None:
        await self.batch.settle(self.row["id"], False)

    async def withhold(self) -> None:
        """Above this subscriber's clearance: the row stays unconsumed for the subscribers that
        have the clearance (the `consumed` flag is per row, not per group - an ack would take
        the message from all of them), and this subscription never claims it again."""
        self.batch.sub.withheld.add(self.row["id"])
        await self.batch.settle(self.row["id"], False)


class _PgSubscription(BackendSubscription):
    def __init__(self, backend: PostgresBackend, topic: str, settings: SubscribeSettings) -> None:
        self.backend, self.topic, self.settings = backend, topic, settings
        self.listen: Any = None
        self._free: list[Any] = []
        self._open: set[_Batch] = set()
        self._released = asyncio.Event()
        #: rows withheld from this subscription (above its clearance), left for others: never claimed again
        self.withheld: set[int] = set()

    async def start(self) -> None:
        self.listen = await self.backend.new_connection(autocommit=True)
        await self.listen.execute(f"LISTEN {CHANNEL}")

    def release(self, batch: _Batch) -> None:
        self._open.discard(batch)
        self._free.append(batch.conn)
        self._released.set()

    def discard(self, batch: _Batch) -> None:
        self._open.discard(batch)
        self._released.set()
        asyncio.get_running_loop().create_task(batch.conn.close())

    async def _connection(self, deadline: float) -> Any:
        loop = asyncio.get_running_loop()
        while True:
            if self._free:
                return self._free.pop()
            if len(self._open) < MAX_OPEN_BATCHES:
                return await self.backend.new_connection(autocommit=False)
            self._released.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._released.wait(), max(0.0, deadline - loop.time()))
            if loop.time() >= deadline and not self._free:
                return None

    async def fetch(self, max_messages: int, timeout: float) -> list[Delivery]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            conn = await self._connection(deadline)
            if conn is None:
                return []  # every connection holds an unsettled batch: ack or nack them
            try:
                if len(self.withheld) >= WITHHELD_PRUNE_AT:  # forget the ones others have consumed since
                    cur = await conn.execute(CONSUMED_SQL, (list(self.withheld),))
                    self.withheld.difference_update(r["id"] for r in await cur.fetchall())
                cur = await conn.execute(CLAIM_SQL, (self.topic, list(self.withheld), max_messages))
                rows = await cur.fetchall()
            except Exception as exc:
                with contextlib.suppress(Exception):
                    await conn.close()
                raise SubscribeError(f"claiming rows of topic {self.topic!r} failed: {exc}",
                                     path=redact_url(self.backend.url)) from exc
            if rows:
                batch = _Batch(self, conn, [r["id"] for r in rows])
                self._open.add(batch)
                return [_PgDelivery(batch, r) for r in rows]
            await conn.rollback()
            self._free.append(conn)
            remaining = deadline - loop.time()
            if remaining <= 0:
                return []
            with contextlib.suppress(Exception):
                async for _ in self.listen.notifies(timeout=min(remaining, self.backend.poll_s), stop_after=1):
                    pass

    async def close(self) -> None:
        for batch in list(self._open):
            with contextlib.suppress(Exception):
                await batch.conn.commit()  # acked rows stay consumed; the others are unlocked
            self._free.append(batch.conn)
        self._open.clear()
        for conn in [*self._free, self.listen]:
            if conn is not None:
                with contextlib.suppress(Exception):
                    await conn.close()
        self._free, self.listen = [], None

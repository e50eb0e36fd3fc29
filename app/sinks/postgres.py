"""PostgreSQL sink (the RFC-031 `prism_events` table) and the queue helper that reads it.

**Sink.** One envelope is one row (`app.bindings.postgres`: JSONB document, `message_id`
UNIQUE, GIN index). A batch is ONE statement:

    INSERT INTO prism_events (message_id, topic, envelope, published_at)
    SELECT * FROM unnest($1::text[], $2::text[], $3::jsonb[], $4::timestamptz[])
    ON CONFLICT (message_id) DO NOTHING

One round trip and one transaction per batch (a batch lands whole or not at all), and the
row count tells new rows from replays. `ON CONFLICT DO NOTHING` is what makes delivery
idempotent - server-side, durable, with no time window: a replay a month later is still a
no-op. The table is created (`create_table: true`) in the configured schema at start-up.

**Byte-exact.** The JSONB document keeps the payload bytes exactly (base64 whenever JSONB
could not reproduce them) and the header as protobuf JSON; `encode(decode(row), layout)`
gives back the envelope bytes the worker wrote, signature included (tested).

**Size limit.** A jsonb value is at most 268435455 bytes (PostgreSQL refuses a larger one on
every retry). `max_document_bytes` (default that maximum) is checked in `encode`: a larger
envelope document goes to the DLQ as `too_large`. The exact JSON length is computed only for
envelopes whose bytes could come near the limit (base64 grows a payload by 4/3).

**Queue.** `PostgresQueue.claim(n)` takes up to n unconsumed rows with
`FOR UPDATE SKIP LOCKED` inside a transaction: concurrent consumers never get the same row
and never block each other. `Claim.ack()` sets `consumed = true` and commits; `release()`
(or a crash: the connection closes) rolls back and the rows are claimable again -
at-least-once on the read side.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import dict_row

from app.bindings import postgres as pgb
from app.envelope.codec import Layout
from app.envelope.codec import encode as encode_envelope
from app.envelope.model import Envelope
from app.errors import ConfigError, PrismError, SinkError, SizeLimitError
from app.sinks.base import Sink, SinkRecord, WriteOutcome, url_secrets
from app.topology import PostgresSinkSpec

INSERT_BATCH_SQL = (
    f"INSERT INTO {pgb.TABLE} (message_id, topic, envelope, published_at) "
    "SELECT * FROM unnest(%s::text[], %s::text[], %s::jsonb[], %s::timestamptz[]) "
    "ON CONFLICT (message_id) DO NOTHING"
)
_SCHEMA_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")
#: PostgreSQL's largest jsonb value (a larger one is refused, on every retry)
JSONB_MAX = 268_435_455


def _check_schema(schema: str) -> str:
    if not _SCHEMA_RE.match(schema):
        raise ConfigError(f"PostgreSQL schema name {schema!r} is not a plain identifier", path="sinks.schema",
                          hint="use letters, digits and underscores (at most 63), not starting with a digit")
    return schema


async def _connect(dsn: str, schema: str, *, autocommit: bool, timeout_s: float) -> psycopg.AsyncConnection[Any]:
    conn = await psycopg.AsyncConnection.connect(dsn, autocommit=autocommit, connect_timeout=max(1, int(timeout_s)))
    await conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
    if not autocommit:
        await conn.commit()
    return conn


async def create_table(conn: psycopg.AsyncConnection[Any], schema: str) -> None:
    """CREATE SCHEMA/TABLE/INDEX IF NOT EXISTS. Two workers racing on a fresh database can
    both pass IF NOT EXISTS and one fails on the catalog's unique index; the retry then sees
    the table."""
    for attempt in (1, 2):
        try:
            await conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema)))
            await conn.execute(pgb.DDL)
            return
        except (psycopg.errors.UniqueViolation, psycopg.errors.DuplicateObject):
            if attempt == 2:
                raise


class PostgresSink(Sink[pgb.EventRow]):
    kind = "postgres"

    def __init__(self, name: str, *, dsn: str = "postgresql://127.0.0.1:5432/postgres", schema: str = "public",
                 create_table: bool = True, timeout_s: float = 10.0, max_document_bytes: int = JSONB_MAX) -> None:
        super().__init__(name, timeout_s=timeout_s, secrets=url_secrets(dsn))
        self.dsn = dsn
        self.schema = _check_schema(schema)
        self.create_table = create_table
        self.max_document_bytes = max_document_bytes
        self._conn: psycopg.AsyncConnection[Any] | None = None

    @classmethod
    def from_spec(cls, spec: PostgresSinkSpec) -> PostgresSink:
        return cls(spec.name, dsn=spec.dsn, schema=spec.db_schema, create_table=spec.create_table,
                   timeout_s=spec.timeout_ms / 1000, max_document_bytes=spec.max_document_bytes)

    def encode(self, record: SinkRecord) -> pgb.EventRow:
        row = pgb.encode(record.envelope, wire=record.raw)
        limit = self.max_document_bytes
        if len(record.raw) * 2 + 65_536 > limit:  # could be near: measure the document exactly
            size = len(row.envelope_json().encode())
            if size > limit:
                raise SizeLimitError(f"postgres sink {self.name!r}: the envelope document is {size} bytes, over the "
                                     f"{limit}-byte limit (jsonb's maximum, the sink's max_document_bytes)",
                                     path=f"sinks.{self.name}", hint="have producers send smaller messages; the "
                                                                     "record is in the DLQ")
        return row

    async def _open(self) -> None:
        self._conn = await _connect(self.dsn, self.schema, autocommit=True, timeout_s=self.timeout_s)
        if self.create_table:
            await create_table(self._conn, self.schema)

    async def _write(self, items: Sequence[pgb.EventRow]) -> WriteOutcome:
        assert self._conn is not None
        cols: tuple[list[Any], ...] = ([], [], [], [])
        for row in items:
            for col, value in zip(cols, row.params(), strict=True):
                col.append(value)
        cur = await self._conn.execute(INSERT_BATCH_SQL, cols)
        new = max(cur.rowcount, 0)
        return WriteOutcome(new, len(items) - new)

    async def _close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                await conn.close()
            except Exception:  # closing a connection to a dead server must not mask the real error
                return

    async def _ping(self) -> None:
        assert self._conn is not None
        await self._conn.execute("SELECT 1")


# --------------------------------------------------------------------------- queue


@dataclass(frozen=True, slots=True)
class ClaimedEvent:
    id: int
    message_id: str
    topic: str
    envelope: Envelope | None
    error: PrismError | None = None
    stored_wire: tuple[Layout, bytes] | None = None

    def wire(self, layout: Layout = Layout.REVIEWED) -> bytes:
        """The envelope's bytes in `layout`: exactly what the sink's input topic carried when
        the row kept them (and the layout matches), else re-encoded from the document."""
        if self.envelope is None:
            raise self.error or SinkError("row has no envelope", path=f"{pgb.TABLE}.id={self.id}")
        if self.stored_wire is not None and self.stored_wire[0] is layout:
            return self.stored_wire[1]
        return encode_envelope(self.envelope, layout)


class Claim:
    """Rows locked for one consumer until `ack()` (consumed) or `release()` (back to the queue)."""

    def __init__(self, queue: PostgresQueue, events: list[ClaimedEvent]) -> None:
        self._queue = queue
        self.events = events
        self._open = True

    async def ack(self, ids: Sequence[int] | None = None) -> int:
        """Mark the claimed rows (or the given subset) consumed and commit; the rest go back."""
        if not self._open:
            raise SinkError("claim was already acked or released", path="PostgresQueue.claim",
                            hint="claim() again for more rows")
        wanted = [e.id for e in self.events] if ids is None else list(ids)
        self._open = False
        return await self._queue._finish(wanted)

    async def release(self) -> None:
        if self._open:
            self._open = False
            await self._queue._finish(None)


class PostgresQueue:
    """The queue pattern on `prism_events` (module docs). One open claim at a time per
    instance; run several instances for concurrent consumers."""

    def __init__(self, dsn: str, *, schema: str = "public", topic: str | None = None,
                 timeout_s: float = 10.0) -> None:
        self.dsn = dsn
        self.schema = _check_schema(schema)
        self.topic = topic
        self.timeout_s = timeout_s
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self._claim: Claim | None = None
        self._secrets = url_secrets(dsn)

    async def start(self) -> None:
        if self._conn is None:
            try:
                self._conn = await _connect(self.dsn, self.schema, autocommit=False, timeout_s=self.timeout_s)
            except Exception as exc:
                raise self._error("cannot connect", exc) from exc

    async def stop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                await conn.close()
            except Exception:
                return

    async def claim(self, n: int) -> Claim:
        """Lock up to `n` unconsumed rows (oldest first) that no other consumer holds."""
        if self._claim is not None and self._claim._open:
            raise SinkError("a claim is still open on this queue", path="PostgresQueue.claim",
                            hint="ack() or release() it first, or use another PostgresQueue")
        await self.start()
        assert self._conn is not None
        where = "NOT consumed" + (" AND topic = %s" if self.topic is not None else "")
        query = (f"SELECT id, message_id, topic, envelope, published_at FROM {pgb.TABLE} WHERE {where} "
                 "ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED")
        params: tuple[Any, ...] = (self.topic, n) if self.topic is not None else (n,)
        try:
            async with self._conn.cursor(row_factory=dict_row) as cur:
                await cur.execute(query, params)
                rows = await cur.fetchall()
        except Exception as exc:
            await self.stop()
            raise self._error("claim failed", exc) from exc
        events = []
        for row in rows:
            try:
                events.append(ClaimedEvent(row["id"], row["message_id"], row["topic"], pgb.decode(row),
                                           stored_wire=pgb.wire_of(row["envelope"])))
            except PrismError as exc:
                events.append(ClaimedEvent(row["id"], row["message_id"], row["topic"], None, exc))
        self._claim = Claim(self, events)
        return self._claim

    async def _finish(self, ids: list[int] | None) -> int:
        assert self._conn is not None
        try:
            n = 0
            if ids:
                cur = await self._conn.execute(f"UPDATE {pgb.TABLE} SET consumed = TRUE WHERE id = ANY(%s)", (ids,))
                n = cur.rowcount
                await self._conn.commit()
            else:
                await self._conn.rollback()
            return n
        except Exception as exc:
            await self.stop()
            raise self._error("ack failed (the rows go back to the queue)", exc) from exc

    async def pending(self) -> int:
        """How many rows are not consumed yet (claimed or not). Uses its own connection, so it
        never touches an open claim's transaction."""
        where = "NOT consumed" + (" AND topic = %s" if self.topic is not None else "")
        try:
            conn = await _connect(self.dsn, self.schema, autocommit=True, timeout_s=self.timeout_s)
            async with conn:
                cur = await conn.execute(f"SELECT count(*) FROM {pgb.TABLE} WHERE {where}",
                                         (self.topic,) if self.topic is not None else ())
                row = await cur.fetchone()
        except Exception as exc:
            raise self._error("counting pending rows failed", exc) from exc
        return int(row[0]) if row else 0

    def _error(self, what: str, exc: BaseException) -> SinkError:
        text = f"postgres queue: {what}: {type(exc).__name__}: {exc}"
        for s in self._secrets:
            text = text.replace(s, "***")
        return SinkError(text[:500], path=f"{self.schema}.{pgb.TABLE}",
                         hint="check that PostgreSQL is up; the next call reconnects")

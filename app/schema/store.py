"""Registry storage: SQLite (default, stdlib ``sqlite3``) and PostgreSQL (psycopg 3).

One SQL dialect-neutral implementation: the statements use ``?`` placeholders and only
features both engines share (``RETURNING``, ``ON CONFLICT``), so the two backends cannot
drift apart. Schema texts are stored once per content hash (``schemas``) and referenced
by subject versions — the same schema under two subjects gets one id, as in Confluent.

Immutability is enforced here as well as in the registry: there is no UPDATE of a
schema's text, and a version row only ever changes its ``deleted`` flag.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

_DDL = [
    """CREATE TABLE IF NOT EXISTS schemas (
        id {pk}, hash TEXT NOT NULL UNIQUE, format TEXT NOT NULL, schema TEXT NOT NULL,
        created_at DOUBLE PRECISION NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS versions (
        subject TEXT NOT NULL, version INTEGER NOT NULL, schema_id INTEGER NOT NULL REFERENCES schemas(id),
        namespace TEXT NOT NULL, label TEXT, deleted INTEGER NOT NULL DEFAULT 0,
        created_at DOUBLE PRECISION NOT NULL, created_by TEXT NOT NULL, metadata TEXT NOT NULL DEFAULT '{{}}',
        PRIMARY KEY (subject, version))""",
    # require_schema / require_pii_tags (RFC-030 "Migration Path" phases 2 and 3) came later:
    # older databases gain the columns in SqlStore._migrate (CREATE TABLE IF NOT EXISTS does not
    # add columns to a table that exists).
    """CREATE TABLE IF NOT EXISTS config (
        scope TEXT PRIMARY KEY, compatibility TEXT, pii_policy TEXT, approval_required INTEGER,
        require_schema INTEGER, require_pii_tags INTEGER)""",
    """CREATE TABLE IF NOT EXISTS audit_log (
        id {pk}, at DOUBLE PRECISION NOT NULL, actor TEXT NOT NULL, action TEXT NOT NULL,
        subject TEXT, version INTEGER, detail TEXT NOT NULL DEFAULT '{{}}')""",
    """CREATE TABLE IF NOT EXISTS approvals (
        id {pk}, subject TEXT NOT NULL, hash TEXT NOT NULL, format TEXT NOT NULL, schema TEXT NOT NULL,
        requested_by TEXT NOT NULL, reason TEXT NOT NULL DEFAULT '', status TEXT NOT NULL,
        decided_by TEXT, created_at DOUBLE PRECISION NOT NULL, decided_at DOUBLE PRECISION)""",
    # Legacy: one row per (subject, consumer), so a consumer reading two versions showed only
    # the last one. Kept so that _init_schema can copy its rows into consumer_versions.
    """CREATE TABLE IF NOT EXISTS consumers (
        subject TEXT NOT NULL, consumer_id TEXT NOT NULL, version INTEGER NOT NULL,
        last_seen DOUBLE PRECISION NOT NULL, PRIMARY KEY (subject, consumer_id))""",
    # One row per version a consumer read: during a rollout a consumer group reads v1 and v2
    # at once, and both versions must count it (delete safety, "active consumers").
    """CREATE TABLE IF NOT EXISTS consumer_versions (
        subject TEXT NOT NULL, consumer_id TEXT NOT NULL, version INTEGER NOT NULL,
        last_seen DOUBLE PRECISION NOT NULL, PRIMARY KEY (subject, consumer_id, version))""",
    # Confluent schema references (added later: CREATE IF NOT EXISTS is the migration - an
    # existing database gains the empty table on open, and its schemas have no references).
    # They belong to the schema id, not the version: an id names text *and* references.
    """CREATE TABLE IF NOT EXISTS schema_references (
        schema_id INTEGER NOT NULL REFERENCES schemas(id), position INTEGER NOT NULL,
        name TEXT NOT NULL, subject TEXT NOT NULL, version INTEGER NOT NULL,
        PRIMARY KEY (schema_id, position))""",
    "CREATE INDEX IF NOT EXISTS schema_references_target ON schema_references (subject, version)",
    # Confluent's /mode (READWRITE, READONLY, READONLY_OVERRIDE, IMPORT) per subject or global
    # (scope '__global__'); a table of its own so that older databases gain it on open.
    "CREATE TABLE IF NOT EXISTS modes (scope TEXT PRIMARY KEY, mode TEXT NOT NULL)",
    # Confluent's associations (a topic's key/value bound to a subject; app/schema/associations.py).
    # One subject per (resource, key|value): the unique key is what makes a second, different
    # association for the same topic a conflict (40903) instead of an ambiguity for serializers.
    """CREATE TABLE IF NOT EXISTS associations (
        guid TEXT PRIMARY KEY, subject TEXT NOT NULL, resource_name TEXT NOT NULL,
        resource_namespace TEXT NOT NULL, resource_id TEXT NOT NULL, resource_type TEXT NOT NULL,
        association_type TEXT NOT NULL, lifecycle TEXT NOT NULL, frozen INTEGER NOT NULL DEFAULT 0,
        created_at DOUBLE PRECISION NOT NULL, UNIQUE (resource_id, resource_type, association_type))""",
    "CREATE INDEX IF NOT EXISTS associations_by_name ON associations (resource_name, resource_type)",
    "CREATE INDEX IF NOT EXISTS associations_by_subject ON associations (subject)",
    # (WHERE 1 = 1: SQLite cannot parse INSERT ... SELECT ... ON CONFLICT without a WHERE.)
    """INSERT INTO consumer_versions (subject, consumer_id, version, last_seen)
        SELECT subject, consumer_id, version, last_seen FROM consumers WHERE 1 = 1
        ON CONFLICT (subject, consumer_id, version) DO NOTHING""",
]


@dataclass(frozen=True, slots=True)
class SchemaRow:
    id: int
    hash: str
    format: str
    schema: str


@dataclass(frozen=True, slots=True)
class VersionRow:
    subject: str
    version: int
    schema_id: int
    namespace: str
    label: str | None
    deleted: bool
    created_at: float
    created_by: str
    metadata: dict[str, Any]


@dataclass(frozen=True, slots=True)
class ConfigRow:
    """One stored policy scope; ``None`` in a setting means "not set here, inherit"."""

    scope: str
    compatibility: str | None
    pii_policy: str | None
    approval_required: bool | None
    require_schema: bool | None = None
    require_pii_tags: bool | None = None


@dataclass(frozen=True, slots=True)
class AuditRow:
    id: int
    at: float
    actor: str
    action: str
    subject: str | None
    version: int | None
    detail: dict[str, Any]


@dataclass(frozen=True, slots=True)
class ApprovalRow:
    id: int
    subject: str
    hash: str
    format: str
    schema: str
    requested_by: str
    reason: str
    status: str
    decided_by: str | None
    created_at: float
    decided_at: float | None


@dataclass(frozen=True, slots=True)
class AssociationRow:
    guid: str
    subject: str
    resource_name: str
    resource_namespace: str
    resource_id: str
    resource_type: str
    association_type: str
    lifecycle: str
    frozen: bool


class Store(Protocol):
    """What the registry needs from storage (both backends implement it)."""

    def close(self) -> None: ...


class SqlStore:
    """Shared implementation; subclasses provide a DB-API connection and the dialect bits."""

    pk_sql = "INTEGER PRIMARY KEY AUTOINCREMENT"
    placeholder = "?"

    def __init__(self) -> None:
        self._lock = threading.RLock()

    # -- plumbing ---------------------------------------------------------------------------
    def _sql(self, sql: str) -> str:
        return sql if self.placeholder == "?" else sql.replace("?", self.placeholder)

    @contextmanager
    def _tx(self) -> Iterator[Any]:
        with self._lock:
            cur = self._conn.cursor()
            try:
                yield cur
                self._conn.commit()
            except BaseException:
                self._conn.rollback()
                raise
            finally:
                cur.close()

    def _q(self, sql: str, args: Sequence[Any] = ()) -> list[tuple]:
        with self._tx() as cur:
            cur.execute(self._sql(sql), tuple(args))
            return list(cur.fetchall()) if cur.description else []

    #: Columns added to existing tables after their first release: (table, column, SQL type).
    #: Added on open when missing, so an older database keeps working and keeps its rows.
    _ADDED_COLUMNS: tuple[tuple[str, str, str], ...] = (
        ("config", "require_schema", "INTEGER"),
        ("config", "require_pii_tags", "INTEGER"),
    )

    def _init_schema(self) -> None:
        with self._tx() as cur:
            for ddl in _DDL:
                cur.execute(ddl.format(pk=self.pk_sql))
            self._migrate(cur)

    def _migrate(self, cur: Any) -> None:
        """Add :attr:`_ADDED_COLUMNS` that an older database lacks (idempotent: run on every open)."""
        for table, column, sql_type in self._ADDED_COLUMNS:
            if column not in self._columns(cur, table):
                self._add_column(cur, table, column, sql_type)

    def _add_column(self, cur: Any, table: str, column: str, sql_type: str) -> None:
        try:
            cur.execute(f"ALTER TABLE {table} ADD COLUMN {column} {sql_type}")
        except sqlite3.OperationalError as e:  # another process opening the same file added it first
            if "duplicate column" not in str(e).lower():
                raise

    def _columns(self, cur: Any, table: str) -> set[str]:
        cur.execute(f"PRAGMA table_info({table})")
        return {str(r[1]) for r in cur.fetchall()}

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    # -- change detection across processes ---------------------------------------------------
    def change_token(self) -> int:
        """A number that moves whenever another connection (a sibling worker process, another
        registry replica) may have committed a write. The registry drops its caches when it
        moves; writes through this store's own connection need not move it (the registry
        invalidates those itself)."""
        return 0

    def announce_change(self) -> None:
        """Tell other registry processes on this store that cached reads may be stale; called
        after each committed write that changes what the caches hold."""

    # -- schemas ----------------------------------------------------------------------------
    def put_schema(self, hash_: str, fmt: str, text: str,
                   references: Sequence[tuple[str, str, int]] = ()) -> int:
        """Insert the schema text once per hash; returns its id (existing or new).

        ``references`` ((name, subject, version), in order) are written in the same
        transaction as a new schema row, so an id is never visible without them."""
        with self._tx() as cur:
            cur.execute(self._sql("SELECT id FROM schemas WHERE hash = ?"), (hash_,))
            row = cur.fetchone()
            if row:
                return int(row[0])
            cur.execute(self._sql("INSERT INTO schemas (hash, format, schema, created_at) VALUES (?, ?, ?, ?) "
                                  "ON CONFLICT (hash) DO NOTHING RETURNING id"), (hash_, fmt, text, time.time()))
            row = cur.fetchone()
            if row is None:  # lost a race with another writer
                cur.execute(self._sql("SELECT id FROM schemas WHERE hash = ?"), (hash_,))
                row = cur.fetchone()
                return int(row[0])
            for pos, (name, subject, version) in enumerate(references):
                cur.execute(self._sql("INSERT INTO schema_references (schema_id, position, name, subject, version) "
                                      "VALUES (?, ?, ?, ?, ?)"), (int(row[0]), pos, name, subject, version))
            return int(row[0])

    def put_schema_with_id(self, schema_id: int, hash_: str, fmt: str, text: str,
                           references: Sequence[tuple[str, str, int]] = ()) -> None:
        """Insert a schema under an id chosen by the caller (Confluent IMPORT mode). The
        registry has checked that neither the id nor the hash is taken by another schema;
        the id sequence is moved past it so later registrations do not collide."""
        with self._tx() as cur:
            cur.execute(self._sql("INSERT INTO schemas (id, hash, format, schema, created_at) VALUES (?, ?, ?, ?, ?)"),
                        (schema_id, hash_, fmt, text, time.time()))
            for pos, (name, subject, version) in enumerate(references):
                cur.execute(self._sql("INSERT INTO schema_references (schema_id, position, name, subject, version) "
                                      "VALUES (?, ?, ?, ?, ?)"), (schema_id, pos, name, subject, version))
            self._advance_id_sequence(cur)

    def _advance_id_sequence(self, cur: Any) -> None:
        """SQLite's AUTOINCREMENT already continues after the largest id inserted."""

    def references(self, schema_id: int) -> list[tuple[str, str, int]]:
        """(name, subject, version) of each reference of a schema, in registration order."""
        return [(r[0], r[1], int(r[2])) for r in self._q(
            "SELECT name, subject, version FROM schema_references WHERE schema_id = ? ORDER BY position",
            (schema_id,))]

    def referencing(self, subject: str, version: int, include_deleted: bool = False) -> list[int]:
        """Ids of schemas that reference ``subject`` ``version`` and still have a version row
        (live only, unless ``include_deleted``): a schema nobody registers any more does not
        hold its references."""
        live = "" if include_deleted else " AND v.deleted = 0"
        return sorted({int(r[0]) for r in self._q(
            "SELECT DISTINCT r.schema_id FROM schema_references r JOIN versions v ON v.schema_id = r.schema_id "
            f"WHERE r.subject = ? AND r.version = ?{live}", (subject, version))})

    def schema_by_id(self, schema_id: int) -> SchemaRow | None:
        rows = self._q("SELECT id, hash, format, schema FROM schemas WHERE id = ?", (schema_id,))
        return SchemaRow(*rows[0]) if rows else None

    def schema_by_hash(self, hash_: str) -> SchemaRow | None:
        rows = self._q("SELECT id, hash, format, schema FROM schemas WHERE hash = ?", (hash_,))
        return SchemaRow(*rows[0]) if rows else None

    # -- versions ---------------------------------------------------------------------------
    _VCOLS = "subject, version, schema_id, namespace, label, deleted, created_at, created_by, metadata"

    @staticmethod
    def _vrow(r: tuple) -> VersionRow:
        return VersionRow(r[0], int(r[1]), int(r[2]), r[3], r[4], bool(r[5]), float(r[6]), r[7], json.loads(r[8]))

    def add_version(self, subject: str, schema_id: int, namespace: str, actor: str, label: str | None,
                    metadata: dict[str, Any], version: int | None = None) -> int:
        """Append the next version number (numbers are never reused, even after deletes).
        ``version`` (Confluent IMPORT mode) inserts that number instead; taking one that exists
        fails with the store's unique-key error."""
        if version is not None:
            with self._tx() as cur:
                cur.execute(self._sql(f"INSERT INTO versions ({self._VCOLS}) VALUES (?, ?, ?, ?, ?, 0, ?, ?, ?)"),
                            (subject, version, schema_id, namespace, label, time.time(), actor, json.dumps(metadata)))
            return version
        for _ in range(5):
            try:
                with self._tx() as cur:
                    cur.execute(self._sql("SELECT COALESCE(MAX(version), 0) FROM versions WHERE subject = ?"),
                                (subject,))
                    nxt = int(cur.fetchone()[0]) + 1
                    cur.execute(self._sql(f"INSERT INTO versions ({self._VCOLS}) VALUES (?, ?, ?, ?, ?, 0, ?, ?, ?)"),
                                (subject, nxt, schema_id, namespace, label, time.time(), actor, json.dumps(metadata)))
                    return nxt
            except Exception as e:  # unique violation from a concurrent writer: retry
                if "unique" not in str(e).lower() and "duplicate" not in str(e).lower():
                    raise
        raise RuntimeError(f"could not allocate a version for {subject}")

    def versions(self, subject: str, include_deleted: bool = False) -> list[VersionRow]:
        sql = f"SELECT {self._VCOLS} FROM versions WHERE subject = ?"
        if not include_deleted:
            sql += " AND deleted = 0"
        return [self._vrow(r) for r in self._q(sql + " ORDER BY version", (subject,))]

    def version(self, subject: str, version: int, include_deleted: bool = False) -> VersionRow | None:
        sql = f"SELECT {self._VCOLS} FROM versions WHERE subject = ? AND version = ?"
        if not include_deleted:
            sql += " AND deleted = 0"
        rows = self._q(sql, (subject, version))
        return self._vrow(rows[0]) if rows else None

    def versions_of_schema(self, schema_id: int, include_deleted: bool = False) -> list[VersionRow]:
        live = "" if include_deleted else " AND deleted = 0"
        return [self._vrow(r) for r in self._q(
            f"SELECT {self._VCOLS} FROM versions WHERE schema_id = ?{live} ORDER BY subject, version",
            (schema_id,))]

    def subjects(self, include_deleted: bool = False) -> list[str]:
        sql = "SELECT DISTINCT subject FROM versions" + ("" if include_deleted else " WHERE deleted = 0")
        return sorted(r[0] for r in self._q(sql))

    def all_live_versions(self) -> list[VersionRow]:
        return [self._vrow(r) for r in self._q(
            f"SELECT {self._VCOLS} FROM versions WHERE deleted = 0 ORDER BY subject, version")]

    def mark_deleted(self, subject: str, version: int) -> None:
        self._q("UPDATE versions SET deleted = 1 WHERE subject = ? AND version = ?", (subject, version))

    def purge_version(self, subject: str, version: int) -> None:
        self._q("DELETE FROM versions WHERE subject = ? AND version = ? AND deleted = 1", (subject, version))

    # -- config -----------------------------------------------------------------------------
    _CCOLS = "scope, compatibility, pii_policy, approval_required, require_schema, require_pii_tags"

    @staticmethod
    def _crow(r: tuple) -> ConfigRow:
        def flag(v: Any) -> bool | None:
            return None if v is None else bool(v)

        return ConfigRow(r[0], r[1], r[2], flag(r[3]), flag(r[4]), flag(r[5]))

    def get_config(self, scope: str) -> ConfigRow | None:
        rows = self._q(f"SELECT {self._CCOLS} FROM config WHERE scope = ?", (scope,))
        return self._crow(rows[0]) if rows else None

    def set_config(self, scope: str, compatibility: str | None, pii_policy: str | None,
                   approval_required: bool | None, *, require_schema: bool | None = None,
                   require_pii_tags: bool | None = None) -> None:
        """Upsert; a None argument leaves that setting as it was."""
        cur = self.get_config(scope)

        def keep(new: Any, old: Any) -> Any:
            return new if new is not None else old

        comp = keep(compatibility, cur and cur.compatibility)
        pii = keep(pii_policy, cur and cur.pii_policy)
        flags = [keep(approval_required, cur and cur.approval_required),
                 keep(require_schema, cur and cur.require_schema),
                 keep(require_pii_tags, cur and cur.require_pii_tags)]
        self._q(f"INSERT INTO config ({self._CCOLS}) VALUES (?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (scope) DO UPDATE SET compatibility = excluded.compatibility, "
                "pii_policy = excluded.pii_policy, approval_required = excluded.approval_required, "
                "require_schema = excluded.require_schema, require_pii_tags = excluded.require_pii_tags",
                (scope, comp, pii, *(None if f is None else int(f) for f in flags)))

    def delete_config(self, scope: str) -> None:
        self._q("DELETE FROM config WHERE scope = ?", (scope,))

    def configs(self) -> list[ConfigRow]:
        return [self._crow(r) for r in self._q(f"SELECT {self._CCOLS} FROM config ORDER BY scope")]

    # -- modes ------------------------------------------------------------------------------
    def get_mode(self, scope: str) -> str | None:
        rows = self._q("SELECT mode FROM modes WHERE scope = ?", (scope,))
        return rows[0][0] if rows else None

    def set_mode(self, scope: str, mode: str) -> None:
        self._q("INSERT INTO modes (scope, mode) VALUES (?, ?) ON CONFLICT (scope) DO UPDATE SET mode = excluded.mode",
                (scope, mode))

    def delete_mode(self, scope: str) -> None:
        self._q("DELETE FROM modes WHERE scope = ?", (scope,))

    # -- associations -----------------------------------------------------------------------
    _ASCOLS = ("guid, subject, resource_name, resource_namespace, resource_id, resource_type, association_type, "
               "lifecycle, frozen")

    @staticmethod
    def _asrow(r: tuple) -> AssociationRow:
        return AssociationRow(r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7], bool(r[8]))

    def associations(self, *, resource_type: str, resource_name: str | None = None,
                     resource_namespace: str | None = None, resource_id: str | None = None,
                     subject: str | None = None) -> list[AssociationRow]:
        """Associations of one resource type, filtered by whichever of name, namespace, id and
        subject are given (``None``: any), in a stable order (pagination depends on it)."""
        sql, args = f"SELECT {self._ASCOLS} FROM associations WHERE resource_type = ?", [resource_type]
        for col, val in (("resource_name", resource_name), ("resource_namespace", resource_namespace),
                         ("resource_id", resource_id), ("subject", subject)):
            if val is not None:
                sql, args = f"{sql} AND {col} = ?", [*args, val]
        return [self._asrow(r) for r in self._q(sql + " ORDER BY resource_id, association_type", args)]

    def put_associations(self, rows: Sequence[AssociationRow]) -> None:
        """Insert or update (lifecycle, frozen) the rows in one transaction: a request that
        binds a topic's key and value lands whole or not at all."""
        with self._tx() as cur:
            for a in rows:
                cur.execute(self._sql(
                    f"INSERT INTO associations ({self._ASCOLS}, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
                    "ON CONFLICT (resource_id, resource_type, association_type) DO UPDATE SET "
                    "lifecycle = excluded.lifecycle, frozen = excluded.frozen"),
                    (a.guid, a.subject, a.resource_name, a.resource_namespace, a.resource_id, a.resource_type,
                     a.association_type, a.lifecycle, int(a.frozen), time.time()))

    def delete_associations(self, guids: Sequence[str]) -> None:
        with self._tx() as cur:
            for g in guids:
                cur.execute(self._sql("DELETE FROM associations WHERE guid = ?"), (g,))

    # -- audit log --------------------------------------------------------------------------
    def append_audit(self, actor: str, action: str, subject: str | None, version: int | None,
                     detail: dict[str, Any]) -> None:
        self._q("INSERT INTO audit_log (at, actor, action, subject, version, detail) VALUES (?, ?, ?, ?, ?, ?)",
                (time.time(), actor, action, subject, version, json.dumps(detail, default=str)))

    def audit(self, subject: str | None = None, limit: int = 100) -> list[AuditRow]:
        sql = "SELECT id, at, actor, action, subject, version, detail FROM audit_log"
        args: tuple = ()
        if subject:
            sql += " WHERE subject = ?"
            args = (subject,)
        rows = self._q(sql + f" ORDER BY id DESC LIMIT {int(limit)}", args)
        return [AuditRow(int(r[0]), float(r[1]), r[2], r[3], r[4], r[5], json.loads(r[6])) for r in rows]

    # -- approvals --------------------------------------------------------------------------
    _ACOLS = "id, subject, hash, format, schema, requested_by, reason, status, decided_by, created_at, decided_at"

    def add_approval(self, subject: str, hash_: str, fmt: str, text: str, actor: str, reason: str) -> int:
        rows = self._q("INSERT INTO approvals (subject, hash, format, schema, requested_by, reason, status, "
                       "created_at) VALUES (?, ?, ?, ?, ?, ?, 'pending', ?) RETURNING id",
                       (subject, hash_, fmt, text, actor, reason, time.time()))
        return int(rows[0][0])

    def approval(self, approval_id: int) -> ApprovalRow | None:
        rows = self._q(f"SELECT {self._ACOLS} FROM approvals WHERE id = ?", (approval_id,))
        return ApprovalRow(*rows[0]) if rows else None

    def approvals(self, subject: str | None = None, status: str | None = None) -> list[ApprovalRow]:
        sql, args = f"SELECT {self._ACOLS} FROM approvals WHERE 1 = 1", []
        if subject:
            sql, args = sql + " AND subject = ?", [*args, subject]
        if status:
            sql, args = sql + " AND status = ?", [*args, status]
        return [ApprovalRow(*r) for r in self._q(sql + " ORDER BY id", args)]

    def decide_approval(self, approval_id: int, status: str, actor: str) -> None:
        self._q("UPDATE approvals SET status = ?, decided_by = ?, decided_at = ? WHERE id = ?",
                (status, actor, time.time(), approval_id))

    # -- consumers --------------------------------------------------------------------------
    def report_consumer(self, subject: str, consumer_id: str, version: int) -> None:
        """``consumer_id`` read ``version`` of ``subject`` just now (one row per version it reads)."""
        self._q("INSERT INTO consumer_versions (subject, consumer_id, version, last_seen) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (subject, consumer_id, version) DO UPDATE SET last_seen = excluded.last_seen",
                (subject, consumer_id, version, time.time()))

    def consumers(self, subject: str, since: float) -> list[tuple[str, int, float]]:
        """(consumer_id, version, last_seen) seen since ``since``; a consumer appears once per version."""
        return [(r[0], int(r[1]), float(r[2])) for r in self._q(
            "SELECT consumer_id, version, last_seen FROM consumer_versions WHERE subject = ? AND last_seen >= ? "
            "ORDER BY consumer_id, version", (subject, since))]


class SqliteStore(SqlStore):
    """Default backend. ``path=":memory:"`` for tests; WAL mode for concurrent readers."""

    def __init__(self, path: str = "prism-registry.db") -> None:
        super().__init__()
        self.path = path
        self._conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._conn.isolation_level = ""  # explicit transactions via commit()
        if path != ":memory:":
            self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute("PRAGMA foreign_keys=ON")
        self._init_schema()

    def change_token(self) -> int:
        # SQLite's own counter: it changes when any *other* connection commits to the file,
        # which is exactly the sibling-process case (~1 us, no I/O: the WAL index is shared memory).
        with self._lock:
            return int(self._conn.execute("PRAGMA data_version").fetchone()[0])


class PostgresStore(SqlStore):
    """Production backend (psycopg 3). ``pg_schema`` isolates a registry (and each test run)."""

    pk_sql = "BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY"
    placeholder = "%s"

    def __init__(self, dsn: str, pg_schema: str = "prism_registry") -> None:
        super().__init__()
        import psycopg

        if not pg_schema.replace("_", "").isalnum():
            raise ValueError(f"bad schema name {pg_schema!r}")
        self.pg_schema = pg_schema
        self._conn = psycopg.connect(dsn, connect_timeout=5)
        with self._tx() as cur:
            cur.execute(f'CREATE SCHEMA IF NOT EXISTS "{pg_schema}"')
            cur.execute(f'SET search_path TO "{pg_schema}"')
        self._init_schema()
        # Other processes' writes arrive as NOTIFYs on a channel per registry schema; a
        # listener thread counts them (see change_token). Started before the first read can
        # be cached, so no change between the two goes unnoticed.
        self._channel = f"prism_registry_{pg_schema}"[:63]
        self._changes = 0
        self._stopping = threading.Event()
        listening = threading.Event()
        self._listener = threading.Thread(target=self._listen, args=(dsn, listening), daemon=True,
                                          name=f"prism-registry-listen-{pg_schema}")
        self._listener.start()
        if not listening.wait(timeout=10):
            raise ConnectionError(f"could not LISTEN on {self._channel!r} within 10 s")

    def _listen(self, dsn: str, listening: threading.Event) -> None:
        import psycopg

        backoff = 0.1
        while not self._stopping.is_set():
            try:
                with psycopg.connect(dsn, autocommit=True, connect_timeout=5) as conn:
                    conn.execute(f'LISTEN "{self._channel}"')
                    # Notifications sent while this connection was down are lost: count a
                    # change on every (re)connect so the caches are dropped conservatively.
                    self._changes += 1
                    listening.set()
                    backoff = 0.1
                    while not self._stopping.is_set():
                        for _ in conn.notifies(timeout=1.0):
                            self._changes += 1
                            if self._stopping.is_set():  # close() wakes us with a NOTIFY
                                break
            except Exception:  # the server went away: retry; readers meanwhile use caches as they are
                self._stopping.wait(backoff)
                backoff = min(backoff * 2, 5.0)

    def change_token(self) -> int:
        return self._changes

    def _add_column(self, cur: Any, table: str, column: str, sql_type: str) -> None:
        # IF NOT EXISTS: two registry replicas opening the store at once both get here
        cur.execute(f"ALTER TABLE {table} ADD COLUMN IF NOT EXISTS {column} {sql_type}")

    def _columns(self, cur: Any, table: str) -> set[str]:
        # current_schema() is this registry's schema (search_path), so another registry's
        # tables in the same database are never looked at.
        cur.execute("SELECT column_name FROM information_schema.columns "
                    "WHERE table_schema = current_schema() AND table_name = %s", (table,))
        return {str(r[0]) for r in cur.fetchall()}

    def _advance_id_sequence(self, cur: Any) -> None:
        # An identity column does not notice explicit ids: move it past the largest one.
        cur.execute("SELECT setval(pg_get_serial_sequence('schemas', 'id'), "
                    "GREATEST((SELECT MAX(id) FROM schemas), 1))")

    def announce_change(self) -> None:
        self._q(f'NOTIFY "{self._channel}"')

    def close(self) -> None:
        self._stopping.set()
        with contextlib.suppress(Exception):  # wake the listener; if the server is gone it times out
            self.announce_change()
        self._listener.join(timeout=5)
        super().close()

    def drop(self) -> None:
        """Remove every table of this registry (tests)."""
        with self._tx() as cur:
            cur.execute(f'DROP SCHEMA IF EXISTS "{self.pg_schema}" CASCADE')


def open_store(url: str | None) -> SqlStore:
    """``sqlite:///path.db`` (default ``sqlite:///prism-registry.db``), ``sqlite://:memory:``,
    or ``postgresql://host/db[?schema=name]``."""
    if not url:
        return SqliteStore()
    if url.startswith("sqlite://"):
        path = url[len("sqlite://"):]
        if path in ("", ":memory:", "/:memory:"):
            return SqliteStore(":memory:")
        return SqliteStore(path[1:] if path.startswith("/") else path)  # sqlite:////abs, sqlite:///rel
    if url.startswith(("postgres://", "postgresql://")):
        from urllib.parse import parse_qs, urlsplit, urlunsplit

        parts = urlsplit(url)
        q = parse_qs(parts.query)
        schema = q.pop("schema", ["prism_registry"])[0]
        rest = "&".join(f"{k}={v[0]}" for k, v in q.items())
        return PostgresStore(urlunsplit(parts._replace(query=rest)), schema)
    raise ValueError(f"unsupported registry store URL {url!r}")

"""Active consumers per schema version: one row per (subject, consumer, version), reports for
unknown versions refused, and rows of the old one-row-per-consumer table carried over."""

from __future__ import annotations

import time

import pytest

from app.schema.registry import Registry, VersionNotFound
from app.schema.store import SqliteStore

V1 = '{"type": "record", "name": "R", "fields": [{"name": "a", "type": "string"}]}'
V2 = '{"type": "record", "name": "R", "fields": [{"name": "a", "type": "string"}, ' \
     '{"name": "b", "type": "string", "default": ""}]}'


def test_a_consumer_is_listed_under_every_version_it_reads(registry: Registry) -> None:
    registry.register("orders.created", V1, "AVRO")
    registry.register("orders.created", V2, "AVRO")
    for v in (1, 2, 1):
        registry.report_consumer("orders.created", v, "billing")
    registry.report_consumer("orders.created", 2, "audit")
    assert [(c, v) for c, v, _ in registry.active_consumers("orders.created")] == [
        ("audit", 2), ("billing", 1), ("billing", 2)]
    with pytest.raises(VersionNotFound):
        registry.report_consumer("orders.created", 9, "billing")


def test_rows_of_the_legacy_consumers_table_are_migrated(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = str(tmp_path / "r.db")
    s = SqliteStore(path)
    s._q("INSERT INTO consumers (subject, consumer_id, version, last_seen) VALUES (?, ?, ?, ?)",
         ("orders.created", "billing", 1, time.time()))
    s._q("DELETE FROM consumer_versions")
    s.close()
    s = SqliteStore(path)  # opening runs the DDL, which copies legacy rows once (idempotent)
    assert [(c, v) for c, v, _ in s.consumers("orders.created", 0)] == [("billing", 1)]
    s.close()

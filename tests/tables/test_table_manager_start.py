"""The table manager's start in app/tables/recovery.py, without a broker: the tables are finalized
and recovery started at once (no fixed one-second sleep), and a table declared too late still
fails loudly."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import pytest

from app.tables.base import make_table
from app.worker.faust_app import make_app


def _app(tmp_path: Path) -> Any:
    return make_app(f"t-{uuid.uuid4().hex[:8]}", "127.0.0.1:9", tmp_path / "data", partitions=2)


def test_start_finalizes_the_tables_without_sleeping(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    app = _app(tmp_path)
    make_table(app, "counts")
    tables = app.tables
    calls: list[str] = []

    async def no_fixed_sleep(seconds: float) -> None:
        raise AssertionError(f"the table manager slept {seconds} s before finalizing the tables")

    async def recovery_started() -> None:
        calls.append("recovery")

    async def maybe_start() -> None:  # the table's own start needs a broker; not what is tested here
        calls.append("table")

    monkeypatch.setattr(tables, "sleep", no_fixed_sleep)
    monkeypatch.setattr(tables.recovery, "start", recovery_started)
    monkeypatch.setattr(tables["counts"], "maybe_start", maybe_start)
    monkeypatch.setattr(app.consumer, "assignment", set)  # before the group join: nothing assigned yet

    asyncio.run(tables.on_start())

    assert calls == ["table", "recovery"]
    assert tables._tables_registered.is_set()  # what the Conductor waits for before it subscribes
    assert any(topic.endswith("counts-changelog") for topic in tables.changelog_topics)
    with pytest.raises(RuntimeError, match="Too late to add tables"):
        make_table(app, "declared-after-start")


def test_a_stopping_manager_does_not_start_recovery(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    app = _app(tmp_path)
    make_table(app, "counts")
    tables = app.tables

    async def must_not_start() -> None:
        raise AssertionError("recovery started while the worker stops")

    monkeypatch.setattr(tables.recovery, "start", must_not_start)
    monkeypatch.setattr(type(tables), "should_stop", property(lambda self: True))

    asyncio.run(tables.on_start())

    assert not tables._tables_registered.is_set()

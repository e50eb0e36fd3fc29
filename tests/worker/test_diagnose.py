"""The stall snapshot (`kill -USR1`) must never fail, whatever state the worker is in; its
content on a live worker is checked in test_sigterm_e2e (a real subprocess and signal)."""

from __future__ import annotations

import json
from pathlib import Path

from app.worker.diagnose import consumer_snapshot
from app.worker.faust_app import make_app


def test_snapshot_of_an_app_that_never_started(tmp_path: Path) -> None:
    app = make_app("t-diagnose", "127.0.0.1:1", tmp_path, embedded=True)
    snap = consumer_snapshot(app)
    json.dumps(snap)  # what the signal handler writes: plain JSON
    assert snap["rebalancing"] is False
    assert snap["batch_sources"] == []
    assert snap["consumer"] is None or isinstance(snap["consumer"], dict)


def test_snapshot_reports_what_it_cannot_read_instead_of_raising() -> None:
    class Broken:
        consumer_generation_id = 7

        def __getattr__(self, name: str):
            raise RuntimeError(f"no {name} here")

    snap = consumer_snapshot(Broken())
    assert snap["generation"] == 7
    assert snap["flow_control_active"].startswith("<unavailable: RuntimeError: no flow_control here")
    assert snap["consumer"] is None and snap["batch_sources"] == []

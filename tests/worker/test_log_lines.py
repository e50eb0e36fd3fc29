"""The worker's log at its default level (warning): the ready line shows without being a
WARNING, and aiokafka's SASL_PLAINTEXT warning shows once, not once per connection."""

from __future__ import annotations

import io
import logging

import pytest

from app.broker import admin
from app.broker.admin import BrokerSettings, warn_plaintext_sasl_once
from app.worker.faust_app import lifecycle, show_lifecycle


def test_ready_line_is_info_and_still_shown_at_warning() -> None:
    root = logging.getLogger("polish-test-root")
    root.propagate = False
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setLevel(logging.WARNING)  # what the worker's handlers get at --loglevel warning
    root.addHandler(handler)
    child_lifecycle = logging.getLogger("polish-test-root.x")
    try:
        show_lifecycle(root)
        show_lifecycle(root)  # idempotent: one filter
        assert handler.level == logging.INFO and len(handler.filters) == 1
        record = lifecycle.makeRecord(lifecycle.name, logging.INFO, __file__, 1, "prism worker ready: x", (), None)
        handler.handle(record)
        child_lifecycle.info("an ordinary info line")  # not shown: the old threshold still holds
        child_lifecycle.warning("a warning")
        assert stream.getvalue().splitlines() == ["prism worker ready: x", "a warning"]
        assert lifecycle.getEffectiveLevel() == logging.INFO
    finally:
        root.removeHandler(handler)


def test_sasl_plaintext_warning_once(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(admin._SASL_CLEAR, "seen", False)
    conn = logging.getLogger("aiokafka.conn")
    monkeypatch.setattr(conn, "filters", list(conn.filters))  # restored after the test
    settings = BrokerSettings.from_env({"PRISM_BROKER_URL": "k:9092", "PRISM_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
                                        "PRISM_SASL_MECHANISM": "PLAIN", "PRISM_SASL_USERNAME": "u",
                                        "PRISM_SASL_PASSWORD": "p"})
    settings.aiokafka_kwargs()
    settings.aiokafka_kwargs()  # every client asks: the filter is installed once
    assert conn.filters.count(admin._SASL_CLEAR) == 1
    with caplog.at_level(logging.WARNING, logger="aiokafka.conn"):
        for _ in range(20):  # aiokafka warns on every connection
            conn.warning("Sending username and password in the clear")
        conn.warning("another warning")
        conn.warning("another warning")
    texts = [r.getMessage() for r in caplog.records if r.name == "aiokafka.conn"]
    assert texts == ["Sending username and password in the clear", "another warning", "another warning"]


def test_other_protocols_install_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    conn = logging.getLogger("aiokafka.conn")
    monkeypatch.setattr(conn, "filters", [])
    for protocol in ("PLAINTEXT", "SSL", "SASL_SSL"):
        warn_plaintext_sasl_once(protocol)
    assert conn.filters == []

"""Fixtures every test folder can use."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from app.broker.embedded import EmbeddedBroker
from tests.support import require_broker_binary


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[EmbeddedBroker]:
    """A fresh embedded Kafka-protocol broker per test (it starts in well under a second)."""
    require_broker_binary()
    embedded = EmbeddedBroker(log_dir=tmp_path / "broker", startup_timeout=20)
    embedded.start()
    try:
        yield embedded
    finally:
        embedded.stop()


def pytest_unconfigure(config: pytest.Config) -> None:
    """Stop the PostgreSQL, Redis and NATS servers this run started (tests/servers.py)."""
    from tests import servers

    servers.stop_all()

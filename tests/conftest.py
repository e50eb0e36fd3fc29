"""Fixtures every test folder can use."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from app.broker.embedded import EmbeddedBroker
from tests.brokers import BrokerUnderTest
from tests.support import require_broker_binary

#: Apache Kafka for any test folder: ``kafka`` (session broker), ``kafka_cluster`` (3 nodes),
#: ``kafka_secure`` (SASL_SSL + mTLS, ACLs) - tests/kafka/fixtures.py.
pytest_plugins = ["tests.kafka.fixtures"]


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



@pytest.fixture(params=["embedded", "kafka"])
def any_broker(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[BrokerUnderTest]:
    """The test runs twice: on a fresh embedded broker, and on the session's Apache Kafka
    broker (fresh topic names and group ids per test keep them apart)."""
    if request.param == "kafka":
        kafka = request.getfixturevalue("kafka")
        yield BrokerUnderTest("kafka", kafka.bootstrap)
        return
    require_broker_binary()
    embedded = EmbeddedBroker(log_dir=tmp_path / "broker", startup_timeout=20)
    embedded.start()
    try:
        yield BrokerUnderTest("embedded", embedded.bootstrap)
    finally:
        embedded.stop()


def pytest_unconfigure(config: pytest.Config) -> None:
    """Stop the PostgreSQL, Redis and NATS servers this run started (tests/servers.py)."""
    from tests import servers

    servers.stop_all()

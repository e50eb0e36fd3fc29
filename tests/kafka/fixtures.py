"""Pytest fixtures that give any test folder a real Apache Kafka (see tests/kafka/cluster.py).

Register them for the whole suite in tests/conftest.py with::

    pytest_plugins = ["tests.kafka.fixtures"]

(tests/conftest.py is loaded before pytest finishes configuring, which is where pytest accepts
``pytest_plugins``), or import them into one folder's conftest.py with
``from tests.kafka.fixtures import *``.  Both at once is harmless: the session broker is kept
in this module, so two registrations still share one broker.

Fixtures:

* ``kafka_libs`` (session): the verified jars of the default Kafka version.
* ``kafka`` (session): one PLAINTEXT broker+controller shared by the session; use fresh topic
  names (``kafka_topic`` makes one).
* ``kafka_topic`` (function): a new single-partition topic on ``kafka``.
* ``kafka_factory`` (function) / ``kafka_module_factory`` (module): ``make(**kwargs)`` starts an
  :class:`ApacheKafka` with those arguments (``nodes=``, ``listeners=``, ``acls=``,
  ``broker_config=``, ``libs=`` for another version) and stops it at the end of the scope.
* ``kafka_cluster`` (module): three broker+controller nodes, a 3-voter quorum,
  ``default.replication.factor=3``, ``min.insync.replicas=2``.
* ``kafka_secure`` (module): listeners SASL_SSL (SCRAM-SHA-512, users ``admin``, ``alice``,
  ``bob``) and SSL (mutual TLS), ``StandardAuthorizer`` with ``admin`` as super user.

Without Java, or when the jars cannot be fetched, the fixtures skip - and fail under CI=true
(``tests.support.require``).  A broker that is there but does not start is an error, never a skip.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.kafka.cluster import (
    DEFAULT_VERSION,
    ApacheKafka,
    KafkaUnavailable,
    fetch_kafka,
)
from tests.support import require

__all__ = [
    "kafka",
    "kafka_cluster",
    "kafka_factory",
    "kafka_libs",
    "kafka_module_factory",
    "kafka_secure",
    "kafka_topic",
    "require_kafka_libs",
]

#: The session broker, kept here (not in pytest's fixture cache) so that a second registration
#: of these fixtures reuses it instead of starting another.
_SESSION: dict[str, ApacheKafka] = {}
_counter = itertools.count()

KafkaFactory = Callable[..., ApacheKafka]


def require_kafka_libs(version: str = DEFAULT_VERSION) -> Path:
    """The jars of Kafka ``version``; skip (fail under CI=true) when Java or the fetch is missing."""
    try:
        return fetch_kafka(version)
    except KafkaUnavailable as exc:
        require(False, str(exc))
        raise  # unreachable: require() skipped or failed


@pytest.fixture(scope="session")
def kafka_libs() -> Path:
    """The verified libs directory of the default Kafka version (fetched once per session)."""
    return require_kafka_libs()


@pytest.fixture(scope="session")
def kafka(kafka_libs: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApacheKafka]:
    """One PLAINTEXT Apache Kafka broker+controller for the whole session (tests use fresh topics)."""
    owner = "kafka" not in _SESSION
    if owner:
        cluster = ApacheKafka(kafka_libs, tmp_path_factory.mktemp("apache-kafka"))
        cluster.start()
        _SESSION["kafka"] = cluster
    try:
        yield _SESSION["kafka"]
    finally:
        if owner:
            _SESSION.pop("kafka").stop()


@pytest.fixture
def kafka_topic(kafka: ApacheKafka, request: pytest.FixtureRequest) -> str:
    """A new, empty single-partition topic on the session broker, named after the test."""
    stem = "".join(c if c.isalnum() else "-" for c in request.node.name)[:80]
    return kafka.create_topic(f"t-{stem}-{uuid.uuid4().hex[:8]}")


def _factory(libs: Path, directory: Path) -> tuple[KafkaFactory, list[ApacheKafka]]:
    created: list[ApacheKafka] = []

    def make(**kwargs: Any) -> ApacheKafka:
        cluster = ApacheKafka(kwargs.pop("libs", libs), directory / f"kafka-{next(_counter)}", **kwargs)
        created.append(cluster)  # before start(): a failed start is stopped too
        return cluster.start()

    return make, created


def _stop_all(created: list[ApacheKafka]) -> None:
    errors = []
    for cluster in created:
        try:
            cluster.stop()
        except Exception as exc:  # stop the others regardless
            errors.append(exc)
    if errors:
        raise errors[0]


@pytest.fixture
def kafka_factory(kafka_libs: Path, tmp_path: Path) -> Iterator[KafkaFactory]:
    """``make(**kwargs)`` -> a started :class:`ApacheKafka`, stopped when the test ends."""
    make, created = _factory(kafka_libs, tmp_path)
    try:
        yield make
    finally:
        _stop_all(created)


@pytest.fixture(scope="module")
def kafka_module_factory(kafka_libs: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaFactory]:
    """``make(**kwargs)`` -> a started :class:`ApacheKafka`, stopped when the module's tests are done."""
    make, created = _factory(kafka_libs, tmp_path_factory.mktemp("apache-kafka-module"))
    try:
        yield make
    finally:
        _stop_all(created)


@pytest.fixture(scope="module")
def kafka_cluster(kafka_module_factory: KafkaFactory) -> ApacheKafka:
    """Three combined broker+controller nodes: RF 3, min ISR 2; tests may kill and restart nodes."""
    return kafka_module_factory(nodes=3)


@pytest.fixture(scope="module")
def kafka_secure(kafka_module_factory: KafkaFactory) -> ApacheKafka:
    """SASL_SSL (SCRAM-SHA-512) and SSL (mutual TLS) listeners with ACLs enforced; ``admin`` is super user."""
    return kafka_module_factory(listeners=("SASL_SSL", "SSL"), acls=True)

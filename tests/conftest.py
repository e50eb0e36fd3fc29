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


#: The driver JVM flags of every Spark the tests start (the session's own, and each `prism lake
#: compact` child): C1 only and the serial GC, as tests/kafka/cluster.py's `light_jvm` gives the
#: test brokers. A compaction of a test archive is a short-lived JVM that spends most of its time
#: starting and compiling; C2 and parallel GC threads only compete for the 2 cores.
SPARK_TEST_DRIVER_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
_SPARK_CONF = pytest.StashKey[Path]()


def pytest_configure(config: pytest.Config) -> None:
    """Point Spark at a conf directory whose spark-defaults.conf sets
    `spark.driver.defaultJavaOptions` (prepended to the `extraJavaOptions` that app.lake.spark
    sets, so its log4j configuration stays). Through the environment it reaches the compaction
    subprocesses too. A SPARK_CONF_DIR set by the caller is left alone."""
    import os
    import tempfile

    if os.environ.get("SPARK_CONF_DIR"):
        return
    conf = Path(tempfile.mkdtemp(prefix="prism-test-spark-conf-"))
    (conf / "spark-defaults.conf").write_text(f"spark.driver.defaultJavaOptions {SPARK_TEST_DRIVER_JAVA_OPTIONS}\n")
    os.environ["SPARK_CONF_DIR"] = str(conf)
    config.stash[_SPARK_CONF] = conf


def pytest_unconfigure(config: pytest.Config) -> None:
    """Stop the PostgreSQL, Redis and NATS servers this run started (tests/servers.py); remove
    the Spark conf directory of `pytest_configure`."""
    import shutil

    from tests import servers

    servers.stop_all()
    conf = config.stash.get(_SPARK_CONF, None)
    if conf is not None:
        shutil.rmtree(conf, ignore_errors=True)

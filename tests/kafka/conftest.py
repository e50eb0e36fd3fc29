"""The Apache Kafka fixtures for this folder (other folders: see tests/kafka/fixtures.py's docstring)."""

from tests.kafka.fixtures import *  # noqa: F403

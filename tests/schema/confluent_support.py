"""Shared by the Confluent conformance tests (modes, deletes): two compatible Avro versions and
the (HTTP status, Confluent error code) a refused client call raised."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka.schema_registry.error import SchemaRegistryError

A1 = '{"type":"record","name":"R","fields":[{"name":"a","type":"int"}]}'
A2 = '{"type":"record","name":"R","fields":[{"name":"a","type":"int"},{"name":"b","type":"int","default":0}]}'


def refused(call: Callable[[], Any]) -> tuple[int, int]:
    """Run a confluent-kafka client call that must be refused; its (status, error_code)."""
    with pytest.raises(SchemaRegistryError) as e:
        call()
    return e.value.http_status_code, e.value.error_code

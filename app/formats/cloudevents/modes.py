"""Which content mode a Kafka record uses, and reading a record in either.

The CloudEvents Kafka Protocol Binding 1.0 tells the modes apart by the `content-type` header:
structured when it starts with `application/cloudevents`, otherwise binary (`ce_` headers).
Structured is checked first, so `ce_` headers next to a structured content type are ignored.
"""

from __future__ import annotations

from collections.abc import Sequence

from .._fields import header_pairs
from .binary import from_kafka_binary
from .decode import Decoded
from .kafka import CE_PREFIX, STRUCTURED_PREFIX
from .structured import from_kafka_structured


def is_structured(headers: Sequence[tuple[str, bytes]]) -> bool:
    """Structured mode: a `content-type` header starting with application/cloudevents."""
    for name, value in header_pairs(headers):
        if name == "content-type" and value.strip().lower().startswith(STRUCTURED_PREFIX.encode()):
            return True
    return False


def is_binary(headers: Sequence[tuple[str, bytes]]) -> bool:
    """Binary mode: any `ce_` header (and not structured)."""
    return any(name.lower().startswith(CE_PREFIX) for name, _ in headers) and not is_structured(headers)


def from_kafka(value: bytes | memoryview, headers: Sequence[tuple[str, bytes | str]], key: bytes | None = None,
               *, topic: str, namespace: str, now_ms: int | None = None) -> Decoded:
    """Either content mode, chosen as the Kafka binding says (structured content type first)."""
    if is_structured(headers):
        return from_kafka_structured(value, headers, key, topic=topic, namespace=namespace, now_ms=now_ms)
    return from_kafka_binary(value, headers, key, topic=topic, namespace=namespace, now_ms=now_ms)

"""Consumer-side schema assertion (RFC-030 ``schema_assertion``), for the SDK.

A subscriber states the schema version it was built against; each message's
``SchemaContext.schema_version`` is compared with it. ``on_mismatch`` decides what happens:
``error`` raises :class:`SchemaMismatchError` (nack -> retry/DLQ), ``warn`` logs once per
version seen and lets the message through, ``ignore`` does nothing. The check is a string
comparison: it is meant to run per message.
"""

from __future__ import annotations

import enum
import logging
from dataclasses import dataclass, field

log = logging.getLogger("prism.schema.assertion")


class OnMismatch(enum.StrEnum):
    ERROR = "error"
    WARN = "warn"
    IGNORE = "ignore"


class SchemaMismatchError(Exception):
    def __init__(self, expected: str, actual: str | None, topic: str | None = None) -> None:
        super().__init__(f"schema version mismatch on {topic or 'topic'}: expected {expected}, got {actual}")
        self.expected, self.actual, self.topic = expected, actual, topic


@dataclass
class SchemaAssertion:
    """``SchemaAssertion("v2", "warn").check(ctx_version)`` -> True when the message may be processed."""

    expected_version: str
    on_mismatch: OnMismatch | str = OnMismatch.ERROR
    expected_hash: str | None = None
    topic: str | None = None
    mismatches: int = 0
    _warned: set[str | None] = field(default_factory=set, repr=False)

    def __post_init__(self) -> None:
        self.on_mismatch = OnMismatch(str(self.on_mismatch).lower())

    @staticmethod
    def _norm(v: str | None) -> str | None:
        if v is None:
            return None
        v = str(v).strip()
        return v[1:] if v[:1] in ("v", "V") and v[1:].isdigit() else v

    def check(self, schema_version: str | None, schema_hash: str | None = None) -> bool:
        ok = self._norm(schema_version) == self._norm(self.expected_version) and (
            self.expected_hash is None or schema_hash == self.expected_hash)
        if ok:
            return True
        self.mismatches += 1
        if self.on_mismatch is OnMismatch.ERROR:
            raise SchemaMismatchError(self.expected_version, schema_version, self.topic)
        if self.on_mismatch is OnMismatch.WARN and schema_version not in self._warned:
            self._warned.add(schema_version)
            log.warning("unexpected schema version on %s: expected %s, got %s", self.topic, self.expected_version,
                        schema_version)
        return True

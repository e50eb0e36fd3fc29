"""enrich: continue the producer's W3C trace (or start one), attach schema context and the
PII flag. Schema data is resolved once at start-up; there is no per-message lookup.

With a protobuf schema that marks fields `[deprecated = true]`, the fields a payload actually
sets are listed in `SchemaContext.deprecated_fields_used` (migration tracking, RFC-030).
With `validate_payloads` (a debug setting), a payload that does not conform to the schema
is rejected to the DLQ. Both read the payload, which is why enrich runs after the
authentication and signature stages; encrypted payloads are never read here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from app.agents.base import Message, Stage
from app.errors import PayloadSchemaError
from app.observability.tracecontext import continue_or_start
from app.schema.resolve import deprecated_fields_used


@dataclass(frozen=True, slots=True)
class SchemaInfo:
    """What the enrich stage stamps on every envelope of a namespace (resolved at start-up)."""

    url: str = ""
    version: str = ""
    format: str = ""
    hash: str = ""
    name: str = ""
    compatibility: str = ""
    pii_fields: tuple[str, ...] = ()
    #: the full resolved schema, for deprecated-field tracking (None without a schema)
    resolved: Any = None
    #: `(payload, content_type) -> problems`, only when validate_payloads is on
    checker: Callable[[bytes, str], list[str]] | None = None


class Enrich(Stage):
    name = "enrich"

    def __init__(self, *, trace: bool, schema: SchemaInfo | None) -> None:
        self.trace = trace
        self.schema = schema
        #: what of the per-message work the schema makes possible at all, decided once
        self._stamps = schema is not None and bool(schema.url or schema.version or schema.name)
        self._may_track = (schema is not None and schema.resolved is not None and schema.format == "protobuf"
                           and bool(schema.resolved.deprecated_fields))
        self._reads_payload = schema is not None and (schema.checker is not None or self._may_track)

    def process(self, msg: Message) -> None:
        env = msg.env
        if self.trace:
            continue_or_start(env, msg.headers)
        s = self.schema
        if s is None:
            return
        if self._stamps:
            sc = env.ensure_schema()
            sc.schema_url, sc.schema_version, sc.schema_format = s.url, s.version, s.format
            sc.schema_hash, sc.schema_name, sc.compatibility_mode = s.hash, s.name, s.compatibility
        if s.pii_fields:
            env.ensure_security().contains_pii = True
        if not self._reads_payload:  # no checker, and no deprecated field this schema could report
            return
        track_deprecated = self._may_track and env.content_type == "application/protobuf"
        if env.is_encrypted or (s.checker is None and not track_deprecated):
            return
        body = env.payload_bytes()
        if s.checker is not None:
            problems = s.checker(body, env.content_type)
            if problems:
                raise PayloadSchemaError(f"payload does not conform to {s.name or s.url} {s.version}: "
                                         + "; ".join(problems), path="payload",
                                         hint="fix the producer, or turn enrich.schema.validate_payloads off")
        if track_deprecated:
            used = deprecated_fields_used(body, s.resolved)
            if used:
                env.ensure_schema().deprecated_fields_used.extend(used)

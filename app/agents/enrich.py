"""enrich: continue the producer's W3C trace (or start one), attach schema context and the
PII flag. Schema data is resolved once at start-up; there is no per-message lookup."""

from __future__ import annotations

from dataclasses import dataclass

from app.agents.base import Message, Stage
from app.observability.tracecontext import continue_or_start


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


class Enrich(Stage):
    name = "enrich"

    def __init__(self, *, trace: bool, schema: SchemaInfo | None) -> None:
        self.trace = trace
        self.schema = schema

    def process(self, msg: Message) -> None:
        env = msg.env
        if self.trace:
            continue_or_start(env, msg.headers)
        s = self.schema
        if s is None:
            return
        if s.url or s.version or s.name:
            sc = env.ensure_schema()
            sc.schema_url, sc.schema_version, sc.schema_format = s.url, s.version, s.format
            sc.schema_hash, sc.schema_name, sc.compatibility_mode = s.hash, s.name, s.compatibility
        if s.pii_fields:
            env.ensure_security().contains_pii = True

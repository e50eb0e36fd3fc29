"""enrich: continue the producer's W3C trace (or start one), attach schema context and the
PII flag. Schema data is resolved once at start-up; there is no per-message lookup.

With a protobuf schema that marks fields `[deprecated = true]`, the fields a payload actually
sets are listed in `SchemaContext.deprecated_fields_used` (migration tracking, RFC-030).
Schema validation (RFC-030 "Migration Path") is set per topology and per namespace
(`validation: off | warn | strict`, the envelope's namespace picks the mode): `warn` logs a
non-conforming payload (event `schema_validation_failed`, with the field path), counts it and
forwards it with the header `prism-schema-validation: failed; <path>`; `strict` sends it to the
DLQ as `schema_validation_failed`. `off` never reads the payload. The older debug switch
`validate_payloads` keeps its own reason, `payload_schema_mismatch`. Validation and deprecated-field tracking read the payload,
which is why enrich runs after the authentication and signature stages; encrypted payloads
are never read here (counted as `skipped`).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from app.agents.base import Message, Stage
from app.errors import PayloadSchemaError, SchemaValidationError
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
    #: `(payload, content_type) -> [Violation]` (app/schema/payload_check.py), built once per
    #: schema id and only when some namespace's validation mode is warn or strict
    validator: Callable[[bytes, str], list[Any]] | None = None


log = logging.getLogger("prism.worker")
#: on each output of a message that failed validation under `warn` (`failed; $.path[, ...]`)
VALIDATION_HEADER = "prism-schema-validation"
#: `schema_validation_failed` log lines per second at most; the next line says how many were left out
LOG_PER_SECOND = 20


class Enrich(Stage):
    name = "enrich"

    def __init__(self, *, trace: bool, schema: SchemaInfo | None, validation: str = "off",
                 namespace_validation: Mapping[str, str] | None = None) -> None:
        self.trace = trace
        self.schema = schema
        can = schema is not None and schema.validator is not None
        #: validation mode for namespaces not in `namespace_validation` (off without a validator)
        self.validation = validation if can else "off"
        self.namespace_validation = dict(namespace_validation or {}) if can else {}
        self._validates = can and (self.validation != "off"
                                   or any(m != "off" for m in self.namespace_validation.values()))
        #: (namespace, schema_version, mode, result) -> messages; drained by the observer into
        #: prism_schema_validations_total (result: valid | invalid | skipped)
        self.validations: Counter[tuple[str, str, str, str]] = Counter()
        self._log_window = 0.0
        self._logged = 0
        self._suppressed = 0
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
        if not (self._validates or self._reads_payload):
            return
        # read once for validation and tracking alike: each read walks the protobuf again
        encrypted, content_type = env.is_encrypted, env.content_type
        body = self._validate(msg, s, encrypted, content_type) if self._validates else None
        if not self._reads_payload:  # no checker, and no deprecated field this schema could report
            return
        track_deprecated = self._may_track and content_type == "application/protobuf"
        if encrypted or (s.checker is None and not track_deprecated):
            return
        if body is None:
            body = env.payload_bytes()
        if s.checker is not None:
            problems = s.checker(body, content_type)
            if problems:
                raise PayloadSchemaError(f"payload does not conform to {s.name or s.url} {s.version}: "
                                         + "; ".join(problems), path="payload",
                                         hint="fix the producer, or turn enrich.schema.validate_payloads off")
        if track_deprecated:
            used = deprecated_fields_used(body, s.resolved)
            if used:
                env.ensure_schema().deprecated_fields_used.extend(used)

    # -- schema validation (RFC-030 "Migration Path") ----------------------------------------
    def mode_for(self, namespace: str) -> str:
        return self.namespace_validation.get(namespace, self.validation)

    def _validate(self, msg: Message, s: SchemaInfo, encrypted: bool, content_type: str) -> bytes | None:
        """Validate the payload per the namespace's mode; the plaintext payload it read (so
        `process` does not read it again), or None when it read none."""
        env = msg.env
        namespace = env.namespace
        mode = self.namespace_validation.get(namespace, self.validation)
        if mode == "off":
            return None
        if encrypted:  # the worker cannot read it; the producer's SDK can validate before encrypting
            self.validations[(namespace, s.version, mode, "skipped")] += 1
            return None
        assert s.validator is not None
        body = env.payload_bytes()
        violations = s.validator(body, content_type)
        if not violations:
            self.validations[(namespace, s.version, mode, "valid")] += 1
            return body
        self.validations[(namespace, s.version, mode, "invalid")] += 1
        paths = ", ".join(v.path for v in violations[:3]) + (", ..." if len(violations) > 3 else "")
        self._log(msg, mode, violations, s)
        if mode == "strict":
            raise SchemaValidationError(
                f"payload does not match {s.name or s.url} {s.version}: " + "; ".join(map(str, violations[:5])),
                violations=violations, schema_version=s.version,
                hint="fix the producer (the path names the field), or set this namespace's validation to warn")
        headers = msg.out_headers
        if headers is None:
            headers = msg.out_headers = []
        headers.append((VALIDATION_HEADER, f"failed; {paths}".encode()))
        return body

    def _log(self, msg: Message, mode: str, violations: list[Any], s: SchemaInfo) -> None:
        """The `schema_validation_failed` event: field path and the violated rule, never the value
        (a payload field may be personal data); at most LOG_PER_SECOND lines a second."""
        now = time.monotonic()
        if now - self._log_window >= 1.0:
            self._log_window, self._logged = now, 0
        if self._logged >= LOG_PER_SECOND:
            self._suppressed += 1
            return
        self._logged += 1
        first = violations[0]
        log.warning("schema_validation_failed: %s %s at %s (%s)%s", s.name or s.url, s.version, first.path,
                    first.rule or "does not match", f"; {self._suppressed} more not logged" if self._suppressed
                    else "", extra={
                        "event": "schema_validation_failed", "field_path": first.path,
                        "field_paths": [v.path for v in violations[:20]], "rule": first.rule,
                        "validation_mode": mode, "namespace": msg.env.namespace, "schema_version": s.version,
                        "schema_name": s.name, "message_id": msg.env.message_id, "topic": msg.topic,
                        "partition": msg.partition, "offset": msg.offset, "suppressed": self._suppressed})
        self._suppressed = 0

    def drain_validations(self) -> dict[tuple[str, str, str, str], int]:
        """The validation counts since the last call (the observer turns them into metrics)."""
        out = dict(self.validations)
        self.validations.clear()
        return out

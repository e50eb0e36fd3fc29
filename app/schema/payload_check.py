"""Payload validation against a namespace's resolved schema (RFC-030 "Migration Path").

Used by the worker's enrich stage (`validation: warn | strict`, and the older debug switch
`validate_payloads`) and by the SDK's `publish(..., schema_validation=True)`. A validator is
compiled once per schema (`validator_for` caches it by the schema's id: its content hash plus
the protobuf root message), because compiling - protoc for protobuf, the metaschema check for
JSON Schema - costs milliseconds while validating costs microseconds.

Every problem is a `Violation` with a JSONPath-style field path (`$.items[2].price`), so a
log line, a DLQ header or an SDK exception points at the field to fix:

* JSON Schema: `jsonschema` decides; the path is the error's `absolute_path`.
* Avro: a JSON-encoded datum is validated with fastavro; fastavro names the *schema* field
  (`ns.Item.price`), not the datum's position, so the failing position is found by
  re-validating children with fastavro on the way down (records, arrays, maps). A binary
  datum is read with fastavro's schemaless reader (no path: `$`).
* Protobuf: the payload is parsed with the schema's own message class (compiled from the
  descriptors the registry checked), so wire-type errors and invalid UTF-8 are caught and
  unknown fields tolerated, as protobuf readers do; the parser reports no field, so the
  path is `$`. A JSON payload under a protobuf schema is parsed with `json_format`, whose
  message names the field.
"""

from __future__ import annotations

import io
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..envelope.compression import DEFAULT_MAX_DECOMPRESSED
from ..untrusted_json import loads_untrusted
from .model import schema_json
from .resolve import ResolvedSchema

#: problems reported per payload at most (a broken producer can fail every field)
MAX_VIOLATIONS = 20


@dataclass(frozen=True, slots=True)
class Violation:
    """One way a payload does not match its schema: where (`$.items[2].price`) and what.

    `message` may quote the offending value (fine for a DLQ header, which the worker masks
    for PII, or an exception in the producer's own process); `rule` never does, so it is
    what a log line or a metric-adjacent warning carries."""

    path: str
    message: str
    rule: str = ""

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


Validator = Callable[[bytes, str], list[Violation]]

_CACHE: dict[tuple[str, str, str], Validator] = {}
_CACHE_LOCK = threading.Lock()


def json_path(parts: Any) -> str:
    """`["items", 2, "price"]` -> `$.items[2].price` (keys that are not identifiers are quoted)."""
    out = "$"
    for p in parts:
        if isinstance(p, int):
            out += f"[{p}]"
        elif str(p).isidentifier():
            out += f".{p}"
        else:
            out += f"[{json.dumps(str(p))}]"
    return out


def validator_for(resolved: ResolvedSchema) -> Validator:
    """The compiled validator of `resolved`, built on first use and then shared by every
    caller that validates against the same schema id (hash and root message)."""
    key = (resolved.hash, resolved.format.value, resolved.name)
    v = _CACHE.get(key)
    if v is None:
        with _CACHE_LOCK:
            v = _CACHE.get(key)
            if v is None:
                v = _CACHE[key] = _build(resolved)
    return v


def _build(resolved: ResolvedSchema) -> Validator:
    fmt = resolved.format.value.lower()
    if fmt == "protobuf":
        return _protobuf_validator(resolved)
    if fmt in ("json", "jsonschema", "json-schema", "json_schema"):
        return _jsonschema_validator(resolved)
    if fmt == "avro":
        return _avro_validator(resolved)
    raise ValueError(f"no payload validation for schema format {fmt!r}")


def build_checker(resolved: ResolvedSchema) -> Callable[[bytes, str], list[str]]:
    """`(payload, content_type) -> problems` as text (`$.path: what`), for `validate_payloads`."""
    validate = validator_for(resolved)

    def check(payload: bytes, content_type: str) -> list[str]:
        return [str(v) for v in validate(payload, content_type)]

    return check


def _protobuf_validator(resolved: ResolvedSchema) -> Validator:
    from google.protobuf import descriptor_pool, json_format, message_factory

    from .protoparse import compile_proto

    schema = compile_proto(resolved.schema_text)
    pool = descriptor_pool.DescriptorPool()
    for fd in schema.fds.file:
        pool.Add(fd)
    cls = message_factory.GetMessageClass(pool.FindMessageTypeByName(resolved.name))

    def validate(payload: bytes, content_type: str) -> list[Violation]:
        if "json" in content_type:
            try:
                json_format.Parse(payload, cls())
            except Exception as exc:  # json_format.ParseError names the field in its message
                return [Violation("$", f"not a valid {resolved.name} in JSON: {exc}", "protobuf JSON mapping")]
            return []
        try:
            cls.FromString(payload)
        except Exception as exc:  # upb's DecodeError
            return [Violation("$", f"not a valid {resolved.name}: {exc}", "protobuf wire format")]
        return []

    return validate


def _jsonschema_validator(resolved: ResolvedSchema) -> Validator:
    import jsonschema

    schema = schema_json(resolved.schema_text, "JSON Schema")
    cls = jsonschema.validators.validator_for(schema)
    validator = cls(schema, format_checker=cls.FORMAT_CHECKER)

    def validate(payload: bytes, content_type: str) -> list[Violation]:
        try:
            doc = loads_untrusted(payload, what="payload", max_bytes=DEFAULT_MAX_DECOMPRESSED)
        except ValueError as exc:  # JsonInputError: syntax, size or depth
            return [Violation("$", f"payload is not JSON: {exc}", "not JSON")]
        errors = sorted(validator.iter_errors(doc), key=lambda e: [str(p) for p in e.absolute_path])
        return [Violation(json_path(e.absolute_path), e.message, _rule(e)) for e in errors[:MAX_VIOLATIONS]]

    return validate


def _rule(e: Any) -> str:
    """A jsonschema error as `keyword: expectation` (`type: number`), without the instance."""
    expected = json.dumps(e.validator_value, separators=(",", ":"), default=str)
    return f"{e.validator}: {expected[:80]}"


def _avro_validator(resolved: ResolvedSchema) -> Validator:
    import fastavro
    from fastavro.validation import validate as avro_valid

    parsed = fastavro.parse_schema(schema_json(resolved.schema_text, "Avro schema"))
    #: the same schema with named types inlined, so every sub-schema stands alone for `locate`
    expanded = fastavro.parse_schema(schema_json(resolved.schema_text, "Avro schema"), expand=True)

    def locate(datum: Any, schema: Any, path: list[Any]) -> list[Any]:
        """The deepest position under `path` whose value fastavro rejects."""
        s = schema
        if isinstance(s, dict):
            t = s.get("type")
            if t == "record" and isinstance(datum, dict):
                for f in s["fields"]:
                    value = datum.get(f["name"], f.get("default"))
                    if not avro_valid(value, f["type"], raise_errors=False):
                        return locate(value, f["type"], [*path, f["name"]])
            elif t == "array" and isinstance(datum, list):
                for i, item in enumerate(datum):
                    if not avro_valid(item, s["items"], raise_errors=False):
                        return locate(item, s["items"], [*path, i])
            elif t == "map" and isinstance(datum, dict):
                for k, item in datum.items():
                    if not avro_valid(item, s["values"], raise_errors=False):
                        return locate(item, s["values"], [*path, k])
        return path

    def validate(payload: bytes, content_type: str) -> list[Violation]:
        if "json" in content_type:
            try:
                datum: Any = loads_untrusted(payload, what="payload", max_bytes=DEFAULT_MAX_DECOMPRESSED)
            except ValueError as exc:  # JsonInputError: syntax, size or depth
                return [Violation("$", f"payload is not JSON: {exc}", "not JSON")]
            try:
                avro_valid(datum, parsed, raise_errors=True)
            except Exception as exc:
                errors = getattr(exc, "errors", None) or [exc]
                where = json_path(locate(datum, expanded, []))
                return [Violation(where, f"does not match the Avro schema: {str(errors[0]).strip()}",
                                  "avro: value does not match the field's type")]
            return []
        try:
            fastavro.schemaless_reader(io.BytesIO(payload), parsed)
        except Exception as exc:
            return [Violation("$", f"payload is not binary Avro of this schema: {exc}", "avro binary encoding")]
        return []

    return validate

"""Publish-time payload validation against a namespace's resolved schema (RFC-030, debug).

Built once per namespace at start-up from the `ResolvedSchema`; `check(payload)` returns
the problems (empty when the payload conforms). Protobuf payloads are parsed with the
schema's own message class (compiled from the same descriptors the registry checked), so
wire-type errors and invalid UTF-8 are caught, unknown fields are tolerated as protobuf
readers do. JSON Schema uses `jsonschema`; Avro accepts JSON-encoded datums (validated with
fastavro) or the binary encoding (read with fastavro's schemaless reader).
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from typing import Any

from google.protobuf import descriptor_pool, message_factory

from app.schema.resolve import ResolvedSchema


def build_checker(resolved: ResolvedSchema) -> Callable[[bytes, str], list[str]]:
    """A function `(payload, content_type) -> problems` for `resolved`'s format."""
    fmt = resolved.format.value.lower()
    if fmt == "protobuf":
        return _protobuf_checker(resolved)
    if fmt in ("json", "jsonschema", "json-schema", "json_schema"):
        return _jsonschema_checker(resolved)
    if fmt == "avro":
        return _avro_checker(resolved)
    raise ValueError(f"no payload validation for schema format {fmt!r}")


def _protobuf_checker(resolved: ResolvedSchema) -> Callable[[bytes, str], list[str]]:
    from app.schema.protoparse import compile_proto

    schema = compile_proto(resolved.schema_text)
    pool = descriptor_pool.DescriptorPool()
    for fd in schema.fds.file:
        pool.Add(fd)
    cls = message_factory.GetMessageClass(pool.FindMessageTypeByName(resolved.name))

    def check(payload: bytes, content_type: str) -> list[str]:
        try:
            cls.FromString(payload)
        except Exception as exc:  # upb's DecodeError
            return [f"payload is not a valid {resolved.name}: {exc}"]
        return []

    return check


def _jsonschema_checker(resolved: ResolvedSchema) -> Callable[[bytes, str], list[str]]:
    import jsonschema

    schema = json.loads(resolved.schema_text)
    validator = jsonschema.validators.validator_for(schema)(schema)

    def check(payload: bytes, content_type: str) -> list[str]:
        try:
            doc = json.loads(payload)
        except ValueError as exc:
            return [f"payload is not JSON: {exc}"]
        return [f"{'/'.join(map(str, e.absolute_path)) or '(root)'}: {e.message}"
                for e in sorted(validator.iter_errors(doc), key=lambda e: list(e.absolute_path))][:20]

    return check


def _avro_checker(resolved: ResolvedSchema) -> Callable[[bytes, str], list[str]]:
    import fastavro
    from fastavro.validation import validate

    parsed = fastavro.parse_schema(json.loads(resolved.schema_text))

    def check(payload: bytes, content_type: str) -> list[str]:
        if "json" in content_type:
            try:
                datum: Any = json.loads(payload)
                validate(datum, parsed, raise_errors=True)
            except Exception as exc:
                return [f"payload does not match the Avro schema: {exc}"]
            return []
        try:
            fastavro.schemaless_reader(io.BytesIO(payload), parsed)
        except Exception as exc:
            return [f"payload is not binary Avro of this schema: {exc}"]
        return []

    return check

"""Canonical forms and the SHA-256 schema hash (``sha256:<hex>``).

Why canonicalize: the hash identifies a schema across re-registrations, git checkouts and
the envelope's ``SchemaContext.schema_hash``, so formatting and comments must not change
it while anything a reader depends on must.

- Protobuf: the compiled FileDescriptorProtos of the schema's own files (no source info,
  so comments and whitespace vanish), serialized deterministically.
- Avro / JSON Schema: the parsed JSON re-serialized with sorted keys and no whitespace.
  (Avro's Parsing Canonical Form is NOT used: it drops ``default`` and ``aliases``, which
  decide compatibility — two schemas differing only in a default must hash differently.)
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping

from .model import SchemaFormat, schema_json


def canonical_bytes(fmt: SchemaFormat | str, text: str, imports: Mapping[str, str] | None = None) -> bytes:
    """``imports`` (protobuf only): the texts of referenced files by import path, so a schema
    with Confluent references compiles; without imports the result is what it always was."""
    fmt = SchemaFormat.parse(fmt)
    if fmt is SchemaFormat.PROTOBUF:
        from google.protobuf import descriptor_pb2

        from .protoparse import compile_proto

        schema = compile_proto(text, imports=imports)
        fds = descriptor_pb2.FileDescriptorSet()
        for f in schema.user_files():
            fds.file.add().CopyFrom(f)
        return fds.SerializeToString(deterministic=True)
    parsed = schema_json(text, "schema")
    return json.dumps(parsed, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def schema_hash(fmt: SchemaFormat | str, text: str, imports: Mapping[str, str] | None = None,
                suffix: bytes = b"") -> str:
    """``sha256:<64 hex>`` of the canonical form (plus ``suffix``: the registry appends the
    schema's references, which are part of its identity; empty for a plain schema)."""
    return "sha256:" + hashlib.sha256(canonical_bytes(fmt, text, imports) + suffix).hexdigest()

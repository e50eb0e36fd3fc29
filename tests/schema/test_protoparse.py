"""protoc wrapper and the wire walker."""

from __future__ import annotations

import pytest

from app.schema.canonical import schema_hash
from app.schema.model import SchemaError
from app.schema.protoparse import compile_proto, iter_wire


def test_imports_nested_and_error_messages() -> None:
    s = compile_proto('syntax="proto3"; package a; import "b/c.proto"; import "google/protobuf/timestamp.proto";'
                      ' message M { b.C c = 1; google.protobuf.Timestamp at = 2; message N { int32 x = 1; } N n = 3; }',
                      imports={"b/c.proto": 'syntax="proto3"; package b; message C { string s = 1; }'})
    assert [f.name for f in s.user_files()] == ["b/c.proto", "schema.proto"]
    assert s.main.message_type[0].nested_type[0].name == "N"
    with pytest.raises(SchemaError, match=r"schema.proto:1:.*not found|Import .* was not found|File not found"):
        compile_proto('syntax="proto3"; import "missing.proto"; message M {}')


def test_hash_ignores_comments_and_whitespace_but_not_content() -> None:
    a = 'syntax = "proto3";\nmessage M { string a = 1; }'
    b = '// doc\nsyntax="proto3";   message M {\n  string a = 1; // why\n}\n'
    assert schema_hash("PROTOBUF", a) == schema_hash("PROTOBUF", b)
    assert schema_hash("PROTOBUF", a) != schema_hash("PROTOBUF", a.replace("a = 1", "a = 2"))
    assert schema_hash("AVRO", '{"type": "string"}') == schema_hash("AVRO", '{"type":"string"}')
    x = '{"type":"record","name":"R","fields":[{"name":"a","type":"int","default":1}]}'
    assert schema_hash("AVRO", x) != schema_hash("AVRO", x.replace('"default":1', '"default":2'))


def test_iter_wire_all_types() -> None:
    data = bytes([0x08, 0x96, 0x01, 0x11]) + (1).to_bytes(8, "little") + bytes([0x1A, 0x02]) + b"hi" + \
        bytes([0x25]) + (7).to_bytes(4, "little") + bytes([0x2B, 0x08, 0x01, 0x2C])
    got = [(n, wt, bytes(v) if isinstance(v, memoryview) else v) for n, wt, v in iter_wire(data)]
    assert got == [(1, 0, 150), (2, 1, 1), (3, 2, b"hi"), (4, 5, 7), (5, 3, 0)]
    with pytest.raises(ValueError):
        list(iter_wire(bytes([0x1A, 0x05, 0x00])))

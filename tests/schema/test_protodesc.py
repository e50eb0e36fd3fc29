"""Confluent's serialized protobuf form <-> .proto text (app/schema/protodesc.py): every
construct protoc can put in a descriptor we render must recompile to the same descriptor."""

from __future__ import annotations

import base64

import pytest
from google.protobuf import descriptor_pb2

from app.schema.model import SchemaError
from app.schema.protodesc import parse_serialized, render_proto, same_schema, serialize
from app.schema.protoparse import compile_proto

PROTO3 = '''syntax = "proto3";
package orders.v1;
import "google/protobuf/timestamp.proto";
import "prism/annotations.proto";
option java_package = "com.acme";
option optimize_for = SPEED;
message OrderCreated {
  string order_id = 1 [(prism.index) = "primary"];
  double total = 3 [deprecated = true];
  optional double tax = 4;
  message Early { int32 x = 1; }
  map<string, int64> counts = 5;
  repeated Item items = 6 [packed = false];
  oneof pay { string card = 7; int64 account = 8; }
  google.protobuf.Timestamp at = 9 [json_name = "when"];
  string email = 10 [(prism.pii) = "email", (prism.encrypt) = "aes256"];
  enum Kind { option allow_alias = true; KIND_UNSPECIFIED = 0; KIND_A = 1; KIND_ALIAS = 1; reserved 5 to 9, 20 to max; reserved "OLD"; }
  Kind kind = 11;
  map<int32, Item> by_id = 12;
  reserved 2, 20 to max;
  reserved "old";
  message Item { bytes sku = 1; string name_with_quote = 2 [json_name = "q\\"x"]; }
}
service S { rpc Get (OrderCreated) returns (stream OrderCreated); rpc Put (stream OrderCreated) returns (OrderCreated) { option deprecated = true; } }
'''
PROTO2 = '''syntax = "proto2";
package x;
message M {
  required int32 a = 1;
  optional string b = 2 [default = "h\\"i\\n"];
  optional bytes c = 3 [default = "\\001x"];
  optional E e = 4 [default = B];
  optional double d = 5 [default = inf];
  repeated int32 r = 6 [packed = true];
  oneof o { int32 p = 7; string q = 8; }
  extensions 100 to 199, 1000 to max;
  extend M { optional int32 nested_ext = 150; }
}
enum E { A = 1; B = 2; }
extend M { optional int32 ext = 100; }
'''


@pytest.mark.parametrize("src", [PROTO3, PROTO2], ids=["proto3", "proto2"])
def test_round_trip_recompiles_to_the_same_descriptor(src: str) -> None:
    original = compile_proto(src).main
    fdp = parse_serialized(serialize(original))
    assert fdp is not None
    rendered = render_proto(fdp)
    again = compile_proto(rendered).main
    assert same_schema(original, again), rendered
    # nested type order is kept (Confluent's message indexes count nested types)
    assert [n.name for n in again.message_type[0].nested_type] == [n.name for n in original.message_type[0].nested_type]


def test_prism_annotations_survive_as_options() -> None:
    text = render_proto(compile_proto(PROTO3).main)
    assert '(prism.pii) = "email"' in text and '(prism.index) = "primary"' in text


def test_plain_text_and_non_descriptors_are_not_serialized_form() -> None:
    assert parse_serialized(PROTO3) is None
    assert parse_serialized("") is None
    assert parse_serialized("aGVsbG8=") is None  # base64 of b"hello": not a descriptor
    assert parse_serialized(base64.b64encode(b"\xff" * 12).decode()) is None
    empty = descriptor_pb2.FileDescriptorProto(name="e.proto", package="p")
    assert parse_serialized(base64.b64encode(empty.SerializeToString()).decode()) is None


def test_unknown_custom_option_and_editions_are_refused_not_dropped() -> None:
    fdp = compile_proto('syntax = "proto3";\nmessage M { string a = 1; }\n').main
    opts = fdp.message_type[0].field[0].options
    # field 60000, wire type 2 (length-delimited), value "x": an option this registry cannot name
    tag, raw = (60000 << 3) | 2, bytearray()
    while tag > 0x7F:
        raw.append((tag & 0x7F) | 0x80)
        tag >>= 7
    opts.MergeFromString(bytes([*raw, tag, 1]) + b"x")
    with pytest.raises(SchemaError, match="custom field option number 60000"):
        render_proto(fdp)
    ed = descriptor_pb2.FileDescriptorProto(name="e.proto", syntax="editions")
    ed.message_type.add(name="M")
    with pytest.raises(SchemaError, match="editions"):
        render_proto(ed)

"""What the protobuf runtime really does with a repeated <-> singular change - the data loss
that makes FIELD_CARDINALITY_CHANGED breaking in both directions (docs/schema-registry.md)."""

from __future__ import annotations

from google.protobuf import descriptor_pool, message_factory

from app.schema.compat import check
from app.schema.protoparse import compile_proto

REPEATED = ('syntax = "proto3"; package t; message M { repeated int32 ids = 1; repeated string tags = 2; '
            'message Item { int32 a = 1; int32 b = 2; } repeated Item items = 3; }')
SINGULAR = ('syntax = "proto3"; package t; message M { int32 ids = 1; string tags = 2; '
            'message Item { int32 a = 1; int32 b = 2; } Item items = 3; }')


def _cls(text: str) -> type:
    pool = descriptor_pool.DescriptorPool()
    for fd in compile_proto(text).fds.file:
        pool.Add(fd)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("t.M"))


def test_a_singular_reader_loses_repeated_data() -> None:
    rep, sing = _cls(REPEATED), _cls(SINGULAR)
    data = rep(ids=[1, 2, 3], tags=["a", "b"], items=[rep.Item(a=1), rep.Item(b=2)]).SerializeToString()
    read = sing.FromString(data)
    assert read.ids == 0  # packed numbers: not readable as one value, dropped
    assert read.tags == "b"  # strings: only the last element survives
    assert (read.items.a, read.items.b) == (1, 2)  # messages: the elements merge into one
    # ...and the checker calls every one of these changes breaking, in both directions
    for mode in ("BACKWARD", "FORWARD"):
        result = check("PROTOBUF", SINGULAR, [REPEATED], mode)
        assert {f.path for f in result.breaking if f.rule == "FIELD_CARDINALITY_CHANGED"} == {
            "M.ids", "M.tags", "M.items"}, mode
        result = check("PROTOBUF", REPEATED, [SINGULAR], mode)
        assert not result.is_compatible, mode

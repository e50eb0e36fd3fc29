"""The protobuf JSON fast path of app/schema/payload_check.py: for every document, the validator
says exactly what `json_format.Parse` says - no violation when Parse accepts, and Parse's own
error text when it does not - whether the fast check, the shared decode or Parse itself decided.
Documents are generated around the schema (right and wrong types, out-of-range numbers, unknown
and repeated keys, null, both spellings of a field name, surrogates, deep nesting) and as raw
hostile bytes."""

from __future__ import annotations

import json

import pytest
from google.protobuf import descriptor_pool, json_format, message_factory
from hypothesis import given, settings
from hypothesis import strategies as st

from app.schema import payload_check
from app.schema.payload_check import validator_for
from app.schema.protoparse import compile_proto
from app.schema.resolve import build_resolved

PROTO = """syntax = "proto3";
package fast;
message Item { string sku = 1; int32 qty = 2; repeated Item parts = 3; }
message Order {
  string order_id = 1;
  string customer_id = 2;
  repeated Item items = 3;
  double total = 4;
  float weight = 5;
  int64 big = 6;
  uint32 small = 7;
  bool gift = 8;
  optional double tax_amount = 9;
  repeated string tags = 10;
  uint64 huge = 11;
  sint32 delta = 12;
}
"""
#: enums, maps and well-known types: the fast check stands aside, Parse decides every payload
OTHER = """syntax = "proto3";
package other;
import "google/protobuf/timestamp.proto";
enum Kind { KIND_UNSPECIFIED = 0; KIND_A = 1; }
message Doc { string id = 1; Kind kind = 2; map<string, int32> counts = 3;
              google.protobuf.Timestamp at = 4; bytes blob = 5; oneof pick { string a = 6; int32 b = 7; } }
"""

KEYS = ["order_id", "orderId", "customer_id", "customerId", "items", "total", "weight", "big", "small", "gift",
        "tax_amount", "taxAmount", "tags", "huge", "delta", "unknown", "_tax_amount", "sku", "qty", "parts",
        "id", "kind", "counts", "at", "blob", "a", "b"]
NUMBERS = st.one_of(
    st.integers(-2**70, 2**70), st.sampled_from([0, -1, 2**31 - 1, 2**31, -2**31, -2**31 - 1, 2**32 - 1, 2**32,
                                                 2**63 - 1, 2**63, 2**64 - 1, 2**64, -2**63, -2**63 - 1]),
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([2.0, 3.5, 1e39, -1e39, 3.4e38, 1e308]))
SCALARS = st.one_of(st.none(), st.booleans(), NUMBERS, st.text(max_size=6),
                    st.sampled_from(["\ud800", "a\udfffb", "KIND_A", "1", " 1", "NaN", "Infinity", "AAEC",
                                     "2024-01-01T00:00:00Z"]))
VALUES = st.recursive(SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=4),
    st.dictionaries(st.sampled_from(KEYS), inner, max_size=5)), max_leaves=20)
DOCS = st.dictionaries(st.sampled_from(KEYS), VALUES, max_size=8)


def _near(lo: int, hi: int) -> st.SearchStrategy[int]:
    """Integers in range, mostly, and just past either end now and then."""
    return st.one_of(st.integers(lo, hi), st.sampled_from([lo, hi, lo - 1, hi + 1]))


ITEM = st.deferred(lambda: st.fixed_dictionaries({}, optional={
    "sku": st.text(max_size=5), "qty": _near(-2**31, 2**31 - 1), "parts": st.lists(ITEM, max_size=2)}))
#: well-typed orders (boundaries included): what the fast path is for
ORDERS = st.fixed_dictionaries({}, optional={
    "order_id": st.text(max_size=8), "customerId": st.text(max_size=4), "items": st.lists(ITEM, max_size=3),
    "total": st.one_of(st.floats(allow_nan=False, allow_infinity=False), st.integers(-2**64, 2**64)),
    "weight": st.one_of(st.floats(-4e38, 4e38), st.integers(-10, 10)), "big": _near(-2**63, 2**63 - 1),
    "small": _near(0, 2**32 - 1), "gift": st.booleans(), "tax_amount": st.floats(allow_nan=False),
    "tags": st.lists(st.text(max_size=3), max_size=3), "huge": _near(0, 2**64 - 1), "delta": _near(-2**31, 2**31 - 1)})


def _reference(text: str) -> type:
    """The schema's message class built as the validator builds it, for calling Parse directly."""
    schema = compile_proto(text)
    pool = descriptor_pool.DescriptorPool()
    for fd in schema.fds.file:
        pool.Add(fd)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(_root(text)))


def _root(text: str) -> str:
    return "fast.Order" if "package fast" in text else "other.Doc"


def _expect(cls: type, payload: bytes) -> list[str]:
    try:
        json_format.Parse(payload, cls())
    except Exception as exc:
        return [f"not a valid {cls.DESCRIPTOR.full_name} in JSON: {exc}"]
    return []


def _check(text: str, payload: bytes) -> None:
    v = validator_for(build_resolved(text, "protobuf", url="u", version="v1", message=_root(text)))
    got = [x.message for x in v(payload, "application/json")]
    assert got == _expect(_reference(text), payload), payload


@settings(max_examples=600, deadline=None)
@given(DOCS)
def test_the_validator_says_what_parse_says(doc: dict) -> None:
    payload = json.dumps(doc).encode()  # NaN/Infinity too: Python's json writes and reads them
    _check(PROTO, payload)
    _check(OTHER, payload)


@settings(max_examples=600, deadline=None)
@given(ORDERS)
def test_well_typed_orders_get_parses_answer(doc: dict) -> None:
    _check(PROTO, json.dumps(doc).encode())


@settings(max_examples=200, deadline=None)
@given(st.one_of(st.binary(max_size=64), st.text(max_size=64).map(str.encode),
                 DOCS.map(lambda d: json.dumps(d).encode()[:-1])))  # truncated: not JSON
def test_hostile_bytes_get_parses_answer(payload: bytes) -> None:
    _check(PROTO, payload)


def test_valid_documents_take_the_fast_path_and_invalid_ones_parse(monkeypatch: pytest.MonkeyPatch) -> None:
    v = validator_for(build_resolved(PROTO, "protobuf", url="u", version="v2", message="fast.Order"))
    good = {"orderId": "o-1", "customer_id": "c", "items": [{"sku": "s", "qty": 2, "parts": [{"sku": "p"}]}],
            "total": 12.5, "weight": 1, "big": -2**63, "small": 2**32 - 1, "gift": True, "taxAmount": 0.5,
            "tags": ["a", "b"], "huge": 2**64 - 1, "delta": -5}
    calls: list[object] = []
    monkeypatch.setattr(payload_check, "_parse_dict", lambda *a: calls.append(a))
    assert v(json.dumps(good).encode(), "application/json") == [] and calls == []  # decided without Parse
    (top,) = v(json.dumps({**good, "unknown": 1}).encode(), "application/json")
    assert calls == []  # an unknown top-level key after fitting ones: Parse's error, worded here
    assert top.message == _expect(_reference(PROTO), json.dumps({**good, "unknown": 1}).encode())[0]
    v(json.dumps({**good, "items": [{"sku": "s", "colour": "red"}]}).encode(), "application/json")
    assert len(calls) == 1  # one level down the fast check declines; Parse's second half runs on the same decode


def test_the_same_field_under_both_names_is_left_to_parse() -> None:
    _check(PROTO, b'{"order_id": "a", "orderId": "b"}')
    _check(PROTO, b'{"order_id": "a", "order_id": "b"}')  # a duplicate key: Parse's load error
    _check(PROTO, b'{"items": [{"parts": ' * 40 + b"{}" + b"]}" * 40 + b"}")  # nested past the fast depth
    _check(PROTO, b"[1, 2]")
    _check(PROTO, b"\xff\xfe")

"""Payload validation (app/schema/payload_check.py): every format reports the failing field's
JSONPath (`$.items[2].price`), and a validator is compiled once per schema id."""

from __future__ import annotations

import json

import pytest

from app.schema import payload_check
from app.schema.payload_check import json_path, validator_for
from app.schema.resolve import build_resolved

JSON_SCHEMA = json.dumps({"title": "Order", "type": "object", "required": ["order_id"],
                          "properties": {"order_id": {"type": "string"},
                                         "items": {"type": "array", "items": {
                                             "type": "object", "properties": {"price": {"type": "number"}}}}}})
AVRO = json.dumps({"type": "record", "name": "Order", "namespace": "shop", "fields": [
    {"name": "order_id", "type": "string"},
    {"name": "items", "type": {"type": "array", "items": {"type": "record", "name": "Item",
                                                          "fields": [{"name": "price", "type": "double"}]}}},
    {"name": "extras", "type": {"type": "map", "values": "Item"}, "default": {}}]})
PROTO = 'syntax = "proto3";\npackage shop;\nmessage Order { string order_id = 1; repeated double prices = 2; }\n'
BAD_ITEMS = {"order_id": "o-1", "items": [{"price": 1}, {"price": 2.5}, {"price": "free"}]}


def test_json_path_rendering():
    assert json_path(["items", 2, "price"]) == "$.items[2].price"
    assert json_path([]) == "$"
    assert json_path(["a b", 0]) == '$["a b"][0]'


def test_json_schema_names_the_field():
    v = validator_for(build_resolved(JSON_SCHEMA, "json", url="u", version="v1"))
    assert v(json.dumps({"order_id": "o-1", "items": [{"price": 3}]}).encode(), "application/json") == []
    (bad,) = v(json.dumps(BAD_ITEMS).encode(), "application/json")
    assert bad.path == "$.items[2].price" and "number" in bad.message
    assert bad.rule == 'type: "number"' and "free" not in bad.rule  # the rule never quotes the value
    missing = v(b'{"items": []}', "application/json")
    assert [m.path for m in missing] == ["$"] and "order_id" in missing[0].message
    assert v(b"{not json", "application/json")[0].path == "$"


def test_avro_json_datum_names_the_position_not_the_schema_field():
    v = validator_for(build_resolved(AVRO, "avro", url="u", version="v3"))
    assert v(json.dumps({"order_id": "o", "items": [], "extras": {}}).encode(), "application/json") == []
    (bad,) = v(json.dumps({**BAD_ITEMS, "extras": {}}).encode(), "application/json")
    assert bad.path == "$.items[2].price"
    (bad,) = v(json.dumps({"order_id": "o", "items": [], "extras": {"gift": {"price": None}}}).encode(),
               "application/json")
    assert bad.path == "$.extras.gift.price"
    assert v(b"\x02", "application/avro")[0].path == "$"  # binary: fastavro's reader gives no position


def test_avro_recursive_type_names_the_position_and_never_raises():
    """A bad value under a recursive type: fastavro cannot validate the bare name alone
    (`UnknownType` escaped untyped); the position is found through the schema's named types."""
    node = json.dumps({"type": "record", "name": "Node", "namespace": "ll", "fields": [
        {"name": "v", "type": "int"}, {"name": "next", "type": ["null", "Node"], "default": None}]})
    v = validator_for(build_resolved(node, "avro", url="u", version="v9"))
    assert v(b'{"v": 1, "next": {"v": 2, "next": null}}', "application/json") == []
    (bad,) = v(b'{"v": 1, "next": {"v": "x"}}', "application/json")
    assert bad.path == "$.next.v"
    (bad,) = v(b'{"v": 1, "next": {"v": 2, "next": {"v": 3, "next": "no"}}}', "application/json")
    assert bad.path == "$.next.next.next"


def test_protobuf_wire_and_json():
    r = build_resolved(PROTO, "protobuf", url="u", version="v1")
    v = validator_for(r)
    assert v(b"\x0a\x03o-1", "application/protobuf") == []
    (bad,) = v(b"\x0a\x05o", "application/protobuf")  # length runs past the end
    assert bad.path == "$" and "shop.Order" in bad.message
    (bad,) = v(b'{"orderId": "x", "prices": ["cheap"]}', "application/json")
    assert "prices" in bad.message


def test_validators_are_compiled_once_per_schema_id(monkeypatch):
    r = build_resolved(JSON_SCHEMA, "json", url="u", version="v1")
    built: list[str] = []
    real = payload_check._build
    monkeypatch.setattr(payload_check, "_build", lambda res: built.append(res.hash) or real(res))
    payload_check._CACHE.clear()
    first = validator_for(r)
    again = validator_for(build_resolved(JSON_SCHEMA, "json", url="elsewhere", version="v9"))  # same content
    assert first is again and built == [r.hash]


def test_unknown_format_is_refused():
    with pytest.raises(ValueError):
        payload_check._build(type("R", (), {"format": type("F", (), {"value": "xml"})()})())  # type: ignore[arg-type]

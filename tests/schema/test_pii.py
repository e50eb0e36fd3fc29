"""PII detection, annotation reading (all three formats), policy and audit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.schema.pii import PiiPolicy, audit, check_policy, detect_category, pii_fields, scan


@pytest.mark.parametrize(("name", "category"), [
    ("email", "email"), ("emailAddress", "email"), ("contact_email", "email"), ("phone", "phone"),
    ("mobileNumber", "phone"), ("name", "name"), ("full_name", "name"), ("firstName", "name"),
    ("ssn", "ssn"), ("passport_number", "ssn"), ("billing_address", "address"), ("zip", "address"),
    ("ip", "ip"), ("client_ip", "ip"), ("ip_address", "ip"), ("date_of_birth", "dob"), ("iban", "payment"),
    ("file_name", None), ("hostname", None), ("topic_name", None), ("username", None), ("product_name", None),
    ("mac_address", None), ("shipping_method", None), ("zipper_count", None), ("tip", None), ("order_id", None),
])
def test_detect_category(name: str, category: str | None) -> None:
    assert detect_category(name) == category


def test_json_and_avro_tags() -> None:
    js = '{"type":"object","properties":{"email":{"type":"string","x-prism-pii":"email"},' \
         '"name":{"type":"string"},"sku":{"type":"string"},"addr":{"type":"object","properties":' \
         '{"street":{"type":"string","x-prism-pii":"address","x-prism-encrypt":"aes256"}}}}}'
    rep = scan("JSON", js)
    assert [f.path for f in rep.untagged] == ["name"]
    assert pii_fields("JSON", js) == ["addr.street", "email", "name"]
    av = '{"type":"record","name":"User","fields":[{"name":"email","type":"string","prism.pii":"email"},' \
         '{"name":"name","type":"string","prism.pii":"none"},{"name":"phone","type":["null","string"]}]}'
    assert [f.path for f in scan("AVRO", av).untagged] == ["User.phone"]
    assert pii_fields("AVRO", av) == ["User.email", "User.phone"]  # "none" opts out


def test_policy_levels_and_index_warning() -> None:
    proto = 'syntax="proto3"; import "prism/annotations.proto"; message U { string email = 1 ' \
            '[(prism.pii)="email", (prism.index)="secondary"]; string phone = 2; }'
    enforce = check_policy("PROTOBUF", proto, PiiPolicy.ENFORCE)
    assert [(f.severity.value, f.rule) for f in enforce] == [("breaking", "PII_UNTAGGED"), ("warning", "PII_INDEXED")]
    assert next(f.severity.value for f in check_policy("PROTOBUF", proto, "warn")) == "warning"
    assert check_policy("PROTOBUF", proto, "off") == []


def test_comment_is_not_a_tag() -> None:
    proto = 'syntax="proto3"; message U { string email = 1; // @prism.pii(type="email")\n }'
    assert [f.path for f in scan("PROTOBUF", proto).untagged] == ["U.email"]


def test_audit_reports_unparsable_schemas() -> None:
    entries = audit([("ok", "JSON", '{"properties":{"sku":{}}}'), ("broken", "PROTOBUF", "message {")])
    assert entries[0].ok and not entries[1].ok and "unparsable" in entries[1].label


def test_packaged_annotations_match_proto_tree() -> None:
    root = Path(__file__).resolve().parents[2]
    assert (root / "app/schema/proto/prism/annotations.proto").read_text() == \
        (root / "proto/prism/annotations.proto").read_text()


# --- PiiValueFinder: the running worker's view of a payload's PII values

def test_value_finder_walks_json_by_field_name_including_nested_pii_objects() -> None:
    from app.schema.pii import PiiValueFinder

    f = PiiValueFinder(["OrderCreated.customer_email", "shipping", "items[].holder_name"])
    doc = {"customer_email": "alice@example.invalid", "order_id": "o-1", "total": 12345,
           "shipping": {"street": "1 Long Road", "zip": 90210, "flag": True},
           "items": [{"sku": "s-1", "holder_name": "Alice Smith"}, {"holder_name": "Bob Jones"}]}
    assert sorted(f.values(json.dumps(doc).encode(), "application/json")) == sorted(
        ["alice@example.invalid", "1 Long Road", "90210", "Alice Smith", "Bob Jones"])
    assert f.values(b"not json", "application/json") == [] and f.values(b"", "") == []
    assert not PiiValueFinder([]) and PiiValueFinder([]).values(b'{"email": "x@y.z"}') == []


def test_value_finder_is_bounded_on_hostile_payloads() -> None:
    from app.schema.pii import PiiValueFinder

    f = PiiValueFinder(["email"], max_nodes=100)
    wide = json.dumps({"email": [f"v{i:04d}@x.y" for i in range(10_000)]}).encode()
    assert 0 < len(f.values(wide, "application/json")) < 100
    deep = ("[" * 5000 + "]" * 5000).encode()  # RecursionError in json is caught
    assert f.values(b'{"email": ' + deep + b"}", "application/json") == []


def test_value_finder_reads_protobuf_payloads_with_the_schema_class() -> None:
    from google.protobuf import descriptor_pool, message_factory

    from app.schema.pii import PiiValueFinder
    from app.schema.protoparse import compile_proto

    root = Path(__file__).resolve().parents[2]
    text = (root / "topologies/schemas/order_created.proto").read_text()
    name = "prism.examples.orders.OrderCreated"
    f = PiiValueFinder(pii_fields("PROTOBUF", text), schema_format="PROTOBUF", schema_text=text, message_name=name)
    pool = descriptor_pool.DescriptorPool()
    for fd in compile_proto(text).fds.file:
        pool.Add(fd)
    cls = message_factory.GetMessageClass(pool.FindMessageTypeByName(name))
    payload = cls(order_id="o-9", customer_email="carol@example.invalid").SerializeToString()
    assert f.values(payload, "application/protobuf") == ["carol@example.invalid"]
    assert f.values(b"\xff\xff\xff", "application/protobuf") == []  # not this message: nothing, no raise

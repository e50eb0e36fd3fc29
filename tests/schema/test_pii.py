"""PII detection, annotation reading (all three formats), policy and audit."""

from __future__ import annotations

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

"""Confluent schema references, driven by confluent-kafka's own SchemaRegistryClient,
Schema and SchemaReference (protobuf) and by raw REST (JSON Schema, Avro), against a real
uvicorn server on SQLite and PostgreSQL (the ``live_server`` fixture runs both)."""

from __future__ import annotations

import json

import httpx
import pytest
from confluent_kafka.schema_registry import Schema, SchemaReference, SchemaRegistryClient
from confluent_kafka.schema_registry.error import SchemaRegistryError

from app.schema.store import SqliteStore
from tests.support import creds

MONEY = 'syntax = "proto3";\npackage common;\nmessage Money {\n  string currency = 1;\n  int64 units = 2;\n}\n'
MONEY_V2 = MONEY.replace("int64 units = 2;", "int64 units = 2;\n  optional int32 nanos = 3;")
MONEY_BROKEN = MONEY.replace("int64 units = 2;", "string units = 2;")  # varint -> length-delimited
ORDER = ('syntax = "proto3";\npackage orders.v1;\nimport "common/money.proto";\n'
         'message Order {\n  string order_id = 1;\n  common.Money total = 2;\n}\n')
CT = "application/vnd.schemaregistry.v1+json"


def _ref(subject: str, version: int) -> SchemaReference:
    return SchemaReference(name="common/money.proto", subject=subject, version=version)


def test_protobuf_import_reference_with_confluent_client(live_server) -> None:  # type: ignore[no-untyped-def]
    client = SchemaRegistryClient(live_server.sr_conf())
    money_id = client.register_schema("money", Schema(MONEY, "PROTOBUF"))

    # Without the reference protoc cannot find the import: Confluent's 42201.
    with pytest.raises(SchemaRegistryError) as missing:
        client.register_schema("orders-value", Schema(ORDER, "PROTOBUF"))
    assert missing.value.http_status_code == 422 and missing.value.error_code == 42201
    # A reference to something not registered: also 42201.
    with pytest.raises(SchemaRegistryError) as unknown:
        client.register_schema("orders-value", Schema(ORDER, "PROTOBUF", [_ref("money", 9)]))
    assert unknown.value.error_code == 42201 and "not found" in unknown.value.error_message

    order_id = client.register_schema("orders-value", Schema(ORDER, "PROTOBUF", [_ref("money", 1)]))
    assert order_id not in (money_id,)
    again = SchemaRegistryClient(live_server.sr_conf())  # no client cache: idempotent on the server
    assert again.register_schema("orders-value", Schema(ORDER, "PROTOBUF", [_ref("money", 1)])) == order_id

    fresh = SchemaRegistryClient(live_server.sr_conf())
    got = fresh.get_schema(order_id)
    assert got.schema_type == "PROTOBUF" and "import \"common/money.proto\"" in got.schema_str
    assert [(r.name, r.subject, r.version) for r in got.references] == [("common/money.proto", "money", 1)]
    latest = fresh.get_latest_version("orders-value")
    assert latest.schema_id == order_id
    assert [(r.name, r.subject, r.version) for r in latest.schema.references] == [("common/money.proto", "money", 1)]
    assert fresh.lookup_schema("orders-value", Schema(ORDER, "PROTOBUF", [_ref("money", 1)])).version == 1

    # Evolution that depends only on the import: order.proto's text never changes.
    assert fresh.register_schema("money", Schema(MONEY_V2, "PROTOBUF")) != money_id  # money v2
    assert fresh.test_compatibility("orders-value", Schema(ORDER, "PROTOBUF", [_ref("money", 2)])) is True
    fresh.register_schema("money-broken", Schema(MONEY_BROKEN, "PROTOBUF"))
    assert fresh.test_compatibility("orders-value", Schema(ORDER, "PROTOBUF", [_ref("money-broken", 1)])) is False
    assert fresh.test_compatibility("orders-value", Schema(ORDER, "PROTOBUF", [_ref("money-broken", 1)]),
                                    version=1) is False
    with pytest.raises(SchemaRegistryError) as incompatible:
        fresh.register_schema("orders-value", Schema(ORDER, "PROTOBUF", [_ref("money-broken", 1)]))
    assert incompatible.value.error_code == 409
    # Same text, different reference: a different schema (new id, version 2).
    order_v2 = fresh.register_schema_full_response("orders-value", Schema(ORDER, "PROTOBUF", [_ref("money", 2)]))
    assert order_v2.schema_id != order_id and order_v2.version == 2

    # The /v1 diff view resolves each side's references too (Money gained `nanos`).
    diff = httpx.get(f"{live_server.url}/v1/subjects/orders-value/diff", params={"from": 1, "to": 2},
                     auth=creds("reader")).json()
    assert diff["is_compatible"] is True and any(f["path"].endswith("nanos") for f in diff["warnings"])

    assert fresh.get_referenced_by("money", 1) == [order_id]
    assert fresh.get_referenced_by("money", 2) == [order_v2.schema_id]
    assert fresh.get_referenced_by("money-broken", 1) == []

    # Deleting a referenced version is refused (Confluent's 42206), soft and permanent.
    with pytest.raises(SchemaRegistryError) as refused:
        fresh.delete_version("money", 1)
    assert refused.value.http_status_code == 422 and refused.value.error_code == 42206
    with pytest.raises(SchemaRegistryError):
        fresh.delete_subject("money")
    # Once the referrer is soft-deleted, the soft delete goes through; permanent still refused
    # while the referrer's row exists (its id must stay resolvable).
    fresh.delete_version("orders-value", 1)
    assert fresh.get_referenced_by("money", 1) == []
    assert fresh.delete_version("money", 1) == 1
    with pytest.raises(SchemaRegistryError) as still:
        fresh.delete_version("money", 1, permanent=True)
    assert still.value.error_code == 42206
    assert SchemaRegistryClient(live_server.sr_conf()).get_schema(order_id).references[0].version == 1


ADDRESS_JSON = json.dumps({"type": "object", "properties": {"street": {"type": "string"}},
                           "required": ["street"], "$defs": {"zip": {"type": "string"}}})
ADDRESS_JSON_NARROW = json.dumps({"type": "object", "properties": {"street": {"type": "integer"}},
                                  "required": ["street"]})
CUSTOMER_JSON = json.dumps({"type": "object", "properties": {"name": {"type": "string"},
                                                             "address": {"$ref": "address.json"}}})


def test_json_schema_ref_reference(live_server) -> None:  # type: ignore[no-untyped-def]
    with httpx.Client(base_url=live_server.url, headers={"Content-Type": CT}, auth=creds("admin")) as h:
        assert h.post("/subjects/address/versions", json={"schema": ADDRESS_JSON, "schemaType": "JSON"}
                      ).status_code == 200
        ref = {"name": "address.json", "subject": "address", "version": 1}
        r = h.post("/subjects/customer/versions", json={"schema": CUSTOMER_JSON, "schemaType": "JSON",
                                                        "references": [ref]})
        assert r.status_code == 200, r.text
        cid = r.json()["id"]
        assert h.get(f"/schemas/ids/{cid}").json()["references"] == [ref]
        assert h.get("/subjects/customer/versions/1").json()["references"] == [ref]
        bad = h.post("/subjects/customer/versions", json={"schema": CUSTOMER_JSON, "schemaType": "JSON",
                                                          "references": [{**ref, "subject": "nope"}]})
        assert bad.status_code == 422 and bad.json()["error_code"] == 42201
        # The referenced definition decides compatibility: street string -> integer breaks BACKWARD.
        h.post("/subjects/address-narrow/versions", json={"schema": ADDRESS_JSON_NARROW, "schemaType": "JSON"})
        narrow = {"name": "address.json", "subject": "address-narrow", "version": 1}
        res = h.post("/compatibility/subjects/customer/versions/latest?verbose=true",
                     json={"schema": CUSTOMER_JSON, "schemaType": "JSON", "references": [narrow]}).json()
        assert res["is_compatible"] is False and any("street" in m for m in res["messages"])
        same = h.post("/compatibility/subjects/customer/versions/latest",
                      json={"schema": CUSTOMER_JSON, "schemaType": "JSON", "references": [ref]}).json()
        assert same["is_compatible"] is True
        assert h.get("/subjects/address/versions/1/referencedby").json() == [cid]


ADDRESS_AVRO = json.dumps({"type": "record", "name": "Address", "namespace": "com.acme",
                           "fields": [{"name": "street", "type": "string"}]})
ADDRESS_AVRO_INT = ADDRESS_AVRO.replace('"string"', '"int"')
CUSTOMER_AVRO = json.dumps({"type": "record", "name": "Customer", "namespace": "com.acme.crm",
                            "fields": [{"name": "name", "type": "string"},
                                       {"name": "home", "type": "com.acme.Address"},
                                       {"name": "work", "type": ["null", "com.acme.Address"], "default": None}]})


def test_avro_named_type_reference(live_server) -> None:  # type: ignore[no-untyped-def]
    with httpx.Client(base_url=live_server.url, headers={"Content-Type": CT}, auth=creds("admin")) as h:
        h.post("/subjects/address-avro/versions", json={"schema": ADDRESS_AVRO})
        # Without the reference the named type is unknown to the parser.
        assert h.post("/subjects/customer-avro/versions", json={"schema": CUSTOMER_AVRO}).json()["error_code"] == 42201
        ref = {"name": "com.acme.Address", "subject": "address-avro", "version": 1}
        r = h.post("/subjects/customer-avro/versions", json={"schema": CUSTOMER_AVRO, "references": [ref]})
        assert r.status_code == 200, r.text
        got = h.get(f"/schemas/ids/{r.json()['id']}").json()
        assert got["schema"] == CUSTOMER_AVRO and got["references"] == [ref] and "schemaType" not in got
        h.post("/subjects/address-avro-int/versions", json={"schema": ADDRESS_AVRO_INT})
        changed = {"name": "com.acme.Address", "subject": "address-avro-int", "version": 1}
        res = h.post("/compatibility/subjects/customer-avro/versions/latest?verbose=true",
                     json={"schema": CUSTOMER_AVRO, "references": [changed]}).json()
        assert res["is_compatible"] is False and any("street" in m for m in res["messages"])
        looked = h.post("/subjects/customer-avro", json={"schema": CUSTOMER_AVRO, "references": [ref]})
        assert looked.json()["version"] == 1
        assert h.post("/subjects/customer-avro", json={"schema": CUSTOMER_AVRO, "references": [changed]}
                      ).json()["error_code"] == 40403


def test_existing_database_gains_references_table(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A registry file written before references existed opens and works (migration on open)."""
    import sqlite3

    path = str(tmp_path / "old.db")
    SqliteStore(path).close()
    with sqlite3.connect(path) as conn:
        conn.execute("DROP TABLE schema_references")
    store = SqliteStore(path)
    try:
        assert store.references(1) == [] and store.referencing("x", 1) == []
    finally:
        store.close()

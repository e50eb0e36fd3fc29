"""The Confluent-compatible REST subset, driven by confluent-kafka's SchemaRegistryClient
(a client no one here wrote) against a real uvicorn server, on SQLite and PostgreSQL."""

from __future__ import annotations

import httpx
import pytest
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.error import SchemaRegistryError

from tests.support import creds

V1 = 'syntax = "proto3";\npackage orders.v1;\nmessage OrderCreated {\n  string order_id = 1;\n  double total = 3;\n}\n'
V2 = V1.replace("double total = 3;", "double total = 3;\n  optional double tax_amount = 4;")
V3_BREAKING = V1.replace("double total = 3;", "double total = 3;\n  string payment_method = 4;")
AVRO_V1 = '{"type":"record","name":"Reading","fields":[{"name":"temperature","type":"int"}]}'
AVRO_V2 = '{"type":"record","name":"Reading","fields":[{"name":"temperature","type":"int"},' \
          '{"name":"unit","type":"string","default":"C"}]}'


def test_confluent_client_register_get_compat(live_server) -> None:  # type: ignore[no-untyped-def]
    client = SchemaRegistryClient(live_server.sr_conf())
    sid = client.register_schema("orders.created-value", Schema(V1, "PROTOBUF"))
    assert isinstance(sid, int) and sid > 0
    # idempotent re-register returns the same id
    assert client.register_schema("orders.created-value", Schema(V1, "PROTOBUF")) == sid

    fresh = SchemaRegistryClient(live_server.sr_conf())  # no cache: really hits the server
    got = fresh.get_schema(sid)
    assert got.schema_type == "PROTOBUF" and "message OrderCreated" in got.schema_str

    assert fresh.test_compatibility("orders.created-value", Schema(V2, "PROTOBUF")) is True
    assert fresh.test_compatibility("orders.created-value", Schema(V3_BREAKING, "PROTOBUF")) is False

    sid2 = fresh.register_schema("orders.created-value", Schema(V2, "PROTOBUF"))
    assert sid2 != sid
    latest = fresh.get_latest_version("orders.created-value")
    assert latest.version == 2 and latest.schema_id == sid2
    assert fresh.get_versions("orders.created-value") == [1, 2]
    assert fresh.get_subjects() == ["orders.created-value"]
    assert fresh.get_version("orders.created-value", 1).schema_id == sid
    found = fresh.lookup_schema("orders.created-value", Schema(V2, "PROTOBUF"))
    assert found.version == 2

    with pytest.raises(SchemaRegistryError) as exc:
        fresh.register_schema("orders.created-value", Schema(V3_BREAKING, "PROTOBUF"))
    assert exc.value.http_status_code == 409 and exc.value.error_code == 409


def test_confluent_client_avro_config_and_errors(live_server) -> None:  # type: ignore[no-untyped-def]
    client = SchemaRegistryClient(live_server.sr_conf())
    sid = client.register_schema("sensor.readings-value", Schema(AVRO_V1, "AVRO"))
    assert client.get_schema(sid).schema_type == "AVRO"
    assert client.get_compatibility() == "BACKWARD"
    client.set_compatibility("sensor.readings-value", "FULL")
    assert client.get_compatibility("sensor.readings-value") == "FULL"
    assert client.test_compatibility("sensor.readings-value", Schema(AVRO_V2, "AVRO")) is True
    narrowed = AVRO_V1.replace('"int"', '"string"')
    assert client.test_compatibility("sensor.readings-value", Schema(narrowed, "AVRO")) is False

    with pytest.raises(SchemaRegistryError) as e1:
        client.get_version("nope-value", 1)
    assert e1.value.error_code == 40401
    with pytest.raises(SchemaRegistryError) as e2:
        client.get_version("sensor.readings-value", 7)
    assert e2.value.error_code == 40402
    with pytest.raises(SchemaRegistryError) as e3:
        SchemaRegistryClient(live_server.sr_conf()).get_schema(9999)
    assert e3.value.error_code == 40403
    with pytest.raises(SchemaRegistryError) as e4:
        client.register_schema("bad-value", Schema('{"type": "record"}', "AVRO"))
    assert e4.value.http_status_code == 422 and e4.value.error_code == 42201


def test_raw_http_content_type_and_delete(live_server) -> None:  # type: ignore[no-untyped-def]
    ct = "application/vnd.schemaregistry.v1+json"
    with httpx.Client(base_url=live_server.url, headers={"Content-Type": ct}, auth=creds("alice")) as h:
        r = h.post("/subjects/t-value/versions", json={"schema": AVRO_V1})
        assert r.status_code == 200 and r.headers["content-type"].startswith(ct)
        assert h.get("/subjects/t-value/versions/latest").json()["version"] == 1
        assert h.get("/config/t-value").json()["error_code"] == 40408
        assert h.get("/config/t-value?defaultToGlobal=true").json() == {"compatibilityLevel": "BACKWARD"}
        assert h.get("/subjects/t-value/versions/abc").json()["error_code"] == 42202
        assert h.put("/config", json={"compatibility": "SIDEWAYS"}).json()["error_code"] == 42203
        # permanent delete needs a soft delete first
        assert h.delete("/subjects/t-value/versions/1?permanent=true").json()["error_code"] == 40407
        assert h.delete("/subjects/t-value/versions/1").json() == 1
        assert h.get("/subjects").json() == []
        assert h.get("/subjects?deleted=true").json() == ["t-value"]
        assert h.delete("/subjects/t-value/versions/1?permanent=true").json() == 1
        spec = h.get("/openapi.json").json()
        assert "/subjects/{subject}/versions" in spec["paths"] and "/v1/schemas" in spec["paths"]
        actions = [(e["actor"], e["action"]) for e in h.get("/v1/audit").json()]
        assert ("alice", "register") in actions and ("alice", "delete.permanent") in actions

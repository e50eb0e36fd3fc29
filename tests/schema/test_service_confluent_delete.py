"""Confluent's soft and permanent deletes and ``?deleted=true`` / ``?deletedOnly=true``, with
confluent-kafka's client and raw HTTP; real uvicorn server, SQLite and PostgreSQL."""

from __future__ import annotations

import httpx
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

from tests.schema.confluent_support import A1, A2
from tests.schema.confluent_support import refused as _code
from tests.support import creds


def test_version_soft_then_permanent(live_server) -> None:  # type: ignore[no-untyped-def]
    c = SchemaRegistryClient(live_server.sr_conf())
    id1 = c.register_schema("d-value", Schema(A1, "AVRO"))
    id2 = c.register_schema("d-value", Schema(A2, "AVRO"))
    assert _code(lambda: c.delete_version("d-value", 1, permanent=True)) == (404, 40407)
    assert c.delete_version("d-value", 1) == 1
    assert _code(lambda: c.delete_version("d-value", 1)) == (404, 40406)
    with httpx.Client(base_url=live_server.url, auth=creds("admin")) as h:
        assert h.get("/subjects/d-value/versions").json() == [2]
        assert h.get("/subjects/d-value/versions?deleted=true").json() == [1, 2]
        assert h.get("/subjects/d-value/versions?deletedOnly=true").json() == [1]
        assert h.get("/subjects/d-value/versions/1").json()["error_code"] == 40402
        assert h.get("/subjects/d-value/versions/1?deleted=true").json()["id"] == id1
        assert h.get("/subjects/d-value/versions/1/schema?deleted=true").text == A1
        assert h.post("/subjects/d-value", json={"schema": A1}).json()["error_code"] == 40403
        assert h.post("/subjects/d-value?deleted=true", json={"schema": A1}).json()["version"] == 1
        assert h.get(f"/schemas/ids/{id1}/versions").json() == []
        assert h.get(f"/schemas/ids/{id1}/versions?deleted=true").json() == [{"subject": "d-value", "version": 1}]
        assert h.get(f"/schemas/ids/{id1}").json()["schema"] == A1  # ids stay readable after a soft delete
    assert c.delete_version("d-value", 1, permanent=True) == 1
    assert _code(lambda: c.delete_version("d-value", 1, permanent=True)) == (404, 40402)
    assert c.get_versions("d-value") == [2] and c.get_latest_version("d-value").schema_id == id2


def test_subject_soft_then_permanent_and_reregister(live_server) -> None:  # type: ignore[no-untyped-def]
    c = SchemaRegistryClient(live_server.sr_conf())
    id1 = c.register_schema("s-value", Schema(A1, "AVRO"))
    c.register_schema("s-value", Schema(A2, "AVRO"))
    assert _code(lambda: c.delete_subject("s-value", permanent=True)) == (404, 40405)
    assert c.delete_subject("s-value") == [1, 2]
    assert _code(lambda: c.delete_subject("s-value")) == (404, 40404)
    assert c.get_subjects() == []
    with httpx.Client(base_url=live_server.url, auth=creds("admin")) as h:
        assert h.get("/subjects?deleted=true").json() == ["s-value"]
        assert h.get("/subjects?deletedOnly=true").json() == ["s-value"]
        assert h.get("/subjects/s-value/versions").json()["error_code"] == 40401
        assert h.get("/subjects/s-value/versions/latest").json()["error_code"] == 40401
        assert h.get("/subjects/s-value/versions/latest?deleted=true").json()["version"] == 2

    # Re-registering a soft-deleted schema: a new version, the same id (Confluent).
    again = SchemaRegistryClient(live_server.sr_conf()).register_schema_full_response("s-value", Schema(A1, "AVRO"))
    assert (again.schema_id, again.version) == (id1, 3)
    with httpx.Client(base_url=live_server.url, auth=creds("admin")) as h:
        assert h.get("/subjects?deletedOnly=true").json() == []
    c.delete_subject("s-value")
    assert c.delete_subject("s-value", permanent=True) == [1, 2, 3]
    assert _code(lambda: c.delete_subject("s-value", permanent=True)) == (404, 40401)
    with httpx.Client(base_url=live_server.url, auth=creds("admin")) as h:
        assert h.get("/subjects?deleted=true").json() == []

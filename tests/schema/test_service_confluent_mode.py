"""Confluent's ``/mode`` through confluent-kafka's SchemaRegistryClient (``get_mode``,
``update_mode``, ``delete_mode``, ``get_global_mode``, ``update_global_mode``) and raw HTTP
for IMPORT with explicit ids; real uvicorn server, SQLite and PostgreSQL."""

from __future__ import annotations

import httpx
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

from tests.schema.confluent_support import A1, A2
from tests.schema.confluent_support import refused as _code
from tests.support import creds

A_BREAKING = '{"type":"record","name":"R","fields":[{"name":"a","type":"string"}]}'


def test_modes_with_the_confluent_client(live_server) -> None:  # type: ignore[no-untyped-def]
    c = SchemaRegistryClient(live_server.sr_conf())
    assert c.get_global_mode() == "READWRITE"
    c.register_schema("m-value", Schema(A1, "AVRO"))
    assert _code(lambda: c.get_mode("m-value")) == (404, 40409)

    # READONLY on the subject: no register, no delete; reads and config changes still work.
    assert c.update_mode("m-value", "READONLY") == "READONLY"
    assert c.get_mode("m-value") == "READONLY"
    assert _code(lambda: c.register_schema("m-value", Schema(A2, "AVRO"))) == (422, 42205)
    assert _code(lambda: c.delete_version("m-value", 1)) == (422, 42205)
    assert _code(lambda: c.delete_subject("m-value")) == (422, 42205)
    assert c.get_latest_version("m-value").version == 1
    c.set_compatibility("m-value", "FULL")
    c.register_schema("other-value", Schema(A1, "AVRO"))  # other subjects follow the global READWRITE

    assert c.delete_mode("m-value") == "READONLY"
    assert _code(lambda: c.delete_mode("m-value")) == (404, 40409)
    assert c.register_schema("m-value", Schema(A2, "AVRO")) > 0

    # Global READONLY covers every subject without a mode of its own; a subject READWRITE escapes it.
    assert c.update_global_mode("READONLY") == "READONLY"
    assert _code(lambda: c.register_schema("new-value", Schema(A1, "AVRO"))) == (422, 42205)
    c.update_mode("new-value", "READWRITE")
    assert c.register_schema("new-value", Schema(A1, "AVRO")) > 0
    # ... but not READONLY_OVERRIDE.
    c.update_global_mode("READONLY_OVERRIDE")
    assert _code(lambda: c.register_schema("new-value", Schema(A2, "AVRO"))) == (422, 42205)
    c.update_global_mode("READWRITE")

    assert _code(lambda: c.update_mode("m-value", "SIDEWAYS")) == (422, 42204)
    assert _code(lambda: c.update_global_mode("")) == (422, 42204)


def test_import_mode_needs_an_empty_subject_or_force(live_server) -> None:  # type: ignore[no-untyped-def]
    c = SchemaRegistryClient(live_server.sr_conf())
    c.register_schema("used-value", Schema(A1, "AVRO"))
    assert _code(lambda: c.update_mode("used-value", "IMPORT")) == (422, 42205)
    assert _code(lambda: c.update_global_mode("IMPORT")) == (422, 42205)
    # soft-deleted versions still count: ids were handed out
    c.delete_subject("used-value")
    assert _code(lambda: c.update_mode("used-value", "IMPORT")) == (422, 42205)
    assert c.update_mode("used-value", "IMPORT", force=True) == "IMPORT"
    assert c.update_mode("fresh-value", "IMPORT") == "IMPORT"
    # IMPORT refuses registrations without an id
    assert _code(lambda: c.register_schema("fresh-value", Schema(A1, "AVRO"))) == (422, 42205)


def test_import_keeps_ids_and_versions(live_server) -> None:  # type: ignore[no-untyped-def]
    with httpx.Client(base_url=live_server.url, auth=creds("admin")) as h:
        # an explicit id outside IMPORT mode is refused
        r = h.post("/subjects/imp-value/versions", json={"schema": A1, "id": 100, "version": 3})
        assert (r.status_code, r.json()["error_code"]) == (422, 42205)
        assert h.put("/mode/imp-value", json={"mode": "IMPORT"}).json() == {"mode": "IMPORT"}
        r = h.post("/subjects/imp-value/versions", json={"schema": A1, "id": 100, "version": 3})
        assert r.status_code == 200 and (r.json()["id"], r.json()["version"]) == (100, 3)
        # idempotent; the same schema may be imported at another version with the same id
        assert h.post("/subjects/imp-value/versions", json={"schema": A1, "id": 100, "version": 3}).json()["id"] == 100
        # no compatibility check in IMPORT: history is copied as it was
        r = h.post("/subjects/imp-value/versions", json={"schema": A_BREAKING, "id": 101, "version": 5})
        assert r.status_code == 200 and r.json()["version"] == 5
        # an id naming another schema, a schema already stored under another id, a taken version
        for body in ({"schema": A2, "id": 100, "version": 6}, {"schema": A1, "id": 102, "version": 7},
                     {"schema": A2, "id": 103, "version": 3}):
            r = h.post("/subjects/imp-value/versions", json=body)
            assert (r.status_code, r.json()["error_code"]) == (422, 42205), body
        r = h.post("/subjects/imp-value/versions", json={"schema": A2, "id": 0})
        assert (r.status_code, r.json()["error_code"]) == (422, 42201)
        assert h.get("/subjects/imp-value/versions").json() == [3, 5]
        assert h.get("/schemas/ids/100").json()["schema"] == A1
        # back to READWRITE: new ids continue after the imported ones, versions after the last
        assert h.delete("/mode/imp-value").json() == {"mode": "IMPORT"}
        r = h.post("/subjects/other-value/versions", json={"schema": A2})
        assert r.status_code == 200 and r.json()["id"] > 101
        h.put("/config/imp-value", json={"compatibility": "NONE"})
        r = h.post("/subjects/imp-value/versions", json={"schema": A2})
        assert r.status_code == 200 and r.json()["version"] == 6

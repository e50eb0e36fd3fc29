"""RFC-030 "Migration Path" phases 2 and 3 in the registry: the policy settings `require_schema`
and `require_pii_tags` (global / namespace / subject, resolved like compatibility), the
refusal of schemas with untagged leaf fields (every format, Confluent and /v1 APIs), the
store migration of older databases, authorization and the `prism schema policy` CLI.
`require_schema` itself is enforced by workers and the SDK (tests/worker, tests/sdk)."""

from __future__ import annotations

import json
import sqlite3
import uuid
from pathlib import Path

import httpx
import pytest

from app.schema.registry import PiiTagsRequired, Registry
from app.schema.store import PostgresStore, SqliteStore
from tests.schema.conftest import _pg_available, pg_dsn
from tests.schema.test_cli import run
from tests.support import creds, require

PROTO = '''syntax = "proto3";
package users.v1;
import "prism/annotations.proto";
import "google/protobuf/timestamp.proto";
message Profile {
  string user_id = 1 [(prism.pii) = "none"];
  Contact contact = 2;
  map<string, string> attributes = 3;
  google.protobuf.Timestamp updated_at = 4;
  message Contact {
    string email = 1 [(prism.pii) = "email"];
    string phone = 2;
  }
  repeated Contact previous = 5;
  int64 visits = 6;
}
'''
# every leaf tagged ("none" and "false" are explicit opt-outs)
PROTO_TAGGED = (PROTO.replace("map<string, string> attributes = 3;",
                              'map<string, string> attributes = 3 [(prism.pii) = "none"];')
                .replace("google.protobuf.Timestamp updated_at = 4;",
                         'google.protobuf.Timestamp updated_at = 4 [(prism.pii) = "false"];')
                .replace("string phone = 2;", 'string phone = 2 [(prism.pii) = "phone"];')
                .replace("int64 visits = 6;", 'int64 visits = 6 [(prism.pii) = "none"];'))
JSON_SCHEMA = json.dumps({
    "title": "Profile", "type": "object",
    "properties": {
        "user_id": {"type": "string", "x-prism-pii": "none"},
        "contact": {"type": "object", "properties": {"email": {"type": "string", "x-prism-pii": "email"},
                                                     "zip": {"type": "string"}}},
        "orders": {"type": "array", "items": {"type": "object", "properties": {"sku": {"type": "string"}}}},
        "home": {"$ref": "#/definitions/Address"},
        "tags": {"type": "array", "items": {"type": "string"}},
    },
    "definitions": {"Address": {"type": "object", "properties": {"street": {"type": "string"}}}},
})
AVRO = json.dumps({
    "type": "record", "name": "Profile", "namespace": "users",
    "fields": [
        {"name": "user_id", "type": "string", "prism.pii": "none"},
        {"name": "contact", "type": {"type": "record", "name": "Contact", "fields": [
            {"name": "email", "type": "string", "prism.pii": "email"},
            {"name": "phone", "type": ["null", "string"], "default": None}]}},
        {"name": "backup", "type": ["null", "Contact"], "default": None},
        {"name": "lines", "type": {"type": "array", "items": {
            "type": "record", "name": "Line", "fields": [{"name": "sku", "type": "string"}]}}},
        {"name": "visits", "type": "int"},
    ],
})
UNTAGGED = {
    "PROTOBUF": ["Profile.attributes", "Profile.updated_at", "Profile.visits", "Profile.Contact.phone"],
    "JSON": ["contact.zip", "orders[].sku", "tags", "definitions.Address.street"],
    "AVRO": ["Profile.contact.Contact.phone", "Profile.lines.Line.sku", "Profile.visits"],
}
TEXTS = {"PROTOBUF": PROTO, "JSON": JSON_SCHEMA, "AVRO": AVRO}


def _tag_all(fmt: str, text: str) -> str:
    """`text` with an explicit tag on every leaf the fixtures leave untagged."""
    if fmt == "PROTOBUF":
        return PROTO_TAGGED
    doc = json.loads(text)
    if fmt == "JSON":
        doc["properties"]["contact"]["properties"]["zip"]["x-prism-pii"] = "address"
        doc["properties"]["orders"]["items"]["properties"]["sku"]["x-prism-pii"] = "none"
        doc["properties"]["tags"]["x-prism-pii"] = False  # JSON's false: an explicit "not PII"
        doc["definitions"]["Address"]["properties"]["street"]["x-prism-pii"] = "address"
    else:
        doc["fields"][1]["type"]["fields"][1]["prism.pii"] = "phone"
        doc["fields"][3]["type"]["items"]["fields"][0]["prism.pii"] = "none"
        doc["fields"][4]["prism.pii"] = "none"
    return json.dumps(doc)


@pytest.mark.parametrize("fmt", ["PROTOBUF", "JSON", "AVRO"])
def test_require_pii_tags_lists_every_untagged_leaf(registry: Registry, fmt: str) -> None:
    registry.set_policy(actor="admin", namespace="users", require_pii_tags=True)
    with pytest.raises(PiiTagsRequired) as e:
        registry.register("users.profile", TEXTS[fmt], fmt, actor="ci")
    err = e.value
    assert (err.status, err.code) == (422, 42201)
    assert sorted(f.path for f in err.findings) == sorted(UNTAGGED[fmt])
    assert {f.rule for f in err.findings} == {"PII_TAG_MISSING"} and all(f.hint for f in err.findings)
    for path in UNTAGGED[fmt]:
        assert path in err.message
    assert "require_pii_tags" in err.message and "namespace 'users'" in err.message
    # message-typed fields are not leaves: their own fields are checked where they are defined
    assert not any(p.endswith((".contact", ".previous", ".backup", ".lines", ".home")) for p in
                   (f.path for f in err.findings))
    assert registry.audit_log("users.profile", 5)[0]["action"] == "register.rejected"
    assert registry.store.versions("users.profile") == []
    ok = registry.register("users.profile", _tag_all(fmt, TEXTS[fmt]), fmt, actor="ci")
    assert ok.created and ok.version.version == 1
    # a namespace without the policy takes the same untagged schema
    assert registry.register("orders.profile", TEXTS[fmt], fmt, actor="ci").created


def test_policies_resolve_subject_namespace_global(registry: Registry) -> None:
    assert registry.policy("users.profile").require_schema is False
    registry.set_policy(actor="admin", require_schema=True)  # global
    pol = registry.policy("users.profile")
    assert (pol.require_schema, pol.require_pii_tags) == (True, False)
    registry.set_policy(actor="admin", namespace="users", require_schema=False, require_pii_tags=True)
    pol = registry.policy("users.profile")
    assert (pol.require_schema, pol.require_pii_tags) == (False, True)
    assert registry.policy("orders.created").require_schema is True  # global still applies there
    registry.set_policy(actor="admin", subject="users.legacy", require_pii_tags=False)
    assert registry.policy("users.legacy").require_pii_tags is False
    assert registry.register("users.legacy", TEXTS["AVRO"], "AVRO", actor="ci").created  # the subject's opt-out
    # a setting left out stays as it was; the other settings are untouched
    registry.set_policy(actor="admin", namespace="users", compatibility="FULL")
    pol = registry.policy(namespace="users")
    assert (pol.compatibility.value, pol.require_pii_tags, pol.require_schema) == ("FULL", True, False)
    assert registry.policy_target("subject:users.new").scope == "users.new"  # a subject before its first version
    detail = next(a for a in registry.audit_log(None, 20) if a["action"] == "policy.set")["detail"]
    assert "require_pii_tags" in detail and "require_schema" in detail


def test_a_schema_registered_before_the_policy_stays_usable(registry: Registry) -> None:
    first = registry.register("users.profile", PROTO, "PROTOBUF", actor="ci")
    registry.set_policy(actor="admin", namespace="users", require_pii_tags=True)
    again = registry.register("users.profile", PROTO, "PROTOBUF", actor="ci")  # idempotent: same version
    assert not again.created and again.version.id == first.version.id
    with pytest.raises(PiiTagsRequired):  # but no new untagged version
        registry.register("users.profile", PROTO.replace("int64 visits = 6;", "int64 visits = 6;\n  string x = 7;"),
                          "PROTOBUF", actor="ci")


# ------------------------------------------------------------------------------------------ migration


OLD_CONFIG = "CREATE TABLE config (scope TEXT PRIMARY KEY, compatibility TEXT, pii_policy TEXT, approval_required INTEGER)"


def test_sqlite_store_from_before_the_columns_is_migrated_on_open(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path)
    conn.execute(OLD_CONFIG)
    conn.execute("INSERT INTO config VALUES ('ns:users', 'FULL', 'enforce', 1)")
    conn.commit()
    conn.close()
    for _ in range(2):  # idempotent: the second open finds the columns
        store = SqliteStore(str(path))
        row = store.get_config("ns:users")
        assert row is not None and (row.compatibility, row.pii_policy, row.approval_required) == ("FULL", "enforce", True)
        assert (row.require_schema, row.require_pii_tags) == (None, None)
        store.close()
    store = SqliteStore(str(path))
    store.set_config("ns:users", None, None, None, require_pii_tags=True)
    assert store.get_config("ns:users").require_pii_tags is True  # type: ignore[union-attr]
    assert Registry(store).policy(namespace="users").compatibility.value == "FULL"
    store.close()


def test_postgres_store_from_before_the_columns_is_migrated_on_open() -> None:
    problem = _pg_available()
    require(problem is None, f"PostgreSQL unavailable: {problem}")  # a failure under CI=true
    import psycopg

    schema = f"prism_reg_old_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(pg_dsn(), autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
        conn.execute(f'SET search_path TO "{schema}"')
        conn.execute(OLD_CONFIG)
        conn.execute("INSERT INTO config VALUES ('__global__', 'NONE', 'warn', 0)")
    try:
        for attempt in range(2):  # idempotent: the second open finds the columns (and the value set)
            store = PostgresStore(pg_dsn(), pg_schema=schema)
            row = store.get_config("__global__")
            assert row is not None and row.compatibility == "NONE"
            assert row.require_schema is (None if attempt == 0 else True)
            store.set_config("__global__", None, None, None, require_schema=True)
            assert Registry(store).policy().require_schema is True
            store.close()
    finally:
        store = PostgresStore(pg_dsn(), pg_schema=schema)
        store.drop()
        store.close()


# ------------------------------------------------------------------------------------------ REST, authz


def test_rest_policy_and_refusal_bodies(live_server) -> None:  # type: ignore[no-untyped-def]
    url = live_server.url
    with httpx.Client(base_url=url, timeout=30) as http:
        body = {"require_schema": True, "require_pii_tags": True}
        # the same role that changes compatibility: admin
        for user in ("reader", "writer"):
            assert http.put("/v1/policies/ns:users", json=body, auth=creds(user)).status_code == 403
        r = http.put("/v1/policies/ns:users", json=body, auth=creds("admin"))
        assert r.status_code == 200 and r.json()["require_schema"] is True and r.json()["require_pii_tags"] is True
        got = http.get("/v1/policies/ns:users", auth=creds("reader")).json()
        assert got["kind"] == "namespace" and got["require_pii_tags"] is True
        listed = http.get("/v1/policies", auth=creds("reader")).json()
        assert [(p["scope"], p["require_schema"], p["require_pii_tags"]) for p in listed] == [("ns:users", True, True)]
        assert http.put("/v1/policies/ns:users", json={"require_schema": "yes please"},
                        auth=creds("admin")).status_code == 422  # strict bool
        # Confluent API: 422 / 42201 with every field in the message (what Confluent clients print)
        r = http.post("/subjects/users.profile-value/versions", auth=creds("admin"),
                      json={"schema": AVRO, "schemaType": "AVRO"})
        assert r.status_code == 422 and r.json()["error_code"] == 42201
        for path in UNTAGGED["AVRO"]:
            assert path in r.json()["message"]
        # Prism API: the findings, each with its fix
        r = http.post("/v1/schemas", auth=creds("admin"), json={"topic": "users.profile", "schema": JSON_SCHEMA,
                                                                 "format": "JSON"})
        assert r.status_code == 422
        findings = r.json()["findings"]
        assert sorted(f["path"] for f in findings) == sorted(UNTAGGED["JSON"])
        assert all(f["rule"] == "PII_TAG_MISSING" and "x-prism-pii" in f["hint"] for f in findings)


def test_cli_policy_set_and_get(live_server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    url = live_server.url
    (tmp_path / "p.avsc").write_text(AVRO)
    r = run("policy", "set", "--namespace", "users", "--require-schema", "--require-pii-tags", registry=url)
    assert r.exit_code == 0, r.output
    assert '"require_schema": true' in r.output and '"require_pii_tags": true' in r.output
    r = run("policy", "get", "--namespace", "users", registry=url)
    assert r.exit_code == 0 and json.loads(r.output)["require_pii_tags"] is True
    r = run("register", "--file", str(tmp_path / "p.avsc"), "--topic", "users.profile", registry=url)
    assert r.exit_code == 1 and "PII tag is required on every field" in r.output
    assert all(p in r.output for p in UNTAGGED["AVRO"]) and "PII_TAG_MISSING" in r.output
    # a subject-level opt-out before the subject exists (subject: scope), shown by policy get --subject
    r = run("policy", "set", "--subject", "users.profile", "--no-require-pii-tags", registry=url)
    assert r.exit_code == 0, r.output
    got = json.loads(run("policy", "get", "--subject", "users.profile", registry=url).output)
    assert got["kind"] == "subject" and got["require_pii_tags"] is False and got["require_schema"] is True
    assert run("register", "--file", str(tmp_path / "p.avsc"), "--topic", "users.profile",
               registry=url).exit_code == 0
    r = run("policy", "set", "--global", "--no-require-schema", registry=url)
    assert r.exit_code == 0 and '"require_schema": false' in r.output
    r = run("policy", "set", "--namespace", "users", "--global", "--require-schema", registry=url)
    assert r.exit_code == 2 and "exactly one policy scope" in r.output
    r = run("policy", "set", "--namespace", "users", "--no-require-schema", registry=url, user="writer")
    assert r.exit_code == 2 and "HTTP 403" in r.output

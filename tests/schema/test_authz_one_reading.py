"""Authorization reads a request exactly as its route does - the class of bug where the check
and the handler parse one request two ways.

The attack this replaced: a ``write:orders.`` user sent ``POST /v1/schemas`` with
``"metadata": {"compatibility_mode": "NONE"}, "dry_run": "false"``; a raw-JSON check took the
string as true (a dry run, no admin needed), the model converted it to False, and the
subject's policy became NONE. Here, for every route of the table and every client:

- values of the wrong JSON type in every field (the string booleans of every spelling,
  numbers, null, lists) are refused - by the route-level rule first, else with 422 - and
  change nothing;
- duplicated keys (at any depth), case variants and aliases of field names, and query
  parameters named like body fields change nothing either;
- an oversized body is refused with 413 on every route, with and without Content-Length
  (over a real socket too, chunked), and the default limit is the same 16 MiB for the
  Confluent and the /v1 routes;
- a registration that moves a subject to another namespace (another policy) needs admin;
- the policy reads (``GET /v1/policies/{s}``, the list, Confluent ``/config``) show what the
  writes did and what registrations enforce;
- the guards that keep it so: every write route decides from its validated input, the app
  refuses to build otherwise, an undecided write cannot name an actor, and a request
  authorized under one route's rule is refused by any other route.
"""

from __future__ import annotations

import copy
import json
import socket
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient

from app.schema import authz
from app.schema.authz import ADMIN, RULES, WRITE, Rule
from app.schema.registry import Registry
from app.schema.service import MAX_BODY_BYTES, create_app
from app.security.http_auth import HttpAuth
from tests.schema.conftest import serve_registry
from tests.schema.test_authz import CLIENTS, CT, V1, V2, refusal, seeded, store  # noqa: F401 - store: a fixture
from tests.support import auth_headers

BREAKING = 'syntax = "proto3";\nmessage OrderCreated { string order_id = 1; string total = 3; }\n'
PARAMS = {"subject": "orders.created", "version": "1", "schema_id": "1", "namespace": "orders",
          "approval_id": "1", "decision": "approve", "resource_namespace": "-", "resource_name": "orders.created",
          "resource_id": "r-1"}
#: Every spelling of a boolean the attack pass tried, and more: none of them is a JSON boolean.
STRING_BOOLEANS = ("false", "False", "FALSE", "0", "no", "off", "n", "f", "", "true", "True", "1", "yes", "on",
                   "y", "t")
NOT_BOOLEANS: tuple[Any, ...] = (*STRING_BOOLEANS, 0, 1, 0.0, 1.0, -1, None, [], {}, [False])
NOT_INTEGERS: tuple[Any, ...] = ("1", "0", "one", 1.0, 1.5, True, False, None, [], [1], {})
NOT_STRINGS: tuple[Any, ...] = (0, 1, 1.5, True, False, None, [], ["NONE"], {})

#: A complete, valid body per route template, and the type of each field (what a wrong
#: value is); ``?`` marks a field that may be null.
BODIES: dict[str, tuple[dict[str, Any], dict[str, str]]] = {
    "/v1/schemas": ({"topic": "orders.created", "schema": V2, "format": "protobuf", "namespace": "orders",
                     "version": "v2", "metadata": {"compatibility_mode": "NONE"}, "dry_run": False},
                    {"topic": "str", "schema": "str", "format": "str", "namespace": "str?", "version": "str?",
                     "dry_run": "bool", "metadata.compatibility_mode": "str?"}),
    "/v1/approvals": ({"subject": "orders.created", "schema": V2, "format": "protobuf", "reason": "r"},
                      {"subject": "str", "schema": "str", "format": "str", "reason": "str"}),
    "/v1/consumers": ({"subject": "orders.created", "version": 1, "consumer_id": "c1"},
                      {"subject": "str", "version": "int", "consumer_id": "str"}),
    "/v1/subjects/{subject}/check": ({"schema": V2, "format": "protobuf", "mode": "FULL", "version": "1"},
                                     {"schema": "str", "format": "str", "mode": "str?", "version": "str?"}),
    "/v1/policies/{namespace}": ({"compatibility": "NONE", "pii_policy": "warn", "approval_required": False},
                                 {"compatibility": "str?", "pii_policy": "str?", "approval_required": "bool?"}),
    "/config": ({"compatibility": "NONE"}, {"compatibility": "str?", "compatibilityLevel": "str?"}),
    "/config/{subject}": ({"compatibility": "NONE"}, {"compatibility": "str?", "compatibilityLevel": "str?"}),
    "/mode": ({"mode": "READWRITE"}, {"mode": "str"}),
    "/mode/{subject}": ({"mode": "READWRITE"}, {"mode": "str"}),
    "/associations": ({"resourceName": "orders.created", "resourceNamespace": "-", "resourceType": "topic",
                       "associations": [{"subject": "orders.created-value", "associationType": "value"}]},
                      {"resourceName": "str?", "resourceNamespace": "str?", "resourceId": "str?",
                       "resourceType": "str?"}),
}
_CONFLUENT_SCHEMA = ({"schema": V2, "schemaType": "PROTOBUF", "references": []},
                     {"schema": "str", "schemaType": "str?", "id": "int?", "version": "int?"})
for _path in ("/subjects/{subject}/versions", "/subjects/{subject}",
              "/compatibility/subjects/{subject}/versions/{version}", "/compatibility/subjects/{subject}/versions"):
    BODIES[_path] = _CONFLUENT_SCHEMA
BODY_RULES = [r for r in RULES if r.method in ("POST", "PUT") and r.path in BODIES]


def concrete(template: str) -> str:
    import re

    return re.sub(r"\{(\w+)\}", lambda m: PARAMS[m.group(1)], template)


def headers_of(who: str, **extra: str) -> dict[str, str]:
    return {**({} if who == "anonymous" else auth_headers(who)), **extra}


def state(registry: Registry) -> tuple[Any, ...]:
    """Everything a request could change: policies, modes, versions, approvals, audit log."""
    st = registry.store
    return (sorted((c.scope, c.compatibility, c.pii_policy, c.approval_required) for c in st.configs()),
            registry.mode(), registry.mode("orders.created"),
            [(s, [(v.version, v.schema_id, v.deleted) for v in st.versions(s, include_deleted=True)])
             for s in sorted(st.subjects(include_deleted=True))],
            [(a.id, a.status) for a in st.approvals(None, None)], len(registry.audit_log(None, 10_000)),
            registry.active_consumers("orders.created"))


def with_value(body: dict[str, Any], field: str, value: Any) -> dict[str, Any]:
    out = copy.deepcopy(body)
    *parents, leaf = field.split(".")
    target = out
    for p in parents:
        target = target.setdefault(p, {})
    target[leaf] = value
    return out


def wrong_values(kind: str) -> tuple[Any, ...]:
    base = {"bool": NOT_BOOLEANS, "int": NOT_INTEGERS, "str": NOT_STRINGS}[kind.rstrip("?")]
    return tuple(v for v in base if not (v is None and kind.endswith("?")))


@pytest.fixture
def client(registry: Registry, auth: HttpAuth) -> TestClient:
    return TestClient(create_app(seeded(registry), auth=auth))


# --------------------------------------------------------------------------- the reported attack


@pytest.mark.parametrize("spelling", [*STRING_BOOLEANS, 0, 1, None])
def test_a_writer_cannot_set_policy_with_a_spelled_boolean(client: TestClient, registry: Registry,
                                                           spelling: Any) -> None:
    """The finding, for every spelling: refused (422, not 200), the policy stays BACKWARD, the
    breaking version is still refused afterwards - and the policy reads agree."""
    body = {"topic": "orders.created", "schema": V2, "metadata": {"compatibility_mode": "NONE"}, "dry_run": spelling}
    for who in ("writer", "admin"):  # not even an admin's request means two things
        r = client.post("/v1/schemas", json=body, headers=auth_headers(who))
        assert r.status_code == 422 and r.json()["error_code"] == 42201, (who, r.status_code, r.text)
        assert "dry_run" in r.json()["message"]
    assert registry.subject_config("orders.created") is None
    assert client.get("/v1/policies/orders.created", headers=auth_headers("reader")).json()["compatibility"] \
        == "BACKWARD"
    r = client.post("/subjects/orders.created/versions", json={"schema": BREAKING, "schemaType": "PROTOBUF"},
                    headers=auth_headers("admin"))
    assert r.status_code == 409, r.text


def test_real_booleans_still_decide_as_documented(client: TestClient, registry: Registry) -> None:
    body = {"topic": "orders.created", "schema": V2, "metadata": {"compatibility_mode": "NONE"}}
    w = auth_headers("writer")
    assert client.post("/v1/schemas", json={**body, "dry_run": False}, headers=w).status_code == 403
    assert client.post("/v1/schemas", json=body, headers=w).status_code == 403  # dry_run absent = false
    r = client.post("/v1/schemas", json={**body, "dry_run": True}, headers=w)
    assert r.status_code == 200 and r.json()["created"] is False
    assert registry.subject_config("orders.created") is None
    for empty in ("", None):  # no mode given: no policy change, a plain write
        assert client.post("/v1/schemas", json={**body, "metadata": {"compatibility_mode": empty}},
                           headers=w).status_code == 200
    assert registry.subject_config("orders.created") is None
    assert client.post("/v1/schemas", json={**body, "dry_run": False}, headers=auth_headers("admin")).status_code == 200
    assert registry.subject_config("orders.created") == "NONE"
    r = client.post("/subjects/orders.created/versions", json={"schema": BREAKING, "schemaType": "PROTOBUF"},
                    headers=auth_headers("admin"))
    assert r.status_code == 200, r.text  # the admin's NONE is what registrations now apply


# --------------------------------------------------------------------------- the role matrix: value spellings


@pytest.mark.parametrize("who", CLIENTS)
@pytest.mark.parametrize("rule", BODY_RULES, ids=lambda r: f"{r.method} {r.path}")
def test_role_matrix_with_wrongly_typed_values(rule: Rule, who: str, client: TestClient, registry: Registry) -> None:
    """Every body field of every route, every client, every wrong JSON type: the route-level
    refusal (401/403) when the client lacks it, else 422 - never a success, never a change."""
    body, fields = BODIES[rule.path]
    before = state(registry)
    refused = refusal(rule.need, who)
    tried = 0
    for field, kind in fields.items():
        for value in wrong_values(kind):
            r = client.request(rule.method, concrete(rule.path), json=with_value(body, field, value),
                               headers=headers_of(who))
            want = refused if refused is not None else 422
            assert r.status_code == want, (field, value, r.status_code, r.text)
            assert r.headers["content-type"] == CT and "error_code" in r.json()
            tried += 1
    assert tried >= len(fields) * 5
    assert state(registry) == before


@pytest.mark.parametrize("who", CLIENTS)
@pytest.mark.parametrize("rule", BODY_RULES, ids=lambda r: f"{r.method} {r.path}")
def test_role_matrix_with_duplicate_keys_and_field_name_variants(rule: Rule, who: str, client: TestClient,
                                                                 registry: Registry) -> None:
    """A duplicated key - top level or nested - is refused (parsers disagree on which one
    counts); so are case variants, camelCase and Python-name aliases of the /v1 fields."""
    body, fields = BODIES[rule.path]
    before = state(registry)
    refused = refusal(rule.need, who)
    want = refused if refused is not None else 422
    top = next(iter(fields))
    text = json.dumps(body)
    variants = [text[:-1] + f", {json.dumps(top)}: {json.dumps(body[top])}}}"]  # the same key again, same value
    if "metadata" in body:
        variants.append(text.replace('"compatibility_mode": "NONE"',
                                     '"compatibility_mode": "NONE", "compatibility_mode": "BACKWARD"'))
    for raw in variants:
        r = client.request(rule.method, concrete(rule.path), content=raw,
                           headers=headers_of(who, **{"Content-Type": "application/json"}))
        assert r.status_code == want, (raw[-80:], r.status_code, r.text)
        if want == 422:
            assert "duplicate key" in r.json()["message"]
    if rule.path.startswith("/v1/"):
        for field in [f for f in fields if "." not in f]:
            for alias in {field.upper(), field.capitalize(), field.title().replace("_", ""),
                          field.split("_")[0] + "".join(p.capitalize() for p in field.split("_")[1:]), field + "_"}:
                if alias == field:
                    continue
                r = client.request(rule.method, concrete(rule.path), json={**body, alias: body.get(field, True)},
                                   headers=headers_of(who))
                assert r.status_code == want, (alias, r.status_code, r.text)
    assert state(registry) == before


def test_variants_of_dry_run_do_not_make_a_dry_run(client: TestClient, registry: Registry) -> None:
    """Spelt like dry_run but not dry_run: refused, so nobody believes they did a dry run (or
    gets one past a check that reads the field another way)."""
    body = {"topic": "orders.created", "schema": V2, "metadata": {"compatibility_mode": "NONE"}}
    for alias in ("Dry_Run", "DRY_RUN", "dryRun", "dry-run", "dry_run ", "\u0064ry_run\u200b"):
        for who in ("writer", "admin"):
            r = client.post("/v1/schemas", json={**body, alias: True}, headers=auth_headers(who))
            assert r.status_code == 422 and "extra" in r.json()["message"].lower(), (alias, r.text)
    for alias in ("Metadata", "META", "metadata_"):
        r = client.post("/v1/schemas", json={"topic": "orders.created", "schema": V2,
                                             alias: {"compatibility_mode": "NONE"}}, headers=auth_headers("writer"))
        assert r.status_code == 422, (alias, r.text)
    # the mode's own spellings are one reading: the registry parses "none" as NONE, so it is admin's
    r = client.post("/v1/schemas", json={**body, "metadata": {"compatibility_mode": " none "}},
                    headers=auth_headers("writer"))
    assert r.status_code == 403
    # a key that only looks like compatibility_mode is just metadata: no policy change, no admin needed
    r = client.post("/v1/schemas", json={**body, "metadata": {"Compatibility_Mode": "NONE"}},
                    headers=auth_headers("writer"))
    assert r.status_code == 200 and registry.subject_config("orders.created") is None


def test_query_parameters_named_like_body_fields_change_nothing(client: TestClient, registry: Registry) -> None:
    body = {"topic": "orders.created", "schema": V2, "metadata": {"compatibility_mode": "NONE"}}
    w = auth_headers("writer")
    for query in ("?dry_run=true", "?dry_run=true&dry_run=false", "?topic=payments.x", "?metadata=",
                  "?subject=orders.created"):
        assert client.post("/v1/schemas" + query, json=body, headers=w).status_code == 403, query
    r = client.post("/v1/schemas?topic=orders.created", json={**body, "topic": "payments.x", "metadata": {}},
                    headers=w)
    assert r.status_code == 403 and "payments.x" in r.json()["message"]  # the body's topic, as the handler's
    r = client.post("/subjects/orders.created/versions?subject=payments.x",
                    json={"schema": V2, "schemaType": "PROTOBUF", "subject": "payments.x"}, headers=w)
    assert r.status_code == 200 and r.json()["subject"] == "orders.created"
    assert registry.subjects() == ["orders.created"] and registry.subject_config("orders.created") is None


def test_moving_a_subject_to_another_namespace_is_a_policy_change(client: TestClient, registry: Registry) -> None:
    """The namespace picks the policy a subject is governed by; a writer choosing a laxer one
    (here pii_policy off, compatibility NONE) would change its subject's policy."""
    a, w = auth_headers("admin"), auth_headers("writer")
    assert client.put("/v1/policies/ns:lax", json={"compatibility": "NONE", "pii_policy": "off"},
                      headers=a).status_code == 200
    body = {"topic": "orders.created", "schema": BREAKING}
    r = client.post("/v1/schemas", json={**body, "namespace": "lax"}, headers=w)
    assert r.status_code == 403 and "admin" in r.json()["message"]
    assert client.post("/v1/schemas", json={**body, "namespace": "lax", "dry_run": True}, headers=w).status_code \
        == 409  # a dry run moves nothing: checked under the subject's own policy
    assert client.post("/v1/schemas", json={**body, "namespace": "orders"}, headers=w).status_code == 409
    assert client.post("/v1/schemas", json={"topic": "orders.new", "schema": V1, "namespace": "orders"},
                       headers=w).status_code == 200  # a new subject in its default namespace
    assert client.post("/v1/schemas", json={"topic": "orders.new2", "schema": V1, "namespace": "lax"},
                       headers=w).status_code == 403
    assert registry.namespace_for("orders.created") == "orders"
    assert client.post("/v1/schemas", json={"topic": "orders.created", "schema": V2, "namespace": "lax"},
                       headers=a).status_code == 200
    assert registry.namespace_for("orders.created") == "lax"


# --------------------------------------------------------------------------- one body limit, every route

SMALL_LIMIT = 4096


def oversized(size: int) -> bytes:
    """A well-formed JSON body of ``size`` bytes (the limit is on bytes, not on parse errors)."""
    head, tail = b'{"topic": "orders.created", "schema": "', b'"}'
    return head + b"x" * (size - len(head) - len(tail)) + tail


def _chunks(data: bytes, n: int = 1024) -> Iterator[bytes]:
    for i in range(0, len(data), n):
        yield data[i:i + n]


@pytest.mark.parametrize("who", CLIENTS)
@pytest.mark.parametrize("rule", RULES, ids=lambda r: f"{r.method} {r.path}")
def test_role_matrix_with_oversized_bodies(rule: Rule, who: str, registry: Registry, auth: HttpAuth) -> None:
    """Every route of the table (every write route and the rest), every client: a declared
    Content-Length over the limit is 413/41301 before authentication; a body without one
    (chunked) is cut off at the limit on every route that reads a body, once the request got
    past the route-level rule (a refused request's body is never read; nor is one sent to a
    route that takes none - the server discards it, nothing is buffered). Nothing changes."""
    app = create_app(seeded(registry), auth=auth, max_body_bytes=SMALL_LIMIT)
    client = TestClient(app)
    reads_body = any(isinstance(r, APIRoute) and r.path == rule.path and rule.method in r.methods
                     and r.body_field is not None for r in app.routes)
    assert reads_body is (rule.path in BODIES and rule.method in ("POST", "PUT"))
    before = state(registry)
    data = oversized(SMALL_LIMIT + 1)
    h = headers_of(who, **{"Content-Type": "application/json"})
    too_large = {"error_code": 41301, "message": f"Request body too large: the limit is {SMALL_LIMIT} bytes"}
    r = client.request(rule.method, concrete(rule.path), content=data, headers=h)
    assert (r.status_code, r.json()) == (413, too_large) and r.headers["content-type"] == CT
    if reads_body:
        r = client.request(rule.method, concrete(rule.path), content=_chunks(data), headers=h)
        assert "content-length" not in {k.lower() for k in r.request.headers}
        refused = refusal(rule.need, who)
        assert r.status_code == (refused or 413), (r.status_code, r.text)
        if refused is None:
            assert r.json() == too_large and r.headers["content-type"] == CT
    assert state(registry) == before


def test_a_body_at_the_limit_is_not_refused_for_its_size(registry: Registry, auth: HttpAuth) -> None:
    client = TestClient(create_app(seeded(registry), auth=auth, max_body_bytes=SMALL_LIMIT))
    body = json.dumps({"schema": V2, "schemaType": "PROTOBUF"}).encode()
    body = body[:-1] + b" " * (SMALL_LIMIT - len(body)) + b"}"
    assert len(body) == SMALL_LIMIT
    for content in (body, _chunks(body)):
        r = client.post("/subjects/orders.created/versions", content=content,
                        headers=headers_of("writer", **{"Content-Type": "application/json"}))
        assert r.status_code == 200, r.text


@pytest.mark.parametrize("path", ["/subjects/orders.created/versions", "/v1/schemas"])
def test_the_default_limit_is_16_mib_on_the_confluent_and_the_v1_routes(client: TestClient, path: str) -> None:
    """The finding: the Confluent route stored a 40 MB schema while /v1 refused over 16 MiB."""
    assert MAX_BODY_BYTES == 16 * 1024 * 1024
    data = oversized(MAX_BODY_BYTES + 1)
    for content in (data, _chunks(data, 1 << 20)):
        r = client.post(path, content=content, headers=headers_of("admin", **{"Content-Type": "application/json"}))
        assert r.status_code == 413 and r.json()["error_code"] == 41301, r.text
        assert "16 MiB" in r.json()["message"]


def _raw_http(url: str, head: bytes, chunks: Iterator[bytes] = iter(())) -> tuple[int, dict[str, Any]]:
    parts = urlsplit(url)
    with socket.create_connection((parts.hostname, parts.port), timeout=30) as sock:
        sock.sendall(head)
        try:
            for c in chunks:
                sock.sendall(c)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server may stop reading once it has refused
        data = b""
        while b"\r\n\r\n" not in data or len(data.split(b"\r\n\r\n", 1)[1]) < int(
                dict(line.split(b": ", 1) for line in data.split(b"\r\n\r\n")[0].split(b"\r\n")[1:]
                     if b": " in line).get(b"content-length", b"0")):
            more = sock.recv(65536)
            if not more:
                break
            data += more
    status = int(data.split(b" ", 2)[1])
    return status, json.loads(data.split(b"\r\n\r\n", 1)[1] or b"{}")


def test_over_a_real_socket_chunked_and_declared(registry: Registry, auth: HttpAuth) -> None:
    """uvicorn, real TCP: a chunked body (no Content-Length) is cut off at the limit, and a
    declared 40 MB body is refused before a byte of it is sent."""
    seeded(registry)
    with serve_registry(registry, auth) as url:
        cred = auth_headers("admin")["Authorization"]
        data = oversized(MAX_BODY_BYTES + 64 * 1024)
        head = (f"POST /subjects/orders.created/versions HTTP/1.1\r\nHost: x\r\nAuthorization: {cred}\r\n"
                "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n").encode()
        chunked = (f"{len(c):x}\r\n".encode() + c + b"\r\n" for c in _chunks(data, 1 << 16))
        status, body = _raw_http(url, head, iter([*chunked, b"0\r\n\r\n"]))
        assert (status, body["error_code"]) == (413, 41301), body
        head = (f"POST /subjects/orders.created/versions HTTP/1.1\r\nHost: x\r\nAuthorization: {cred}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {40 * 1000 * 1000}\r\n\r\n").encode()
        status, body = _raw_http(url, head)  # no body sent at all: answered from the header
        assert (status, body["error_code"]) == (413, 41301), body
    assert registry.versions("orders.created")[-1].version == 1


# --------------------------------------------------------------------------- policy reads agree with policy writes


def test_policy_reads_show_what_every_policy_write_did(client: TestClient, registry: Registry) -> None:
    """The finding: after a registration set orders.created to NONE, the list showed NONE but
    ``GET /v1/policies/orders.created`` read it as a *namespace* and said BACKWARD. Now every
    read of the subject's policy equals what registrations enforce, after every kind of write."""
    a, rd = auth_headers("admin"), auth_headers("reader")

    def check(expected: str) -> None:
        one = client.get("/v1/policies/orders.created", headers=rd).json()
        confluent = client.get("/config/orders.created?defaultToGlobal=true", headers=rd).json()
        assert (one["compatibility"], one["kind"], confluent["compatibilityLevel"],
                registry.policy("orders.created").compatibility.value) == (expected, "subject", expected, expected)
        listed = {e["scope"]: e for e in client.get("/v1/policies", headers=rd).json()}
        own = listed.get("orders.created", {}).get("compatibility")
        assert own is None or own == expected
        # and what registration applies: the breaking change passes only under NONE
        dry = client.post("/v1/schemas", json={"topic": "orders.created", "schema": BREAKING, "dry_run": True},
                          headers=a)
        assert dry.status_code == (200 if expected == "NONE" else 409), (expected, dry.text)

    check("BACKWARD")
    r = client.post("/v1/schemas", json={"topic": "orders.created", "schema": V2,
                                         "metadata": {"compatibility_mode": "NONE"}}, headers=a)
    assert r.status_code == 200
    check("NONE")
    assert {e["scope"]: e["kind"] for e in client.get("/v1/policies", headers=rd).json()} == {
        "orders.created": "subject"}
    assert client.delete("/config/orders.created", headers=a).status_code == 200
    check("BACKWARD")
    r = client.put("/v1/policies/ns:orders", json={"compatibility": "FULL"}, headers=a)
    assert r.status_code == 200 and (r.json()["kind"], r.json()["scope"]) == ("namespace", "ns:orders")
    check("FULL")
    r = client.put("/v1/policies/orders", json={"compatibility": "FORWARD"}, headers=a)  # not a subject: namespace
    assert r.status_code == 200 and r.json()["scope"] == "ns:orders"
    check("FORWARD")
    assert client.get("/v1/policies/orders", headers=rd).json()["compatibility"] == "FORWARD"
    assert client.put("/config/orders.created", json={"compatibility": "NONE"}, headers=a).status_code == 200
    check("NONE")
    r = client.put("/v1/policies/orders.created", json={"compatibility": "FULL_TRANSITIVE"}, headers=a)
    assert r.status_code == 200 and (r.json()["kind"], r.json()["compatibility"]) == ("subject", "FULL_TRANSITIVE")
    check("FULL_TRANSITIVE")
    assert client.put("/config", json={"compatibility": "NONE"}, headers=a).status_code == 200
    check("FULL_TRANSITIVE")  # the subject's own setting wins over the global one
    assert client.get("/v1/policies/__global__", headers=rd).json()["compatibility"] == "NONE"
    assert client.get("/v1/policies/ns:orders", headers=rd).json()["compatibility"] == "FORWARD"
    # a subject not registered yet, configured first (Confluent allows it): read back as that subject
    assert client.put("/config/orders.future", json={"compatibility": "FORWARD_TRANSITIVE"}, headers=a) \
        .status_code == 200
    got = client.get("/v1/policies/orders.future", headers=rd).json()
    assert (got["kind"], got["compatibility"]) == ("subject", "FORWARD_TRANSITIVE")


# --------------------------------------------------------------------------- the guards that keep it so


def test_every_write_route_decides_from_its_validated_input(registry: Registry, auth: HttpAuth) -> None:
    app = create_app(registry, auth=auth)
    writes = [r for r in app.routes if isinstance(r, APIRoute)
              for m in r.methods if (rule := authz.explicit_rule(m, r.path)) and rule.need == WRITE]
    # POST /v1/schemas, /v1/approvals, /subjects/{subject}/versions and /associations
    assert len(writes) == 4 and all(authz.has_decision(r.dependant) for r in writes)


def test_an_app_with_an_undecided_write_route_is_not_built(registry: Registry, auth: HttpAuth,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(authz, "has_decision", lambda dependant: False)
    with pytest.raises(RuntimeError, match=r"write routes without an authz\.decides dependency"):
        create_app(registry, auth=auth)


class _Req:
    def __init__(self, state: dict[str, Any], method: str = "POST") -> None:
        self.scope = {"state": state, "method": method}


def test_an_undecided_write_cannot_name_its_actor() -> None:
    from app.security.http_auth import Principal

    p = Principal("writer", frozenset({"write:orders."}), "basic")
    rule = authz.explicit_rule("POST", "/v1/schemas")
    req = _Req({"principal": p, "authz_rule": rule, "authz_pending": True})
    with pytest.raises(RuntimeError, match="did not decide"):
        authz.actor_of(req)
    with pytest.raises(authz.Refused) as exc:
        authz.decide(req, subject="payments.x")
    assert exc.value.status == 403
    with pytest.raises(authz.Refused):
        authz.decide(req, subject="orders.x", admin=True)
    with pytest.raises(RuntimeError, match="did not decide"):
        authz.actor_of(req)  # refusals leave it undecided
    authz.decide(req, subject="orders.x")
    assert authz.actor_of(req) == "writer"
    with pytest.raises(RuntimeError):  # decide() on a route whose rule is not a write is a bug
        authz.decide(_Req({"principal": p, "authz_rule": authz.explicit_rule("GET", "/subjects")}), subject="x")


def test_a_request_authorized_under_another_routes_rule_is_refused() -> None:
    read_rule = authz.explicit_rule("GET", "/subjects/{subject}/versions")
    scope = {"method": "GET", "state": {"authz_rule": read_rule}}
    authz.check_routed(scope, "/subjects/{subject}/versions")
    with pytest.raises(authz.Refused) as exc:
        authz.check_routed(scope, "/v1/audit")  # the router chose an admin route
    assert exc.value.status == 403
    with pytest.raises(authz.Refused):
        authz.check_routed(scope, "/some/route/without/a/rule")


def test_refusals_from_inside_a_route_look_like_the_middlewares(client: TestClient) -> None:
    """A per-subject refusal made by decide() has the middleware's shape (code, message, type)."""
    r = client.post("/v1/schemas", json={"topic": "payments.x", "schema": V1}, headers=auth_headers("writer"))
    assert r.status_code == 403 and r.headers["content-type"] == CT and "www-authenticate" not in r.headers
    assert r.json() == {"error_code": 40301, "message": "Forbidden: user 'writer' may not POST '/v1/schemas' "
                                                        "(needs write on subject 'payments.x')"}
    assert ADMIN in client.post("/v1/schemas", json={"topic": "orders.x", "schema": V1,
                                                     "metadata": {"compatibility_mode": "NONE"}},
                                headers=auth_headers("writer")).json()["message"]

"""Who may call which registry route: the route table covers every route of the app, each
rule is checked as an anonymous, a read-only, a writer (``write:orders.``) and an admin
client, and the attacks: spoofed actor header, wrong password, prefix escapes, subjects that
try to leave their path segment, body tricks, cache bypass, and (bearer) forged, expired,
``none`` and HS256-with-the-public-key JWTs."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re
import time
from collections.abc import Iterator
from pathlib import Path

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient
from jwt.algorithms import RSAAlgorithm

from app.errors import ConfigError
from app.schema.authz import ADMIN, DEFAULT_RULE, OPEN, READ, RULES, WRITE, Rule, explicit_rule, rule_for
from app.schema.registry import Registry
from app.schema.service import create_app
from app.schema.store import SqliteStore
from app.security.http_auth import BearerAuth, HttpAuth, auth_from_settings
from tests.support import auth_headers, creds

V1 = 'syntax = "proto3";\nmessage OrderCreated { string order_id = 1; double total = 3; }\n'
V2 = 'syntax = "proto3";\nmessage OrderCreated { string order_id = 1; double total = 3; optional double tax = 4; }\n'
CT = "application/vnd.schemaregistry.v1+json"
PARAMS = {"subject": "orders.created", "version": "1", "schema_id": "1", "namespace": "orders",
          "approval_id": "1", "decision": "approve", "resource_namespace": "-", "resource_name": "orders.created",
          "resource_id": "lkc-1:orders.created"}
CLIENTS = ("anonymous", "reader", "writer", "admin")


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqliteStore]:
    """Authorization does not depend on the storage backend: SQLite only (overrides conftest)."""
    s = SqliteStore(str(tmp_path / "registry.db"))
    yield s
    s.close()


def seeded(registry: Registry) -> Registry:
    registry.register("orders.created", V1, "PROTOBUF", namespace="orders", actor="seed")
    registry.request_approval("orders.created", V2, "PROTOBUF", actor="seed", reason="r")
    return registry


def concrete(template: str) -> str:
    return re.sub(r"\{(\w+)\}", lambda m: PARAMS[m.group(1)], template)


def body_for(rule: Rule) -> dict | None:
    if rule.method not in ("POST", "PUT"):
        return None
    if rule.path == "/v1/schemas":
        return {"topic": "orders.created", "schema": V2, "format": "protobuf"}
    if rule.path == "/v1/approvals":
        return {"subject": "orders.created", "schema": V2, "format": "protobuf"}
    if rule.path == "/v1/consumers":
        return {"subject": "orders.created", "version": 1, "consumer_id": "c1"}
    if rule.path == "/associations":
        return {"resourceName": "orders.created", "resourceNamespace": "lkc-1", "resourceId": "lkc-1:orders.created",
                "resourceType": "topic", "associations": [{"subject": "orders.created", "associationType": "value"}]}
    return {"schema": V2, "schemaType": "PROTOBUF", "compatibility": "FULL"}


def refusal(need: str, who: str) -> int | None:
    """The status the middleware refuses ``who`` with for a rule needing ``need`` (None: passes)."""
    if need == OPEN:
        return None
    if who == "anonymous":
        return 401
    if need == READ or who == "admin" or (need == WRITE and who == "writer"):
        return None
    return 403


def call(client: TestClient, method: str, path: str, who: str, **kw) -> object:  # type: ignore[no-untyped-def]
    headers = {} if who == "anonymous" else auth_headers(who)
    return client.request(method, path, headers={**headers, **kw.pop("headers", {})}, **kw)


def app_routes(app) -> list[tuple[str, str]]:  # type: ignore[no-untyped-def]
    out = []
    for r in app.routes:
        for m in sorted(getattr(r, "methods", None) or ()):
            if m != "HEAD":
                out.append((m, r.path))
    return out


# --------------------------------------------------------------------------- the table


def test_every_route_of_the_app_has_a_rule(registry: Registry, auth: HttpAuth) -> None:
    app = create_app(registry, auth=auth)
    routes = app_routes(app)
    assert len(routes) > 40 and any(isinstance(r, APIRoute) for r in app.routes)
    missing = [(m, p) for m, p in routes if explicit_rule(m, p) is None]
    assert missing == [], f"routes without an authorization rule in app/schema/authz.py RULES: {missing}"


@pytest.mark.parametrize("rule", RULES, ids=lambda r: f"{r.method} {r.path}")
def test_each_rule_is_the_one_its_paths_find(rule: Rule) -> None:
    """No rule shadows another: a concrete path of each template finds exactly that rule."""
    assert rule_for(rule.method, concrete(rule.path)) is rule
    if rule.method == "GET":
        assert rule_for("HEAD", concrete(rule.path)) is rule


def test_the_table_says_what_the_docs_say() -> None:
    """The policy itself, written out independently of the table (the role matrix only checks
    that the middleware enforces whatever the table says)."""
    by_need: dict[str, set[tuple[str, str]]] = {}
    for r in RULES:
        by_need.setdefault(r.need, set()).add((r.method, r.path))
    assert by_need[OPEN] == {("GET", "/healthz"), ("GET", "/readyz"), ("GET", "/metrics")}
    assert by_need[WRITE] == {("POST", "/subjects/{subject}/versions"), ("POST", "/v1/schemas"),
                              ("POST", "/v1/approvals"), ("POST", "/associations")}
    assert {(m, p) for m, p in by_need[ADMIN] if m in ("GET", "POST")} == {
        ("GET", "/v1/audit"), ("GET", "/v1/pii/audit"), ("POST", "/v1/approvals/{approval_id}/{decision}")}
    assert all(r.need == ADMIN for r in RULES if r.method in ("PUT", "DELETE"))  # config, mode, policies, deletes
    assert {r.method for r in RULES if r.need == READ} <= {"GET", "POST"}
    assert {r.path: r.subject_from for r in RULES if r.need == WRITE} == {
        "/subjects/{subject}/versions": "path", "/v1/schemas": "body.topic", "/v1/approvals": "body.subject",
        "/associations": "body.associations[].subject + body.resourceName"}
    # confluent-kafka's serializers and deserializers look associations up: a read, never admin
    assert {r.path for r in RULES if r.path.startswith("/associations") and r.method == "GET"} == {
        "/associations/subjects/{subject}", "/associations/resources/{resource_namespace}/{resource_name}",
        "/associations/resources/{resource_id}"}
    assert all(r.need == READ for r in RULES if r.path.startswith("/associations") and r.method == "GET")


def test_mode_and_unknown_routes() -> None:
    assert rule_for("GET", "/mode").need == READ and rule_for("GET", "/mode/orders.created").need == READ
    for m in ("PUT", "DELETE"):
        assert rule_for(m, "/mode").need == ADMIN and rule_for(m, "/mode/x").need == ADMIN
    for m, p in (("PUT", "/subjects"), ("GET", "/v2/anything"), ("OPTIONS", "/subjects"), ("GET", "/subjects/"),
                 ("POST", "/exporters"), ("GET", "/subjects/a/b/versions")):
        assert rule_for(m, p) is DEFAULT_RULE and DEFAULT_RULE.need == ADMIN


# --------------------------------------------------------------------------- the role matrix


@pytest.mark.parametrize("who", CLIENTS)
@pytest.mark.parametrize("rule", RULES, ids=lambda r: f"{r.method} {r.path}")
def test_role_matrix(rule: Rule, who: str, registry: Registry, auth: HttpAuth) -> None:
    client = TestClient(create_app(seeded(registry), auth=auth))
    r = call(client, rule.method, concrete(rule.path), who, json=body_for(rule))
    refused = refusal(rule.need, who)
    if refused is None:
        assert r.status_code not in (401, 403), (r.status_code, r.text)
        return
    assert r.status_code == refused, (r.status_code, r.text)
    body = r.json()
    assert r.headers["content-type"] == CT
    if r.status_code == 401:
        assert body["error_code"] == 40101 and r.headers["www-authenticate"] == \
            'Basic realm="prism-schema-registry", charset="UTF-8"'
    else:
        assert body["error_code"] == 40301 and "www-authenticate" not in r.headers
        assert f"user {who!r}" in body["message"] and rule.need in body["message"]


@pytest.mark.parametrize("rule", [r for r in RULES if r.need == READ], ids=lambda r: f"{r.method} {r.path}")
def test_allow_anonymous_read_opens_reads_only(rule: Rule, registry: Registry, users_file: Path) -> None:
    auth = auth_from_settings(users_file=users_file, jwt_config=None, allow_anonymous="read", realm="r", where="t")
    client = TestClient(create_app(seeded(registry), auth=auth))
    assert call(client, rule.method, concrete(rule.path), "anonymous", json=body_for(rule)).status_code \
        not in (401, 403)


def test_allow_anonymous_read_still_needs_credentials_to_write(registry: Registry, users_file: Path) -> None:
    auth = auth_from_settings(users_file=users_file, jwt_config=None, allow_anonymous="read", realm="r", where="t")
    client = TestClient(create_app(seeded(registry), auth=auth))
    r = client.post("/subjects/orders.created/versions", json={"schema": V2, "schemaType": "PROTOBUF"})
    assert r.status_code == 401 and r.json()["error_code"] == 40101 and "write" in r.json()["message"]
    assert client.delete("/subjects/orders.created").status_code == 401
    audit = registry.audit_log(None, 10)
    assert all(e["actor"] == "seed" for e in audit)  # nothing anonymous was written


def test_no_authentication_configured_is_a_start_up_error(registry: Registry, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    for var in ("PRISM_REGISTRY_USERS_FILE", "PRISM_REGISTRY_JWT_CONFIG", "PRISM_REGISTRY_ALLOW_ANONYMOUS"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(ConfigError, match="no authentication configured") as exc:
        create_app(registry)
    assert "--allow-anonymous read" in str(exc.value)


# --------------------------------------------------------------------------- attacks


@pytest.fixture
def client(registry: Registry, auth: HttpAuth) -> TestClient:
    return TestClient(create_app(seeded(registry), auth=auth))


def test_a_cross_site_page_cannot_approve_with_an_admins_cached_credentials(client: TestClient,
                                                                               registry: Registry) -> None:
    """An admin who opened ``/ui`` has basic credentials cached in the browser, which adds them to
    a cross-site form post (no CORS preflight, no body needed): ``POST /v1/approvals/1/approve``
    from another site's page approved a pending breaking change in the admin's name. Now any
    state-changing request a browser marks as coming from elsewhere is refused (403) before the
    credentials count; scripts (no ``Origin``) and same-origin pages are unaffected."""
    for hostile in ({"Origin": "https://evil.example", "Content-Type": "application/x-www-form-urlencoded"},
                    {"Origin": "null"}, {"Sec-Fetch-Site": "cross-site"},
                    {"Sec-Fetch-Site": "same-site", "Origin": "https://ui.example"}):
        r = call(client, "POST", "/v1/approvals/1/approve", "admin", headers=hostile)
        assert r.status_code == 403 and r.json()["error_code"] == 40301 and "refused" in r.json()["message"], (
            hostile, r.text)
        r = call(client, "POST", "/subjects/orders.created/versions", "admin", headers=hostile,
                 json={"schema": V2, "schemaType": "PROTOBUF"})
        assert r.status_code == 403, (hostile, r.text)
    assert [a.status for a in registry.store.approvals("orders.created")] == ["pending"]
    assert [v.version for v in registry.versions("orders.created")] == [1]
    # what a browser reads from anywhere and what a script or the registry's own page sends still works
    assert call(client, "GET", "/v1/approvals", "admin", headers={"Origin": "https://evil.example"}).status_code == 200
    r = call(client, "POST", "/v1/approvals/1/approve", "admin", headers={"Origin": "http://testserver"})
    assert r.status_code == 200 and r.json()["status"] == "approved", r.text


def test_spoofed_actor_header_is_ignored(client: TestClient, registry: Registry) -> None:
    r = client.post("/subjects/orders.created/versions", json={"schema": V2, "schemaType": "PROTOBUF"},
                    headers={**auth_headers("writer"), "X-Prism-Actor": "admin"})
    assert r.status_code == 200, r.text
    entry = registry.audit_log("orders.created", 1)[0]
    assert entry["actor"] == "writer" and entry["action"] == "register"
    # a basic-auth user name that does not verify is not an actor either
    forged = "Basic " + base64.b64encode(b"admin:").decode()
    r = client.put("/config", json={"compatibility": "NONE"}, headers={"Authorization": forged})
    assert r.status_code == 401 and registry.policy().compatibility.value == "BACKWARD"


def test_wrong_password_and_unknown_user(client: TestClient) -> None:
    for user, password in (("admin", "admin-password-2"), ("admin", ""), ("nobody", "x"), ("ADMIN", creds("admin")[1])):
        r = client.get("/subjects", auth=(user, password))
        assert r.status_code == 401 and r.json() == {
            "error_code": 40101, "message": "Unauthorized: invalid user name or password"}


@pytest.mark.parametrize("subject", ["orders-evil", "orders", "ORDERS.created", "orders\u2024created",
                                     ":.ctx:orders.created", "payments.orders.created", "%20orders.created"])
def test_prefix_escape_is_refused(client: TestClient, registry: Registry, subject: str) -> None:
    from urllib.parse import quote

    path = f"/subjects/{quote(subject, safe='%')}/versions"
    r = client.post(path, json={"schema": V1, "schemaType": "PROTOBUF"}, headers=auth_headers("writer"))
    assert r.status_code == 403 and r.json()["error_code"] == 40301, r.text
    r = client.post("/v1/schemas", json={"topic": subject, "schema": V1}, headers=auth_headers("writer"))
    assert r.status_code == 403, r.text
    r = client.post("/v1/approvals", json={"subject": subject, "schema": V1}, headers=auth_headers("writer"))
    assert r.status_code == 403, r.text
    assert registry.subjects() == ["orders.created"]


def test_the_encoded_slash_placeholder_is_the_services() -> None:
    from app.schema import authz, service

    assert (authz._ENCODED_SLASH, authz._ENCODED_SLASH_KEY) == (service._SLASH, service._ENCODED_SLASH_KEY)


@pytest.mark.parametrize(("path", "subject"), [
    ("/subjects/orders.%2F..%2Fpayments.x/versions", "orders./../payments.x"),
    ("/subjects/orders.%2Fx/versions", "orders./x"),
    ("/subjects/orders.a%2fb/versions", "orders.a/b"),
])
def test_an_encoded_slash_stays_inside_the_subject(client: TestClient, registry: Registry, path: str,
                                                   subject: str) -> None:
    """Subjects may hold '/' (protobuf imports are registered under their file name): the
    check sees the same subject the route registers, and '..' in it is just characters."""
    r = client.post(path, json={"schema": V1, "schemaType": "PROTOBUF"}, headers=auth_headers("writer"))
    assert r.status_code == 200, r.text
    assert sorted(registry.subjects()) == sorted(["orders.created", subject])


@pytest.mark.parametrize("path", [
    "/subjects/payments.x%2Forders./versions",
    "/subjects/%2Forders.x/versions",
    "/subjects/..%2Forders.x/versions",
])
def test_an_encoded_slash_cannot_borrow_a_prefix(client: TestClient, registry: Registry, path: str) -> None:
    r = client.post(path, json={"schema": V1, "schemaType": "PROTOBUF"}, headers=auth_headers("writer"))
    assert r.status_code == 403, r.text
    assert registry.subjects() == ["orders.created"]


@pytest.mark.parametrize("path", [
    "/subjects/orders.created/../../config/versions",   # dot segments (normalized by the client or not)
    "/subjects//versions",
    "/subjects/orders.x/versions/extra/segments",
])
def test_paths_the_router_would_not_send_to_a_route_need_admin(client: TestClient, registry: Registry,
                                                               path: str) -> None:
    """The rule is looked up on the same path the router matches, so a path that the router
    would not send to the register route is not authorized as one either (it needs admin)."""
    r = client.post(path, json={"schema": V1, "schemaType": "PROTOBUF"}, headers=auth_headers("writer"))
    assert r.status_code == 403, (path, r.status_code, r.text)
    # and the admin gets the router's answer (no route), not a registration somewhere else
    assert client.post(path, json={"schema": V1, "schemaType": "PROTOBUF"},
                       headers=auth_headers("admin")).status_code in (404, 405)
    assert registry.subjects() == ["orders.created"]


def test_probes_and_metrics_are_open_and_show_no_data(client: TestClient) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}
    assert client.get("/readyz").json() == {"status": "ok"}
    assert client.get("/healthz", headers={"Authorization": "Basic !!!"}).status_code == 200  # not even parsed
    text = client.get("/metrics").text
    assert "prism_schema_registry_requests_total" in text and "orders.created" not in text


def test_a_subject_with_odd_characters_under_the_prefix_is_still_under_it(client: TestClient,
                                                                            registry: Registry) -> None:
    r = client.post("/subjects/orders...%20x/versions", json={"schema": V1, "schemaType": "PROTOBUF"},
                    headers=auth_headers("writer"))
    assert r.status_code == 200 and "orders... x" in registry.subjects()


def test_body_subject_is_the_validated_one(client: TestClient, registry: Registry) -> None:
    """The subject is checked on the validated model the handler receives: a duplicated key
    (which parsers disagree about) is refused outright, and a body that does not validate is
    422 for everyone - no subject was decided, nothing written
    (more in test_authz_one_reading.py)."""
    w = {**auth_headers("writer"), "Content-Type": "application/json"}
    schema = json.dumps(V1)
    for sneaky in ('{"topic": "orders.x", "topic": "payments.x", "schema": ' + schema + "}",
                   '{"topic": "payments.x", "topic": "orders.x", "schema": ' + schema + "}"):
        r = client.post("/v1/schemas", content=sneaky, headers=w)
        assert r.status_code == 422 and "duplicate key 'topic'" in r.json()["message"], r.text
    assert client.post("/v1/schemas", content='{"topic": "payments.x", "schema": ' + schema + "}",
                       headers=w).status_code == 403
    r = client.post("/v1/schemas", content='{"topic": "orders.x", "schema": ' + schema + "}", headers=w)
    assert r.status_code == 200 and r.json()["subject"] == "orders.x"
    for bad in ('{"topic": ["orders.x"], "schema": "x"}', "not json", '{"schema": "x"}', '{"topic": null}'):
        for who in ("writer", "admin"):
            r = client.post("/v1/schemas", content=bad, headers={**w, **auth_headers(who)})
            assert r.status_code == 422, (who, bad, r.text)
    assert client.post("/v1/schemas", content=bad, headers={"Content-Type": "application/json",
                                                            **auth_headers("reader")}).status_code == 403
    assert sorted(registry.subjects()) == ["orders.created", "orders.x"]


def test_a_writer_cannot_change_policy_through_registration_metadata(client: TestClient, registry: Registry) -> None:
    body = {"topic": "orders.created", "schema": V2, "metadata": {"compatibility_mode": "NONE"}}
    r = client.post("/v1/schemas", json=body, headers=auth_headers("writer"))
    assert r.status_code == 403 and "admin" in r.json()["message"]
    assert registry.subject_config("orders.created") is None
    assert client.post("/v1/schemas", json={**body, "dry_run": True}, headers=auth_headers("writer")).status_code == 200
    assert client.post("/v1/schemas", json=body, headers=auth_headers("admin")).status_code == 200
    assert registry.subject_config("orders.created") == "NONE"


def test_approvals_requested_by_writers_decided_by_admins(client: TestClient, registry: Registry) -> None:
    r = client.post("/v1/approvals", json={"subject": "orders.created", "schema": V2}, headers=auth_headers("writer"))
    assert r.status_code == 200 and r.json()["requested_by"] == "writer"
    aid = r.json()["id"]
    assert client.post(f"/v1/approvals/{aid}/approve", headers=auth_headers("writer")).status_code == 403
    ok = client.post(f"/v1/approvals/{aid}/approve", headers=auth_headers("admin"))
    assert ok.status_code == 200 and ok.json()["decided_by"] == "admin"


def test_the_fast_read_cache_does_not_bypass_authentication(client: TestClient) -> None:
    for path in ("/schemas/ids/1", "/subjects/orders.created/versions/latest"):
        assert client.get(path, headers=auth_headers("reader")).status_code == 200
        assert client.get(path, headers=auth_headers("reader")).status_code == 200  # now served from the cache
        assert client.get(path).status_code == 401
        assert client.get(path, auth=("reader", "wrong")).status_code == 401


def test_refusals_are_counted_in_metrics(client: TestClient) -> None:
    client.get("/subjects")
    text = client.get("/metrics", headers=auth_headers("reader")).text
    assert re.search(r'requests_total\{method="GET",route="[^"]*",status="401"\} 1\.0', text), text


# --------------------------------------------------------------------------- bearer JWTs

ISS, AUD = "https://idp.example", "prism-registry"


class Idp:
    """An identity provider: an RSA signing key whose public half is in the registry's JWKS."""

    def __init__(self, tmp: Path, *, role_map: dict | None = None) -> None:
        self.key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.other = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        jwk = {**json.loads(RSAAlgorithm.to_jwk(self.key.public_key())), "kid": "reg-1", "use": "sig"}
        (tmp / "jwks.json").write_text(json.dumps({"keys": [jwk]}))
        conf = {"jwks_file": "jwks.json", "issuers": [ISS], "audience": AUD, "roles_claim": "roles",
                "claims": {"publisher_id": "sub"}}
        if role_map:
            conf["role_map"] = role_map
        self.config = tmp / "jwt.yaml"
        self.config.write_text(json.dumps(conf))

    def token(self, roles: object = ("read",), *, key: object = None, exp_in: float = 300, **claims: object) -> str:
        now = time.time()
        body = {"iss": ISS, "aud": AUD, "sub": "ci-bot", "iat": int(now), "exp": int(now + exp_in), "roles": roles,
                **claims}
        return jwt.encode(body, key or self.key, algorithm="RS256", headers={"kid": "reg-1"})

    def public_pem(self) -> bytes:
        return self.key.public_key().public_bytes(serialization.Encoding.PEM,
                                                  serialization.PublicFormat.SubjectPublicKeyInfo)


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


@pytest.fixture(scope="module")
def idp(tmp_path_factory: pytest.TempPathFactory) -> Idp:
    return Idp(tmp_path_factory.mktemp("idp"))


@pytest.fixture
def jwt_client(registry: Registry, idp: Idp, users_file: Path) -> TestClient:
    auth = auth_from_settings(users_file=users_file, jwt_config=idp.config, allow_anonymous=None,
                              realm="prism-schema-registry", where="t")
    return TestClient(create_app(seeded(registry), auth=auth))


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_bearer_roles_from_the_token(jwt_client: TestClient, idp: Idp, registry: Registry) -> None:
    assert jwt_client.get("/subjects", headers=bearer(idp.token(["read"]))).json() == ["orders.created"]
    r = jwt_client.post("/subjects/orders.created/versions", json={"schema": V2, "schemaType": "PROTOBUF"},
                        headers=bearer(idp.token(["read"])))
    assert r.status_code == 403 and "'ci-bot'" in r.json()["message"]
    r = jwt_client.post("/subjects/orders.created/versions", json={"schema": V2, "schemaType": "PROTOBUF"},
                        headers=bearer(idp.token("read write:orders.")))  # a space-separated string, like scope
    assert r.status_code == 200
    assert registry.audit_log("orders.created", 1)[0]["actor"] == "ci-bot"
    assert jwt_client.get("/subjects", headers=bearer(idp.token(["superuser", 7]))).status_code == 403  # no role
    assert jwt_client.get("/subjects", headers=bearer(idp.token(None))).status_code == 403
    # both schemes are offered on a 401
    r = jwt_client.get("/subjects")
    assert r.headers.get_list("www-authenticate") == ['Basic realm="prism-schema-registry", charset="UTF-8"',
                                                      'Bearer realm="prism-schema-registry"']
    assert jwt_client.get("/subjects", auth=creds("reader")).status_code == 200  # basic still works


def test_role_map_translates_groups(registry: Registry, tmp_path: Path) -> None:
    idp = Idp(tmp_path, role_map={"schema-admins": "admin", "orders-team": ["write:orders."]})
    client = TestClient(create_app(seeded(registry), auth=HttpAuth(bearer=BearerAuth.from_file(idp.config))))
    assert client.put("/config", json={"compatibility": "FULL"},
                      headers=bearer(idp.token(["schema-admins"]))).status_code == 200
    assert client.put("/config", json={"compatibility": "FULL"},
                      headers=bearer(idp.token(["orders-team"]))).status_code == 403
    # with a role_map, literal role names in the token mean nothing
    assert client.put("/config", json={"compatibility": "FULL"}, headers=bearer(idp.token(["admin"]))).status_code \
        == 403


def _unsigned(header: dict, claims: dict, signature: bytes = b"") -> str:
    h, c = b64url(json.dumps(header).encode()), b64url(json.dumps(claims).encode())
    return f"{h}.{c}.{b64url(signature)}"


def test_jwt_attacks_are_401(jwt_client: TestClient, idp: Idp, registry: Registry) -> None:
    now = int(time.time())
    claims = {"iss": ISS, "aud": AUD, "sub": "mallory", "exp": now + 300, "roles": ["admin"]}
    h = {"alg": "HS256", "typ": "JWT", "kid": "reg-1"}
    signing_input = f"{b64url(json.dumps(h).encode())}.{b64url(json.dumps(claims).encode())}".encode()
    hs_with_public_key = signing_input.decode() + "." + b64url(
        hmac.new(idp.public_pem(), signing_input, hashlib.sha256).digest())
    attacks = {
        "forged (another key, same kid)": (idp.token(["admin"], key=idp.other), "signature does not verify"),
        "expired": (idp.token(["admin"], exp_in=-3600), "token expired"),
        "alg none": (_unsigned({"alg": "none", "kid": "reg-1"}, claims), "alg 'none'"),
        "HS256 with the RSA public key": (hs_with_public_key, "algorithm"),
        "wrong audience": (idp.token(["admin"], aud="other-service"), "audience"),
        "unknown kid": (jwt.encode(claims, idp.key, algorithm="RS256", headers={"kid": "reg-9"}), "not in the JWKS"),
        "tampered claims": (idp.token(["read"]).split(".")[0] + "." + b64url(json.dumps(claims).encode()) + "."
                            + idp.token(["read"]).split(".")[2], "signature"),
        "garbage": ("not-a-jwt", "dot-separated"),
    }
    for name, (token, says) in attacks.items():
        r = jwt_client.put("/config", json={"compatibility": "NONE"}, headers=bearer(token))
        assert r.status_code == 401, (name, r.status_code, r.text)
        body = r.json()
        assert body["error_code"] == 40101 and says in body["message"], (name, body)
        assert token not in body["message"]
    assert registry.policy().compatibility.value == "BACKWARD"


def test_an_address_over_the_failure_limit_gets_429_with_retry_after(registry: Registry, users_file: Path,
                                                                     monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Password guessing over HTTP: after the limit, every request for that name from that
    address - the right password included - gets Confluent-style 429 before any hash is
    checked; another user of the same address, and another address, are unaffected."""
    monkeypatch.setenv("PRISM_AUTH_MAX_FAILURES", "3")
    auth = auth_from_settings(users_file=users_file, jwt_config=None, allow_anonymous=None,
                              realm="prism-schema-registry", where="tests")
    app = create_app(seeded(registry), auth=auth)
    attacker, other = TestClient(app, client=("203.0.113.9", 40000)), TestClient(app, client=("198.51.100.7", 40000))
    for guess in ("a", "b", "c"):
        assert attacker.get("/subjects", auth=("admin", guess)).status_code == 401
    for headers in (auth_headers("admin"), {"Authorization": "Basic " + base64.b64encode(b"admin:d").decode()}):
        r = attacker.get("/subjects", headers=headers)
        assert r.status_code == 429, r.text
        assert r.json()["error_code"] == 42901 and "too many failed authentication attempts" in r.json()["message"]
        assert 1 <= int(r.headers["retry-after"]) <= 60
    assert attacker.get("/healthz").status_code == 200  # open routes take no credentials: not limited
    assert other.get("/subjects", headers=auth_headers("admin")).status_code == 200
    assert attacker.get("/subjects", headers=auth_headers("reader")).status_code == 200  # issue 28

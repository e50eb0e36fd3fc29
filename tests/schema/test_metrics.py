"""Registry ``/metrics``: drive the app, scrape, parse with prometheus_client's own text parser,
and check that the numbers add up to what was done. Runs on SQLite and PostgreSQL."""

from __future__ import annotations

from collections import defaultdict

from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from app.schema.metrics import CONTENT_TYPE
from app.schema.registry import Registry
from app.schema.service import create_app
from app.security.http_auth import HttpAuth
from tests.support import auth_headers

V1 = 'syntax = "proto3";\nmessage OrderCreated { string order_id = 1; double total = 3; }\n'
V2 = V1.replace("double total = 3;", "double total = 3; optional double tax_amount = 4;")
V3 = V2.replace("optional double tax_amount = 4;", "optional double tax_amount = 4; string payment_method = 5;")
PII_UNTAGGED = 'syntax = "proto3";\nmessage User { string user_id = 1; string email = 2; }\n'
P = "prism_schema_registry_"


def scrape(client: TestClient) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """sample name -> {sorted label items -> value}, via prometheus_client's parser."""
    r = client.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"] == CONTENT_TYPE
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = defaultdict(dict)
    for fam in text_string_to_metric_families(r.text):
        for s in fam.samples:
            out[s.name][tuple(sorted(s.labels.items()))] = s.value
    return out


def val(m: dict, name: str, **labels: str) -> float:
    return m[P + name].get(tuple(sorted(labels.items())), 0.0)


def test_metrics_add_up(registry: Registry, auth: HttpAuth) -> None:
    client = TestClient(create_app(registry, auth=auth), headers=auth_headers("admin"))
    sent: list[tuple[str, str, int]] = []  # (route template, method, status) of every request before the scrape

    def call(method: str, path: str, template: str, **kw) -> object:  # type: ignore[no-untyped-def]
        r = client.request(method, path, **kw)
        sent.append((template, method, r.status_code))
        return r

    reg_t = "/v1/schemas"
    body = {"topic": "orders.created", "format": "protobuf"}
    assert call("POST", reg_t, reg_t, json={**body, "schema": V1}).status_code == 200          # created
    assert call("POST", reg_t, reg_t, json={**body, "schema": V1}).json()["created"] is False  # idempotent
    assert call("POST", reg_t, reg_t, json={**body, "schema": V3}).status_code == 409          # incompatible
    assert call("POST", reg_t, reg_t, json={**body, "schema": "message {"}).status_code == 422  # unparsable
    assert call("PUT", "/v1/policies/users", "/v1/policies/{namespace}",
                json={"pii_policy": "enforce"}).status_code == 200
    assert call("POST", reg_t, reg_t, json={"topic": "users.profile", "namespace": "users", "format": "protobuf",
                                             "schema": PII_UNTAGGED}).status_code == 422      # PII rejection
    compat_t = "/compatibility/subjects/{subject}/versions"
    assert call("POST", "/compatibility/subjects/orders.created/versions", compat_t,
                json={"schema": V2, "schemaType": "PROTOBUF"}).json() == {"is_compatible": True}
    sid = client.get("/v1/subjects/orders.created/versions/1").json()["id"]
    sent.append(("/v1/subjects/{subject}/versions/{version}", "GET", 200))

    before = scrape(client)
    sent.append(("/metrics", "GET", 200))
    ids_t = "/schemas/ids/{schema_id}"
    for _ in range(3):
        assert call("GET", f"/schemas/ids/{sid}", ids_t).status_code == 200
    assert call("GET", "/schemas/ids/99999", ids_t).status_code == 404
    assert call("GET", "/no/such/route", "__unmatched__").status_code == 404
    after = scrape(client)

    # requests: one series per (route template, method, status), and they sum to what was sent
    expected: dict[tuple[str, str, int], int] = defaultdict(int)
    for key in sent:
        expected[key] += 1
    for (route, method, status), n in expected.items():
        assert val(after, "requests_total", route=route, method=method, status=str(status)) == n, (route, status)
    assert sum(after[P + "requests_total"].values()) == len(sent)
    routes = {dict(k)["route"] for k in after[P + "requests_total"]}
    assert not any(r.startswith("/schemas/ids/") and "{" not in r for r in routes), routes  # no raw paths
    # latency histogram: count per route = requests on that route, across statuses
    assert val(after, "request_duration_seconds_count", route=ids_t, method="GET") == 4
    assert val(after, "request_duration_seconds_bucket", route=ids_t, method="GET", le="+Inf") == 4

    # compatibility verdicts: the created register, the rejected V3 register, the explicit check
    assert val(after, "compatibility_checks_total", format="PROTOBUF", mode="BACKWARD", verdict="compatible") == 2
    assert val(after, "compatibility_checks_total", format="PROTOBUF", mode="BACKWARD", verdict="incompatible") == 1
    # failures by reason, PII rejections, registrations
    assert val(after, "validation_failures_total", operation="register", reason="incompatible") == 1
    assert val(after, "validation_failures_total", operation="register", reason="invalid_schema") == 1
    assert val(after, "validation_failures_total", operation="register", reason="pii_untagged") == 1
    assert val(after, "pii_rejections_total", pii_policy="enforce") == 1
    assert val(after, "registrations_total", result="created") == 1
    assert val(after, "registrations_total", result="idempotent") == 1

    # cache: the first GET by id missed the response cache and found the schema row cached
    # (registration read it); the next two were response-cache hits; the missing id missed
    # both. The ratio gauge is hits / lookups over all caches.
    def delta(cache: str, result: str) -> float:
        return val(after, "cache_lookups_total", cache=cache, result=result) - \
            val(before, "cache_lookups_total", cache=cache, result=result)

    assert (delta("response", "hit"), delta("response", "miss")) == (2, 2)
    assert (delta("schema", "hit"), delta("schema", "miss")) == (1, 1)
    hits = sum(v for k, v in after[P + "cache_lookups_total"].items() if dict(k)["result"] == "hit")
    total = sum(after[P + "cache_lookups_total"].values())
    assert val(after, "cache_hit_ratio") == hits / total


def test_metrics_in_openapi_as_text(registry: Registry, auth: HttpAuth) -> None:
    """/metrics is published in the OpenAPI document (as text/plain, not JSON), /ui is not."""
    doc = TestClient(create_app(registry, auth=auth), headers=auth_headers("reader")).get("/openapi.json").json()
    op = doc["paths"]["/metrics"]["get"]
    assert list(op["responses"]["200"]["content"]) == [CONTENT_TYPE]
    assert "/ui" not in doc["paths"]

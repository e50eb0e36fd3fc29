"""The pre-serialized fast path for GET by id / subject version: same bytes as the FastAPI
routes (reached with a query parameter, which bypasses the fast path), and never stale after
register or delete. Runs on SQLite and PostgreSQL."""

from __future__ import annotations

from fastapi.testclient import TestClient

from app.schema.registry import Registry
from app.schema.service import create_app
from app.security.http_auth import HttpAuth
from tests.support import auth_headers

V1 = '{"type": "record", "name": "R", "fields": [{"name": "a", "type": "string"}]}'
V2 = '{"type": "record", "name": "R", "fields": [{"name": "a", "type": "string"}, ' \
     '{"name": "b", "type": "string", "default": ""}]}'


def post(client: TestClient, schema: str) -> dict:
    r = client.post("/subjects/s1/versions", json={"schema": schema})
    assert r.status_code == 200, r.text
    return r.json()


def same(client: TestClient, path: str, slow_query: str) -> object:
    """GET via the fast path (twice: miss then hit) and via the route; all three identical."""
    fast1, fast2, slow = client.get(path), client.get(path), client.get(f"{path}?{slow_query}")
    for r in (fast2, slow):
        assert (r.status_code, r.content, r.headers["content-type"]) == \
            (fast1.status_code, fast1.content, fast1.headers["content-type"]), (path, r.content, fast1.content)
    return fast1


def test_fast_reads_match_routes_and_follow_writes(registry: Registry, auth: HttpAuth) -> None:
    client = TestClient(create_app(registry, auth=auth), headers=auth_headers("admin"))
    id1 = post(client, V1)["id"]
    assert same(client, f"/schemas/ids/{id1}", "subject=s1").json() == {"schema": V1}
    assert same(client, "/subjects/s1/versions/latest", "deleted=false").json()["version"] == 1
    assert "/subjects/s1/versions/latest" in registry.response_cache

    id2 = post(client, V2)["id"]  # register clears the cache: latest moves to 2
    assert same(client, "/subjects/s1/versions/latest", "deleted=false").json() == {
        "subject": "s1", "version": 2, "id": id2, "schema": V2}
    assert same(client, "/subjects/s1/versions/-1", "deleted=false").json()["version"] == 2
    assert same(client, "/subjects/s1/versions/2", "deleted=false").json()["id"] == id2

    assert client.delete("/subjects/s1/versions/2").status_code == 200  # delete clears it too
    gone = same(client, "/subjects/s1/versions/2", "deleted=false")
    assert gone.status_code == 404 and gone.json()["error_code"] == 40402
    assert same(client, "/subjects/s1/versions/latest", "deleted=false").json()["version"] == 1
    assert same(client, f"/schemas/ids/{id2}", "subject=s1").json() == {"schema": V2}  # ids stay readable
    missing = same(client, "/schemas/ids/424242", "subject=s1")
    assert missing.status_code == 404 and missing.json()["error_code"] == 40403
    assert same(client, "/subjects/nope/versions/1", "deleted=false").json()["error_code"] == 40401


def test_a_body_computed_before_a_write_is_not_kept(registry: Registry) -> None:
    registry.register("s1", V1, "AVRO")
    gen = registry.cache_generation
    registry.register("s1", V2, "AVRO")  # a write between the read and the store
    assert registry.cache_response("/subjects/s1/versions/latest", gen, b"stale") is False
    assert "/subjects/s1/versions/latest" not in registry.response_cache
    assert registry.cache_response("/subjects/s1/versions/latest", registry.cache_generation, b"ok") is True

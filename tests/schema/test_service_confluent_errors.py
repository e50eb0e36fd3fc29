"""Every error a Confluent client can meet on the Confluent routes has Confluent's body,
``{"error_code": <int>, "message": <str>}``, the right HTTP status and the Confluent
content type - including paths and methods that do not exist (Confluent's Jetty answers
them with ``error_code`` 404 / 405). Real uvicorn server, SQLite and PostgreSQL."""

from __future__ import annotations

import httpx
import pytest

from app.untrusted_json import DEFAULT_MAX_DEPTH
from tests.support import creds

CT = "application/vnd.schemaregistry.v1+json"
AVRO = '{"type":"record","name":"R","fields":[{"name":"a","type":"int"}]}'
AVRO_OTHER = '{"type":"record","name":"R","fields":[{"name":"b","type":"string"}]}'


def _deep_avro(levels: int) -> str:
    """An Avro array of arrays: JSON nested `levels` deep."""
    return '{"type":"array","items":' * levels + '"int"' + "}" * levels


def _deep_json_schema(levels: int) -> str:
    return '{"type":"array","items":' * levels + '{"type":"integer"}' + "}" * levels

# (method, path, json body or None, expected HTTP status, expected error_code)
CASES = [
    ("GET", "/no/such/route", None, 404, 404),
    ("GET", "/subjects/s-value/nope", None, 404, 404),
    ("DELETE", "/schemas/types", None, 405, 405),
    ("PUT", "/subjects", None, 405, 405),
    ("PATCH", "/subjects/s-value/versions", None, 405, 405),
    ("GET", "/subjects/missing/versions", None, 404, 40401),
    ("GET", "/subjects/missing/versions/1", None, 404, 40401),
    ("GET", "/subjects/missing/versions/latest", None, 404, 40401),
    ("GET", "/subjects/s-value/versions/9", None, 404, 40402),
    ("GET", "/subjects/s-value/versions/abc", None, 422, 42202),
    ("GET", "/subjects/s-value/versions/0", None, 422, 42202),
    ("GET", "/subjects/s-value/versions/9?deleted=true", None, 404, 40402),
    ("GET", "/subjects/missing/versions/1/schema", None, 404, 40401),
    ("GET", "/subjects/s-value/versions/9/schema", None, 404, 40402),
    ("GET", "/subjects/s-value/versions/9/referencedby", None, 404, 40402),
    ("GET", "/subjects/missing/versions/1/referencedby", None, 404, 40401),
    ("POST", "/subjects/missing", {"schema": AVRO}, 404, 40401),
    ("POST", "/subjects/s-value", {"schema": AVRO_OTHER}, 404, 40403),
    ("POST", "/subjects/s-value", {"schema": "{not json"}, 422, 42201),
    ("POST", "/subjects/s-value/versions", {"schema": "{not json"}, 422, 42201),
    ("POST", "/subjects/s-value/versions", {"schema": AVRO, "schemaType": "XML"}, 422, 42201),
    ("POST", "/subjects/s-value/versions", {"schemaType": "AVRO"}, 422, 42201),
    ("POST", "/subjects/s-value/versions", {"schema": 'syntax = "proto3"; message {', "schemaType": "PROTOBUF"},
     422, 42201),
    ("DELETE", "/subjects/missing", None, 404, 40401),
    ("DELETE", "/subjects/missing/versions/1", None, 404, 40401),
    ("DELETE", "/subjects/s-value/versions/9", None, 404, 40402),
    ("DELETE", "/subjects/s-value/versions/abc", None, 422, 42202),
    ("DELETE", "/subjects/s-value/versions/1?permanent=true", None, 404, 40407),
    ("DELETE", "/subjects/s-value?permanent=true", None, 404, 40405),
    ("GET", "/schemas/ids/999999", None, 404, 40403),
    ("GET", "/schemas/ids/999999/versions", None, 404, 40403),
    # found by tests/security/test_api_fuzz.py: an id past SQLite's integers was a 500
    ("GET", "/schemas/ids/99999999999999999999/versions", None, 404, 40403),
    ("GET", "/schemas/ids/99999999999999999999", None, 404, 40403),
    ("GET", "/schemas/ids/-1/versions", None, 404, 40403),
    ("GET", "/v1/audit?limit=99999999999999999999", None, 422, 42201),
    ("GET", "/v1/audit?limit=-1", None, 422, 42201),
    ("GET", "/config/s-value", None, 404, 40408),
    ("DELETE", "/config/s-value", None, 404, 40408),
    ("PUT", "/config", {"compatibility": "SIDEWAYS"}, 422, 42203),
    ("PUT", "/config/s-value", {"compatibility": "SIDEWAYS"}, 422, 42203),
    ("POST", "/compatibility/subjects/missing/versions/1", {"schema": AVRO}, 404, 40401),
    ("POST", "/compatibility/subjects/s-value/versions/9", {"schema": AVRO}, 404, 40402),
    ("POST", "/compatibility/subjects/s-value/versions/abc", {"schema": AVRO}, 422, 42202),
    ("POST", "/compatibility/subjects/s-value/versions/latest", {"schema": "nope"}, 422, 42201),
    ("POST", "/compatibility/subjects/s-value/versions", {"schema": "nope"}, 422, 42201),
    ("GET", "/mode/s-value", None, 404, 40409),
    ("DELETE", "/mode/s-value", None, 404, 40409),
    ("PUT", "/mode", {"mode": "SIDEWAYS"}, 422, 42204),
    ("PUT", "/mode/s-value", {"mode": "SIDEWAYS"}, 422, 42204),
    ("PUT", "/mode/s-value", {"mode": "IMPORT"}, 422, 42205),
    ("POST", "/mode", None, 405, 405),
    ("GET", "/schemas/ids/1%2F2", None, 422, 42201),
    # issue 28: schemas nested 3,000 levels were a 500 "Error in the backend data store" (Protobuf a 422)
    ("POST", "/subjects/deep-value/versions", {"schema": _deep_avro(3_000)}, 422, 42201),
    ("POST", "/subjects/deep-value/versions", {"schema": _deep_json_schema(3_000), "schemaType": "JSON"}, 422, 42201),
    ("POST", "/subjects/deep-value/versions", {"schema": "[" * 200_000 + "]" * 200_000}, 422, 42201),
    ("POST", "/compatibility/subjects/s-value/versions/latest", {"schema": _deep_avro(3_000)}, 422, 42201),
    ("POST", "/subjects/s-value", {"schema": _deep_avro(3_000)}, 422, 42201),
]


@pytest.fixture
def client(live_server) -> httpx.Client:  # type: ignore[no-untyped-def]
    with httpx.Client(base_url=live_server.url, headers={"Content-Type": CT}, auth=creds("admin")) as h:
        assert h.post("/subjects/s-value/versions", json={"schema": AVRO}).status_code == 200
        yield h


def test_every_confluent_error_has_confluent_body(client: httpx.Client) -> None:
    failures = []
    for method, path, body, status, code in CASES:
        r = client.request(method, path, json=body)
        try:
            got = r.json()
        except ValueError:
            got = r.text
        ok = (r.status_code == status and isinstance(got, dict) and got.get("error_code") == code
              and isinstance(got.get("message"), str) and got["message"]
              and r.headers["content-type"].startswith(CT) and set(got) <= {"error_code", "message", "findings"})
        if not ok:
            failures.append(f"{method} {path}: {r.status_code} {got!r} (wanted {status}/{code})")
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("levels", [DEFAULT_MAX_DEPTH - 2, DEFAULT_MAX_DEPTH - 1, DEFAULT_MAX_DEPTH,
                                    DEFAULT_MAX_DEPTH + 1])
def test_schemas_at_and_past_the_depth_limit_are_never_a_500(client: httpx.Client, levels: int) -> None:
    """Avro and JSON Schema at the decoder's depth limit must compile without meeting the
    recursion limit anywhere (compiler, compatibility check, PII scan, canonical form); one
    level past it they are a 422."""
    for subject, body, depth in (
            (f"avro{levels}-value", {"schema": _deep_avro(levels)}, levels),
            (f"json{levels}-value", {"schema": _deep_json_schema(levels), "schemaType": "JSON"}, levels + 1)):
        r = client.post(f"/subjects/{subject}/versions", json=body)
        assert r.status_code == (200 if depth <= DEFAULT_MAX_DEPTH else 422), (subject, r.status_code, r.text[:300])
        if r.status_code == 200:
            assert client.get(f"/subjects/{subject}/versions/1").status_code == 200
            assert client.post(f"/compatibility/subjects/{subject}/versions/latest", json=body).status_code == 200
            assert client.post(f"/subjects/{subject}", json=body).status_code == 200
        else:
            assert "nested too deeply" in r.json()["message"]


def test_a_request_body_nested_past_the_depth_limit_is_a_422(client: httpx.Client) -> None:
    r = client.post("/subjects/s-value/versions", content=b'{"schema":' + b"[" * 100_000 + b"]" * 100_000 + b"}")
    assert r.status_code == 422 and r.json()["error_code"] == 42201 and "nested too deeply" in r.json()["message"]


def test_unknown_route_and_method_messages_name_the_request(client: httpx.Client) -> None:
    r = client.get("/no/such/route")
    assert r.json()["message"] == "HTTP 404 Not Found: GET /no/such/route"
    r = client.delete("/schemas/types")
    assert r.json()["message"] == "HTTP 405 Method Not Allowed: DELETE /schemas/types"
    assert r.headers["allow"] == "GET"

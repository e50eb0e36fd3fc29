"""Schema-driven fuzzing of the console (issue 28) from the OpenAPI document it serves
(``GET /openapi.json``, app/console/web.py), with every back end real and up: the embedded
broker with one DLQ record of every kind (tests/console/record_kinds.py) and two forged ledger
records, a worker running the pipeline (its management API tells the console the pipeline), and
a seeded schema registry.

Each role is fuzzed: an admin through a log-in session (cookie, the session's CSRF token and the
console's own Origin - so replays really run), a reader and a writer through HTTP basic, and a
stranger (a wrong password: the guard's JSON 401). Each in two passes: *known*, where path parameters are drawn from what exists (the
pipeline, its source, the DLQ records' refs, the subjects) so requests reach the pages behind
them, and *hostile*, where everything is generated. Every answer must be below 500 (the back ends
are up: a 502 would be a bug too), carry no traceback, and conform to the document: a declared
status, the declared content type and, for JSON, the declared schema."""

from __future__ import annotations

import asyncio
import copy
import re
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from app.broker.admin import ensure_topics
from app.broker.embedded import EmbeddedBroker, find_free_port
from app.cli.dlq import ledger_topic
from app.console import create_app
from app.observability.metrics import PipelineMetrics
from app.schema.service import create_app as registry_app
from app.security.devkeys import DevKeys
from app.security.http_auth import basic_header
from app.worker.dlq_overflow import build_overflow
from app.worker.management import ManagementSettings
from app.worker.observe import Observer
from tests.cli.test_dlq_cli import _seed
from tests.cli.test_dlq_ledger import _write_ledger
from tests.console.record_kinds import every_kind
from tests.console.support import BACKWARD_SUBJECT, FULL_SUBJECT, console_settings, make_auth, seeded_registry, serve
from tests.support import ADMIN_CLEARED, USERS, auth_headers, write_users_file
from tests.worker.conftest import make_topology
from tests.worker.harness import RunningPipeline

#: a wrong password for a real user
STRANGER = ("reader", "not-the-password")
CHECKS = [status_code_conformance, content_type_conformance, response_schema_conformance]
#: generated requests per operation and pass (derandomized: the same requests every run)
EXAMPLES = 8
#: what a Python traceback or a server's debug page leaves in a body
TRACEBACK = re.compile(r"Traceback \(most recent call last\)|File \"[^\"]+\.py\", line \d+")


def _known(document: dict[str, Any], values: dict[str, list[str]]) -> dict[str, Any]:
    """The document with each path parameter (and the replay form's `csrf`) drawn only from
    `values`: requests that reach real pipelines, records and subjects."""
    doc = copy.deepcopy(document)
    doc["paths"].pop("/logout")  # it would end the session the rest of the pass fuzzes with
    for ops in doc["paths"].values():
        for op in ops.values():
            for param in op.get("parameters", []):
                if param["in"] == "path" and param["name"] in values:
                    param["schema"] = {"type": "string", "enum": values[param["name"]]}
                if param["in"] == "query" and param["name"] in ("source", "topic"):
                    param["schema"] = {"type": "string", "enum": values["source"]}
            body = op.get("requestBody", {}).get("content", {}).get("application/x-www-form-urlencoded")
            if body is not None and "csrf" in body["schema"]["properties"] and values.get("csrf"):
                body["schema"]["properties"]["csrf"] = {"type": "string", "enum": values["csrf"]}
    return doc


def _fuzz(base_url: str, document: dict[str, Any], headers: dict[str, str], label: str,
          seen: Counter[tuple[str, str, int]]) -> list[str]:
    """Every operation, `EXAMPLES` requests each; the failures, one line each. `seen` counts
    (pass, operation, status) of every answer."""
    schema = schemathesis.openapi.from_dict(document)
    failures: list[str] = []
    for result in schema.get_all_operations():
        operation = result.ok()
        try:
            _run(operation, base_url, headers, label, seen)
        except (AssertionError, BaseExceptionGroup, Exception) as exc:  # gathered: every operation is reported
            failures.append(f"{label} {operation.label}: {' '.join(str(exc).split())[:500]}")
    return failures


def _run(operation: Any, base_url: str, headers: dict[str, str], label: str,
         seen: Counter[tuple[str, str, int]]) -> None:
    """`EXAMPLES` generated requests of one operation, each answer checked (module docs)."""

    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(case=operation.as_strategy())
    def run(case: Any) -> None:
        response = case.call(base_url=base_url, headers=headers, timeout=60, allow_redirects=False)
        seen[label, operation.label, response.status_code] += 1
        assert response.status_code < 500, f"{response.status_code}: {response.text[:300]}"
        assert not TRACEBACK.search(response.text), f"a traceback in the body: {response.text[:300]}"
        case.validate_response(response, checks=CHECKS)

    run()


def _session(base_url: str, user: str) -> tuple[dict[str, str], str]:
    """Log in through the form: (the headers a browser of that session sends, its CSRF token)."""
    with httpx.Client(base_url=base_url, follow_redirects=False) as c:
        r = c.post("/login", data={"user": user, "password": USERS[user][0], "next": "/"},
                   headers={"Origin": base_url})
        assert r.status_code == 303, r.text[:300]
        cookie = "; ".join(f"{k}={v}" for k, v in c.cookies.items())
        page = c.get("/subjects", headers={"Cookie": cookie})
        token = re.search(r'name="csrf" value="([^"]+)"', page.text)
        assert token is not None, page.text[:300]
    return {"Cookie": cookie, "Origin": base_url}, token.group(1)


def _campaign(console_url: str, values: dict[str, list[str]]) -> tuple[list[str], Counter[tuple[str, str, int]]]:
    document = httpx.get(f"{console_url}/openapi.json", headers=auth_headers("reader"), timeout=30).json()
    assert document["paths"], "the console serves an OpenAPI document with its routes"
    admin, csrf = _session(console_url, "admin")
    roles = [("admin-session", admin, csrf), ("reader-basic", auth_headers("reader"), ""),
             ("writer-basic", auth_headers("writer"), ""), ("stranger-basic", {"Authorization": basic_header(*STRANGER)}, "")]
    failures: list[str] = []
    seen: Counter[tuple[str, str, int]] = Counter()
    for label, headers, token in roles:
        for kind, doc in (("known", _known(document, {**values, "csrf": [token] if token else []})),
                          ("hostile", document)):
            failures += _fuzz(console_url, doc, headers, f"{label}/{kind}", seen)
    return failures, seen


@pytest.mark.timeout(900)
async def test_console_conforms_to_its_openapi_document_with_real_back_ends(broker: EmbeddedBroker, tmp_path: Path,
                                                                           dev_keys: DevKeys) -> None:
    users_file = write_users_file(tmp_path / "users.yaml", clearances=ADMIN_CLEARED)
    topo = make_topology(tmp_path, dev_keys, partitions=1, dlq={"overflow": {"path": f"file://{tmp_path}/overflow"}})
    src = topo.sources[0].topic
    store = build_overflow(topo)
    assert store is not None
    kinds = every_kind(src, store)
    await ensure_topics(broker.bootstrap, topo.topics())
    where = await _seed(broker.bootstrap, [k.record for k in kinds], [0] * len(kinds))
    refs = [f"{p}@{o}" for p, o in where]
    await _write_ledger(broker.bootstrap, ledger_topic(src + ".dlq"), [
        (refs[0].encode(), b"[" * 100_000 + b"]" * 100_000), (refs[1].encode(), b'{"v": 1, "replays": "2"}')])
    registry = registry_app(seeded_registry(tmp_path / "registry.db"),
                            auth=make_auth(users_file, "prism-schema-registry"))
    management = ManagementSettings.from_env({"PRISM_ADMIN_USERS_FILE": str(users_file),
                                              "PRISM_ADMIN_ALLOW_ANONYMOUS": "none"})
    port = find_free_port()
    async with RunningPipeline(topo, broker.bootstrap, tmp_path / "w", app_id=f"fuzz-{uuid.uuid4().hex[:8]}",
                               web_port=port, observe=Observer(metrics=PipelineMetrics(), management=management)):
        with serve(registry) as registry_url:
            settings_ = console_settings(users_file, registry_url=registry_url,
                                         worker_urls=(f"http://127.0.0.1:{port}",), bootstrap=broker.bootstrap)
            with serve(create_app(settings_)) as console_url:
                values = {"name": [topo.name], "source": [src], "ref": refs,
                          "subject": [BACKWARD_SUBJECT, FULL_SUBJECT]}
                failures, seen = await asyncio.to_thread(_campaign, console_url, values)
    assert not failures, "\n".join(failures)

    def answered(label: str, operation: str) -> set[int]:
        return {status for (pass_, op, status) in seen if pass_ == label and op == operation}

    # deep: the known passes reached real records, subjects and replays, not only error pages
    record, replay = "GET /pipelines/{name}/dlq/{source}/{ref}", "POST /pipelines/{name}/dlq/{source}/{ref}/replay"
    for label in ("admin-session/known", "reader-basic/known", "writer-basic/known"):
        for op in (record, "GET /pipelines/{name}/dlq", "GET /subjects/{subject}", "GET /", "GET /governance"):
            assert 200 in answered(label, op), (label, op, answered(label, op))
    assert 200 in answered("admin-session/known", replay)  # replays really ran, through session and CSRF
    assert answered("reader-basic/known", replay) == {403}  # basic credentials never replay
    assert 200 in answered("admin-session/known", "GET /audit") and 403 in answered("reader-basic/known", "GET /audit")
    # a wrong password gets nothing behind the guard (a 429 once its failures are counted too often)
    assert {s for (p, op, s) in seen if p.startswith("stranger") and "login" not in op
            and "healthz" not in op} <= {401, 429}
    assert 404 in answered("admin-session/hostile", record)  # made-up names are "not found", not a 502
    assert sum(seen.values()) >= 4 * 2 * EXAMPLES * 5

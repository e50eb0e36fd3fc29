"""Schema-driven fuzzing (schemathesis) of the servers that publish an OpenAPI document - the
schema registry (``/openapi.json``) and the worker's management API (``/openapi.json``) - each a
real server in a process of its own behind the HTTP limits (tests/security/http_servers.py),
called with an admin's credentials so that requests reach the routes: no answer may be a 500,
and every status must be one the document declares for that operation (issue 28). The console
(``/openapi.json`` too) is fuzzed here without back ends (each page's 502 is declared); its deep
campaign, with a broker, a worker and a registry behind it and every role, is
tests/console/test_console_fuzz.py. The example counts are small so that each server takes well
under a minute."""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.specs.openapi.checks import status_code_conformance

from app.broker.embedded import find_free_port
from tests.support import auth_headers, write_users_file

ROOT = Path(__file__).resolve().parents[2]
ADMIN = auth_headers("admin")


def _start(kind: str, data: Path) -> Iterator[str]:
    users = write_users_file(data / "users.yaml")
    port = find_free_port()
    proc = subprocess.Popen([sys.executable, "-m", "tests.security.http_servers", kind, str(port), str(users),
                             str(data)], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                            stdout=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        assert proc.stdout is not None
        while True:
            ready, _, _ = select.select([proc.stdout], [], [], max(0.0, deadline - time.monotonic()))
            if ready and proc.stdout.readline().strip() == "ready":
                break
            if not ready or proc.poll() is not None:
                raise AssertionError(f"the {kind} server did not start (exit {proc.poll()})")
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def registry_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    yield from _start("registry", tmp_path_factory.mktemp("fuzz-registry"))


@pytest.fixture(scope="module")
def console_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    yield from _start("console", tmp_path_factory.mktemp("fuzz-console"))


@pytest.fixture(scope="module")
def worker_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    yield from _start("worker", tmp_path_factory.mktemp("fuzz-worker"))


#: A 503 is a documented answer (``/readyz`` of a worker that is not ready), a 500 never is.
CHECKS = [status_code_conformance]
#: examples per operation: small, so that each server is done well under a minute
EXAMPLES = 6


def _fuzz(base_url: str, schema: Any = None, checks: list[Any] = CHECKS) -> list[str]:
    """Every operation of the server's OpenAPI document (`schema`, default: the one it serves),
    `EXAMPLES` generated requests each (hypothesis, derandomized: the same requests every run);
    the failures, one line each."""
    schema = schema or schemathesis.openapi.from_url(f"{base_url}/openapi.json", headers=ADMIN)
    failures: list[str] = []
    operations = [result.ok() for result in schema.get_all_operations()]
    assert operations, "the OpenAPI document lists no operation"
    for operation in operations:

        @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                  suppress_health_check=list(HealthCheck))
        @given(case=operation.as_strategy())
        def run(case: Any) -> None:
            response = case.call(base_url=base_url, headers=ADMIN, timeout=30)
            assert response.status_code != 500, f"500: {response.text[:300]}"
            if checks:
                case.validate_response(response, checks=checks)

        try:
            run()
        except (AssertionError, BaseExceptionGroup) as exc:  # gathered: one run reports every operation
            failures.append(f"{operation.label}: {' '.join(str(exc).split())[:400]}")
    return failures


def test_registry_api_has_no_500s_and_no_undocumented_statuses(registry_url: str) -> None:
    failures = _fuzz(registry_url)
    assert not failures, "\n".join(failures)


def test_console_has_no_500s_and_no_undocumented_statuses(console_url: str) -> None:
    """Without back ends: every page must say so (a declared 502 or 404), never 500."""
    failures = _fuzz(console_url)
    assert not failures, "\n".join(failures)


def test_management_api_has_no_500s_and_no_undocumented_statuses(worker_url: str) -> None:
    failures = _fuzz(worker_url)
    assert not failures, "\n".join(failures)

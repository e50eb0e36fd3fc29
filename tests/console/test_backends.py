"""The console's worker back end (app/console/backends.py) against a real worker management API
(Faust's aiohttp server on loopback, tests/worker/test_management_auth.py's) and a real console
(uvicorn): the console keeps reading while someone on its host floods the worker with wrong
passwords for other names (issue 28), and whenever it cannot read a worker the pipelines page
says why - 429 with until when, 401, unreachable - never an empty list without a word."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from app.console import create_app
from app.console.backends import _flatten
from app.security.http_auth import basic_header
from app.worker.management import ManagementSettings
from tests.console.support import console_settings, free_port, serve
from tests.support import USERS, write_users_file
from tests.worker.test_management_auth import web


@pytest.fixture(scope="module")
def users_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_users_file(tmp_path_factory.mktemp("console-backends") / "users.yaml")


@pytest.fixture
async def worker(tmp_path: Path, users_file: Path) -> AsyncIterator[str]:
    """A worker management API whose failure limit is 2 per name (20 per address)."""
    env = {"PRISM_ADMIN_USERS_FILE": str(users_file), "PRISM_AUTH_MAX_FAILURES": "2"}
    async with web(tmp_path, ManagementSettings.from_env(env)) as url:
        yield url


async def pipelines_page(users_file: Path, worker_urls: tuple[str, ...], *, worker_user: str = "reader",
                         worker_headers: dict[str, str] | None = None) -> str:
    """The pipelines page of a fresh console reading ``worker_urls`` as ``worker_user``, as the
    admin sees it (the worker runs on this event loop: every wait here is an ``await``)."""
    settings = console_settings(users_file, registry_url=None, worker_urls=worker_urls, worker_user=worker_user)
    if worker_headers is not None:
        settings = dataclasses.replace(settings, worker_headers=worker_headers)
    return await console_page(create_app(settings))


async def console_page(app: object) -> str:
    with serve(app) as url:
        async with httpx.AsyncClient(base_url=url, timeout=60) as c:
            r = await c.post("/login", data={"user": "admin", "password": USERS["admin"][0], "next": "/"},
                             headers={"origin": url})
            assert r.status_code == 303, r.text
            page = await c.get("/", headers={"accept": "text/html"})
            assert page.status_code == 200
            return page.text


def worker_errors(html: str) -> list[str]:
    return re.findall(r'<p class="error worker-error">(.*?)</p>', html, re.S)


async def guess(worker: str, users: list[str]) -> list[int]:
    """A wrong password for each of ``users`` in turn, from this host (the console's)."""
    async with httpx.AsyncClient() as c:
        return [(await c.get(worker + "/connectors", headers={"Authorization": basic_header(u, "wrong")})).status_code
                for u in users]


async def test_a_flood_of_wrong_passwords_for_other_names_does_not_lock_out_the_console(
        worker: str, users_file: Path) -> None:
    settings = console_settings(users_file, registry_url=None, worker_urls=(worker,), worker_user="reader")
    app = create_app(settings)
    with serve(app) as url:
        async with httpx.AsyncClient(base_url=url, timeout=60) as c:
            r = await c.post("/login", data={"user": "admin", "password": USERS["admin"][0], "next": "/"},
                             headers={"origin": url})
            assert r.status_code == 303
            first = (await c.get("/")).text
            assert worker_errors(first) == [] and "run no pipeline" in first
            # from the console's host: the admin's password guessed, then 40 made-up names
            assert await guess(worker, ["admin"] * 3) == [401, 401, 429]
            flood = await guess(worker, [f"nobody-{i}" for i in range(40)])
            assert flood == [401] * 18 + [429] * 22  # past the per-address ceiling (2 x 10) new names are refused
            after = (await c.get("/")).text
            assert worker_errors(after) == [], worker_errors(after)
            assert "run no pipeline" in after


async def test_a_locked_out_console_user_is_named_on_the_page_with_until_when(worker: str, users_file: Path) -> None:
    assert await guess(worker, ["reader"] * 3) == [401, 401, 429]
    errors = worker_errors(await pipelines_page(users_file, (worker,)))
    assert len(errors) == 1, errors
    assert f"worker {worker}: worker refused {worker}/" in errors[0] and "HTTP 429" in errors[0]
    assert re.search(r"locked out for \d+ s, until \d\d:\d\d:\d\d UTC", errors[0]), errors[0]


async def test_wrong_credentials_and_an_unreachable_worker_are_named(worker: str, users_file: Path) -> None:
    closed = f"http://127.0.0.1:{free_port()}"
    html = await pipelines_page(users_file, (worker, closed),
                                worker_headers={"Authorization": basic_header("reader", "not-the-password")})
    errors = worker_errors(html)
    assert len(errors) == 2, errors
    assert errors[0].startswith(f"Cannot read worker {worker}:") and "HTTP 401" in errors[0]
    assert errors[1].startswith(f"Cannot read worker {closed}:") and "unreachable" in errors[1]
    assert "run no pipeline" not in html and "No worker configured" not in html


async def test_a_worker_that_answers_with_markup_is_shown_as_text(users_file: Path) -> None:
    """A hostile (or broken) worker URL's answer must not reach the page as markup."""
    from fastapi import FastAPI
    from fastapi.responses import JSONResponse

    evil = FastAPI()

    @evil.get("/{path:path}")
    async def anything(path: str) -> JSONResponse:
        return JSONResponse({"error": "<script>alert(1)</script>"}, status_code=418)

    with serve(evil) as evil_url:
        html = await pipelines_page(users_file, (evil_url,))
    errors = worker_errors(html)
    assert len(errors) == 1 and "<script>" not in html and "418" in errors[0], errors


def test_children_of_a_supervisor_that_cannot_be_read_are_named_not_dropped() -> None:
    doc = {"url": "http://sup", "supervisor": {}, "workers": [
        {"index": 0, "url": "http://c0", "status": {"url": "http://c0", "topologies": []}},
        {"index": 1, "url": "http://c1", "error": "worker refused http://c1/metrics (HTTP 429: ...)"},
        {"index": 2, "url": None, "error": "not ready"}]}
    docs, errors = _flatten(doc)
    assert [d["url"] for d in docs] == ["http://c0"]
    assert errors == ["worker http://c1: worker refused http://c1/metrics (HTTP 429: ...)", "worker #2: not ready"]

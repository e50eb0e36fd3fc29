"""Fixtures for the schema-registry tests: stores (SQLite, PostgreSQL), the users the registry
authenticates (one per role), and a real uvicorn server."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.schema.registry import Registry
from app.schema.store import PostgresStore, SqliteStore
from app.security.http_auth import FailureLimiter, HttpAuth, auth_from_settings
from tests import servers
from tests.support import creds, require, write_users_file


@pytest.fixture(scope="session")
def users_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_users_file(tmp_path_factory.mktemp("registry-users") / "users.yaml")


@pytest.fixture(scope="session")
def auth(users_file: Path) -> HttpAuth:
    """The registry's authentication for tests: the USERS above, no anonymous access."""
    auth = auth_from_settings(users_file=users_file, jwt_config=None, allow_anonymous=None,
                              realm="prism-schema-registry", where="tests")
    # Shared by every test of the session, all from one test-client address: the default
    # limit (10 failures a minute) would let one test's deliberate wrong passwords lock the
    # next test out. The limit itself is tested with an auth of its own (test_authz.py).
    auth.limiter = FailureLimiter(10_000, 60)
    return auth


def pg_dsn() -> str:
    """The test run's own PostgreSQL (tests/servers.py), started on first use."""
    return servers.pg_dsn()


def _pg_available() -> str | None:
    try:
        import psycopg

        with psycopg.connect(pg_dsn(), connect_timeout=3) as conn:
            conn.execute("SELECT 1")
        return None
    except Exception as e:  # any failure means "no usable server"
        return str(e)


@pytest.fixture(params=["sqlite", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path) -> Iterator:  # type: ignore[no-untyped-def]
    """Each service test runs on both backends. PostgreSQL is skipped locally when absent,
    but FAILS under CI=true: CI machines are required to have it."""
    if request.param == "sqlite":
        s = SqliteStore(str(tmp_path / "registry.db"))
        yield s
        s.close()
        return
    problem = _pg_available()
    require(not problem, f"PostgreSQL at {pg_dsn()}: {problem}")
    s = PostgresStore(pg_dsn(), pg_schema=f"prism_reg_test_{uuid.uuid4().hex[:10]}")
    yield s
    s.drop()
    s.close()


@pytest.fixture
def registry(store) -> Registry:  # type: ignore[no-untyped-def]
    return Registry(store)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ServerHandle:
    def __init__(self, url: str, registry: Registry) -> None:
        self.url, self.registry = url, registry

    def sr_conf(self, user: str = "admin") -> dict[str, str]:
        """confluent-kafka ``SchemaRegistryClient`` settings with ``user``'s basic credentials."""
        name, password = creds(user)
        return {"url": self.url, "basic.auth.user.info": f"{name}:{password}"}


@contextlib.contextmanager
def serve_registry(registry: Registry, auth: HttpAuth, **uvicorn_kw: object) -> Iterator[str]:
    """A real uvicorn server (HTTP over TCP on a free port) serving the registry app, with the
    HTTP limits production applies; yields its URL."""
    import uvicorn

    from app.schema.service import create_app
    from app.security.http_limits import HttpLimits, uvicorn_config

    port = free_port()
    # The production HTTP stack: the limited protocol of app.security.http_limits.
    server = uvicorn.Server(uvicorn_config(create_app(registry, auth=auth), HttpLimits(), host="127.0.0.1", port=port,
                                           log_level="warning", lifespan="off", **uvicorn_kw))
    t = threading.Thread(target=server.run, daemon=True)
    t.start()
    deadline = time.time() + 10
    while not server.started:
        if time.time() > deadline or not t.is_alive():
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.02)
    try:
        yield f"{'https' if uvicorn_kw.get('ssl_certfile') else 'http'}://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        t.join(timeout=10)


@pytest.fixture
def live_server(registry: Registry, auth: HttpAuth) -> Iterator[ServerHandle]:
    with serve_registry(registry, auth) as url:
        yield ServerHandle(url, registry)

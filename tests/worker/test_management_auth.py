"""The worker's management API behind authentication, on Faust's own aiohttp web server (no
broker needed: the views answer 404 for connectors when no pipeline is attached, which is
past the auth layer). Every rule of the table as an anonymous, a read-only and an admin
client, Kafka Connect-style refusals, bearer JWT attacks, HTTPS via Faust's
web_ssl_context, and start-up validation of the PRISM_ADMIN_* / PRISM_WEB_SSL_* settings.
Every route the running server holds - Faust's own included - is in the table or not served:
the test enumerates the live aiohttp router."""

from __future__ import annotations

import json
import re
import ssl
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from jwt.algorithms import RSAAlgorithm

from app.broker.embedded import find_free_port
from app.errors import ConfigError
from app.security.http_auth import basic_header
from app.worker.faust_app import make_app
from app.worker.management import (
    ADMIN,
    OPEN,
    READ,
    RULES,
    ManagementSettings,
    register_views,
    rule_for,
    served_routes,
    unclassified_routes,
)
from app.worker.observe import Observer
from tests.support import USERS, creds, self_signed_cert, write_users_file

CLIENTS = ("anonymous", "reader", "admin")


@asynccontextmanager
async def web_app(tmp_path: Path, settings: ManagementSettings, before_start: Callable[[Any], None] | None = None,
                  **faust_settings: Any) -> AsyncIterator[tuple[str, Any]]:
    """Faust's web server (the real aiohttp site, TLS included) with the management views;
    yields its URL and the Faust app. ``before_start`` may mount more before it starts."""
    port = find_free_port()
    app = make_app(f"mgmt-{uuid.uuid4().hex[:8]}", "127.0.0.1:1", tmp_path / "data", web_port=port,
                   **({"web_ssl_context": settings.ssl_context} if settings.ssl_context else {}), **faust_settings)
    observer = Observer(management=settings)
    register_views(app, observer, settings)
    if before_start is not None:
        before_start(app)
    server = app.web
    server.init_server()
    await server.start_server()
    try:
        yield f"{'https' if settings.ssl_context else 'http'}://127.0.0.1:{port}", app
    finally:
        await server.stop_server()


@asynccontextmanager
async def web(tmp_path: Path, settings: ManagementSettings) -> AsyncIterator[str]:
    async with web_app(tmp_path, settings) as (url, _):
        yield url


@pytest.fixture(scope="module")
def users_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_users_file(tmp_path_factory.mktemp("mgmt") / "users.yaml")


def settings_of(env: dict[str, str]) -> ManagementSettings:
    return ManagementSettings.from_env(env)


async def request(url: str, method: str, path: str, who: str = "anonymous", *,
                  headers: dict[str, str] | None = None, **kw: Any) -> tuple[int, Any, Any]:
    hdrs = dict(headers or {})
    if who != "anonymous":
        hdrs["Authorization"] = basic_header(*creds(who))
    async with aiohttp.ClientSession() as s, s.request(method, url + path, headers=hdrs, **kw) as r:
        raw = await r.read()
        body = json.loads(raw) if r.content_type == "application/json" and raw else raw.decode()
        return r.status, body, r.headers


def concrete(template: str) -> str:
    return re.sub(r"\{name\}", "orders-pipeline", template)


def test_table_mentions_every_mounted_view(tmp_path: Path) -> None:
    app = make_app(f"mgmt-{uuid.uuid4().hex[:8]}", "127.0.0.1:1", tmp_path / "d", web_port=find_free_port())
    register_views(app, Observer())
    from faust.web import View

    views = [v if isinstance(v, type) else type(v) for v in app.web.views.values()]
    mounted = {(m.upper(), v.template) for v in views  # type: ignore[attr-defined]
               for m in ("get", "post", "put", "patch", "delete") if getattr(v, m) is not getattr(View, m)}
    ruled = {k for k in RULES if k[0] != "HEAD"}
    assert len(mounted) == len(ruled) and mounted == ruled, sorted(mounted ^ ruled)
    assert rule_for("DELETE", "/connectors/{name}") == ADMIN and rule_for("HEAD", "/metrics") == OPEN
    assert {k for k, v in RULES.items() if v == OPEN} == {("GET", "/metrics"), ("GET", "/healthz"),
                                                           ("GET", "/readyz")}
    assert all(v == ADMIN for (m, _), v in RULES.items() if m != "GET")  # every mutation needs admin
    assert {k for k, v in RULES.items() if v == ADMIN and k[0] != "HEAD"} == {("PUT", "/connectors/{name}/pause"),
                                                            ("PUT", "/connectors/{name}/resume"),
                                                            ("POST", "/connectors/{name}/restart")}


@pytest.mark.parametrize("who", CLIENTS)
@pytest.mark.parametrize(("method", "template"), sorted(RULES), ids=lambda x: str(x))
async def test_role_matrix(method: str, template: str, who: str, tmp_path: Path, users_file: Path) -> None:
    need = RULES[(method, template)]
    async with web(tmp_path, settings_of({"PRISM_ADMIN_USERS_FILE": str(users_file)})) as url:
        status, body, headers = await request(url, method, concrete(template), who)
    allowed = need in (OPEN, READ) or who == "admin"
    if allowed:
        assert status not in (401, 403), (status, body)
        return
    want = 401 if who == "anonymous" else 403
    assert status == want and (method == "HEAD" or body["error_code"] == want), (status, body)
    assert ("WWW-Authenticate" in headers) is (want == 401)


async def test_reads_can_be_closed_and_unknown_routes_need_admin(tmp_path: Path, users_file: Path) -> None:
    env = {"PRISM_ADMIN_USERS_FILE": str(users_file), "PRISM_ADMIN_ALLOW_ANONYMOUS": "none"}
    async with web(tmp_path, settings_of(env)) as url:
        assert (await request(url, "GET", "/connectors"))[0] == 401
        assert (await request(url, "GET", "/connectors", "reader"))[0] == 200
        for path in ("/metrics", "/healthz"):
            assert (await request(url, "GET", path))[0] == 200  # probes and scrapers stay open
        # a method no view implements never reaches a view: aiohttp's router answers 405
        assert (await request(url, "DELETE", "/connectors/orders-pipeline", "admin"))[0] == 405
        assert (await request(url, "GET", "/connectors", "admin", auth=None))[0] == 200


async def test_without_credentials_configured_mutations_are_closed(tmp_path: Path) -> None:
    async with web(tmp_path, ManagementSettings.default()) as url:
        assert (await request(url, "GET", "/connectors"))[0] == 200
        status, body, headers = await request(url, "PUT", "/connectors/orders-pipeline/pause")
        assert status == 401 and "PRISM_ADMIN_USERS_FILE" in body["message"] and "WWW-Authenticate" in headers
        status, body, _ = await request(url, "PUT", "/connectors/orders-pipeline/pause",
                                        headers={"Authorization": basic_header("admin", "x")})
        assert status == 401 and "basic authentication is not enabled" in body["message"]


async def test_wrong_password_forged_basic_and_malformed(tmp_path: Path, users_file: Path) -> None:
    async with web(tmp_path, settings_of({"PRISM_ADMIN_USERS_FILE": str(users_file)})) as url:
        for header in (basic_header("admin", "wrong"), basic_header("nobody", USERS["admin"][0]),
                       "Basic %%%", "Token abc"):
            status, body, headers = await request(url, "POST", "/connectors/orders-pipeline/restart",
                                                  headers={"Authorization": header})
            assert status == 401 and body["error_code"] == 401, (header, body)
            assert headers["WWW-Authenticate"] == 'Basic realm="prism-worker", charset="UTF-8"'


async def test_a_cross_site_page_cannot_ride_on_cached_admin_credentials(tmp_path: Path, users_file: Path) -> None:
    """A browser that opened the management API sends its cached basic credentials with a
    cross-site form post too (no CORS preflight): such a restart, pause or resume is refused
    (403) before the credentials count, while the same request from a script, or from a page
    of the worker's own origin, reaches the view (404: no pipeline is attached here)."""
    async with web(tmp_path, settings_of({"PRISM_ADMIN_USERS_FILE": str(users_file)})) as url:
        host = url.split("//", 1)[1]
        path = "/connectors/orders-pipeline/restart"
        for hostile in ({"Origin": "https://evil.example"}, {"Origin": "null"},
                        {"Sec-Fetch-Site": "cross-site", "Origin": f"http://{host}"},
                        {"Sec-Fetch-Site": "same-site"}):
            status, body, _ = await request(url, "POST", path, "admin", headers=hostile)
            assert status == 403 and body["error_code"] == 403 and "refused" in body["message"], (hostile, body)
            status, _, _ = await request(url, "PUT", "/connectors/orders-pipeline/pause", "admin", headers=hostile)
            assert status == 403, hostile
        for fine in ({}, {"Origin": f"http://{host}"}, {"Sec-Fetch-Site": "same-origin"}, {"Sec-Fetch-Site": "none"}):
            status, body, _ = await request(url, "POST", path, "admin", headers=fine)
            assert status == 404, (fine, body)
        # reads stay readable from anywhere (a dashboard on another host may show them)
        assert (await request(url, "GET", "/connectors", "reader", headers={"Origin": "https://evil.example"}))[0] == 200


async def test_bearer_jwt_on_the_worker(tmp_path: Path) -> None:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    other = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    (tmp_path / "jwks.json").write_text(json.dumps({"keys": [
        {**json.loads(RSAAlgorithm.to_jwk(key.public_key())), "kid": "ops-1"}]}))
    (tmp_path / "jwt.yaml").write_text(json.dumps({
        "jwks_file": "jwks.json", "issuers": ["https://idp"], "audience": "prism-worker",
        "role_map": {"sre": "admin", "dev": "read"}, "roles_claim": "groups"}))

    def token(groups: list[str], *, signer: Any = key, exp_in: float = 300) -> dict[str, str]:
        claims = {"iss": "https://idp", "aud": "prism-worker", "sub": "pat", "exp": int(time.time() + exp_in),
                  "groups": groups}
        return {"Authorization": "Bearer " + jwt.encode(claims, signer, algorithm="RS256", headers={"kid": "ops-1"})}

    settings = settings_of({"PRISM_ADMIN_JWT_CONFIG": str(tmp_path / "jwt.yaml")})
    path = "/connectors/orders-pipeline/pause"
    async with web(tmp_path, settings) as url:
        assert (await request(url, "PUT", path, headers=token(["sre"])))[0] == 404  # past auth: no such pipeline
        assert (await request(url, "PUT", path, headers=token(["dev"])))[0] == 403
        for bad, says in ((token(["sre"], signer=other), "signature"), (token(["sre"], exp_in=-600), "expired")):
            status, body, headers = await request(url, "PUT", path, headers=bad)
            assert status == 401 and says in body["message"] and headers["WWW-Authenticate"].startswith("Bearer")


async def test_https_management_api(tmp_path: Path, users_file: Path) -> None:
    certfile, keyfile = self_signed_cert(tmp_path)
    settings = settings_of({"PRISM_ADMIN_USERS_FILE": str(users_file), "PRISM_WEB_SSL_CERTFILE": str(certfile),
                            "PRISM_WEB_SSL_KEYFILE": str(keyfile)})
    trust = ssl.create_default_context(cafile=str(certfile))
    async with web(tmp_path, settings) as url:
        assert url.startswith("https://")
        status, body, _ = await request(url, "GET", "/healthz", ssl=trust)
        assert status in (200, 503) and "status" in body
        assert (await request(url, "PUT", "/connectors/orders-pipeline/pause", "admin", ssl=trust))[0] == 404
        with pytest.raises(aiohttp.ClientError):  # plaintext is not served on the TLS port
            await request(url.replace("https", "http"), "GET", "/healthz")
        # prism status over HTTPS: trusts the worker's certificate with --cafile (PRISM_ADMIN_CAFILE)
        import asyncio

        import typer
        from typer.testing import CliRunner

        from app.cli.ops import register

        cli, dlq = typer.Typer(), typer.Typer()
        cli.add_typer(dlq, name="dlq")
        register(cli, dlq)
        args = ["status", "--url", url, "--json", "--interval", "0.1", "--user", "reader", "--password",
                USERS["reader"][0]]
        res = await asyncio.to_thread(CliRunner().invoke, cli, [*args, "--cafile", str(certfile)])
        assert res.exit_code == 0, res.output
        assert json.loads(res.output)["topologies"] == []  # no pipeline attached to this web server
        res = await asyncio.to_thread(CliRunner().invoke, cli, args, env={"PRISM_ADMIN_CAFILE": None})
        assert res.exit_code == 2 and "CERTIFICATE_VERIFY_FAILED" in res.output, res.output


@pytest.mark.parametrize(("env", "says"), [
    ({"PRISM_ADMIN_ALLOW_ANONYMOUS": "admin"}, "anonymous requests may at most read"),
    ({"PRISM_ADMIN_ALLOW_ANONYMOUS": "root"}, "unknown role"),
    ({"PRISM_ADMIN_USERS_FILE": "/nonexistent/users.yaml"}, "cannot read users file"),
    ({"PRISM_ADMIN_JWT_CONFIG": "/nonexistent/jwt.yaml"}, "cannot read JWT settings"),
    ({"PRISM_WEB_SSL_CERTFILE": "/nonexistent/cert.pem"}, "needs both"),
    ({"PRISM_WEB_SSL_CERTFILE": "/nonexistent/c.pem", "PRISM_WEB_SSL_KEYFILE": "/nonexistent/k.pem"},
     "cannot load the TLS certificate"),
])
def test_settings_are_validated_at_start_up(env: dict[str, str], says: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(says)):
        ManagementSettings.from_env(env)


def test_observer_from_env_carries_the_settings(users_file: Path) -> None:
    obs: Callable[..., Observer] = Observer.from_env
    o = obs({"PRISM_ADMIN_USERS_FILE": str(users_file)})
    assert o.management.auth.users.keys() == USERS.keys() and o.management.auth.anonymous_roles == {"read"}
    assert Observer().management.auth.accepts_credentials is False


def test_prism_run_stops_on_bad_management_settings_before_any_broker(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    topology = Path(__file__).resolve().parents[2] / "topologies" / "orders-created.yaml"
    env = {**os.environ, "PRISM_ADMIN_USERS_FILE": str(tmp_path / "missing.yaml")}
    env.pop("PRISM_BROKER_URL", None)
    for extra in ([], ["--processes", "2"]):  # one worker, or a supervisor of two
        r = subprocess.run([sys.executable, "-m", "app.cli.main", "run", "--topology", str(topology), "--no-dev-keys",
                            "--data-dir", str(tmp_path / "data"), *extra], cwd=tmp_path, env=env, capture_output=True,
                           text=True, timeout=120)
        assert r.returncode == 2, r.stdout + r.stderr
        assert "cannot read users file" in r.stdout + r.stderr and "missing.yaml" in r.stdout + r.stderr
        assert "embedded broker on" not in r.stdout and "supervisor (pid" not in r.stdout  # nothing was started


async def test_an_address_over_the_failure_limit_gets_429(tmp_path: Path, users_file: Path) -> None:
    """Password guessing at the worker: past PRISM_AUTH_MAX_FAILURES, even the right password
    gets 429 with Retry-After, before any hash is verified."""
    env = {"PRISM_ADMIN_USERS_FILE": str(users_file), "PRISM_AUTH_MAX_FAILURES": "2"}
    async with web(tmp_path, settings_of(env)) as url:
        for guess in ("a", "b"):
            status, _, _ = await request(url, "POST", "/connectors/orders-pipeline/restart",
                                         headers={"Authorization": basic_header("admin", guess)})
            assert status == 401
        status, body, headers = await request(url, "POST", "/connectors/orders-pipeline/restart", "admin")
        assert status == 429 and body["error_code"] == 429, body
        assert "too many failed authentication attempts" in body["message"]
        assert 1 <= int(headers["Retry-After"]) <= 60
        assert (await request(url, "GET", "/healthz"))[0] == 200  # probes carry no credentials


async def test_wrong_passwords_for_other_names_do_not_lock_out_the_consoles_user(tmp_path: Path,
                                                                               users_file: Path) -> None:
    """Issue 28: the console reads the worker as `reader` from its host. Wrong passwords from that
    host for `admin`, and then for a flood of made-up names past the per-address ceiling (2 x 10
    here), lock out those names - never `reader`, who has read from there before."""
    env = {"PRISM_ADMIN_USERS_FILE": str(users_file), "PRISM_AUTH_MAX_FAILURES": "2"}
    async with web(tmp_path, settings_of(env)) as url:
        assert (await request(url, "GET", "/connectors", "reader"))[0] == 200
        for guess in ("a", "b"):
            assert (await request(url, "GET", "/connectors",
                                  headers={"Authorization": basic_header("admin", guess)}))[0] == 401
        assert (await request(url, "GET", "/connectors", "admin"))[0] == 429  # admin's own count
        assert (await request(url, "GET", "/connectors", "reader"))[0] == 200
        statuses = [(await request(url, "GET", "/connectors",
                                   headers={"Authorization": basic_header(f"nobody-{i}", "x")}))[0]
                    for i in range(40)]
        assert statuses.count(401) == 18 and statuses[18:] == [429] * 22, statuses  # 2 for admin + 18
        assert (await request(url, "GET", "/connectors", "writer"))[0] == 429  # new here: the ceiling holds
        status, body, _ = await request(url, "GET", "/connectors", "reader")
        assert status == 200 and isinstance(body, list)


# --------------------------------------------------------------------------- every served route, Faust's included

#: Faust's built-in views (faust.web.apps): the attack pass asked /table/<t>/<message id>/
#: whether a message id was seen, without credentials.
FAUST_PATHS = ("/", "/router/", "/router/topics", "/router/dedup/k1/", "/table/", "/table/dedup/",
               "/table/dedup/msg-1/", "/graph/", "/stats/", "/assignment/", "/performance/")


async def test_every_route_the_running_server_serves_is_in_the_table(tmp_path: Path, users_file: Path) -> None:
    """Enumerates the live aiohttp router (not the views we meant to mount): each route has a
    rule of its own, and Faust's views are not among them - also with every APP_WEB_* switch of
    Faust's set to on."""
    env = {"PRISM_ADMIN_USERS_FILE": str(users_file), "PRISM_ADMIN_ALLOW_ANONYMOUS": "none"}
    on = {"web_router_enabled": True, "web_tables_enabled": True, "web_graph_enabled": True,
          "web_stats_enabled": True, "web_metrics_enabled": True, "debug": True}
    for faust_settings in ({}, on):
        async with web_app(tmp_path, settings_of(env), **faust_settings) as (url, app):
            served = served_routes(app)
            assert served and unclassified_routes(app) == [], unclassified_routes(app)
            assert set(served) == set(RULES) | {("HEAD", t) for m, t in RULES if m == "GET"}
            for path in FAUST_PATHS:
                for who in ("anonymous", "reader", "admin"):
                    status, _, _ = await request(url, "GET", path, who)
                    assert status == 404, (faust_settings, path, who, status)  # not served at all


async def test_a_route_mounted_outside_the_table_needs_admin(tmp_path: Path, users_file: Path) -> None:
    """Were Faust's table views (or anything else) mounted after all, the guard still applies -
    by route template, with no rule meaning admin - and the enumeration reports it."""
    from faust.web import Blueprint
    from faust.web import View as FaustView

    extra = Blueprint("extra")

    @extra.route("/{name}/{key}/", name="key")
    class Key(FaustView):  # type: ignore[misc]  # like faust.web.apps.tables' key view
        async def get(self, request: Any, name: str, key: str) -> Any:
            return self.json({"name": name, "key": key, "seen": True})

    def mount(app: Any) -> None:
        app.web.blueprints.add("/table", "faust.web.apps.tables.blueprint")
        app.web.blueprints.add("/extra", extra)

    env = {"PRISM_ADMIN_USERS_FILE": str(users_file), "PRISM_ADMIN_ALLOW_ANONYMOUS": "read"}
    async with web_app(tmp_path, settings_of(env), before_start=mount) as (url, app):
        missing = unclassified_routes(app)
        assert ("GET", "/table/{name}/{key}/") in missing and ("GET", "/extra/{name}/{key}/") in missing, missing
        for path in ("/table/", "/extra/dedup/msg-1/"):
            assert (await request(url, "GET", path))[0] == 401  # anonymous may read - but this is no read route
            status, body, _ = await request(url, "GET", path, "reader")
            assert status == 403 and body["error_code"] == 403 and "needs admin" in body["message"], body
        status, body, _ = await request(url, "GET", "/extra/dedup/msg-1/", "admin")
        assert status == 200 and body["seen"] is True


async def test_a_prism_view_without_the_guard_is_closed(tmp_path: Path) -> None:
    def unguard(app: Any) -> None:
        app.web.web_app.middlewares.clear()

    async with web_app(tmp_path, ManagementSettings.default(), before_start=unguard) as (url, _):
        status, body, _ = await request(url, "GET", "/connectors", "anonymous")
        assert status == 500 and "not authorized by the management guard" in body["message"]
        assert (await request(url, "PUT", "/connectors/orders-pipeline/pause"))[0] == 500

"""The worker's HTTP surface on Faust's web server: metrics, health, and a Connect-style
management API (the shape Kafka Connect users know from its REST API).

| method | path | what |
| --- | --- | --- |
| GET | /metrics | Prometheus text (the worker's own registry) |
| GET | /healthz, /readyz | liveness / readiness JSON (200 or 503) |
| GET | /connectors | names of the topologies this worker runs (a JSON list; ``?expand=status|info``) |
| GET | /connectors/{name} | Connect's {name, config, tasks, type} + stages, sources, outputs, DLQ topics |
| GET | /connectors/{name}/config | the topology as Connect's flat string map |
| GET | /connectors/{name}/topics | the topics it reads and writes, ``{name: {"topics": [...]}}`` |
| GET | /connectors/{name}/status | state + one "task" per assigned source partition with its lag |
| PUT | /connectors/{name}/pause, /resume | stop / restart fetching the source partitions (202, no body) |
| POST | /connectors/{name}/restart | let the in-flight batch finish, refetch, clear a failed state
  (204; 202 with the status with ``includeTasks``/``onlyFailed``) |
| GET | /connectors/{name}/dlq | DLQ depth (records) per partition |
| GET | /openapi.json | the OpenAPI 3.1 document of all of the above |

Where Connect has the same route, the answer has Connect's shape - status codes, key sets,
``{"error_code", "message"}`` error bodies (also for an unknown route, 404, and a wrong method,
405) - checked against a real Kafka Connect by ``tests/kafka/test_connect_parity.py``; every
remaining difference is listed in docs/operations.md, "Prism vs Kafka Connect REST".

Why Faust views (`app.page`) and not a second server: one port per worker, the one the
orchestrator already probes, started by Faust only after table recovery (before that the
port is closed, which a readiness probe reads as "not ready" - correct).

Who may call what (:data:`RULES`, one table; a route without a rule needs ``admin``):
``/metrics``, ``/healthz`` and ``/readyz`` stay open (scrapers and probes carry no
credentials); the other GETs need the ``read`` role, which anonymous requests have unless
``PRISM_ADMIN_ALLOW_ANONYMOUS=none``; pause, resume, restart and anything not a GET need
``admin``, proven with HTTP basic (``PRISM_ADMIN_USERS_FILE``, the registry's users-file
format) or a bearer JWT (``PRISM_ADMIN_JWT_CONFIG``), through the same
:mod:`app.security.http_auth` as the schema registry. With no credentials configured the
mutating routes are simply closed (401). Refusals look like Kafka Connect's:
``{"error_code": 401|403, "message": ...}``, 401 with ``WWW-Authenticate``. A pause, resume or
restart that a browser sent from another site's page is refused (403) before any credentials are
looked at: the browser would add the basic credentials it cached for the worker
(:func:`app.security.http_auth.cross_site_refusal`).

Every route the web server serves goes through the table, Faust's own included: the check is
an aiohttp middleware on the server (:func:`_guard`), keyed by the template of the route the
router matched - not a per-view hook that a route mounted some other way would skip. Faust's
built-in views (``/router/...``, ``/table/...`` - which answer whether a key such as a message
id is in a table -, ``/graph``, statistics and its index page at ``/``) are switched off:
Prism uses none of them (no ``@table_route``). Were one mounted anyway (a Faust upgrade, an
``APP_WEB_*`` setting), it would need ``admin``, and ``tests/worker/test_management_auth.py``
enumerates the running router's routes and fails on any the table does not name.
``PRISM_WEB_SSL_CERTFILE`` + ``PRISM_WEB_SSL_KEYFILE`` serve all of it over HTTPS (Faust's
``web_ssl_context``). Every setting is validated when the worker is built.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import logging
import math
import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from aiohttp import web as aiohttp_web
from faust.web import View
from faust.web.base import BlueprintManager

from app import native
from app.errors import ConfigError
from app.observability.metrics import CONTENT_TYPE
from app.security.http_auth import (
    ROLE_ADMIN,
    HttpAuth,
    Principal,
    TooManyFailures,
    Unauthenticated,
    auth_from_settings,
    cross_site_refusal,
)
from app.security.http_limits import HttpLimits, harden_aiohttp_runner
from app.worker.faust_app import event_loop_name

if TYPE_CHECKING:
    import faust

    from app.worker.interfaces import ObserverView

JSON = "application/json"
log = logging.getLogger(__name__)

CONNECTOR_STATES = ("RUNNING", "PAUSED", "UNASSIGNED", "FAILED")

ENV_USERS_FILE = "PRISM_ADMIN_USERS_FILE"
ENV_JWT_CONFIG = "PRISM_ADMIN_JWT_CONFIG"
ENV_ALLOW_ANONYMOUS = "PRISM_ADMIN_ALLOW_ANONYMOUS"
ENV_SSL_CERTFILE = "PRISM_WEB_SSL_CERTFILE"
ENV_SSL_KEYFILE = "PRISM_WEB_SSL_KEYFILE"
#: The largest request body the management API accepts (its routes read none).
MAX_BODY_BYTES = 64 * 1024
OPEN, READ, ADMIN = "open", "read", "admin"
#: Who is making the current request (aiohttp runs each request in its own task/context).
_PRINCIPAL: contextvars.ContextVar[str] = contextvars.ContextVar("prism_management_principal", default="anonymous")

#: (method, path template) -> what it needs. Anything else needs admin.
RULES: Mapping[tuple[str, str], str] = {
    ("GET", "/metrics"): OPEN,
    ("GET", "/healthz"): OPEN,
    ("GET", "/readyz"): OPEN,
    ("GET", "/openapi.json"): READ,
    ("GET", "/connectors"): READ,
    ("GET", "/connectors/{name}"): READ,
    ("GET", "/connectors/{name}/status"): READ,
    ("GET", "/connectors/{name}/config"): READ,
    ("GET", "/connectors/{name}/topics"): READ,
    ("GET", "/connectors/{name}/dlq"): READ,
    ("PUT", "/connectors/{name}/pause"): ADMIN,
    ("PUT", "/connectors/{name}/resume"): ADMIN,
    ("POST", "/connectors/{name}/restart"): ADMIN,
    # Faust serves HEAD on every view (as its GET); a HEAD has the rule of the template's GET.
    # These views have no GET (HEAD answers 405) and their HEAD is an admin's like their write.
    ("HEAD", "/connectors/{name}/pause"): ADMIN,
    ("HEAD", "/connectors/{name}/resume"): ADMIN,
    ("HEAD", "/connectors/{name}/restart"): ADMIN,
}


def _rule(method: str, template: str) -> str | None:
    rule = RULES.get((method, template))
    return RULES.get(("GET", template)) if rule is None and method == "HEAD" else rule


def rule_for(method: str, template: str) -> str:
    """What a request to route ``template`` needs (``HEAD`` is ``GET`` unless it has a rule of
    its own); ``admin`` without a rule."""
    return _rule(method, template) or ADMIN


def served_routes(app: faust.App) -> list[tuple[str, str]]:
    """(method, template) of every route the worker's aiohttp router holds (what it serves)."""
    return sorted((r.method, r.resource.canonical) for r in app.web.web_app.router.routes()  # type: ignore[attr-defined]
                  if r.resource is not None)


def unclassified_routes(app: faust.App) -> list[tuple[str, str]]:
    """Served routes without a rule of their own in :data:`RULES` (they fall back to ``admin``)."""
    return [(m, t) for m, t in served_routes(app) if _rule(m, t) is None]


@dataclass(frozen=True)
class ManagementSettings:
    """Authentication, TLS and HTTP limits of the worker's web server."""

    auth: HttpAuth
    ssl_context: ssl.SSLContext | None = None
    #: app.security.http_limits: no route reads a body, so the body limit is small
    http_limits: HttpLimits = field(default_factory=lambda: HttpLimits(max_body_bytes=MAX_BODY_BYTES))

    @classmethod
    def default(cls) -> ManagementSettings:
        """Reads open, mutations closed (no credentials exist)."""
        return cls(HttpAuth(anonymous_roles=(READ,), realm="prism-worker"))

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> ManagementSettings:
        env = os.environ if env is None else env
        anonymous = env.get(ENV_ALLOW_ANONYMOUS, READ)
        auth = auth_from_settings(users_file=env.get(ENV_USERS_FILE) or None,
                                  jwt_config=env.get(ENV_JWT_CONFIG) or None, allow_anonymous=anonymous,
                                  realm="prism-worker", where=ENV_ALLOW_ANONYMOUS, env=env)
        if auth.anonymous_roles - {READ}:
            raise ConfigError(f"anonymous requests may at most read, not {sorted(auth.anonymous_roles - {READ})}",
                              path=ENV_ALLOW_ANONYMOUS, hint="use read or none; give operators credentials")
        return cls(auth, tls_context(env.get(ENV_SSL_CERTFILE) or None, env.get(ENV_SSL_KEYFILE) or None),
                   HttpLimits.from_env(env, max_body_bytes=MAX_BODY_BYTES))


def tls_context(certfile: str | None, keyfile: str | None) -> ssl.SSLContext | None:
    """A server TLS context from PEM files, loaded now (a wrong path or a key that does not
    match the certificate stops the start-up, not every handshake)."""
    if certfile is None and keyfile is None:
        return None
    if certfile is None or keyfile is None:
        raise ConfigError("TLS needs both a certificate and its key", path=f"{ENV_SSL_CERTFILE} / {ENV_SSL_KEYFILE}",
                          hint="set both, or neither for plain HTTP")
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        ctx.load_cert_chain(certfile, keyfile)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"cannot load the TLS certificate/key: {exc}", path=f"{certfile} / {keyfile}",
                          hint="a PEM certificate (chain) and its unencrypted PEM private key") from None
    return ctx


def topology_info(observer: ObserverView) -> dict[str, Any]:
    """What `GET /connectors/{name}` returns (also used by `prism status`)."""
    p = observer.pipeline
    assert p is not None
    t = p.topology
    sources = [{"topic": s.topic, "partitions": s.partitions, "format": s.format,
                "namespace": s.namespace or t.namespace} for s in t.sources]
    outputs = [f"{s.topic}.{layout}" for s in t.sources for layout in t.outputs.layouts]
    if t.archive.enabled and t.archive.topic:
        outputs.append(t.archive.topic)
    return {"name": t.name, "type": "pipeline", "namespace": t.namespace, "stages": [s.name for s in t.stages],
            "sources": sources, "outputs": outputs, "dlq": [s.topic + t.dlq.topic_suffix for s in t.sources],
            "sinks": [getattr(s, "name", "") for s in t.sinks],
            # the console's Replay reads a truncated copy's whole value from this store only
            # (app/worker/dlq_overflow.py `read_ref`); the query names endpoints, never secrets
            "dlq_overflow": _without_credentials(t.dlq.overflow.path) if t.dlq.overflow is not None else None}


def topology_topics(observer: ObserverView) -> list[str]:
    """Every Kafka topic the topology reads or writes (sources, outputs, archive tap, DLQs), sorted:
    what Connect's ``GET /connectors/{name}/topics`` lists for a connector."""
    info = topology_info(observer)
    return sorted({s["topic"] for s in info["sources"]} | set(info["outputs"]) | set(info["dlq"]))


def _config_value(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


def _without_credentials(value: Any) -> Any:
    from app.sinks.base import redact_credentials

    if isinstance(value, str):
        return redact_credentials(value)
    if isinstance(value, dict):
        return {k: _without_credentials(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_without_credentials(v) for v in value]
    return value


def topology_config(observer: ObserverView) -> dict[str, str]:
    """The topology as Connect's connector config: a flat map of strings (top-level keys; a nested
    value as compact JSON), ``name`` included as Connect includes it. A topology should name hosts
    and key files only, credentials coming from the environment - but a sink's URL or DSN may
    hold a password (docs/sinks.md masks it in logs and errors), and this is served to every
    reader, anonymous ones by default: every password in a URL or DSN is masked (``***``)."""
    p = observer.pipeline
    assert p is not None
    doc = _without_credentials(p.topology.model_dump(mode="json", by_alias=True, exclude_none=True))
    return {str(k): _config_value(v) for k, v in doc.items()}


def connector_info(observer: ObserverView) -> dict[str, Any]:
    """``GET /connectors/{name}``: Connect's ``{name, config, tasks, type}`` (one task id per assigned
    source partition, as in the status) plus Prism's own keys (:func:`topology_info`)."""
    info = topology_info(observer)
    name = info["name"]
    tasks = [{"connector": name, "task": i} for i in range(len(observer.partition_status()))]
    return {**info, "config": topology_config(observer), "tasks": tasks}


def prism_version() -> str:
    """The installed Prism version: Connect 4.x reports the plugin version of connector and tasks."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("prism-envelope")
    except PackageNotFoundError:
        return "unknown"


def connector_state(observer: ObserverView) -> str:
    p = observer.pipeline
    assert p is not None
    h = observer.health
    if h.failed is not None:
        return "FAILED"
    if p.topology.name in observer.paused:
        return "PAUSED"
    if not h.started or not h.assignment_received:
        return "UNASSIGNED"
    return "RUNNING"


def connector_status(observer: ObserverView) -> dict[str, Any]:
    p = observer.pipeline
    assert p is not None
    worker_id = f"{p.app.conf.web_host}:{p.app.conf.web_port}"
    rows = observer.partition_status()
    version = prism_version()
    tasks = [{"id": i, "state": "PAUSED" if r["paused"] else "RUNNING", "worker_id": worker_id, "version": version,
              **r} for i, r in enumerate(rows)]
    # The group's lag on every source partition, assigned to this worker or not (app/worker/lag.py):
    # while a rebalance leaves nothing assigned, the tasks are empty but the lag is still there.
    group = observer.group_lag()
    lag = group["lag"] if group is not None else sum(r["lag"] or 0 for r in rows)
    connector: dict[str, Any] = {"state": connector_state(observer), "worker_id": worker_id, "version": version}
    if observer.health.failed is not None:  # Connect carries the failure as "trace" on FAILED only
        connector["trace"] = observer.health.failed
    return {"name": p.topology.name, "connector": connector,
            "tasks": tasks, "type": "pipeline", "lag": lag, "group_lag": group, "batches": observer.batches,
            "in_flight_batches": observer.in_flight, "tables": observer.table_sizes(),
            "readiness": observer.health.readiness().to_dict(),
            # the .v2 sunset (outputs.migration): its phase, and whether .v2 is still written
            **({"migration": mig} if (mig := p.publisher.migration_status()) is not None else {})}


async def set_fetching(observer: ObserverView, paused: bool) -> None:
    """Pause/resume the topology's source partitions (app/worker/batch_source.py,
    `set_source_fetching`: aiokafka's own pause, not Faust's, which loses records)."""
    from app.worker.batch_source import set_source_fetching

    p = observer.pipeline
    assert p is not None
    await set_source_fetching(p.app.consumer, {s.topic for s in p.topology.sources}, paused=paused)


async def pause(observer: ObserverView) -> None:
    """Stop fetching the topology's source partitions (the in-flight batch still finishes)."""
    p = observer.pipeline
    assert p is not None
    observer.paused.add(p.topology.name)
    await set_fetching(observer, True)


async def resume(observer: ObserverView) -> None:
    p = observer.pipeline
    assert p is not None
    observer.paused.discard(p.topology.name)
    await set_fetching(observer, False)


async def restart(observer: ObserverView, timeout: float = 30.0) -> bool:
    """Connect's restart, for a worker that has no separate task processes: stop fetching, let
    the in-flight batch finish, clear a failed state, and resume unless the topology was
    paused. Returns False if the batch did not finish in `timeout` seconds (fetching is
    resumed anyway)."""
    p = observer.pipeline
    assert p is not None
    was_paused = p.topology.name in observer.paused
    await set_fetching(observer, True)
    try:
        done = await observer.wait_idle(timeout)
        observer.health.failed = None
    finally:
        if not was_paused:
            await set_fetching(observer, False)
    return done


async def dlq_depth(observer: ObserverView) -> dict[str, Any]:
    """Records in each DLQ partition (end - beginning). End offsets come from a fetch's high
    watermark (`true_end_offsets`): ListOffsets is wrong on the embedded broker."""
    from aiokafka import AIOKafkaConsumer
    from aiokafka.structs import TopicPartition
    from faust.transport.drivers import aiokafka as faust_aiokafka

    from app.worker.offsets import true_end_offsets

    p = observer.pipeline
    assert p is not None
    t, conf = p.topology, p.app.conf
    tps = [TopicPartition(s.topic + t.dlq.topic_suffix, i) for s in t.sources for i in range(s.partitions)]
    transport = p.app.transport
    probe = AIOKafkaConsumer(
        bootstrap_servers=faust_aiokafka.server_list(transport.url, transport.default_port),
        client_id=f"{conf.broker_client_id}-dlq-depth", enable_auto_commit=False,
        **faust_aiokafka.credentials_to_aiokafka_auth(conf.broker_credentials, conf.ssl_context))
    await probe.start()
    try:
        begin = await probe.beginning_offsets(tps)
        end = await true_end_offsets(probe, tps)
    finally:
        await probe.stop()
    parts = [{"topic": tp.topic, "partition": tp.partition, "depth": max(0, end.get(tp, 0) - begin.get(tp, 0)),
              "start_offset": begin.get(tp), "end_offset": end.get(tp)} for tp in tps]
    return {"name": t.name, "total": sum(x["depth"] for x in parts), "partitions": parts}


def register_views(app: faust.App, observer: ObserverView, settings: ManagementSettings | None = None) -> None:
    """Mount every view on `app`'s Faust web server, switch Faust's own views off and install
    the authorization guard in front of all of it (call before the app starts)."""
    obs = observer
    settings = settings or ManagementSettings.default()
    auth = settings.auth
    server = app.web
    if server.blueprints.applied:
        raise RuntimeError("register_views must run before the web server is initialized")
    # Header size/count, the head deadline and the body limit, before the guard authenticates.
    harden_aiohttp_runner(server, settings.http_limits)
    # Faust's built-in views (router, tables, graph, stats, index) are blueprints; Prism mounts
    # its views with app.page and uses none of them, so none is applied.
    server.blueprints = BlueprintManager()
    server.web_app.middlewares.append(_connect_errors)  # type: ignore[attr-defined]
    server.web_app.middlewares.append(_guard(auth))  # type: ignore[attr-defined]

    class View(_GuardedView):
        pass

    def _unknown(name: str, message: str) -> Any:
        """None when ``name`` is the topology this worker runs, else Connect's 404 for it
        (``message``: Connect's own wording for that route, with ``{name}``)."""
        p = obs.pipeline
        if p is not None and name == p.topology.name:
            return None
        return aiohttp_web.json_response({"error_code": 404, "message": message.format(name=name)}, status=404)

    class Metrics(View):
        async def get(self, request: Any) -> Any:
            return self.bytes(obs.exposition(), headers={"Content-Type": CONTENT_TYPE})

    class Healthz(View):
        async def get(self, request: Any) -> Any:
            r = obs.health.liveness()
            return self.bytes(r.to_json(), content_type=JSON, status=r.http_status)

    class Readyz(View):
        async def get(self, request: Any) -> Any:
            obs.refresh_gauges()
            r = obs.health.readiness()
            # which event loop runs the worker (uvloop is ~25 % faster; docs/platform-notes.md)
            # and whether the compiled hot path is in use (app/native.py)
            doc = {**r.to_dict(), "event_loop": event_loop_name(), "pid": os.getpid(), "native": native.status()}
            return self.bytes(json.dumps(doc, sort_keys=True).encode(), content_type=JSON, status=r.http_status)

    class OpenApi(View):
        async def get(self, request: Any) -> Any:
            return self.json(OPENAPI)

    class Connectors(View):
        async def get(self, request: Any) -> Any:
            p = obs.pipeline
            names = [p.topology.name] if p is not None else []
            expand = request.query.getall("expand", [])
            if not expand:
                return self.json(names)
            # Connect: {name: {"status": ..., "info": ...}} with what was asked; unknown values ignored
            out: dict[str, dict[str, Any]] = {}
            for n in names:
                out[n] = {}
                if "status" in expand:
                    out[n]["status"] = connector_status(obs)
                if "info" in expand:
                    out[n]["info"] = connector_info(obs)
            return self.json(out)

    class Connector(View):
        async def get(self, request: Any, name: str) -> Any:
            return _unknown(name, "Connector {name} not found") or self.json(connector_info(obs))

    class Config(View):
        async def get(self, request: Any, name: str) -> Any:
            return _unknown(name, "Connector {name} not found") or self.json(topology_config(obs))

    class Topics(View):
        async def get(self, request: Any, name: str) -> Any:
            return (_unknown(name, "Connector {name} not found")
                    or self.json({name: {"topics": topology_topics(obs)}}))

    class Status(View):
        async def get(self, request: Any, name: str) -> Any:
            return _unknown(name, "No status found for connector {name}") or self.json(connector_status(obs))

    class Pause(View):
        async def put(self, request: Any, name: str) -> Any:
            if (refused := _unknown(name, "Unknown connector {name}")) is not None:
                return refused
            await pause(obs)
            log.warning("connector %r paused by %r", name, _PRINCIPAL.get())
            return aiohttp_web.Response(status=202)  # Connect: 202 without a body

    class Resume(View):
        async def put(self, request: Any, name: str) -> Any:
            if (refused := _unknown(name, "Unknown connector {name}")) is not None:
                return refused
            await resume(obs)
            log.warning("connector %r resumed by %r", name, _PRINCIPAL.get())
            return aiohttp_web.Response(status=202)

    class Restart(View):
        async def post(self, request: Any, name: str) -> Any:
            """Connect's answers: 204 without a body for a plain restart; with ``includeTasks`` or
            ``onlyFailed`` (Connect reads anything but "true" as false) 202 and the status.
            ``onlyFailed`` restarts only a FAILED topology. The restart itself is synchronous
            (the in-flight batch finishes first), so the status is the one after it, and
            ``Prism-In-Flight-Finished`` says whether the batch finished in time."""
            if (refused := _unknown(name, "Unknown connector: {name}")) is not None:
                return refused
            include_tasks = request.query.get("includeTasks", "false").lower() == "true"
            only_failed = request.query.get("onlyFailed", "false").lower() == "true"
            finished = True
            if not only_failed or connector_state(obs) == "FAILED":
                log.warning("connector %r restarted by %r", name, _PRINCIPAL.get())
                finished = await restart(obs)
            headers = {"Prism-In-Flight-Finished": str(finished).lower()}
            if not include_tasks and not only_failed:
                return aiohttp_web.Response(status=204, headers=headers)
            return aiohttp_web.json_response(connector_status(obs), status=202, headers=headers)

    class Dlq(View):
        async def get(self, request: Any, name: str) -> Any:
            if (refused := _unknown(name, "Connector {name} not found")) is not None:
                return refused
            try:
                return self.json(await asyncio.wait_for(dlq_depth(obs), 20))
            except (TimeoutError, OSError) as exc:
                return self.json({"error": "broker_unavailable", "detail": type(exc).__name__}, status=503)

    for path, view in (("/metrics", Metrics), ("/healthz", Healthz), ("/readyz", Readyz),
                       ("/openapi.json", OpenApi), ("/connectors", Connectors),
                       ("/connectors/{name}", Connector), ("/connectors/{name}/status", Status),
                       ("/connectors/{name}/config", Config), ("/connectors/{name}/topics", Topics),
                       ("/connectors/{name}/pause", Pause), ("/connectors/{name}/resume", Resume),
                       ("/connectors/{name}/restart", Restart), ("/connectors/{name}/dlq", Dlq)):
        app.page(path, name=f"prism-{path}")(type(view.__name__, (view,), {"template": path}))


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a request is refused: Kafka Connect's error shape, plus the headers it needs."""

    status: int
    message: str
    headers: dict[str, str] | None = None

    def body(self) -> dict[str, Any]:
        return {"error_code": self.status, "message": self.message}


async def authorize(auth: HttpAuth, need: str, what: str, authorization: list[str], remote: str | None
                    ) -> Principal | Refusal:
    """The principal allowed to do `what` (needing `need`), or why not: one place for the
    worker's views and the supervisor's status site (`app/worker/supervisor.py`)."""
    try:
        principal = await auth.authenticate(authorization, client=remote)
    except Unauthenticated as exc:
        return Refusal(401, f"Unauthorized: {exc.message}", {"WWW-Authenticate": ", ".join(auth.challenges())})
    except TooManyFailures as exc:
        return Refusal(429, f"Too Many Requests: {exc.message}", {"Retry-After": str(max(1, math.ceil(exc.retry_after)))})
    if _allowed(principal, need):
        return principal
    if principal.anonymous:
        extra = "" if auth.accepts_credentials else (
            f" (none are configured: set {ENV_USERS_FILE} or {ENV_JWT_CONFIG} on the worker)")
        return Refusal(401, f"Unauthorized: {what} needs credentials with the {need} role{extra}",
                       {"WWW-Authenticate": ", ".join(auth.challenges())})
    return Refusal(403, f"Forbidden: user {principal.name[:100]!r} may not {what} (needs {need})")


@aiohttp_web.middleware
async def _connect_errors(request: Any, handler: Any) -> Any:
    """aiohttp's own refusals (no such route: 404, a method the route lacks: 405) in Connect's error
    body, ``{"error_code": 405, "message": "HTTP 405 Method Not Allowed"}``, as Connect's Jersey
    answers them: a Connect client reads every error the same way. Outermost, so the guard's and
    the views' answers pass through untouched."""
    try:
        return await handler(request)
    except aiohttp_web.HTTPException as exc:
        if exc.status < 400:
            raise
        return aiohttp_web.json_response({"error_code": exc.status, "message": f"HTTP {exc.status} {exc.reason}"},
                                         status=exc.status, headers={k: v for k, v in exc.headers.items()
                                                                     if k.lower() == "allow"})


#: aiohttp request key: the rule :func:`_guard` applied (its views check it is there).
_AUTHORIZED = aiohttp_web.RequestKey("prism_authorized_need", str)


def _guard(auth: HttpAuth) -> Any:
    """The aiohttp middleware that authorizes every request of the worker's web server by the
    template of the route the router matched, per :data:`RULES` (no rule: ``admin``). Requests
    that match no route go on to aiohttp's own 404/405 (nothing is served)."""

    @aiohttp_web.middleware
    async def guard(request: Any, handler: Any) -> Any:
        info = request.match_info
        if info.http_exception is not None or info.route.resource is None:
            return await handler(request)
        template = info.route.resource.canonical
        why = cross_site_refusal(request.method, request.headers.get("Host"), request.headers.get("Origin"),
                                 request.headers.get("Sec-Fetch-Site"))
        if why is not None:  # another site's page, riding on a browser's cached basic credentials
            return aiohttp_web.json_response({"error_code": 403, "message": f"Forbidden: {why}"}, status=403)
        need = rule_for(request.method, template)
        if need != OPEN:
            verdict = await authorize(auth, need, f"{request.method} {template}",
                                      request.headers.getall("Authorization", []), request.remote)
            if isinstance(verdict, Refusal):
                return aiohttp_web.json_response(verdict.body(), status=verdict.status, headers=verdict.headers)
            _PRINCIPAL.set(verdict.name)
        request[_AUTHORIZED] = need
        return await handler(request)

    return guard


class _GuardedView(View):
    """A Prism view: refuses to run unless :func:`_guard` authorized the request for this
    view's own template (a view reached without the guard - mounted on another server, or the
    guard removed - is closed, not open)."""

    template: str = ""

    async def dispatch(self, request: Any) -> Any:
        if request.get(_AUTHORIZED) != rule_for(request.method, self.template):
            return self.json({"error_code": 500, "message": "request not authorized by the management guard"},
                             status=500)
        return await super().dispatch(request)


def _allowed(principal: Principal, need: str) -> bool:
    return ROLE_ADMIN in principal.roles if need == ADMIN else principal.can_read()


def _op(summary: str, schema: dict[str, Any] | None = None, status: str = "200",
        content: str = JSON, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    resp: dict[str, Any] = {"description": summary}
    if schema is not None:
        resp["content"] = {content: {"schema": schema}}
    out: dict[str, Any] = {"summary": summary, "responses": {status: resp, **(extra or {})}}
    return out


_NAME = [{"name": "name", "in": "path", "required": True, "schema": {"type": "string"},
          "description": "topology name (GET /connectors lists them)"}]
_ERROR = {"type": "object", "properties": {"error_code": {"type": "integer"}, "message": {"type": "string"}}}
_404 = {"404": {"description": "no topology with that name on this worker",
                "content": {JSON: {"schema": _ERROR}}}}
_HEALTH = {"type": "object", "properties": {"status": {"enum": ["ok", "fail"]}, "checks": {"type": "object"}}}
_READY = {"type": "object", "properties": {**_HEALTH["properties"], "event_loop": {"type": "string"},
                                          "pid": {"type": "integer"},
                                          "native": {"type": "object", "properties": {
                                              "active": {"type": "boolean"}, "detail": {"type": "string"}}}}}
_TASK = {"type": "object", "properties": {
    "id": {"type": "integer"}, "state": {"enum": ["RUNNING", "PAUSED"]}, "worker_id": {"type": "string"},
    "topic": {"type": "string"}, "partition": {"type": "integer"}, "committed": {"type": ["integer", "null"]},
    "highwater": {"type": ["integer", "null"]}, "lag": {"type": ["integer", "null"]}, "paused": {"type": "boolean"}}}

#: OpenAPI 3.1 description of the worker's HTTP API (served at /openapi.json).
OPENAPI: dict[str, Any] = {
    "openapi": "3.1.0",
    "info": {"title": "Prism worker API", "version": "1",
             "description": "Metrics, health and Kafka-Connect-style management of one Prism pipeline worker."},
    "paths": {
        "/metrics": {"get": _op("Prometheus metrics", {"type": "string"}, content="text/plain")},
        "/healthz": {"get": _op("Liveness", _HEALTH, extra={"503": {"description": "not live"}})},
        "/readyz": {"get": _op("Readiness", _READY, extra={"503": {"description": "not ready"}})},
        "/openapi.json": {"get": _op("This document", {"type": "object"})},
        "/connectors": {"get": {**_op("Topologies run by this worker (with expand: {name: {status, info}})", {
            "oneOf": [{"type": "array", "items": {"type": "string"}}, {"type": "object"}]}),
            "parameters": [{"name": "expand", "in": "query", "required": False,
                            "schema": {"type": "array", "items": {"enum": ["status", "info"]}}}]}},
        "/connectors/{name}": {"parameters": _NAME, "get": _op("Topology: stages, sources, outputs", {
            "type": "object", "properties": {
                "name": {"type": "string"}, "stages": {"type": "array", "items": {"type": "string"}},
                "sources": {"type": "array", "items": {"type": "object"}},
                "outputs": {"type": "array", "items": {"type": "string"}},
                "dlq": {"type": "array", "items": {"type": "string"}},
                "config": {"type": "object", "additionalProperties": {"type": "string"}},
                "tasks": {"type": "array", "items": {"type": "object", "properties": {
                    "connector": {"type": "string"}, "task": {"type": "integer"}}}}}}, extra=_404)},
        "/connectors/{name}/config": {"parameters": _NAME, "get": _op("The topology as a flat string map", {
            "type": "object", "additionalProperties": {"type": "string"}}, extra=_404)},
        "/connectors/{name}/topics": {"parameters": _NAME, "get": _op("Topics read and written", {
            "type": "object", "additionalProperties": {"type": "object", "properties": {
                "topics": {"type": "array", "items": {"type": "string"}}}}}, extra=_404)},
        "/connectors/{name}/status": {"parameters": _NAME, "get": _op("State and per-partition lag", {
            "type": "object", "properties": {
                "name": {"type": "string"},
                "connector": {"type": "object", "properties": {"state": {"enum": list(CONNECTOR_STATES)},
                                                               "worker_id": {"type": "string"}}},
                "tasks": {"type": "array", "items": _TASK}, "lag": {"type": "integer"},
                "group_lag": {"type": ["object", "null"], "description": (
                    "the consumer group's committed offsets against the log end offsets on every source "
                    "partition (app/worker/lag.py): group, lag, at, end_from, error, partitions")},
                "tables": {"type": "object", "additionalProperties": {"type": "integer"}}}}, extra=_404)},
        "/connectors/{name}/pause": {"parameters": _NAME, "put": _op(
            "Pause fetching the source partitions", status="202", extra=_404)},
        "/connectors/{name}/resume": {"parameters": _NAME, "put": _op(
            "Resume fetching", status="202", extra=_404)},
        "/connectors/{name}/restart": {"parameters": [*_NAME, *(
            {"name": q, "in": "query", "required": False, "schema": {"type": "boolean", "default": False}}
            for q in ("includeTasks", "onlyFailed"))], "post": _op(
            "Finish the in-flight batch, clear a failed state, refetch (onlyFailed: only if FAILED)",
            status="204", extra={**_404, "202": {"description": "with includeTasks or onlyFailed: the status",
                                                 "content": {JSON: {"schema": {"type": "object"}}}}})},
        "/connectors/{name}/dlq": {"parameters": _NAME, "get": _op("DLQ depth per partition", {
            "type": "object", "properties": {
                "total": {"type": "integer"},
                "partitions": {"type": "array", "items": {"type": "object", "properties": {
                    "topic": {"type": "string"}, "partition": {"type": "integer"},
                    "depth": {"type": "integer"}}}}}},
            extra={**_404, "503": {"description": "broker unavailable"}})},
    },
}


def openapi_json() -> str:
    return json.dumps(OPENAPI, indent=2, sort_keys=True)

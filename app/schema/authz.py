"""Who may call which registry route: ONE table, the ASGI middleware that enforces it, and
the per-request decision that routes with a subject in their input make.

Every route of :mod:`app.schema.service` (Confluent subset, Prism ``/v1``, operations, UI,
OpenAPI) has a rule in :data:`RULES`; ``tests/schema/test_authz.py`` enumerates the app's
routes and fails when one has none. A request whose path and method match no rule needs
``admin`` - a route added later is closed until someone writes its rule.

Permissions (roles in :mod:`app.security.http_auth`):

- open (no credentials): ``/healthz``, ``/readyz`` and ``/metrics`` - probes and scrapers carry
  none, and none of them shows a subject or a schema (metrics are labelled by route template);
- ``read``: every read, plus what only reads (compatibility checks, ``POST /subjects/{s}``
  lookups, consumer version reports);
- ``write`` on a subject: registering under it (``POST /subjects/{s}/versions``, ``POST
  /v1/schemas`` ``topic``) and asking for an approval (``POST /v1/approvals`` ``subject``);
  creating an association (``POST /associations``) needs it on every subject named *and* on
  the topic's default subject ``<topic>-key|value`` (the topic's owner decides what its
  clients resolve to);
- ``admin``: global and subject configuration, ``/mode``, every DELETE, deciding approvals,
  policies, the audit log and the PII audit. A ``POST /v1/schemas`` that changes which policy
  governs its subject - ``metadata.compatibility_mode``, or a ``namespace`` other than the one
  the subject is in - needs ``admin`` too (unless ``dry_run``).

Two halves, and why. The middleware authenticates and applies the route-level part of the
rule before anything is parsed (so the fast read path and every handler only ever see
authorized requests). A ``write`` rule depends on *which* subject, and on fields that may
raise the need to admin; that part is decided by :func:`decide`, which the route calls from
a FastAPI dependency with the path parameters and the **validated request model the handler
itself receives** - never the raw JSON. A value the handler reads one way cannot be read
another way by the check (the attack this replaced: ``"dry_run": "false"`` was a true
string to a raw-JSON check and ``False`` to the model). Until :func:`decide` has allowed the
request, :func:`actor_of` refuses to name an actor, so a write route that forgot its
decision fails instead of writing; ``create_app`` refuses to build an app in which a
``write`` route has no deciding dependency, and every route checks that the rule the
middleware applied is the rule of the route the router chose (:func:`check_routed`).

The middleware runs before the fast read path (``_FastReads``) and inside the request
counter, so refused requests are counted but never served from a cache. It stores the
verified principal in the request state; :func:`actor_of` is the only source of the audit
actor (client headers such as ``X-Prism-Actor`` are ignored).

Refusals use Confluent's codes: 401 + ``WWW-Authenticate`` + ``{"error_code": 40101}``
without (usable) credentials, 403 + ``{"error_code": 40301}`` when the roles do not allow;
429 + ``Retry-After`` + ``{"error_code": 42901}`` for a user name over the failed-attempt
limit from that address (:class:`app.security.http_auth.FailureLimiter`).
An anonymous request that needs more than the anonymous roles gets 401: it should retry
with credentials.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from app.errors import ConfigError
from app.security.http_auth import (
    ERROR_FORBIDDEN,
    ERROR_TOO_MANY_FAILURES,
    ERROR_UNAUTHENTICATED,
    SAFE_METHODS,
    HttpAuth,
    Principal,
    TooManyFailures,
    Unauthenticated,
    auth_from_settings,
    cross_site_refusal,
)

CONFLUENT_CT = "application/vnd.schemaregistry.v1+json"
OPEN, READ, WRITE, ADMIN = "open", "read", "write", "admin"
#: service._EncodedSlashes hides an encoded '/' inside a segment as this while routing.
_ENCODED_SLASH, _ENCODED_SLASH_KEY = "\x00", "prism.encoded_slash"
#: Request-state keys (``request.state.<key>``) the middleware and :func:`decide` share.
STATE_PRINCIPAL, STATE_RULE, STATE_PENDING = "principal", "authz_rule", "authz_pending"
#: Marks a dependency callable as the one that makes a route's :func:`decide` call.
DECIDES_ATTR = "__prism_authz_decides__"

ENV_USERS_FILE = "PRISM_REGISTRY_USERS_FILE"
ENV_JWT_CONFIG = "PRISM_REGISTRY_JWT_CONFIG"
ENV_ALLOW_ANONYMOUS = "PRISM_REGISTRY_ALLOW_ANONYMOUS"


@dataclass(frozen=True, slots=True)
class Rule:
    """``method`` + ``path`` template (FastAPI syntax) -> the permission it needs.

    ``need`` is open/read/write/admin. ``write`` is decided in two steps: the middleware only
    checks that the principal may write somewhere; the route's deciding dependency calls
    :func:`decide` with the subject (and whether the request needs admin) taken from the
    validated values the handler receives. ``subject_from`` says where that subject comes
    from, for the documentation and the tests."""

    method: str
    path: str
    need: str
    subject_from: str | None = None

    def regex(self) -> re.Pattern[str]:
        parts = re.split(r"(\{[^}]+\})", self.path)
        return re.compile("".join(f"(?P<{p[1:-1]}>[^/]+)" if p.startswith("{") else re.escape(p) for p in parts))


#: THE table. Literal paths before templated ones where both could match.
RULES: tuple[Rule, ...] = (
    # ---- Confluent subset
    Rule("GET", "/", READ),
    Rule("GET", "/schemas/types", READ),
    Rule("GET", "/schemas", READ),
    Rule("GET", "/contexts", READ),
    Rule("GET", "/subjects", READ),
    Rule("GET", "/subjects/{subject}/versions", READ),
    Rule("POST", "/subjects/{subject}/versions", WRITE, subject_from="path"),
    Rule("POST", "/subjects/{subject}", READ),  # lookup: does this schema exist under the subject?
    Rule("DELETE", "/subjects/{subject}", ADMIN),
    Rule("GET", "/subjects/{subject}/versions/{version}", READ),
    Rule("GET", "/subjects/{subject}/versions/{version}/schema", READ),
    Rule("GET", "/subjects/{subject}/versions/{version}/referencedby", READ),
    Rule("DELETE", "/subjects/{subject}/versions/{version}", ADMIN),
    Rule("GET", "/schemas/ids/{schema_id}", READ),
    Rule("GET", "/schemas/ids/{schema_id}/schema", READ),
    Rule("GET", "/schemas/ids/{schema_id}/versions", READ),
    Rule("GET", "/schemas/ids/{schema_id}/subjects", READ),
    Rule("GET", "/config", READ),
    Rule("PUT", "/config", ADMIN),
    Rule("DELETE", "/config", ADMIN),
    Rule("GET", "/config/{subject}", READ),
    Rule("PUT", "/config/{subject}", ADMIN),
    Rule("DELETE", "/config/{subject}", ADMIN),
    Rule("GET", "/mode", READ),
    Rule("PUT", "/mode", ADMIN),
    Rule("DELETE", "/mode", ADMIN),
    Rule("GET", "/mode/{subject}", READ),
    Rule("PUT", "/mode/{subject}", ADMIN),
    Rule("DELETE", "/mode/{subject}", ADMIN),
    Rule("POST", "/compatibility/subjects/{subject}/versions/{version}", READ),
    Rule("POST", "/compatibility/subjects/{subject}/versions", READ),
    # Associations (app/schema/associations.py). confluent-kafka's serializers AND deserializers
    # look the topic up before their first message, so the lookups are plain reads. Creating one
    # binds a topic to a subject for every default-configured client: write on each subject and
    # on the topic's own default subject (<topic>-key|value), decided from the validated body.
    # Deleting is admin, as every DELETE here.
    Rule("GET", "/associations/subjects/{subject}", READ),
    Rule("GET", "/associations/resources/{resource_namespace}/{resource_name}", READ),
    Rule("GET", "/associations/resources/{resource_id}", READ),
    Rule("POST", "/associations", WRITE, subject_from="body.associations[].subject + body.resourceName"),
    Rule("DELETE", "/associations/resources/{resource_id}", ADMIN),
    # ---- Prism /v1
    Rule("POST", "/v1/schemas", WRITE, subject_from="body.topic"),  # admin: see decide() callers
    Rule("GET", "/v1/schemas/{schema_id}", READ),
    Rule("GET", "/v1/subjects", READ),
    Rule("GET", "/v1/subjects/{subject}/versions", READ),
    Rule("GET", "/v1/subjects/{subject}/versions/{version}", READ),
    Rule("DELETE", "/v1/subjects/{subject}/versions/{version}", ADMIN),
    Rule("POST", "/v1/subjects/{subject}/check", READ),
    Rule("GET", "/v1/subjects/{subject}/diff", READ),
    Rule("GET", "/v1/subjects/{subject}/consumers", READ),
    Rule("GET", "/v1/policies", READ),
    Rule("GET", "/v1/policies/{namespace}", READ),
    Rule("PUT", "/v1/policies/{namespace}", ADMIN),
    Rule("GET", "/v1/audit", ADMIN),
    Rule("GET", "/v1/pii/audit", ADMIN),
    Rule("POST", "/v1/approvals", WRITE, subject_from="body.subject"),
    Rule("GET", "/v1/approvals", READ),
    Rule("POST", "/v1/approvals/{approval_id}/{decision}", ADMIN),
    Rule("POST", "/v1/consumers", READ),  # a consumer reports the version it reads
    # ---- operations, docs, UI
    Rule("GET", "/healthz", OPEN),
    Rule("GET", "/readyz", OPEN),
    Rule("GET", "/metrics", OPEN),
    Rule("GET", "/ui", READ),
    Rule("GET", "/openapi.json", READ),
    Rule("GET", "/docs", READ),
    Rule("GET", "/docs/oauth2-redirect", READ),
    Rule("GET", "/redoc", READ),
)

#: What an unmatched method/path needs (a safe default for routes added without a rule).
DEFAULT_RULE = Rule("*", "*", ADMIN)

_COMPILED = [(r.method, r.regex(), r) for r in RULES]
_BY_TEMPLATE = {(r.method, r.path): r for r in RULES}


def rule_for(method: str, path: str) -> Rule:
    """The rule of a concrete request (``HEAD`` is ``GET``); :data:`DEFAULT_RULE` when none."""
    method = "GET" if method == "HEAD" else method
    for m, rx, rule in _COMPILED:
        if m == method and rx.fullmatch(path):
            return rule
    return DEFAULT_RULE


def explicit_rule(method: str, template: str) -> Rule | None:
    """The rule written for exactly this route template (route coverage, :func:`check_routed`)."""
    return _BY_TEMPLATE.get(("GET" if method == "HEAD" else method, template))


def allowed(principal: Principal, need: str, subject: str | None) -> bool:
    """Whether ``principal`` has ``need`` (on ``subject`` for ``write``)."""
    if need == OPEN:
        return True
    if need == READ:
        return principal.can_read()
    if need == WRITE:
        return principal.can_write(subject)
    return principal.is_admin


def actor_of(request: Any) -> str:
    """The audit actor: the verified principal's name. Never a client-supplied header.

    Every mutating handler asks for its actor before it writes, so this is also where a
    ``write`` route that never made its :func:`decide` call is stopped (500, nothing written)."""
    state = request.scope.get("state") or {}
    principal = state.get(STATE_PRINCIPAL)
    if principal is None:  # the middleware always sets it; refuse to invent an actor
        raise RuntimeError("no authenticated principal on this request (is RegistryAuthMiddleware installed?)")
    if state.get(STATE_PENDING):
        raise RuntimeError("this write route did not decide its authorization (authz.decide) before writing")
    return str(principal.name)


class Refused(Exception):
    """A refusal decided inside a route (:func:`decide`, :func:`check_routed`); the service
    turns it into the same response the middleware sends (:func:`refusal_response`)."""

    def __init__(self, status: int, code: int, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


def _refusal(principal: Principal, method: str, what_path: str, subject: str | None, need: str) -> Refused:
    what = f"{method} {what_path!r}"
    needs = f"{need} on subject {subject[:200]!r}" if need == WRITE and subject else need
    if principal.anonymous:
        return Refused(401, ERROR_UNAUTHENTICATED, f"Unauthorized: {what} needs credentials with the {needs} role")
    return Refused(403, ERROR_FORBIDDEN, f"Forbidden: user {principal.name[:100]!r} may not {what} (needs {needs})")


def decide(request: Any, *, subject: str | None, admin: bool = False) -> None:
    """The per-subject half of a ``write`` rule, made by the route from the values its handler
    will use: ``subject`` from the route's path parameter or its validated body model,
    ``admin`` when the validated request also changes a policy. Raises :class:`Refused`.

    Only callable on a request the middleware passed as ``write`` (anything else is a
    programming error, not a client's)."""
    state = request.scope.get("state") or {}
    principal, rule = state.get(STATE_PRINCIPAL), state.get(STATE_RULE)
    if principal is None or rule is None or rule.need != WRITE:
        raise RuntimeError(f"authz.decide on a request whose rule is {getattr(rule, 'need', None)!r}, not write")
    need = ADMIN if admin else WRITE
    if not allowed(principal, need, subject):
        raise _refusal(principal, request.scope["method"], rule.path, subject, need)
    state[STATE_PENDING] = False


def decides(func: Callable[..., Any]) -> Callable[..., Any]:
    """Mark ``func`` as a route dependency that calls :func:`decide` (``create_app`` checks
    that every ``write`` route has one)."""
    setattr(func, DECIDES_ATTR, True)
    return func


def has_decision(dependant: Any) -> bool:
    """Whether a FastAPI ``Dependant`` (or one of its sub-dependencies) is marked :func:`decides`."""
    return any(getattr(d.call, DECIDES_ATTR, False) or has_decision(d) for d in dependant.dependencies)


def check_routed(scope: Any, template: str) -> None:
    """Called by the route the router chose: the rule the middleware applied (looked up on the
    path) must be this route's own rule, else the request is refused - authorization and
    routing never act on two readings of one path."""
    applied = (scope.get("state") or {}).get(STATE_RULE)
    own = explicit_rule(scope["method"], template) or DEFAULT_RULE
    if applied is not None and applied is not own:
        raise Refused(403, ERROR_FORBIDDEN, f"Forbidden: {scope['method']} {template!r} was authorized as "
                                            f"{applied.method} {applied.path!r}")


# --------------------------------------------------------------------------- middleware


class RegistryAuthMiddleware:
    """Pure ASGI (Starlette's BaseHTTPMiddleware would halve read throughput, see
    ``service._CountRequests``): authenticate, look the rule up, authorize, then pass on."""

    def __init__(self, app: Any, auth: HttpAuth) -> None:
        self.app, self.auth = app, auth

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if scope["method"] not in SAFE_METHODS:
            # before anything else, open routes included: a browser's cached basic credentials
            # must not let another site's page change the registry (http_auth.cross_site_refusal)
            seen = {k: v.decode("latin-1") for k, v in reversed(scope["headers"])
                    if k in (b"host", b"origin", b"sec-fetch-site")}
            why = cross_site_refusal(scope["method"], seen.get(b"host"), seen.get(b"origin"),
                                     seen.get(b"sec-fetch-site"))
            if why is not None:
                await self._refuse(scope, receive, send, 403, ERROR_FORBIDDEN, f"Forbidden: {why}")
                return
        rule = rule_for(scope["method"], scope["path"])
        if rule.need == OPEN:
            await self.app(scope, receive, send)
            return
        headers = [v.decode("latin-1") for k, v in scope["headers"] if k == b"authorization"]
        peer = scope.get("client")  # the socket peer (behind a proxy: what the server was told to trust)
        try:
            principal = await self.auth.authenticate(headers, client=peer[0] if peer else None)
        except Unauthenticated as exc:
            await self._refuse(scope, receive, send, 401, ERROR_UNAUTHENTICATED, f"Unauthorized: {exc.message}")
            return
        except TooManyFailures as exc:
            await self._refuse(scope, receive, send, 429, ERROR_TOO_MANY_FAILURES, f"Too Many Requests: {exc.message}",
                               retry_after=exc.retry_after)
            return
        state = scope.setdefault("state", {})
        state[STATE_PRINCIPAL], state[STATE_RULE] = principal, rule
        need = rule.need
        if need == WRITE:
            # Which subject, and whether the request also needs admin, is decided by the route
            # from its validated input (decide()); here only: may this principal write at all?
            if not principal.can_write_some():
                await self._deny(scope, receive, send, principal, rule, None, need)
                return
            state[STATE_PENDING] = True
        elif not allowed(principal, need, None):
            await self._deny(scope, receive, send, principal, rule, None, need)
            return
        await self.app(scope, receive, send)

    async def _deny(self, scope: Any, receive: Any, send: Any, principal: Principal, rule: Rule,
                    subject: str | None, need: str) -> None:
        path = rule.path if rule is not DEFAULT_RULE else scope["path"][:200]
        r = _refusal(principal, scope["method"], path, subject, need)
        await self._refuse(scope, receive, send, r.status, r.code, r.message)

    async def _refuse(self, scope: Any, receive: Any, send: Any, status: int, code: int, message: str, *,
                      retry_after: float | None = None) -> None:
        status, headers, body = refusal_response(self.auth, status, code, message, retry_after=retry_after)
        raw = [(k.lower().encode(), v.encode()) for k, v in headers]
        raw.append((b"content-length", str(len(body)).encode()))
        await send({"type": "http.response.start", "status": status, "headers": raw})
        await send({"type": "http.response.body", "body": body})


def refusal_response(auth: HttpAuth, status: int, code: int, message: str, *,
                     retry_after: float | None = None) -> tuple[int, list[tuple[str, str]], bytes]:
    """Status, headers and body of a refusal: one shape whether the middleware or a route's
    :func:`decide` refuses (401 carries the challenges, 429 ``Retry-After``)."""
    headers = [("Content-Type", CONFLUENT_CT)]
    if status == 401:
        headers += [("WWW-Authenticate", c) for c in auth.challenges()]
    if retry_after is not None:
        headers.append(("Retry-After", str(max(1, math.ceil(retry_after)))))
    return status, headers, json.dumps({"error_code": code, "message": message}).encode()


# --------------------------------------------------------------------------- configuration


def registry_auth_from_env(env: Any = None) -> HttpAuth:
    """The registry's :class:`HttpAuth` from ``PRISM_REGISTRY_USERS_FILE``,
    ``PRISM_REGISTRY_JWT_CONFIG`` and ``PRISM_REGISTRY_ALLOW_ANONYMOUS`` (how ``prism schema
    serve`` hands its options to uvicorn's worker processes). Nothing configured is an
    error: a registry nobody can use, or one everybody can change, is never the default."""
    env = os.environ if env is None else env
    auth = auth_from_settings(users_file=env.get(ENV_USERS_FILE) or None, jwt_config=env.get(ENV_JWT_CONFIG) or None,
                              allow_anonymous=env.get(ENV_ALLOW_ANONYMOUS), realm="prism-schema-registry",
                              where=ENV_ALLOW_ANONYMOUS, env=env)
    if not auth.configured:
        raise ConfigError("the schema registry has no authentication configured",
                          path=f"{ENV_USERS_FILE} / {ENV_JWT_CONFIG} / {ENV_ALLOW_ANONYMOUS}",
                          hint="pass --users-file (see `prism schema hash-password`) and/or --jwt-config; "
                               "--allow-anonymous read opens reads to everyone")
    return auth


__all__ = ["ADMIN", "DEFAULT_RULE", "OPEN", "READ", "RULES", "WRITE", "Refused", "RegistryAuthMiddleware", "Rule",
           "actor_of", "allowed", "check_routed", "decide", "decides", "explicit_rule", "has_decision",
           "refusal_response", "registry_auth_from_env", "rule_for"]

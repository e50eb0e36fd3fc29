"""Who may call which registry route: ONE table, and the ASGI middleware that enforces it.

Every route of :mod:`app.schema.service` (Confluent subset, Prism ``/v1``, operations, UI,
OpenAPI) has a rule in :data:`RULES`; ``tests/schema/test_authz.py`` enumerates the app's
routes and fails when one has none. A request whose path and method match no rule needs
``admin`` - a route added later is closed until someone writes its rule.

Permissions (roles in :mod:`app.security.http_auth`):

- open (no credentials): ``/healthz``, ``/readyz`` and ``/metrics`` - probes and scrapers carry
  none, and none of them shows a subject or a schema (metrics are labelled by route template);
- ``read``: every read, plus what only reads (compatibility checks, ``POST /subjects/{s}``
  lookups, consumer version reports);
- ``write`` on a subject: registering under it; the subject comes from the path, or for the
  two ``/v1`` routes that carry it in the body (``POST /v1/schemas`` ``topic``, ``POST
  /v1/approvals`` ``subject``) from the JSON body, read here the way FastAPI reads it
  (``json.loads``: for a duplicated key the last one counts, in both places);
- ``admin``: global and subject configuration, ``/mode``, every DELETE, deciding approvals,
  policies, the audit log and the PII audit. ``POST /v1/schemas`` with a
  ``metadata.compatibility_mode`` sets the subject's policy, so it needs ``admin`` too.

The middleware runs before the fast read path (``_FastReads``) and inside the request
counter, so refused requests are counted but never served from a cache. It stores the
verified principal in the request state; :func:`actor_of` is the only source of the audit
actor (client headers such as ``X-Prism-Actor`` are ignored).

Refusals use Confluent's codes: 401 + ``WWW-Authenticate`` + ``{"error_code": 40101}``
without (usable) credentials, 403 + ``{"error_code": 40301}`` when the roles do not allow;
429 + ``Retry-After`` + ``{"error_code": 42901}`` from an address over the failed-attempt
limit (:class:`app.security.http_auth.FailureLimiter`).
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
    HttpAuth,
    Principal,
    TooManyFailures,
    Unauthenticated,
    auth_from_settings,
)

CONFLUENT_CT = "application/vnd.schemaregistry.v1+json"
OPEN, READ, WRITE, ADMIN = "open", "read", "write", "admin"
#: service._EncodedSlashes hides an encoded '/' inside a segment as this while routing.
_ENCODED_SLASH, _ENCODED_SLASH_KEY = "\x00", "prism.encoded_slash"
#: Bodies read for a subject check are bounded (a schema text is rarely over a few MB).
MAX_INSPECTED_BODY = 16 * 1024 * 1024

ENV_USERS_FILE = "PRISM_REGISTRY_USERS_FILE"
ENV_JWT_CONFIG = "PRISM_REGISTRY_JWT_CONFIG"
ENV_ALLOW_ANONYMOUS = "PRISM_REGISTRY_ALLOW_ANONYMOUS"


def _compat_mode_needs_admin(body: Any) -> bool:
    meta = body.get("metadata") if isinstance(body, dict) else None
    return bool(isinstance(meta, dict) and meta.get("compatibility_mode") and not body.get("dry_run"))


@dataclass(frozen=True, slots=True)
class Rule:
    """``method`` + ``path`` template (FastAPI syntax) -> the permission it needs.

    ``need`` is read/write/admin. For ``write``, the subject is the ``{subject}`` path
    parameter, or ``body_subject`` names the JSON body field holding it. ``admin_if`` raises
    the need to admin for bodies it returns True for."""

    method: str
    path: str
    need: str
    body_subject: str | None = None
    admin_if: Callable[[Any], bool] | None = None

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
    Rule("POST", "/subjects/{subject}/versions", WRITE),
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
    # ---- Prism /v1
    Rule("POST", "/v1/schemas", WRITE, body_subject="topic", admin_if=_compat_mode_needs_admin),
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
    Rule("POST", "/v1/approvals", WRITE, body_subject="subject"),
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
_REGEX = {id(r): rx for _, rx, r in _COMPILED}


def rule_for(method: str, path: str) -> Rule:
    """The rule of a concrete request (``HEAD`` is ``GET``); :data:`DEFAULT_RULE` when none."""
    method = "GET" if method == "HEAD" else method
    for m, rx, rule in _COMPILED:
        if m == method and rx.fullmatch(path):
            return rule
    return DEFAULT_RULE


def explicit_rule(method: str, template: str) -> Rule | None:
    """The rule written for exactly this route template (for the route-coverage test)."""
    return next((r for r in RULES if r.method == method and r.path == template), None)


def allowed(principal: Principal, need: str, subject: str | None) -> bool:
    if need == OPEN:
        return True
    if need == READ:
        return principal.can_read()
    if need == WRITE:
        return principal.can_write(subject)
    return principal.is_admin


def actor_of(request: Any) -> str:
    """The audit actor: the verified principal's name. Never a client-supplied header."""
    principal = getattr(request.state, "principal", None)
    if principal is None:  # the middleware always sets it; refuse to invent an actor
        raise RuntimeError("no authenticated principal on this request (is RegistryAuthMiddleware installed?)")
    return str(principal.name)


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
        scope.setdefault("state", {})["principal"] = principal
        need, subject = rule.need, None
        if need == WRITE and rule.body_subject is None:
            m = _REGEX[id(rule)].fullmatch(scope["path"])
            subject = m.group("subject") if m else None
            if subject is not None and scope.get(_ENCODED_SLASH_KEY):
                subject = subject.replace(_ENCODED_SLASH, "/")  # the subject the route will see
        if need == WRITE and rule.body_subject is not None:
            if not principal.can_write_some():
                await self._deny(scope, receive, send, principal, rule, None, need)
                return
            body = await _read_body(receive)
            if body is None:
                await self._refuse(scope, receive, send, 413, 41301,
                                   f"request body over {MAX_INSPECTED_BODY} bytes")
                return
            receive = _replay(body)
            try:
                doc = json.loads(body)
            except (ValueError, RecursionError):
                doc = None
            value = doc.get(rule.body_subject) if isinstance(doc, dict) else None
            subject = value if isinstance(value, str) else None  # unknown subject: only global writers
            if rule.admin_if is not None and rule.admin_if(doc):
                need = ADMIN
        if not allowed(principal, need, subject):
            await self._deny(scope, receive, send, principal, rule, subject, need)
            return
        await self.app(scope, receive, send)

    async def _deny(self, scope: Any, receive: Any, send: Any, principal: Principal, rule: Rule,
                    subject: str | None, need: str) -> None:
        what = f"{scope['method']} {rule.path if rule is not DEFAULT_RULE else scope['path'][:200]!r}"
        needs = f"{need} on subject {subject[:200]!r}" if need == WRITE and subject else need
        if principal.anonymous:
            await self._refuse(scope, receive, send, 401, ERROR_UNAUTHENTICATED,
                               f"Unauthorized: {what} needs credentials with the {needs} role")
            return
        await self._refuse(scope, receive, send, 403, ERROR_FORBIDDEN,
                           f"Forbidden: user {principal.name[:100]!r} may not {what} (needs {needs})")

    async def _refuse(self, scope: Any, receive: Any, send: Any, status: int, code: int, message: str, *,
                      retry_after: float | None = None) -> None:
        headers = [(b"content-type", CONFLUENT_CT.encode())]
        if status == 401:
            headers += [(b"www-authenticate", c.encode()) for c in self.auth.challenges()]
        if retry_after is not None:
            headers.append((b"retry-after", str(max(1, math.ceil(retry_after))).encode()))
        body = json.dumps({"error_code": code, "message": message}).encode()
        headers.append((b"content-length", str(len(body)).encode()))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})


async def _read_body(receive: Any) -> bytes | None:
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_INSPECTED_BODY:
            return None
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


def _replay(body: bytes) -> Any:
    sent = [False]

    async def receive() -> dict[str, Any]:
        if not sent[0]:
            sent[0] = True
            return {"type": "http.request", "body": body, "more_body": False}
        return {"type": "http.disconnect"}

    return receive


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


__all__ = ["ADMIN", "DEFAULT_RULE", "OPEN", "READ", "RULES", "WRITE", "RegistryAuthMiddleware", "Rule", "actor_of",
           "allowed", "explicit_rule", "registry_auth_from_env", "rule_for"]

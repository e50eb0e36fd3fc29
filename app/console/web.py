"""The console's web app: server-rendered pages (Jinja2, autoescaped) and one state-changing
action, the DLQ replay.

Why server-rendered: every value shown - a schema, a DLQ payload, an error message, a header -
comes from producers or operators and may hold markup. Jinja2's autoescaping turns all of it
into text in one place, and the Content-Security-Policy (scripts and styles from this origin
only, no inline script) stops anything that slipped through from running. The small script
in ``static/console.js`` only filters tables; the pages work without it.

Who may read what data: the DLQ pages show a record above the user's clearance as metadata only,
and write one audit record per such view (app/console/clearance.py).

Who may do what (one check, :func:`_authenticate`, in front of every route but the log-in page,
its stylesheet and ``/healthz``): a session from the log-in form, or an ``Authorization`` header
(HTTP basic against the users file, or a bearer JWT) for scripts. Any role reads; ``admin`` is
needed to replay and to see the audit log and PII audit (the registry shows those to admins
only). A replay is a POST that carries the session's CSRF token and passes a same-origin check.
"""

from __future__ import annotations

import itertools
import json
import urllib.parse
from collections import Counter
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any

import jinja2
from fastapi import FastAPI, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles

from app.console.backends import BackendError, Kafka, NotFound, RegistryClient, Workers, replay_topology
from app.console.clearance import RefusalAudit, Withheld, clearance_of, covers, label
from app.console.sessions import COOKIE, Session, Sessions, check_same_origin, csrf_ok
from app.console.settings import MAX_FORM_BYTES, ConsoleSettings, static_dir, templates_dir
from app.decimal_text import decimal
from app.schema.pretty import pretty_schema
from app.security.http_auth import Principal, TooManyFailures, Unauthenticated, basic_header
from app.security.http_limits import BodyLimit

#: Reachable without logging in: the log-in page, its two static assets, the liveness probe.
OPEN_PATHS = frozenset({"/login", "/healthz", "/static/console.css", "/static/console.js"})
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
       "form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
#: DLQ records listed on one page at most (the newest)
MAX_ROWS = 500

# ------------------------------------------------------------------ the OpenAPI description --
# FastAPI generates the console's document from its routes (``GET /openapi.json``, any role); what
# it cannot see is declared here: the HTML pages' answers (200, and the error page of 403, 404 and
# 502), the guard's JSON answers (401, 429), the body limit's 413, and the form bodies the
# state-changing routes read by hand (``_form``). tests/security/test_console_fuzz.py holds the
# running console, with real back ends, to it: every status and content type as declared here.
_HTML = {"text/html": {"schema": {"type": "string"}}}
_JSON_ERROR = {"application/json": {"schema": {
    "type": "object", "required": ["error"],
    "properties": {"error": {"type": "string"}, "login": {"type": "string"}}}}}
#: what the guard and the error pages answer on every route but the open ones
COMMON_RESPONSES: dict[int | str, dict[str, Any]] = {
    303: {"description": "not logged in, from a browser (an HTML GET): sent to the log-in page"},
    400: {"description": "a query value the page cannot use (not a whole number, a `before` cursor that is not "
                         "the page's): the error page, naming the value and how to write it", "content": _HTML},
    401: {"description": "no or invalid credentials", "content": _JSON_ERROR},
    403: {"description": "the role does not allow it (or, for a replay, the user's clearance does not cover the "
                         "record's classification), or a form without its session, CSRF token or origin",
          "content": _HTML},
    413: {"description": "a body over the console's limit (refused before it is read)", "content": {
        "application/json": {"schema": {"type": "object", "required": ["error_code", "message"]}}}},
    429: {"description": "too many failed log-ins from this address for this user", "content": _JSON_ERROR},
    502: {"description": "a back end (registry, worker, broker) did not answer, or the audit record of a page "
                         "view that withheld classified records could not be written", "content": _HTML},
}
#: ... and on a route whose path names something that may not exist
GUARDED_404: dict[int | str, dict[str, Any]] = {
    **COMMON_RESPONSES, 404: {"description": "no such pipeline, source, record or subject", "content": _HTML}}


def _form_body(fields: dict[str, str], required: tuple[str, ...] = ()) -> dict[str, Any]:
    """The ``openapi_extra`` of a route that reads an ``application/x-www-form-urlencoded`` body."""
    schema: dict[str, Any] = {"type": "object", "additionalProperties": {"type": "string"},
                              "properties": {k: {"type": "string", "description": d} for k, d in fields.items()}}
    if required:
        schema["required"] = list(required)
    return {"requestBody": {"required": True, "content": {"application/x-www-form-urlencoded": {"schema": schema}}}}


class NeedsLogin(Exception):
    """No (valid) credentials: a browser is sent to the log-in page, a script gets 401."""


class Forbidden(Exception):
    """Authenticated, but the role does not allow it (403)."""


class BadRequest(Exception):
    """A query value the page cannot use (400): the error page says which and how to write it."""

    def __init__(self, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.message, self.hint = message, hint


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(templates_dir())), autoescape=True,
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters["pretty"] = lambda v: json.dumps(v, indent=2, ensure_ascii=False, default=str, sort_keys=False)
    env.filters["when"] = _when
    env.filters["q"] = lambda v: urllib.parse.quote(str(v), safe="")
    env.filters["cap"] = _cap
    return env


#: what a DLQ page shows of one field at most (characters), as `prism dlq list|show` cut theirs
#: (app/cli/ops.py): a code (reason, stage, source, identity), an error text, a header value or key
CAPS = {"code": 200, "error": 4000, "header": 1000}
#: reason chips on a DLQ list page at most (the most frequent)
MAX_CHIPS = 50
#: headers shown on a record page at most (a 1 MB record holds ~100,000 one-byte headers)
MAX_HEADERS = 200


def _cap(value: Any, kind: str, ref: str) -> str:
    """`value` as text, cut to ``CAPS[kind]`` characters with how many follow and where to read
    them whole (`prism dlq show REF --json`: the console has no raw route). Why: every field of a
    DLQ record is its writer's to choose - 20 records with a 1 MB error header made one list page
    19.5 MB of HTML, a 1 MB key a 4 MB record page."""
    from app.cli.ops import _cell

    return _cell(str(value), CAPS[kind], ref, whole=" --json")


def _when(value: Any) -> str:
    """Epoch seconds or milliseconds (or an ISO string) as UTC, to the second. Total: a time no
    calendar holds - a record's timestamp is its producer's to set (the trace page shows the
    output record's), a ledger entry's is whoever wrote the topic's - shows as its number, where
    ``datetime`` raised and the page answered 500."""
    if value in (None, ""):
        return ""
    if isinstance(value, str):
        return value[:19].replace("T", " ")
    try:
        t = float(value)
        t = t / 1000 if t > 1e11 else t
        return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M:%S")
    except (TypeError, ValueError, OverflowError, OSError):
        return f"{str(value)[:40]} (not a date)"


async def _form(request: Request) -> dict[str, str]:
    """An ``application/x-www-form-urlencoded`` body (the only kind the console's forms send),
    size-limited; the last value of a repeated field would be ambiguous, so repeats are refused."""
    body = await request.body()
    if len(body) > MAX_FORM_BYTES:
        raise Forbidden("form too large")
    pairs = urllib.parse.parse_qsl(body.decode("utf-8", errors="replace"), keep_blank_values=True)
    out: dict[str, str] = {}
    for k, v in pairs:
        if k in out:
            raise Forbidden(f"form field {k!r} sent twice")
        out[k] = v
    return out


def _own_origin(request: Request) -> str:
    return f"{request.url.scheme}://{request.headers.get('host', request.url.netloc)}"


def create_app(settings: ConsoleSettings) -> FastAPI:
    """The console around ``settings`` (its users: ``settings.auth``; back ends: the rest)."""
    sessions = Sessions(settings.idle_timeout_s, settings.max_session_s)
    registry = RegistryClient(settings)
    workers = Workers(settings)
    kafka = Kafka(settings)
    refusals = RefusalAudit(settings.bootstrap, settings.broker_settings, signing_key=settings.audit_signing_key,
                            principal=settings.audit_principal, audit_topic=settings.audit_topic)
    env = _environment()

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> Any:
        yield
        await registry.close()
        await refusals.close()

    app = FastAPI(title="Prism console", version="1", docs_url=None, redoc_url=None, openapi_url="/openapi.json",
                  lifespan=lifespan,
                  description="The console's pages (HTML) and forms. Every route but /login and /healthz needs a "
                              "log-in session or an Authorization header (HTTP basic or a bearer JWT); forms need a "
                              "session, its CSRF token and the same origin (docs/console.md).")
    app.state.sessions = sessions
    app.state.refusals = refusals
    app.mount("/static", StaticFiles(directory=str(static_dir())), name="static")

    def render(request: Request, template: str, status: int = 200, **ctx: Any) -> HTMLResponse:
        session: Session | None = getattr(request.state, "session", None)
        principal: Principal | None = getattr(request.state, "principal", None)
        html = env.get_template(template).render(
            principal=principal, csrf=session.csrf if session else "", path=request.url.path,
            is_admin=bool(principal and principal.is_admin), **ctx)
        return HTMLResponse(html, status_code=status)

    def error_page(request: Request, status: int, title: str, message: str, hint: str = "") -> HTMLResponse:
        """The console's one error page. Its message and hint often quote a back end (a broker's
        exception, a registry or worker URL) and may quote what the request sent: both go
        through the log redaction's rules (`redact_patterns`), so a back end's `user:password@`
        or a `Basic` credential is masked on the page as in a log."""
        from app.observability.redaction import redact_patterns

        return render(request, "error.html", status, title=title, message=redact_patterns(message),
                      hint=redact_patterns(hint))

    async def _authenticate(request: Request) -> None:
        """Sets ``request.state.principal`` (and ``.session``), or raises (module docs)."""
        session = sessions.get(request.cookies.get(COOKIE))
        if session is not None:
            request.state.session, request.state.principal = session, session.principal
            return
        header = request.headers.getlist("authorization")
        if not header:
            raise NeedsLogin()
        try:
            principal = await settings.auth.authenticate(header, request.client.host if request.client else None)
        except Unauthenticated:
            raise NeedsLogin() from None
        if not principal.can_read():
            raise Forbidden(f"{principal.name} has no role here")
        request.state.session, request.state.principal = None, principal

    @app.middleware("http")
    async def guard(request: Request, call_next: Any) -> Response:
        """Every request but :data:`OPEN_PATHS` is authenticated here, before any route runs -
        a route added later cannot be left open by forgetting a dependency."""
        request.state.session = request.state.principal = None
        try:
            if request.url.path not in OPEN_PATHS:
                await _authenticate(request)
            response: Response = await call_next(request)
        except NeedsLogin:
            if request.method == "GET" and "text/html" in request.headers.get("accept", ""):
                nxt = request.url.path + (f"?{request.url.query}" if request.url.query else "")
                response = RedirectResponse("/login?" + urllib.parse.urlencode({"next": nxt}), status_code=303)
            else:
                challenges = settings.auth.challenges()
                response = JSONResponse({"error": "unauthenticated", "login": "/login"}, status_code=401,
                                        headers={"WWW-Authenticate": ", ".join(challenges)})
        except TooManyFailures as exc:
            response = JSONResponse({"error": "too_many_failures"}, status_code=429,
                                    headers={"Retry-After": str(max(1, int(exc.retry_after)))})
        except Forbidden as exc:
            response = error_page(request, 403, "Not allowed", str(exc))
        response.headers["Content-Security-Policy"] = CSP
        response.headers["X-Content-Type-Options"] = "nosniff"
        response.headers["Referrer-Policy"] = "same-origin"
        response.headers["X-Frame-Options"] = "DENY"
        if not request.url.path.startswith("/static/"):
            response.headers["Cache-Control"] = "no-store"
        return response

    @app.exception_handler(BackendError)
    async def backend_error(request: Request, exc: BackendError) -> HTMLResponse:
        return error_page(request, 502, "A back end did not answer", exc.message, exc.hint or "")

    from aiokafka.errors import KafkaError

    @app.exception_handler(KafkaError)
    async def broker_error(request: Request, exc: KafkaError) -> HTMLResponse:
        """A broker that went away mid-request: the page says so (502), as for any back end."""
        return error_page(request, 502, "A back end did not answer",
                          f"the Kafka broker ({settings.bootstrap}) failed: {type(exc).__name__}: {exc}"[:500],
                          "check --broker (PRISM_BROKER_URL) and that the broker runs")

    from starlette.exceptions import HTTPException as StarletteHTTPException

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> HTMLResponse:
        """The router's own answers (no such route - a subject name with a line break matches
        none -, a method not allowed): the console's error page, as every other page, not
        Starlette's JSON."""
        response = error_page(request, exc.status_code, "Not found" if exc.status_code == 404
                              else f"HTTP {exc.status_code}", str(exc.detail)[:300])
        for k, v in (exc.headers or {}).items():
            response.headers[k] = v
        return response

    from fastapi.exceptions import RequestValidationError

    @app.exception_handler(RequestValidationError)
    async def bad_query(request: Request, exc: RequestValidationError) -> HTMLResponse:
        """A query value of the wrong type (``?limit=abc``, ``?partition=-x``): the error page (400)
        naming each parameter, what it must be and what was sent - FastAPI answered its JSON 422,
        which a person in a browser cannot act on."""
        problems, hints = [], []
        for err in exc.errors()[:5]:
            where = ".".join(str(p) for p in err.get("loc", ()) if p not in ("query", "path", "body"))
            sent = str(err.get("input", ""))
            problems.append(f"{where or 'a parameter'}={sent[:60]!r}{'…' if len(sent) > 60 else ''}: "
                            f"{err.get('msg', 'not valid')}")
            whole = "int" in str(err.get("type", ""))
            hints.append(f"write {where} as a whole number, e.g. {where}=100" if whole else
                         f"{where}: {err.get('msg', 'not valid')}")
        return error_page(request, 400, "Bad request", "; ".join(problems), "; ".join(hints))

    @app.exception_handler(BadRequest)
    async def bad_request(request: Request, exc: BadRequest) -> HTMLResponse:
        return error_page(request, 400, "Bad request", exc.message, exc.hint)

    @app.exception_handler(NotFound)
    async def not_found(request: Request, exc: NotFound) -> HTMLResponse:
        return error_page(request, 404, "Not found", exc.message, exc.hint or "")

    @app.exception_handler(Forbidden)
    async def forbidden(request: Request, exc: Forbidden) -> HTMLResponse:
        return error_page(request, 403, "Not allowed", str(exc))

    def need_admin(request: Request, what: str) -> Principal:
        principal: Principal = request.state.principal
        if not principal.is_admin:
            raise Forbidden(f"{what} needs the admin role; {principal.name} has "
                            f"{', '.join(sorted(principal.roles)) or 'no role'}")
        return principal

    async def audit_withheld(request: Request, clearance: str, withheld: list[Withheld]) -> None:
        """The audit record of what this page view withheld (clearance.py); when it cannot be
        written the page is not shown (502), so no view goes unrecorded."""
        if not withheld:
            return
        from app.errors import PrismError

        principal: Principal = request.state.principal
        try:
            await refusals.write(principal.name, clearance, withheld, request.url.path)
        except PrismError as exc:
            raise BackendError(f"the audit record of the {len(withheld)} record(s) withheld from {principal.name} "
                               f"could not be written to {refusals.audit_topic!r}: {exc.message}",
                               hint="check that the console's broker user may write the audit topic") from None

    def check_post(request: Request, form: dict[str, str]) -> None:
        """CSRF: a session's form, with its token, from this origin."""
        session: Session | None = request.state.session
        if session is None:
            raise Forbidden("state-changing requests need a log-in session (the form of a console page)")
        if not check_same_origin(_own_origin(request), request.headers.get("origin"), request.headers.get("referer")):
            raise Forbidden("cross-origin request refused")
        if not csrf_ok(session, form.get("csrf")):
            raise Forbidden("the form's CSRF token does not match this session; reload the page and try again")

    def secure(request: Request) -> bool:
        return request.url.scheme == "https"

    # ------------------------------------------------------------------ log-in, log-out --
    def _next(value: str | None) -> str:
        """Only a local path: the log-in form must not become an open redirect."""
        if value and value.startswith("/") and not value.startswith("//") and "\\" not in value:
            return value
        return "/"

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/login", response_class=HTMLResponse)
    async def login_page(request: Request, next: str | None = None) -> HTMLResponse:
        return render(request, "login.html", next=_next(next), error="")

    @app.post("/login", response_class=RedirectResponse, status_code=303, responses={
        303: {"description": "logged in: the session cookie, and on to `next`"},
        401: {"description": "wrong user name or password: the form again", "content": _HTML},
        403: {"description": "a cross-origin log-in, a repeated field or a user without a role", "content": _HTML},
        429: {"description": "too many failed log-ins: the form again, saying how long to wait", "content": _HTML},
        413: COMMON_RESPONSES[413],
        503: {"description": "every session belongs to another user", "content": _HTML}},
        openapi_extra=_form_body({"user": "user name", "password": "password", "next": "local path to go on to"}))
    async def login(request: Request) -> Response:
        form = await _form(request)
        if not check_same_origin(_own_origin(request), request.headers.get("origin"), request.headers.get("referer")):
            raise Forbidden("cross-origin log-in refused")
        nxt = _next(form.get("next"))
        user, password = form.get("user", ""), form.get("password", "")
        try:
            if not user or ":" in user or not settings.auth.users:
                raise Unauthenticated("invalid user name or password")
            principal = await settings.auth.authenticate(basic_header(user, password),
                                                         request.client.host if request.client else None)
        except Unauthenticated:
            return render(request, "login.html", 401, next=nxt, error="Invalid user name or password.")
        except TooManyFailures as exc:
            return render(request, "login.html", 429, next=nxt,
                          error=f"Too many failed attempts; wait {max(1, int(exc.retry_after))} s.")
        if not principal.can_read():
            return render(request, "login.html", 403, next=nxt, error=f"{principal.name} has no role here.")
        try:
            token, _ = sessions.create(principal)
        except Sessions.Full:
            return render(request, "login.html", 503, next=nxt,
                          error="The console is full: every session belongs to a different user. Try again later, "
                                "or ask an operator to restart the console.")
        response = RedirectResponse(nxt, status_code=303)
        response.set_cookie(COOKIE, token, httponly=True, samesite="strict", secure=secure(request), path="/")
        return response

    @app.post("/logout", response_class=RedirectResponse, status_code=303, responses={
        **COMMON_RESPONSES, 303: {"description": "logged out (or, from a browser without a session, sent to log in)"}},
              openapi_extra=_form_body({"csrf": "the session's CSRF token"}, ("csrf",)))
    async def logout(request: Request) -> Response:
        check_post(request, await _form(request))
        sessions.end(request.cookies.get(COOKIE))
        response = RedirectResponse("/login", status_code=303)
        response.delete_cookie(COOKIE, path="/")
        return response

    # ------------------------------------------------------------------------ pipelines --
    @app.get("/", response_class=HTMLResponse, responses=COMMON_RESPONSES)
    async def pipelines(request: Request) -> HTMLResponse:
        from app.observability.redaction import redact_patterns

        found, errors = await workers.pipelines() if workers.urls else ([], [])
        errors = [redact_patterns(e) for e in errors]  # they quote back-end URLs (error_page)
        return render(request, "pipelines.html", pipelines=found, errors=errors, worker_urls=workers.urls,
                      interval=settings.rate_interval_s)

    async def _topology(name: str) -> tuple[dict[str, Any], Any]:
        info = await workers.info(name)
        return info, replay_topology(info)

    @app.get("/pipelines/{name}/dlq", response_class=HTMLResponse, responses=GUARDED_404)
    async def dlq(request: Request, name: str, reason: str | None = None, q: str | None = None,
                  source: str | None = None, before: str | None = None) -> HTMLResponse:
        """The newest DLQ records (a window bounded in records and bytes, app/cli/dlq.py
        `read_window`), filtered by `reason` and `q` within it; `before` (with `source` when the
        pipeline has several) is the cursor of the page of older records the page links to."""
        from app.cli.dlq import BadSelector, parse_cursor
        from app.cli.ops import dlq_row

        source, before = source or None, before or None  # the page's links send them empty
        info, topology = await _topology(name)
        if source is not None and source not in {s.topic for s in topology.sources}:
            raise NotFound(f"{source!r} is not a source of {name}")
        cursor = None
        if before is not None:
            if source is None and len(topology.sources) > 1:
                raise BadRequest(f"before={before[:100]!r} names offsets of one DLQ topic, and {name} has "
                                 f"{len(topology.sources)}", hint="add source=TOPIC (the page's \"older\" links do)")
            chosen = next(s for s in topology.sources if source is None or s.topic == source)
            try:
                cursor = parse_cursor(before, chosen.partitions, chosen.topic + topology.dlq.topic_suffix,
                                      option="before")
            except BadSelector as exc:
                raise BadRequest(exc.message, hint="use the page's \"older records\" link, or write before= as "
                                                   "P@O entries separated by commas, e.g. 0@1200,1@1180") from None
        windows = await kafka.dlq_window(topology, source, cursor)
        records = sorted((r for w in windows for r in w.records), key=lambda r: (r.timestamp or 0, r.partition,
                                                                                   r.offset))
        warnings: list[str] = []
        ledger = await kafka.ledger(topology, warnings)
        clearance = clearance_of(request.state.principal)
        rows = []
        for rec in records:
            row = dlq_row(rec)
            row["ref"] = f"{rec.partition}@{rec.offset}"
            row["source_topic"] = rec.topic[: -len(topology.dlq.topic_suffix)] if topology.dlq.topic_suffix else rec.topic
            row["replayed"] = ledger.get(rec.topic, {}).get(row["ref"])
            labelled = label(rec)
            row["classification"] = labelled.classification
            row["withheld"] = None
            if not covers(clearance, labelled.classification):
                # the error text may quote the data: neither shown nor searchable (a search is an oracle)
                row["error"] = row["exception"] = ""
                row["withheld"] = Withheld(f"{rec.topic}/{row['ref']}", labelled.classification, labelled.envelope,
                                           row["source_topic"])
            rows.append(row)
        by_reason = Counter(r["reason"] for r in rows)
        # a chip (a link carrying the reason) for the most frequent codes only: reasons are header
        # values anyone who writes the DLQ chooses, and 5,000 distinct 3 kB ones made 5,000 chips
        # whose links alone were ~45 MB of HTML
        chips = [(r, n) for r, n in sorted(by_reason.items(), key=lambda kv: (-kv[1], kv[0]))
                 if len(r) <= CAPS["code"]][:MAX_CHIPS]
        needle = (q or "").strip().lower()
        shown = [r for r in rows if (not reason or r["reason"] == reason)
                 and (not needle or needle in " ".join(str(r[k]) for k in (
                     "ref", "source", "stage", "reason", "error", "attested_identity", "exception")).lower())]
        page = shown[-MAX_ROWS:]
        await audit_withheld(request, clearance, [r["withheld"] for r in page if r["withheld"] is not None])
        scanned = [{"topic": w.topic, "source": w.topic[: len(w.topic) - len(topology.dlq.topic_suffix)],
                    "read": len(w.records), "total": w.total, "older": w.older, "cut_by_bytes": w.cut_by_bytes,
                    "spans": [f"{p.partition}@{p.first}-{p.stop - 1}" for p in w.partitions if p.stop > p.first],
                    "next": ",".join(f"{p}@{o}" for p, o in sorted(w.next_cursor.items())),
                    "unreadable": [f"{p}@{a}-{b - 1}" for p, a, b in w.unreadable]} for w in windows]
        return render(request, "dlq.html", name=name, info=info, rows=page, total=len(rows),
                      matching=len(shown), by_reason=chips, other_reasons=(len(by_reason) - len(chips),
                                                                           len(rows) - sum(n for _, n in chips)),
                      reason=reason or "", q=q or "", source=source or "", before=before or "", scanned=scanned,
                      warnings=warnings, clearance=clearance)

    async def _record(name: str, source: str, ref: str) -> tuple[Any, Any, dict[str, Any]]:
        from app.cli.dlq import BadSelector, Unreadable, parse_ref

        info, topology = await _topology(name)
        chosen = [s for s in topology.sources if s.topic == source]
        if not chosen:
            raise NotFound(f"{source!r} is not a source of {name}")
        try:
            part, off = parse_ref(ref, chosen[0].partitions, source + topology.dlq.topic_suffix, option="record")
        except BadSelector as exc:
            raise NotFound(exc.message, hint=exc.hint or "") from None
        try:
            rec = await kafka.dlq_record(topology, source, part, off)
        except Unreadable as exc:  # not a back end's fault: the record is there and cannot be shown
            raise NotFound(exc.message, hint=exc.hint or "") from None
        if rec is None:
            raise NotFound(f"no record at {ref} in {source + topology.dlq.topic_suffix}",
                           hint="deleted by retention, or beyond the end")
        return topology, rec, info

    @app.get("/pipelines/{name}/dlq/{source}/{ref}", response_class=HTMLResponse, responses=GUARDED_404)
    async def dlq_record(request: Request, name: str, source: str, ref: str) -> HTMLResponse:
        from app.cli.ops import dlq_row, dlq_show_doc

        topology, rec, _ = await _record(name, source, ref)
        clearance = clearance_of(request.state.principal)
        labelled = label(rec)
        ledger = (await kafka.ledger(topology)).get(rec.topic, {}).get(ref)
        if not covers(clearance, labelled.classification):
            # metadata only (clearance.py): no value, key, headers, error text or digest
            doc = {**dlq_row(rec), "error": "", "exception": "", "value_bytes": len(rec.value or b"")}
            await audit_withheld(request, clearance, [Withheld(f"{rec.topic}/{ref}", labelled.classification,
                                                               labelled.envelope, source)])
            return render(request, "dlq_record.html", name=name, source=source, ref=ref, doc=doc, value={},
                          ledger=ledger, classification=labelled.classification, clearance=clearance, withheld=True,
                          max_headers=MAX_HEADERS)
        doc = dlq_show_doc(rec)
        value = {k: v for k, v in doc["value"].items() if k not in ("kind", "not_an_envelope")}
        return render(request, "dlq_record.html", name=name, source=source, ref=ref, doc=doc, value=value,
                      ledger=ledger, classification=labelled.classification, clearance=clearance, withheld=False,
                      max_headers=MAX_HEADERS)

    @app.post("/pipelines/{name}/dlq/{source}/{ref}/replay", response_class=HTMLResponse, responses=GUARDED_404,
              openapi_extra=_form_body({"csrf": "the session's CSRF token",
                                        "force": "`yes`: replay a record the ledger says was replayed"}, ("csrf",)))
    async def dlq_replay(request: Request, name: str, source: str, ref: str) -> HTMLResponse:
        form = await _form(request)
        check_post(request, form)
        principal = need_admin(request, "replaying a DLQ record")
        topology, rec, _ = await _record(name, source, ref)
        clearance, classification = clearance_of(principal), label(rec).classification
        if not covers(clearance, classification):
            raise Forbidden(f"{ref} is {classification} data and {principal.name}'s clearance is {clearance}: "
                            "replaying it needs a clearance that covers it")
        report = await kafka.replay(topology, source, ref, force=form.get("force") == "yes",
                                    by=f"console:{principal.name}")
        outcome = report.outcomes[0] if report.outcomes else None
        return render(request, "replay_result.html", name=name, source=source, ref=ref, outcome=outcome)

    @app.get("/pipelines/{name}/trace", response_class=HTMLResponse, responses=GUARDED_404)
    async def trace(request: Request, name: str, topic: str, partition: int, offset: int) -> HTMLResponse:
        """Where the input at ``topic``/``partition``/``offset`` went: the ``.v3`` record whose
        ``prism-source`` names it (a replayed record's new offset), decoded and redacted."""
        from app.cli.envelope_view import value_doc

        info, topology = await _topology(name)
        if topic not in {s.topic for s in topology.sources}:
            raise NotFound(f"{topic!r} is not a source of {name}")
        outputs = [o for o in info["outputs"] if o.startswith(topic + ".")]
        output = next((o for o in outputs if o.endswith(".v3")), outputs[-1] if outputs else topic + ".v3")
        partitions = next(s.partitions for s in topology.sources if s.topic == topic)
        rec = await kafka.find_output(output, partitions, f"{topic}/{partition}/{offset}".encode())
        doc = None if rec is None else {"partition": rec.partition, "offset": rec.offset,
                                        "timestamp": rec.timestamp, "value": None, "classification": ""}
        clearance = clearance_of(request.state.principal)
        if rec is not None and doc is not None:
            labelled = label(rec)
            doc["classification"] = labelled.classification
            if covers(clearance, labelled.classification):
                doc["value"] = value_doc(rec.value or b"")
            else:
                await audit_withheld(request, clearance, [Withheld(f"{rec.topic}/{rec.partition}@{rec.offset}",
                                                                   labelled.classification, labelled.envelope,
                                                                   rec.topic)])
        return render(request, "trace.html", name=name, topic=topic, partition=partition, offset=offset,
                      output=output, found=doc, clearance=clearance)

    # ------------------------------------------------------------------------- subjects --
    @app.get("/subjects", response_class=HTMLResponse, responses=COMMON_RESPONSES)
    async def subjects(request: Request, q: str | None = None) -> HTMLResponse:
        import asyncio

        needle = (q or "").strip()
        all_subjects = await registry.subjects()
        by_id: list[dict[str, Any]] = []
        if (schema_id := decimal(needle, most_digits=10)) is not None:  # which subjects and versions use it
            try:
                by_id = list(await registry.get(f"/schemas/ids/{schema_id}/versions"))
            except BackendError:
                by_id = []
        low = needle.lower()
        shown = [s for s in all_subjects if not low or low in s["subject"].lower() or low in s["namespace"].lower()
                 or any(b["subject"] == s["subject"] for b in by_id)][:200]
        policies, latest = await asyncio.gather(
            asyncio.gather(*(registry.policy(s["subject"]) for s in shown)),
            asyncio.gather(*(registry.get(f"/v1/subjects/{_seg(s['subject'])}/versions/latest") for s in shown)))
        rows = [{**s, "compatibility": p["compatibility"], "policy_source": p.get("source", ""), "id": v["id"]}
                for s, p, v in zip(shown, policies, latest, strict=True)]
        return render(request, "subjects.html", rows=rows, q=needle, total=len(all_subjects), by_id=by_id)

    @app.get("/subjects/{subject:path}", response_class=HTMLResponse, responses=GUARDED_404)
    async def subject(request: Request, subject: str, to: int | None = None,
                      frm: str | None = Query(None, alias="from")) -> HTMLResponse:
        """`from` is declared (under its alias: a Python keyword) so that the OpenAPI document,
        and the schema-driven fuzzing of tests/console/test_console_fuzz.py, know it."""
        import asyncio

        versions = list(await registry.get(f"/v1/subjects/{_seg(subject)}/versions"))
        if not versions:
            raise NotFound(f"subject {subject!r} has no versions")
        numbers = [v["version"] for v in versions]
        to_v = to if to in numbers else numbers[-1]
        before = [n for n in numbers if n < to_v]
        asked = decimal(frm, most_digits=9)  # "²" passed isdigit() and failed int(): a 500 page
        from_v = asked if asked in numbers else (before[-1] if before else None)
        seg = _seg(subject)
        pairs = list(itertools.pairwise(numbers))
        policy, pair_diffs, new, old = await asyncio.gather(
            registry.policy(subject),
            asyncio.gather(*(registry.get(f"/v1/subjects/{seg}/diff", **{"from": a, "to": b}) for a, b in pairs)),
            registry.get(f"/v1/subjects/{seg}/versions/{to_v}"),
            registry.get(f"/v1/subjects/{seg}/versions/{from_v}") if from_v is not None else _none())
        verdicts = {b: d for (_, b), d in zip(pairs, pair_diffs, strict=True)}
        selected = None
        if from_v is not None:
            selected = verdicts.get(to_v) if from_v == (before[-1] if before else None) else \
                await registry.get(f"/v1/subjects/{seg}/diff", **{"from": from_v, "to": to_v})
        return render(request, "subject.html", subject=subject, versions=versions, policy=policy, verdicts=verdicts,
                      new=new, old=old, new_text=pretty_schema(new["format"], new["schema"]),
                      old_text=pretty_schema(old["format"], old["schema"]) if old else "",
                      selected=selected, from_v=from_v, to_v=to_v,
                      diff_lines=(selected or {}).get("text_diff", "").splitlines())

    # ----------------------------------------------------------------------- governance --
    @app.get("/governance", response_class=HTMLResponse, responses=COMMON_RESPONSES)
    async def governance(request: Request) -> HTMLResponse:
        import asyncio

        policies, approvals, subs = await asyncio.gather(registry.get("/v1/policies"), registry.get("/v1/approvals"),
                                                         registry.subjects())
        latest = await asyncio.gather(*(registry.get(f"/v1/subjects/{_seg(s['subject'])}/versions/latest")
                                        for s in subs))
        pii = [{"subject": v["subject"], "version": v["version"], "fields": v.get("metadata", {}).get("pii_fields", [])}
               for v in latest]
        pii_audit = await registry.get("/v1/pii/audit") if request.state.principal.is_admin else None
        return render(request, "governance.html", policies=policies, approvals=approvals, pii=pii,
                      pii_audit=pii_audit)

    @app.get("/audit", response_class=HTMLResponse, responses=COMMON_RESPONSES)
    async def audit(request: Request, subject: str | None = None, limit: int = 200) -> HTMLResponse:
        need_admin(request, "the audit log")
        entries = await registry.get("/v1/audit", subject=subject or None, limit=max(1, min(limit, 1000)))
        return render(request, "audit.html", entries=entries, subject=subject or "")

    generated = app.openapi

    def openapi() -> dict[str, Any]:
        """FastAPI's document without the JSON 422 it declares for every route with parameters:
        the console answers a query value of the wrong type with its 400 page (`bad_query`)."""
        if app.openapi_schema is None:
            doc = generated()
            for ops in doc.get("paths", {}).values():
                for op in ops.values():
                    op.get("responses", {}).pop("422", None)
            for name in ("HTTPValidationError", "ValidationError"):
                doc.get("components", {}).get("schemas", {}).pop(name, None)
        return app.openapi_schema or generated()

    app.openapi = openapi  # type: ignore[method-assign]

    # Outermost (added last): a body over the limit is refused before the log-in guard, or a
    # form parser, reads any of it (a 600 MiB POST /login used to cost 1.1 GiB).
    app.add_middleware(BodyLimit, limits=settings.http_limits)
    return app


async def _none() -> None:
    return None


def _seg(value: str) -> str:
    return urllib.parse.quote(value, safe="")

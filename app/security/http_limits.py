"""One HTTP hardening layer for every server Prism runs: the schema registry and the console
(uvicorn), the worker's management API (aiohttp, Faust's web server) and a supervisor's status
site (aiohttp).

Why one place: each server used to take whatever its HTTP library allowed. The console read a
request body to its end, unauthenticated, before checking its size (a 600 MiB ``POST /login``
cost 1.1 GiB of memory); the registry and the console buffered a request header of any size
(uvicorn's httptools protocol keeps a 200 MiB header in memory and answers ``200 OK``); no
server cut off a client that sends its headers one byte a second. Every limit here acts before
the request reaches authentication or a route, and is the same for every server:

================================  =========================================  ==================
limit                             what happens past it                       default
================================  =========================================  ==================
``max_head_bytes``                request line + headers: 431, connection     32 KiB
                                  closed (counted while they arrive)
``max_headers``                   header count: 431                          100
``max_body_bytes`` (per server)   ``Content-Length`` over it: 413 before a   registry 16 MiB,
                                  byte is read; a body without one: 413      console 16 KiB,
                                  as soon as the count passes it             worker 64 KiB
``head_timeout_s``                the request head must be complete within   10 s
                                  this time of the connection (or of the
                                  previous response): 408, closed
``body_timeout_s``                longest wait for the next piece of a body  30 s
                                  the route is reading: 408, closed
``min_body_rate``                 after ``body_timeout_s``, a body must       1024 B/s
                                  average this many bytes a second: 408,
                                  closed (a piece every 29 s held a
                                  connection for as long as the body was)
``keep_alive_s``                  idle keep-alive connection closed          5 s
``max_connections``               more open connections: 503                 512
================================  =========================================  ==================

Settings: ``PRISM_HTTP_MAX_HEAD_BYTES``, ``PRISM_HTTP_MAX_HEADERS``, ``PRISM_HTTP_HEAD_TIMEOUT_S``,
``PRISM_HTTP_BODY_TIMEOUT_S``, ``PRISM_HTTP_MIN_BODY_RATE``, ``PRISM_HTTP_KEEP_ALIVE_S``, ``PRISM_HTTP_MAX_CONNECTIONS``
(:meth:`HttpLimits.from_env`, validated at start-up: a bad value is a ``ConfigError``). The body
limit is each server's own (what its routes accept), passed by its code.

The adapters:

* uvicorn: :func:`uvicorn_config` builds the ``uvicorn.Config`` (the protocol
  :class:`LimitedHttpToolsProtocol`, ``limit_concurrency``, ``timeout_keep_alive``) and
  :func:`serve` runs it (one process or ``--workers N``); :class:`BodyLimit` is the ASGI
  middleware for the body (it must be the outermost one the app adds, so that nothing - not
  authentication - runs for a refused body).
* aiohttp: :func:`harden_aiohttp_runner` gives a (Faust) ``AppRunner`` the server-side limits
  and :func:`aiohttp_body_limit` is the middleware for the body; :func:`limited_aiohttp_runner`
  does the same for an aiohttp application of Prism's own (the supervisor's status site).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from app.decimal_text import decimal
from app.errors import ConfigError

ENV_PREFIX = "PRISM_HTTP_"

#: (status, message) -> (body, content type): how a server words a refusal (the registry in
#: Confluent's ``{"error_code", "message"}``, the console as plain JSON).
Refusal = Callable[[int, str], tuple[bytes, bytes]]


def plain_refusal(status: int, message: str) -> tuple[bytes, bytes]:
    """The default refusal body: ``{"error_code": <status>, "message": ...}`` (Kafka Connect's shape)."""
    return json.dumps({"error_code": status, "message": message}).encode(), b"application/json"


_REASONS = {400: b"Bad Request", 408: b"Request Timeout", 413: b"Content Too Large",
            431: b"Request Header Fields Too Large", 503: b"Service Unavailable"}


@dataclass(frozen=True, slots=True)
class HttpLimits:
    """The limits one server applies to every request (module docs: what each one does)."""

    max_head_bytes: int = 32 * 1024
    max_headers: int = 100
    max_body_bytes: int = 64 * 1024
    head_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    min_body_rate: int = 1024
    keep_alive_s: float = 5.0
    max_connections: int = 512

    def __post_init__(self) -> None:
        problems = [f"{name} must be > 0, got {getattr(self, name)!r}"
                    for name in ("max_head_bytes", "max_headers", "max_body_bytes", "head_timeout_s",
                                 "body_timeout_s", "min_body_rate", "keep_alive_s", "max_connections")
                    if not getattr(self, name) > 0]
        if self.max_head_bytes < 1024:
            problems.append(f"max_head_bytes must be at least 1024 (a request line and a few headers), "
                            f"got {self.max_head_bytes}")
        if problems:
            raise ConfigError("; ".join(problems), path="HTTP limits",
                              hint=f"set the {ENV_PREFIX}* variables to positive numbers (docs/operations.md)")

    def with_body_limit(self, max_body_bytes: int) -> HttpLimits:
        """The same limits with this server's own body limit."""
        return replace(self, max_body_bytes=max_body_bytes)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, *, max_body_bytes: int = 64 * 1024) -> HttpLimits:
        """The limits from ``PRISM_HTTP_*`` (the process environment by default), with
        `max_body_bytes` (the server's own). Raises ``ConfigError`` naming a bad variable."""
        env = os.environ if env is None else env
        values: dict[str, Any] = {"max_body_bytes": max_body_bytes}
        for name, kind in (("max_head_bytes", int), ("max_headers", int), ("head_timeout_s", float),
                           ("body_timeout_s", float), ("min_body_rate", int), ("keep_alive_s", float),
                           ("max_connections", int)):
            var = ENV_PREFIX + name.upper()
            raw = (env.get(var) or "").strip()
            if not raw:
                continue
            try:
                values[name] = kind(raw)
            except ValueError:
                raise ConfigError(f"{var}={raw[:40]!r} is not {'an integer' if kind is int else 'a number'}",
                                  path=var, hint="unset it for the default (docs/operations.md)") from None
        try:
            return cls(**values)
        except ConfigError as exc:
            raise ConfigError(exc.message, path="PRISM_HTTP_* environment", hint=exc.hint) from None


def _raw_response(status: int, body: bytes, content_type: bytes) -> bytes:
    return b"".join([b"HTTP/1.1 %d %s\r\n" % (status, _REASONS.get(status, b"")),
                     b"content-type: ", content_type, b"\r\ncontent-length: %d\r\n" % len(body),
                     b"connection: close\r\n\r\n", body])


# --------------------------------------------------------------------------------------- uvicorn


class LimitedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol (the fast one the registry was built on) with a bounded
    request head and a deadline for it.

    httptools keeps the request line and a header value in memory until it is complete, with no
    limit; here the bytes received while a head is incomplete are counted, and past
    ``max_head_bytes`` the client gets a 431 and the connection is closed - so the memory a head
    can take is the limit plus one read (at most 256 KiB). The head must also be complete within
    ``head_timeout_s`` of the connection or the previous response (408): uvicorn's keep-alive
    timer stops at the first byte, so a client sending one byte a second held the connection
    for ever. The header count is checked when the head is complete (431), before any app runs.
    The limits are the ``prism_http_limits`` attribute of the uvicorn config (:func:`uvicorn_config`)."""

    def __init__(self, config: Any, server_state: Any, app_state: dict[str, Any],
                 _loop: asyncio.AbstractEventLoop | None = None) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self.limits: HttpLimits = getattr(config, "prism_http_limits", None) or HttpLimits()
        self._head_pending = True
        self._head_bytes = 0  # received while the current head is incomplete
        self._head_size = 0  # of the current head as parsed: its URL and header lines
        self._head_timer: asyncio.TimerHandle | None = None
        self._refused = False

    # -- the head deadline -----------------------------------------------------------------
    def _arm_head_timer(self) -> None:
        self._cancel_head_timer()
        self._head_timer = self.loop.call_later(self.limits.head_timeout_s, self._head_timed_out)

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self.cycle is not None and not self.cycle.response_complete:
            return  # a request is being answered; its completion starts the wait for the next head
        if self._head_pending:
            self._refuse(408, f"the request head was not complete within {self.limits.head_timeout_s:g} s")

    def _refuse(self, status: int, message: str) -> None:
        """Answer `status` before any app runs and close the connection."""
        if self._refused or self.transport is None or self.transport.is_closing():
            return
        self._refused = True
        self._cancel_head_timer()
        self.logger.warning("HTTP %d to %s: %s", status, self.client[0] if self.client else "?", message)
        body, ctype = plain_refusal(status, message)
        self.transport.write(_raw_response(status, body, ctype))
        self.transport.close()

    # -- protocol events -------------------------------------------------------------------
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        if self._head_pending:
            self._head_bytes += len(data)
        super().data_received(data)
        if self._head_pending and self._head_bytes > self.limits.max_head_bytes:
            self._refuse(431, f"the request line and headers are over the {self.limits.max_head_bytes}-byte limit")

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head_size = 0

    def on_url(self, url: bytes) -> None:
        self._head_size += len(url)
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._head_size += len(name) + len(value) + 4
        if len(self.headers) <= self.limits.max_headers:  # one more than allowed marks "too many"
            super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._head_pending = False
        self._head_bytes = 0
        self._cancel_head_timer()
        # A head that arrived in one read was parsed before data_received could count it.
        if self._head_size > self.limits.max_head_bytes:
            self._refuse(431, f"the request line and headers are over the {self.limits.max_head_bytes}-byte limit")
            return
        if len(self.headers) > self.limits.max_headers:
            self._refuse(431, f"more than {self.limits.max_headers} request headers")
            return
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        if not self._refused:
            super().on_body(body)

    def on_message_complete(self) -> None:
        if self._refused:
            return
        super().on_message_complete()
        self._head_pending = True  # the next request's head (pipelined or after keep-alive)

    def on_response_complete(self) -> None:
        pipelined = bool(self.pipeline)  # super() starts the next one of those, if any
        super().on_response_complete()
        if not pipelined and not self.transport.is_closing():
            self._arm_head_timer()  # the next head must arrive in time too


def uvicorn_config(app: Any, limits: HttpLimits, **kwargs: Any) -> Any:
    """A ``uvicorn.Config`` for `app` (an ASGI app or an import string) with `limits` applied:
    the limited protocol, ``limit_concurrency`` (503 past ``max_connections``) and the
    keep-alive timeout. `kwargs` are the other ``uvicorn.Config`` settings (host, port, TLS...)."""
    import uvicorn

    for owned in ("http", "limit_concurrency", "timeout_keep_alive"):
        if owned in kwargs:
            raise TypeError(f"{owned} is set by HttpLimits")
    config = uvicorn.Config(app, http=LimitedHttpToolsProtocol, limit_concurrency=limits.max_connections,
                            timeout_keep_alive=max(1, round(limits.keep_alive_s)), **kwargs)
    # Read by LimitedHttpToolsProtocol; an attribute of the config, so the worker processes of
    # `--workers N` (which receive a pickled copy of it) apply the same limits.
    config.prism_http_limits = limits
    return config


def bind_listen(host: str, port: int, option: str = "--port") -> socket.socket:
    """A socket bound to ``port`` on ``host``, for :func:`serve` to listen on - bound before a
    server prints that it listens, and kept: the server serves on this very socket.

    Why: uvicorn given port 99999, or a port in use, logged a line (or nothing) and then hung in
    its event loop instead of exiting, so ``prism console`` and ``prism schema serve`` looked up
    to a supervisor while serving nothing. A check that bound and closed the port left a window
    in which another process could take it and bring the hang back; binding once and handing
    the socket over closes it. Every problem is one ``ConfigError`` line."""
    import errno

    if not 1 <= port <= 65535:
        raise ConfigError(f"{option} {port} is not a TCP port", path=option, hint="use a port from 1 to 65535")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        infos = socket.getaddrinfo(host, port, family, socket.SOCK_STREAM)
    except OSError as exc:
        raise ConfigError(f"--host {host!r} is not an address of this machine ({exc.strerror or exc})",
                          path="--host", hint="e.g. --host 127.0.0.1, or 0.0.0.0 for every interface") from None
    s = socket.socket(family, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds it
    try:
        s.bind(infos[0][4])
    except OSError as exc:
        s.close()
        busy = exc.errno == errno.EADDRINUSE
        raise ConfigError(f"port {port} on {host} is {'in use' if busy else 'not available'}"
                          + ("" if busy else f" ({exc.strerror})"), path=option,
                          hint=f"pick another {option}, or stop what listens there (ss -ltnp 'sport = :{port}')"
                          if busy else "check --host names an address of this machine") from None
    s.set_inheritable(True)  # uvicorn's worker processes serve on it too
    return s


def serve(config: Any, sock: socket.socket) -> bool:
    """Run a config from :func:`uvicorn_config` like ``uvicorn.run`` does, on ``sock`` from
    :func:`bind_listen`: in this process, or with ``workers > 1`` in that many processes sharing
    the socket. True when it started."""
    import uvicorn
    from uvicorn.supervisors import Multiprocess

    with sock:
        if config.workers > 1:
            if not isinstance(config.app, str):
                raise ConfigError("several workers need the app as an import string", path="--workers")
            Multiprocess(config, sockets=[sock]).run()
            return True
        server = uvicorn.Server(config=config)
        server.run(sockets=[sock])
        return bool(server.started)


class _BodyTooLarge(Exception):
    """Raised into the reader of a body that went over the limit (never reaches a client)."""


class _BodyTimeout(Exception):
    """Raised into the reader of a body whose next piece did not come in time."""


class BodyLimit:
    """ASGI middleware: one request-body limit, counted on the bytes actually received, and a
    wait limit for each piece of it. A ``Content-Length`` over the limit is refused (413) before
    anything is read; a body without one (chunked) is cut off when it crosses the limit - the
    reader gets an exception, and whatever the app answers then is replaced by the 413. A body
    whose next piece does not come within ``body_timeout_s`` is answered 408. Every refusal
    closes the connection, so the rest of the body is never read. Past ``body_timeout_s`` from
    the first read the body must also keep an average of ``min_body_rate`` bytes a second (the
    allowance grows with every byte, as Apache's ``mod_reqtimeout`` MinRate): without it a client
    sending a byte every 29 s held a connection, unauthenticated (``POST /login`` reads its
    form), for as long as the body was - 16,000 bytes, five days - and 512 of them took every
    connection of the server. Add it last (outermost)."""

    def __init__(self, app: Any, limits: HttpLimits, refusal: Refusal = plain_refusal) -> None:
        self.app, self.limits, self.refusal = app, limits, refusal

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.limits.max_body_bytes
        has_body = False
        for key, value in scope["headers"]:
            if key == b"content-length":
                length = decimal(value)  # 5,000 digits passed isdigit() and failed int(): a 500
                if length is None:
                    await self._refuse(send, 400, "Content-Length is not a number of at most 18 digits")
                    return
                if length > limit:
                    await self._refuse(send, 413, self._too_large())
                    return
                has_body = has_body or length > 0
            elif key == b"transfer-encoding":
                has_body = True
        seen, failure, started, complete = 0, None, False, False
        timeout, rate = self.limits.body_timeout_s, self.limits.min_body_rate
        loop = asyncio.get_running_loop()
        first_read: float | None = None

        async def counted() -> Any:
            nonlocal seen, failure, complete, first_read
            if complete:  # the body is read: later calls wait for a disconnect, for as long as a response takes
                return await receive()
            now = loop.time()
            if first_read is None:
                first_read = now
            # the whole body's deadline: the grace, plus a second for every `rate` bytes received
            wait = min(timeout, first_read + timeout + seen / rate - now)
            try:
                if wait <= 0:
                    raise TimeoutError
                message = await asyncio.wait_for(receive(), wait)
            except TimeoutError:
                failure = (408, f"the request body stalled for {timeout:g} s" if wait >= timeout else
                           f"the request body came slower than {rate} bytes a second")
                raise _BodyTimeout from None
            if message["type"] == "http.request":
                complete = not message.get("more_body", False)
                seen += len(message.get("body", b""))
                if seen > limit:
                    failure = (413, self._too_large())
                    raise _BodyTooLarge
            return message

        async def guarded(message: Any) -> None:
            nonlocal started
            if failure is not None and not started:
                return  # the app's answer to a refused body is replaced below
            if message["type"] == "http.response.start":
                started = True
                if has_body and not complete:
                    # Answered without reading the body (a 401, a 404): close the connection
                    # after the answer, rather than read and throw away the rest of the body.
                    message = {**message, "headers": [*message.get("headers", ()), (b"connection", b"close")]}
            await send(message)

        try:
            await self.app(scope, counted, guarded)
        except Exception:
            if failure is None:
                raise
        if failure is not None and not started:
            await self._refuse(send, *failure)

    def _too_large(self) -> str:
        limit = self.limits.max_body_bytes
        mib = f" ({limit // 1048576} MiB)" if limit % 1048576 == 0 else ""
        return f"Request body too large: the limit is {limit} bytes{mib}"

    async def _refuse(self, send: Any, status: int, message: str) -> None:
        body, ctype = self.refusal(status, message)
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", ctype), (b"content-length", str(len(body)).encode()),
                                (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})


# --------------------------------------------------------------------------------------- aiohttp


class _OneLineRefusals(logging.Filter):
    """aiohttp logs each request it refuses as malformed (a header over the limit: 400) with a
    full traceback, at ERROR: any client could fill the log with them. They become one WARNING
    line, like the uvicorn servers' refusals; other errors keep their traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        from aiohttp.http_exceptions import HttpProcessingError

        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError):
            record.msg, record.args = "HTTP %d to %s: %s", (exc.code, *(record.args or ("?",))[:1],
                                                             str(exc.message)[:200])
            record.exc_info, record.exc_text = None, None
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


#: The logger of the worker's HTTP protocol (aiohttp's own is ``aiohttp.server``).
_AIOHTTP_LOG = logging.getLogger("app.security.http_limits.aiohttp")
_AIOHTTP_LOG.addFilter(_OneLineRefusals())


def aiohttp_handler_settings(limits: HttpLimits) -> dict[str, Any]:
    """aiohttp ``RequestHandler`` settings for `limits`: the request line and each header field
    at most ``max_head_bytes`` long, at most ``max_headers`` of them (aiohttp answers 400 past
    either, before any handler), and the keep-alive timeout. aiohttp's keep-alive timer is not
    reset by incoming bytes and closes a connection whose request is still incomplete, so it
    is also the head deadline: the shorter of the two timeouts. No lingering (below)."""
    return {"max_line_size": limits.max_head_bytes, "max_field_size": limits.max_head_bytes,
            "max_headers": limits.max_headers,
            "keepalive_timeout": min(limits.keep_alive_s, limits.head_timeout_s),
            # After answering a request whose body was not read (a 401, a 413), aiohttp would
            # read and throw away the rest of it for 10 s ("lingering": 600 MB on loopback);
            # close the connection instead, as the uvicorn servers do.
            "lingering_time": 0,
            "logger": _AIOHTTP_LOG}


def harden_aiohttp_runner(web: Any, limits: HttpLimits) -> None:
    """Give a Faust aiohttp web driver (``app.web``; call before it starts) the limits: its
    ``AppRunner`` is rebuilt with :func:`aiohttp_handler_settings`, the application's
    ``client_max_size`` becomes ``max_body_bytes`` and :func:`aiohttp_body_limit` runs first."""
    runner = getattr(web, "_runner", None)
    if runner is None or runner.server is not None:
        raise RuntimeError("harden_aiohttp_runner must run before the web server is set up")
    web._runner = limited_aiohttp_runner(web.web_app, limits)


class _Busy(asyncio.Protocol):
    """A connection past ``max_connections`` on an aiohttp server: answered 503 and closed
    without its request being parsed. The answer goes out at once and the write side is shut;
    what the client sends meanwhile is discarded, and the socket closed when the client closes
    or after ``linger_s`` - so the answer is not lost to a reset, and a refused connection costs
    a file descriptor for a second at most, never a request handler."""

    def __init__(self, linger_s: float) -> None:
        self.linger_s = linger_s
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        transport.write(_raw_response(503, b"Service Unavailable: too many open connections, retry later",
                                      b"text/plain; charset=utf-8"))
        if transport.can_write_eof():
            transport.write_eof()
        asyncio.get_running_loop().call_later(self.linger_s, transport.close)

    def data_received(self, data: bytes) -> None:
        """Discarded (module docs)."""

    def eof_received(self) -> bool:
        if self.transport is not None:
            self.transport.close()
        return False


class _ConnectionCap:
    """The protocol factory an aiohttp site calls once per accepted connection: aiohttp's
    ``Server`` while it holds fewer than ``limit`` connections, :class:`_Busy` past that (what
    uvicorn's ``limit_concurrency`` does for the registry and the console). Everything else is
    the wrapped server's.

    The event loop accepts a backlog of connections in one go - creating every protocol before
    any ``connection_made`` runs (that is scheduled with ``call_soon``), when aiohttp counts it -
    so the ones created in this pass are counted here until the loop's next pass."""

    def __init__(self, server: Any, limit: int, linger_s: float) -> None:
        self._server, self._limit, self._linger_s = server, limit, linger_s
        self._accepting = 0

    def __call__(self) -> asyncio.Protocol:
        if len(self._server.connections) + self._accepting >= self._limit:
            return _Busy(self._linger_s)
        self._accepting += 1
        asyncio.get_running_loop().call_soon(self._accepted)
        return self._server()  # type: ignore[no-any-return]

    def _accepted(self) -> None:
        self._accepting -= 1

    def __getattr__(self, name: str) -> Any:
        return getattr(self._server, name)


def limited_aiohttp_runner(web_app: Any, limits: HttpLimits) -> Any:
    """An ``AppRunner`` for an aiohttp application - Faust's (:func:`harden_aiohttp_runner`) or
    one Prism builds itself (the supervisor's status site) - with the limits: head and header
    sizes, keep-alive/head deadline, no lingering, ``client_max_size`` and the body-limit
    middleware first, and at most ``max_connections`` open connections (:class:`_ConnectionCap`).
    Call before the runner is set up."""
    from aiohttp.web import AppRunner

    class LimitedAppRunner(AppRunner):
        async def _make_server(self) -> Any:
            return _ConnectionCap(await super()._make_server(), limits.max_connections,
                                  min(1.0, limits.head_timeout_s))

    web_app._client_max_size = limits.max_body_bytes
    web_app.middlewares.insert(0, aiohttp_body_limit(limits))
    return LimitedAppRunner(web_app, access_log=None, **aiohttp_handler_settings(limits))


def aiohttp_body_limit(limits: HttpLimits, refusal: Refusal = plain_refusal) -> Callable[..., Awaitable[Any]]:
    """aiohttp middleware: a declared body over ``max_body_bytes`` is refused (413) before any
    other middleware (authentication included) runs, and the connection is closed. A chunked
    body is bounded by ``client_max_size`` when read; one that is not read is never buffered
    (aiohttp pauses the socket)."""
    from aiohttp import web

    limit = limits.max_body_bytes

    @web.middleware
    async def body_limit(request: Any, handler: Any) -> Any:
        declared = request.content_length
        if declared is not None and declared > limit:
            body, ctype = refusal(413, f"Request body too large: the limit is {limit} bytes")
            response = web.Response(body=body, status=413, content_type=ctype.decode(),
                                    headers={"Connection": "close"})
            response.force_close()
            return response
        return await handler(request)

    return body_limit

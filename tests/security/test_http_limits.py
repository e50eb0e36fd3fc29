"""The HTTP hardening layer (app.security.http_limits) on all four of Prism's servers - the
schema registry, the console, the worker's management API and the status site of a supervisor
(`prism run --processes N`) - each a real server in a process
of its own (tests/security/http_servers.py), attacked over raw loopback sockets with the hostile
sizes of issue 28. For each attack the server's peak memory (VmHWM, reset through
/proc/PID/clear_refs first) may grow by a few MB, not by the hundreds the attack sends, and the
server must answer the next ordinary request.

Before this layer: a 200 MiB header to /healthz got 200 OK and cost the registry and the console
about 360 MiB each; a 600 MiB POST /login cost the console 1.1 GiB; nothing cut off a client
sending its headers one byte at a time."""

from __future__ import annotations

import os
import select
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from app.broker.embedded import find_free_port
from app.errors import ConfigError
from app.security.http_limits import HttpLimits, aiohttp_handler_settings
from tests.support import auth_headers, write_users_file

MiB = 1024 * 1024
ROOT = Path(__file__).resolve().parents[2]
#: The peak memory one hostile request may add to a server.
MAX_GROWTH = 16 * MiB
HEAD_TIMEOUT_S = 1.0
MAX_CONNECTIONS = 16
BODY_TIMEOUT_S = 1.0
CHUNK = b"a" * MiB
#: the servers on aiohttp (the others are on uvicorn)
AIOHTTP = ("worker", "supervisor")


@dataclass
class Server:
    kind: str
    port: int
    proc: subprocess.Popen[str]

    #: a route each server has that reads or may read a body, and one that needs no login
    @property
    def post_path(self) -> str:
        return {"registry": "/subjects/limits-value/versions", "console": "/login",
                "worker": "/connectors/x/restart", "supervisor": "/workers"}[self.kind]

    def status_of(self, field: str) -> int:
        """A /proc/PID/status field in bytes (VmRSS, VmHWM)."""
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
        raise AssertionError(f"no {field} in /proc/{self.proc.pid}/status")

    def reset_peak(self) -> int:
        """Reset the peak-RSS counter to the current RSS; returns that RSS."""
        Path(f"/proc/{self.proc.pid}/clear_refs").write_text("5")
        return self.status_of("VmRSS")


@pytest.fixture(scope="module", params=["registry", "console", "worker", "supervisor"])
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    data = tmp_path_factory.mktemp(f"http-limits-{request.param}")
    users = write_users_file(data / "users.yaml")
    port = find_free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PRISM_HTTP_HEAD_TIMEOUT_S": str(HEAD_TIMEOUT_S),
           "PRISM_HTTP_BODY_TIMEOUT_S": str(BODY_TIMEOUT_S),
           "PRISM_HTTP_MAX_CONNECTIONS": str(MAX_CONNECTIONS)}
    proc = subprocess.Popen([sys.executable, "-m", "tests.security.http_servers", request.param, str(port),
                             str(users), str(data)], cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        assert proc.stdout is not None
        while True:
            ready, _, _ = select.select([proc.stdout], [], [], max(0.0, deadline - time.monotonic()))
            line = proc.stdout.readline() if ready else ""
            if line.strip() == "ready":
                break
            if not ready or proc.poll() is not None:
                raise AssertionError(f"the {request.param} server did not start (exit {proc.poll()})")
        srv = Server(request.param, port, proc)
        assert _get(srv, "/healthz") == 200
        yield srv
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _status(response: bytes) -> int | None:
    """The status of a raw HTTP response, None when the server closed without one."""
    if not response.startswith(b"HTTP/1."):
        return None
    return int(response.split(b" ", 2)[1])


def _read_all(sock: socket.socket, timeout: float = 10.0) -> bytes:
    sock.settimeout(timeout)
    data = b""
    try:
        while more := sock.recv(65536):
            data += more
    except (ConnectionResetError, TimeoutError):
        pass
    return data


def _attack(srv: Server, head: bytes, body: Iterator[bytes] = iter(())) -> tuple[int | None, int]:
    """Send `head`, then `body` until the server stops reading; (the response status, the bytes
    the server let us send)."""
    sent = 0
    with socket.create_connection(("127.0.0.1", srv.port), timeout=30) as sock:
        try:
            for piece in (head, *body):
                sock.sendall(piece)
                sent += len(piece)
        except (BrokenPipeError, ConnectionResetError):
            pass
        return _status(_read_all(sock)), sent


def _streamed(head_start: bytes, total: int, tail: bytes = b"") -> Iterator[bytes]:
    """`head_start`, then `total` bytes of 'a' a MiB at a time, then `tail` (lazily: the
    attacker never holds the hundreds of MiB it sends)."""
    yield head_start
    for _ in range(total // MiB):
        yield CHUNK
    yield tail


def _get(srv: Server, path: str, headers: dict[str, str] | None = None) -> int | None:
    lines = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
    status, _ = _attack(srv, f"GET {path} HTTP/1.1\r\nHost: x\r\n{lines}Connection: close\r\n\r\n".encode())
    return status


def _peak_growth(srv: Server, attack: object) -> tuple[object, int]:
    before = srv.reset_peak()
    result = attack() if callable(attack) else None
    return result, srv.status_of("VmHWM") - before


def _unread_refusal(srv: Server) -> int:
    """What an aiohttp server answers a POST it reads no body for: the worker's route needs
    credentials first (401); the supervisor has no POST route at all (405)."""
    return 405 if srv.kind == "supervisor" else 401


def _head_refused(srv: Server, status: int | None) -> bool:
    # uvicorn (registry, console): this layer's 431; aiohttp (worker): its own 400 for the same limits
    return status == (400 if srv.kind in AIOHTTP else 431)


def test_a_200_mib_header_is_cut_off_and_costs_a_few_mb(server: Server) -> None:
    head = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: "
    (status, sent), growth = _peak_growth(server, lambda: _attack(server, b"", _streamed(head, 200 * MiB,
                                                                                          b"\r\n\r\n")))
    assert _head_refused(server, status), status
    assert sent < 100 * MiB, f"the server read {sent} bytes of a 200 MiB header"
    assert growth < MAX_GROWTH, f"{server.kind}: +{growth / MiB:.1f} MiB for a 200 MiB header"
    assert _get(server, "/healthz") == 200


def test_a_header_over_the_limit_in_one_piece_is_refused(server: Server) -> None:
    """A head that arrives whole in one read is parsed at once; its size is checked after."""
    assert _head_refused(server, _get(server, "/healthz", {"X-Big": "a" * 40_000}))
    assert _get(server, "/healthz", {"X-Ok": "a" * 20_000}) == 200


def test_too_many_headers_are_refused(server: Server) -> None:
    assert _head_refused(server, _get(server, "/healthz", {f"X-H{i}": "v" for i in range(101)}))
    assert _get(server, "/healthz", {f"X-H{i}": "v" for i in range(90)}) == 200


def test_a_declared_600_mib_body_is_refused_before_it_is_read(server: Server) -> None:
    head = (f"POST {server.post_path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-www-form-urlencoded\r\n"
            f"Content-Length: {600 * MiB}\r\n\r\n").encode()  # no credentials: refused before authentication
    (status, sent), growth = _peak_growth(server, lambda: _attack(server, b"", _streamed(head, 600 * MiB)))
    assert status == 413
    assert sent < 100 * MiB, f"the server read {sent} bytes of a declared-too-large body"
    assert growth < MAX_GROWTH, f"{server.kind}: +{growth / MiB:.1f} MiB for a 600 MiB POST"
    assert _get(server, "/healthz") == 200


def _auth_line(srv: Server) -> str:
    """The registry reads a body only for an authenticated writer; the console's log-in form and
    the worker's guard need none to be reached."""
    return f"Authorization: {auth_headers('admin')['Authorization']}\r\n" if srv.kind == "registry" else ""


@pytest.mark.parametrize("authenticated", [True, False])
def test_three_400_mib_chunked_bodies_cost_a_few_mb(server: Server, authenticated: bool) -> None:
    """No Content-Length: the uvicorn servers count while the body streams and refuse at the
    limit (413); a request refused before its body is read (401) has its connection closed
    rather than the rest of its body read. The worker's routes read no body; aiohttp does not
    buffer one nobody reads."""
    head = (f"POST {server.post_path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-www-form-urlencoded\r\n"
            f"{_auth_line(server) if authenticated else ''}Transfer-Encoding: chunked\r\n\r\n").encode()
    chunk = b"%x\r\n" % MiB + CHUNK + b"\r\n"

    def body() -> Iterator[bytes]:
        yield head
        for _ in range(400):
            yield chunk
        yield b"0\r\n\r\n"

    def three() -> list[tuple[int | None, int]]:
        return [_attack(server, b"", body()) for _ in range(3)]

    results, growth = _peak_growth(server, three)
    refused_unread = server.kind in AIOHTTP or (server.kind == "registry" and not authenticated)
    for status, sent in results:  # type: ignore[union-attr]
        assert status == (_unread_refusal(server) if refused_unread else 413), status
        assert sent < 100 * MiB, f"the server read {sent} bytes of a 400 MiB body"
    # An authenticated registry writer's body is read up to the registry's 16 MiB limit before
    # it is cut off, and reading it (Starlette joins the pieces) costs about three times that.
    allowed = MAX_GROWTH + (3 * 16 * MiB if server.kind == "registry" and authenticated else 0)
    assert growth < allowed, f"{server.kind}: +{growth / MiB:.1f} MiB for three 400 MiB bodies"
    assert _get(server, "/healthz") == 200


def test_slowloris_headers_one_byte_at_a_time_are_cut_off(server: Server) -> None:
    """A client that sends its head a byte at a time holds the connection at most the head
    timeout (1 s here), however steadily it keeps sending."""
    start = time.monotonic()
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        closed = False
        while time.monotonic() - start < 10 * HEAD_TIMEOUT_S:
            try:
                sock.sendall(b"X")  # one byte of a header name that never ends
            except (BrokenPipeError, ConnectionResetError):
                closed = True
                break
            readable, _, _ = select.select([sock], [], [], 0.1)  # the attacker's pace: 10 bytes a second
            if readable:
                closed = True
                break
        assert closed, "the server kept a one-byte-at-a-time head open"
        response = _read_all(sock, timeout=5)
    elapsed = time.monotonic() - start
    assert elapsed < HEAD_TIMEOUT_S + 3, elapsed
    assert _status(response) in ((408,) if server.kind not in AIOHTTP else (None,)), response[:200]
    assert _get(server, "/healthz") == 200


def _read_responses(sock: socket.socket, count: int) -> list[int | None]:
    """The statuses of the next `count` responses (head + Content-Length body) on a kept-alive
    connection."""
    sock.settimeout(10)
    buffer, statuses = b"", []
    while len(statuses) < count:
        head, sep, rest = buffer.partition(b"\r\n\r\n")
        if sep:
            length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")[1:]
                           if line.lower().startswith(b"content-length:")), 0)
            if len(rest) >= length:
                statuses.append(_status(head))
                buffer = rest[length:]
                continue
        more = sock.recv(65536)
        assert more, f"connection closed after {statuses}: {buffer[:200]!r}"
        buffer += more
    return statuses


def test_pipelined_and_keep_alive_requests_are_answered_and_the_next_head_is_timed_too(server: Server) -> None:
    """Two requests in one write are both answered; on the kept-alive connection the next head
    has the same deadline as the first one."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n" * 2)
        assert _read_responses(sock, 2) == [200, 200]
        start = time.monotonic()
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        closed = False
        while not closed and time.monotonic() - start < 10 * HEAD_TIMEOUT_S:
            try:
                sock.sendall(b"X")
            except (BrokenPipeError, ConnectionResetError):
                closed = True
            closed = closed or bool(select.select([sock], [], [], 0.1)[0])
        assert closed and time.monotonic() - start < HEAD_TIMEOUT_S + 3


def test_a_stalled_body_is_cut_off(server: Server) -> None:
    """A route reading a body whose next piece does not come: 408 after the body timeout. The
    worker's routes read no body: its guard answers at once, without waiting for the body."""
    head = (f"POST {server.post_path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-www-form-urlencoded\r\n"
            f"{_auth_line(server)}Content-Length: 1000\r\n\r\n").encode()
    start = time.monotonic()
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(head + b"user=a&p")
        response = _read_all(sock, timeout=10)
    elapsed = time.monotonic() - start
    if server.kind in AIOHTTP:
        assert _status(response) == _unread_refusal(server) and elapsed < BODY_TIMEOUT_S, (response[:300], elapsed)
    else:
        assert _status(response) == 408 and elapsed < BODY_TIMEOUT_S + 3, (response[:300], elapsed)


def test_a_body_trickled_slower_than_the_minimum_rate_is_cut_off(server: Server) -> None:
    """A byte every half body-timeout never trips the wait for the next piece: before, such a
    body held the connection for as long as it was (the console's log-in form, unauthenticated:
    16,000 bytes at one per 29 s is five days; 512 of them took every connection). Past the
    body timeout a body must average PRISM_HTTP_MIN_BODY_RATE bytes a second: 408, closed."""
    head = (f"POST {server.post_path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-www-form-urlencoded\r\n"
            f"{_auth_line(server)}Content-Length: 1000\r\n\r\n").encode()
    start = time.monotonic()
    response = b""
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(head)
        while time.monotonic() - start < 8 * BODY_TIMEOUT_S and not response:
            try:
                sock.sendall(b"a")
            except (BrokenPipeError, ConnectionResetError):
                break
            if select.select([sock], [], [], BODY_TIMEOUT_S / 2)[0]:
                response = _read_all(sock, timeout=5)
        response = response or _read_all(sock, timeout=1)
    elapsed = time.monotonic() - start
    if server.kind in AIOHTTP:  # no route reads a body: answered at once
        assert _status(response) == _unread_refusal(server) and elapsed < BODY_TIMEOUT_S, (response[:300], elapsed)
    else:
        assert _status(response) == 408 and b"slower than" in response, (response[:300], elapsed)
        assert elapsed < BODY_TIMEOUT_S + 3, elapsed


def test_connections_past_the_limit_are_answered_503_and_the_server_recovers(server: Server) -> None:
    """A client holding `max_connections` sockets open gets 503 on the next one (uvicorn's
    `limit_concurrency`; on aiohttp the connection cap of this layer) - not a request handler
    per socket until file descriptors run out - and once it lets go, requests are served."""
    held = [socket.create_connection(("127.0.0.1", server.port), timeout=10) for _ in range(MAX_CONNECTIONS)]
    try:
        assert _get(server, "/healthz") == 503
    finally:
        for sock in held:
            sock.close()
    deadline = time.monotonic() + 10
    while (status := _get(server, "/healthz")) != 200 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert status == 200


@pytest.mark.parametrize("levels", [65, 3_000, 100_000])
def test_a_deeply_nested_json_body_is_never_a_500(server: Server, levels: int) -> None:
    """The depth cases of issue 28 against every server, authenticated where that gets the body
    parsed: the registry answers 422 (its JSON decoder's depth limit); the console's routes take
    forms and the worker's none, so neither parses it - and none answers 500."""
    body = b'{"schema":' + b"[" * levels + b"]" * levels + b"}"
    auth = f"Authorization: {auth_headers('admin')['Authorization']}\r\n"
    head = (f"POST {server.post_path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{auth}"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode()
    status, _ = _attack(server, head + body)
    if server.kind == "registry":
        assert status == 422, status
    else:
        assert status is not None and status < 500, status
    assert _get(server, "/healthz") == 200


# --------------------------------------------------------------------------- the settings


def test_limits_come_from_the_environment_and_are_validated() -> None:
    limits = HttpLimits.from_env({"PRISM_HTTP_MAX_HEAD_BYTES": "65536", "PRISM_HTTP_HEAD_TIMEOUT_S": "2.5",
                                  "PRISM_HTTP_MAX_CONNECTIONS": " 64 "}, max_body_bytes=1000)
    assert (limits.max_head_bytes, limits.head_timeout_s, limits.max_connections, limits.max_body_bytes) == \
        (65536, 2.5, 64, 1000)
    assert HttpLimits.from_env({}) == HttpLimits()
    assert aiohttp_handler_settings(limits)["keepalive_timeout"] == 2.5


@pytest.mark.parametrize(("env", "says"), [
    ({"PRISM_HTTP_MAX_HEADERS": "many"}, "PRISM_HTTP_MAX_HEADERS='many' is not an integer"),
    ({"PRISM_HTTP_HEAD_TIMEOUT_S": "0"}, "head_timeout_s must be > 0"),
    ({"PRISM_HTTP_MAX_HEAD_BYTES": "100"}, "at least 1024"),
    ({"PRISM_HTTP_BODY_TIMEOUT_S": "soon"}, "is not a number"),
    ({"PRISM_HTTP_MIN_BODY_RATE": "0"}, "min_body_rate must be > 0"),
    ({"PRISM_HTTP_MIN_BODY_RATE": "fast"}, "PRISM_HTTP_MIN_BODY_RATE='fast' is not an integer"),
])
def test_bad_settings_are_config_errors(env: dict[str, str], says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        HttpLimits.from_env(env)


def test_aiohttp_refusals_are_logged_as_one_line_without_a_traceback(caplog: pytest.LogCaptureFixture) -> None:
    """Any client can make the worker refuse a header; the log gets a line, not a traceback."""
    from aiohttp.http_exceptions import LineTooLong

    log = aiohttp_handler_settings(HttpLimits())["logger"]
    with caplog.at_level("INFO", logger=log.name):
        try:
            raise LineTooLong("a" * 500, "32768")
        except LineTooLong as exc:
            log.exception("Error handling request from %s", "10.0.0.1", exc_info=exc)
        try:
            raise RuntimeError("a real bug")
        except RuntimeError as exc:
            log.exception("Error handling request from %s", "10.0.0.1", exc_info=exc)
    refused, bug = caplog.records
    assert refused.levelname == "WARNING" and refused.exc_info is None
    assert refused.getMessage().startswith("HTTP 400 to 10.0.0.1: Got more than 32768 bytes")
    assert len(refused.getMessage()) < 300
    # a real bug keeps its traceback: as exc_info, or as exc_text once the redaction filter
    # (installed by any worker earlier in the run) has rendered and redacted it
    assert bug.levelname == "ERROR" and (bug.exc_info is not None or "a real bug" in (bug.exc_text or ""))


def test_bind_listen_holds_the_port_until_the_server_serves_on_it() -> None:
    """The port is bound once and kept: nothing can take it between the check and the serve
    (a port taken in that window left uvicorn hanging instead of exiting)."""
    import errno
    import socket

    from app.errors import ConfigError
    from app.security.http_limits import bind_listen

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    sock = bind_listen("127.0.0.1", port)
    try:
        assert sock.getsockname()[1] == port and sock.get_inheritable()
        with socket.socket() as other, pytest.raises(OSError) as taken:
            other.bind(("127.0.0.1", port))
        assert taken.value.errno == errno.EADDRINUSE
        sock.listen()
        with pytest.raises(ConfigError, match=f"port {port} on 127.0.0.1 is in use"):
            bind_listen("127.0.0.1", port)
    finally:
        sock.close()
    for bad in (0, 65536, 99999):
        with pytest.raises(ConfigError, match="is not a TCP port"):
            bind_listen("127.0.0.1", bad)


@pytest.mark.parametrize("length", ["9" * 5000, "²", "１２"])
def test_a_content_length_that_is_no_number_is_a_400_never_a_500(server: Server, length: str) -> None:
    """5,000 digits passed `isdigit()` and failed `int()` (over its 4,300-digit limit) in the
    body limit, as did "²": whichever layer sees the head first refuses it as a bad request."""
    head = (f"POST {server.post_path} HTTP/1.1\r\nHost: x\r\n{_auth_line(server)}"
            f"Content-Type: application/json\r\nContent-Length: {length}\r\nConnection: close\r\n\r\n").encode()
    status, _ = _attack(server, head)
    assert status in (400, 413), status
    assert _get(server, "/healthz") == 200

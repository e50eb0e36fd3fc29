"""Throwaway PostgreSQL, Redis and NATS (JetStream) servers that the test run starts itself.

The machines start with no server running, and a developer's own servers are not ours to
use or to stop. So the first test that asks for a server (``redis_url()``, ``nats_url()``,
``pg_dsn()``) starts one: the Debian package's binary, on a free loopback port, with its own
data directory under a temporary folder; the session's end stops every one of them
(``stop_all``, called from the root conftest's ``pytest_unconfigure`` and from ``atexit``).

Why lazily: a run of ``tests/envelope`` needs none of them, and PostgreSQL's ``initdb`` costs a
couple of seconds. Why module-level state: the URLs are read by many test folders, including
module-level code of theirs, and the outage tests must stop and restart *the same* instance.

A developer who wants the tests on servers of their own sets ``PRISM_TEST_REDIS_URL``,
``PRISM_TEST_NATS_URL`` or ``PRISM_TEST_PG_DSN``; then nothing is started for that one, and the
outage tests (which stop the server) refuse to run against it.

The binaries come from ``scripts/ensure-test-deps.sh`` (``make test`` runs it: Debian's
``postgresql``, ``redis-server`` and ``nats-server``). Missing ones make ``require`` skip the test
locally and fail it under ``CI=true``.
"""

from __future__ import annotations

import abc
import atexit
import contextlib
import glob
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from tests.support import require

READY_TIMEOUT_S = 60.0


def free_port() -> int:
    """A loopback port nobody listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def poll(check: Callable[[], bool], what: str, timeout: float = READY_TIMEOUT_S) -> None:
    """Wait until ``check()`` is true: short, growing intervals, never a fixed sleep."""
    deadline = time.monotonic() + timeout
    delay = 0.02
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not reached within {timeout:.0f}s")
        time.sleep(delay)
        delay = min(delay * 2, 0.25)


def _answers(port: int, probe: bytes, expect: bytes) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
            if probe:
                s.sendall(probe)
            s.settimeout(1)
            return s.recv(64).startswith(expect)
    except OSError:
        return False


class ServerUnavailable(RuntimeError):
    """The server's binary is missing or it did not come up; the message says how to fix it."""


class LocalServer(abc.ABC):
    """One server process of ours: started, stopped and started again on the same port and data."""

    name = "server"
    package = ""
    #: The signal that stops the server at once, dropping its clients as a crash would.
    stop_signal = signal.SIGTERM

    def __init__(self, root: Path) -> None:
        self.port = free_port()
        self.dir = root / self.name
        self.dir.mkdir(parents=True, exist_ok=True)
        self.log = self.dir / "server.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self._prepared = False

    # -- what each server defines
    @abc.abstractmethod
    def binary(self) -> str | None:
        """The server's executable, or None when it is not installed."""

    @abc.abstractmethod
    def command(self, binary: str) -> list[str]:
        """The command line that runs the server in the foreground on ``self.port``."""

    @abc.abstractmethod
    def up(self) -> bool:
        """Whether the server answers its own protocol (not merely accepts TCP)."""

    def prepare(self, binary: str) -> None:
        """One-time set-up of the data directory (PostgreSQL's initdb); most servers need none."""
        return

    def after_start(self) -> None:
        """What must exist once the server answers (PostgreSQL's databases); most need nothing."""
        return

    def popen_kwargs(self) -> dict[str, object]:
        return {}

    @property
    @abc.abstractmethod
    def url(self) -> str:
        """What a client connects to."""

    # -- lifecycle
    def start(self) -> None:
        binary = self.binary()
        if binary is None:
            raise ServerUnavailable(
                f"{self.name}: no binary found; install the Debian package {self.package!r} "
                f"(make test does it as root: scripts/ensure-test-deps.sh)")
        if not self._prepared:
            self.prepare(binary)
            self._prepared = True
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(self.command(binary), stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True,
                                         **self.popen_kwargs())  # type: ignore[call-overload]
        try:
            poll(lambda: self.up() or self.proc is None or self.proc.poll() is not None, f"{self.name} answering")
        except TimeoutError:
            self.stop()
            raise ServerUnavailable(f"{self.name} did not answer on port {self.port}: {self._log_tail()}") from None
        if not self.up():
            code = self.proc.returncode if self.proc else None
            self.proc = None
            raise ServerUnavailable(f"{self.name} exited ({code}) at start: {self._log_tail()}")
        self.after_start()

    def stop(self) -> None:
        """``stop_signal``, then SIGKILL after 15 s; waits until the process is gone."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(self.stop_signal)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            proc.wait(timeout=10)

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def _log_tail(self) -> str:
        try:
            return " | ".join(self.log.read_text(errors="replace").strip().splitlines()[-8:])
        except OSError:
            return "(no log)"


class RedisServer(LocalServer):
    name = "redis"
    package = "redis-server"

    def binary(self) -> str | None:
        return shutil.which("redis-server")

    def command(self, binary: str) -> list[str]:
        # No persistence: a restart after an outage test starts empty, like the machines' old server.
        return [binary, "--bind", "127.0.0.1", "--port", str(self.port), "--save", "", "--appendonly", "no",
                "--dir", str(self.dir), "--daemonize", "no", "--protected-mode", "no"]

    def up(self) -> bool:
        return _answers(self.port, b"PING\r\n", b"+PONG")

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"


class NatsServer(LocalServer):
    name = "nats"
    package = "nats-server"

    def binary(self) -> str | None:
        return shutil.which("nats-server") or next(
            (p for p in ("/usr/sbin/nats-server", "/usr/bin/nats-server") if os.access(p, os.X_OK)), None)

    def command(self, binary: str) -> list[str]:
        return [binary, "-a", "127.0.0.1", "-p", str(self.port), "-js", "-sd", str(self.dir / "jetstream")]

    def up(self) -> bool:
        return _answers(self.port, b"", b"INFO ")

    def after_start(self) -> None:
        _jetstream_ready(self.url)

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"


class PostgresServer(LocalServer):
    """PostgreSQL with trust authentication and the databases the tests use (``test``, ``root``).

    ``initdb`` and ``postgres`` refuse to run as root, so as root they run as the package's
    ``postgres`` user (the data directory is handed to it); as anyone else, as that user."""

    name = "postgres"
    package = "postgresql"
    #: SIGTERM is PostgreSQL's "smart" shutdown, which waits for every client to leave;
    #: SIGINT is the "fast" one (pg_ctl -m fast) that an outage test needs.
    stop_signal = signal.SIGINT

    def _bindir(self) -> Path | None:
        dirs = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda d: int(Path(d).parent.name))
        for d in reversed(dirs):
            if os.access(Path(d) / "postgres", os.X_OK) and os.access(Path(d) / "initdb", os.X_OK):
                return Path(d)
        found = shutil.which("postgres")
        return Path(found).parent if found and shutil.which("initdb") else None

    def binary(self) -> str | None:
        bindir = self._bindir()
        return str(bindir / "postgres") if bindir else None

    def popen_kwargs(self) -> dict[str, object]:
        if os.geteuid() != 0:
            return {}
        return {"user": "postgres", "group": "postgres", "extra_groups": []}

    def prepare(self, binary: str) -> None:
        data = self.dir / "data"
        if os.geteuid() == 0:
            shutil.chown(self.dir, "postgres", "postgres")
            for parent in self.dir.parents:  # the postgres user must reach its directory
                if parent == Path(tempfile.gettempdir()) or parent == Path("/"):
                    break
                parent.chmod(parent.stat().st_mode | 0o711)
        initdb = str(Path(binary).parent / "initdb")
        proc = subprocess.run([initdb, "-D", str(data), "-A", "trust", "-U", "postgres", "--no-sync",
                               "-E", "UTF8", "--locale", "C"], capture_output=True, text=True, timeout=120,
                              stdin=subprocess.DEVNULL, **self.popen_kwargs())  # type: ignore[call-overload]
        if proc.returncode != 0:
            raise ServerUnavailable(f"postgres: initdb failed: {proc.stderr.strip() or proc.stdout.strip()}")

    def command(self, binary: str) -> list[str]:
        # Durability settings off: these are throwaway databases, and fsync on a busy 2-core
        # machine costs the suite minutes.
        return [binary, "-D", str(self.dir / "data"), "-p", str(self.port), "-k", str(self.dir),
                "-c", "listen_addresses=127.0.0.1", "-c", "fsync=off", "-c", "synchronous_commit=off",
                "-c", "full_page_writes=off", "-c", "max_connections=200"]

    def up(self) -> bool:
        import psycopg

        try:
            with psycopg.connect(self.dsn("postgres"), connect_timeout=1) as conn:
                conn.execute("SELECT 1")
            return True
        except Exception:
            return False

    def after_start(self) -> None:
        import psycopg

        with psycopg.connect(self.dsn("postgres"), autocommit=True, connect_timeout=5) as conn:
            have = {r[0] for r in conn.execute("SELECT datname FROM pg_database").fetchall()}
            for db in ("test", "root"):
                if db not in have:
                    conn.execute(f'CREATE DATABASE "{db}"')

    def dsn(self, db: str = "test") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{db}"

    @property
    def url(self) -> str:
        return self.dsn("test")


def _jetstream_ready(url: str, timeout: float = READY_TIMEOUT_S) -> None:
    """nats-server accepts connections before JetStream is ready; the tests need JetStream itself."""
    import asyncio

    import nats

    async def probe() -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                nc = await nats.connect(url, connect_timeout=1, allow_reconnect=False)
                try:
                    await nc.jetstream().account_info()
                    return
                finally:
                    await nc.close()
            except Exception:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.05)

    # The first caller may be inside a running event loop (an async fixture): probe on a thread.
    errors: list[BaseException] = []

    def run() -> None:
        try:
            asyncio.run(probe())
        except BaseException as exc:  # handed to the caller below
            errors.append(exc)

    t = threading.Thread(target=run, name="jetstream-probe")
    t.start()
    t.join()
    if errors:
        raise ServerUnavailable(f"nats: JetStream did not become ready: {errors[0]!r}")


# --------------------------------------------------------------------------- the session's servers

_KINDS: dict[str, type[LocalServer]] = {"redis": RedisServer, "nats": NatsServer, "postgres": PostgresServer}
_ENV = {"redis": "PRISM_TEST_REDIS_URL", "nats": "PRISM_TEST_NATS_URL", "postgres": "PRISM_TEST_PG_DSN"}
_servers: dict[str, LocalServer] = {}
_failed: dict[str, str] = {}
_lock = threading.Lock()
_root: Path | None = None


def _session_root() -> Path:
    global _root
    if _root is None:
        _root = Path(tempfile.mkdtemp(prefix="prism-test-servers-"))
    return _root


def server(name: str) -> LocalServer | None:
    """The running server of ours for ``name``, started on first use; None when the developer
    pointed the tests at their own server (``PRISM_TEST_*``). A server that cannot start is
    reported through ``require`` (skip locally, fail under CI=true) - once per session."""
    if os.environ.get(_ENV[name]):
        return None
    with _lock:
        if name in _failed:
            require(False, _failed[name])
        srv = _servers.get(name)
        if srv is None:
            srv = _KINDS[name](_session_root())
            try:
                srv.start()
            except Exception as exc:  # e.g. KeyError: no `postgres` user
                srv.stop()
                _failed[name] = f"{name} for the tests could not start: {exc}"
                require(False, _failed[name])
            _servers[name] = srv
        return srv


def url(name: str) -> str:
    """The URL of the session's ``name`` server (starting it if need be)."""
    srv = server(name)
    return os.environ[_ENV[name]] if srv is None else srv.url


def redis_url() -> str:
    return url("redis")


def nats_url() -> str:
    return url("nats")


def pg_dsn() -> str:
    return url("postgres")


def stop_all() -> None:
    """Stop every server this session started, and remove their data."""
    with _lock:
        for srv in list(_servers.values()):
            with contextlib.suppress(Exception):
                srv.stop()
        _servers.clear()
        if _root is not None:
            shutil.rmtree(_root, ignore_errors=True)


atexit.register(stop_all)

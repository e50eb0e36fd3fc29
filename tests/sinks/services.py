"""Stopping and restarting the machine's real Redis, PostgreSQL and NATS, for outage tests.

The commands are exactly the ones in docs/platform-notes.md ("The test machines and their local
services"). `outage(service)` stops the
server on entry and ALWAYS starts it again on exit (even when the test failed), then waits
until it answers - polling, never sleeping a fixed time - because other engineers and CI
need these servers. A file lock serialises outages of the same service between our own
test processes.

Stop/start commands run in a thread, so the event loop (and the sink under test) keeps
running through the outage.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

from tests.support import require

REDIS_START = ["redis-server", "--daemonize", "yes", "--bind", "127.0.0.1", "-::1", "--port", "6379", "--save", "",
               "--appendonly", "no", "--dir", "/var/lib/redis", "--logfile", "/var/log/redis/ci.log"]
NATS_START = ["start-stop-daemon", "--start", "--oknodo", "--background", "--exec", "/usr/sbin/nats-server", "--",
              "-a", "127.0.0.1", "-p", "4222", "-js", "-sd", "/var/lib/nats-server", "-l", "/var/log/nats-server.log"]
READY_TIMEOUT_S = 60.0


def _pg_cluster(action: str) -> list[str]:
    versions = sorted(os.listdir("/etc/postgresql"))  # `$(ls /etc/postgresql)`
    return ["pg_ctlcluster", "--skip-systemctl-redirect", *versions, "main", action]


def _run(cmd: list[str]) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}: {proc.stderr.strip() or proc.stdout.strip()}")


def _poll(check: Callable[[], bool], what: str, timeout: float = READY_TIMEOUT_S) -> None:
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


def redis_up() -> bool:
    return _answers(6379, b"PING\r\n", b"+PONG")


def nats_up() -> bool:
    return _answers(4222, b"", b"INFO ")


def postgres_up() -> bool:
    import psycopg

    try:
        with psycopg.connect("postgresql://postgres@127.0.0.1:5432/postgres", connect_timeout=1) as conn:
            conn.execute("SELECT 1")
        return True
    except Exception:
        return False


def _nats_pid() -> int | None:
    """The pid of the process listening on 127.0.0.1:4222 (the server to stop, found by its
    port rather than by name, so no other process can be hit)."""
    out = subprocess.run(["ss", "-ltnpH", "sport = :4222"], capture_output=True, text=True).stdout
    m = re.search(r"pid=(\d+)", out)
    return int(m.group(1)) if m else None


def _stop_nats() -> None:
    pid = _nats_pid()
    if pid is None:
        raise RuntimeError("no process listens on 127.0.0.1:4222")
    os.kill(pid, signal.SIGTERM)
    try:
        _poll(lambda: not Path(f"/proc/{pid}").exists(), "nats-server exit", timeout=10)
    except TimeoutError:
        os.kill(pid, signal.SIGKILL)
        _poll(lambda: not Path(f"/proc/{pid}").exists(), "nats-server exit after SIGKILL", timeout=10)


SERVICES: dict[str, dict[str, object]] = {
    "redis": {"stop": lambda: _run(["redis-cli", "-p", "6379", "shutdown", "nosave"]),
              "start": lambda: _run(REDIS_START), "up": redis_up, "binaries": ["redis-cli", "redis-server"]},
    "postgres": {"stop": lambda: _run(_pg_cluster("stop")), "start": lambda: _run(_pg_cluster("start")),
                 "up": postgres_up, "binaries": ["pg_ctlcluster"]},
    "nats": {"stop": _stop_nats, "start": lambda: _run(NATS_START), "up": nats_up,
             "binaries": ["start-stop-daemon", "/usr/sbin/nats-server", "ss"]},
}


def require_restartable(name: str) -> None:
    missing = [b for b in SERVICES[name]["binaries"] if shutil.which(b) is None]  # type: ignore[attr-defined]
    require(not missing and os.geteuid() == 0,
            f"restarting {name} needs root and {missing or SERVICES[name]['binaries']}")
    require(SERVICES[name]["up"](), f"{name} is not running on this machine")  # type: ignore[operator]


@contextlib.contextmanager
def _lock(name: str) -> Iterator[None]:
    with open(f"/tmp/prism-test-outage-{name}.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


@contextlib.asynccontextmanager
async def outage(name: str) -> AsyncIterator[None]:
    """Stop `name` (redis, postgres, nats); on exit start it again and wait until it answers."""
    svc = SERVICES[name]
    up: Callable[[], bool] = svc["up"]  # type: ignore[assignment]
    with _lock(name):
        try:
            await asyncio.to_thread(svc["stop"])  # type: ignore[arg-type]
            await asyncio.to_thread(_poll, lambda: not up(), f"{name} down", 30)
            yield
        finally:
            if name == "nats":  # start-stop-daemon --oknodo does nothing while an old process lingers
                await asyncio.to_thread(_poll, lambda: _nats_pid() is None, "old nats-server gone", 15)
            if not up():
                await asyncio.to_thread(svc["start"])  # type: ignore[arg-type]
            await asyncio.to_thread(_poll, up, f"{name} answering again")
            if name == "nats":
                await _jetstream_ready()


async def _jetstream_ready(timeout: float = READY_TIMEOUT_S) -> None:
    """nats-server accepts connections before JetStream has recovered its streams; the next
    test (ours or another module's) needs JetStream itself."""
    import nats

    deadline = time.monotonic() + timeout
    while True:
        try:
            nc = await nats.connect("nats://127.0.0.1:4222", connect_timeout=1, allow_reconnect=False)
            try:
                await nc.jetstream().account_info()
                return
            finally:
                await nc.close()
        except Exception:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.05)

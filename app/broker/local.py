"""`prism broker`: a local embedded broker that outlives workers, on a known port.

Why: without ``PRISM_BROKER_URL``, ``prism run`` starts a private embedded broker on a random
port that only its log names, and stops it with the worker. The DLQ workflow - fix the cause,
restart the worker, replay the DLQ - then loses the DLQ itself at the restart, and ``prism dlq``
has no broker to read. ``prism broker start`` runs the same broker (Tansu, in memory) detached,
on a fixed port (9092 by default), and records it in a state directory (``broker.pid``,
``broker.port``, ``tansu-<port>.log``). ``prism run``, ``prism dlq``, ``prism topics create``
and ``prism status`` find it there when ``PRISM_BROKER_URL`` is not set.

The state directory is ``$PRISM_BROKER_STATE_DIR``, else ``var/broker`` under the working
directory (where ``var/data`` and the demo's keys live too). The broker's data lives in its
memory: it lasts as long as the broker process, not longer - ``prism broker stop`` (or a
reboot) empties every topic.

A pid file is trusted only while its process is alive, runs a Tansu binary and the recorded
port accepts connections; anything else is a stale record (a crashed or killed broker, a reused
pid), reported by ``status``, ignored by the other commands and removed by ``start``/``stop``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.broker.embedded import BrokerError, BrokerPortInUse, EmbeddedBroker, _port_is_free

STATE_ENV = "PRISM_BROKER_STATE_DIR"
DEFAULT_STATE_DIR = Path("var/broker")
DEFAULT_PORT = 9092
HOST = "127.0.0.1"


def state_dir(explicit: str | os.PathLike[str] | None = None) -> Path:
    """Where the local broker's pid and port files are: the argument, $PRISM_BROKER_STATE_DIR, var/broker."""
    if explicit:
        return Path(explicit)
    return Path(os.environ.get(STATE_ENV) or DEFAULT_STATE_DIR)


@dataclass(frozen=True)
class LocalBroker:
    """A local broker as its state files describe it."""

    pid: int
    port: int
    state_dir: Path
    host: str = HOST

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.state_dir / f"tansu-{self.port}.log"

    def describe(self) -> str:
        return f"local broker on {self.bootstrap} (prism broker, pid {self.pid})"


def _pid_file(folder: Path) -> Path:
    return folder / "broker.pid"


def _port_file(folder: Path) -> Path:
    return folder / "broker.port"


def read_record(folder: Path) -> LocalBroker | None:
    """The recorded broker (alive or not); None when there is no complete, readable record."""
    try:
        pid = int(_pid_file(folder).read_text().strip())
        port = int(_port_file(folder).read_text().strip())
    except (OSError, ValueError):
        return None
    return LocalBroker(pid=pid, port=port, state_dir=folder)


def _is_tansu(pid: int) -> bool:
    """The process `pid` is alive and runs a Tansu broker (not a process that reused the pid)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # alive, another user's: the cmdline decides
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    if b"<defunct>" in cmdline or not cmdline:
        return False
    args = cmdline.split(b"\0")
    return any(Path(a.decode("utf-8", "replace")).name.startswith("tansu") for a in args[:1]) and b"broker" in args


def _accepts(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1.0):
            return True
    except OSError:
        return False


def probe(folder: Path | None = None) -> tuple[LocalBroker | None, LocalBroker | None]:
    """`(running, stale)`: the recorded broker if it is alive and listening, else the stale record."""
    folder = state_dir(folder)
    rec = read_record(folder)
    if rec is None:
        return None, None
    if _is_tansu(rec.pid) and _accepts(rec.host, rec.port):
        return rec, None
    return None, rec


def find_running(folder: Path | None = None) -> LocalBroker | None:
    """The running local broker, or None (a stale record counts as none)."""
    return probe(folder)[0]


def _clear(folder: Path) -> None:
    for f in (_pid_file(folder), _port_file(folder)):
        f.unlink(missing_ok=True)


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


class BrokerRunning(BrokerError):
    """`prism broker start` when one already runs on another port."""

    code = "broker_running"


def start(port: int = DEFAULT_PORT, folder: Path | None = None) -> tuple[LocalBroker, bool]:
    """Start a detached broker on `port` and record it; `(broker, started)` - started is False
    when one was running already on that port. Raises BrokerPortInUse (someone else has the
    port) or BrokerRunning (ours runs on another port)."""
    folder = state_dir(folder)
    running, stale = probe(folder)
    if running is not None:
        if running.port != port:
            raise BrokerRunning(f"a local broker already runs on {running.bootstrap} (pid {running.pid})",
                                path=str(folder), hint=f"use it, or `prism broker stop` first to move it to port {port}")
        return running, False
    if stale is not None:
        _clear(folder)
    folder.mkdir(parents=True, exist_ok=True)
    if not _port_is_free(HOST, port):
        raise BrokerPortInUse(f"cannot start the local broker: {HOST}:{port} is already in use by another process",
                              path="--port", hint=f"stop whatever listens there (`ss -ltnp 'sport = :{port}'`) or "
                                                  f"pick another port: prism broker start --port {port + 1 if port < 65535 else 19092}")
    broker = EmbeddedBroker(port=port, host=HOST, log_dir=folder, outlive_parent=True)
    broker.start()
    pid = broker.release()
    _write_atomic(_port_file(folder), f"{port}\n")
    _write_atomic(_pid_file(folder), f"{pid}\n")  # last: a pid file means a complete record
    return LocalBroker(pid=pid, port=port, state_dir=folder), True


def stop(folder: Path | None = None, timeout: float = 10.0) -> tuple[LocalBroker | None, bool]:
    """Stop the recorded broker: SIGTERM, SIGKILL after `timeout`. `(record, was_running)`;
    the record files are removed either way (a stale record is cleaned up)."""
    folder = state_dir(folder)
    rec = read_record(folder)
    if rec is None:
        _clear(folder)
        return None, False
    alive = _is_tansu(rec.pid)
    if alive:
        with contextlib.suppress(ProcessLookupError):
            os.kill(rec.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while _is_tansu(rec.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if _is_tansu(rec.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(rec.pid, signal.SIGKILL)
            while _is_tansu(rec.pid) and time.monotonic() < deadline + 5:
                time.sleep(0.05)
    _clear(folder)
    return rec, alive


def cli_bootstrap(note: Callable[[str], None] | None = None) -> tuple[str, Any]:
    """`(bootstrap, settings)` for a command that needs an existing broker (`prism dlq`, `prism
    topics create`): PRISM_BROKER_URL when set, else the running local broker (said in one line
    through `note`), else an error naming both ways to get one. A private broker would be empty,
    so these commands never start one."""
    from app.broker.admin import BrokerSettings
    from app.errors import NoBrokerError

    settings = BrokerSettings.from_env()
    if not settings.embedded:
        check_reachable(settings)
        return settings.bootstrap, settings
    running = find_running()
    if running is None:
        raise NoBrokerError("no broker configured and no local broker running", path="PRISM_BROKER_URL",
                            hint="start one with `prism broker start` (and run the worker while it runs: `prism "
                                 "run` uses it), or set PRISM_BROKER_URL=host:port of your Kafka cluster")
    if note is not None:
        note(f"using the {running.describe()}; set PRISM_BROKER_URL for a Kafka cluster")
    return running.bootstrap, None


def check_reachable(settings: Any, *, timeout: float = 15.0) -> None:
    """Connect once (TLS, SASL) before a command reads or writes the cluster, so that an unreachable
    broker and a refused password are each one `error [code] ...; fix:` line - `kafka_unreachable`,
    `kafka_auth_failed`, `kafka_tls_failed` (app/broker/preflight.py, what `prism run` does) - not
    an aiokafka traceback ending in "Unable to bootstrap", which blames the network for a wrong
    password. aiokafka's own connection log lines are silenced for the command: the error line
    says it all."""
    import logging

    from app.broker.preflight import preflight

    quiet = logging.getLogger("aiokafka")
    before = quiet.level
    quiet.setLevel(logging.CRITICAL)  # for this check only: the caller's process keeps its logging
    try:
        preflight(settings, timeout=timeout)
    finally:
        quiet.setLevel(before)


def status_doc() -> dict[str, Any] | None:
    """What `prism status` says about the local broker: None when PRISM_BROKER_URL names the
    broker (the local one is not used then), else whether one runs and where."""
    if (os.environ.get("PRISM_BROKER_URL") or "").strip():
        return None
    running = find_running()
    if running is None:
        return {"running": False, "state_dir": str(state_dir())}
    return {"running": True, "bootstrap": running.bootstrap, "pid": running.pid, "state_dir": str(running.state_dir)}


def status_line(doc: dict[str, Any]) -> str:
    """`status_doc()` as the one line `prism status` prints."""
    if doc["running"]:
        return (f"local broker: {doc['bootstrap']} (prism broker, pid {doc['pid']}); `prism dlq` reads the DLQ there, "
                "and it keeps running when the worker stops")
    return ("local broker: not running - a worker without PRISM_BROKER_URL then has a private broker whose DLQ is gone "
            "with it; `prism broker start` before `prism run` keeps it")

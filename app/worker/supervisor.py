"""`prism run --processes N`: one supervisor, N worker processes in one consumer group.

Why processes: a Faust worker is one Python process on one event loop; past ~6k msg/s per core
(docs/platform-notes.md) the way to use more cores is more workers in the same consumer group,
each owning some of the source partitions - what Kafka Connect's ``tasks.max`` and uvicorn's
``--workers`` do. The supervisor is the one thing an operator (or systemd, or a container
runtime) starts and stops:

* **children**: ``python -m app.worker.faust_app app.worker.pipeline:app_from_env``, each with its
  own data dir (``<data-dir>/<topology>/proc-<i>``: RocksDB allows one process per database),
  its own archive writer id (``<host>-<supervisor pid>-p<i>``) and archive shard
  (``i/N``: child ``i`` archives partitions ``p % N == i``), and - with ``--web-port P`` - its
  own web port ``P + 1 + i``. All share the app id, i.e. the consumer group and the changelogs.
* **the embedded default**: without ``PRISM_BROKER_URL`` the supervisor starts the embedded
  broker once and gives its address to every child (flagged embedded, so the children use its
  workarounds); with it, the children inherit the cluster settings.
* **crashes**: a child that exits while the supervisor is not stopping is started again after a
  backoff (1 s, doubling to 30 s; reset once the child has been ready for 60 s). Its partitions
  go to the survivors in the meantime (a rebalance), and come back at the next one.
* **SIGTERM / SIGINT**: passed on to every child and awaited (each finishes its batch, commits,
  closes RocksDB); children still running after ``stop_timeout`` are killed. Exit code 0 when
  every child stopped cleanly. If the supervisor itself is killed, the children get SIGTERM from
  the kernel (parent-death signal) instead of running on as orphans.
* **status**: ``<data-dir>/<topology>/supervisor.json`` (rewritten on every change), and with
  ``--web-port P`` on ``http://127.0.0.1:P``: ``/readyz`` (200 when every child is ready),
  ``/healthz`` and ``/workers`` (per child: pid, state, restarts, last exit, its web address) -
  ``prism status --url http://127.0.0.1:P`` reads it and then each child.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.security.http_limits import limited_aiohttp_runner
from app.worker.archive_service import SHARD_ENV, WRITER_ID_ENV, check_writer_id, default_writer_id
from app.worker.faust_app import WorkerProcess, event_loop_name
from app.worker.management import READ, ManagementSettings, Refusal, authorize

__all__ = ["Backoff", "Child", "Supervisor", "child_data_dir"]

log = logging.getLogger("prism.supervisor")

TARGET = "app.worker.pipeline:app_from_env"


def child_data_dir(data_dir: Path, topology_name: str, index: int) -> Path:
    """Where child ``index`` keeps its RocksDB tables: ``<data-dir>/<topology>/proc-<index>``."""
    return data_dir / topology_name / f"proc-{index}"


@dataclass
class Backoff:
    """Restart delays: ``initial * 2**(failures-1)`` capped at ``maximum``; reset by a stable run."""

    initial: float = 1.0
    maximum: float = 30.0
    stable_after: float = 60.0

    def delay(self, failures: int) -> float:
        return 0.0 if failures <= 0 else min(self.maximum, self.initial * 2 ** (failures - 1))


@dataclass
class Child:
    """One worker process and what the supervisor knows about it."""

    index: int
    process: WorkerProcess
    data_dir: Path
    writer_id: str
    web_port: int | None
    state: str = "starting"  # starting | ready | restarting | stopped
    restarts: int = 0
    failures: int = 0  # consecutive crashes (reset once the child has been ready for a while)
    last_exit: int | None = None
    last_exit_at: float | None = None
    started_at: float = 0.0
    ready_at: float | None = None
    next_start: float | None = None
    ready_info: dict[str, Any] = field(default_factory=dict)
    scheme: str = "http"  # https when the children serve TLS (PRISM_WEB_SSL_CERTFILE)

    def to_dict(self) -> dict[str, Any]:
        return {"index": self.index, "pid": self.process.pid if self.process.running else None,
                "state": self.state, "restarts": self.restarts, "last_exit": self.last_exit,
                "last_exit_at": self.last_exit_at, "data_dir": str(self.data_dir), "writer_id": self.writer_id,
                "web_url": f"{self.scheme}://127.0.0.1:{self.web_port}" if self.web_port else None,
                "event_loop": self.ready_info.get("event_loop"), "log": str(self.process.log_path)}


class Supervisor:
    """Starts, watches and stops N worker processes (see the module docstring).

    Args:
        env: the children's configuration (PRISM_TOPOLOGY, PRISM_BOOTSTRAP, PRISM_APP_ID,
            PRISM_EMBEDDED, PRISM_ARCHIVE, ...); per-child variables are added here.
    """

    def __init__(self, *, processes: int, topology_name: str, data_dir: Path, env: Mapping[str, str],
                 web_port: int | None = None, web_bind: str = "127.0.0.1", loglevel: str = "warning",
                 backoff: Backoff | None = None,
                 stop_timeout: float = 60.0, status_file: Path | None = None,
                 management: ManagementSettings | None = None) -> None:
        if processes < 1:
            raise ValueError("processes must be >= 1")
        self.processes = processes
        self.topology_name = topology_name
        self.backoff = backoff or Backoff()
        self.stop_timeout = stop_timeout
        self.web_port = web_port
        #: where the supervisor's status site and every child's web port listen (`--web-bind`):
        #: 0.0.0.0 in a container, so the orchestrator's probes reach them
        self.web_bind = web_bind
        self.status_file = status_file or data_dir / topology_name / "supervisor.json"
        #: who may read `/workers`, and TLS: the children's own settings (PRISM_ADMIN_*,
        #: PRISM_WEB_SSL_*), so the supervisor's status is guarded like a child's status route
        self.management = management or ManagementSettings.default()
        self.stopping = False
        self.started_at = time.time()
        self._last_written: str | None = None
        self.children: list[Child] = []
        for i in range(processes):
            cdir = child_data_dir(data_dir, topology_name, i)
            writer = default_writer_id(suffix=f"p{i}", env=env)
            if env.get(WRITER_ID_ENV) and processes > 1:  # an explicit id, made unique per child
                writer = f"{env[WRITER_ID_ENV].strip()}-p{i}"
            check_writer_id(writer)
            port = web_port + 1 + i if web_port else None
            child_env = {**env, "PRISM_DATA_DIR": str(cdir), WRITER_ID_ENV: writer,
                         SHARD_ENV: f"{i}/{processes}"}
            child_env["PRISM_WEB_PORT"] = str(port) if port else ""  # "" beats an inherited value
            child_env["PRISM_WEB_BIND"] = web_bind
            proc = WorkerProcess(TARGET, log_path=cdir / "worker.log", ready_file=cdir / "ready.json",
                                 env=child_env, loglevel=loglevel)
            tls = bool({**os.environ, **env}.get("PRISM_WEB_SSL_CERTFILE"))
            self.children.append(Child(i, proc, cdir, writer, port, scheme="https" if tls else "http"))

    # -- lifecycle -------------------------------------------------------------------------------
    def start(self) -> None:
        for child in self.children:
            child.data_dir.mkdir(parents=True, exist_ok=True)
            self._spawn(child)
        self.write_status()

    def _spawn(self, child: Child) -> None:
        child.process.stop(timeout=0)  # closes the previous log handle; the process is gone already
        child.process.start(wait=False)
        child.state = "starting"
        child.started_at = time.time()
        child.ready_at = None
        child.next_start = None
        child.ready_info = {}
        log.info("worker %d started (pid %s)", child.index, child.process.pid)

    def poll(self, now: float | None = None) -> None:
        """One supervision step: notice readiness, crashes, due restarts. Called every ~0.2 s."""
        now = time.time() if now is None else now
        for child in self.children:
            proc = child.process
            if child.state == "restarting":
                if not self.stopping and child.next_start is not None and now >= child.next_start:
                    child.restarts += 1
                    self._spawn(child)
                continue
            if child.state == "stopped":
                continue
            code = proc.returncode
            if code is not None:
                child.last_exit, child.last_exit_at = code, now
                if self.stopping:
                    child.state = "stopped"
                    continue
                child.failures += 1
                delay = self.backoff.delay(child.failures)
                child.state, child.next_start = "restarting", now + delay
                log.warning("worker %d (pid %s) exited with %s; restarting in %.1fs (restart %d); log: %s",
                            child.index, proc.pid, _exit_text(code), delay, child.restarts + 1, proc.log_path)
                continue
            if child.state == "starting" and proc.ready_file.exists():
                with contextlib.suppress(OSError, ValueError):
                    child.ready_info = json.loads(proc.ready_file.read_text())
                child.state, child.ready_at = "ready", now
            if child.state == "ready" and child.ready_at is not None and now - child.ready_at >= self.backoff.stable_after:
                child.failures = 0
        self.write_status()

    async def run(self, stop: asyncio.Event, interval: float = 0.2) -> int:
        """Supervise until ``stop`` is set, then stop every child. Returns the exit code."""
        self.start()
        while not stop.is_set():
            self.poll()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), interval)
        return await self.shutdown()

    async def shutdown(self) -> int:
        """SIGTERM every child, wait for all (in parallel), SIGKILL what is left after the timeout."""
        self.stopping = True
        alive = [c.process.running for c in self.children]
        # in parallel: each stop() sends SIGTERM and waits (SIGKILL after the timeout)
        codes = await asyncio.gather(*(asyncio.to_thread(c.process.stop, self.stop_timeout) for c in self.children))
        bad = []
        for child, was_alive, code in zip(self.children, alive, codes, strict=True):
            if was_alive:
                child.last_exit, child.last_exit_at = code, time.time()
                if code != 0:
                    bad.append(child.index)
            child.state = "stopped"
        self.write_status()
        if bad:
            log.warning("worker(s) %s did not stop cleanly", bad)
        return 1 if bad else 0

    # -- status ----------------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        children = [c.to_dict() for c in self.children]
        ready = all(c.state == "ready" for c in self.children) and not self.stopping
        return {"kind": "supervisor", "pid": os.getpid(), "topology": self.topology_name,
                "processes": self.processes, "ready": ready, "stopping": self.stopping,
                "event_loop": event_loop_name(), "started_at": self.started_at,
                "restarts": sum(c.restarts for c in self.children), "children": children}

    def write_status(self) -> None:
        doc = self.status()
        text = json.dumps(doc, sort_keys=True)
        if text == self._last_written:
            return
        self._last_written = text
        self.status_file.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.status_file.with_name(self.status_file.name + ".tmp")
        tmp.write_text(text)
        tmp.replace(self.status_file)  # atomic for readers

    # -- HTTP --------------------------------------------------------------------------------------
    async def serve(self, port: int) -> Any:
        """``/readyz``, ``/healthz``, ``/workers`` on ``web_bind``:``port``; returns the aiohttp runner."""
        from aiohttp import web

        async def readyz(_request: web.Request) -> web.Response:
            # Open (probes carry no credentials), so only what a probe needs: readiness and
            # each child's state. Pids, paths, writer ids and addresses are in /workers.
            doc = self.status()
            probe = {k: doc[k] for k in ("kind", "topology", "processes", "ready", "stopping", "restarts")}
            probe["children"] = [{k: c[k] for k in ("index", "state", "restarts", "last_exit")} for c in doc["children"]]
            return web.json_response(probe, status=200 if doc["ready"] else 503)

        async def healthz(_request: web.Request) -> web.Response:
            return web.json_response({"status": "ok", "pid": os.getpid()})

        auth = self.management.auth

        async def workers(request: web.Request) -> web.Response:
            # a read, like GET /connectors/{name}/status on a child: anonymous unless
            # PRISM_ADMIN_ALLOW_ANONYMOUS=none, then credentials with the read role
            verdict = await authorize(auth, READ, "GET /workers", request.headers.getall("Authorization", []),
                                      request.remote)
            if isinstance(verdict, Refusal):
                return web.json_response(verdict.body(), status=verdict.status, headers=verdict.headers)
            return web.json_response(self.status())

        web_app = web.Application()
        # the one HTTP limits layer, as on every other Prism server (app/security/http_limits.py)
        runner = limited_aiohttp_runner(web_app, self.management.http_limits)
        web_app.router.add_get("/readyz", readyz)
        web_app.router.add_get("/healthz", healthz)
        web_app.router.add_get("/workers", workers)
        await runner.setup()
        await web.TCPSite(runner, self.web_bind, port, ssl_context=self.management.ssl_context).start()
        return runner


def _exit_text(code: int) -> str:
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"signal {signal.Signals(-code).name}"
    return f"status {code}"


async def supervise(supervisor: Supervisor, *, web_port: int | None = None) -> int:
    """Run ``supervisor`` until SIGTERM/SIGINT (both stop the children cleanly)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    runner = await supervisor.serve(web_port) if web_port else None
    try:
        return await supervisor.run(stop)
    finally:
        if runner is not None:
            await runner.cleanup()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)

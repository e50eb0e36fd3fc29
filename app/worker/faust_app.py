"""The Faust app factory, tuned as measured (docs/platform-notes.md), and ways to run a worker.

``make_app`` builds a ``faust.App`` with the settings that took Faust from ~2.5k to ~6.4k msg/s
on these machines and that make it start quickly on the embedded broker:

* session timeout 6 s / heartbeat 1 s: Tansu holds a new group's first join for about half the
  session timeout, so Faust's default 60 s means ~30 s before the first record;
* producer linger 5 ms and 256 KiB batches: with no linger and 16 KiB batches the broker burns
  ~10x more CPU per message;
* 4 MiB per-partition fetches, 2000 records per poll and a 16k stream buffer;
* RocksDB tables (``rocksdb://``, via rocksdict) so that state survives restarts;
* uvloop when installed (+22-27 %). A Faust app binds its event loop when it is built (the
  producer, the consumer and every service take ``asyncio.get_event_loop()``), so the policy must
  be installed before the app exists: :func:`use_uvloop` is the first thing every entry point
  does (``prism run``, ``python -m app.worker.faust_app``, ``prism demo``), and the ready file
  and ``/readyz`` report the loop actually running (``"event_loop": "uvloop"``);
* :class:`PrismWorker` resets the ROOT logger that Faust's start-up spinner leaves at DEBUG
  (building every aiokafka/Faust debug record cost ~10 % CPU and halved throughput);
* on the embedded broker, the ListOffsets workaround of :mod:`app.worker.offsets`, without which
  tables recover short or a restarted worker dies with ``ConsistencyError``;
* on every broker, :mod:`app.tables.recovery`: changelog end offsets verified with a fetch, and a
  partition whose local store is still ahead of its changelog (a changelog that lost records)
  wiped and rebuilt from the changelog instead of failing the worker with ``ConsistencyError`` -
  on restart and on a partition taken over in a rebalance alike;
* once started, :func:`tune_gc` (the worker process only: it changes process-wide state);
* :mod:`app.worker.dispatch`: fetched records reach the conductor without four asyncio tasks
  each (Faust's ``wait_first`` per record): the tuned passthrough went from ~90 to ~50 µs of
  CPU per message.

Two ways to run a worker:

* in-process, for tests: ``async with InProcessWorker(app): ...`` (explicit start/stop, no
  signal handlers, no logging takeover);
* as a subprocess: ``python -m app.worker.faust_app package.module:attr`` where ``attr`` is a
  ``faust.App`` or a zero-argument factory returning one; :class:`WorkerProcess` spawns it and
  waits for the ready file that :class:`PrismWorker` writes once table recovery is complete.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import json
import logging
import os
import signal
import subprocess
import sys
import time
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Any, NoReturn, Self

import faust
from faust.exceptions import AlreadyConfiguredWarning

from app import native
from app.broker.admin import BrokerSettings
from app.broker.embedded import with_parent_death_signal
from app.errors import ConfigError, PrismError
from app.worker.dispatch import install_fast_dispatch
from app.worker.offsets import install_listoffsets_workaround, install_offsets_probe
from app.worker.shutdown import clock as shutdown_clock
from app.worker.shutdown import install as bound_shutdown
from app.worker.shutdown import settle_loop

__all__ = [
    "READY_FILE_ENV",
    "InProcessWorker",
    "PrismWorker",
    "WorkerProcess",
    "event_loop_name",
    "load_app",
    "main",
    "make_app",
    "run_worker",
    "tune_gc",
    "use_uvloop",
]

log = logging.getLogger(__name__)
#: Lines an operator needs at the default level without their being warnings (the ready line):
#: logged at INFO, and let through the log handlers even when the worker runs at warning
#: (:class:`LifecycleFilter`). Why not WARNING: alerting on WARNING lines paged on every start.
lifecycle = logging.getLogger("prism.lifecycle")
lifecycle.setLevel(logging.INFO)


class LifecycleFilter(logging.Filter):
    """On a handler lowered to INFO: keeps its old threshold for every record except the
    ``prism.lifecycle`` ones, which pass at INFO."""

    def __init__(self, threshold: int) -> None:
        super().__init__()
        self.threshold = threshold

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= self.threshold or record.name == lifecycle.name


def show_lifecycle(logger: logging.Logger) -> None:
    """Let ``prism.lifecycle`` INFO lines through `logger`'s handlers, nothing else that they did
    not already let through."""
    for handler in logger.handlers:
        if handler.level > logging.INFO and not any(isinstance(f, LifecycleFilter) for f in handler.filters):
            handler.addFilter(LifecycleFilter(handler.level))
            handler.setLevel(logging.INFO)

#: When set, :class:`PrismWorker` writes a JSON file here once the worker is fully started
#: (table recovery complete, agents running): the subprocess readiness signal.
READY_FILE_ENV = "PRISM_WORKER_READY_FILE"

KIB = 1024
MIB = 1024 * KIB

#: Tuned defaults (docs/platform-notes.md, "Faust throughput" and "The embedded broker").
TUNED_SETTINGS: Mapping[str, Any] = {
    "broker_session_timeout": 6.0,
    "broker_heartbeat_interval": 1.0,
    "broker_max_poll_records": 2000,
    "consumer_max_fetch_size": 4 * MIB,
    "producer_linger": 0.005,
    "producer_max_batch_size": 256 * KIB,
    "producer_max_request_size": 4 * MIB,
    "stream_buffer_maxsize": 16384,
    "stream_recovery_delay": 0.0,
    "consumer_auto_offset_reset": "earliest",
    "topic_disable_leader": True,  # no leader-election topic: nothing in Prism uses app.leader
    "autodiscover": False,
    "worker_redirect_stdouts": False,
}


class PrismWorker(faust.Worker):
    """``faust.Worker`` with two fixes: the ROOT log level and a readiness file.

    Faust's progress spinner sets the ROOT logger to DEBUG so it can spin on every record, even
    with ``-l warn``; every ``log.debug`` in aiokafka and Faust then builds a record. We put the
    ROOT logger back to the requested level (the spinner still sees warnings and errors).
    """

    def on_setup_root_logger(self, logger: logging.Logger, level: int) -> None:
        if self.spinner is not None and not self.spinner.file.isatty():
            self.spinner = None  # nothing to animate in a log file or pipe
        super().on_setup_root_logger(logger, level)
        logger.setLevel(level or logging.WARNING)
        show_lifecycle(logger)

    def _on_sigterm(self) -> None:
        shutdown_clock.begin()  # every stop-time wait is bounded by the drain from now (app/worker/shutdown.py)
        super()._on_sigterm()

    def _on_sigint(self) -> None:
        shutdown_clock.begin()
        super()._on_sigint()

    async def _sentinel_task(self) -> None:
        """mode's last step before it closes the loop: a fixed 1 s sleep there, a condition
        wait here - until no other task is pending, at most that second (`settle_loop`)."""
        await settle_loop()

    def _on_sigusr1(self) -> None:
        """``kill -USR1``: the consumer snapshot and every task's await chain
        (:mod:`app.worker.diagnose`) - together they say where a stalled worker waits. Replaces
        mode's dump, which prints every frame's locals (messages, tokens, keys)."""
        from app.worker.diagnose import consumer_snapshot, worker_task_stacks

        try:
            snapshot = json.dumps(consumer_snapshot(self.app), default=str)
            stacks = worker_task_stacks(self.app, self.loop)
        except Exception as exc:  # never let a diagnostic take the worker down
            snapshot, stacks = f"<snapshot failed: {exc!r}>", []
        text = "\n".join([f"prism consumer snapshot: {snapshot}", f"prism tasks: {len(stacks)}",
                           *(f"  {line}" for line in stacks), "prism diagnosis end"])
        print(text, file=self.stderr, flush=True)

    async def on_startup_finished(self) -> None:
        await super().on_startup_finished()
        tune_gc()
        ready_file = os.environ.get(READY_FILE_ENV)
        if ready_file:
            _write_ready_file(Path(ready_file), self.app)
        lifecycle.info("%s", ready_line(self.app))


def ready_line(app: faust.App) -> str:
    """The one line a worker logs once it is ready (tables recovered, agents running).

    Why: an operator could not tell from the log when a worker was ready, nor what it had joined;
    the broker's address in particular appeared only in a debug line. Logged at INFO on the
    ``prism.lifecycle`` logger, which the worker's handlers show at the default (warning) level:
    topology, group, the source partitions this worker holds, broker and web address."""
    group = str(app.conf.id)
    topology = group.removeprefix("prism-")
    held: dict[str, list[int]] = {}
    with contextlib.suppress(Exception):  # no consumer yet: partitions unknown, the line still says the rest
        for tp in app.consumer.assignment():
            if not tp.topic.endswith("-changelog"):  # the tables' changelogs follow the source partitions
                held.setdefault(tp.topic, []).append(tp.partition)
    parts = ", ".join(f"{t}[{','.join(map(str, sorted(ps)))}]" for t, ps in sorted(held.items())) or "none yet"
    brokers = ",".join(f"{u.host}:{u.port}" for u in app.conf.broker)
    web = f"http://{app.conf.web_bind}:{app.conf.web_port}" if app.conf.web_enabled else "off"
    hot = "native" if native.ACTIVE else f"pure Python ({native.reason})"
    return (f"prism worker ready: topology {topology}, group {group}, partitions {parts}, broker {brokers}, "
            f"web {web}, pid {os.getpid()}, hot path {hot}")


def event_loop_name(loop: asyncio.AbstractEventLoop | None = None) -> str:
    """``"uvloop"`` or ``"asyncio"`` (or the loop class's top-level module): the loop that runs.

    Defaults to the running loop, else the app-level one ``asyncio.get_event_loop()`` returns."""
    if loop is None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = asyncio.get_event_loop_policy().get_event_loop()
    return type(loop).__module__.split(".", 1)[0]


def _write_ready_file(path: Path, app: faust.App) -> None:
    import gc

    info = {"pid": os.getpid(), "app_id": app.conf.id, "ready_at": time.time(),
            "loop": type(asyncio.get_event_loop()).__module__, "event_loop": event_loop_name(),
            "gc": {"threshold": list(gc.get_threshold()), "frozen": gc.get_freeze_count()},
            "native": native.status()}
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(info))
    tmp.replace(path)  # atomic: a reader never sees a half-written file


#: Allocations (net of frees) between young-generation collections; CPython's default is 700.
GC_GEN0_THRESHOLD = 100_000


def tune_gc() -> None:
    """Freeze what start-up allocated and collect the young generation less often.

    Measured in the worker (bench/bench_pipeline.py, BENCHMARKS.md): with CPython's defaults,
    ~750 collections per 20,000 messages took ~1.2 s - about 60 µs per message, mostly older
    generations re-walking the hundreds of thousands of long-lived objects a Faust app,
    aiokafka, RocksDB bindings and protobuf descriptors leave behind. `gc.freeze()` moves them to
    the permanent generation, never walked again; a higher young threshold suits a process whose
    per-message garbage is acyclic and freed by reference counting anyway. Cyclic garbage is
    still collected, just in larger, rarer batches. (Instagram's `gc.freeze` write-up and
    CPython's `gc` docs describe the same practice for long-running services.)

    Call it once the worker is fully started; it changes process-wide state, so it is not
    called for in-process workers (tests), only by :class:`PrismWorker` and the benchmarks.
    """
    import gc

    gc.collect()
    gc.freeze()
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(GC_GEN0_THRESHOLD, gen1, gen2)


def use_uvloop() -> bool:
    """Make new event loops uvloop loops when uvloop is installed. Call before any loop exists.

    Before any Faust app is built, too: the app (its producer, consumer, services) binds the loop
    that exists when it is constructed, and installing the policy afterwards changes nothing for
    it (measured: ``prism run`` ran on the stock asyncio loop that way). A loop created before
    this call belongs to the old policy and is not reused. Returns False when uvloop is not
    installed."""
    try:
        import uvloop
    except ImportError:
        return False
    if not isinstance(asyncio.get_event_loop_policy(), uvloop.EventLoopPolicy):
        # what mode.loop.use("uvloop") does, but every time: its import runs only once
        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    return True


def make_app(
    app_id: str,
    bootstrap: str | Sequence[str],
    data_dir: str | os.PathLike[str],
    *,
    web_port: int | None = None,
    partitions: int = 4,
    embedded: bool = False,
    settings: BrokerSettings | None = None,
    replication_factor: int | None = None,
    standby_replicas: int = 0,
    processing_guarantee: str = "at_least_once",
    fast_dispatch: bool = True,
    **overrides: Any,
) -> faust.App:
    """Build a tuned ``faust.App``.

    Args:
        app_id: Faust app id = consumer group id = prefix of changelog topics. Use a fresh one
            per test.
        bootstrap: ``host:port[,host:port]`` (or a list).
        data_dir: where RocksDB tables live (``<data_dir>/v1/tables/...``).
        web_port: enable Faust's web server on 127.0.0.1:``web_port``; ``None`` disables it.
        partitions: ``topic_partitions`` for topics Faust creates itself (changelogs follow their
            source topic: declare topics with ``ensure_topics`` first).
        embedded: the broker is the embedded Tansu one: installs the ListOffsets workaround.
        settings: SASL/SSL credentials for a real cluster.
        replication_factor: ``topic_replication_factor``, the replication factor of the topics
            Faust creates (table changelogs); default: ``settings.replication_factor``
            (``PRISM_REPLICATION_FACTOR``), else 1.
        standby_replicas: ``table_standby_replicas`` (0: one worker per group in tests and demo;
            standbys only help with several workers).
        processing_guarantee: ``at_least_once``; ``exactly_once`` needs Kafka transactions,
            which the embedded broker does not have (refused here, in one line). Faust itself stays
            ``at_least_once`` either way: Prism's batch path owns the transactions
            (app/worker/transactions.py), not Faust's TransactionManager.
        fast_dispatch: deliver fetched records to the conductor without four asyncio tasks per
            record (:mod:`app.worker.dispatch`); False keeps Faust's stock path (A/B benchmarks).
        **overrides: any other Faust setting; wins over the tuned defaults.
    """
    servers = [s for s in (bootstrap.split(",") if isinstance(bootstrap, str) else bootstrap) if s.strip()]
    if not servers:
        raise ConfigError("no Kafka bootstrap servers given", hint="pass host:port of the broker")
    from app.worker.transactions import AT_LEAST_ONCE, check_guarantee, refusal

    if check_guarantee(processing_guarantee) != AT_LEAST_ONCE and embedded:
        raise ConfigError(refusal("the embedded broker has none"), path="processing_guarantee")
    if not 1 <= partitions <= 10_000:
        raise ConfigError(f"topic_partitions={partitions} is out of range", hint="use 1..10000")
    datadir = Path(data_dir)
    datadir.mkdir(parents=True, exist_ok=True)
    conf: dict[str, Any] = dict(TUNED_SETTINGS)
    conf.update(
        broker=[f"kafka://{s.strip().removeprefix('kafka://')}" for s in servers],
        broker_credentials=settings.faust_credentials() if settings is not None else None,
        datadir=str(datadir),
        store="rocksdb://",
        topic_partitions=partitions,
        topic_replication_factor=replication_factor if replication_factor is not None
        else settings.replication_factor if settings is not None else 1,
        table_standby_replicas=standby_replicas,
        processing_guarantee="at_least_once",  # also under exactly_once: see the docstring
        web_enabled=web_port is not None,
        web_port=web_port if web_port is not None else 6066,
        web_bind="127.0.0.1",
        web_host="127.0.0.1",
        Worker=PrismWorker,
        # Recovery that rebuilds a partition whose local store is ahead of its changelog instead
        # of dying with ConsistencyError (app/tables/recovery.py): every broker, not only embedded.
        TableManager=_table_manager(),
    )
    conf.update(overrides)
    # Faust warns (AlreadyConfiguredWarning) whenever a setting is applied again with the value it
    # already has - the worker command does it on every start (web_enabled, web_port); noise an
    # operator can do nothing about, filtered where the app is built.
    warnings.filterwarnings("ignore", category=AlreadyConfiguredWarning)
    app = faust.App(app_id, **conf)
    if embedded:
        install_listoffsets_workaround(app)  # includes the offsets probe
    else:
        install_offsets_probe(app)  # the recovery's offset queries off the long-poll connection
    if fast_dispatch:
        install_fast_dispatch(app.consumer)  # after the workaround: it replaces the consumer's transport
    bound_shutdown(app)  # SIGTERM's drain bounds the producer's and the consumer thread's stop
    return app


def _table_manager() -> type:
    from app.tables.recovery import PrismTableManager

    return PrismTableManager  # type: ignore[no-any-return]


# --------------------------------------------------------------------------- in-process


class _InProcessFaustWorker(PrismWorker):
    """A worker that leaves the host process alone: no signal handlers, no logging takeover."""

    def install_signal_handlers(self) -> None:
        return None

    async def on_startup_finished(self) -> None:  # no ready file / spinner in-process
        return None


class InProcessWorker:
    """Run a Faust app inside the current event loop with an explicit lifecycle (for tests).

    ``await start()`` returns once the app is fully started: partitions assigned, table recovery
    complete, agents running. ``await stop()`` stops it cleanly (commits offsets, flushes the
    producer, closes RocksDB). A Faust app cannot be started twice: build a new one to restart.
    """

    def __init__(self, app: faust.App) -> None:
        self.app = app
        self._worker: _InProcessFaustWorker | None = None

    async def start(self, timeout: float = 60.0) -> None:
        if self._worker is not None:
            raise RuntimeError("this worker was already started; build a new app to restart")
        self._worker = _InProcessFaustWorker(
            self.app, loop=asyncio.get_running_loop(), quiet=True, override_logging=False,
            redirect_stdouts=False, daemon=False)
        self._worker.spinner = None
        try:
            await asyncio.wait_for(self._worker.start(), timeout)
        except BaseException:
            await self.stop()
            raise

    async def stop(self, timeout: float = 30.0) -> None:
        worker = self._worker
        if worker is None or worker.should_stop:
            return
        await asyncio.wait_for(worker.stop(), timeout)

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.stop()


# --------------------------------------------------------------------------- subprocess


def load_app(target: str) -> faust.App:
    """Import ``package.module:attr``; ``attr`` is a ``faust.App`` or a factory returning one."""
    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise ConfigError(f"worker target {target!r} is not of the form package.module:attr")
    obj: Any = getattr(importlib.import_module(module_name), attr)
    if not isinstance(obj, faust.App) and callable(obj):
        obj = obj()
    if not isinstance(obj, faust.App):
        raise ConfigError(f"worker target {target!r} is a {type(obj).__name__}, not a faust.App")
    return obj


#: Our level names -> the Faust CLI's.
_FAUST_LEVELS = {"critical": "crit", "crit": "crit", "error": "error", "warning": "warn", "warn": "warn",
                 "info": "info", "debug": "debug"}


def check_loglevel(loglevel: str) -> str:
    """The Faust CLI's name for `loglevel`; a ConfigError for an unknown one (checked with the
    other start-up settings, not after the broker and the topics)."""
    level = _FAUST_LEVELS.get(loglevel.lower())
    if level is None:
        raise ConfigError(f"unknown log level {loglevel!r}", path="--loglevel",
                          hint=f"use one of {', '.join(_FAUST_LEVELS)}")
    return level


def run_worker(app: faust.App, *, loglevel: str = "warning", uvloop: bool = True) -> NoReturn:
    """Run ``app`` as a Faust worker in this process (blocks; exits the process when stopped).

    This is what ``faust -A app worker -l warning`` does, plus uvloop. SIGTERM and SIGINT stop the
    worker cleanly (offsets committed, RocksDB closed).
    """
    level = check_loglevel(loglevel)
    if uvloop:
        use_uvloop()
        bound = getattr(app, "_loop", None)
        if bound is not None and event_loop_name(bound) != "uvloop":
            log.warning("the Faust app was built on a %s loop before uvloop was installed: it keeps that loop; "
                        "call use_uvloop() before building the app", event_loop_name(bound))
    # The worker command re-applies --with/--without-web and --web-port to already-used settings
    # (a harmless, same-value AlreadyConfiguredWarning each; make_app filters them too).
    warnings.filterwarnings("ignore", category=AlreadyConfiguredWarning)
    argv = [sys.argv[0] or "prism-worker", "worker", "--loglevel", level]
    if not app.conf.web_enabled:
        argv.append("--without-web")
    else:
        argv += ["--web-port", str(app.conf.web_port), "--web-bind", app.conf.web_bind]
    sys.argv = argv
    app.main()


def main(argv: Sequence[str] | None = None) -> NoReturn:
    """``python -m app.worker.faust_app package.module:attr [--loglevel LEVEL] [--no-uvloop]``."""
    parser = argparse.ArgumentParser(prog="python -m app.worker.faust_app",
                                     description="Run a Faust app (or app factory) as a Prism worker.")
    parser.add_argument("target", help="package.module:attr of a faust.App or a factory returning one")
    parser.add_argument("--loglevel", default="warning")
    parser.add_argument("--no-uvloop", action="store_true")
    args = parser.parse_args(argv)
    if not args.no_uvloop:
        use_uvloop()  # before the app exists: it binds the loop it is built on
    try:
        app = load_app(args.target)
    except PrismError as exc:  # configuration, and the broker preflight (auth, TLS, ACLs)
        print(f"error [{exc.code}] {exc}", file=sys.stderr)
        raise SystemExit(2) from exc
    run_worker(app, loglevel=args.loglevel, uvloop=not args.no_uvloop)


class WorkerProcess:
    """A Faust worker in a child process (``python -m app.worker.faust_app TARGET``).

    Args:
        target: ``package.module:attr`` of the app (or app factory) to run.
        log_path: file that receives the child's stdout and stderr.
        ready_file: file the worker writes when fully started (default: next to ``log_path``).
        env: extra environment for the child (how a factory receives its configuration).
        cwd: working directory (default: the current one, so that ``target`` imports resolve).
    """

    def __init__(
        self,
        target: str,
        *,
        log_path: str | os.PathLike[str],
        ready_file: str | os.PathLike[str] | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        loglevel: str = "warning",
        python: str = sys.executable,
    ) -> None:
        self.target = target
        self.log_path = Path(log_path)
        self.ready_file = Path(ready_file) if ready_file else self.log_path.with_suffix(".ready")
        self.env = dict(env or {})
        self.cwd = Path(cwd) if cwd else Path.cwd()
        self.loglevel = loglevel
        self.python = python
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    @property
    def returncode(self) -> int | None:
        return self._proc.poll() if self._proc else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self, *, wait: bool = True, timeout: float = 60.0) -> Self:
        if self.running:
            raise RuntimeError("worker process already running")
        self.ready_file.unlink(missing_ok=True)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        env = {**os.environ, **self.env, READY_FILE_ENV: str(self.ready_file), "PYTHONUNBUFFERED": "1"}
        # Parent-death signal: if the process that started the worker dies (even by SIGKILL),
        # the worker gets SIGTERM and shuts down cleanly instead of running on as an orphan.
        cmd = with_parent_death_signal(
            [self.python, "-m", "app.worker.faust_app", self.target, "--loglevel", self.loglevel])
        self._proc = subprocess.Popen(cmd, cwd=self.cwd, env=env, stdin=subprocess.DEVNULL,
                                      stdout=self._log, stderr=subprocess.STDOUT)
        if wait:
            try:
                self.wait_ready(timeout)
            except BaseException:
                self.stop()
                raise
        return self

    def wait_ready(self, timeout: float = 60.0) -> dict[str, Any]:
        """Block until the ready file appears; fail early (with the log tail) if the child exits."""
        deadline = time.monotonic() + timeout
        delay = 0.02
        while True:
            if self.ready_file.exists():
                return dict(json.loads(self.ready_file.read_text()))
            code = self.returncode
            if code is not None:
                raise RuntimeError(f"worker {self.target} exited with status {code} before it was ready; "
                                   f"log tail:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"worker {self.target} not ready after {timeout:g}s; log tail:\n"
                                   f"{self.log_tail()}")
            time.sleep(delay)  # polling interval
            delay = min(delay * 2, 0.2)

    def diagnose(self, timeout: float = 5.0, limit: int = 20_000) -> str:
        """Ask a running worker where it waits (SIGUSR1: consumer snapshot and every task's
        await chain, see :mod:`app.worker.diagnose`) and return what it wrote."""
        proc = self._proc
        if proc is None or proc.poll() is not None:
            return f"(worker not running, exit status {self.returncode})\n{self.log_tail(limit)}"
        before = self.log_path.stat().st_size if self.log_path.exists() else 0
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGUSR1)
        deadline = time.monotonic() + timeout
        text = ""
        while time.monotonic() < deadline and "prism diagnosis end" not in text:
            time.sleep(0.1)  # polling interval
            with open(self.log_path, "rb") as f:
                f.seek(before)
                text = f.read().decode("utf-8", "replace")
        return text[-limit:] if "prism diagnosis end" in text else \
            f"(no diagnosis within {timeout:g}s: is its event loop blocked?)\n{self.log_tail(limit)}"

    def log_tail(self, limit: int = 4000) -> str:
        if not self.log_path.exists():
            return ""
        return self.log_path.read_bytes()[-limit:].decode("utf-8", "replace")

    def stop(self, timeout: float = 30.0) -> int | None:
        """SIGTERM (clean Faust shutdown), SIGKILL after ``timeout``. Returns the exit status."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                log.warning("worker pid %s did not stop within %.0fs; killing it", proc.pid, timeout)
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                proc.wait()
        if self._log is not None:
            self._log.close()
            self._log = None
        return proc.returncode if proc is not None else None

    def kill(self) -> None:
        """SIGKILL, as in a crash: no commit, no flush."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()
        self.stop()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


if __name__ == "__main__":
    main()

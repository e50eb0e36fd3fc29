"""One deadline for the whole shutdown: SIGTERM ends the worker within `SHUTDOWN_DRAIN_S`.

Why: with the broker unreachable, waits that are harmless while running block a stop for
minutes. Found by SIGTERMing a worker whose broker was killed
(tests/worker/test_shutdown_dead_broker_e2e.py):

* Faust's producer flush on stop (before the last offset commit, and in the producer's own
  stop) waits for every queued record, for up to `producer_request_timeout` - 1200 s;
* the consumer thread's stop waits for its thread to finish (mode's `shutdown_timeout`, 60 s)
  while aiokafka's consumer leaves a group whose coordinator is gone;
* the pipeline's retry loops for the dedup-changelog flush and the skipped-record fetch
  retried until the broker answered (these are bounded in app/worker/worker_state.py with the
  batches' own drain, `WRITE_DRAIN_S`, and the batch is abandoned unacknowledged).

The drain time is the one docs/operations.md gives for SIGTERM ("SIGTERM in every state"):
`WRITE_DRAIN_S`, 20 s, inside the 60 s the supervisor allows a child and the 120 s grace of
deploy/. `begin()` starts the clock at SIGTERM; every bounded wait gets what is left of it; what
is abandoned is named in a `shutdown: abandoned ...` WARNING line. Nothing abandoned is lost:
unacknowledged messages and uncommitted offsets are read again on restart (at-least-once), and a
dedup id whose changelog record was not flushed can at worst let one redelivery through.

Last resort: a watchdog thread (it runs even if the event loop is blocked) ends the process
`HARD_EXIT_GRACE_S` after the deadline, logging what was still pending. RocksDB is then not
closed cleanly, which it survives like a kill -9 (tests/worker/test_crash_e2e.py).
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

__all__ = ["HARD_EXIT_GRACE_S", "LOOP_SETTLE_S", "SHUTDOWN_DRAIN_S", "ShutdownClock", "clock", "install", "settle_loop"]

log = logging.getLogger("prism.worker")

#: SIGTERM's drain time (docs/operations.md "SIGTERM in every state"; = worker_state.WRITE_DRAIN_S).
SHUTDOWN_DRAIN_S = 20.0
#: After the deadline, how long the orderly stop may still take before the watchdog ends it.
HARD_EXIT_GRACE_S = 4.0
#: The longest the last step of a worker process's stop waits for the event loop to go idle before
#: closing it: mode's own fixed wait there (`Worker._sentinel_task`, `asyncio.sleep(1.0)`).
LOOP_SETTLE_S = 1.0
#: Loop iterations run after the last task is gone: callbacks the stop's last steps scheduled
#: (a closed transport's `connection_lost` is one `call_soon` away) run before the loop closes.
_SETTLE_ROUNDS = 3
#: `ShutdownClock.race`'s answer when the deadline passed first
_OVERRUN = object()


class ShutdownClock:
    """When the shutdown began and how much of its drain time is left (module docs)."""

    def __init__(self, drain_s: float = SHUTDOWN_DRAIN_S) -> None:
        self.drain_s = drain_s
        self.started: float | None = None
        self._pending: list[Callable[[], str | None]] = []
        self._on_begin: list[Callable[[], None]] = []
        self._lock = threading.Lock()

    @property
    def begun(self) -> bool:
        return self.started is not None

    def remaining(self) -> float:
        """Seconds left of the drain (the full drain before shutdown began), never below 0."""
        if self.started is None:
            return self.drain_s
        return max(0.0, self.started + self.drain_s - time.monotonic())

    def pending(self, describe: Callable[[], str | None]) -> None:
        """Register what the watchdog's last line lists if the stop overruns (None: nothing)."""
        self._pending.append(describe)

    async def race(self, aw: Any) -> Any:
        """Await `aw`; once the shutdown began, no longer than its deadline: then `_OVERRUN`
        (`aw` keeps running, abandoned). Unbounded while the worker runs."""
        task = asyncio.ensure_future(aw)
        try:
            while True:
                wait = 0.5 if self.started is None else min(0.5, max(0.01, self.remaining()))
                done, _ = await asyncio.wait({task}, timeout=wait)
                if done:
                    return task.result()
                if self.started is not None and self.remaining() <= 0:
                    return _OVERRUN
        except asyncio.CancelledError:
            task.cancel()
            raise

    def on_begin(self, callback: Callable[[], None]) -> None:
        self._on_begin.append(callback)

    def begin(self) -> None:
        """Start the drain (once): bound the waits that know the clock, arm the watchdog."""
        with self._lock:
            if self.started is not None:
                return
            self.started = time.monotonic()
        for cb in self._on_begin:
            try:
                cb()
            except Exception:  # a bound that cannot be set must not stop the shutdown
                log.exception("shutdown: could not bound a wait")
        threading.Thread(target=self._watchdog, name="prism-shutdown-watchdog", daemon=True).start()

    def _watchdog(self) -> None:
        time.sleep(self.remaining() + HARD_EXIT_GRACE_S)
        still = []
        for describe in self._pending:
            try:
                what = describe()
            except Exception as exc:  # describing must never keep the process alive
                what = f"(could not describe: {exc!r})"
            if what:
                still.append(what)
        log.warning("shutdown: abandoned the orderly stop %.0f s after SIGTERM (drain %.0f s): %s; the process exits "
                    "now - unacknowledged messages and uncommitted offsets are read again on restart",
                    self.drain_s + HARD_EXIT_GRACE_S, self.drain_s, "; ".join(still) or "a stop step did not return",
                    extra={"event": "shutdown_abandoned"})
        for h in logging.getLogger().handlers:
            try:
                h.flush()
            except Exception:  # a broken handler must not keep the process alive
                continue
        sys.stderr.flush()
        os._exit(0)


#: The process's clock: a worker process runs one Faust app.
clock = ShutdownClock()


def install(app: Any, shutdown: ShutdownClock | None = None) -> ShutdownClock:
    """Bound `app`'s stop-time waits by `shutdown`'s drain (module docs): Faust's producer flush
    and stop, and the consumer thread's stop. Call once the app is built; `begin()` (at SIGTERM,
    `PrismWorker`) arms the bounds."""
    sc = shutdown or clock
    producer = app.producer
    flush = producer.flush

    async def bounded_flush() -> None:
        # A flush that began before SIGTERM (the periodic commit's) is bounded too: the stop waits for it.
        if await sc.race(flush()) is _OVERRUN:
            _abandon_queued(producer, "flushing the producer before an offset commit", stop_sender=False)

    producer.flush = bounded_flush
    consumer = app.consumer
    commit = consumer._commit

    async def bounded_commit(offsets: Any) -> bool:
        result = await sc.race(commit(offsets))
        if result is _OVERRUN:
            log.warning("shutdown: abandoned the offset commit after the %.0f s drain (the broker did not answer): "
                        "%d partition(s) keep their last committed offset and are read again from there on restart",
                        sc.drain_s, len(offsets), extra={"event": "shutdown_abandoned"})
            return False
        return bool(result)

    consumer._commit = bounded_commit
    on_stop = producer.on_stop

    async def bounded_on_stop() -> None:
        inner = getattr(producer, "_producer", None)
        if sc.begun and inner is not None:
            try:
                await asyncio.wait_for(asyncio.shield(inner._message_accumulator.flush()), max(0.01, sc.remaining()))
            except TimeoutError:
                _abandon_queued(producer, "the producer's flush on stop", stop_sender=True)
        await on_stop()

    producer.on_stop = bounded_on_stop

    def bound_consumer_thread() -> None:
        thread = getattr(app.consumer, "_thread", None)
        if thread is None:
            return
        stop = thread.stop

        async def bounded_stop() -> None:
            # mode waits `shutdown_timeout` (60 s) for the thread to end: what is left of the drain
            budget = max(1.0, sc.remaining())
            thread.shutdown_timeout = budget
            try:
                await stop()
            except TimeoutError:
                # Named like every other abandoned step (a bare TimeoutError traceback said nothing):
                # the thread is a daemon, the process exits without it.
                log.warning("shutdown: abandoned the consumer thread's stop after %.1f s (the group coordinator "
                            "did not answer the leave-group): uncommitted offsets are read again on restart",
                            budget, extra={"event": "shutdown_abandoned"})

        thread.stop = bounded_stop

    sc.on_begin(bound_consumer_thread)
    sc.pending(lambda: _queued_text(producer))
    sc.pending(lambda: _unacked_text(app))
    sc.pending(lambda: _stop_steps(app))
    return sc


def _unacked_text(app: Any) -> str | None:
    n = len(getattr(app.consumer, "_unacked_messages", ()) or ())
    return f"{n} message(s) not acknowledged (their offsets are not committed)" if n else None


def _stop_steps(app: Any) -> str | None:
    """Where the stop waits: the innermost awaits of the tasks that are stopping a service."""
    from app.worker.diagnose import task_stacks

    loop = getattr(app, "_loop", None) or getattr(app, "loop", None)
    try:
        stacks = task_stacks(loop)
    except Exception:  # read from another thread while the loop runs: best effort
        return None
    steps = []
    for line in stacks:
        _, _, chain = line.partition(": ")
        frames = chain.split(" -> ")
        if any(f.startswith(("stop (", "_stop_children", "on_stop", "_default_stop_children")) for f in frames):
            steps.append(" -> ".join(frames[-3:]))
    uniq = list(dict.fromkeys(steps))
    return ("the stop was waiting in " + " | ".join(uniq[:3])) if uniq else None


def _queued(producer: Any) -> int:
    inner = getattr(producer, "_producer", None)
    acc = getattr(inner, "_message_accumulator", None)
    if acc is None:
        return 0
    batches = [b for bs in list(acc._batches.values()) for b in bs] + list(acc._pending_batches)
    return sum(int(b.record_count() if callable(b.record_count) else b.record_count) for b in batches)


def _queued_text(producer: Any) -> str | None:
    n = _queued(producer)
    return f"{n} record(s) still queued in the producer" if n else None


def _abandon_queued(producer: Any, what: str, *, stop_sender: bool) -> None:
    """Leave the producer's queued records unwritten. `stop_sender`: end its sender task, which
    is what aiokafka's stop waits for besides the queue, so the stop goes on to close the client.
    The batches are not failed: failing them would raise in every task still awaiting one (Faust
    reports that as a crash), and nothing awaits them once the worker is gone."""
    inner = getattr(producer, "_producer", None)
    n = _queued(producer)
    sender = getattr(getattr(inner, "_sender", None), "sender_task", None)
    if stop_sender and sender is not None and not sender.done():
        sender.cancel()
    log.warning("shutdown: abandoned %s after the %.0f s drain: %d queued record(s) not written (the broker did not "
                "take them). Outputs belong to batches left unacknowledged, read again on restart; a table changelog "
                "record lost here can at worst let one redelivery through dedup", what, clock.drain_s, n,
                extra={"event": "shutdown_abandoned"})


async def settle_loop(bound: float = LOOP_SETTLE_S) -> float:
    """Wait until no other task is pending on the running loop, at most `bound` seconds; return
    the seconds waited. Tasks still pending at the bound are named in a WARNING (the loop is
    closed with them, as mode would).

    Why: the last step of mode's `Worker._shutdown_loop` (a worker process's stop, after every
    service stopped and `_gather_all` found no task left) was a fixed `asyncio.sleep(1.0)`
    (`_sentinel_task`) before the loop closed - 1.0 s of every SIGTERM, restart and test stop.
    Traced at that point (asyncio loop, idle and mid-stream stops, web server on): no task, no
    ready callback, no timer was left; the offsets are committed and the producer flushed before
    (the services' stop). So the wait is a condition, not a sleep: whatever is still pending
    keeps mode's full second; a quiet loop closes after a few iterations
    (docs/testing.md, "One worker stop")."""
    loop = asyncio.get_running_loop()
    me = asyncio.current_task()
    started = loop.time()
    deadline = started + bound
    while True:
        for _ in range(_SETTLE_ROUNDS):
            await asyncio.sleep(0)
        others = {t for t in asyncio.all_tasks(loop) if t is not me and not t.done()}
        left = deadline - loop.time()
        if not others:
            return loop.time() - started
        if left <= 0:
            names = ", ".join(sorted(_task_name(t) for t in others))
            log.warning("shutdown: %d task(s) still pending %.1f s after the stop, closed with the event loop: %s",
                        len(others), bound, names, extra={"event": "shutdown_tasks_pending"})
            return loop.time() - started
        await asyncio.wait(others, timeout=left)


def _task_name(task: asyncio.Task[Any]) -> str:
    coro = task.get_coro()
    what = getattr(coro, "__qualname__", None) or repr(coro)
    return f"{task.get_name()} ({what})"

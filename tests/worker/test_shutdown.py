"""Unit tests of app/worker/shutdown.py without a broker: every bounded wait that gives up says so."""

from __future__ import annotations

import asyncio
import logging
import time
from types import SimpleNamespace
from typing import Any

import pytest

from app.worker import shutdown
from app.worker.shutdown import ShutdownClock


class _Thread:
    """Stands in for Faust's consumer thread: its stop times out the way mode's does when the
    group coordinator never answers the leave-group."""

    def __init__(self) -> None:
        self.shutdown_timeout = 60.0

    async def stop(self) -> None:
        raise TimeoutError()


def _app(thread: Any) -> Any:
    async def flush() -> None:
        return None

    async def commit(offsets: Any) -> bool:
        return True

    async def on_stop() -> None:
        return None

    producer = SimpleNamespace(flush=flush, on_stop=on_stop, _producer=None)
    consumer = SimpleNamespace(_commit=commit, _thread=thread, _unacked_messages=set())
    return SimpleNamespace(producer=producer, consumer=consumer, loop=None)


async def test_a_consumer_thread_stop_that_times_out_is_named_not_raised(caplog: pytest.LogCaptureFixture,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    clock = ShutdownClock(drain_s=5.0)
    monkeypatch.setattr(ShutdownClock, "_watchdog", lambda self: None)  # no os._exit in a test
    thread = _Thread()
    app = _app(thread)
    shutdown.install(app, clock)
    clock.begin()
    with caplog.at_level(logging.WARNING, logger="prism.worker"):
        await thread.stop()  # the bounded stop: must not raise
    assert 1.0 <= thread.shutdown_timeout <= 5.0
    lines = [r.getMessage() for r in caplog.records if getattr(r, "event", "") == "shutdown_abandoned"]
    assert len(lines) == 1 and "consumer thread's stop" in lines[0], lines


async def test_the_race_gives_up_at_the_deadline_and_leaves_the_wait_running() -> None:
    clock = ShutdownClock(drain_s=0.2)
    clock.started = time.monotonic()
    never = asyncio.get_running_loop().create_future()
    assert await clock.race(never) is shutdown._OVERRUN
    assert not never.done()
    never.cancel()


# --------------------------------------------------------------------------- settle_loop
# The last step of a worker process's stop (PrismWorker._sentinel_task; mode's fixed 1 s sleep before).
# Run as mode runs it: `loop.run_until_complete` on a loop where nothing else awaits the settle.


def _on_fresh_loop(setup: Any, bound: float) -> tuple[float, float, set[str]]:
    """Run `setup(loop)`, then `settle_loop(bound)` as mode's `_shutdown_loop` runs its sentinel;
    returns (seconds the settle reported, wall seconds, names of the tasks still pending then)."""
    loop = asyncio.new_event_loop()
    try:
        setup(loop)
        t0 = time.monotonic()
        waited = loop.run_until_complete(shutdown.settle_loop(bound))
        return waited, time.monotonic() - t0, {t.get_name() for t in asyncio.all_tasks(loop)}
    finally:
        for task in asyncio.all_tasks(loop):
            task.cancel()
        loop.run_until_complete(asyncio.sleep(0))
        loop.close()


def test_settle_loop_returns_at_once_when_nothing_is_pending() -> None:
    # bound 30 s: returning well inside it proves it waited for no timer, only a few iterations
    waited, wall, pending = _on_fresh_loop(lambda loop: None, 30.0)
    assert waited < 10.0 and wall < 10.0 and not pending


def test_settle_loop_runs_the_callbacks_the_stop_scheduled() -> None:
    ran: list[str] = []

    def setup(loop: asyncio.AbstractEventLoop) -> None:  # two hops, like a closed transport's connection_lost
        loop.call_soon(lambda: loop.call_soon(lambda: ran.append("connection_lost")))

    _on_fresh_loop(setup, 30.0)
    assert ran == ["connection_lost"]


def test_settle_loop_waits_for_a_pending_task_and_the_tasks_it_starts() -> None:
    finished: list[str] = []
    tasks: list[asyncio.Task[None]] = []

    async def child(release: asyncio.Event) -> None:
        await release.wait()
        finished.append("child")

    async def parent() -> None:
        release = asyncio.Event()
        for _ in range(5):
            await asyncio.sleep(0.01)
        asyncio.get_running_loop().create_task(child(release))  # started while the settle waits
        finished.append("parent")
        for _ in range(5):
            await asyncio.sleep(0.01)
        release.set()

    _, wall, pending = _on_fresh_loop(lambda loop: tasks.append(loop.create_task(parent())), 30.0)
    assert tasks[0].done() and finished == ["parent", "child"] and not pending and wall < 20.0


def test_settle_loop_names_a_task_that_outlives_the_bound(caplog: pytest.LogCaptureFixture) -> None:
    async def stuck_fetch(never: asyncio.Future[None]) -> None:
        await never

    def setup(loop: asyncio.AbstractEventLoop) -> None:
        loop.create_task(stuck_fetch(loop.create_future()), name="stuck")

    with caplog.at_level(logging.WARNING, logger="prism.worker"):
        waited, _, pending = _on_fresh_loop(setup, 0.2)
    assert waited >= 0.2 and pending == {"stuck"}  # mode closes the loop with it next (here: cancelled)
    lines = [r.getMessage() for r in caplog.records if getattr(r, "event", "") == "shutdown_tasks_pending"]
    assert len(lines) == 1 and "stuck (" in lines[0] and "stuck_fetch" in lines[0], lines

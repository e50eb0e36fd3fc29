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

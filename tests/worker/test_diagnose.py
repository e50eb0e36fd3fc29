"""The stall snapshot (`kill -USR1`) must never fail, whatever state the worker is in; its
content on a live worker is checked in test_sigterm_e2e (a real subprocess and signal)."""

from __future__ import annotations

import json
from pathlib import Path

from app.worker.diagnose import consumer_snapshot
from app.worker.faust_app import make_app


def test_snapshot_of_an_app_that_never_started(tmp_path: Path) -> None:
    app = make_app("t-diagnose", "127.0.0.1:1", tmp_path, embedded=True)
    snap = consumer_snapshot(app)
    json.dumps(snap)  # what the signal handler writes: plain JSON
    assert snap["rebalancing"] is False
    assert snap["batch_sources"] == []
    assert snap["consumer"] is None or isinstance(snap["consumer"], dict)


def test_snapshot_reports_what_it_cannot_read_instead_of_raising() -> None:
    class Broken:
        consumer_generation_id = 7

        def __getattr__(self, name: str):
            raise RuntimeError(f"no {name} here")

    snap = consumer_snapshot(Broken())
    assert snap["generation"] == 7
    assert snap["flow_control_active"].startswith("<unavailable: RuntimeError: no flow_control here")
    assert snap["consumer"] is None and snap["batch_sources"] == []


async def test_task_stacks_name_code_locations_not_local_values() -> None:
    """What kill -USR1 prints must not leak what a task holds: a token in a local variable of a
    suspended coroutine appears nowhere, its await chain does (function, file, line)."""
    import asyncio

    from app.worker.diagnose import task_stacks

    release = asyncio.Event()

    async def holds_a_secret() -> None:
        token = "eyJhbGciOiJFZERTQSJ9.secret-token"  # the value that must not appear
        await release.wait()
        assert token

    task = asyncio.create_task(holds_a_secret(), name="secret-holder")
    await asyncio.sleep(0)
    lines = task_stacks()
    release.set()
    await task
    mine = next(line for line in lines if line.startswith("secret-holder: "))
    assert "holds_a_secret (" in mine and "test_diagnose.py:" in mine and "wait (" in mine, mine
    assert not any("secret-token" in line for line in lines)


async def test_worker_task_stacks_include_the_consumer_threads_loop() -> None:
    """A commit stuck in Faust's consumer thread shows only ``call_thread`` on the worker's loop;
    the dump must also list the thread loop's tasks (where the commit really waits)."""
    import asyncio
    import threading
    from types import SimpleNamespace

    from app.worker.diagnose import worker_task_stacks

    thread_loop = asyncio.new_event_loop()
    started, gate = threading.Event(), None

    def run() -> None:
        nonlocal gate
        asyncio.set_event_loop(thread_loop)
        gate = asyncio.Event()

        async def stuck_commit() -> None:
            started.set()
            await gate.wait()

        thread_loop.run_until_complete(stuck_commit())

    t = threading.Thread(target=run, daemon=True)
    t.start()
    assert started.wait(10)
    app = SimpleNamespace(_consumer=SimpleNamespace(_thread=SimpleNamespace(thread_loop=thread_loop)))
    lines = worker_task_stacks(app)
    thread_loop.call_soon_threadsafe(gate.set)
    t.join(10)
    thread_loop.close()
    mine = [line for line in lines if line.startswith("[consumer thread] ")]
    assert any("stuck_commit (" in line and "wait (" in line for line in mine), lines
    # no consumer (a worker not yet started): the worker's own loop only, no error
    assert not any(line.startswith("[consumer") for line in worker_task_stacks(SimpleNamespace()))

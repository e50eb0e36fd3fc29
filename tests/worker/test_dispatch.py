"""`app.worker.dispatch`: the consumer's `wait_first` runs a record's delivery inline when it
does not wait, and otherwise behaves as Faust's (mode's) original - raced against the
suspend-flow event, abandoned with `CancelledError` where it waits."""

from __future__ import annotations

import asyncio
import contextvars

from mode import Service

from app.worker.dispatch import fast_dispatch_installed, install_fast_dispatch
from app.worker.faust_app import make_app

VAR: contextvars.ContextVar[str] = contextvars.ContextVar("VAR", default="outside")


class Consumer(Service):
    """A mode service standing in for Faust's consumer (its `wait_first` is mode's)."""


async def _service() -> Consumer:
    c = Consumer()
    await c.start()
    install_fast_dispatch(c)
    return c


async def test_a_delivery_that_does_not_wait_runs_inline_without_tasks() -> None:
    c = await _service()
    suspend = asyncio.Event()
    log: list[str] = []

    async def deliver() -> str:
        VAR.set("inside")  # stays in the delivery's own context, as in a task
        log.append("delivered")
        return "ok"

    before = len(asyncio.all_tasks())
    res = await c.wait_first(deliver(), suspend.wait())
    assert log == ["delivered"] and res.results == ["ok"] and not res.stopped
    assert len(asyncio.all_tasks()) == before  # nothing left running, nothing spawned
    assert VAR.get() == "outside"
    await c.stop()


async def test_a_delivery_that_waits_finishes_under_the_original() -> None:
    c = await _service()
    gate: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    log: list[object] = []

    async def deliver() -> None:
        log.append("started")
        log.append(await gate)  # suspends here
        await asyncio.sleep(0)   # and a bare yield
        log.append("done")

    asyncio.get_running_loop().call_later(0.01, gate.set_result, 42)
    await c.wait_first(deliver(), asyncio.Event().wait())
    assert log == ["started", 42, "done"]
    await c.stop()


async def test_a_waiting_delivery_is_abandoned_when_the_flow_is_suspended() -> None:
    c = await _service()
    suspend = asyncio.Event()
    never: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    log: list[str] = []

    async def deliver() -> None:
        try:
            await never
        except asyncio.CancelledError:
            log.append("cancelled where it waited")
            raise

    asyncio.get_running_loop().call_later(0.01, suspend.set)
    res = await c.wait_first(deliver(), suspend.wait())
    for _ in range(5):  # mode cancels the losers and returns; they unwind on the next turns
        await asyncio.sleep(0)
    assert log == ["cancelled where it waited"] and never.cancelled()
    assert res.results == [True]  # the suspend event won, as with mode's own wait_first
    await c.stop()


async def test_errors_reach_the_caller_both_ways() -> None:
    c = await _service()
    gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    async def fails_at_once() -> None:
        raise ValueError("bad record")

    async def fails_later() -> None:
        await gate
        raise KeyError("later")

    try:
        await c.wait_first(fails_at_once(), asyncio.Event().wait())
        raise AssertionError("no error")
    except ValueError:
        pass
    asyncio.get_running_loop().call_later(0.01, gate.set_result, None)
    try:
        await c.wait_first(fails_later(), asyncio.Event().wait())
        raise AssertionError("no error")
    except KeyError:
        pass
    await c.stop()


async def test_other_calls_go_to_mode() -> None:
    c = await _service()
    ev = asyncio.Event()
    ev.set()
    res = await c.wait_first(ev.wait())  # one argument: the original path
    assert res.results == [True]
    await c.stop()


def test_every_app_built_by_make_app_has_it(tmp_path) -> None:
    app = make_app("t-dispatch", "127.0.0.1:1", tmp_path, embedded=True)
    assert fast_dispatch_installed(app.consumer)
    stock = make_app("t-dispatch-stock", "127.0.0.1:1", tmp_path / "s", fast_dispatch=False)
    assert not fast_dispatch_installed(stock.consumer)

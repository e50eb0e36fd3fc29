"""Hand fetched records to Faust's conductor without four asyncio tasks per record.

Faust's fetch loop (`Consumer._drain_messages`) delivers every record with

    await self.wait_first(callback(message), self.suspend_flow.wait())

so that a delivery stuck on flow control or a full stream buffer can be abandoned when a
rebalance suspends the flow. `mode`'s `wait_first` wraps each argument - and the service's own
`stopped` and `crashed` events - in a task, waits for the first, and cancels the rest: four
tasks and an `asyncio.wait` for every record, although the delivery almost never waits for
anything (the conductor's awaits complete at once while the flow is active and the buffer has
room).

:func:`install_fast_dispatch` gives the app's consumer a `wait_first` that first runs the
delivery coroutine one step inline, in a copy of the current context as a task would:

* it finished (the usual case): done, no task was created;
* it suspended on a future: the rest of it continues under the original `wait_first`, still
  raced against the suspend-flow event exactly as before (a rebalance can abandon it, with
  `CancelledError` thrown into it where it waits, as cancelling its task would).

Every other use of `wait_first` on the consumer goes to the original. Measured with the tuned
Faust passthrough (BENCHMARKS.md, "Release comparison").
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Coroutine
from types import CoroutineType
from typing import Any

__all__ = ["fast_dispatch_installed", "install_fast_dispatch"]


def install_fast_dispatch(consumer: Any) -> None:
    """Replace `consumer.wait_first` (an instance attribute; the class is untouched)."""
    if getattr(consumer, "_prism_fast_dispatch", False):
        return
    original = consumer.wait_first

    async def wait_first(*coros: Any, timeout: Any = None) -> Any:
        if timeout is None and len(coros) == 2 and type(coros[0]) is CoroutineType \
                and type(coros[1]) is CoroutineType:
            delivery, other = coros
            ctx = contextvars.copy_context()
            try:
                yielded = ctx.run(delivery.send, None)
            except StopIteration as stop:
                other.close()  # never started: nothing to cancel
                from mode.services import WaitResults

                return WaitResults([delivery], [stop.value], False)
            except BaseException:
                other.close()
                raise
            return await original(_resume(delivery, yielded, ctx), other)
        return await original(*coros, timeout=timeout)

    consumer.wait_first = wait_first
    consumer._prism_fast_dispatch = True


def fast_dispatch_installed(consumer: Any) -> bool:
    return bool(getattr(consumer, "_prism_fast_dispatch", False))


async def _resume(coro: Coroutine[Any, Any, Any], yielded: Any, ctx: contextvars.Context) -> Any:
    """Drive `coro` on from where it suspended (on `yielded`), as its task would have."""
    try:
        while True:
            if yielded is None:  # a bare yield (asyncio.sleep(0)): give the loop one turn
                await asyncio.sleep(0)
            else:
                yielded._asyncio_future_blocking = False
                await asyncio.wait([yielded])  # until done; its result or error reaches coro below
            yielded = ctx.run(coro.send, None)
    except StopIteration as stop:
        return stop.value
    except asyncio.CancelledError:
        # abandoned (the flow was suspended): what cancelling its task would have done
        if yielded is not None:
            yielded.cancel()
        try:
            ctx.run(coro.throw, asyncio.CancelledError())
        except (asyncio.CancelledError, StopIteration):
            pass
        else:
            coro.close()
        raise

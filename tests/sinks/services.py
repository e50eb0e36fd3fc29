"""Stopping and restarting the test run's own Redis, PostgreSQL and NATS, for outage tests.

The servers are the session's throwaway instances (`tests/servers.py`), never a developer's:
`outage(service)` stops the instance on entry and ALWAYS starts it again on exit (even when the
test failed) on the same port and data directory, then waits until it answers - polling, never
sleeping a fixed time - because later tests use the same instance.

Stop/start run in a thread, so the event loop (and the sink under test) keeps running through
the outage.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from tests import servers
from tests.support import require


def require_restartable(name: str) -> None:
    """The test stops and restarts `name`: only our own instance may be stopped."""
    srv = servers.server(name)
    require(srv is not None, f"{name}: the outage test stops the server, and {servers._ENV[name]} points the "
                             "tests at a server of your own; unset it to let the test run start its own")
    assert srv is not None
    require(srv.up(), f"{name} (the test run's own instance) is not answering")


@contextlib.asynccontextmanager
async def outage(name: str) -> AsyncIterator[None]:
    """Stop `name` (redis, postgres, nats); on exit start it again and wait until it answers."""
    srv = servers.server(name)
    assert srv is not None, "call require_restartable(name) first"
    try:
        await asyncio.to_thread(srv.stop)
        await asyncio.to_thread(servers.poll, lambda: not srv.up(), f"{name} down", 30)
        yield
    finally:
        if not srv.running:
            await asyncio.to_thread(srv.start)  # waits until it answers (NATS: JetStream too)

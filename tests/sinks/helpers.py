"""Driving a sink through an outage the way the runner's agent does: batch after batch,
each awaited before the next (so a batch that waits for its backend holds the stream)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence

from app.sinks.base import SinkRecord
from app.sinks.delivery import Delivery, DeliveryResult


class Feeder:
    """Feeds `records` to `delivery` in batches; `pause()`/`resume()` hold it between batches."""

    def __init__(self, delivery: Delivery, records: Sequence[SinkRecord], batch: int = 10,
                 gap_s: float = 0.005) -> None:
        self.delivery = delivery
        self.records = list(records)
        self.batch = batch
        self.gap_s = gap_s
        self.delivered = 0
        self.results: list[DeliveryResult] = []
        self._go = asyncio.Event()
        self._go.set()
        self._idle = asyncio.Event()
        self.task: asyncio.Task[None] | None = None

    def start(self) -> Feeder:
        self.task = asyncio.create_task(self._run())
        return self

    async def _run(self) -> None:
        for i in range(0, len(self.records), self.batch):
            if not self._go.is_set():
                self._idle.set()
                await self._go.wait()
                self._idle.clear()
            chunk = self.records[i : i + self.batch]
            self.results.append(await self.delivery.deliver(chunk))
            self.delivered += len(chunk)
            await asyncio.sleep(self.gap_s)
        self._idle.set()

    async def pause(self) -> None:
        """Return once no batch is in flight."""
        self._go.clear()
        await self._idle.wait()

    def resume(self) -> None:
        self._go.set()

    async def done(self, timeout: float = 60) -> None:
        assert self.task is not None
        await asyncio.wait_for(self.task, timeout)


async def wait_for(check: Callable[[], bool], what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)

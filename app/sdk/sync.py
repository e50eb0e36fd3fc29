"""`SyncPrismClient`: the blocking twin of `PrismClient` (like httpx's Client/AsyncClient).

It owns a private event loop running in a daemon thread and submits every call to it, so
it works from plain scripts, threads and frameworks that are not async, and also from code
that already runs inside *another* event loop (the calls block that thread, they do not
nest loops). One client is safe to share between threads: calls are serialised onto the
loop. Close it (or use `with`) to stop the thread.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Iterable, Iterator
from types import TracebackType
from typing import Any, Self, TypeVar

from ..envelope.model import Envelope
from ..errors import ConfigError
from .client import BatchItem, PrismClient, Subscription, UnreadableMessage
from .options import PrismPublishOptions
from .received import ReceivedEnvelope

T = TypeVar("T")


class _LoopThread:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="prism-sdk-loop", daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        if not self.thread.is_alive():
            coro.close()
            raise ConfigError("the SyncPrismClient is closed", hint="create a new client")
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self) -> None:
        if self.thread.is_alive():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join()
            self.loop.close()


class SyncReceivedEnvelope:
    """A `ReceivedEnvelope` whose `ack()`/`nack()` block; every other attribute is the async one's."""

    __slots__ = ("_loop", "received")

    def __init__(self, received: ReceivedEnvelope | UnreadableMessage, loop: _LoopThread) -> None:
        self.received = received
        self._loop = loop

    def ack(self) -> None:
        self._loop.run(self.received.ack())

    def nack(self) -> None:
        self._loop.run(self.received.nack())

    def payload_schema(self, *, subject: str | None = None) -> Any:
        """The referenced schema (blocking; see `ReceivedEnvelope.payload_schema`)."""
        return self._loop.run(self.received.payload_schema(subject=subject))  # type: ignore[union-attr]

    def decoded(self, *, subject: str | None = None) -> Any:
        """The payload decoded by its envelope's schema (blocking; see `ReceivedEnvelope.decoded`)."""
        return self._loop.run(self.received.decoded(subject=subject))  # type: ignore[union-attr]

    def __getattr__(self, name: str) -> Any:
        return getattr(self.received, name)

    def __repr__(self) -> str:
        return f"Sync{self.received!r}"


def _sync_errors(loop: _LoopThread, exc: BaseException) -> BaseException:
    delivery = getattr(exc, "delivery", None)
    if delivery is not None:
        exc.delivery = SyncReceivedEnvelope(delivery, loop)  # type: ignore[attr-defined]
    return exc


class SyncSubscription:
    """Iterate it (`for msg in sub`); see `PrismClient.subscribe`."""

    def __init__(self, sub: Subscription, loop: _LoopThread) -> None:
        self._sub = sub
        self._loop = loop

    @property
    def stats(self) -> dict[str, int]:
        return self._sub.stats

    def receive(self, timeout: float | None = None) -> SyncReceivedEnvelope | None:
        try:
            msg = self._loop.run(self._sub.receive(timeout))
        except Exception as exc:
            raise _sync_errors(self._loop, exc) from None
        return SyncReceivedEnvelope(msg, self._loop) if msg is not None else None

    def receive_batch(self, max_messages: int, timeout: float | None = None) -> list[SyncReceivedEnvelope]:
        try:
            batch = self._loop.run(self._sub.receive_batch(max_messages, timeout))
        except Exception as exc:
            raise _sync_errors(self._loop, exc) from None
        return [SyncReceivedEnvelope(m, self._loop) for m in batch]

    def __iter__(self) -> Iterator[SyncReceivedEnvelope]:
        # Short blocking steps (the poll interval), so Ctrl-C is seen between them.
        while not self._sub._closed:
            msg = self.receive(self._sub.poll_interval)
            if msg is not None:
                yield msg

    def commit(self) -> None:
        """`Subscription.commit`: every ack so far is durable when this returns."""
        try:
            self._loop.run(self._sub.commit())
        except Exception as exc:
            raise _sync_errors(self._loop, exc) from None

    def close(self) -> None:
        self._loop.run(self._sub.close())

    def __enter__(self) -> Self:
        self._loop.run(self._sub.start())
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


class SyncPrismClient:
    """Blocking client with `PrismClient`'s constructor arguments and methods."""

    def __init__(self, url: str, **kwargs: Any) -> None:
        self._loop = _LoopThread()
        try:
            self._client: PrismClient = self._loop.run(self._make(url, kwargs))
        except BaseException:
            self._loop.stop()
            raise

    @staticmethod
    async def _make(url: str, kwargs: dict[str, Any]) -> PrismClient:
        return PrismClient(url, **kwargs)  # created on the loop that will use its locks

    @property
    def backend(self) -> Any:
        return self._client.backend

    @property
    def namespace(self) -> str:
        return self._client.namespace

    def connect(self) -> Self:
        self._loop.run(self._client.connect())
        return self

    def close(self) -> None:
        if not self._loop.thread.is_alive():
            return
        try:
            self._loop.run(self._client.close())
        finally:
            self._loop.stop()

    def __enter__(self) -> Self:
        return self.connect()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def build_envelope(self, topic: str, payload: Any, options: PrismPublishOptions | None = None) -> Envelope:
        return self._client.build_envelope(topic, payload, options)

    def publish(self, topic: str, payload: Any, options: PrismPublishOptions | None = None) -> str:
        return self._loop.run(self._client.publish(topic, payload, options))

    def publish_batch(self, items: Iterable[BatchItem]) -> list[str]:
        return self._loop.run(self._client.publish_batch(list(items)))

    def publish_envelope(self, env: Envelope, **kwargs: Any) -> str:
        return self._loop.run(self._client.publish_envelope(env, **kwargs))

    def publish_bytes(self, topic: str, value: bytes) -> None:
        self._loop.run(self._client.publish_bytes(topic, value))

    def subscribe(self, topic: str, **kwargs: Any) -> SyncSubscription:
        return SyncSubscription(self._client.subscribe(topic, **kwargs), self._loop)

    def __repr__(self) -> str:
        return f"Sync{self._client!r}"

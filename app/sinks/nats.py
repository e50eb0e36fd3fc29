"""NATS JetStream sink (publish with `Nats-Msg-Id`) and a JetStream pull source.

**Sink.** Each record is published with the binding's headers (`Prism-*`, `Nats-Msg-Id`,
`traceparent`; `app.bindings.nats.encode`) and the exact envelope bytes the worker signed as
data. The subject is the envelope's topic unless `subject` is configured. A batch is
published concurrently on one connection (the server stores them in wire order) and the
sink waits for every JetStream ack: an ack means the message is stored (on disk for the
default file storage) before the batch's Kafka offsets may be committed.

**Idempotency.** `Nats-Msg-Id` is the envelope's message id, and JetStream drops a publish
whose id it stored within the stream's `duplicate_window` (the ack then says `duplicate`).
That is server-side de-duplication, so a replay, or a retry of a publish whose ack was lost
when the server died, stores nothing twice - within the window. An outage longer than the
window can, in the worst case (publish stored, ack lost, retried after the window),
store a second copy; raise `duplicate_window_s` to cover the longest outage you wait out.

**Size limit.** The server announces its `max_payload` (1 MiB by default) in the INFO it sends
on connect, and refuses a larger message (headers included). The sink reads it from the
connection (`nc.max_payload`, again after a reconnect) and checks each message, headers plus
data, before publishing: one over it goes to the DLQ as `too_large` (`Sink.size_problem`)
instead of failing its batch on every retry.

**Stream.** With `create_stream: true` the stream is created at start-up when missing
(file storage, the sink's subjects, the configured duplicate window); an existing stream is
used as it is.

**Source.** `NatsJetStreamSource` pulls from a durable consumer: `fetch()` returns decoded
messages (headers cross-checked against the envelope), `ack()` acknowledges them; unacked
messages are redelivered after the consumer's ack wait.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import nats
from nats.js import api as js_api
from nats.js.errors import NotFoundError

from app.bindings import nats as nb
from app.envelope.model import Envelope
from app.errors import PrismError, SinkError
from app.sinks.base import Sink, SinkRecord, WriteOutcome, url_secrets
from app.topology import NatsSinkSpec

log = logging.getLogger("prism.sinks")


async def _quiet(exc: Exception) -> None:
    # nats-py reports every failed reconnect through error_cb; the delivery loop already
    # logs the outage once, so these stay at debug level.
    log.debug("nats client: %s", exc)


async def connect(url: str, *, timeout_s: float) -> Any:
    """A client that keeps reconnecting forever (a restarted server is found again) and
    fails fast on the first connect, so the delivery loop's backoff governs retries."""
    return await nats.connect(servers=[url], connect_timeout=max(1, int(min(timeout_s, 3))),
                              allow_reconnect=True, max_reconnect_attempts=-1, reconnect_time_wait=0.2,
                              error_cb=_quiet, disconnected_cb=None, closed_cb=None, name="prism-sink")


async def _close(nc: Any) -> None:
    if nc is None:
        return
    with contextlib.suppress(Exception):
        await asyncio.wait_for(nc.close(), 2.0)


class NatsSink(Sink[nb.NatsMessage]):
    kind = "nats"

    def __init__(self, name: str, *, stream: str, url: str = "nats://127.0.0.1:4222", subject: str | None = None,
                 create_stream: bool = True, stream_subjects: Sequence[str] | None = None,
                 duplicate_window_s: int = 120, timeout_s: float = 10.0) -> None:
        super().__init__(name, timeout_s=timeout_s, secrets=url_secrets(url))
        self.url = url
        self.stream = stream
        self.subject = nb.check_subject(subject) if subject else None
        self.create_stream = create_stream
        self.stream_subjects = list(stream_subjects or ([subject] if subject else []))
        self.duplicate_window_s = duplicate_window_s
        self._nc: Any = None
        self._js: Any = None
        #: the server's max_payload from its INFO (None until the first connect)
        self._max_payload: int | None = None

    limit_source = "the NATS server's max_payload"

    def max_item_bytes(self) -> int | None:
        nc = self._nc
        if nc is not None and nc.is_connected:
            self._max_payload = int(nc.max_payload)  # a reconnect may have brought another server's INFO
        return self._max_payload

    def item_size(self, item: nb.NatsMessage) -> int:
        # what the server compares with max_payload: the HPUB's header block plus the data
        head = 0
        if item.headers:
            head = len(b"NATS/1.0\r\n\r\n") + sum(len(str(k).encode()) + len(str(v).encode()) + 4
                                                  for k, v in item.headers.items())
        return head + len(item.data)

    async def refresh_limits(self) -> None:
        if self._max_payload is None:  # never connected: connect now to learn it (a failure is the write's)
            try:
                await self.start()
            except Exception as exc:
                log.debug("nats sink %s: not connected, max_payload unknown yet: %s", self.name, exc)

    @classmethod
    def from_spec(cls, spec: NatsSinkSpec, *, default_subjects: Sequence[str] = ()) -> NatsSink:
        """`default_subjects`: the stream's subjects when neither `stream_subjects` nor
        `subject` is configured (the runner passes the topology's source topics)."""
        subjects = spec.stream_subjects or ([spec.subject] if spec.subject else list(default_subjects))
        return cls(spec.name, stream=spec.stream, url=spec.url, subject=spec.subject,
                   create_stream=spec.create_stream, stream_subjects=subjects,
                   duplicate_window_s=spec.duplicate_window_s, timeout_s=spec.timeout_ms / 1000)

    def encode(self, record: SinkRecord) -> nb.NatsMessage:
        msg = nb.encode(record.envelope, record.layout, subject=self.subject)
        return nb.NatsMessage(msg.subject, record.raw, msg.headers)  # the signed bytes, not a re-encoding

    async def _open(self) -> None:
        self._nc = await connect(self.url, timeout_s=self.timeout_s)
        self._max_payload = int(self._nc.max_payload)
        self._js = self._nc.jetstream(timeout=self.timeout_s)
        if self.create_stream:
            await self._ensure_stream()

    async def _ensure_stream(self) -> None:
        try:
            await self._js.stream_info(self.stream)
            return
        except NotFoundError:
            pass
        if not self.stream_subjects:
            raise self.error(f"stream {self.stream!r} does not exist and no subjects are known to create it with",
                             hint="set stream_subjects (or subject) on the sink, or create the stream yourself")
        await self._js.add_stream(name=self.stream, subjects=self.stream_subjects,
                                  storage=js_api.StorageType.FILE, duplicate_window=float(self.duplicate_window_s))

    async def _write(self, items: Sequence[nb.NatsMessage]) -> WriteOutcome:
        results = await asyncio.gather(
            *(self._js.publish(m.subject, m.data, headers=m.headers, timeout=self.timeout_s) for m in items),
            return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            # Stored ones are dropped as duplicates when the whole batch is retried.
            raise self.error(f"{len(errors)} of {len(items)} publish(es) were not acknowledged", errors[0])
        dup = sum(1 for r in results if getattr(r, "duplicate", False))
        return WriteOutcome(len(items) - dup, dup)

    async def _close(self) -> None:
        nc, self._nc, self._js = self._nc, None, None
        await _close(nc)

    async def _ping(self) -> None:
        await self._nc.flush(timeout=2)
        await self._js.stream_info(self.stream)


# --------------------------------------------------------------------------- source


@dataclass(frozen=True, slots=True)
class NatsDelivery:
    msg: Any  # nats.aio.msg.Msg: ack()/nak()/term()
    raw: bytes
    envelope: Envelope | None
    error: PrismError | None = None


class NatsJetStreamSource:
    """Pull messages of `stream` (filtered by `subject`) through the durable consumer
    `durable`, created when missing. Unacknowledged messages come back after `ack_wait_s`."""

    def __init__(self, url: str, stream: str, durable: str, subject: str, *, ack_wait_s: float = 30.0,
                 timeout_s: float = 10.0) -> None:
        self.url = url
        self.stream = stream
        self.durable = durable
        self.subject = subject
        self.ack_wait_s = ack_wait_s
        self.timeout_s = timeout_s
        self._nc: Any = None
        self._sub: Any = None
        self._secrets = url_secrets(url)

    async def start(self) -> None:
        if self._sub is not None:
            return
        try:
            self._nc = await connect(self.url, timeout_s=self.timeout_s)
            js = self._nc.jetstream(timeout=self.timeout_s)
            config = js_api.ConsumerConfig(ack_wait=self.ack_wait_s, ack_policy=js_api.AckPolicy.EXPLICIT)
            self._sub = await js.pull_subscribe(self.subject, durable=self.durable, stream=self.stream,
                                                config=config)
        except Exception as exc:
            await self.stop()
            raise self._error("cannot connect or bind the pull consumer", exc) from exc

    async def fetch(self, n: int = 100, timeout_s: float = 1.0) -> list[NatsDelivery]:
        """Up to `n` messages, waiting at most `timeout_s` for the first; [] when none."""
        await self.start()
        try:
            msgs = await self._sub.fetch(n, timeout=timeout_s)
        except (TimeoutError, nats.errors.TimeoutError):
            return []
        except Exception as exc:
            raise self._error("fetch failed", exc) from exc
        out: list[NatsDelivery] = []
        for m in msgs:
            try:
                out.append(NatsDelivery(m, bytes(m.data), nb.decode(m)))
            except PrismError as exc:
                out.append(NatsDelivery(m, bytes(m.data), None, exc))
        return out

    async def ack(self, deliveries: Sequence[NatsDelivery]) -> None:
        """Acknowledge and wait until the server has the acks (so a crash right after this
        call cannot redeliver them)."""
        try:
            for d in deliveries:
                await d.msg.ack()
            if self._nc is not None:
                await self._nc.flush(timeout=self.timeout_s)
        except Exception as exc:
            raise self._error("ack failed (the messages will be redelivered)", exc) from exc

    async def stop(self) -> None:
        sub, self._sub = self._sub, None
        if sub is not None:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        nc, self._nc = self._nc, None
        await _close(nc)

    def _error(self, what: str, exc: BaseException) -> SinkError:
        text = f"nats source {self.stream!r}/{self.durable!r}: {what}: {type(exc).__name__}: {exc}"
        for s in self._secrets:
            text = text.replace(s, "***")
        return SinkError(text[:500], path=f"nats stream {self.stream}",
                         hint="check that nats-server (JetStream) is up; the client reconnects by itself")

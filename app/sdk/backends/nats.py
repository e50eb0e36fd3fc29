"""NATS backend: JetStream, `nats://[user:pass@]host:port[?param=value...]`.

Messages follow `app.bindings.nats` (envelope as data, `Prism-*` headers, `Nats-Msg-Id` =
message id, so JetStream drops a retried publish inside the duplicate window). Core NATS
(no JetStream) is not used by the SDK for the reason Redis Pub/Sub is not: it stores
nothing, so there is nothing to acknowledge or redeliver.

Each topic (subject) lives in a stream: the existing stream that captures the subject when
there is one, else the SDK creates `<stream_prefix>_<subject, sanitised>_<hash>` capturing
exactly that subject. A subscription group is a durable pull consumer of that name
(sanitised: JetStream names cannot contain `.`, `*`, `>`, whitespace).

URL parameters:

| parameter            | default | meaning                                                  |
|----------------------|---------|----------------------------------------------------------|
| `stream_prefix`      | PRISM   | name prefix of streams the SDK creates                   |
| `storage`            | file    | storage of streams the SDK creates (`file`, `memory`)    |
| `duplicate_window_s` | 120     | de-duplication window of streams the SDK creates         |

Acknowledgements: `ack()` is `+ACK`, `nack()` is `-NAK` (redelivered at once), and closing a
subscription NAKs whatever it handed out and nobody settled. A consumer that dies gets its
messages redelivered after the consumer's `ack_wait` (30 s by default).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import re
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlunsplit

from ...bindings import _common as c
from ...bindings import nats as nb
from ...envelope.codec import encode as encode_envelope
from ...envelope.model import Envelope
from ...errors import ConfigError, PublishError, SubscribeError
from ...security.signing import VerificationKeys
from .base import (
    Backend,
    BackendSubscription,
    Delivery,
    Outgoing,
    PlainTemplates,
    RawMessage,
    SubscribeSettings,
    int_param,
    redact_url,
    reject_unknown,
    split_url,
)

_KNOWN = ("stream_prefix", "storage", "duplicate_window_s")
_NAME_BAD = re.compile(r"[^A-Za-z0-9_-]")


def jetstream_name(text: str) -> str:
    """A valid JetStream stream/consumer name for any text; distinct texts stay distinct."""
    clean = _NAME_BAD.sub("_", text)
    if clean == text:
        return text
    return f"{clean}_{hashlib.sha256(text.encode()).hexdigest()[:8]}"


class NatsBackend(Backend):
    scheme = "nats"

    def __init__(self, url: str) -> None:
        super().__init__(url)
        parts, params = split_url(url)
        self.stream_prefix = params.pop("stream_prefix", "PRISM")
        self.storage = params.pop("storage", "file")
        if self.storage not in ("file", "memory"):
            raise ConfigError(f"URL parameter storage={self.storage!r} must be file or memory", path=redact_url(url))
        self.duplicate_window_s = int_param(params, "duplicate_window_s", 120, url, minimum=1)
        reject_unknown(params, url, _KNOWN)
        self._server = urlunsplit(parts._replace(query=""))
        self.nc: Any = None
        self.js: Any = None
        self._streams: dict[str, str] = {}
        self._lock = asyncio.Lock()
        # As the dict nb.encode returns (its headers, no caller ones to merge).
        self._plain_headers = PlainTemplates(lambda env, layout: dict(nb.headers_for(env, layout)),
                                             [nb._WIRE_NAMES[c.MESSAGE_ID], nb.NATS_MSG_ID], c.pct_encode)

    async def connect(self) -> None:
        import nats

        try:
            self.nc = await nats.connect(self._server, connect_timeout=3, max_reconnect_attempts=5,
                                         name="prism-sdk")
        except Exception as exc:
            raise PublishError(f"cannot connect to NATS: {exc!r}", path=redact_url(self.url),
                               hint="check the URL and that nats-server runs with JetStream (-js)") from exc
        self.js = self.nc.jetstream()

    async def close(self) -> None:
        if self.nc is not None:
            nc, self.nc, self.js = self.nc, None, None
            with contextlib.suppress(Exception):
                await nc.flush(timeout=2)
            await nc.close()

    async def stream_for(self, subject: str, *, create: bool = True) -> str | None:
        """The stream capturing `subject`, created when missing and `create` is set."""
        if subject in self._streams:
            return self._streams[subject]
        from nats.js.api import StorageType, StreamConfig
        from nats.js.errors import BadRequestError, NotFoundError

        nb.check_subject(subject)
        async with self._lock:
            if subject in self._streams:
                return self._streams[subject]
            try:
                name = await self.js.find_stream_name_by_subject(subject)
            except NotFoundError:
                if not create:
                    return None
                name = jetstream_name(f"{self.stream_prefix}_{subject}")
                config = StreamConfig(name=name, subjects=[subject], storage=StorageType(self.storage),
                                      duplicate_window=float(self.duplicate_window_s))
                try:
                    await self.js.add_stream(config)
                except BadRequestError:
                    name = await self.js.find_stream_name_by_subject(subject)  # created concurrently
            self._streams[subject] = name
            return name

    async def publish(self, items: Sequence[Outgoing]) -> None:
        if self.js is None:
            raise PublishError("the NATS backend is not connected", hint="use the client inside `async with`")
        try:
            for subject in {i.topic for i in items}:
                if subject not in self._streams:  # stream_for's own first check, without a coroutine
                    await self.stream_for(subject)
            msgs = [self._message(item) for item in items]
            if len(msgs) == 1:
                await self.js.publish(msgs[0][0], msgs[0][1], headers=msgs[0][2])
            else:
                # One connection keeps the order; the acks are awaited together.
                await asyncio.gather(*(self.js.publish(s, d, headers=h) for s, d, h in msgs))
        except PublishError:
            raise
        except Exception as exc:
            raise PublishError(f"JetStream did not confirm the publish: {exc!r}", path=redact_url(self.url),
                               hint="retrying with the same message_id is safe inside the duplicate window") from exc

    def _message(self, item: Outgoing) -> tuple[str, bytes, dict[str, str]]:
        """(subject, data, headers) of `nats.encode`; `stream_for` has checked the subject."""
        if item.plain:
            # The topic's headers with this message id (`Outgoing.plain`).
            data = item.wire if item.wire is not None else encode_envelope(item.envelope, item.layout)
            return item.topic, data, self._plain_headers.get(item.envelope, item.layout)
        m = nb.encode(item.envelope, item.layout, subject=item.topic, sign_with=item.sign_with)
        return m.subject, item.wire if item.wire is not None else m.data, m.headers

    async def publish_bytes(self, topic: str, value: bytes) -> None:
        await self.stream_for(topic)
        await self.js.publish(topic, value)

    def subscription(self, topic: str, settings: SubscribeSettings) -> BackendSubscription:
        return _NatsSubscription(self, topic, settings)

    async def topic_exists(self, topic: str) -> bool:
        return await self.stream_for(topic, create=False) is not None

    async def sample(self, topic: str, limit: int) -> list[RawMessage]:
        from nats.js.errors import NotFoundError

        stream = await self.stream_for(topic, create=False)
        if stream is None:
            return []
        out: list[RawMessage] = []
        seq = 1
        while len(out) < limit:
            try:
                m = await self.js.get_msg(stream, seq=seq, subject=topic, next=True)
            except NotFoundError:
                break
            headers = [(k, str(v).encode()) for k, v in (m.headers or {}).items()]
            out.append(RawMessage(bytes(m.data or b""), headers, str(m.seq)))
            seq = m.seq + 1
        return out


class _NatsDelivery(Delivery):
    backend = "nats"
    __slots__ = ("msg", "redelivered", "sub")

    def __init__(self, sub: _NatsSubscription, msg: Any) -> None:
        self.sub, self.msg = sub, msg
        self.redelivered = msg.metadata.num_delivered > 1

    def decode(self, verify_with: VerificationKeys | None) -> Envelope:
        return nb.decode(self.msg, verify_with=verify_with)

    @property
    def ref(self) -> str:
        return str(self.msg.metadata.sequence.stream)

    async def ack(self) -> None:
        if self.sub.settle(self):
            await self.msg.ack()

    async def nack(self) -> None:
        if self.sub.settle(self):
            await self.msg.nak()


class _NatsSubscription(BackendSubscription):
    def __init__(self, backend: NatsBackend, topic: str, settings: SubscribeSettings) -> None:
        self.backend, self.topic, self.settings = backend, topic, settings
        self.durable = jetstream_name(settings.group)
        self.sub: Any = None
        self._outstanding: set[_NatsDelivery] = set()

    async def start(self) -> None:
        from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

        try:
            stream = await self.backend.stream_for(self.topic)
            config = ConsumerConfig(durable_name=self.durable, ack_policy=AckPolicy.EXPLICIT,
                                    deliver_policy=DeliverPolicy.ALL, ack_wait=self.settings.ack_wait_s,
                                    filter_subject=self.topic)
            self.sub = await self.backend.js.pull_subscribe(self.topic, durable=self.durable, stream=stream,
                                                            config=config)
        except Exception as exc:
            raise SubscribeError(f"cannot subscribe to NATS subject {self.topic!r}: {exc!r}",
                                 path=redact_url(self.backend.url)) from exc

    def settle(self, d: _NatsDelivery) -> bool:
        if d in self._outstanding:
            self._outstanding.discard(d)
            return True
        return False

    async def fetch(self, max_messages: int, timeout: float) -> list[Delivery]:
        try:
            msgs = await self.sub.fetch(max_messages, timeout=max(timeout, 0.05))
        except TimeoutError:
            # nats.errors.TimeoutError, and also the bare asyncio.TimeoutError nats-py raises
            # when its deadline runs out between the no-wait probe and the lingering request
            # (seen under load): both mean "nothing within the timeout", not a failure.
            return []
        except Exception as exc:
            raise SubscribeError(f"fetching from NATS subject {self.topic!r} failed: {exc!r}") from exc
        out: list[Delivery] = []
        for m in msgs:
            d = _NatsDelivery(self, m)
            self._outstanding.add(d)
            out.append(d)
        return out

    async def close(self) -> None:
        unsettled, self._outstanding = list(self._outstanding), set()
        for d in unsettled:
            with contextlib.suppress(Exception):
                await d.msg.nak()
        if self.sub is not None:
            sub, self.sub = self.sub, None
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        with contextlib.suppress(Exception):
            if self.backend.nc is not None:
                await self.backend.nc.flush(timeout=2)

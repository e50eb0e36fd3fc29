"""The contract between the SDK client and one backend.

A backend turns envelopes into its binding's native form (`app.bindings.<backend>`) and
back, and maps the SDK's two settlement verbs onto its own acknowledgement model:

| backend    | ack()                                   | nack()                                        |
|------------|-----------------------------------------|-----------------------------------------------|
| Kafka      | commit the offset (contiguous prefix)   | seek the partition back to the message        |
| Redis      | XACK                                    | leave it pending; XCLAIM it back on next fetch|
| NATS       | JetStream +ACK                          | JetStream -NAK (redelivered at once)          |
| PostgreSQL | `consumed = TRUE` (row locked meanwhile)| leave `consumed = FALSE`; lock released       |

The client never sees backend objects: it gets `Delivery` handles, decodes them and wraps
them in `ReceivedEnvelope`. Everything here is async and runs on the client's event loop.
"""

from __future__ import annotations

import abc
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar
from urllib.parse import SplitResult, parse_qsl, urlsplit

from ...envelope.codec import Layout
from ...envelope.model import Envelope
from ...errors import ConfigError
from ...security.signing import SigningKey, VerificationKeys


@dataclass(slots=True)
class Outgoing:
    """One envelope to publish, with how to encode it."""

    topic: str
    envelope: Envelope
    layout: Layout
    sign_with: SigningKey | None = None
    key: bytes | None = None
    #: Already-encoded (possibly signed) envelope bytes to send verbatim: forwarding a
    #: message (migration) must not re-encode it, or its signature would no longer hold.
    wire: bytes | None = None
    #: Set by `PrismClient.publish` for an envelope it built from a dict/list with the default
    #: options, unsigned and without a caller key: metadata only (message id, topic,
    #: namespace, publish time, `application/json`), no other context or extension. Its
    #: binding headers then differ from those of the previous such envelope of the topic in
    #: the message id alone, so backends may reuse them (`PlainTemplates`).
    plain: bool = False


class PlainTemplates:
    """The binding's headers/fields of plain envelopes (`Outgoing.plain`), worked out once per
    (topic, namespace, layout) and re-used with the message id swapped in.

    `build(env, layout)` is the binding's own function and returns a list of (name, value)
    pairs or a dict; the entries named in `id_names` are the ones that carry the message id
    (`encode_id` turns the id into their value). Re-using is exact because for a plain
    envelope every other entry depends only on the key's fields (tests/sdk/test_publish_path.py
    compares the result with the binding's for every backend).
    """

    __slots__ = ("_build", "_cache", "_encode_id", "_id_names", "max_topics")

    def __init__(self, build: Callable[[Envelope, Layout], Any], id_names: Sequence[str],
                 encode_id: Callable[[str], Any], max_topics: int = 1024) -> None:
        self._build, self._id_names, self._encode_id = build, frozenset(id_names), encode_id
        self.max_topics = max_topics  # more distinct keys than this: start over
        self._cache: dict[tuple[str, str, Layout], tuple[Any, tuple[Any, ...]]] = {}

    def get(self, env: Envelope, layout: Layout) -> Any:
        md = env.header.metadata
        key = (md.topic, md.namespace, layout)
        hit = self._cache.get(key)
        if hit is None:
            built = self._build(env, layout)
            if isinstance(built, dict):
                slots: tuple[Any, ...] = tuple(k for k in built if k in self._id_names)
            else:
                slots = tuple(i for i, (name, _) in enumerate(built) if name in self._id_names)
            if len(self._cache) >= self.max_topics:
                self._cache.clear()
            self._cache[key] = (built, slots)
            return built.copy()
        template, slots = hit
        value = self._encode_id(md.message_id)
        out = template.copy()
        if isinstance(out, dict):
            for k in slots:
                out[k] = value
        else:
            for i in slots:
                out[i] = (out[i][0], value)
        return out


@dataclass(slots=True)
class RawMessage:
    """A message as stored, for tools that must see every shape (check-compat, migration)."""

    value: bytes
    headers: list[tuple[str, bytes]] = field(default_factory=list)
    #: Where it is: `partition:offset`, a stream entry id, a stream sequence, a row id.
    ref: str = ""
    #: Backends that store a decoded form (PostgreSQL JSONB) hand the envelope over directly.
    envelope: Envelope | None = None


@dataclass(frozen=True, slots=True)
class SubscribeSettings:
    """Backend-facing part of `PrismClient.subscribe`."""

    group: str
    batch_size: int = 64
    #: Redis: how long an entry may sit un-acked in a dead consumer's pending list before
    #: another consumer of the group claims it (XAUTOCLAIM); None: the URL's `claim_idle_ms`.
    claim_idle_ms: int | None = None
    #: NATS: how long JetStream waits for an ack before redelivering.
    ack_wait_s: float = 30.0


class Delivery(abc.ABC):
    """One received message, not yet decoded, with its backend's settlement handles."""

    backend: ClassVar[str]
    #: True when the backend knows this is not the first delivery of the message.
    redelivered: bool = False

    @abc.abstractmethod
    def decode(self, verify_with: VerificationKeys | None) -> Envelope:
        """Decode through the binding (cross-checking its metadata copies), verifying the
        signature first when keys are given."""

    @abc.abstractmethod
    async def ack(self) -> None: ...

    @abc.abstractmethod
    async def nack(self) -> None: ...

    async def withhold(self) -> None:
        """Settle a message this subscriber may not see (above its clearance) so that it never
        comes back to this subscriber. Where each group keeps its own position (Kafka, Redis
        streams, NATS consumers) that is an ack: other groups still get the message. The
        PostgreSQL queue overrides it: there one row is shared by every subscriber."""
        await self.ack()

    @property
    def stale(self) -> bool:
        """True when the backend already re-queued this delivery (Kafka: its partition was
        rewound by a nack or revoked by a rebalance); the client then skips it."""
        return False

    @property
    def ref(self) -> str:
        return ""

    def header(self, name: str) -> bytes | None:
        """The value of the transport header `name` (lowercase), or None. Only the Kafka
        backend has headers the worker writes (e.g. `prism-deprecation` on `.v2`)."""
        return None


class BackendSubscription(abc.ABC):
    @abc.abstractmethod
    async def start(self) -> None: ...

    @abc.abstractmethod
    async def fetch(self, max_messages: int, timeout: float) -> list[Delivery]:
        """Up to `max_messages` deliveries, waiting at most `timeout` seconds for the first."""

    @abc.abstractmethod
    async def close(self) -> None: ...


class Backend(abc.ABC):
    """One connection (pool) to a backend, shared by all publishes and subscriptions of a client."""

    scheme: ClassVar[str]

    def __init__(self, url: str) -> None:
        self.url = url

    @abc.abstractmethod
    async def connect(self) -> None: ...

    @abc.abstractmethod
    async def close(self) -> None: ...

    @abc.abstractmethod
    async def publish(self, items: Sequence[Outgoing]) -> None:
        """Publish in order and return once the backend confirmed every item."""

    @abc.abstractmethod
    async def publish_bytes(self, topic: str, value: bytes) -> None:
        """Publish bare bytes, no envelope: the benchmark's baseline, and the only way to
        write the legacy shapes migration tests start from."""

    @abc.abstractmethod
    def subscription(self, topic: str, settings: SubscribeSettings) -> BackendSubscription: ...

    @abc.abstractmethod
    async def sample(self, topic: str, limit: int) -> list[RawMessage]:
        """Up to `limit` stored messages of `topic`, oldest first, without consuming them."""

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {redact_url(self.url)}>"


# --------------------------------------------------------------------------- URL helpers

_PASSWORD = re.compile(r"(//[^:/@]*:)[^@]*@")


def redact_url(url: str) -> str:
    """The URL with any password replaced, for messages and logs."""
    return _PASSWORD.sub(r"\1***@", url)


def split_url(url: str) -> tuple[SplitResult, dict[str, str]]:
    parts = urlsplit(url)
    return parts, dict(parse_qsl(parts.query, keep_blank_values=True))


def int_param(params: dict[str, str], name: str, default: int, url: str, *, minimum: int = 0) -> int:
    raw = params.pop(name, None)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = minimum - 1
    if value < minimum:
        raise ConfigError(f"URL parameter {name}={raw!r} must be an integer >= {minimum}", path=redact_url(url),
                          hint=f"for example ?{name}={default}")
    return value


def reject_unknown(params: dict[str, str], url: str, known: Sequence[str]) -> None:
    if params:
        raise ConfigError(f"unknown URL parameter(s) {sorted(params)}", path=redact_url(url),
                          hint=f"this backend understands {sorted(known)}")

"""The contract between the SDK client and one backend.

A backend turns envelopes into its binding's native form (`app.bindings.<backend>`) and
back, and maps the SDK's two settlement verbs onto its own acknowledgement model:

| backend    | ack()                                   | nack()                                        |
|------------|-----------------------------------------|-----------------------------------------------|
| Kafka      | record the offset; a background commit  | seek the partition back to the message        |
|            | of the contiguous acked prefix          |                                               |
| Redis      | XACK                                    | leave it pending; XCLAIM it back on next fetch|
| NATS       | JetStream +ACK                          | JetStream -NAK (redelivered at once)          |
| PostgreSQL | `consumed = TRUE` (row locked meanwhile)| leave `consumed = FALSE`; lock released       |

The client never sees backend objects: it gets `Delivery` handles, decodes them and wraps
them in `ReceivedEnvelope`. Everything here is async and runs on the client's event loop.
"""

from __future__ import annotations

import abc
import math
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol
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


class PlainWire(Protocol):
    """What `Backend.publish_plain` gets of a plain envelope's topic (`app.sdk.client._PlainWire`):
    its topic, the Kafka backend's slot for its per-topic header pieces (None until it fills
    it), and the envelope itself for a backend that needs more than the bytes."""

    topic: str
    kafka_headers: Any

    def envelope(self, message_id: str, ms: int, value: bytes) -> Envelope: ...


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
        key = (env.topic, env.namespace, layout)  # not env.header: a plain envelope builds it on demand
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
        value = self._encode_id(env.message_id)
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
    #: Kafka: acks are recorded in memory and committed in the background at most this many
    #: milliseconds later (None: the URL's `commit_interval_ms`). A commit per ack is a round
    #: trip per record (~150 records/s on the embedded broker); one per interval is not.
    commit_interval_ms: int | None = None
    #: Kafka: also commit once this many acks are waiting (None: by time only).
    commit_every: int | None = None
    #: Kafka: `read_committed` (records of aborted transactions are never handed out) or
    #: `read_uncommitted`; None: the URL's `isolation_level` (default `read_committed`).
    isolation_level: str | None = None


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

    async def commit(self) -> None:
        """Make every ack so far durable before returning. Only Kafka batches acks (in memory
        until its background commit). The other backends have nothing to flush: Redis and NATS
        settle each ack with its own round trip (XACK, +ACK), and PostgreSQL's acks become
        durable when their batch's transaction commits, once every message of it is settled."""
        return None

    @abc.abstractmethod
    async def close(self) -> None: ...


class Backend(abc.ABC):
    """One connection (pool) to a backend, shared by all publishes and subscriptions of a client."""

    scheme: ClassVar[str]
    #: `async publish_plain(plain, message_id, ms, wire, value)`: the publish of one plain
    #: envelope (`Outgoing.plain`) in the reviewed layout - `plain.envelope(message_id, ms,
    #: value)`, whose bytes are `wire` - the same record as `publish([Outgoing(..., wire=wire,
    #: plain=True)])` with less per-call work; None when the backend has none (then
    #: `PrismClient.publish` takes the general path). Read when the client connects.
    publish_plain: Callable[[PlainWire, bytes, int, bytes, bytes], Awaitable[None]] | None = None

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

    async def topic_exists(self, topic: str) -> bool:
        """Whether `topic` was ever written (or created), asked without creating it: an empty
        `sample` cannot tell a topic with no messages from a misspelt name. True when the
        backend cannot say."""
        return True

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {redact_url(self.url)}>"


# --------------------------------------------------------------------------- Kafka consumer options

#: Default and bounds of `commit_interval_ms`: 0.5 s keeps redelivery after a crash small and
#: the commit traffic at 2 requests/s; below 10 ms the timer would be a per-record commit again,
#: above 5 min a crash would redeliver a lot.
DEFAULT_COMMIT_INTERVAL_MS = 500
COMMIT_INTERVAL_RANGE_MS = (10, 300_000)
ISOLATION_LEVELS = ("read_committed", "read_uncommitted")
DEFAULT_ISOLATION_LEVEL = "read_committed"


def check_commit_interval(value: Any, where: str) -> int:
    """`value` as a commit interval in ms, or `ConfigError` naming `where`."""
    lo, hi = COMMIT_INTERVAL_RANGE_MS
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise ConfigError(f"commit_interval_ms must be an integer from {lo} to {hi}, got {value!r}", path=where,
                          hint=f"acks are committed in the background at most this long after; e.g. "
                               f"{DEFAULT_COMMIT_INTERVAL_MS}")
    return value


def check_isolation_level(value: Any, where: str) -> str:
    """`value` as an isolation level, or `ConfigError` naming `where`."""
    if value not in ISOLATION_LEVELS:
        raise ConfigError(f"isolation_level must be one of {', '.join(ISOLATION_LEVELS)}, got {value!r}",
                          path=where, hint="read_committed hides the records of aborted transactions; "
                                           "it is what consumers of an exactly_once pipeline need")
    return str(value)


def check_seconds(value: Any, name: str, where: str, *, positive: bool = True, most: float = 86_400.0) -> float:
    """`value` as a number of seconds (`positive`: above 0, else 0 too) up to `most`, or
    `ConfigError` naming `name` and `where`. A NaN deadline is never passed, so a receive loop
    given one polled without ever waiting; an infinite one never ends."""
    ok = (not isinstance(value, bool) and isinstance(value, int | float) and math.isfinite(value)
          and (value > 0 if positive else value >= 0) and value <= most)
    if not ok:
        floor = "above 0" if positive else "from 0"
        raise ConfigError(f"{name} must be a number of seconds {floor} up to {most:g}, got {value!r}", path=where,
                          hint="e.g. 1.0; to wait for good, loop around the call")
    return float(value)


def check_commit_every(value: Any, where: str) -> int | None:
    """`value` as a commit-every-N-acks count (None: off), or `ConfigError` naming `where`."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"commit_every must be None or an integer >= 1, got {value!r}", path=where,
                          hint="None commits by time only (commit_interval_ms); e.g. 1000 also commits "
                               "once 1000 acks are waiting")
    return value


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

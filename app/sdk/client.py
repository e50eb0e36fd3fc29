"""`PrismClient`: one async publish/subscribe API over Kafka, Redis Streams, NATS JetStream
and PostgreSQL (RFC-031 "Developer APIs").

    async with PrismClient("kafka://127.0.0.1:9092", namespace="order-events") as client:
        await client.publish("orders.created", {"order_id": 42})
        async with client.subscribe("orders.created", group="billing") as sub:
            async for msg in sub:
                print(msg.metadata.message_id, msg.payload())
                await msg.ack()

The URL picks the backend; nothing else in the calling code changes between backends
(docs/sdk.md lists each backend's URL parameters and acknowledgement model).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import deque
from collections.abc import Callable, Iterable
from types import TracebackType
from typing import Any, Self

from google.protobuf.message import Message

from .._gen.prism.envelope.v1 import envelope_pb2 as pb
from ..envelope.codec import Layout
from ..envelope.model import Envelope, Payload, new_envelope
from ..envelope.validation import SanityPolicy, required_problems, text_problem
from ..errors import (
    ConfigError,
    DeliveryAuditError,
    PrismError,
    SchemaAssertionError,
    TopicMismatchError,
    ValidationError,
)
from ..observability.tracecontext import write_envelope_context
from ..schema.assertion import OnMismatch, SchemaAssertion, SchemaMismatchError
from ..security.encryption import encrypt_envelope
from ..security.keys import DataKeyProvider, KeyProvider
from ..security.signing import SigningKey, VerificationKeys
from ..sunset import DEPRECATION_HEADER
from ..sunset import parse_header as parse_deprecation
from ..untrusted_json import dumps_checked
from ._ids import fast_uuid7
from .audit import (
    AUDITED,
    REFUSAL_RECORD_BYTES,
    REFUSALS_PER_RECORD,
    WITHHELD_LOG_EVERY,
    Clearance,
    audit_outgoing,
    audit_record,
    classification_of,
    refusal_entry,
    refusal_entry_bytes,
    refusal_record,
    refusals_record,
)
from .backends import backend_for_url
from .backends.base import (
    Backend,
    BackendSubscription,
    Delivery,
    Outgoing,
    SubscribeSettings,
    check_commit_every,
    check_commit_interval,
    check_isolation_level,
    check_seconds,
)
from .options import DEFAULT_OPTIONS, PrismPublishOptions, current_otel_context, otel_context, trace_context_of
from .pii import PiiPolicy
from .received import ReceivedEnvelope
from .schemas import SchemaRequirement, SchemaResolver
from .usage import DEFAULT_INTERVAL_S, VersionReporter
from .validation import SchemaMetrics, SchemaValidation
from .version import SDK_VERSION

log = logging.getLogger("prism.sdk")
#: `app` in the worker's tree, `prism_client` in the client distribution: hints name the import path
#: the caller actually has.
_PACKAGE = __name__.partition(".")[0]

#: One `publish_batch` item: (topic, payload) or (topic, payload, options).
BatchItem = tuple[str, Any] | tuple[str, Any, PrismPublishOptions | None]


_JSON = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)  # what new_envelope's json.dumps builds per call
_CONTENT_TYPE_JSON = pb.CONTENT_TYPE_JSON
_JSON_CONTAINERS = (dict, list)  # a constant: `dict | list` in an isinstance builds a union per call


def _varint(n: int) -> bytes:
    """Protobuf's base-128 varint of a non-negative int (tests/sdk/test_publish_path.py checks
    every byte of `_json_envelope` against `SerializeToString`)."""
    if n < 0x80:
        return _SMALL_VARINTS[n]
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


_SMALL_VARINTS = tuple(bytes((i,)) for i in range(0x80))
#: Publish times whose varint has 6 bytes: 1971-02 to 2109-05. `_PlainWire` writes those
#: without a loop and with the metadata length worked out in advance.
_MS6_LOW, _MS6_HIGH = 1 << 35, 1 << 42


class _PlainWire:
    """The reviewed-layout bytes of a plain JSON envelope of one (topic, namespace), cut
    around the two values that change per publish: message id and publish time.

    `PrismEnvelope{metadata{message_id, topic, namespace, published_at_ms, content_type,
    producer_sdk_version}, payload{value}}` serializes its fields in field-number order, so
    the bytes are `0x0a len(md) | 0x0a 0x24 id | <topic, namespace> | 0x20 varint(ms) |
    <content type, SDK version> | 0x9a 0x06 len(any) 0x12 len(value) value`. The constant
    pieces come from `SerializeToString` of partial metadata messages (protobuf writes them,
    not this class); only the lengths and the timestamp are varints written here.

    `kafka_headers` is `KafkaBackend.publish_plain`'s per-topic piece (the binding's `prism-*`
    headers split around the message id), filled on its first publish: the binding's headers of
    a plain envelope depend on nothing but the topic and namespace, so every Kafka client may
    share them. A backend that gets a direct path of its own adds its own slot."""

    __slots__ = ("after_id", "after_ms", "after_ms_any", "head6", "id_prefix", "kafka_headers", "namespace", "topic")

    def __init__(self, topic: str, namespace: str) -> None:
        self.topic, self.namespace = topic, namespace
        self.id_prefix = pb.PrismMetadata(message_id="0" * 36).SerializeToString()[:-36]  # tag + length
        self.after_id = pb.PrismMetadata(topic=topic, namespace=namespace).SerializeToString() + b"\x20"
        self.after_ms = pb.PrismMetadata(content_type=_CONTENT_TYPE_JSON,
                                         producer_sdk_version=SDK_VERSION).SerializeToString()
        self.after_ms_any = self.after_ms + b"\x9a\x06"  # + the payload field's tag
        md_len6 = len(self.id_prefix) + 36 + len(self.after_id) + 6 + len(self.after_ms)
        self.head6 = b"\x0a" + _varint(md_len6) + self.id_prefix
        self.kafka_headers: Any = None

    def wire(self, message_id: bytes, ms: int, value: bytes) -> bytes:
        """The envelope's bytes; `message_id` is the id's 36 ASCII bytes."""
        if _MS6_LOW <= ms < _MS6_HIGH:
            return b"".join((self.head6, message_id, self.after_id,
                             bytes((ms & 0x7F | 0x80, ms >> 7 & 0x7F | 0x80, ms >> 14 & 0x7F | 0x80,
                                    ms >> 21 & 0x7F | 0x80, ms >> 28 & 0x7F | 0x80, ms >> 35)),
                             self.after_ms_any, _VALUE_HEADS.get(len(value)) or _value_head(len(value)), value))
        md = b"".join((self.id_prefix, message_id, self.after_id, _varint(ms), self.after_ms))
        return b"".join((b"\x0a", _varint(len(md)), md, b"\x9a\x06", _value_head(len(value)), value))

    def envelope(self, message_id: str, ms: int, value: bytes) -> Envelope:
        """The envelope whose bytes `wire` writes (for whoever needs more than the bytes)."""
        return _PlainJsonEnvelope(message_id, self.topic, self.namespace, ms, value)


def _value_head(n: int) -> bytes:
    """`len(any) 0x12 len(value)` before a payload value of `n` bytes: the Any message's length
    and its `value` field's tag and length. Kept for the lengths seen (`_VALUE_HEADS`)."""
    nv = _varint(n)
    head = _varint(n + 1 + len(nv)) + b"\x12" + nv
    if len(_VALUE_HEADS) >= _MAX_VALUE_HEADS:
        _VALUE_HEADS.clear()
    _VALUE_HEADS[n] = head
    return head


_VALUE_HEADS: dict[int, bytes] = {}
_MAX_VALUE_HEADS = 4096  # distinct payload lengths kept; more: start over


def _plain_wire(topic: str, namespace: str) -> _PlainWire:
    """The cached `_PlainWire` of (topic, namespace), made on first use."""
    template = _WIRES.get((topic, namespace))
    if template is None:
        if len(_WIRES) >= _MAX_WIRES:
            _WIRES.clear()
        template = _WIRES[(topic, namespace)] = _PlainWire(topic, namespace)
    return template


_WIRES: dict[tuple[str, str], _PlainWire] = {}
_MAX_WIRES = 1024  # more distinct (topic, namespace) pairs than this: start over


class _PlainJsonEnvelope(Envelope):
    """The envelope of a plain JSON publish whose protobuf header is built only when something
    reads `header` (the general path, another layout, a binding on a template miss). The Kafka
    publish of a known topic never does: it needs the id, topic, namespace and time, which
    this keeps as plain attributes, and the bytes `_PlainWire` wrote. Built, the header is
    the one `new_envelope` builds (tests/sdk/test_publish_path.py)."""

    __slots__ = ("_md",)

    def __init__(self, message_id: str, topic: str, namespace: str, ms: int, value: bytes) -> None:
        self._md: tuple[str, str, str, int] | None = (message_id, topic, namespace, ms)
        self.payload = Payload(value)

    def __getattr__(self, name: str) -> Any:
        if name != "header":  # only the unset `header` slot lands here
            raise AttributeError(name)
        assert self._md is not None  # set in __init__, cleared only here once `header` is set
        message_id, topic, namespace, ms = self._md
        header = pb.PrismEnvelope()
        md = header.metadata
        md.message_id = message_id
        md.topic = topic
        md.namespace = namespace
        md.published_at_ms = ms
        md.content_type = _CONTENT_TYPE_JSON
        md.producer_sdk_version = SDK_VERSION
        self.header = header
        self._md = None  # from now on the header is the truth (it may be changed in place)
        return header

    @property
    def message_id(self) -> str:
        md = self._md
        return md[0] if md is not None else self.header.metadata.message_id

    @property
    def topic(self) -> str:
        md = self._md
        return md[1] if md is not None else self.header.metadata.topic

    @property
    def namespace(self) -> str:
        md = self._md
        return md[2] if md is not None else self.header.metadata.namespace

    @property
    def published_at_ms(self) -> int:
        md = self._md
        return md[3] if md is not None else self.header.metadata.published_at_ms


def _json_envelope(topic: str, payload: Any, namespace: str) -> tuple[Envelope, bytes]:
    """`new_envelope(topic, payload, namespace=namespace, message_id=fast_uuid7(),
    producer_sdk_version=SDK_VERSION)` for a dict/list payload, and its reviewed-layout
    encoding: the same envelope and the same bytes as `codec.encode`
    (tests/sdk/test_publish_path.py pins both) without building a protobuf message at all.

    The bytes are a per-(topic, namespace) template with the id, the time and the payload
    filled in (`_PlainWire`); the envelope builds its header only if something asks for it
    (`_PlainJsonEnvelope`). Issue 29: building and serializing the header was about a third
    of the envelope's overhead over a raw aiokafka producer. `PrismClient.publish`'s direct
    path does the same steps inline and builds no envelope object at all."""
    message_id = fast_uuid7()
    value = dumps_checked(payload, what="publish(payload=)", encode=_JSON.encode).encode()
    ms = int(time.time() * 1000)
    template = _plain_wire(topic, namespace)
    return template.envelope(message_id, ms, value), template.wire(message_id.encode(), ms, value)


class UnreadableMessage:
    """A delivery the SDK could not turn into a `ReceivedEnvelope` (bad signature, broken
    envelope, binding mismatch). It is attached to the raised error as `err.delivery` so the
    consumer decides: `ack()` drops it (after sending it to a DLQ, say), `nack()` retries it."""

    __slots__ = ("_delivery", "_settled", "error")

    def __init__(self, delivery: Delivery, error: PrismError) -> None:
        self._delivery = delivery
        self.error = error
        self._settled: str | None = None

    @property
    def backend(self) -> str:
        return self._delivery.backend

    @property
    def ref(self) -> str:
        return self._delivery.ref

    async def ack(self) -> None:
        if self._settled is None:
            self._settled = "acked"
            await self._delivery.ack()

    async def nack(self) -> None:
        if self._settled is None:
            self._settled = "nacked"
            await self._delivery.nack()

    def __repr__(self) -> str:
        return f"UnreadableMessage(backend={self.backend}, ref={self.ref!r}, error={self.error.code})"


class PrismClient:
    """Async client. `url` picks the backend (`kafka://`, `redis://`, `nats://`, `postgresql://`).

    Client-wide defaults: `namespace` (required by every envelope), `layout` (reviewed unless
    consumers still read the draft layout), `signing_key` (sign every publish), `schema` (an
    `app.schema.resolve.ResolvedSchema`: its schema context and `contains_pii` go into every
    envelope, and protobuf payloads get `deprecated_fields_used`), `publisher_id`/`team`
    (claimed identity; the worker replaces it with the JWT's), `auth_token` (a JWT string or
    a callable returning one, for the worker's `authenticate` stage).

    `metrics` (a prometheus_client `CollectorRegistry`, or an `app.sdk.validation.SchemaMetrics`):
    count publish-time schema validations and the schema versions subscribers read
    (`prism_sdk_schema_*`, docs/observability.md); serve that registry from the application.

    `registry_url` (a Prism schema registry): `publish(..., schema_version=...)` validates
    against that version of the topic's subject; subscriptions report the schema versions they
    read, as `consumer_id` (default: the subscription's group), at most once per version per
    `report_interval_s`, in the background - see `app.sdk.usage`. A registry that is down
    never delays or fails a message. Received messages decode by the schema their envelope
    references (`await msg.decoded()`, `msg.is_pii_field()`, `msg.mask_pii()`; `self.schemas`),
    and a publish to a namespace whose registry policy has `require_schema` needs the topic's
    subject registered (`SchemaRequiredError` otherwise) - see `app.sdk.schemas`.

    The connection opens on first use, or explicitly with `connect()` / `async with`.
    """

    def __init__(
        self,
        url: str,
        *,
        namespace: str = "default",
        layout: Layout = Layout.REVIEWED,
        signing_key: SigningKey | None = None,
        schema: Any = None,
        publisher_id: str | None = None,
        publisher_team: str | None = None,
        auth_token: str | Callable[[], str] | None = None,
        registry_url: str | None = None,
        consumer_id: str | None = None,
        report_interval_s: float = DEFAULT_INTERVAL_S,
        metrics: Any = None,
    ) -> None:
        if not namespace:
            raise ConfigError("namespace must not be empty", path="PrismClient(namespace=)",
                              hint="every envelope carries a namespace; pass your team's, e.g. 'order-events'")
        if (why := text_problem(namespace, SanityPolicy().max_name_length)) is not None:
            # every envelope carries it: refused here, not on every publish (or at the worker)
            raise ConfigError(f"namespace {why}", path="PrismClient(namespace=)",
                              hint="a namespace names a team's messages, e.g. 'order-events'")
        self.url = url
        self.namespace = namespace
        self.layout = Layout(layout)
        self.signing_key = signing_key
        self.schema = schema
        self.publisher_id = publisher_id
        self.publisher_team = publisher_team
        self.auth_token = auth_token
        self.backend: Backend = backend_for_url(url)
        self._connected = False
        self._closed = False
        self._lock = asyncio.Lock()
        self._subscriptions: set[Subscription] = set()
        self.consumer_id = consumer_id
        self.version_reporter: VersionReporter | None = (
            VersionReporter(registry_url, interval=report_interval_s) if registry_url else None)
        self.schema_metrics: SchemaMetrics | None = (
            metrics if isinstance(metrics, SchemaMetrics) or metrics is None else SchemaMetrics(metrics))
        self._validation = SchemaValidation(registry_url, self.schema_metrics)
        #: the registry's schemas for received messages (None without registry_url)
        self.schemas: SchemaResolver | None = SchemaResolver(registry_url) if registry_url else None
        self._requirement: SchemaRequirement | None = SchemaRequirement(registry_url) if registry_url else None
        self._plain_ok = False
        self._refresh_plain()

    #: The attributes `_plain_ok` is computed from: assigning any of them recomputes it.
    _PLAIN_INPUTS = frozenset({"_connected", "backend", "layout", "schema", "signing_key", "publisher_id",
                               "publisher_team", "auth_token", "_requirement"})

    def __setattr__(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)
        if name in PrismClient._PLAIN_INPUTS and "_plain_ok" in self.__dict__:
            self._refresh_plain()

    def _refresh_plain(self) -> None:
        """`_plain_ok`: whether a `publish(topic, dict_or_list)` with no options may take the
        direct path - everything about the client that the path leaves out holds: connected,
        a backend with `publish_plain`, the reviewed layout, no client schema, signing key,
        publisher identity or schema requirement. Worked out here, whenever one of those
        attributes is assigned (`__setattr__`), instead of on every publish (issue 29)."""
        backend = self.backend
        object.__setattr__(self, "_plain_ok", bool(
            self._connected and backend.publish_plain is not None and self.layout is Layout.REVIEWED
            and self.schema is None and self.signing_key is None and self._requirement is None
            and not (self.publisher_id or self.publisher_team or self.auth_token)))

    # -- lifecycle ---------------------------------------------------------------------------------------
    async def connect(self) -> Self:
        if self._connected:
            return self
        if self._closed:
            raise ConfigError("this PrismClient is closed", hint="create a new client")
        async with self._lock:
            if not self._connected:
                await self.backend.connect()
                self._connected = True
        return self

    async def close(self) -> None:
        """Close every subscription (their unsettled messages go back to the backend) and the connection."""
        self._closed = True
        for sub in list(self._subscriptions):
            await sub.close()
        if self.version_reporter is not None:
            await self.version_reporter.close()
        if self._connected:
            self._connected = False
            await self.backend.close()

    async def __aenter__(self) -> Self:
        return await self.connect()

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()

    # -- publish -----------------------------------------------------------------------------------------
    def build_envelope(self, topic: str, payload: Any, options: PrismPublishOptions | None = None) -> Envelope:
        """The envelope `publish` would send (encrypted when asked, not yet signed)."""
        return self._build(topic, payload, options or DEFAULT_OPTIONS)[0]

    def _build(self, topic: str, payload: Any, o: PrismPublishOptions,
               schema: Any = None) -> tuple[Envelope, bool, bytes | None]:
        """(`build_envelope`, plain, wire): plain means the envelope holds nothing but the
        metadata of a dict/list payload published with the default options (`Outgoing.plain`);
        wire is then its reviewed-layout encoding (None otherwise). `schema`: the one this
        publish was validated against, stamped instead of the client's."""
        if not topic:
            raise ConfigError("topic must not be empty", path="publish(topic=)")
        schema = self.schema if schema is None else schema
        plain = o is DEFAULT_OPTIONS and schema is None and isinstance(payload, dict | list)
        wire = None
        if plain:
            env, wire = _json_envelope(topic, payload, self.namespace)
        else:
            env = new_envelope(
                topic, payload, namespace=self.namespace, content_type=o.content_type,
                content_encoding=o.content_encoding, message_id=o.message_id or fast_uuid7(), priority=o.priority,
                ttl_seconds=o.ttl_seconds, correlation_id=o.correlation_id, causality_parent=o.causality_parent,
                labels=o.labels, extensions=o.extensions or None, data_classification=o.data_classification,
                contains_pii=o.contains_pii if o.contains_pii is not None else (
                    True if schema is not None and schema.contains_pii else None),
                producer_sdk_version=SDK_VERSION,  # memo-031: adoption is counted per SDK version
            )
            if schema is not None:
                self._schema_context(env, payload, schema)
        tc = trace_context_of(o.trace_context) if o.trace_context is not None else current_otel_context()
        if tc is not None:
            plain = False
            write_envelope_context(env, tc.trace_id, tc.span_id, None, tc.flags, tc.tracestate)
        if self.publisher_id or self.publisher_team or self.auth_token:
            plain = False
            sec = env.ensure_security()
            if self.publisher_id:
                sec.publisher_id = self.publisher_id
            if self.publisher_team:
                sec.publisher_team = self.publisher_team
            if self.auth_token:
                sec.auth_token = self.auth_token() if callable(self.auth_token) else self.auth_token
        if o.encryption is not None:
            e = o.encryption
            encrypt_envelope(env, e.provider, key_id=e.key_id, algorithm=e.algorithm, policy=e.policy)
        return env, plain, wire if plain else None

    def _schema_context(self, env: Envelope, payload: Any, schema: Any = None) -> None:
        from ..schema.resolve import deprecated_fields_used

        schema = self.schema if schema is None else schema
        # Before encryption: the payload bytes new_envelope already serialized (no second pass).
        used = deprecated_fields_used(env.payload_bytes(), schema) if isinstance(payload, Message) else []
        sc = env.ensure_schema()
        for name, value in schema.schema_context(used).items():
            if name == "deprecated_fields_used":
                sc.deprecated_fields_used.extend(value)
            elif value:
                setattr(sc, name, value)

    def _outgoing(self, env: Envelope, o: PrismPublishOptions, plain: bool = False,
                  wire: bytes | None = None) -> Outgoing:
        sign_with = o.signing_key or self.signing_key
        if plain and sign_with is None and o.key is None:
            # Unsigned: the bytes built with the envelope are what the codec would send.
            layout = self.layout
            return Outgoing(env.topic, env, layout, None, None, wire if layout is Layout.REVIEWED else None, True)
        return Outgoing(env.topic, env, self.layout, sign_with, o.key)

    async def publish(self, topic: str, payload: Any, options: PrismPublishOptions | None = None, *,
                      schema_validation: bool = False, schema_version: str | int | None = None) -> str:
        """Wrap `payload` in an envelope, publish it, and return its message id once the
        backend confirmed it (Kafka acks, XADD reply, JetStream PubAck, committed INSERT).

        `payload`: a dict/list (JSON), a protobuf message, bytes, or str. Raises `PublishError`
        when the backend does not confirm; retrying with `options.message_id` set to the
        returned/previous id keeps idempotent consumers and sinks exactly-once.

        `schema_validation=True` (RFC-030 Workflow 1): validate the payload first, against the
        client's `schema` or, with `schema_version`, that version of the subject named like the
        topic in `registry_url`; a payload that does not match raises `SchemaValidationError`
        (field paths in `.violations`) and nothing is sent. The envelope then carries the
        schema context of the version it was validated against.
        """
        if (options is None and self._plain_ok and isinstance(payload, _JSON_CONTAINERS) and topic
                and not schema_validation and schema_version is None
                and (not otel_context() or current_otel_context() is None)):
            # The default publish of a dict/list (issue 29): `_json_envelope` + `publish_plain`
            # inline, no envelope object; the record is the general path's (`_build` +
            # `_outgoing` + `backend.publish`; tests/sdk/test_publish_path.py).
            message_id = fast_uuid7()
            value = dumps_checked(payload, what="publish(payload=)", encode=_JSON.encode).encode()
            ms = int(time.time() * 1000)
            template = _WIRES.get((topic, self.namespace)) or _plain_wire(topic, self.namespace)
            id_bytes = message_id.encode()
            await self.backend.publish_plain(template, id_bytes, ms, template.wire(id_bytes, ms, value), value)
            return message_id
        o = options or DEFAULT_OPTIONS
        schema = None
        if schema_validation:
            schema = await self._validation.schema_for(topic, self.schema, None if schema_version is None
                                                       else str(schema_version))
            ct = o.content_type if o is not DEFAULT_OPTIONS else None
            self._validation.check(schema, self.namespace, payload, ct)
        elif schema_version is not None:
            raise ConfigError("schema_version= is only used with schema_validation=True",
                              path="publish(schema_version=)", hint="pass schema_validation=True as well")
        if self._requirement is not None:  # RFC-030 phase 2: cached, a dict lookup per publish
            await self._requirement.check(self.namespace, topic)
        env, plain, wire = self._build(topic, payload, o, schema)
        if not self._connected:
            await self.connect()
        await self.backend.publish([self._outgoing(env, o, plain, wire)])
        return env.message_id

    async def publish_envelope(self, env: Envelope, *, signing_key: SigningKey | None = None,
                               key: bytes | None = None, wire: bytes | None = None) -> str:
        """Publish an envelope built elsewhere (`build_envelope`, a decoded message being
        forwarded). `wire` sends already-encoded bytes verbatim, keeping their signature.

        The envelope's required fields (message id, topic, namespace, publish time, payload, and
        the rest of memo-031's list) are checked first: an envelope missing them raises
        `ValidationError` listing every problem, and nothing is sent (memo-031 recommendation 1).
        """
        problems = required_problems(env)
        if problems:
            raise ValidationError(problems, hint="build it with PrismClient.build_envelope or "
                                                 f"{_PACKAGE}.envelope.new_envelope, which set them all")
        if self._requirement is not None:
            await self._requirement.check(env.namespace, env.topic)
        if not self._connected:
            await self.connect()
        await self.backend.publish([Outgoing(env.topic, env, self.layout, signing_key or self.signing_key, key,
                                             wire)])
        return env.message_id

    async def publish_batch(self, items: Iterable[BatchItem]) -> list[str]:
        """Publish several messages in one round trip where the backend allows (Kafka batch,
        Redis pipeline, one PostgreSQL transaction, concurrent JetStream acks). Each message
        gets its own envelope (RFC-031 leaves multi-message envelopes an open question).
        Returns the message ids in order."""
        out: list[Outgoing] = []
        checked: set[str] = set()
        for item in items:
            if len(item) not in (2, 3):
                raise ConfigError(f"publish_batch item {item!r:.60} must be (topic, payload[, options])",
                                  path="publish_batch")
            topic, payload = item[0], item[1]
            o = (item[2] if len(item) == 3 else None) or DEFAULT_OPTIONS  # type: ignore[misc]
            if self._requirement is not None and topic not in checked:  # before anything of the batch is sent
                await self._requirement.check(self.namespace, topic)
                checked.add(topic)
            env, plain, wire = self._build(topic, payload, o)
            out.append(self._outgoing(env, o, plain, wire))
        if not out:
            return []
        if not self._connected:
            await self.connect()
        await self.backend.publish(out)
        return [o.envelope.message_id for o in out]

    async def publish_bytes(self, topic: str, value: bytes) -> None:
        """Publish bare bytes WITHOUT an envelope (benchmark baseline, legacy shapes in tests
        and migrations). Prism consumers see such messages as legacy/raw input."""
        if not self._connected:
            await self.connect()
        await self.backend.publish_bytes(topic, value)

    # -- subscribe ----------------------------------------------------------------------------------------
    def subscribe(
        self,
        topic: str,
        *,
        group: str,
        expected_version: str | None = None,
        on_mismatch: str | OnMismatch = OnMismatch.ERROR,
        expected_hash: str | None = None,
        verify_with: VerificationKeys | None = None,
        decrypt_with: KeyProvider | DataKeyProvider | None = None,
        pii_fields: Iterable[str] = (),
        schema: Any = None,
        payload_type: type[Message] | None = None,
        batch_size: int = 64,
        poll_interval: float = 1.0,
        drop_expired: bool = True,
        claim_idle_ms: int | None = None,
        ack_wait_s: float = 30.0,
        clearance: str | None = None,
        principal: str | None = None,
        audit_topic: str | None = None,
        commit_interval_ms: int | None = None,
        commit_every: int | None = None,
        isolation_level: str | None = None,
        topic_aliases: Iterable[str] = (),
    ) -> Subscription:
        """Subscribe `group` to `topic`; iterate the result (`async for msg in sub`).

        * `expected_version`/`on_mismatch`/`expected_hash` - schema assertion (RFC-030): a
          message whose `schema.schema_version` differs raises `SchemaAssertionError`
          (`error`), is logged once per version and delivered (`warn`), or is delivered
          silently (`ignore`).
        * `verify_with` - every message must carry a valid signature by one of these keys;
          otherwise `SignatureError`/`UnknownKeyError` is raised for it. A signed message must
          also claim this topic (`metadata.topic`: `topic`, the source of a worker's
          `<source>.v2`/`.v3` output, or one of `topic_aliases`), else `TopicMismatchError`:
          a signature is the producer's word for the topic it wrote to, and a valid one copied
          onto another topic (a refund approval replayed onto an order topic) is not for this one.
        * `decrypt_with` - encrypted payloads are decrypted (lazily) by `payload()`.
        * `pii_fields` (and/or `schema`, whose PII fields are added) - reading one of these
          fields from `payload()` warns (`PiiAccessWarning`).
        * `payload_type` - protobuf class for `payload()` when the type URL is not enough.
        * `drop_expired` - messages past their TTL are acknowledged and skipped.
        * `claim_idle_ms` (Redis; default: the URL's) and `ack_wait_s` (NATS) - how long an
          unacknowledged message of a dead consumer waits before another one gets it.
        * `batch_size` / `poll_interval` - messages fetched per round trip / how long one
          `receive()` without a timeout waits.
        * `clearance` (`public` | `internal` | `confidential` | `restricted`; default
          `internal`) - a message classified above it is acknowledged without being handed
          out, and counted in `stats["withheld"]`. `confidential` and `restricted` need
          `principal` (who reads), because each delivery of such data first writes an audit
          record to `audit_topic` (default `prism.audit`); if that write fails the message is
          nacked and `DeliveryAuditError` raised (`app.sdk.audit`).

        Errors raised while receiving carry `err.delivery` (`ReceivedEnvelope` or
        `UnreadableMessage`) so the consumer can `ack()` (drop) or `nack()` (retry) the message;
        until it does, the message stays unsettled. Iterating again continues the subscription.
        """
        if not group:
            raise ConfigError("group must not be empty", path="subscribe(group=)",
                              hint="consumers sharing a group share the work; name yours, e.g. 'billing'")
        if batch_size < 1:
            raise ConfigError(f"batch_size must be >= 1, got {batch_size}", path="subscribe(batch_size=)")
        check_seconds(poll_interval, "poll_interval", "subscribe(poll_interval=)")
        check_seconds(ack_wait_s, "ack_wait_s", "subscribe(ack_wait_s=)")
        if claim_idle_ms is not None and (isinstance(claim_idle_ms, bool) or not isinstance(claim_idle_ms, int)
                                          or claim_idle_ms < 1):
            raise ConfigError(f"claim_idle_ms must be None or an integer >= 1, got {claim_idle_ms!r}",
                              path="subscribe(claim_idle_ms=)",
                              hint="None takes the URL's claim_idle_ms (default 30000)")
        if commit_interval_ms is not None:
            check_commit_interval(commit_interval_ms, "subscribe(commit_interval_ms=)")
        check_commit_every(commit_every, "subscribe(commit_every=)")
        if isolation_level is not None:
            check_isolation_level(isolation_level, "subscribe(isolation_level=)")
        aliases = [topic_aliases] if isinstance(topic_aliases, str) else list(topic_aliases)
        if any(not isinstance(a, str) or not a for a in aliases):
            raise ConfigError(f"topic_aliases must be topic names, got {aliases!r:.100}",
                              path="subscribe(topic_aliases=)", hint="e.g. topic_aliases=['orders.created.legacy']")
        claimable = {topic, *aliases}
        for suffix in (".v2", ".v3"):  # a Prism worker's outputs claim their source topic
            if topic.endswith(suffix) and len(topic) > len(suffix):
                claimable.add(topic[: -len(suffix)])
        cleared = Clearance.of(clearance, principal, audit_topic, topic, signed=self.signing_key is not None)
        settings = SubscribeSettings(group=group, batch_size=batch_size, ack_wait_s=ack_wait_s,
                                     claim_idle_ms=claim_idle_ms, commit_interval_ms=commit_interval_ms,
                                     commit_every=commit_every, isolation_level=isolation_level)
        assertion = None
        if expected_version is not None:
            assertion = SchemaAssertion(expected_version, on_mismatch, expected_hash=expected_hash, topic=topic)
        fields = set(pii_fields)
        if schema is not None:
            fields.update(schema.pii_fields)
        sub = Subscription(self, topic, settings, verify_with=verify_with, decrypt_with=decrypt_with,
                           assertion=assertion, pii=PiiPolicy(fields), payload_type=payload_type,
                           poll_interval=poll_interval, drop_expired=drop_expired, clearance=cleared,
                           claimable_topics=frozenset(claimable))
        self._subscriptions.add(sub)
        return sub

    def __repr__(self) -> str:
        return f"PrismClient({self.backend!r}, namespace={self.namespace!r})"


class Subscription:
    """An open subscription: an async iterator of `ReceivedEnvelope` (see `PrismClient.subscribe`)."""

    def __init__(self, client: PrismClient, topic: str, settings: SubscribeSettings, *,
                 verify_with: VerificationKeys | None, decrypt_with: KeyProvider | DataKeyProvider | None,
                 assertion: SchemaAssertion | None, pii: PiiPolicy, payload_type: type[Message] | None,
                 poll_interval: float, drop_expired: bool, clearance: Clearance | None = None,
                 claimable_topics: frozenset[str] | None = None) -> None:
        self.client, self.topic, self.settings = client, topic, settings
        #: the `metadata.topic` values a verified message may claim here (`PrismClient.subscribe`)
        self.claimable_topics = claimable_topics if claimable_topics is not None else frozenset({topic})
        self.verify_with, self.decrypt_with = verify_with, decrypt_with
        self.assertion, self.pii, self.payload_type = assertion, pii, payload_type
        self.poll_interval, self.drop_expired = poll_interval, drop_expired
        self._inner: BackendSubscription | None = None
        self._buffer: deque[Delivery] = deque()
        self._closed = False
        self._start_lock = asyncio.Lock()
        self._reporter = client.version_reporter
        self._schemas = getattr(client, "schemas", None)  # tests build subscriptions on stand-ins
        self._schema_metrics = getattr(client, "schema_metrics", None)  # tests build subscriptions on stand-ins
        self._consumer_id = client.consumer_id or settings.group
        #: `prism-deprecation` header values already warned about (one warning per value, not per message)
        self._deprecations_seen: set[bytes] = set()
        #: What this subscription may receive and who it is in the audit trail (app.sdk.audit).
        self.clearance = clearance or Clearance()
        #: Counters: messages decoded; of those dropped as expired, withheld as classified above the
        #: clearance; classified deliveries audited; audit records written for refusals (one per batch).
        self.stats = {"received": 0, "expired": 0, "withheld": 0, "audited": 0, "refusal_records": 0}
        #: withheld messages per classification
        self.withheld: dict[str, int] = {}
        #: refused deliveries held until their (shared) audit record is written (`_flush_refusals`)
        self._refused: list[tuple[Delivery, Envelope, dict[str, str]]] = []
        self._refused_bytes = 0
        #: a refusal record that failed after good messages were handed out: raised on the next call
        self._refusal_error: DeliveryAuditError | None = None

    @property
    def group(self) -> str:
        return self.settings.group

    async def start(self) -> Self:
        if self._inner is not None:
            return self
        async with self._start_lock:
            if self._inner is None:
                await self.client.connect()
                inner = self.client.backend.subscription(self.topic, self.settings)
                await inner.start()
                self._inner = inner
        return self

    async def commit(self) -> None:
        """Make every `ack()` so far durable before returning: one round trip for all of
        them, never one per message. Kafka otherwise commits acked offsets in the background
        (`commit_interval_ms`); call this when you must know they are committed, e.g. before
        telling someone else the messages are done. The other backends settle each ack
        themselves; for them this returns at once. Raises `SubscribeError` if the commit fails
        (the messages are then delivered again, to this group: at-least-once)."""
        if self._inner is not None:
            await self._inner.commit()

    async def close(self) -> None:
        """Stop receiving. Acked messages are committed; messages handed out but not
        settled go back to the backend."""
        if self._closed:
            return
        self._closed = True
        self._buffer.clear()
        self._refused.clear()  # held refusals were never settled: they go back to the backend with the rest
        self.client._subscriptions.discard(self)
        if self._inner is not None:
            await self._inner.close()

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> ReceivedEnvelope:
        while not self._closed:
            msg = await self.receive(timeout=self.poll_interval)
            if msg is not None:
                return msg
        raise StopAsyncIteration

    async def receive(self, timeout: float | None = None) -> ReceivedEnvelope | None:
        """The next message, or None after `timeout` seconds (None: the poll interval)."""
        batch = await self.receive_batch(1, timeout)
        return batch[0] if batch else None

    async def receive_batch(self, max_messages: int, timeout: float | None = None) -> list[ReceivedEnvelope]:
        """Up to `max_messages` messages; waits at most `timeout` seconds for the first."""
        if self._closed:
            raise ConfigError("the subscription is closed", hint="subscribe again")
        if isinstance(max_messages, bool) or not isinstance(max_messages, int) or max_messages < 1:
            raise ConfigError(f"max_messages must be an integer >= 1, got {max_messages!r}",
                              path="receive_batch(max_messages=)", hint="e.g. 100")
        if timeout is not None:
            check_seconds(timeout, "timeout", "receive(timeout=)", positive=False)
        if self._refusal_error is not None:  # a refusal record that failed after messages were handed out
            err, self._refusal_error = self._refusal_error, None
            raise err
        await self.start()
        assert self._inner is not None
        try:
            out = await self._receive_batch(max_messages, timeout)
        except BaseException:
            await self._flush_refusals(raise_error=False)
            raise
        err = await self._flush_refusals(raise_error=False)
        if err is not None:
            if not out:
                raise err
            self._refusal_error = err  # hand out what was good first; raise on the next call
        return out

    async def _receive_batch(self, max_messages: int, timeout: float | None) -> list[ReceivedEnvelope]:
        assert self._inner is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (self.poll_interval if timeout is None else timeout)
        out: list[ReceivedEnvelope] = []
        while len(out) < max_messages:
            while self._buffer and len(out) < max_messages:
                d = self._buffer.popleft()
                if d.stale:
                    continue
                try:
                    msg = await self._accept(d)
                except PrismError:
                    if not out:
                        raise
                    self._buffer.appendleft(d)  # hand out what was good first; raise on the next call
                    return out
                if msg is not None:
                    out.append(msg)
            if out or self._closed:
                break
            await self._flush_refusals()  # held refusals are written before waiting for more
            remaining = deadline - loop.time()
            fetched = await self._inner.fetch(self.settings.batch_size, max(0.0, remaining))
            self._buffer.extend(fetched)
            if not fetched and loop.time() >= deadline:
                break
        return out

    def _count_received(self, env: Envelope, sc: Any) -> None:
        """prism_sdk_schema_messages_received_total: the version read and, with an assertion,
        whether it is the one this subscriber expects (RFC-030 "Observability")."""
        assert self._schema_metrics is not None
        version = sc.schema_version if sc is not None else ""
        if self.assertion is None:
            result = "unchecked"
        else:
            a = self.assertion
            result = "match" if a._norm(version) == a._norm(a.expected_version) else "mismatch"
        self._schema_metrics.received_message(env.namespace, version, result)

    async def _accept(self, d: Delivery) -> ReceivedEnvelope | None:
        try:
            env = d.decode(self.verify_with)
            if self.verify_with is not None and env.topic not in self.claimable_topics:
                raise TopicMismatchError(
                    f"message {env.message_id[:64]} claims topic {env.topic[:200]!r} but was read from {self.topic!r}: "
                    "a signed message replayed from another topic", path="metadata.topic",
                    hint="ack() or nack() err.delivery (dead-letter it); if this topic legitimately carries that "
                         "topic's messages, subscribe with topic_aliases=[...]")
        except PrismError as exc:
            exc.delivery = UnreadableMessage(d, exc)  # type: ignore[attr-defined]
            raise
        self.stats["received"] += 1
        notice = d.header(DEPRECATION_HEADER)
        if notice is not None and notice not in self._deprecations_seen:
            self._warn_deprecated(notice)
        classification = classification_of(env)  # the decoded (verified) envelope's, never a header's
        if not self.clearance.allows(classification):
            await self._withhold(d, env, classification)
            return None
        if self.drop_expired and env.is_expired():
            self.stats["expired"] += 1
            log.debug("dropping expired message %s on %s", env.message_id, self.topic)
            await d.ack()
            return None
        verified = None
        if self.verify_with is not None and env.security is not None:
            verified = env.security.signature_key_id or "(unnamed key)"
        msg = ReceivedEnvelope(env, d, decrypt_with=self.decrypt_with, payload_type=self.payload_type,
                               pii=self.pii, verified_key_id=verified, schemas=self._schemas)
        if classification in AUDITED:
            await self._audit(d, env, classification)  # before the application can see the message
        sc = env.schema
        if self._reporter is not None and sc is not None and sc.schema_url:
            self._reporter.seen(self._consumer_id, sc.schema_url)
        if self._schema_metrics is not None:
            self._count_received(env, sc)
        if self.assertion is not None:
            try:
                self.assertion.check(sc.schema_version if sc is not None else None,
                                     sc.schema_hash if sc is not None else None)
            except SchemaMismatchError as exc:
                err = SchemaAssertionError(
                    f"message {env.message_id} on {self.topic!r} has schema version "
                    f"{exc.actual or '(none)'}, the subscriber expects {exc.expected}"
                    + (f" with hash {self.assertion.expected_hash}" if self.assertion.expected_hash else ""),
                    path="schema.schema_version",
                    hint="upgrade the consumer, or subscribe with on_mismatch='warn'; ack() or nack() err.delivery")
                err.delivery = msg  # type: ignore[attr-defined]
                err.expected, err.actual = exc.expected, exc.actual  # type: ignore[attr-defined]
                raise err from None
        return msg

    async def _withhold(self, d: Delivery, env: Envelope, classification: str) -> None:
        """Above the clearance, whatever the classification: hold the delivery for the refusal's
        audit record, which is written for all refusals of this batch at once before any of them
        is settled (`_flush_refusals`; app/sdk/audit.py says why one record for several), count,
        and log the first one and then every `WITHHELD_LOG_EVERY`th."""
        entry = refusal_entry(env, classification, d.ref)
        self._refused.append((d, env, entry))
        self._refused_bytes += refusal_entry_bytes(entry)
        self.stats["withheld"] += 1
        self.withheld[classification] = self.withheld.get(classification, 0) + 1
        n = self.stats["withheld"]
        if n == 1 or n % WITHHELD_LOG_EVERY == 0:
            log.warning("withheld %s message %s on %s from group %r (clearance %s); %d withheld so far",
                        classification, env.message_id, self.topic, self.group, self.clearance.level, n,
                        extra={"event": "classified_withheld", "topic": self.topic, "group": self.group,
                               "classification": classification, "clearance": self.clearance.level,
                               "withheld": n})
        if len(self._refused) >= REFUSALS_PER_RECORD or self._refused_bytes >= REFUSAL_RECORD_BYTES:
            await self._flush_refusals()

    async def _flush_refusals(self, *, raise_error: bool = True) -> DeliveryAuditError | None:
        """Write the one audit record of the refusals held so far, then settle each of them
        (`Delivery.withhold`: an ack where each group has its own position; on PostgreSQL's shared
        queue the row stays for subscribers with the clearance). When the record cannot be written
        every held message is nacked (refused - and audited - again later) and the
        `DeliveryAuditError` raised, or returned when `raise_error` is false."""
        if not self._refused:
            return None
        held, self._refused, self._refused_bytes = self._refused, [], 0
        c = self.clearance
        d0, env0, _ = held[0]
        if len(held) == 1:
            record = refusal_record(env0, held[0][2]["classification"], clearance=c.level, principal=c.principal,
                                    group=self.group, backend=d0.backend, ref=d0.ref)
        else:
            record = refusals_record(env0, [e for _, _, e in held], clearance=c.level, principal=c.principal,
                                     group=self.group, backend=d0.backend)
        try:
            await self._write_audit(d0, env0, record["classification"], record, "refusal",
                                    also=[d for d, _, _ in held[1:]], count=len(held))
        except DeliveryAuditError as exc:
            if raise_error:
                raise
            return exc
        for d, _, _ in held:
            await d.withhold()  # never back to this subscriber; still there for one with the clearance
        self.stats["refusal_records"] += 1
        return None

    async def _audit(self, d: Delivery, env: Envelope, classification: str) -> None:
        """Write the delivery's audit record; on failure give the message back and raise."""
        c = self.clearance
        assert c.principal is not None  # Clearance.of requires one for clearances that see audited data
        record = audit_record(env, classification, principal=c.principal, group=self.group, backend=d.backend,
                              ref=d.ref)
        await self._write_audit(d, env, classification, record, "delivery")
        self.stats["audited"] += 1

    async def _write_audit(self, d: Delivery, env: Envelope, classification: str, record: dict[str, Any],
                           what: str, *, also: list[Delivery] | None = None, count: int = 1) -> None:
        """Publish one audit record, signed with the client's key (an unsigned one - a refusal
        by a client without a key - is written too, and `prism audit` shows it as unverified);
        on failure give the message back - and the `also` messages the record stands for too -
        and raise `DeliveryAuditError`."""
        c = self.clearance
        out = audit_outgoing(record, c.audit_topic, self.client.namespace, self.client.layout,
                             self.client.signing_key, env.message_id.encode())
        try:
            await self.client.backend.publish([out])
        except Exception as exc:
            await d.nack()
            for other in also or ():
                await other.nack()
            others = f" (and {count - 1} other refused messages)" if count > 1 else ""
            err = DeliveryAuditError(
                f"the {what} audit record of {classification} message {env.message_id}{others} on {self.topic!r} "
                f"could not be written to {c.audit_topic!r} ({type(exc).__name__}), so the message was not "
                f"{'delivered' if what == 'delivery' else 'settled'} and goes back to the backend",
                path=f"subscribe(audit_topic={c.audit_topic!r})",
                hint="check that the audit topic is writable on this backend; the message is delivered again")
            unread = UnreadableMessage(d, err)
            unread._settled = "nacked"
            err.delivery = unread  # type: ignore[attr-defined]
            raise err from None

    def _warn_deprecated(self, notice: bytes) -> None:
        """The worker marks `.v2` records from the deprecation date on (`outputs.migration`,
        app/sunset.py): say once per subscription (and per notice) which topic replaces this one
        and when this one stops, so the owner of a `.v2` consumer hears it before the cutoff."""
        if len(self._deprecations_seen) >= 16:  # a bounded memory of notices
            return
        self._deprecations_seen.add(notice)
        p = parse_deprecation(notice)
        log.warning("topic %s is deprecated since %s and stops receiving messages at the cutoff %s; move consumer "
                    "group %r to %s", self.topic, p.get("deprecated", "?"), p.get("sunset", "?"), self.group,
                    p.get("successor", "the .v3 topic"),
                    extra={"event": "v2_deprecated", "topic": self.topic, "cutoff": p.get("sunset", ""),
                           "successor": p.get("successor", ""), "group": self.group})

    def __repr__(self) -> str:
        return f"Subscription(topic={self.topic!r}, group={self.group!r}, backend={self.client.backend.scheme})"

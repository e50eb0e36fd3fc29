"""`ReceivedEnvelope`: what a subscriber gets for each message.

Header first, payload later: the envelope's contexts are decoded when the message arrives
(they are small, and the signature check and schema assertion need them), while the payload
stays the zero-copy slice the codec left it as until `payload()` is called. Decryption is
part of that lazy step, so a consumer that filters on headers never pays for (or audits) a
decryption it did not need.
"""

from __future__ import annotations

import logging
import warnings
from datetime import UTC, datetime
from typing import Any

from google.protobuf import descriptor_pool, message_factory
from google.protobuf.message import Message

from ..envelope.compression import DEFAULT_MAX_DECOMPRESSED
from ..envelope.model import PROTOBUF_TYPE_URL_PREFIX, Envelope
from ..errors import ConfigError, FieldProblem, JsonInputError, PayloadError, ValidationError
from ..formats.legacy import is_json_content_type
from ..observability.tracecontext import carrier_from
from ..security.encryption import decrypt_to_envelope
from ..security.keys import DataKeyProvider, KeyProvider
from ..untrusted_json import loads_untrusted
from .backends.base import Delivery
from .pii import PiiAccessWarning, PiiPolicy, guard
from .schemas import PayloadSchema, SchemaResolver

log = logging.getLogger("prism.sdk")


class ReceivedEnvelope:
    """One received message: envelope accessors, lazy `payload()`, and `ack()`/`nack()`.

    The `metadata`, `security`, `observability` and `schema` accessors always return a
    message (an empty one when the context is absent, read-only by convention); use
    `has_security` & co. when presence matters.
    """

    __slots__ = ("_decrypt_with", "_delivery", "_payload_cache", "_payload_type", "_pii", "_plain", "_schema",
                 "_schemas", "_settled", "envelope", "verified_key_id")

    def __init__(
        self,
        envelope: Envelope,
        delivery: Delivery,
        *,
        decrypt_with: KeyProvider | DataKeyProvider | None = None,
        payload_type: type[Message] | None = None,
        pii: PiiPolicy | None = None,
        verified_key_id: str | None = None,
        schemas: SchemaResolver | None = None,
    ) -> None:
        self.envelope = envelope
        self._delivery = delivery
        self._decrypt_with = decrypt_with
        self._payload_type = payload_type
        self._pii = pii
        self._plain: Envelope | None = None
        self._payload_cache: dict[Any, Any] = {}
        self._settled: str | None = None
        self._schemas = schemas
        self._schema: PayloadSchema | None = None
        #: Key id whose signature was verified on receipt (None when no keys were configured).
        self.verified_key_id = verified_key_id

    # -- contexts (RFC-031 accessors) ------------------------------------------------------------
    @property
    def metadata(self) -> Any:
        return self.envelope.header.metadata

    @property
    def security(self) -> Any:
        return self.envelope.header.security

    @property
    def observability(self) -> Any:
        return self.envelope.header.observability

    @property
    def schema(self) -> Any:
        return self.envelope.header.schema

    @property
    def has_security(self) -> bool:
        return self.envelope.header.HasField("security")

    @property
    def has_observability(self) -> bool:
        return self.envelope.header.HasField("observability")

    @property
    def has_schema(self) -> bool:
        return self.envelope.header.HasField("schema")

    @property
    def extensions(self) -> Any:
        return self.envelope.extensions

    # -- metadata shortcuts ------------------------------------------------------------------------
    @property
    def message_id(self) -> str:
        return self.envelope.message_id

    @property
    def topic(self) -> str:
        return self.envelope.topic

    @property
    def namespace(self) -> str:
        return self.envelope.namespace

    @property
    def published_at(self) -> datetime:
        """The envelope's publish time. The producer writes it (a signature only proves who):
        a value no ``datetime`` can hold (past the year 9999) raises ``ValidationError``, one of
        the SDK's typed errors, instead of the ``ValueError`` that crashed a consumer loop
        logging it."""
        ms = self.envelope.published_at_ms
        try:
            return datetime.fromtimestamp(ms / 1000, tz=UTC)
        except (ValueError, OverflowError, OSError):
            raise ValidationError([FieldProblem("metadata.published_at_ms",
                                                f"{ms} is not a time a datetime can hold")],
                                  hint="the producer wrote a bogus publish time; read envelope.published_at_ms "
                                       "for the raw value") from None

    @property
    def content_type(self) -> str:
        return self.envelope.content_type

    @property
    def priority(self) -> int:
        return self.envelope.priority

    @property
    def labels(self) -> dict[str, str]:
        return dict(self.envelope.header.observability.labels)

    @property
    def is_encrypted(self) -> bool:
        return self.envelope.is_encrypted

    def is_expired(self, now_ms: int | None = None) -> bool:
        return self.envelope.is_expired(now_ms)

    # -- delivery ----------------------------------------------------------------------------------------
    @property
    def backend(self) -> str:
        return self._delivery.backend

    @property
    def redelivered(self) -> bool:
        """True when the backend knows this is a redelivery (Redis, NATS; Kafka and PostgreSQL
        do not track it, so False there means "not known")."""
        return self._delivery.redelivered

    @property
    def ref(self) -> str:
        """The backend position (`partition:offset`, stream entry id, stream sequence, row id)."""
        return self._delivery.ref

    @property
    def settled(self) -> str | None:
        """"acked", "nacked", or None while neither was called."""
        return self._settled

    async def ack(self) -> None:
        """Acknowledge: the message is done and will not be delivered to this group again.
        A second ack/nack of the same message is ignored."""
        if self._settled is None:
            self._settled = "acked"
            await self._delivery.ack()

    async def nack(self) -> None:
        """Give the message back for redelivery (see docs/sdk.md for each backend's meaning)."""
        if self._settled is None:
            self._settled = "nacked"
            await self._delivery.nack()

    # -- tracing -------------------------------------------------------------------------------------------
    @property
    def traceparent(self) -> str | None:
        """The producer's W3C `traceparent` (validated), or None."""
        return carrier_from(self.envelope).get("traceparent")

    def trace_context(self) -> Any:
        """An OpenTelemetry `Context` continuing the producer's trace, for
        `tracer.start_as_current_span(..., context=msg.trace_context())`."""
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        return TraceContextTextMapPropagator().extract(carrier_from(self.envelope))

    # -- payload ---------------------------------------------------------------------------------------------
    def _plain_envelope(self) -> Envelope:
        if not self.envelope.is_encrypted:
            return self.envelope
        if self._plain is None:
            if self._decrypt_with is None:
                raise PayloadError(
                    f"payload of message {self.message_id} is encrypted and the subscription has no keys",
                    path="security.encryption",
                    hint="subscribe(..., decrypt_with=<KeyProvider>) to decrypt transparently")
            self._plain = decrypt_to_envelope(self.envelope, self._decrypt_with)
        return self._plain

    def payload_bytes(self) -> bytes:
        """The plaintext payload bytes: decrypted (when encrypted) and decompressed."""
        if "bytes" not in self._payload_cache:
            self._payload_cache["bytes"] = self._plain_envelope().payload_bytes()
        return self._payload_cache["bytes"]

    def payload(self, cls: type[Message] | None = None) -> Any:
        """The payload, parsed by content type, on first call (then cached):

        * protobuf (`application/protobuf` or a type URL): an instance of `cls`, of the
          subscription's `payload_type`, or of the class registered for the type URL;
        * JSON (`application/json`, `*+json`): the parsed value;
        * anything else: the bytes.

        With PII fields configured, dicts/lists/messages come back wrapped so that reading a
        tagged field warns (`app.sdk.pii`).
        """
        cls = cls or self._payload_type
        key = ("message", cls) if cls is not None else "value"
        if key not in self._payload_cache:
            self._payload_cache[key] = self._parse(cls)
        value = self._payload_cache[key]
        if self._pii is None:
            return value
        contains_pii = self.envelope.header.security.contains_pii
        # Only a payload flagged as PII, and once per subscription and topic (not per message:
        # the flag is on every message of a schema with PII fields): the advice is the same each time.
        if not self._pii.fields and contains_pii and self._pii.first_flag_on(self.topic):
            warnings.warn(f"messages on topic {self.topic!r} are flagged contains_pii and no PII field list is "
                          "configured to say which fields: pass subscribe(schema=...) or pii_fields=[...] so that "
                          "reads of PII fields are reported", PiiAccessWarning, stacklevel=2)
        return guard(value, self._pii.for_message(self.topic, self.message_id, contains_pii))

    def _parse(self, cls: type[Message] | None) -> Any:
        env = self._plain_envelope()
        ct = env.content_type
        type_url = env.payload.type_url
        if cls is not None:
            return env.payload_message(cls)
        if type_url or ct.split(";", 1)[0].strip() == "application/protobuf":
            name = type_url[len(PROTOBUF_TYPE_URL_PREFIX):] if type_url.startswith(PROTOBUF_TYPE_URL_PREFIX) else ""
            try:
                found = message_factory.GetMessageClass(descriptor_pool.Default().FindMessageTypeByName(name)) \
                    if name else None
            except KeyError:
                found = None
            if found is None:
                raise PayloadError(f"payload is a protobuf message ({type_url or 'no type URL'}) and no class is "
                                   "known for it", path="payload.type_url",
                                   hint="call payload(YourMessage) or subscribe(..., payload_type=YourMessage)")
            return env.payload_message(found)
        data = self.payload_bytes()
        if ct and is_json_content_type(ct):
            try:
                return loads_untrusted(data, what="payload", max_bytes=DEFAULT_MAX_DECOMPRESSED)
            except JsonInputError as exc:
                raise PayloadError(f"payload of message {self.message_id} is not valid JSON: {exc.message}",
                                   path="payload", hint="read it with payload_bytes()") from None
        return data

    # -- the payload by its schema (RFC-030 "Consumer PII Awareness"; app/sdk/schemas.py) -------------
    async def payload_schema(self, *, subject: str | None = None) -> PayloadSchema:
        """The registered schema the envelope references, resolved through the client's registry
        (cached per schema version and id) and checked: it must belong to this message's topic
        (or to `subject`), and match the envelope's `schema_hash`. Raises `SchemaReferenceError`
        (the message stays unsettled) or `ConfigError` without `PrismClient(registry_url=)`."""
        if self._schema is not None and subject is None:
            return self._schema
        if self._schemas is None:
            raise ConfigError("decoding by the envelope's schema needs a registry",
                              path="PrismClient(registry_url=)",
                              hint="create the client with registry_url='http://registry:8081'")
        schema = await self._schemas.for_envelope(self.envelope, subjects=None if subject is None else [subject])
        self._schema = schema
        return schema

    async def decoded(self, *, subject: str | None = None) -> Any:
        """The payload decoded by the schema its envelope references (`payload_schema`):
        a protobuf message of the schema's root type (or the payload's type URL, when it names
        one of the schema's messages), the JSON value, or the Avro datum (binary Avro or a JSON
        document). Decrypted first when encrypted. Cached per message."""
        key = ("decoded", subject)
        if key not in self._payload_cache:
            schema = await self.payload_schema(subject=subject)
            env = self._plain_envelope()
            self._payload_cache[key] = schema.decode(self.payload_bytes(), env.content_type,
                                                     message=_type_name(env.payload.type_url))
        return self._payload_cache[key]

    def _resolved_schema(self) -> PayloadSchema:
        if self._schema is None:
            raise ConfigError("the message's schema is not resolved yet", path="ReceivedEnvelope.is_pii_field",
                              hint="await msg.decoded() or await msg.payload_schema() first")
        return self._schema

    def is_pii_field(self, path: str) -> bool:
        """Whether `path` (`$.customer.email`) is PII by the tags of this message's schema (untagged
        and unknown fields are not); after `decoded()` / `payload_schema()`."""
        return self._resolved_schema().is_pii_field(path)

    def mask_pii(self, value: Any = None) -> Any:
        """A copy of `value` (default: the `decoded()` payload) with every PII field masked; the
        input is never changed. After `decoded()` / `payload_schema()`."""
        schema = self._resolved_schema()
        if value is None:
            if ("decoded", None) not in self._payload_cache:
                raise ConfigError("nothing decoded to mask", path="ReceivedEnvelope.mask_pii",
                                  hint="await msg.decoded() first, or pass the value")
            value = self._payload_cache[("decoded", None)]
        return schema.mask_pii(value)

    def __repr__(self) -> str:
        return (f"ReceivedEnvelope({self.envelope!r}, backend={self.backend}, ref={self.ref!r}, "
                f"settled={self._settled})")


def _type_name(type_url: str) -> str | None:
    """The message name of a protobuf `Any` type URL, or None."""
    return type_url[len(PROTOBUF_TYPE_URL_PREFIX):] or None if type_url.startswith(PROTOBUF_TYPE_URL_PREFIX) else None

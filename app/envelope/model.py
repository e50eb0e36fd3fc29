"""The one envelope model every part of Prism uses.

An `Envelope` is two things:

* `header` - a reviewed-layout (`prism.envelope.v1`) `PrismEnvelope` protobuf holding
  metadata, the optional security/observability/schema contexts, extensions and any
  unknown fields, with its own `payload` field always left empty;
* `payload` - a `Payload`, the `google.protobuf.Any` (type_url + value) kept as the
  received wire bytes until somebody asks for it.

The reviewed layout is the model because it can represent everything the draft layout can
(see `app.envelope.layouts`); the draft layout only exists at the codec boundary.
Keeping the generated protobuf classes as the field containers (rather than mirroring them
in dataclasses) means unknown fields from newer producers survive a decode/encode round
trip for free, and there is exactly one definition of every field: the `.proto` file.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any as _Any

from google.protobuf.message import Message

from .._gen.prism.envelope.v1 import envelope_pb2 as pb
from ..errors import DecodeError, JsonInputError, PayloadError, Utf8Error
from ..untrusted_json import dumps_checked, loads_untrusted
from . import compression
from .ids import new_message_id
from .wire import LEN, encode_varint, scan

_COMPACT_JSON = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)

PrismMetadata = pb.PrismMetadata
SecurityContext = pb.SecurityContext
EncryptionMetadata = pb.EncryptionMetadata
ObservabilityContext = pb.ObservabilityContext
SchemaContext = pb.SchemaContext
ContentType = pb.ContentType
ContentEncoding = pb.ContentEncoding
EncryptionType = pb.EncryptionType

DEFAULT_PRIORITY = 5

_CT_TO_MIME = {
    pb.CONTENT_TYPE_PROTOBUF: "application/protobuf",
    pb.CONTENT_TYPE_JSON: "application/json",
    pb.CONTENT_TYPE_AVRO: "application/avro",
}
_MIME_TO_CT = {v: k for k, v in _CT_TO_MIME.items()}
_CE_TO_NAME = {
    pb.CONTENT_ENCODING_NONE: "none",
    pb.CONTENT_ENCODING_GZIP: "gzip",
    pb.CONTENT_ENCODING_SNAPPY: "snappy",
    pb.CONTENT_ENCODING_ZSTD: "zstd",
}
_NAME_TO_CE = {v: k for k, v in _CE_TO_NAME.items()}
PROTOBUF_TYPE_URL_PREFIX = "type.googleapis.com/"


# --------------------------------------------------------------------------- content type / encoding


def get_content_type(md: PrismMetadata) -> str:
    """The metadata's content type as a MIME string ("" when unset).

    No `HasField`: an unset field reads as `CONTENT_TYPE_UNSPECIFIED` (0), which maps to ""
    just as absence does (the enrich stage and the publisher read it per message)."""
    ct = md.content_type
    if ct == pb.CONTENT_TYPE_CUSTOM:
        return md.content_type_custom
    return _CT_TO_MIME.get(ct, "")


def set_content_type(md: PrismMetadata, mime: str) -> None:
    """Store a MIME string, using the compact enum only for the exact canonical spellings
    so that any string round-trips unchanged through both layouts."""
    md.ClearField("content_type_custom")
    if not mime:
        md.ClearField("content_type")
    elif mime in _MIME_TO_CT:
        md.content_type = _MIME_TO_CT[mime]
    else:
        md.content_type = pb.CONTENT_TYPE_CUSTOM
        md.content_type_custom = mime


def get_content_encoding(md: PrismMetadata) -> str:
    """The metadata's content encoding as a name ("" when unset, "none", "gzip", ...)."""
    if not md.HasField("content_encoding"):
        return ""
    if md.content_encoding == pb.CONTENT_ENCODING_CUSTOM:
        return md.content_encoding_custom
    return _CE_TO_NAME.get(md.content_encoding, "")


def set_content_encoding(md: PrismMetadata, name: str) -> None:
    md.ClearField("content_encoding_custom")
    if not name:
        md.ClearField("content_encoding")
    elif name in _NAME_TO_CE:
        md.content_encoding = _NAME_TO_CE[name]
    else:
        md.content_encoding = pb.CONTENT_ENCODING_CUSTOM
        md.content_encoding_custom = name


# --------------------------------------------------------------------------- payload


class Payload:
    """The payload `Any`, lazily parsed from its wire bytes.

    `value` is a zero-copy `memoryview` into the received buffer when the envelope was
    decoded; nothing is copied until a caller turns it into `bytes`.
    """

    __slots__ = ("_raw", "_type_url", "_value", "present")

    def __init__(self, value: bytes | memoryview = b"", type_url: str = "", *, present: bool = True) -> None:
        self._raw: memoryview | None = None
        self._type_url: str | None = type_url
        self._value: bytes | memoryview | None = value
        #: False when the envelope carried no payload record at all (a validation error).
        self.present = present

    @classmethod
    def absent(cls) -> Payload:
        return cls(present=False)

    @classmethod
    def from_wire(cls, raw: bytes | memoryview) -> Payload:
        """Wrap the serialized `Any` message bytes without parsing them yet.

        A memoryview is kept as it is: the decoder passes a fresh slice of the received
        buffer that nothing else holds, and wrapping it again cost ~40 ns per message (issue 29)."""
        p = cls.__new__(cls)
        p._raw = raw if type(raw) is memoryview else memoryview(raw)
        p._type_url = None
        p._value = None
        p.present = True
        return p

    def _parse(self) -> None:
        raw = self._raw
        assert raw is not None
        # The common shape first: one `value` record (tag 0x12, a length of one or two varint
        # bytes) spanning the whole buffer, no type_url - what every JSON and bytes payload is.
        # It is what the walk below yields for these bytes, without the compiled scan's call and
        # tuple list (~0.2 µs a message); any other shape takes the walk.
        n = len(raw)
        if n > 1 and raw[0] == 0x12:
            b = raw[1]
            if b < 0x80:
                if n - 2 == b:
                    self._type_url, self._value = "", raw[2:]
                    return
            elif n > 2 and raw[2] < 0x80 and n - 3 == (b & 0x7F) | (raw[2] << 7):
                self._type_url, self._value = "", raw[3:]
                return
        type_url = ""
        value: memoryview = raw[0:0]
        for field, wt, _, vstart, end in scan(raw):
            if wt != LEN:
                continue  # unknown scalar field inside Any: ignored, as protobuf would
            if field == 1:
                try:
                    type_url = str(raw[vstart:end], "utf-8")
                except UnicodeDecodeError as exc:
                    raise Utf8Error("payload type_url is not valid UTF-8", path="payload.type_url") from exc
            elif field == 2:
                value = raw[vstart:end]
        self._type_url = type_url
        self._value = value

    @property
    def type_url(self) -> str:
        if self._type_url is None:
            self._parse()
        return self._type_url  # type: ignore[return-value]

    @property
    def value(self) -> bytes | memoryview:
        """The payload value exactly as on the wire (possibly compressed and/or encrypted)."""
        if self._value is None:
            self._parse()
        return self._value  # type: ignore[return-value]

    @property
    def is_parsed(self) -> bool:
        """False while the payload is still an unread slice of the input (header-only parse)."""
        return self._value is not None

    def wire(self) -> bytes | memoryview:
        """The serialized `Any` message. Re-uses the received bytes when untouched."""
        if self._raw is not None:
            return self._raw
        parts = []
        if self._type_url:
            tu = self._type_url.encode()
            parts += [b"\x0a", encode_varint(len(tu)), tu]
        value = self._value or b""
        if len(value):
            parts += [b"\x12", encode_varint(len(value)), value]
        built = b"".join(parts)
        self._raw = memoryview(built)  # built once: a payload is immutable once wrapped
        return built

    def __len__(self) -> int:
        return len(self.value)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Payload):
            return NotImplemented
        return self.type_url == other.type_url and bytes(self.value) == bytes(other.value)

    def __repr__(self) -> str:
        return f"Payload(type_url={self.type_url!r}, {len(self)} bytes)"


# --------------------------------------------------------------------------- envelope


class Envelope:
    """A Prism envelope: header contexts + lazy payload. See the module docstring."""

    __slots__ = ("header", "payload")

    def __init__(self, header: pb.PrismEnvelope | None = None, payload: Payload | None = None) -> None:
        self.header = header if header is not None else pb.PrismEnvelope()
        self.payload = payload if payload is not None else Payload()

    # -- contexts ---------------------------------------------------------------------------
    @property
    def metadata(self) -> PrismMetadata:
        return self.header.metadata

    @property
    def security(self) -> SecurityContext | None:
        """The security context, or None when absent (memo-031: presence is meaningful)."""
        return self.header.security if self.header.HasField("security") else None

    # The `ensure_*` methods keep the context they mark present: protobuf (upb) hands out one
    # object per submessage field, set or not, and marking it present keeps that object - so
    # reading the field once instead of twice returns the very same context (~90 ns less per
    # call; a message takes five on its way through the chain).
    def ensure_security(self) -> SecurityContext:
        sec = self.header.security
        sec.SetInParent()
        return sec

    @property
    def observability(self) -> ObservabilityContext | None:
        return self.header.observability if self.header.HasField("observability") else None

    def ensure_observability(self) -> ObservabilityContext:
        obs = self.header.observability
        obs.SetInParent()
        return obs

    @property
    def schema(self) -> SchemaContext | None:
        return self.header.schema if self.header.HasField("schema") else None

    def ensure_schema(self) -> SchemaContext:
        sc = self.header.schema
        sc.SetInParent()
        return sc

    @property
    def extensions(self) -> _Any:
        """`map<string, bytes>`; consumers must ignore keys they do not know."""
        return self.header.extensions

    # -- metadata shortcuts -------------------------------------------------------------------
    @property
    def message_id(self) -> str:
        return self.header.metadata.message_id

    @property
    def topic(self) -> str:
        return self.header.metadata.topic

    @property
    def namespace(self) -> str:
        return self.header.metadata.namespace

    @property
    def published_at_ms(self) -> int:
        return self.header.metadata.published_at_ms

    @property
    def content_type(self) -> str:
        return get_content_type(self.header.metadata)

    @property
    def content_encoding(self) -> str:
        return get_content_encoding(self.header.metadata)

    @property
    def priority(self) -> int:
        """Effective priority: an absent priority means 5 (memo-031 zero-value semantics)."""
        md = self.header.metadata
        return md.priority if md.HasField("priority") else DEFAULT_PRIORITY

    @property
    def producer_sdk_version(self) -> str:
        """The version of the SDK that built the envelope ("" when a producer sent it without a
        Prism SDK): what `prism migrate status` and `prism_producer_sdk_outputs_total` count, so
        a sunset can tell which producers still have to upgrade (memo-031 migration tracking)."""
        return self.header.metadata.producer_sdk_version

    @property
    def is_encrypted(self) -> bool:
        h = self.header  # not through `security`: one property call less, asked several times a message
        return h.HasField("security") and h.security.HasField("encryption")

    def expires_at_ms(self) -> int | None:
        ttl = self.header.metadata.ttl_seconds
        return None if ttl <= 0 else self.published_at_ms + ttl * 1000

    def is_expired(self, now_ms: int | None = None) -> bool:
        exp = self.expires_at_ms()
        if exp is None:
            return False
        return (now_ms if now_ms is not None else int(time.time() * 1000)) >= exp

    # -- payload access -------------------------------------------------------------------------
    def payload_bytes(self, *, max_size: int = compression.DEFAULT_MAX_DECOMPRESSED) -> bytes:
        """The plaintext payload bytes, decompressed per `content_encoding`.

        Raises `PayloadError` for an encrypted payload: decryption needs keys and is
        `app.security.encryption.decrypt_envelope`'s job, never an implicit side effect.
        """
        if self.is_encrypted:
            raise PayloadError(
                "payload is encrypted",
                path="security.encryption",
                hint="decrypt it with app.security.encryption.decrypt_envelope(envelope, key_provider)",
            )
        return compression.decompress(self.payload.value, self.content_encoding, max_size=max_size)

    def payload_json(self) -> _Any:
        """The payload parsed as JSON, by the bounded decoder (a message's payload is untrusted)."""
        try:
            return loads_untrusted(self.payload_bytes(), what="payload", max_bytes=compression.DEFAULT_MAX_DECOMPRESSED)
        except JsonInputError as exc:
            raise PayloadError(
                f"payload is not valid JSON: {exc.message}",
                path="payload",
                hint=f"content_type is {self.content_type!r}; read it with payload_bytes() instead",
            ) from exc

    def payload_message(self, cls: type[Message]) -> Message:
        expected = PROTOBUF_TYPE_URL_PREFIX + cls.DESCRIPTOR.full_name
        if self.payload.type_url and self.payload.type_url != expected:
            raise PayloadError(
                f"payload holds {self.payload.type_url!r}, not {expected!r}",
                path="payload.type_url",
                hint="pass the message class that matches the payload's type_url",
            )
        try:
            return cls.FromString(self.payload_bytes())
        except Exception as exc:  # upb raises its own DecodeError type
            raise DecodeError(f"payload is not a valid {cls.DESCRIPTOR.full_name}", path="payload") from exc

    # -- misc ---------------------------------------------------------------------------------------
    def copy(self) -> Envelope:
        h = pb.PrismEnvelope()
        h.CopyFrom(self.header)
        return Envelope(h, self.payload)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Envelope):
            return NotImplemented
        return self.header == other.header and self.payload == other.payload

    def __repr__(self) -> str:
        # Never print the token, the signature or the payload itself.
        flags = []
        if self.security is not None:
            if self.security.HasField("auth_token"):
                flags.append("auth_token=<redacted>")
            if self.security.HasField("signature"):
                flags.append(f"signed={self.security.signature_algorithm}")
            if self.is_encrypted:
                flags.append(f"encrypted={self.security.encryption.algorithm}")
        extra = (" " + " ".join(flags)) if flags else ""
        return (
            f"Envelope(message_id={self.message_id!r}, topic={self.topic!r}, namespace={self.namespace!r}, "
            f"payload={len(self.payload)}B{extra})"
        )


# --------------------------------------------------------------------------- builder


def new_envelope(
    topic: str,
    payload: bytes | bytearray | memoryview | str | Mapping[str, _Any] | list[_Any] | Message,
    *,
    namespace: str,
    content_type: str | None = None,
    content_encoding: str = "",
    message_id: str | None = None,
    published_at_ms: int | None = None,
    priority: int | None = None,
    ttl_seconds: int | None = None,
    correlation_id: str | None = None,
    causality_parent: str | None = None,
    labels: Mapping[str, str] | None = None,
    extensions: Mapping[str, bytes] | None = None,
    data_classification: str | None = None,
    contains_pii: bool | None = None,
    producer_sdk_version: str | None = None,
) -> Envelope:
    """Build a complete, valid envelope with memo-031's defaults.

    `payload` may be raw bytes, text, a JSON-able dict/list (stored as compact JSON with
    content type application/json) or a protobuf message (packed like `Any.Pack`). A
    `content_encoding` of gzip/snappy/zstd compresses the payload here; decoding reverses
    it transparently in `Envelope.payload_bytes()`.
    """
    type_url = ""
    if isinstance(payload, Message):
        value = payload.SerializeToString()
        type_url = PROTOBUF_TYPE_URL_PREFIX + payload.DESCRIPTOR.full_name
        ct = content_type or "application/protobuf"
    elif isinstance(payload, bytes | bytearray | memoryview):
        value = bytes(payload)
        ct = content_type or ""
    elif isinstance(payload, str):
        value = payload.encode()
        ct = content_type or "text/plain; charset=utf-8"
    else:
        value = dumps_checked(payload, what="payload", encode=_COMPACT_JSON.encode).encode()
        ct = content_type or "application/json"

    header = pb.PrismEnvelope()
    md = header.metadata
    md.message_id = message_id or new_message_id()
    md.topic = topic
    md.namespace = namespace
    md.published_at_ms = published_at_ms if published_at_ms is not None else int(time.time() * 1000)
    set_content_type(md, ct)
    if content_encoding:
        set_content_encoding(md, content_encoding)
        value = compression.compress(value, content_encoding)
    if priority is not None:
        md.priority = priority
    if ttl_seconds is not None:
        md.ttl_seconds = ttl_seconds
    if correlation_id:
        md.correlation_id = correlation_id
    if causality_parent:
        md.causality_parent = causality_parent
    if producer_sdk_version:
        md.producer_sdk_version = producer_sdk_version
    if labels:
        header.observability.labels.update(labels)
    if extensions:
        header.extensions.update(extensions)
    if data_classification is not None:
        header.security.data_classification = data_classification
    if contains_pii is not None:
        header.security.contains_pii = contains_pii
    return Envelope(header, Payload(value, type_url))

"""The shapes producers send today (RFC-031 "Motivation"), read into envelopes.

* Kafka-header metadata: the value is the payload, metadata rides in headers such as
  `schema-id`, `correlation-id`, `timestamp`, `trace-id`.
* NATS-style headers: HTTP-like names (`Nats-Msg-Id`, `X-Schema-URL`, `X-Trace-ID`).
* Redis JSON: `{"meta": {...}, "payload": <user data>}` - Redis pub/sub has no headers.
* Raw bytes: nothing but a payload.

In every case the payload bytes are the producer's bytes, unchanged; header names are compared
case-insensitively; a header or meta key that maps onto no envelope field is kept in the
envelope's extensions (`header.<lowercased name>` / `meta.<key>`), and an auth token goes to
`security.auth_token` only. The full mapping tables are in docs/formats.md.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..envelope.model import Envelope, Payload, get_content_type, set_content_type
from ..errors import LegacyFormatError
from . import _json
from ._fields import Found, add_found, apply_found, header_text, set_auth_token, take_auth_token

#: Extension-key prefixes for metadata that maps onto no envelope field.
HEADER_EXTENSION_PREFIX = "header."
META_EXTENSION_PREFIX = "meta."

#: Kafka legacy header name (lowercase) -> logical field (see `_fields.FIELD_ORDER`).
KAFKA_HEADERS: Mapping[str, str] = {
    "message-id": "message_id",
    "msg-id": "message_id",
    "correlation-id": "correlation_id",
    "causation-id": "causality_parent",
    "causality-parent": "causality_parent",
    "timestamp": "published_at",
    "schema-id": "schema_id",
    "schema-version": "schema_version",
    "schema-url": "schema_url",
    "schema-name": "schema_name",
    "schema-format": "schema_format",
    "schema-hash": "schema_hash",
    "trace-id": "trace_id",
    "span-id": "span_id",
    "priority": "priority",
    "ttl": "ttl_seconds",
    "ttl-seconds": "ttl_seconds",
    "publisher-id": "publisher_id",
    "publisher-team": "publisher_team",
    "data-classification": "data_classification",
    "contains-pii": "contains_pii",
}

#: NATS-style header name (lowercase) -> logical field.
NATS_HEADERS: Mapping[str, str] = {
    "nats-msg-id": "message_id",
    "x-message-id": "message_id",
    "x-correlation-id": "correlation_id",
    "x-causation-id": "causality_parent",
    "x-timestamp": "published_at",
    "x-schema-id": "schema_id",
    "x-schema-url": "schema_url",
    "x-schema-version": "schema_version",
    "x-schema-name": "schema_name",
    "x-schema-format": "schema_format",
    "x-schema-hash": "schema_hash",
    "x-trace-id": "trace_id",
    "x-span-id": "span_id",
    "x-priority": "priority",
    "x-ttl": "ttl_seconds",
    "x-publisher-id": "publisher_id",
    "x-publisher-team": "publisher_team",
    "x-data-classification": "data_classification",
    "x-contains-pii": "contains_pii",
}

#: Standard headers every header shape (and raw bytes that come with headers) understands.
COMMON_HEADERS: Mapping[str, str] = {
    "content-type": "content_type",
    "content-encoding": "content_encoding",
    "traceparent": "traceparent",
    "tracestate": "tracestate",
    "baggage": "baggage",
}

#: Redis `meta` key (lowercase) -> logical field. `payload_encoding` is a control key.
REDIS_META: Mapping[str, str] = {
    "id": "message_id",
    "message_id": "message_id",
    "msg_id": "message_id",
    "ts": "published_at",
    "timestamp": "published_at",
    "time": "published_at",
    "published_at": "published_at",
    "published_at_ms": "published_at_ms",
    "schema": "schema_version",
    "schema_version": "schema_version",
    "schema_id": "schema_id",
    "schema_url": "schema_url",
    "schema_name": "schema_name",
    "schema_format": "schema_format",
    "schema_hash": "schema_hash",
    "trace_id": "trace_id",
    "span_id": "span_id",
    "traceparent": "traceparent",
    "tracestate": "tracestate",
    "correlation_id": "correlation_id",
    "causality_parent": "causality_parent",
    "causation_id": "causality_parent",
    "content_type": "content_type",
    "content_encoding": "content_encoding",
    "priority": "priority",
    "ttl": "ttl_seconds",
    "ttl_seconds": "ttl_seconds",
    "publisher": "publisher_id",
    "publisher_id": "publisher_id",
    "publisher_team": "publisher_team",
    "data_classification": "data_classification",
    "contains_pii": "contains_pii",
}
REDIS_TOKEN_KEYS: tuple[str, ...] = ("auth_token", "token", "authorization")
PAYLOAD_ENCODING_KEY = "payload_encoding"

_JSON_CT = re.compile(r"(application|text)/([a-zA-Z0-9.\-]+\+)?json(;.*)?", re.IGNORECASE)


def is_json_content_type(ct: str) -> bool:
    return bool(_JSON_CT.fullmatch(ct.strip()))


@dataclass(slots=True)
class Decoded:
    """An envelope read from an input shape, with what the reader wants the caller to know."""

    envelope: Envelope
    notes: list[str]


# --------------------------------------------------------------------------- header shapes


def from_headers(
    value: bytes | memoryview,
    headers: Sequence[tuple[str, bytes]],
    table: Mapping[str, str],
    *,
    shape: str,
) -> Decoded:
    """Read a message whose value is the payload and whose metadata rides in `headers`.

    `headers` are `_fields.header_pairs` output (lowercased names). `table` is
    `KAFKA_HEADERS` or `NATS_HEADERS`; `COMMON_HEADERS` always apply.
    """
    notes: list[str] = []
    env = Envelope(payload=Payload(value))
    auth = take_auth_token(headers)
    notes += auth.notes
    set_auth_token(env, auth.token, notes, f"{shape} headers")
    found: dict[str, Found] = {}
    unmapped: dict[str, list[bytes]] = {}
    for name, raw in headers:
        if name in auth.consumed:
            continue
        field = table.get(name) or COMMON_HEADERS.get(name)
        ext_key = HEADER_EXTENSION_PREFIX + name
        if field is None:
            unmapped.setdefault(ext_key, []).append(raw)
            continue
        text = header_text(raw, f"header {name}", LegacyFormatError)
        add_found(found, field, Found(text, f"header {name}", ext_key), LegacyFormatError)
    apply_found(env, found, LegacyFormatError, notes)
    for key, values in unmapped.items():
        if len(values) > 1:
            notes.append(f"{key} appeared {len(values)} times; values joined with ', '")
        env.extensions[key] = b", ".join(values)
    return Decoded(env, notes)


def from_kafka_headers(value: bytes | memoryview, headers: Sequence[tuple[str, bytes]]) -> Decoded:
    return from_headers(value, headers, KAFKA_HEADERS, shape="Kafka")


def from_nats_headers(value: bytes | memoryview, headers: Sequence[tuple[str, bytes]]) -> Decoded:
    return from_headers(value, headers, NATS_HEADERS, shape="NATS")


def from_raw(value: bytes | memoryview, headers: Sequence[tuple[str, bytes]] = ()) -> Decoded:
    """Bytes with no metadata of their own: the payload is the bytes. Standard headers that
    came along (content-type, traceparent, an auth token) are still honoured."""
    return from_headers(value, headers, {}, shape="raw")


# --------------------------------------------------------------------------- Redis JSON


def looks_like_redis_json(value: bytes) -> bool:
    """True for a JSON object whose members are exactly `payload` and optionally `meta`.

    Cheap first check (a leading `{` and both key strings present) before a real parse. A
    `meta` that is not an object still counts: the caller then gets a precise error instead
    of the message silently passing as raw bytes.
    """
    head = value.lstrip(b" \t\r\n")[:1]
    if head != b"{" or b'"payload"' not in value:
        return False
    try:
        members = _json.scan_object(value.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return False
    return "payload" in members and set(members) <= {"meta", "payload"}


def _scalar_text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value
    if isinstance(value, int | float):
        return json.dumps(value)
    return None


def from_redis_json(value: bytes) -> Decoded:
    """Read `{"meta": {...}, "payload": <data>}`.

    Payload rule - the producer states it, Prism never guesses:
    * `meta.payload_encoding == "base64"`: `payload` must be a JSON string; the payload is
      its strict base64 decoding (binary data through a JSON-only channel);
    * otherwise, if `payload` is a JSON string and `meta.content_type` names a non-JSON type
      (`text/plain`), the payload is that string's UTF-8 bytes;
    * otherwise the payload is the JSON text of `payload` exactly as the producer wrote it
      (byte for byte, whitespace included), with content type `application/json` unless
      `meta.content_type` says otherwise.
    """
    try:
        text = value.decode("utf-8")
        members = _json.scan_object(text)
    except UnicodeDecodeError as exc:
        raise LegacyFormatError(f"Redis JSON message is not UTF-8 (byte {exc.start})", path="value",
                                hint="JSON must be UTF-8 encoded") from None
    except ValueError as exc:
        raise LegacyFormatError(f"Redis JSON message is malformed: {exc}", path="value",
                                hint='send {"meta": {...}, "payload": ...} as one JSON object') from None
    if "payload" not in members or not set(members) <= {"meta", "payload"}:
        raise LegacyFormatError(f"Redis JSON message has members {sorted(members)}", path="value",
                                hint='expected exactly "payload" and optionally "meta"')
    meta_member = members.get("meta")
    meta: dict[str, Any] = {}
    if meta_member is not None:
        if not isinstance(meta_member.value, dict):
            raise LegacyFormatError(f"meta must be a JSON object, got {type(meta_member.value).__name__}",
                                    path="meta", hint='send "meta": {"key": value, ...}')
        meta = meta_member.value

    notes: list[str] = []
    env = Envelope()
    found: dict[str, Found] = {}
    token: str | None = None
    encoding: str | None = None
    lowered: dict[str, tuple[str, Any]] = {}
    for key, v in meta.items():
        low = key.lower()
        if low in lowered:
            raise LegacyFormatError(f"meta keys {lowered[low][0]!r} and {key!r} differ only in case",
                                    path=f"meta.{key}", hint="send each meta key once")
        lowered[low] = (key, v)
    for low, (key, v) in lowered.items():
        where = f"meta.{key}"
        if low in REDIS_TOKEN_KEYS:
            if isinstance(v, str) and v.strip():
                tok = v.strip()
                if low == "authorization" and tok.lower().startswith("bearer "):
                    tok = tok[7:].strip()
                if token is None:
                    token = tok
                else:
                    notes.append(f"{where} dropped: an auth token was already found in meta")
            else:
                notes.append(f"{where} dropped: not a non-empty string, so not a token")
            continue
        if low == PAYLOAD_ENCODING_KEY:
            if not isinstance(v, str):
                raise LegacyFormatError("payload_encoding must be a string", path=where, hint='use "base64"')
            encoding = v.lower()
            continue
        field = REDIS_META.get(low)
        scalar = _scalar_text(v)
        if field is None or scalar is None:
            if v is not None:
                env.extensions[META_EXTENSION_PREFIX + key] = _json.dumps_compact(v)
            if field is not None:
                notes.append(f"{where} is not a scalar; kept in extensions[{META_EXTENSION_PREFIX + key!r}]")
            continue
        add_found(found, field, Found(scalar, where, META_EXTENSION_PREFIX + key), LegacyFormatError)

    apply_found(env, found, LegacyFormatError, notes)
    set_auth_token(env, token, notes, "Redis meta")

    pm = members["payload"]
    ct = get_content_type(env.metadata)
    if encoding is not None:
        if encoding != "base64":
            raise LegacyFormatError(f"payload_encoding {encoding!r} is not supported", path="meta.payload_encoding",
                                    hint='the only payload encoding is "base64"; omit it for JSON payloads')
        if not isinstance(pm.value, str):
            raise LegacyFormatError("payload_encoding is base64 but payload is not a string", path="payload",
                                    hint="send the base64 text as a JSON string")
        try:
            data = base64.b64decode(pm.value, validate=True)
        except (binascii.Error, ValueError):
            raise LegacyFormatError("payload is not valid base64", path="payload",
                                    hint="use standard base64 with padding (RFC 4648 section 4)") from None
    elif isinstance(pm.value, str) and ct and not is_json_content_type(ct):
        try:
            data = pm.value.encode("utf-8")
        except UnicodeEncodeError:
            raise LegacyFormatError("payload string holds a lone UTF-16 surrogate escape", path="payload",
                                    hint="send binary data base64-encoded with meta.payload_encoding=base64") from None
    else:
        data = text[pm.start : pm.end].encode("utf-8")
        if not ct:
            set_content_type(env.metadata, "application/json")
    env.payload = Payload(data)
    return Decoded(env, notes)


def to_redis_json(env: Envelope) -> bytes:
    """The Redis legacy shape of an envelope, for consumers not yet migrated (RFC-031 Phase 1
    dual-write). The inverse of `from_redis_json` for the fields that shape can hold: JSON
    payloads are embedded verbatim, text payloads as strings, anything else as base64.
    The auth token is never written."""
    md = env.metadata
    meta: dict[str, Any] = {"message_id": md.message_id, "published_at_ms": md.published_at_ms}
    ct = env.content_type
    if ct:
        meta["content_type"] = ct
    if md.HasField("correlation_id"):
        meta["correlation_id"] = md.correlation_id
    if md.HasField("causality_parent"):
        meta["causality_parent"] = md.causality_parent
    if md.HasField("priority"):
        meta["priority"] = md.priority
    if md.HasField("ttl_seconds"):
        meta["ttl_seconds"] = md.ttl_seconds
    if env.content_encoding:
        meta["content_encoding"] = env.content_encoding
    obs = env.observability
    if obs is not None and obs.trace_id:
        meta["trace_id"] = obs.trace_id
        if obs.span_id:
            meta["span_id"] = obs.span_id
    sch = env.schema
    if sch is not None:
        for name in ("schema_url", "schema_version", "schema_name", "schema_format", "schema_hash"):
            if getattr(sch, name):
                meta[name] = getattr(sch, name)
    sec = env.security
    if sec is not None:
        for name in ("publisher_id", "publisher_team", "data_classification"):
            if sec.HasField(name):
                meta[name] = getattr(sec, name)
        if sec.HasField("contains_pii"):
            meta["contains_pii"] = sec.contains_pii
    data = bytes(env.payload.value)
    if ct and is_json_content_type(ct) and not env.content_encoding and _json.is_exact_json(data):
        payload_text = data.decode("utf-8")
    else:
        try:
            text = data.decode("utf-8")
            textual = bool(ct) and not is_json_content_type(ct) and not env.content_encoding
        except UnicodeDecodeError:
            textual = False
        if textual:
            payload_text = json.dumps(text, ensure_ascii=False)
        else:
            meta[PAYLOAD_ENCODING_KEY] = "base64"
            payload_text = json.dumps(base64.b64encode(data).decode("ascii"))
    meta_text = _json.dumps_compact(meta).decode("utf-8")
    return f'{{"meta":{meta_text},"payload":{payload_text}}}'.encode()

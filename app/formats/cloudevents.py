"""CloudEvents 1.0 <-> Prism envelopes, and both content modes of the CloudEvents Kafka
protocol binding.

Kafka binding rules followed (CloudEvents Kafka Protocol Binding 1.0):
* structured mode when the `content-type` header starts with `application/cloudevents`
  (only the JSON event format, `application/cloudevents+json`, is read); the value is the
  whole event;
* otherwise binary mode: attributes in `ce_<name>` headers (UTF-8 values, names compared
  case-insensitively), `datacontenttype` in `content-type`, the value is the data as is;
* the `partitionkey` extension is the Kafka record key.

The `cloudevents` SDK (2.x, `cloudevents.core`) validates every event we read or write (required
attributes, attribute types, extension names) and writes the attribute part of structured
events and the headers of binary ones. Reading is done here, not with the SDK's readers,
because those (a) invent an `id` and `time` when they are missing instead of refusing the event,
(b) re-encode JSON data, which would change the payload bytes, and (c) raise non-Prism errors.

Attribute mapping (full table with the reasons in docs/formats.md):

| CloudEvents                 | Prism envelope                                                     |
|-----------------------------|--------------------------------------------------------------------|
| id                          | metadata.message_id                                                |
| source                      | security.publisher_id; `/prism/<namespace>` when there is none     |
| type                        | schema.schema_name; metadata.topic when there is no schema name    |
| time (RFC 3339)             | metadata.published_at_ms                                           |
| datacontenttype             | metadata.content_type                                              |
| dataschema                  | schema.schema_url                                                  |
| subject, other extensions   | extensions["ce.<name>"]                                            |
| traceparent                 | observability.trace_id / span_id / trace_flags                     |
| tracestate                  | extensions["w3c.tracestate"] (as the backend bindings do)          |
| dataclassification          | security.data_classification                                       |
| partitionkey / record key   | extensions["kafka.key"]                                            |
| prism* extensions           | the remaining envelope fields (priority, ttl, schema version ...)  |

`metadata.topic` and `metadata.namespace` come from the transport (the Kafka topic the event was
read from, the configured namespace), never from the event: an event must not pick its tenant.
The auth token never leaves Prism and a signature cannot survive (it covers envelope bytes):
both are reported in `dropped`.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from cloudevents.core.base import BaseCloudEvent
from cloudevents.core.bindings import kafka as ce_kafka
from cloudevents.core.exceptions import BaseCloudEventException
from cloudevents.core.formats.json import JSONFormat
from cloudevents.core.v1.event import CloudEvent

from app._gen.prism.envelope.v1 import envelope_pb2 as pb
from app.bindings.tracecontext import TRACESTATE_EXTENSION, parse_traceparent, traceparent_of, tracestate_of
from app.envelope.model import Envelope, Payload, get_content_type, set_content_encoding, set_content_type
from app.envelope.validation import CLASSIFICATIONS
from app.errors import CloudEventError
from app.formats import _json
from app.formats._fields import (
    MAX_MS,
    datetime_from_ms,
    header_pairs,
    ms_from_rfc3339,
    set_auth_token,
    take_auth_token,
)
from app.formats.legacy import HEADER_EXTENSION_PREFIX, is_json_content_type

SPECVERSION = "1.0"
CE_PREFIX = "ce_"
STRUCTURED_PREFIX = "application/cloudevents"
STRUCTURED_JSON = "application/cloudevents+json"
#: Envelope extension prefix for CloudEvents attributes Prism has no field for.
EXTENSION_PREFIX = "ce."
#: Envelope extension holding the Kafka record key (the `partitionkey` extension).
KEY_EXTENSION = "kafka.key"
SOURCE_PREFIX = "/prism/"

_CORE = ("specversion", "id", "source", "type")
_OPTIONAL = ("datacontenttype", "dataschema", "subject", "time")
_NAME = re.compile(r"[a-z0-9]+")
_HEX32 = re.compile(r"[0-9a-f]{32}")
_HEX16 = re.compile(r"[0-9a-f]{16}")

# Prism fields without a CloudEvents attribute travel as `prism*` extension attributes.
A_TYPE_URL = "prismtypeurl"
A_PRIORITY = "prismpriority"
A_TTL = "prismttl"
A_CORRELATION = "prismcorrelationid"
A_CAUSALITY = "prismcausalityparent"
A_ENCODING = "prismcontentencoding"
A_TEAM = "prismpublisherteam"
A_PII = "prismcontainspii"
A_ENCRYPTION = "prismencryption"
A_SCHEMA_VERSION = "prismschemaversion"
A_SCHEMA_FORMAT = "prismschemaformat"
A_SCHEMA_HASH = "prismschemahash"
A_COMPAT = "prismcompatibility"
A_DEPRECATED = "prismdeprecatedfields"
A_TRACE_ID = "prismtraceid"
A_SPAN_ID = "prismspanid"
A_TRACE_FLAGS = "prismtraceflags"
A_PARENT_SPAN = "prismparentspanid"
A_BAGGAGE = "prismbaggage"
A_LABELS = "prismlabels"
A_EXTENSIONS = "prismextensions"
PRISM_ATTRIBUTES = frozenset({
    A_TYPE_URL, A_PRIORITY, A_TTL, A_CORRELATION, A_CAUSALITY, A_ENCODING, A_TEAM, A_PII, A_ENCRYPTION,
    A_SCHEMA_VERSION, A_SCHEMA_FORMAT, A_SCHEMA_HASH, A_COMPAT, A_DEPRECATED, A_TRACE_ID, A_SPAN_ID,
    A_TRACE_FLAGS, A_PARENT_SPAN, A_BAGGAGE, A_LABELS, A_EXTENSIONS,
})
#: Attribute names with a fixed meaning here: never produced from `ce.<name>` extensions.
#: `subject` is not here: it has no envelope field, so it travels as extensions["ce.subject"].
RESERVED = frozenset({*_CORE, "datacontenttype", "dataschema", "time", "data", "traceparent", "tracestate",
                      "dataclassification", "partitionkey", *PRISM_ATTRIBUTES})


@dataclass(slots=True)
class Converted:
    """An envelope as a CloudEvent (SDK object; data is the payload bytes)."""

    event: CloudEvent
    #: The Kafka record key (`partitionkey`), bytes, or None.
    key: bytes | None
    #: Envelope content that a CloudEvent cannot carry, one line each.
    dropped: list[str] = field(default_factory=list)


@dataclass(slots=True)
class Record:
    """A Kafka record in either content mode: hand to any Kafka producer."""

    key: bytes | None
    value: bytes
    headers: list[tuple[str, bytes]]
    dropped: list[str] = field(default_factory=list)


@dataclass(slots=True)
class Decoded:
    envelope: Envelope
    notes: list[str]


class _RawData:
    """SDK `Format` for binary mode that leaves data bytes exactly as they are."""

    def write_data(self, data: Any, datacontenttype: str | None) -> bytes:
        return bytes(data) if data is not None else b""

    def read_data(self, body: bytes, datacontenttype: str | None) -> bytes:
        return body



# --------------------------------------------------------------------------- envelope -> CloudEvent


def _attr_text(value: Any) -> str:
    """Canonical string form of an attribute value (CloudEvents type system)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, datetime):
        return value.isoformat().replace("+00:00", "Z")
    return str(value)


def envelope_attributes(env: Envelope) -> tuple[dict[str, Any], bytes | None, list[str]]:
    """(attributes, key, dropped) for an envelope; attribute values are strings except `time`."""
    md = env.metadata
    dropped: list[str] = []
    a: dict[str, Any] = {"specversion": SPECVERSION, "id": md.message_id}
    sec = env.security
    a["source"] = sec.publisher_id if sec is not None and sec.publisher_id else SOURCE_PREFIX + md.namespace
    sch = env.schema
    a["type"] = sch.schema_name if sch is not None and sch.schema_name else md.topic
    if not 1 <= md.published_at_ms <= 253402300799999:
        raise CloudEventError(f"published_at_ms {md.published_at_ms} has no RFC 3339 form", path="metadata.published_at_ms",
                              hint="CloudEvents time covers years 1970..9999")
    a["time"] = datetime_from_ms(md.published_at_ms)
    ct = get_content_type(md)
    if ct:
        a["datacontenttype"] = ct
    if sch is not None and sch.schema_url:
        a["dataschema"] = sch.schema_url
    if env.payload.type_url:
        a[A_TYPE_URL] = env.payload.type_url
    if md.HasField("priority"):
        a[A_PRIORITY] = str(md.priority)
    if md.HasField("ttl_seconds"):
        a[A_TTL] = str(md.ttl_seconds)
    if md.correlation_id:
        a[A_CORRELATION] = md.correlation_id
    if md.causality_parent:
        a[A_CAUSALITY] = md.causality_parent
    if md.HasField("content_encoding"):
        a[A_ENCODING] = env.content_encoding
    if sec is not None:
        if sec.publisher_team:
            a[A_TEAM] = sec.publisher_team
        if sec.HasField("contains_pii"):
            a[A_PII] = "true" if sec.contains_pii else "false"
        if sec.data_classification:
            a["dataclassification"] = sec.data_classification
        if sec.HasField("encryption"):
            a[A_ENCRYPTION] = base64.b64encode(sec.encryption.SerializeToString()).decode("ascii")
        if sec.HasField("auth_token"):
            dropped.append("security.auth_token: tokens never leave Prism")
        if sec.HasField("signature"):
            dropped.append("security.signature: covers the envelope bytes only; re-sign after conversion")
    if sch is not None:
        for attr, name in ((A_SCHEMA_VERSION, "schema_version"), (A_SCHEMA_FORMAT, "schema_format"),
                           (A_SCHEMA_HASH, "schema_hash"), (A_COMPAT, "compatibility_mode")):
            if getattr(sch, name):
                a[attr] = getattr(sch, name)
        if sch.deprecated_fields_used:
            a[A_DEPRECATED] = json.dumps(list(sch.deprecated_fields_used), ensure_ascii=False)
    obs = env.observability
    if obs is not None:
        tp = traceparent_of(env)
        if tp is not None and obs.trace_flags == (obs.trace_flags & 0xFF):
            a["traceparent"] = tp
        else:
            if obs.trace_id:
                a[A_TRACE_ID] = obs.trace_id
            if obs.span_id:
                a[A_SPAN_ID] = obs.span_id
            if obs.trace_flags:
                a[A_TRACE_FLAGS] = str(obs.trace_flags)
        if obs.parent_span_id:
            a[A_PARENT_SPAN] = obs.parent_span_id
        if obs.baggage:
            a[A_BAGGAGE] = _json.dumps_compact(dict(obs.baggage)).decode("utf-8")
        if obs.labels:
            a[A_LABELS] = _json.dumps_compact(dict(obs.labels)).decode("utf-8")
    key: bytes | None = None
    rest: dict[str, str] = {}
    for k in sorted(env.extensions):
        v = env.extensions[k]
        if k == TRACESTATE_EXTENSION and tracestate_of(env) is not None:
            a["tracestate"] = v.decode("ascii")
            continue
        if k == KEY_EXTENSION:
            key = bytes(v)
            try:
                a["partitionkey"] = v.decode("utf-8")
                continue
            except UnicodeDecodeError:
                pass  # the record key still carries it; an SDK event keeps it in prismextensions
        name = k[len(EXTENSION_PREFIX):] if k.startswith(EXTENSION_PREFIX) else ""
        if name and _NAME.fullmatch(name) and name not in RESERVED:
            try:
                a[name] = v.decode("utf-8")
                continue
            except UnicodeDecodeError:
                pass
        rest[k] = base64.b64encode(v).decode("ascii")
    if rest:
        a[A_EXTENSIONS] = json.dumps(rest, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return a, key, dropped


def _sdk_event(attributes: dict[str, Any], data: Any) -> CloudEvent:
    try:
        return CloudEvent(dict(attributes), data)
    except BaseCloudEventException as exc:
        raise CloudEventError(f"not a valid CloudEvent: {exc}", hint="fix the listed attributes") from None


def to_cloudevent(env: Envelope) -> Converted:
    """The envelope as an SDK CloudEvent whose data is the payload bytes, as they are in the
    envelope (compressed or encrypted payloads stay so; `prismcontentencoding` and
    `prismencryption` say how to read them)."""
    attrs, key, dropped = envelope_attributes(env)
    data = bytes(env.payload.value)
    return Converted(_sdk_event(attrs, data if data else None), key, dropped)


def to_kafka_binary(env: Envelope) -> Record:
    """Binary content mode: `ce_` headers, `content-type`, value = payload bytes."""
    conv = to_cloudevent(env)
    msg = ce_kafka.to_binary(conv.event, _RawData(), key_mapper=lambda _e: conv.key)
    headers = [(name, value) for name, value in msg.headers.items()]
    return Record(conv.key, msg.value, headers, conv.dropped)


def _data_member(env: Envelope, ct: str) -> tuple[str, str] | None:
    """("data"|"data_base64", JSON text) for a structured event, or None for no data.

    JSON payloads are embedded verbatim only when that is exact (the bytes are JSON with no
    surrounding whitespace, not compressed/encrypted/typed): reading the event back yields the
    very same bytes. `text/*` payloads that are UTF-8 become a JSON string; everything else is
    base64 (`data_base64`).
    """
    raw = bytes(env.payload.value)
    if not raw:
        return None
    plain = not env.is_encrypted and env.content_encoding in ("", "none") and not env.payload.type_url
    if plain and ct and is_json_content_type(ct) and _json.is_exact_json(raw):
        return "data", raw.decode("utf-8")
    if plain and ct.lower().startswith("text/"):
        try:
            return "data", json.dumps(raw.decode("utf-8"), ensure_ascii=False)
        except UnicodeDecodeError:
            pass
    return "data_base64", json.dumps(base64.b64encode(raw).decode("ascii"))


def to_kafka_structured(env: Envelope) -> Record:
    """Structured content mode: `content-type: application/cloudevents+json`, value = the event."""
    attrs, key, dropped = envelope_attributes(env)
    event = _sdk_event(attrs, None)
    msg = ce_kafka.to_structured(event, JSONFormat(), key_mapper=lambda _e: key)
    value = msg.value
    member = _data_member(env, attrs.get("datacontenttype", ""))
    if member is not None:
        # Splice the data member in after the SDK wrote the attributes: the SDK would re-encode
        # JSON data (changing its bytes); this keeps the payload exactly as in the envelope.
        name, text = member
        value = value[:-1].rstrip() + f', "{name}": {text}}}'.encode()
    headers = [(name, v) for name, v in msg.headers.items()]
    return Record(key, value, headers, dropped)


# --------------------------------------------------------------------------- CloudEvent -> envelope


def _require(attrs: Mapping[str, Any], where: str) -> None:
    for name in _CORE:
        v = attrs.get(name)
        if v is None:
            raise CloudEventError(f"required attribute {name!r} is missing", path=f"{where}{name}",
                                  hint="a CloudEvent needs specversion, id, source and type")
        if not isinstance(v, str) or not v:
            raise CloudEventError(f"required attribute {name!r} must be a non-empty string", path=f"{where}{name}")
    if attrs["specversion"] != SPECVERSION:
        raise CloudEventError(f"specversion {attrs['specversion'][:20]!r} is not supported",
                              path=f"{where}specversion", hint=f"this reader supports CloudEvents {SPECVERSION}")


def _as_text(name: str, value: Any, where: str) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value
    if isinstance(value, int):
        return str(value)
    raise CloudEventError(f"attribute {name!r} has a {type(value).__name__} value", path=where,
                          hint="CloudEvents attribute values are strings, integers, booleans or timestamps")


def _int_attr(name: str, text: str, lo: int, hi: int, where: str) -> int:
    if not re.fullmatch(r"-?[0-9]{1,19}", text) or not lo <= int(text) <= hi:
        raise CloudEventError(f"{name} {text[:30]!r} is not an integer in {lo}..{hi}", path=where)
    return int(text)


def _json_attr(name: str, text: str, kind: type, where: str) -> Any:
    try:
        value = _json.loads(text)
    except ValueError:
        raise CloudEventError(f"{name} is not JSON", path=where) from None
    if not isinstance(value, kind):
        raise CloudEventError(f"{name} must be a JSON {kind.__name__}", path=where)
    return value


def attributes_to_envelope(
    attrs: Mapping[str, Any],
    data: bytes,
    *,
    topic: str,
    namespace: str,
    where: str = "",
    key: bytes | None = None,
    json_data: bool = False,
    now_ms: int | None = None,
) -> Decoded:
    """Map validated-shape attributes + raw data bytes onto a new envelope (see module table).

    `json_data` says the data came from a structured event's `data` member with no
    datacontenttype, which the JSON event format defines as application/json.
    """
    _require(attrs, where)
    notes: list[str] = []
    env = Envelope(payload=Payload(data))
    md = env.metadata
    md.message_id = attrs["id"]
    md.topic, md.namespace = topic, namespace
    text: dict[str, str] = {}
    for name, value in attrs.items():
        if value is None:
            continue
        if name == "time":
            if isinstance(value, datetime):
                value = _attr_text(value)
            elif not isinstance(value, str):
                raise CloudEventError("time must be an RFC 3339 string", path=f"{where}time")
        text[name] = _as_text(name, value, f"{where}{name}")
    if text["source"] != SOURCE_PREFIX + namespace:
        env.ensure_security().publisher_id = text["source"]
    if text["type"] != topic:
        env.ensure_schema().schema_name = text["type"]
    if "time" in text:
        md.published_at_ms = ms_from_rfc3339(text["time"], f"{where}time", CloudEventError)
    else:
        md.published_at_ms = now_ms if now_ms is not None else int(time.time() * 1000)
        notes.append("event has no time; metadata.published_at_ms set to now")
    ct = text.get("datacontenttype")
    if ct is not None:
        if not ct:
            raise CloudEventError("datacontenttype must not be empty", path=f"{where}datacontenttype")
        set_content_type(md, ct)
    elif json_data:
        set_content_type(md, "application/json")
    if "dataschema" in text:
        env.ensure_schema().schema_url = text["dataschema"]
    if "traceparent" in text:
        tp = parse_traceparent(text["traceparent"])
        if tp is None:
            # W3C Trace Context: a receiver ignores a traceparent it cannot parse. Keep the text.
            env.extensions[EXTENSION_PREFIX + "traceparent"] = text["traceparent"].encode("utf-8")
            notes.append("traceparent is not valid W3C trace context; kept in extensions['ce.traceparent']")
        else:
            obs = env.ensure_observability()
            obs.trace_id, obs.span_id, obs.trace_flags = tp.trace_id, tp.parent_id, tp.propagated_flags()
    if "tracestate" in text:
        env.extensions[TRACESTATE_EXTENSION] = text["tracestate"].encode("utf-8")
    if "dataclassification" in text:
        cls = text["dataclassification"]
        if cls not in CLASSIFICATIONS:
            raise CloudEventError(f"dataclassification {cls[:30]!r} is unknown", path=f"{where}dataclassification",
                                  hint=f"use one of {sorted(CLASSIFICATIONS)}")
        env.ensure_security().data_classification = cls
    if "partitionkey" in text:
        env.extensions[KEY_EXTENSION] = text["partitionkey"].encode("utf-8")
    if key is not None:
        if "partitionkey" in text and text["partitionkey"].encode("utf-8") != key:
            notes.append("partitionkey attribute differs from the Kafka record key; the record key wins")
        env.extensions[KEY_EXTENSION] = bytes(key)
    _apply_prism_attributes(env, text, where, notes)
    for name, value in text.items():
        if name in RESERVED:
            continue
        env.extensions[EXTENSION_PREFIX + name] = value.encode("utf-8")
    return Decoded(env, notes)


def _apply_prism_attributes(env: Envelope, t: Mapping[str, str], where: str, notes: list[str]) -> None:
    md = env.metadata
    w = where
    if A_TYPE_URL in t:
        env.payload = Payload(env.payload.value, t[A_TYPE_URL])
    if A_PRIORITY in t:
        md.priority = _int_attr(A_PRIORITY, t[A_PRIORITY], 0, 10, w + A_PRIORITY)
    if A_TTL in t:
        md.ttl_seconds = _int_attr(A_TTL, t[A_TTL], 0, MAX_MS, w + A_TTL)
    if A_CORRELATION in t:
        md.correlation_id = t[A_CORRELATION]
    if A_CAUSALITY in t:
        md.causality_parent = t[A_CAUSALITY]
    if A_ENCODING in t:
        set_content_encoding(md, t[A_ENCODING])
    if A_TEAM in t:
        env.ensure_security().publisher_team = t[A_TEAM]
    if A_PII in t:
        if t[A_PII] not in ("true", "false"):
            raise CloudEventError(f"{A_PII} must be true or false", path=w + A_PII)
        env.ensure_security().contains_pii = t[A_PII] == "true"
    if A_ENCRYPTION in t:
        try:
            enc = pb.EncryptionMetadata.FromString(base64.b64decode(t[A_ENCRYPTION], validate=True))
        except Exception:  # binascii.Error or upb's DecodeError
            raise CloudEventError(f"{A_ENCRYPTION} is not base64 of an EncryptionMetadata message",
                                  path=w + A_ENCRYPTION) from None
        env.ensure_security().encryption.CopyFrom(enc)
    for attr, name in ((A_SCHEMA_VERSION, "schema_version"), (A_SCHEMA_FORMAT, "schema_format"),
                       (A_SCHEMA_HASH, "schema_hash"), (A_COMPAT, "compatibility_mode")):
        if attr in t:
            setattr(env.ensure_schema(), name, t[attr])
    if A_DEPRECATED in t:
        fields = _json_attr(A_DEPRECATED, t[A_DEPRECATED], list, w + A_DEPRECATED)
        if not all(isinstance(f, str) for f in fields):
            raise CloudEventError(f"{A_DEPRECATED} must be a JSON list of strings", path=w + A_DEPRECATED)
        env.ensure_schema().deprecated_fields_used.extend(fields)
    for attr, name, pattern in ((A_TRACE_ID, "trace_id", _HEX32), (A_SPAN_ID, "span_id", _HEX16),
                                (A_PARENT_SPAN, "parent_span_id", _HEX16)):
        if attr in t:
            if not pattern.fullmatch(t[attr]):
                raise CloudEventError(f"{attr} is not lowercase hex of the W3C length", path=w + attr)
            setattr(env.ensure_observability(), name, t[attr])
    if A_TRACE_FLAGS in t:
        env.ensure_observability().trace_flags = _int_attr(A_TRACE_FLAGS, t[A_TRACE_FLAGS], -(2**31), 2**31 - 1,
                                                           w + A_TRACE_FLAGS)
    for attr, target in ((A_BAGGAGE, "baggage"), (A_LABELS, "labels")):
        if attr in t:
            m = _json_attr(attr, t[attr], dict, w + attr)
            if not all(isinstance(v, str) for v in m.values()):
                raise CloudEventError(f"{attr} must map strings to strings", path=w + attr)
            getattr(env.ensure_observability(), target).update(m)
    if A_EXTENSIONS in t:
        m = _json_attr(A_EXTENSIONS, t[A_EXTENSIONS], dict, w + A_EXTENSIONS)
        for k, v in m.items():
            try:
                raw = base64.b64decode(v, validate=True) if isinstance(v, str) else None
            except (binascii.Error, ValueError):
                raw = None
            if raw is None:
                raise CloudEventError(f"{A_EXTENSIONS}[{k[:30]!r}] is not a base64 string", path=w + A_EXTENSIONS)
            if k in env.extensions:
                notes.append(f"{A_EXTENSIONS}[{k[:30]!r}] ignored: the event sets that extension directly")
                continue
            env.extensions[k] = raw


def from_cloudevent(event: BaseCloudEvent, *, topic: str, namespace: str, key: bytes | None = None,
                    now_ms: int | None = None) -> Decoded:
    """An SDK CloudEvent as an envelope. Bytes data is kept as is; str data is UTF-8 encoded;
    dict/list data (already parsed by the SDK) is serialized as compact JSON - say so in notes."""
    data = event.get_data()
    notes: list[str] = []
    if data is None:
        raw = b""
    elif isinstance(data, bytes | bytearray):
        raw = bytes(data)
    elif isinstance(data, str):
        raw = data.encode("utf-8")
    else:
        raw = _json.dumps_compact(data)
        notes.append("event data was a parsed JSON value; the payload is its compact JSON serialization")
    attrs = dict(event.get_attributes())
    decoded = attributes_to_envelope(attrs, raw, topic=topic, namespace=namespace, key=key, now_ms=now_ms,
                                     json_data=not isinstance(data, bytes | bytearray | str | type(None)))
    decoded.notes[:0] = notes
    return decoded


# --------------------------------------------------------------------------- Kafka binding, reading


def is_structured(headers: Sequence[tuple[str, bytes]]) -> bool:
    """Structured mode: a `content-type` header starting with application/cloudevents."""
    for name, value in header_pairs(headers):
        if name == "content-type" and value.strip().lower().startswith(STRUCTURED_PREFIX.encode()):
            return True
    return False


def is_binary(headers: Sequence[tuple[str, bytes]]) -> bool:
    """Binary mode: any `ce_` header (and not structured)."""
    return any(name.lower().startswith(CE_PREFIX) for name, _ in headers) and not is_structured(headers)


def _other_headers(env: Envelope, pairs: list[tuple[str, bytes]], skip: set[str], notes: list[str]) -> None:
    auth = take_auth_token(pairs)
    notes += auth.notes
    set_auth_token(env, auth.token, notes, "Kafka headers")
    for name, value in pairs:
        if name in skip or name in auth.consumed or name.startswith(CE_PREFIX):
            continue
        ext = HEADER_EXTENSION_PREFIX + name
        env.extensions[ext] = env.extensions[ext] + b", " + value if ext in env.extensions else value


def from_kafka_binary(value: bytes | memoryview, headers: Sequence[tuple[str, bytes | str]], key: bytes | None = None,
                      *, topic: str, namespace: str, now_ms: int | None = None) -> Decoded:
    pairs = header_pairs(headers)
    attrs: dict[str, str] = {}
    for name, raw in pairs:
        if name.startswith(CE_PREFIX):
            attr = name[len(CE_PREFIX):]
        elif name == "content-type":
            attr = "datacontenttype"
        else:
            continue
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise CloudEventError(f"header {name} is not UTF-8", path=f"header {name}",
                                  hint="CloudEvents Kafka headers carry UTF-8 strings") from None
        if attr in attrs and attrs[attr] != text:
            raise CloudEventError(f"header {name} appears twice with different values", path=f"header {name}",
                                  hint="send each attribute once")
        attrs[attr] = text
    if "specversion" not in attrs:
        raise CloudEventError("binary-mode event has no ce_specversion header", path="header ce_specversion",
                              hint="binary mode needs ce_specversion, ce_id, ce_source and ce_type headers")
    data = bytes(value)
    decoded = attributes_to_envelope(attrs, data, topic=topic, namespace=namespace, where="header ce_", key=key,
                                     now_ms=now_ms)
    _validate_with_sdk(attrs, data)
    _other_headers(decoded.envelope, pairs, {"content-type"}, decoded.notes)
    return decoded


def _validate_with_sdk(attrs: Mapping[str, Any], data: Any) -> None:
    """Let the SDK apply its checks too (extension names, optional attribute types)."""
    checked = {k: v for k, v in attrs.items() if v is not None}
    if isinstance(checked.get("time"), str):
        checked["time"] = datetime_from_ms(ms_from_rfc3339(checked["time"], "time", CloudEventError))
    _sdk_event(checked, data if data else None)


def from_kafka_structured(value: bytes | memoryview, headers: Sequence[tuple[str, bytes | str]] = (),
                          key: bytes | None = None, *, topic: str, namespace: str,
                          now_ms: int | None = None) -> Decoded:
    pairs = header_pairs(headers)
    for name, raw in pairs:
        if name == "content-type":
            ct = raw.decode("latin-1").strip().lower()
            if ct.startswith(STRUCTURED_PREFIX) and not ct.split(";")[0].strip() == STRUCTURED_JSON:
                raise CloudEventError(f"structured event format {ct[:60]!r} is not supported", path="header content-type",
                                      hint=f"send {STRUCTURED_JSON} (the JSON event format)")
    try:
        text = bytes(value).decode("utf-8")
        members = _json.scan_object(text)
    except UnicodeDecodeError as exc:
        raise CloudEventError(f"structured event is not UTF-8 (byte {exc.start})", path="value") from None
    except ValueError as exc:
        raise CloudEventError(f"structured event is not one JSON object: {exc}", path="value",
                              hint="the value must be a JSON-format CloudEvent") from None
    if "data" in members and "data_base64" in members:
        raise CloudEventError("event has both data and data_base64", path="value",
                              hint="the JSON event format allows only one of them")
    attrs = {k: m.value for k, m in members.items() if k not in ("data", "data_base64")}
    for k, v in attrs.items():
        if isinstance(v, dict | list | float):
            raise CloudEventError(f"attribute {k!r} has a JSON {type(v).__name__} value", path=f"value.{k}",
                                  hint="attribute values are strings, integers or booleans")
    ct = attrs.get("datacontenttype")
    json_data = False
    if "data_base64" in members:
        b64 = members["data_base64"].value
        try:
            if not isinstance(b64, str):
                raise ValueError
            data = base64.b64decode(b64, validate=True)
        except (binascii.Error, ValueError):
            raise CloudEventError("data_base64 is not a base64 string", path="value.data_base64") from None
    elif "data" in members:
        m = members["data"]
        if isinstance(ct, str) and not is_json_content_type(ct) and isinstance(m.value, str):
            try:
                data = m.value.encode("utf-8")
            except UnicodeEncodeError:
                raise CloudEventError("text data holds a lone UTF-16 surrogate escape", path="value.data",
                                      hint="send binary data as data_base64") from None
        else:
            data = text[m.start : m.end].encode("utf-8")
            json_data = ct is None
    else:
        data = b""
    decoded = attributes_to_envelope(attrs, data, topic=topic, namespace=namespace, where="value.", key=key,
                                     json_data=json_data, now_ms=now_ms)
    _validate_with_sdk(attrs, data)
    _other_headers(decoded.envelope, pairs, {"content-type"}, decoded.notes)
    return decoded


def from_kafka(value: bytes | memoryview, headers: Sequence[tuple[str, bytes | str]], key: bytes | None = None,
               *, topic: str, namespace: str, now_ms: int | None = None) -> Decoded:
    """Either content mode, chosen as the Kafka binding says (structured content type first)."""
    if is_structured(headers):
        return from_kafka_structured(value, headers, key, topic=topic, namespace=namespace, now_ms=now_ms)
    return from_kafka_binary(value, headers, key, topic=topic, namespace=namespace, now_ms=now_ms)


__all__ = [
    "KEY_EXTENSION", "STRUCTURED_JSON", "Converted", "Decoded", "Record", "attributes_to_envelope",
    "from_cloudevent", "from_kafka", "from_kafka_binary", "from_kafka_structured", "is_binary", "is_structured",
    "to_cloudevent", "to_kafka_binary", "to_kafka_structured",
]

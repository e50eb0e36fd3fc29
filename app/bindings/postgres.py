"""PostgreSQL binding (RFC-031 "PostgreSQL: Envelope as JSONB Column").

One envelope is one `prism_events` row (`DDL`): `message_id` (UNIQUE, so a re-delivered
message is an idempotent `ON CONFLICT DO NOTHING`), `topic`, `published_at`, `consumed`, and
`envelope`, a JSONB document:

* the header (metadata and the optional contexts, extensions) is protobuf's JSON mapping
  (`MessageToDict`) of the reviewed-layout header with the `.proto` field names
  (`published_at_ms`, not `publishedAtMs`), because those are the names SQL authors see in the
  `.proto` and the RFC. Per proto3 JSON, int64 values (`published_at_ms`, `ttl_seconds`) are
  strings, enums are names (`CONTENT_TYPE_JSON`), bytes are base64;
* `payload` is `{"type_url"?, "json"?, "base64"?}`:
  - `json`: the payload parsed, inline and queryable
    (`envelope @> '{"payload": {"json": {"status": "paid"}}}'`, GIN-indexed), present when the
    content type is JSON (`application/json` or `*+json`), the payload is neither encrypted
    nor compressed, and the value is UTF-8 JSON that JSONB can store (no U+0000, no lone
    surrogates, finite numbers);
  - `base64`: the exact payload bytes. Omitted only when the bytes can be rebuilt exactly
    from `json`, i.e. they already are its canonical form (compact, keys sorted, no
    exponent floats, no -0.0), which survives JSONB's own normalisation (it reorders keys
    and rewrites numbers). Otherwise both are stored: `json` for queries, `base64` for the
    byte-exact round trip - signatures cover those bytes;
  - `type_url`: the `Any` type URL when set;
* `unknown_fields`: `{path: base64}` for protobuf fields this Prism does not know (from newer
  producers); protobuf's JSON mapping would drop them, this keeps the round trip lossless.

`to_document`/`from_document` are the pure mapping; `encode`/`decode` add the row columns and
cross-check them against the document (`BindingError` when they disagree).
"""

from __future__ import annotations

import base64
import binascii
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from google.protobuf.json_format import MessageToDict, ParseDict, ParseError
from google.protobuf.message import Message
from google.protobuf.unknown_fields import UnknownFieldSet

from .._gen.prism.envelope.v1 import envelope_pb2 as pb
from ..envelope.codec import Layout, detect_layout
from ..envelope.model import Envelope, Payload
from ..envelope.wire import iter_records
from ..errors import BindingError, DecodeError

TABLE = "prism_events"

DDL = f"""\
CREATE TABLE IF NOT EXISTS {TABLE} (
  id           BIGSERIAL PRIMARY KEY,
  message_id   TEXT NOT NULL UNIQUE,              -- idempotent inserts: ON CONFLICT DO NOTHING
  topic        TEXT NOT NULL,
  envelope     JSONB NOT NULL,                    -- app.bindings.postgres.to_document()
  published_at TIMESTAMPTZ NOT NULL DEFAULT NOW(),
  consumed     BOOLEAN NOT NULL DEFAULT FALSE
);
CREATE INDEX IF NOT EXISTS idx_events_topic_consumed ON {TABLE} (topic, consumed);
CREATE INDEX IF NOT EXISTS idx_events_envelope ON {TABLE} USING GIN (envelope jsonb_path_ops);
"""
"""`jsonb_path_ops` serves the containment queries (`@>`) that filtering by envelope fields
needs, with a smaller and faster index than the default `jsonb_ops` (which would add key
existence operators nobody needs on a fixed schema)."""

#: Parameters: EventRow.params(). Text cast to jsonb so no driver-specific JSON adapter is needed.
INSERT_SQL = (
    f"INSERT INTO {TABLE} (message_id, topic, envelope, published_at) "
    "VALUES (%s, %s, %s::jsonb, %s) ON CONFLICT (message_id) DO NOTHING"
)

PAYLOAD_KEY = "payload"
UNKNOWN_KEY = "unknown_fields"
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MS = timedelta(milliseconds=1)
# Nested messages whose unknown fields are preserved (map entries are not worth it).
_SUBMESSAGES = ("metadata", "security", "security.encryption", "observability", "schema")


@dataclass(frozen=True, slots=True)
class EventRow:
    """One `prism_events` row as `encode` builds it (id/consumed are the table's defaults)."""

    message_id: str
    topic: str
    envelope: dict[str, Any]
    published_at: datetime

    def envelope_json(self) -> str:
        return json.dumps(self.envelope, ensure_ascii=False, separators=(",", ":"), allow_nan=False)

    def params(self) -> tuple[str, str, str, datetime]:
        """Parameters for `INSERT_SQL`, in order."""
        return (self.message_id, self.topic, self.envelope_json(), self.published_at)


# --------------------------------------------------------------------------- payload <-> JSON


def _is_json_type(mime: str) -> bool:
    base = mime.split(";", 1)[0].strip().lower()
    return base == "application/json" or (base.startswith("application/") and base.endswith("+json"))


def _utf8_ok(text: str) -> bool:
    # Strict UTF-8 refuses exactly the code points U+D800-U+DFFF (lone surrogates): one C
    # call instead of a Python loop over every character.
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _jsonb_ok(obj: Any) -> bool:
    """`_jsonb_problem(obj) is None`, without building a path string per key and value: the
    walk every publish pays (the paths are only worked out for an object that has a problem)."""
    if isinstance(obj, str):
        return "\x00" not in obj and (obj.isascii() or _utf8_ok(obj))
    # Plain loops, not all(<generator>): a generator frame per container costs more here.
    if isinstance(obj, dict):
        for k, v in obj.items():  # noqa: SIM110
            if not (_jsonb_ok(k) and _jsonb_ok(v)):
                return False
        return True
    if isinstance(obj, list):
        for v in obj:  # noqa: SIM110
            if not _jsonb_ok(v):
                return False
        return True
    return not isinstance(obj, float) or math.isfinite(obj)


def _jsonb_problem(obj: Any, path: str = "") -> str | None:
    """Why JSONB would refuse `obj` (None when it would not)."""
    return None if _jsonb_ok(obj) else _problem_at(obj, path)


def _problem_at(obj: Any, path: str) -> str | None:
    if isinstance(obj, str):
        if "\x00" in obj:
            return f"{path or 'value'} contains U+0000, which JSONB cannot store"
        if not _utf8_ok(obj):
            return f"{path or 'value'} contains a lone UTF-16 surrogate"
        return None
    if isinstance(obj, float) and not math.isfinite(obj):
        return f"{path or 'value'} is not a finite number"
    if isinstance(obj, dict):
        for k, v in obj.items():
            problem = _problem_at(k, f"{path}.{k!r}") or _problem_at(v, f"{path}.{k}")
            if problem:
                return problem
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            problem = _problem_at(v, f"{path}[{i}]")
            if problem:
                return problem
    return None


def _numbers_stable(obj: Any) -> bool:
    """True when JSONB's numeric output re-parses to the same Python value and text."""
    if isinstance(obj, float):
        text = repr(obj)
        return "e" not in text and text != "-0.0"
    if isinstance(obj, dict):
        return all(_numbers_stable(v) for v in obj.values())
    if isinstance(obj, list):
        return all(_numbers_stable(v) for v in obj)
    return True


def _keys_sorted(obj: dict[str, Any]) -> bool:
    keys = list(obj)
    return keys == sorted(keys)  # dict keys are unique: sorted order is strictly increasing


def canonical_json(obj: Any) -> bytes:
    """The canonical text a `json`-only payload is rebuilt as: compact, keys sorted, UTF-8."""
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"), sort_keys=True, allow_nan=False).encode()


def _payload_doc(env: Envelope) -> dict[str, Any]:
    p = env.payload
    out: dict[str, Any] = {}
    if p.type_url:
        out["type_url"] = p.type_url
    inline = (
        not env.is_encrypted
        and env.content_encoding in ("", "none")
        and _is_json_type(env.content_type)
    )
    _add_payload(out, bytes(p.value), inline, encoder_text=False)
    return out


def encoder_json_payload_doc(value: bytes) -> dict[str, Any]:
    """The `payload` member of the document of an envelope whose payload is `value`, JSON
    text that `json.dumps`/`JSONEncoder(ensure_ascii=False)` wrote from Python objects and
    that was then UTF-8 encoded (no type URL, not encrypted, not compressed, a JSON content
    type): what the SDK publishes for a dict or list. The same member `to_document` builds,
    with a cheaper storability check (see `_add_payload`)."""
    out: dict[str, Any] = {}
    _add_payload(out, value, True, encoder_text=True)
    return out


def _add_payload(out: dict[str, Any], value: bytes, inline: bool, *, encoder_text: bool) -> None:
    parsed: Any = None
    if inline:
        try:
            parsed = json.loads(value.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError):
            inline = False
    # Encoder-written text holds U+0000 only as a \u escape (a lone surrogate cannot be
    # UTF-8 encoded at all) and a non-finite number only as NaN/Infinity (a finite float's
    # repr parses back finite): without those, the walk over every value cannot fail.
    if inline and ((encoder_text and b"\\u" not in value and b"NaN" not in value and b"Infinity" not in value)
                   or _jsonb_problem(parsed) is None):
        out["json"] = parsed
        # The canonical text sorts object keys, so a document whose top-level keys are not in
        # sorted order cannot be canonical: that check is free, the serialization is not.
        # Then the text comparison (one C call) before the Python walk over the numbers.
        try:
            exact = (not isinstance(parsed, dict) or _keys_sorted(parsed)) and canonical_json(parsed) == value \
                and _numbers_stable(parsed)
        except (ValueError, UnicodeEncodeError):
            exact = False
        if exact:
            return
    out["base64"] = base64.b64encode(value).decode("ascii")


def _payload_from_doc(doc: Any) -> Payload:
    if not isinstance(doc, dict):
        raise BindingError("envelope document's payload must be an object", path="envelope.payload")
    type_url = doc.get("type_url", "")
    if not isinstance(type_url, str):
        raise BindingError("payload.type_url must be a string", path="envelope.payload.type_url")
    if "base64" in doc:
        b64 = doc["base64"]
        if not isinstance(b64, str):
            raise BindingError("payload.base64 must be a string", path="envelope.payload.base64")
        try:
            value = base64.b64decode(b64, validate=True)
        except (binascii.Error, ValueError):
            raise BindingError("payload.base64 is not valid base64", path="envelope.payload.base64") from None
    elif "json" in doc:
        try:
            value = canonical_json(doc["json"])
        except (TypeError, ValueError) as exc:
            raise BindingError(f"payload.json cannot be serialized: {exc}", path="envelope.payload.json") from None
    else:
        raise BindingError("envelope document's payload has neither 'json' nor 'base64'",
                           path="envelope.payload", hint="write rows with app.bindings.postgres.encode")
    return Payload(value, type_url)


# --------------------------------------------------------------------------- unknown fields


def _submessage(root: Message, path: str) -> Message | None:
    msg = root
    for part in path.split("."):
        if not msg.HasField(part):  # type: ignore[arg-type]
            return None
        msg = getattr(msg, part)
    return msg


def _unknown_bytes(msg: Message) -> bytes:
    if not len(UnknownFieldSet(msg)):
        # No unknown fields: every record of the serialization is a known field, so the scan
        # below would find nothing. upb answers this without serializing (the usual case).
        return b""
    known = msg.DESCRIPTOR.fields_by_number
    data = msg.SerializeToString()
    return b"".join(data[r.start : r.end] for r in iter_records(data) if r.field not in known)


def _collect_unknown(header: pb.PrismEnvelope) -> dict[str, str]:
    out: dict[str, str] = {}
    for path, msg in [("", header), *((p, _submessage(header, p)) for p in _SUBMESSAGES)]:
        if msg is None:
            continue
        try:
            raw = _unknown_bytes(msg)
        except DecodeError as exc:  # unknown group-encoded fields: not representable
            raise BindingError(f"unknown fields of {path or 'envelope'} cannot be stored: {exc.message}",
                               path=path or "envelope") from None
        if raw:
            out[path] = base64.b64encode(raw).decode("ascii")
    return out


def _restore_unknown(header: pb.PrismEnvelope, doc: Any) -> None:
    if not isinstance(doc, dict):
        raise BindingError("unknown_fields must be an object", path=f"envelope.{UNKNOWN_KEY}")
    for path, b64 in doc.items():
        target = header if path == "" else (_submessage(header, path) if path in _SUBMESSAGES else None)
        if target is None or not isinstance(b64, str):
            raise BindingError(f"unknown_fields entry {path!r} does not name a present message",
                               path=f"envelope.{UNKNOWN_KEY}")
        try:
            target.MergeFromString(base64.b64decode(b64, validate=True))
        except Exception:  # binascii.Error or protobuf's DecodeError
            raise BindingError(f"unknown_fields entry {path!r} is not base64 protobuf",
                               path=f"envelope.{UNKNOWN_KEY}") from None


# --------------------------------------------------------------------------- document


def _check_storable(obj: Any, path: str) -> None:
    problem = _jsonb_problem(obj, path)
    if problem:
        raise BindingError(f"envelope cannot be stored as JSONB: {problem}", path=path,
                           hint="reject control characters in metadata (validation sanity policy) before the sink")


#: Optional member holding the exact envelope bytes a row was made from: `{"layout", "base64"}`.
#: Rebuilding bytes from JSON is not byte-exact in general (protobuf does not fix the order
#: of map entries), and signatures cover the bytes, so a sink that has them stores them.
WIRE_KEY = "wire"


def to_document(env: Envelope, *, wire: bytes | None = None) -> dict[str, Any]:
    """The JSONB document for an envelope (module docs). Raises `BindingError` for text JSONB
    cannot hold (U+0000). `wire`: the exact bytes `env` was decoded from, kept for a
    byte-exact round trip (see `WIRE_KEY`)."""
    doc: dict[str, Any] = MessageToDict(env.header, preserving_proto_field_name=True)
    _check_storable(doc, "envelope")
    unknown = _collect_unknown(env.header)
    if unknown:
        doc[UNKNOWN_KEY] = unknown
    if env.payload.present:
        doc[PAYLOAD_KEY] = _payload_doc(env)
    if wire is not None:
        doc[WIRE_KEY] = {"layout": detect_layout(wire).value, "base64": base64.b64encode(wire).decode("ascii")}
    return doc


def wire_of(doc: Mapping[str, Any] | None) -> tuple[Layout, bytes] | None:
    """The exact envelope bytes stored in a document, with their layout (None if not stored)."""
    w = doc.get(WIRE_KEY) if isinstance(doc, Mapping) else None
    if not isinstance(w, Mapping):
        return None
    try:
        return Layout(w["layout"]), base64.b64decode(w["base64"], validate=True)
    except (KeyError, ValueError, TypeError, binascii.Error):
        raise BindingError("envelope.wire is malformed", path=f"{TABLE}.envelope.wire") from None


def _safe_parse_message(exc: Exception) -> str:
    text = str(exc)
    # ParseError texts can quote the offending value; never echo credential fields.
    if any(word in text for word in ("auth_token", "authToken", "signature")):
        return "a security field has the wrong type"
    return text[:300]


def from_document(doc: Mapping[str, Any] | str | bytes) -> Envelope:
    """The envelope a `to_document` document (or its JSON text) describes; the payload bytes
    are exactly the ones encoded."""
    if isinstance(doc, str | bytes | bytearray):
        try:
            doc = json.loads(doc)
        except (ValueError, RecursionError):
            raise BindingError("envelope column is not valid JSON", path="envelope") from None
    if not isinstance(doc, Mapping):
        raise BindingError(f"envelope document must be a JSON object, got {type(doc).__name__}", path="envelope")
    body = dict(doc)
    body.pop(WIRE_KEY, None)
    payload_doc = body.pop(PAYLOAD_KEY, None)
    unknown_doc = body.pop(UNKNOWN_KEY, None)
    header = pb.PrismEnvelope()
    try:
        ParseDict(body, header)
    except (ParseError, TypeError, ValueError) as exc:
        raise BindingError(f"envelope document does not match prism.envelope.v1.PrismEnvelope: "
                           f"{_safe_parse_message(exc)}", path="envelope",
                           hint="write rows with app.bindings.postgres.encode") from None
    if unknown_doc is not None:
        _restore_unknown(header, unknown_doc)
    payload = Payload.absent() if payload_doc is None else _payload_from_doc(payload_doc)
    return Envelope(header, payload)


# --------------------------------------------------------------------------- row


def published_at(ms: int) -> datetime:
    try:
        return _EPOCH + ms * _MS
    except OverflowError:
        raise BindingError(f"published_at_ms {ms} is outside the TIMESTAMPTZ range",
                           path="metadata.published_at_ms") from None


def encode(env: Envelope, *, wire: bytes | None = None) -> EventRow:
    """The `prism_events` row for an envelope (`wire`: its exact bytes, when known)."""
    return EventRow(
        message_id=env.message_id,
        topic=env.topic,
        envelope=to_document(env, wire=wire),
        published_at=published_at(env.published_at_ms),
    )


def decode(row: EventRow | Mapping[str, Any]) -> Envelope:
    """The envelope of a `prism_events` row (an `EventRow`, or a mapping such as psycopg's
    `dict_row`). Columns present in the row must agree with the document (`BindingError`)."""
    get = (lambda k: getattr(row, k, None)) if isinstance(row, EventRow) else row.get
    if get("envelope") is None:
        raise BindingError("row has no envelope column", path=f"{TABLE}.envelope")
    env = from_document(get("envelope"))
    for column, expected in (("message_id", env.message_id), ("topic", env.topic)):
        value = get(column)
        if value is not None and value != expected:
            raise BindingError(f"row column {column} is {value!r} but the envelope says {expected!r}",
                               path=f"{TABLE}.{column}", hint="the row was edited after it was written")
    at = get("published_at")
    if isinstance(at, datetime):
        aware = at if at.tzinfo is not None else at.replace(tzinfo=UTC)
        if (aware - _EPOCH) // _MS != env.published_at_ms:
            raise BindingError(f"row column published_at is {aware.isoformat()} but the envelope's "
                               f"published_at_ms is {env.published_at_ms}", path=f"{TABLE}.published_at")
    return env

"""Building an envelope out of loosely typed metadata: the part every input shape shares.

Each shape (Kafka headers, NATS headers, Redis `meta`, CloudEvents, LNMP) first *names* what
it found - "this header is the correlation id" - as `Found` entries keyed by a logical field
name. `apply_found` then turns those strings into envelope fields with one set of parsing rules
(timestamps, trace ids, priorities ...), so a Kafka `timestamp` header and a Redis `meta.ts`
can never be read two different ways. Anything that cannot be mapped (a trace id that is not
W3C, a header nobody knows) is kept in the envelope's extensions under the shape's own key
(`header.<name>`, `meta.<key>`), so no producer metadata is silently lost.

`finalize` fills what the producer did not send (UUIDv7 message id, publish time now, topic and
namespace from the transport) and refuses to return an envelope that would fail
`required_problems`: a normalized envelope is always valid.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone
from urllib.parse import unquote

from ..bindings.tracecontext import TRACESTATE_EXTENSION, parse_traceparent
from ..envelope.ids import new_message_id, uuid7_from_seed
from ..envelope.model import Envelope, get_content_type, set_content_encoding, set_content_type
from ..envelope.validation import CLASSIFICATIONS, required_problems
from ..errors import FormatError

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
MAX_MS = (1 << 63) - 1
#: Extension key of a registry schema id (`schema-id: 123`); SchemaContext has no id field.
SCHEMA_ID_EXTENSION = "schema.id"

_RFC3339 = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})[Tt](\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?([Zz]|[+-]\d{2}:\d{2})"
)
_DECIMAL = re.compile(r"[0-9]{1,20}(?:\.[0-9]{1,9})?")
_HEX32 = re.compile(r"[0-9a-fA-F]{32}")
_HEX16 = re.compile(r"[0-9a-fA-F]{16}")
_BOOL = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}

#: Header names whose value is an auth token, in priority order (first present wins).
TOKEN_HEADERS: tuple[str, ...] = ("prism-auth-token", "authorization", "x-auth-token", "auth-token", "x-api-key")
#: Credential headers that are not Prism tokens: dropped, never copied anywhere.
SECRET_HEADERS: frozenset[str] = frozenset({"proxy-authorization", "cookie", "set-cookie"})
#: Every header name `take_auth_token` reads: for pairs with none of them it finds no token,
#: consumes nothing and notes nothing, so a caller may skip it (a live producer's headers are
#: nearly always tracing and application headers, none of these).
AUTH_HEADERS: frozenset[str] = frozenset(TOKEN_HEADERS) | SECRET_HEADERS


# --------------------------------------------------------------------------- headers


def header_pairs(headers: Iterable[tuple[str, bytes | str]] | None) -> list[tuple[str, bytes]]:
    """(lowercased name, bytes value) pairs in their original order.

    Kafka header names are case-sensitive on the wire, but every convention Prism reads
    (CloudEvents `ce_`, NATS's HTTP-style names, legacy `Correlation-Id` spellings) is compared
    case-insensitively here, so a producer's capitalization never changes the meaning.
    """
    out: list[tuple[str, bytes]] = []
    for name, value in headers or ():
        if isinstance(value, str):
            value = value.encode("utf-8")
        elif value is None:
            value = b""
        out.append((name.lower(), bytes(value)))
    return out


def header_text(value: bytes, where: str, error: type[FormatError]) -> str:
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        raise error("header value is not valid UTF-8", path=where,
                    hint="metadata headers carry UTF-8 text; put binary data in the payload") from None


@dataclass(slots=True)
class AuthResult:
    token: str | None
    consumed: set[str]
    notes: list[str]


def take_auth_token(pairs: Sequence[tuple[str, bytes]]) -> AuthResult:
    """Find the producer's auth token among the headers.

    The token goes to `security.auth_token` and nowhere else: the names returned in `consumed`
    must never be copied into extensions, and notes name headers, never values.
    `Authorization: Bearer <t>` yields `<t>`; another scheme keeps the whole value, so the auth
    stage rejects it instead of Prism guessing what it means.
    """
    found: dict[str, bytes] = {}
    consumed: set[str] = set()
    notes: list[str] = []
    for name, value in pairs:
        if name in TOKEN_HEADERS or name in SECRET_HEADERS:
            consumed.add(name)
            if name in TOKEN_HEADERS and name not in found:
                found[name] = value
    for name in sorted(consumed & SECRET_HEADERS):
        notes.append(f"header {name} dropped: credentials other than a Prism auth token are never forwarded")
    token: str | None = None
    for name in TOKEN_HEADERS:
        if name not in found:
            continue
        try:
            text = found[name].decode("utf-8").strip()
        except UnicodeDecodeError:
            notes.append(f"header {name} dropped: not UTF-8, so not a token")
            continue
        if name == "authorization":
            scheme, _, rest = text.partition(" ")
            if scheme.lower() == "bearer" and rest.strip():
                text = rest.strip()
            else:
                notes.append("authorization header is not a Bearer token; kept whole as the auth token")
        if not text:
            continue
        if token is None:
            token = text
        else:
            notes.append(f"header {name} dropped: an auth token was already taken from a higher-priority header")
    return AuthResult(token, consumed, notes)


def set_auth_token(env: Envelope, token: str | None, notes: list[str], where: str) -> None:
    """Store a token found outside the envelope, never overwriting one the envelope carries."""
    if not token:
        return
    sec = env.security
    if sec is not None and sec.HasField("auth_token"):
        if sec.auth_token != token:
            notes.append(f"auth token from {where} dropped: the envelope already carries one")
        return
    env.ensure_security().auth_token = token


# --------------------------------------------------------------------------- time


def ms_from_epoch_number(text: str, where: str, error: type[FormatError]) -> int:
    """An epoch timestamp of unknown unit, told apart by magnitude.

    Legacy producers send seconds (`timestamp: 1697200000` in RFC-031), milliseconds, and
    sometimes micro- or nanoseconds. Ranges: < 1e11 seconds (until year 5138), < 1e14 ms,
    < 1e17 µs, else ns. The price: a millisecond timestamp before 1973-03-03 reads as seconds.
    """
    if not _DECIMAL.fullmatch(text):
        raise error(f"timestamp {text[:40]!r} is neither an epoch number nor RFC 3339", path=where,
                    hint="send Unix epoch milliseconds (or seconds) as a decimal, or an RFC 3339 time")
    whole, _, frac = text.partition(".")
    n = int(whole)
    if n < 10**11:
        scale = 1000  # seconds -> ms, fraction kept to the millisecond
        ms = n * scale + (int(frac[:3].ljust(3, "0")) if frac else 0)
    elif n < 10**14:
        ms = n
    elif n < 10**17:
        ms = n // 1000
    else:
        ms = n // 1_000_000
    if ms <= 0 or ms > MAX_MS:
        raise error(f"timestamp {text[:40]!r} is out of range", path=where,
                    hint="send a publish time after 1970-01-01 in Unix epoch milliseconds")
    return ms


def ms_from_rfc3339(text: str, where: str, error: type[FormatError]) -> int:
    """RFC 3339 date-time to epoch ms (fractions beyond the millisecond are truncated)."""
    m = _RFC3339.fullmatch(text.strip())
    if m is None:
        raise error(f"time {text[:40]!r} is not an RFC 3339 date-time", path=where,
                    hint="use e.g. 2024-11-23T14:45:47.123Z")
    y, mo, d, h, mi, s, frac, off = m.groups()
    if off in ("Z", "z"):
        tz = UTC
    else:
        sign = 1 if off[0] == "+" else -1
        tz = timezone(sign * timedelta(hours=int(off[1:3]), minutes=int(off[4:6])))
    try:
        dt = datetime(int(y), int(mo), int(d), int(h), int(mi), int(s), tzinfo=tz)
    except ValueError as exc:
        raise error(f"time {text[:40]!r} is not a valid date-time: {exc}", path=where,
                    hint="check the date and time fields (leap seconds are not supported)") from None
    ms = (dt - EPOCH) // timedelta(milliseconds=1) + (int(frac[:3].ljust(3, "0")) if frac else 0)
    if ms <= 0:
        raise error(f"time {text[:40]!r} is before 1970", path=where, hint="send the real publish time")
    return ms


def parse_time_ms(text: str, where: str, error: type[FormatError]) -> int:
    """Either an epoch number (unit by magnitude) or an RFC 3339 date-time."""
    text = text.strip()
    if text[:1].isdigit() and "-" not in text and ":" not in text:
        return ms_from_epoch_number(text, where, error)
    return ms_from_rfc3339(text, where, error)


def datetime_from_ms(ms: int) -> datetime:
    """Epoch ms as an aware UTC datetime (exact: integer arithmetic, no float rounding)."""
    return EPOCH + timedelta(milliseconds=ms)


# --------------------------------------------------------------------------- applying metadata


@dataclass(frozen=True, slots=True)
class Found:
    """One piece of metadata a shape found: its text, where it was, and the extension key that
    keeps it verbatim when it cannot be mapped onto an envelope field."""

    value: str
    where: str
    fallback: str


#: Logical field names `apply_found` understands, in the order they are applied (traceparent
#: before the bare ids, so a full traceparent wins over a separate trace-id header).
FIELD_ORDER: tuple[str, ...] = (
    "message_id", "correlation_id", "causality_parent", "published_at", "published_at_ms",
    "content_type", "content_encoding", "priority", "ttl_seconds",
    "publisher_id", "publisher_team", "data_classification", "contains_pii",
    "schema_id", "schema_url", "schema_version", "schema_name", "schema_format", "schema_hash",
    "traceparent", "trace_id", "span_id", "tracestate", "baggage",
)


def add_found(found: dict[str, Found], field: str, item: Found, error: type[FormatError]) -> None:
    """Record `item` for `field`; the same field from two places must agree."""
    prev = found.get(field)
    if prev is not None and prev.value != item.value:
        raise error(f"{prev.where} and {item.where} both set {field} but disagree", path=item.where,
                    hint="send each piece of metadata once")
    if prev is None:
        found[field] = item


def _int_in(item: Found, field: str, lo: int, hi: int, error: type[FormatError]) -> int:
    text = item.value.strip()
    if not re.fullmatch(r"-?[0-9]{1,19}", text) or not lo <= int(text) <= hi:
        raise error(f"{field} {item.value[:40]!r} is not an integer in {lo}..{hi}", path=item.where,
                    hint=f"send {field} as a decimal integer between {lo} and {hi}")
    return int(text)


def apply_found(env: Envelope, found: dict[str, Found], error: type[FormatError], notes: list[str]) -> None:
    """Set envelope fields from `found`; unmappable values go to their fallback extension."""
    md = env.metadata
    for field in FIELD_ORDER:
        item = found.get(field)
        if item is None:
            continue
        v = item.value
        if field in ("message_id", "correlation_id", "causality_parent"):
            if v:
                setattr(md, field, v)
        elif field == "published_at":
            md.published_at_ms = parse_time_ms(v, item.where, error)
        elif field == "published_at_ms":
            md.published_at_ms = _int_in(item, "published_at_ms", 1, MAX_MS, error)
        elif field == "content_type":
            if v.strip():
                set_content_type(md, v.strip())
        elif field == "content_encoding":
            if v.strip():
                set_content_encoding(md, v.strip().lower())
        elif field == "priority":
            md.priority = _int_in(item, "priority", 0, 10, error)
        elif field == "ttl_seconds":
            md.ttl_seconds = _int_in(item, "ttl_seconds", 0, MAX_MS, error)
        elif field in ("publisher_id", "publisher_team"):
            if v:
                setattr(env.ensure_security(), field, v)
        elif field == "data_classification":
            cls = v.strip().lower()
            if cls not in CLASSIFICATIONS:
                raise error(f"data classification {v[:40]!r} is unknown", path=item.where,
                            hint=f"use one of {sorted(CLASSIFICATIONS)}")
            env.ensure_security().data_classification = cls
        elif field == "contains_pii":
            b = _BOOL.get(v.strip().lower())
            if b is None:
                raise error(f"contains_pii {v[:40]!r} is not a boolean", path=item.where, hint="send true or false")
            env.ensure_security().contains_pii = b
        elif field == "schema_id":
            env.extensions[SCHEMA_ID_EXTENSION] = v.encode("utf-8")
        elif field.startswith("schema_"):
            if v:
                setattr(env.ensure_schema(), field, v)
        elif field == "traceparent":
            tp = parse_traceparent(v)
            if tp is None:
                _keep(env, item, notes, "is not a valid W3C traceparent")
            else:
                obs = env.ensure_observability()
                obs.trace_id, obs.span_id, obs.trace_flags = tp.trace_id, tp.parent_id, tp.propagated_flags()
        elif field == "trace_id":
            _apply_bare_id(env, item, "trace_id", _HEX32, notes)
        elif field == "span_id":
            _apply_bare_id(env, item, "span_id", _HEX16, notes)
        elif field == "tracestate":
            env.extensions[TRACESTATE_EXTENSION] = v.encode("utf-8")
        elif field == "baggage":
            _apply_baggage(env, item, notes)


def _keep(env: Envelope, item: Found, notes: list[str], why: str) -> None:
    env.extensions[item.fallback] = item.value.encode("utf-8")
    notes.append(f"{item.where} {why}; kept verbatim in extensions[{item.fallback!r}]")


def _apply_bare_id(env: Envelope, item: Found, field: str, pattern: re.Pattern[str], notes: list[str]) -> None:
    v = item.value.strip()
    if not pattern.fullmatch(v) or set(v) == {"0"}:
        _keep(env, item, notes, f"is not a W3C {field.replace('_', '-')}")
        return
    obs = env.ensure_observability()
    current = getattr(obs, field)
    if current and current != v.lower():
        _keep(env, item, notes, f"disagrees with the traceparent's {field}")
        return
    setattr(obs, field, v.lower())


def _apply_baggage(env: Envelope, item: Found, notes: list[str]) -> None:
    """W3C Baggage `k=v,k2=v2` into observability.baggage; anything fancier is kept verbatim."""
    pairs: dict[str, str] = {}
    for member in item.value.split(","):
        member = member.strip()
        if not member:
            continue
        key, eq, value = member.partition("=")
        if not eq or not key.strip() or ";" in value:
            _keep(env, item, notes, "has baggage members Prism does not split (properties or no '=')")
            return
        try:
            pairs[key.strip()] = unquote(value.strip(), errors="strict")
        except UnicodeDecodeError:
            _keep(env, item, notes, "is not percent-encoded UTF-8")
            return
    if pairs:
        env.ensure_observability().baggage.update(pairs)


# --------------------------------------------------------------------------- finishing


def finalize(
    env: Envelope,
    *,
    topic: str,
    namespace: str,
    default_content_type: str | None,
    now_ms: int | None,
    notes: list[str],
    error: type[FormatError],
    id_seed: bytes | None = None,
) -> Envelope:
    """Fill what the producer did not send and make sure the result is a valid envelope.

    With `id_seed` (the worker passes the record's topic/partition/offset) a missing message
    id is derived from it, so the same input record always gets the same id.
    """
    md = env.metadata
    if md.published_at_ms <= 0:
        md.published_at_ms = now_ms if now_ms is not None else int(time.time() * 1000)
        notes.append("metadata.published_at_ms set to now: the input carried no publish time")
    if not md.message_id:
        md.message_id = uuid7_from_seed(md.published_at_ms, id_seed) if id_seed is not None else new_message_id()
        notes.append("metadata.message_id generated (UUIDv7): the input carried none")
    if not md.topic:
        md.topic = topic
    if not md.namespace:
        md.namespace = namespace
    if default_content_type and not get_content_type(md):
        set_content_type(md, default_content_type)
    problems = required_problems(env)
    if problems:
        raise error(
            "input does not make a valid envelope: " + "; ".join(str(p) for p in problems),
            hint="pass topic= and namespace= for shapes that carry none, and fix the listed producer metadata",
        )
    return env

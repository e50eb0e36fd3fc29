"""LNMP envelope transport bindings (LNMP spec section 7): Kafka record headers, HTTP headers and
gRPC metadata. Pure encode/decode pairs; no clients.

| field     | Kafka header     | HTTP header        | gRPC metadata key |
|-----------|------------------|--------------------|-------------------|
| timestamp | `lnmp.timestamp` | `X-LNMP-Timestamp` | `lnmp-timestamp`  |
| source    | `lnmp.source`    | `X-LNMP-Source`    | `lnmp-source`     |
| trace_id  | `lnmp.trace_id`  | `X-LNMP-Trace-ID`  | `lnmp-trace-id`   |
| sequence  | `lnmp.sequence`  | `X-LNMP-Sequence`  | `lnmp-sequence`   |

Values are strings: numbers in decimal (spec: "string values for interoperability"). Kafka
header values are bytes, so strings travel as UTF-8 verbatim. HTTP header values and gRPC ASCII
metadata must be printable ASCII, so there - and only there - a value with any other character
or a `%` is percent-encoded (RFC 3986, UTF-8); ordinary ids pass unchanged. The spec does not
say how to carry non-ASCII in HTTP/gRPC; this is the least surprising reversible choice.

Names are matched case-insensitively on decode (HTTP and gRPC names are case-insensitive, and
gRPC lowercases them anyway). Unknown `lnmp` names are ignored (spec 10.1). The spec defines no
binding for extra TLV types, extra text keys or labels, so those are not carried here.
Strict decoding raises `LnmpError` for a malformed number, a name given twice with different
values, or a value that does not decode; loose decoding drops the offending field and notes it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from urllib.parse import quote, unquote

from ..errors import LnmpError
from .lnmp import TEXT_KEYS, U64_MAX, LnmpEnvelope


@dataclass(frozen=True, slots=True)
class Binding:
    """One transport's spelling of the four field names, and whether it needs ASCII values."""

    name: str
    names: Mapping[str, str]  # field -> wire name, as emitted
    ascii_only: bool

    def field_of(self, wire_name: str) -> str | None:
        return _reverse(self).get(wire_name.lower())


KAFKA = Binding("Kafka", {"timestamp": "lnmp.timestamp", "source": "lnmp.source",
                          "trace_id": "lnmp.trace_id", "sequence": "lnmp.sequence"}, ascii_only=False)
HTTP = Binding("HTTP", {"timestamp": "X-LNMP-Timestamp", "source": "X-LNMP-Source",
                        "trace_id": "X-LNMP-Trace-ID", "sequence": "X-LNMP-Sequence"}, ascii_only=True)
GRPC = Binding("gRPC", {"timestamp": "lnmp-timestamp", "source": "lnmp-source",
                        "trace_id": "lnmp-trace-id", "sequence": "lnmp-sequence"}, ascii_only=True)
BINDINGS: tuple[Binding, ...] = (KAFKA, HTTP, GRPC)

_REVERSE: dict[str, dict[str, str]] = {}
_SAFE = "".join(chr(c) for c in range(0x21, 0x7F) if chr(c) != "%")
_DIGITS = re.compile(r"[0-9]{1,20}")


def _reverse(b: Binding) -> dict[str, str]:
    rev = _REVERSE.get(b.name)
    if rev is None:
        rev = _REVERSE[b.name] = {wire.lower(): f for f, wire in b.names.items()}
    return rev


def _encode_value(b: Binding, value: str) -> str:
    return quote(value, safe=_SAFE, encoding="utf-8") if b.ascii_only else value


def encode(meta: LnmpEnvelope, binding: Binding) -> list[tuple[str, str]]:
    """(name, value) pairs for `meta`, in canonical field order; absent fields are omitted."""
    out: list[tuple[str, str]] = []
    for f in TEXT_KEYS:
        v = getattr(meta, f)
        if v is None:
            continue
        if isinstance(v, int):
            if not 0 <= v <= U64_MAX:
                raise LnmpError(f"{f} {v} does not fit an unsigned 64-bit integer", path=f)
            text = str(v)
        else:
            text = _encode_value(binding, v)
        out.append((binding.names[f], text))
    return out


def decode(pairs: Iterable[tuple[str, str | bytes]], binding: Binding, *, strict: bool = True,
           notes: list[str] | None = None) -> LnmpEnvelope | None:
    """The LNMP metadata found among `pairs` (other names ignored); None when there is none."""
    found: dict[str, str] = {}
    for name, raw in pairs:
        f = binding.field_of(name)
        if f is None:
            continue
        try:
            text = bytes(raw).decode("utf-8") if isinstance(raw, bytes | bytearray | memoryview) else raw
            if binding.ascii_only:
                text = unquote(text, encoding="utf-8", errors="strict")
            if f in ("timestamp", "sequence"):
                text = text.strip()
                if not _DIGITS.fullmatch(text) or int(text) > U64_MAX:
                    raise LnmpError(f"{binding.name} {name} {text[:40]!r} is not an unsigned 64-bit decimal",
                                    path=name, hint=f"send {f} as digits, e.g. 42")
            if f in found and found[f] != text:
                raise LnmpError(f"{binding.name} {name} appears twice with different values", path=name,
                                hint="send each LNMP header once")
        except UnicodeDecodeError:
            err = LnmpError(f"{binding.name} {name} is not {'percent-encoded ' if binding.ascii_only else ''}UTF-8",
                            path=name, hint="encode LNMP values as UTF-8 text")
            if strict:
                raise err from None
            _note(notes, err)
            continue
        except LnmpError as err:
            if strict:
                raise
            _note(notes, err)
            continue
        found[f] = text
    if not found:
        return None
    return LnmpEnvelope(
        timestamp=int(found["timestamp"]) if "timestamp" in found else None,
        source=found.get("source"),
        trace_id=found.get("trace_id"),
        sequence=int(found["sequence"]) if "sequence" in found else None,
    )


def _note(notes: list[str] | None, err: LnmpError) -> None:
    if notes is not None:
        notes.append(f"ignored (loose mode): {err}")


# Convenience pairs with each transport's natural container type.


def to_kafka_headers(meta: LnmpEnvelope) -> list[tuple[str, bytes]]:
    return [(n, v.encode("utf-8")) for n, v in encode(meta, KAFKA)]


def from_kafka_headers(headers: Iterable[tuple[str, bytes]], *, strict: bool = True,
                       notes: list[str] | None = None) -> LnmpEnvelope | None:
    return decode(headers, KAFKA, strict=strict, notes=notes)


def to_http_headers(meta: LnmpEnvelope) -> dict[str, str]:
    return dict(encode(meta, HTTP))


def from_http_headers(headers: Mapping[str, str] | Iterable[tuple[str, str]], *, strict: bool = True,
                      notes: list[str] | None = None) -> LnmpEnvelope | None:
    items = headers.items() if isinstance(headers, Mapping) else headers
    return decode(items, HTTP, strict=strict, notes=notes)


def to_grpc_metadata(meta: LnmpEnvelope) -> list[tuple[str, str]]:
    return encode(meta, GRPC)


def from_grpc_metadata(metadata: Iterable[tuple[str, str | bytes]], *, strict: bool = True,
                       notes: list[str] | None = None) -> LnmpEnvelope | None:
    return decode(metadata, GRPC, strict=strict, notes=notes)


def from_any_headers(pairs: Iterable[tuple[str, str | bytes]], *, strict: bool = True,
                     notes: list[str] | None = None) -> LnmpEnvelope | None:
    """LNMP metadata from whichever binding's names appear (a Kafka record bridged from HTTP may
    carry `X-LNMP-*`). Bindings are read in the order Kafka, HTTP, gRPC; the first to define a
    field wins and a later different value is noted."""
    pairs = list(pairs)
    merged: dict[str, object] = {}
    for b in BINDINGS:
        meta = decode(pairs, b, strict=strict, notes=notes)
        if meta is None:
            continue
        for f in TEXT_KEYS:
            v = getattr(meta, f)
            if v is None:
                continue
            if f not in merged:
                merged[f] = v
            elif merged[f] != v and notes is not None:
                notes.append(f"LNMP {f} from {b.name} headers differs from an earlier binding's; the first wins")
    return LnmpEnvelope(**merged) if merged else None  # type: ignore[arg-type]


def has_lnmp_headers(names: Iterable[str]) -> bool:
    return any(b.field_of(n) is not None for n in names for b in BINDINGS)

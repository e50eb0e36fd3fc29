"""LNMP messages <-> Prism envelopes.

| LNMP                      | Prism envelope                                                        |
|---------------------------|-----------------------------------------------------------------------|
| timestamp (u64 ms)        | metadata.published_at_ms (must be 1..2^63-1)                          |
| source                    | security.publisher_id (a producer *claim*; the auth stage replaces it) |
| trace_id = traceparent    | observability.trace_id / span_id / trace_flags                        |
| trace_id = 32 hex         | observability.trace_id                                                |
| trace_id, anything else   | extensions["lnmp.trace_id"] (UTF-8, verbatim)                          |
| sequence (u64)            | extensions["lnmp.sequence"] (8 bytes big-endian)                      |
| record                    | payload, content type application/lnmp (container) or text/lnmp      |
| container mode != binary  | extensions["lnmp.mode"] (1 byte)                                      |
| container flags (not 15)  | extensions["lnmp.flags"] (2 bytes BE), when non-zero                   |
| fixed/opaque metadata     | extensions["lnmp.mode_metadata"], when non-empty                       |
| unknown TLV entries       | extensions["lnmp.tlv"] (their TLV encoding, ascending types)           |
| unknown text keys         | extensions["lnmp.text_keys"] (`k=v …`, canonical)                     |

Why source -> publisher rather than namespace: LNMP says source is a "service/device/tenant
identifier" - who produced the record - while a Prism namespace is an isolation boundary the
transport and its ACLs decide; letting a record choose its own namespace would let a producer
write into another tenant. The same choice is made for CloudEvents `source`.

The source is only ever a claim: the worker's identity rule (app/agents/identity.py) states a
publisher on its outputs only when a verifier established it, and otherwise keeps the source
as `prism.claimed.publisher_id` (the LNMP sequence table still groups records by it).

Why the sequence is an extension: the envelope has no sequence field, and a fixed 8-byte
big-endian value lets the pipeline's sequence table compare sequences without parsing text.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from ..bindings.tracecontext import parse_traceparent, traceparent_of
from ..envelope.model import Envelope, Payload, set_content_type
from ..errors import LnmpError
from . import lnmp
from ._fields import MAX_MS

CONTENT_TYPE_BINARY = "application/lnmp"
CONTENT_TYPE_TEXT = "text/lnmp"
#: Content types read as LNMP: ours, the container format's proposed MIME, and text variants.
BINARY_CONTENT_TYPES = frozenset({CONTENT_TYPE_BINARY, "application/x-lnmp"})
TEXT_CONTENT_TYPES = frozenset({CONTENT_TYPE_TEXT, "text/x-lnmp"})

EXT_SEQUENCE = "lnmp.sequence"
EXT_TRACE_ID = "lnmp.trace_id"
EXT_MODE = "lnmp.mode"
EXT_FLAGS = "lnmp.flags"
EXT_MODE_METADATA = "lnmp.mode_metadata"
EXT_TLV = "lnmp.tlv"
EXT_TEXT_KEYS = "lnmp.text_keys"

_HEX32 = re.compile(r"[0-9a-f]{32}")


@dataclass(slots=True)
class Mapped:
    envelope: Envelope
    notes: list[str]


def base_mime(content_type: str) -> str:
    return content_type.split(";", 1)[0].strip().lower()


# --------------------------------------------------------------------------- LNMP -> Prism


def apply_metadata(env: Envelope, meta: lnmp.LnmpEnvelope, notes: list[str], *, strict: bool = True) -> None:
    """Copy LNMP envelope metadata onto `env` (see the module table)."""
    if meta.timestamp is not None:
        if 1 <= meta.timestamp <= MAX_MS:
            env.metadata.published_at_ms = meta.timestamp
        elif strict:
            raise LnmpError(f"LNMP timestamp {meta.timestamp} is not a usable publish time", path="timestamp",
                            hint="send Unix epoch milliseconds between 1 and 2^63-1")
        else:
            notes.append(f"LNMP timestamp {meta.timestamp} ignored (loose mode): not a usable publish time")
    if meta.source is not None and meta.source:
        env.ensure_security().publisher_id = meta.source
    if meta.trace_id is not None:
        _apply_trace(env, meta.trace_id, notes)
    if meta.sequence is not None:
        env.extensions[EXT_SEQUENCE] = meta.sequence.to_bytes(8, "big")
    if meta.extra_tlv:
        env.extensions[EXT_TLV] = lnmp.encode_tlv(lnmp.LnmpEnvelope(extra_tlv=meta.extra_tlv))
    if meta.extra_keys:
        line = lnmp.encode_text_header(lnmp.LnmpEnvelope(extra_keys=meta.extra_keys))
        env.extensions[EXT_TEXT_KEYS] = line[len(lnmp.TEXT_KEYWORD) + 1 :].encode("utf-8")


def _apply_trace(env: Envelope, trace_id: str, notes: list[str]) -> None:
    """LNMP section 8.2: a full traceparent or just the trace id. What is neither (or is not
    in its canonical spelling) is also kept verbatim, so LNMP -> Prism -> LNMP is exact."""
    tp = parse_traceparent(trace_id)
    if tp is not None:
        obs = env.ensure_observability()
        obs.trace_id, obs.span_id, obs.trace_flags = tp.trace_id, tp.parent_id, tp.propagated_flags()
        if tp.to_header() == trace_id:
            return
    elif _HEX32.fullmatch(trace_id) and trace_id != "0" * 32:
        env.ensure_observability().trace_id = trace_id
        return
    else:
        notes.append("LNMP trace_id is not W3C trace context; kept in extensions['lnmp.trace_id']")
    env.extensions[EXT_TRACE_ID] = trace_id.encode("utf-8")


def from_container(container: lnmp.Container, *, strict: bool = True) -> Mapped:
    """A decoded binary container as an envelope (topic/namespace/ids still to be filled)."""
    notes = list(container.warnings)
    env = Envelope(payload=Payload(container.record))
    set_content_type(env.metadata, CONTENT_TYPE_BINARY)
    if container.mode != lnmp.Mode.BINARY:
        env.extensions[EXT_MODE] = bytes([container.mode])
    if container.flags:
        env.extensions[EXT_FLAGS] = container.flags.to_bytes(2, "big")
    if container.mode_metadata:
        env.extensions[EXT_MODE_METADATA] = container.mode_metadata
    if container.envelope is not None:
        apply_metadata(env, container.envelope, notes, strict=strict)
    return Mapped(env, notes)


def from_text(message: lnmp.TextMessage, *, strict: bool = True) -> Mapped:
    notes = list(message.warnings)
    env = Envelope(payload=Payload(message.record))
    set_content_type(env.metadata, CONTENT_TYPE_TEXT)
    if message.envelope is not None:
        apply_metadata(env, message.envelope, notes, strict=strict)
    return Mapped(env, notes)


def merge_transport(env: Envelope, in_band: lnmp.LnmpEnvelope | None, transport: lnmp.LnmpEnvelope | None,
                    notes: list[str], *, strict: bool = True) -> None:
    """Add metadata from transport headers (`lnmp_bindings`) for fields the record's own
    envelope does not set. The in-band envelope wins: it travels with the record, while
    headers can be rewritten by any hop. A disagreement is reported, never silently merged."""
    if transport is None or transport.is_empty():
        return
    fill: dict[str, object] = {}
    for name in ("timestamp", "source", "trace_id", "sequence"):
        theirs = getattr(transport, name)
        if theirs is None:
            continue
        ours = getattr(in_band, name) if in_band is not None else None
        if ours is None:
            fill[name] = theirs
        elif ours != theirs:
            notes.append(f"LNMP {name} in the transport headers differs from the record's envelope; the envelope wins")
    if fill:
        apply_metadata(env, lnmp.LnmpEnvelope(**fill), notes, strict=strict)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- Prism -> LNMP


def _ext_u64(env: Envelope, key: str) -> int | None:
    raw = env.extensions.get(key)
    if raw is None:
        return None
    if len(raw) != 8:
        raise LnmpError(f"extensions[{key!r}] is {len(raw)} bytes, must be 8 (u64 big-endian)", path=f"extensions.{key}")
    return int.from_bytes(raw, "big")


def to_metadata(env: Envelope) -> lnmp.LnmpEnvelope:
    """The LNMP envelope metadata of a Prism envelope (inverse of `apply_metadata`)."""
    sec = env.security
    source = sec.publisher_id if sec is not None and sec.HasField("publisher_id") and sec.publisher_id else None
    trace: str | None
    raw_trace = env.extensions.get(EXT_TRACE_ID)
    if raw_trace is not None:
        try:
            trace = raw_trace.decode("utf-8")
        except UnicodeDecodeError:
            raise LnmpError("extensions['lnmp.trace_id'] is not UTF-8", path="extensions.lnmp.trace_id") from None
    else:
        trace = traceparent_of(env)
        obs = env.observability
        if trace is None and obs is not None and obs.trace_id:
            trace = obs.trace_id
    extra_tlv: tuple[tuple[int, bytes], ...] = ()
    if EXT_TLV in env.extensions:
        extra_tlv = lnmp.decode_tlv(env.extensions[EXT_TLV]).extra_tlv
    extra_keys: tuple[tuple[str, str], ...] = ()
    if EXT_TEXT_KEYS in env.extensions:
        line = lnmp.TEXT_KEYWORD + " " + env.extensions[EXT_TEXT_KEYS].decode("utf-8", errors="strict")
        extra_keys = lnmp.parse_text_header(line).extra_keys
    return lnmp.LnmpEnvelope(
        timestamp=env.published_at_ms or None,
        source=source,
        trace_id=trace,
        sequence=_ext_u64(env, EXT_SEQUENCE),
        extra_tlv=extra_tlv,
        extra_keys=extra_keys,
    )


def to_lnmp(env: Envelope, *, form: str | None = None) -> bytes | memoryview:
    """Serialize an envelope as an LNMP message: `form` "binary" (container with TLV block) or
    "text" (`#ENVELOPE` line + record); by default chosen from the content type (text/lnmp ->
    text, anything else -> binary). The record is the plaintext payload."""
    if form is None:
        form = "text" if base_mime(env.content_type) in TEXT_CONTENT_TYPES else "binary"
    if form not in ("binary", "text"):
        raise LnmpError(f"unknown LNMP form {form!r}", path="form", hint='use "binary" or "text"')
    # The record is the plaintext: decompress when needed; an encrypted payload raises
    # PayloadError (decrypt first) rather than leaking ciphertext into an LNMP record.
    plain = not env.is_encrypted and env.content_encoding in ("", "none")
    record = env.payload.value if plain else env.payload_bytes()
    meta = to_metadata(env)
    if form == "text":
        return lnmp.encode_text(record, meta)
    mode_raw = env.extensions.get(EXT_MODE)
    flags_raw = env.extensions.get(EXT_FLAGS)
    if mode_raw is not None and len(mode_raw) != 1:
        raise LnmpError("extensions['lnmp.mode'] must be 1 byte", path="extensions.lnmp.mode")
    if flags_raw is not None and len(flags_raw) != 2:
        raise LnmpError("extensions['lnmp.flags'] must be 2 bytes", path="extensions.lnmp.flags")
    return lnmp.encode_container(lnmp.Container(
        record=record,
        envelope=meta,
        mode=mode_raw[0] if mode_raw else lnmp.Mode.BINARY,
        flags=int.from_bytes(flags_raw, "big") if flags_raw else 0,
        mode_metadata=env.extensions.get(EXT_MODE_METADATA, b""),
    ))


def decode_message(data: bytes | memoryview, *, strict: bool = True,
                   transport: lnmp.LnmpEnvelope | None = None) -> Mapped:
    """Any LNMP message - container, `#ENVELOPE` text, or a bare record whose metadata came in
    transport headers - as an envelope (topic/namespace/ids still to be filled)."""
    if lnmp.is_container(data):
        c = lnmp.decode_container(data, strict=strict)
        mapped = from_container(c, strict=strict)
        merge_transport(mapped.envelope, c.envelope, transport, mapped.notes, strict=strict)
        return mapped
    text = lnmp.decode_text(data, strict=strict)
    mapped = from_text(text, strict=strict)
    if text.envelope is None and not lnmp.has_text_header(data) and not _is_utf8(data):
        set_content_type(mapped.envelope.metadata, CONTENT_TYPE_BINARY)  # a bare binary record
    merge_transport(mapped.envelope, text.envelope, transport, mapped.notes, strict=strict)
    return mapped


def _is_utf8(data: bytes | memoryview) -> bool:
    try:
        bytes(data).decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def sequence_of(env: Envelope) -> int | None:
    """The LNMP sequence carried by an envelope, for the pipeline's sequence table."""
    return _ext_u64(env, EXT_SEQUENCE)


__all__: Sequence[str] = (
    "CONTENT_TYPE_BINARY", "CONTENT_TYPE_TEXT", "EXT_SEQUENCE", "EXT_TRACE_ID", "Mapped",
    "apply_metadata", "decode_message", "from_container", "from_text", "merge_transport",
    "sequence_of", "to_lnmp", "to_metadata",
)

"""Encode and decode envelopes in either wire layout.

`decode` is always a header-only parse: it walks the top-level records, hands everything
but the payload to upb, and keeps the payload as a zero-copy slice of the input. Its cost
does not depend on the payload size (see `bench/bench_codec.py`).

`encode` emits `[header without security][security][payload]`. Record order does not
matter to any protobuf parser, and this order has two useful properties: the payload is
last (a streaming reader can stop before it), and the bytes a signature covers are cut
from exactly these runs (`app.security.signing`, docs/signing.md).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from google.protobuf.message import DecodeError as _PbDecodeError
from google.protobuf.unknown_fields import UnknownFieldSet

from .._gen.prism.envelope.draft import envelope_pb2 as dpb
from .._gen.prism.envelope.v1 import envelope_pb2 as vpb
from ..errors import DecodeError, LayoutError, SizeLimitError, WireTypeError
from .layouts import (
    UNKNOWN_EXT_PREFIX,
    draft_metadata,
    draft_security_as_is,
    draft_to_reviewed,
    has_unknown_metadata,
    reviewed_to_draft,
)
from .model import Envelope, Payload
from .wire import LEN, VARINT, encode_varint, read_varint, scan, scan_envelope, strip_field


class Layout(enum.StrEnum):
    """The two wire layouts of RFC-031. Values name the migration topics' readers."""

    DRAFT = "draft"        # RFC-031 draft, envelope_version=1, payload field 3  -> <topic>.v2
    REVIEWED = "reviewed"  # memo-031 reviewed layout, payload field 99           -> <topic>.v3

    @property
    def security_field(self) -> int:
        return 4 if self is _DRAFT else 2

    @property
    def payload_field(self) -> int:
        return 3 if self is _DRAFT else 99


# Module-level names for the members: `Layout.DRAFT` is an EnumType attribute lookup (~80 ns
# on CPython 3.11), and the per-message paths below ask several times per message.
_DRAFT, _REVIEWED = Layout.DRAFT, Layout.REVIEWED


@dataclass(frozen=True, slots=True)
class Limits:
    """Size limits, checked before any payload byte is touched."""

    max_message_bytes: int = 16 * 1024 * 1024
    max_header_bytes: int = 256 * 1024


DEFAULT_LIMITS = Limits()


def detect_layout(data: bytes | memoryview, *, limits: Limits = DEFAULT_LIMITS) -> Layout:
    """Tell the draft layout from the reviewed one by field 1's wire type.

    Draft envelopes start with `envelope_version` (field 1, varint); reviewed ones with
    `metadata` (field 1, length-delimited). Without field 1, fields only one layout has
    decide (5/6 draft, 97 reviewed); otherwise the reviewed layout is assumed.

    The bytes come from producers, so they are walked like `decode` walks them: with the
    header limit (`limits.max_header_bytes`) applied while walking, in either layout
    (`scan_records`). 16 MiB of tiny records were walked whole into millions of tuples
    (~170 MB compiled, ~650 MB and 5 s in Python) before the first record told the layout;
    now the walk stops with `SizeLimitError` near the limit, as `decode` would.
    """
    return layout_of_records(scan_records(memoryview(data), None, limits))


def layout_of_records(records: list[tuple[int, int, int, int, int]]) -> Layout:
    """`detect_layout` for callers that already scanned the records (`wire.scan`).

    The rule itself, not a wrapper around it: normalize calls this on every message, and one
    Python frame fewer is ~0.1 µs (issue 29)."""
    for r in records:
        if r[0] == 1:
            return _DRAFT if r[1] == VARINT else _REVIEWED
    fields = {r[0] for r in records}
    if fields & {5, 6}:
        return _DRAFT
    if not records:
        raise LayoutError("empty input is not an envelope", hint="check the producer sends envelope bytes")
    return _REVIEWED


#: the name signing.py imports
_detect = layout_of_records


def decode(
    data: bytes | bytearray | memoryview,
    *,
    layout: Layout | None = None,
    limits: Limits = DEFAULT_LIMITS,
    dropped: list[str] | None = None,
) -> Envelope:
    """Decode envelope bytes of either layout into the model (payload left lazy).

    `dropped`, when given, receives what a draft->model conversion could not carry.
    Raises only `app.errors.EnvelopeError` subclasses.
    """
    size = len(data)
    check_message_size(size, limits)
    if size <= SMALL_ENVELOPE and layout is None and dropped is None:
        env = _decode_small(data, limits)
        if env is not None:
            return env
    view = memoryview(data)
    records = scan_records(view, layout, limits)
    return decode_records(view, records, layout or layout_of_records(records), limits, dropped)


def scan_records(view: memoryview, layout: Layout | None, limits: Limits) -> list[tuple[int, int, int, int, int]]:
    """The top-level records of an envelope (`layout` None: either layout), the header limit
    applied while walking (`wire.scan_envelope`): what every decoder of a whole envelope walks
    with, after `check_message_size`."""
    fields = (3, 99) if layout is None else ((99,) if layout is _REVIEWED else (3,))
    return scan_envelope(view, fields, limits.max_header_bytes)


def check_message_size(size: int, limits: Limits) -> None:
    """Refuse a message over `limits.max_message_bytes` before any byte of it is read (also
    for callers that walk the records themselves, such as `verify_and_decode`)."""
    if size > limits.max_message_bytes:
        raise SizeLimitError(
            f"envelope is {size} bytes, over the {limits.max_message_bytes}-byte limit",
            hint="raise Limits.max_message_bytes or have the producer split the message",
        )


#: Below this size upb parses the whole envelope in C and the payload is moved out: a copy
#: of at most this many bytes is cheaper than walking the records in Python. Above it, the
#: record walk keeps the payload a zero-copy view and the cost flat in payload size.
SMALL_ENVELOPE = 64 * 1024


def _decode_small(data: bytes | bytearray | memoryview, limits: Limits) -> Envelope | None:
    """Reviewed envelopes that start with their metadata record (what every Prism encoder
    writes). Anything else, or anything upb rejects, takes the general path, which also
    produces the precise error."""
    if not data or data[0] != 0x0A:
        return None
    try:
        header = vpb.PrismEnvelope.FromString(data)
    except _PbDecodeError:
        return None
    if not header.HasField("payload") or len(UnknownFieldSet(header)):
        # Unknown top-level fields include a payload record of the wrong wire type, which upb
        # keeps as unknown but the general path refuses (WireTypeError): both paths must agree
        # (conformance/negative, "wire/payload-as-varint"). A newer producer's fields are rare
        # enough that the general path's cost does not matter.
        return None
    any_ = header.payload
    if len(data) - len(any_.value) > limits.max_header_bytes:
        return None  # the general path reports the oversized header precisely
    payload = Payload(any_.value, any_.type_url)
    header.ClearField("payload")
    return Envelope(header, payload)


def decode_records(
    view: memoryview, records: list[tuple[int, int, int, int, int]], lay: Layout, limits: Limits = DEFAULT_LIMITS,
    dropped: list[str] | None = None,
) -> Envelope:
    """`decode` for callers that already scanned the records (signature verification)."""
    pf = 99 if lay is _REVIEWED else 3  # lay.payload_field, without the property call

    if records:
        f, wt, start, vstart, end = records[-1]
        if f == pf and wt == LEN:
            # Fast path (what Prism itself emits): one payload record, last on the wire. The
            # payload records are counted in a loop, not with a list comprehension: no list and
            # no comprehension frame per message (~70 ns, more on the worker's cold caches; issue 29).
            count = 0
            for r in records:
                if r[0] == pf:
                    count += 1
            if count == 1:
                if start > limits.max_header_bytes:
                    raise SizeLimitError(
                        f"envelope header is {start} bytes, over the {limits.max_header_bytes}-byte limit",
                        hint="move bulky data into the payload, or raise Limits.max_header_bytes",
                    )
                return Envelope(_parse_header(view[:start], lay, dropped), Payload.from_wire(view[vstart:end]))

    header_parts: list[memoryview] = []
    payload_recs: list[tuple[int, int, int, int, int]] = []
    header_len = 0
    for r in records:
        if r[0] == pf:
            if r[1] != LEN:
                raise WireTypeError(f"payload field {pf} must be length-delimited, got wire type {r[1]}",
                                    path=f"byte {r[2]}")
            payload_recs.append(r)
        else:
            header_parts.append(view[r[2] : r[4]])
            header_len += r[4] - r[2]
    if header_len > limits.max_header_bytes:
        raise SizeLimitError(
            f"envelope header is {header_len} bytes, over the {limits.max_header_bytes}-byte limit",
            hint="move bulky data into the payload, or raise Limits.max_header_bytes",
        )
    header = _parse_header(b"".join(header_parts), lay, dropped)
    if not payload_recs:
        payload = Payload.absent()
    elif len(payload_recs) == 1:
        r = payload_recs[0]
        payload = Payload.from_wire(view[r[3] : r[4]])
    else:  # protobuf merge semantics for a repeated singular message field
        payload = Payload.from_wire(b"".join(view[r[3] : r[4]] for r in payload_recs))
    return Envelope(header, payload)


def _parse_header(head: bytes | memoryview, lay: Layout, dropped: list[str] | None) -> vpb.PrismEnvelope:
    try:
        if lay is _REVIEWED:
            return vpb.PrismEnvelope.FromString(head)
        header, lost = draft_to_reviewed(dpb.PrismEnvelope.FromString(head))
        if dropped is not None:
            dropped.extend(lost)
        return header
    except _PbDecodeError as exc:
        raise DecodeError(
            f"envelope header ({lay.value} layout) is not valid protobuf: {exc}",
            hint="a string field may hold invalid UTF-8, or a nested message is truncated or has a wrong wire type",
        ) from exc
    except ValueError as exc:  # e.g. an unknown enum name in prism.enc.* extensions
        raise DecodeError(f"envelope header is inconsistent: {exc}") from exc


def _varint_size(n: int) -> int:
    size = 1
    while n >= 0x80:
        n >>= 7
        size += 1
    return size


def _record_size(field_tag_bytes: int, msg: object) -> int:
    n = msg.ByteSize()  # type: ignore[attr-defined]
    return field_tag_bytes + _varint_size(n) + n


def _split_security(full: bytes, before: int, sec_size: int, field: int) -> tuple[bytes, bytes]:
    """Cut the security record out of a serialized header.

    upb writes known fields in field-number order, so the security record starts right
    after the records numbered below it (`before` bytes). That is checked, and a full
    record scan is the fallback, so correctness never depends on the encoder's order.
    """
    tag = (field << 3) | LEN
    if len(full) >= before + sec_size and full[before] == tag:
        return full[:before] + full[before + sec_size :], full[before : before + sec_size]
    runs = strip_field(full, field)
    sec = b"".join(full[r[2] : r[4]] for r in scan(full) if r[0] == field)
    return b"".join(runs), sec


def encode_parts(env: Envelope, layout: Layout = Layout.REVIEWED) -> tuple[bytes, bytes, list[bytes | memoryview]]:
    """(head, security record, payload record parts): the runs `app.security.signing` signs."""
    header = layout_header(env, layout)
    head, sec = split_header(header, layout)
    return head, sec, payload_parts(env, layout)


def layout_header(env: Envelope, layout: Layout) -> vpb.PrismEnvelope | dpb.PrismEnvelope:
    """The header message in `layout` (the model itself for the reviewed layout)."""
    return env.header if layout is Layout.REVIEWED else reviewed_to_draft(env.header, report=False)[0]


def split_header(header: vpb.PrismEnvelope | dpb.PrismEnvelope, layout: Layout) -> tuple[bytes, bytes]:
    """Serialize a layout header as (head without security, security record)."""
    full = header.SerializeToString()
    cut = _cut_after_prefix(full, layout)
    if cut is not None:
        return cut
    if not header.HasField("security"):
        return full, b""
    if layout is Layout.REVIEWED:
        before = _record_size(1, header.metadata) if header.HasField("metadata") else 0
    else:
        before = (1 + _varint_size(header.envelope_version)) if header.envelope_version else 0
        if header.HasField("metadata"):
            before += _record_size(1, header.metadata)
    return _split_security(full, before, _record_size(1, header.security), layout.security_field)


def draft_split(header: vpb.PrismEnvelope, reviewed_head: bytes) -> tuple[bytes, dpb.SecurityContext] | None:
    """`split_header(reviewed_to_draft(header)[0], Layout.DRAFT)` without building the draft
    header: (the draft head, the draft security context), or None when the shortcut does not
    apply (the caller then takes that general path).

    `reviewed_head` is `split_header(header, Layout.REVIEWED)[0]`, which a writer of both layouts
    has at hand. The draft head is the version record, the metadata (the one part whose fields
    differ between the layouts, built with `draft_metadata`), then the observability and schema
    records of the reviewed head with their tags renumbered - the same fields with the same
    numbers, so the same bytes. That holds when the reviewed head is exactly metadata,
    observability, schema and at most one extension entry (the identity stage adds
    `prism.identity.method` to every authenticated message), the observability context has no
    map entries (a map may be written in another order when parsed and written again) and the
    security context reads as a draft one as is (`draft_security_as_is`); anything else -
    several extensions or a carried unknown one, unknown top-level fields, encryption - takes
    the general path. The worker writes every message in both layouts, and converting the
    header field by field was ~20 µs of its ~180 µs per message (issue 29's profile)."""
    if not (header.HasField("metadata") and header.HasField("security")):
        return None
    sec = header.security
    if not draft_security_as_is(sec) or has_unknown_metadata(header.metadata):
        return None
    n = len(reviewed_head)
    if n < 2 or reviewed_head[0] != 0x0A:
        return None
    length, pos = read_varint(reviewed_head, 1, n)
    pos += length
    tail: list[bytes] = []
    if pos < n and reviewed_head[pos] == 0x1A:  # observability (3) -> draft field 5
        obs = header.observability
        if len(obs.baggage) or len(obs.labels):
            return None
        length, start = read_varint(reviewed_head, pos + 1, n)
        tail.append(b"\x2a" + reviewed_head[pos + 1:start + length])
        pos = start + length
    if pos < n and reviewed_head[pos] == 0x22:  # schema (4) -> draft field 6
        length, start = read_varint(reviewed_head, pos + 1, n)
        tail.append(b"\x32" + reviewed_head[pos + 1:start + length])
        pos = start + length
    if pos < n and reviewed_head[pos:pos + 2] == _REVIEWED_EXT_TAG:  # extensions (97) -> draft field 99
        # One entry only (a second record fails `pos != n` below): with several, the general
        # path's map could be written in another order. A carried-unknown key makes the general
        # path put fields back (`_restore_unknown`). The key is read off the entry's bytes:
        # asking the map (len, iter) costs more than the rest of this function.
        length, start = read_varint(reviewed_head, pos + 2, n)
        end = start + length
        if start >= end or reviewed_head[start] != 0x0A:
            return None  # no key first: not the shape upb writes, leave it to the general path
        klen, kstart = read_varint(reviewed_head, start + 1, end)
        if reviewed_head.startswith(_UNKNOWN_EXT_KEY, kstart, min(kstart + klen, end)):
            return None
        vpos = kstart + klen
        if vpos < end:  # a value record, and nothing after it: else an odd entry, which
            # the general path refuses (`refuse_odd_map_entries`) instead of renumbering it
            if reviewed_head[vpos] != 0x12:
                return None
            vlen, vstart = read_varint(reviewed_head, vpos + 1, end)
            if vstart + vlen != end:
                return None
        elif vpos != end:
            return None
        tail.append(_DRAFT_EXT_TAG + reviewed_head[pos + 2:end])
        pos = end
    if pos != n:
        return None  # several extension entries or unknown fields after them
    meta = draft_metadata(header.metadata).SerializeToString()
    head = b"".join((_DRAFT_VERSION_RECORD, _DRAFT_METADATA_TAG, _encode_len(len(meta)), meta, *tail))
    return head, dpb.SecurityContext.FromString(sec.SerializeToString())


_DRAFT_VERSION_RECORD = b"\x08\x01"  # envelope_version = 1
_DRAFT_METADATA_TAG = b"\x12"
_REVIEWED_EXT_TAG = b"\x8a\x06"  # field 97, LEN
_DRAFT_EXT_TAG = b"\x9a\x06"  # field 99, LEN
_UNKNOWN_EXT_KEY = UNKNOWN_EXT_PREFIX.encode()


#: What upb writes before the security record, in field-number order: (tag byte, wire type).
_BEFORE_SECURITY = {Layout.REVIEWED: ((0x0A, LEN),), Layout.DRAFT: ((0x08, VARINT), (0x12, LEN))}


def _cut_after_prefix(full: bytes, layout: Layout) -> tuple[bytes, bytes] | None:
    """`split_header`'s common case, read off the bytes: step over the records numbered
    below the security field (reviewed: metadata; draft: version, metadata) and cut the
    security record if it comes next. Every encoder's header looks like that, and walking
    two records costs less than asking upb for their sizes (this runs twice per published
    message). None when the bytes look otherwise (no security record, another order): the
    caller then takes the general path, which finds the same record wherever it is."""
    n = len(full)
    pos = 0
    for tag, wt in _BEFORE_SECURITY[layout]:
        if pos < n and full[pos] == tag:
            value, pos = read_varint(full, pos + 1, n)
            if wt == LEN:
                pos += value
    if pos < n and full[pos] == _SECURITY_TAG_BYTE[layout]:
        length, start = read_varint(full, pos + 1, n)
        end = start + length
        if end <= n:
            return full[:pos] + full[end:], full[pos:end]
    return None


def payload_parts(env: Envelope, layout: Layout) -> list[bytes | memoryview]:
    if not env.payload.present:
        return []
    value = env.payload.wire()
    return [_PAYLOAD_TAG[layout] + _encode_len(len(value)), value]


def security_bytes(sec: vpb.SecurityContext | dpb.SecurityContext, layout: Layout) -> bytes:
    body = sec.SerializeToString()
    return b"".join((_SECURITY_TAG[layout], _encode_len(len(body)), body))


def _encode_len(n: int) -> bytes:
    return bytes((n,)) if n < 0x80 else encode_varint(n)


_PAYLOAD_TAG = {lay: encode_varint((lay.payload_field << 3) | LEN) for lay in Layout}
_SECURITY_TAG = {lay: encode_varint((lay.security_field << 3) | LEN) for lay in Layout}
_SECURITY_TAG_BYTE = {lay: tag[0] for lay, tag in _SECURITY_TAG.items()}  # one byte: fields 2 and 4


def security_record(env: Envelope, layout: Layout = Layout.REVIEWED) -> bytes:
    """The serialized security record alone (empty when the envelope has no security context)."""
    if not env.header.HasField("security"):
        return b""
    return security_bytes(layout_header(env, layout).security, layout)


def encode(env: Envelope, layout: Layout = Layout.REVIEWED) -> bytes:
    """Serialize the envelope in the given layout."""
    head, sec, payload = encode_parts(env, layout)
    return b"".join([head, sec, *payload])


def convert(data: bytes | memoryview, to: Layout, *, limits: Limits = DEFAULT_LIMITS) -> tuple[bytes, list[str]]:
    """Re-encode envelope bytes in another layout; returns the bytes and what was dropped.

    A signature never survives a layout change (it covers the old bytes), so it is removed
    and reported; the pipeline re-signs what it emits.
    """
    dropped: list[str] = []
    env = decode(data, limits=limits, dropped=dropped)
    if to is Layout.DRAFT:
        dropped += reviewed_to_draft(env.header)[1]
    sec = env.security
    if sec is not None and sec.HasField("signature"):
        sec.ClearField("signature")
        sec.ClearField("signature_algorithm")
        sec.ClearField("signature_key_id")
        sec.ClearField("signature_scope")
        sec.ClearField("sibling_digest")
        for name in ("tree_index", "tree_size", "tree_path"):
            sec.ClearField(name)
        dropped.append("security.signature: covers the original bytes only; re-sign after conversion")
    return encode(env, to), dropped

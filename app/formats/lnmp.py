"""The LNMP envelope (LNMP Envelope Specification v1.0): binary TLV block and `#ENVELOPE` text
header, both directions, strict and loose.

Pure LNMP here - no Prism types. `lnmp_envelope.py` maps the result onto Prism envelopes.

Binary form (spec section 4): a 12-byte container header

    "LNMP" | version 0x01 | mode u8 | flags u16 BE | metadata_length u32 BE

followed by `metadata_length` bytes of metadata, then the record. When flags bit 15
(`has_ext_metadata`) is set, the metadata holds the fixed mode metadata of the LNMP container
format (6 bytes for Stream, 10 for Delta, none otherwise) followed by a TLV chain
`type u8 | length u16 BE | value`; envelope entries are 0x10 timestamp (u64 BE), 0x11 source
(UTF-8), 0x12 trace_id (UTF-8), 0x13 sequence (u64 BE); 0x14 (labels) is reserved.

Text form (spec section 5): an optional first line
`#ENVELOPE timestamp=… source=… trace_id=… sequence=…` before the record.

Rules implemented (the spec's normative sections, not its Appendix A example - see
docs/formats.md for what is wrong with that example):

* encoding is canonical: TLV entries in ascending type order, text keys in the order
  timestamp, source, trace_id, sequence, then unknown keys sorted; minimal quoting;
* decoding skips unknown TLV types by their length and keeps unknown text keys, so they can be
  re-emitted unchanged (`extra_tlv`, `extra_keys`);
* strict mode (default) raises `LnmpError` for duplicates, out-of-order entries, bad lengths,
  bad UTF-8, malformed header lines; loose mode ignores a malformed envelope, keeps the record
  and says why in `warnings`. When `metadata_length` disagrees with a TLV chain that is itself
  consistent (too short, too long, past the input, or 0 with bit 15 set), loose mode recovers
  the chain and says so (`_recover_chain`: only when the record boundary is unambiguous);
  when the boundary is ambiguous, it keeps every TLV entry that parses whole inside the
  declared block (`_salvage_whole_entries`) and the record starts where the header says.
  Container damage that hides where the record starts (bad magic, unknown version, metadata
  longer than the input with no recoverable chain) is an error in both modes.
* zero overhead: without an envelope, encoding returns the record object itself (text) or the
  bare container (binary), and decoding returns the input without copying.
"""

from __future__ import annotations

import enum
import re
import struct
from dataclasses import dataclass, field

from ..decimal_text import decimal
from ..errors import LnmpError

MAGIC = b"LNMP"
CONTAINER_VERSION = 0x01
HEADER_LEN = 12
FLAG_CHECKSUM = 0x0001
FLAG_EXT_METADATA = 0x8000
_KNOWN_FLAGS = FLAG_CHECKSUM | FLAG_EXT_METADATA
U64_MAX = (1 << 64) - 1
U16_MAX = 0xFFFF


class Mode(enum.IntEnum):
    """Container mode byte (LNMP container format v1)."""

    TEXT = 0x01
    BINARY = 0x02
    STREAM = 0x03
    DELTA = 0x04
    QUANTUM_SAFE = 0x05


#: Fixed mode metadata that precedes the TLV chain when bit 15 is set.
MODE_METADATA_LENGTH: dict[int, int] = {Mode.STREAM: 6, Mode.DELTA: 10}


class Tlv(enum.IntEnum):
    TIMESTAMP = 0x10
    SOURCE = 0x11
    TRACE_ID = 0x12
    SEQUENCE = 0x13
    LABEL = 0x14  # reserved by the spec: treated as unknown (skipped, kept verbatim)


TEXT_KEYWORD = "#ENVELOPE"
TEXT_KEYS: tuple[str, ...] = ("timestamp", "source", "trace_id", "sequence")
_DIGITS = re.compile(r"[0-9]+")


@dataclass(frozen=True, slots=True)
class LnmpEnvelope:
    """Envelope metadata. Every field is optional; an all-None envelope is 'no envelope'."""

    timestamp: int | None = None
    source: str | None = None
    trace_id: str | None = None
    sequence: int | None = None
    #: TLV entries this implementation does not interpret, (type, value), ascending type.
    extra_tlv: tuple[tuple[int, bytes], ...] = ()
    #: Text keys this implementation does not interpret, (key, value), sorted by key.
    extra_keys: tuple[tuple[str, str], ...] = ()

    def is_empty(self) -> bool:
        return (self.timestamp is None and self.source is None and self.trace_id is None
                and self.sequence is None and not self.extra_tlv and not self.extra_keys)


@dataclass(frozen=True, slots=True)
class TextMessage:
    """A text LNMP message: optional envelope + the record bytes after the header line."""

    envelope: LnmpEnvelope | None
    record: bytes | memoryview
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Container:
    """A binary LNMP container: header fields, envelope, and the record (zero-copy view)."""

    record: bytes | memoryview
    envelope: LnmpEnvelope | None = None
    mode: int = Mode.BINARY
    #: Header flags other than bit 15, which encoding derives from the envelope.
    flags: int = 0
    #: Fixed mode metadata (Stream/Delta), or the whole opaque metadata when bit 15 is clear.
    mode_metadata: bytes = b""
    warnings: tuple[str, ...] = field(default=(), compare=False)


# --------------------------------------------------------------------------- binary TLV


def _check_u64(name: str, value: int) -> None:
    if not 0 <= value <= U64_MAX:
        raise LnmpError(f"{name} {value} does not fit an unsigned 64-bit integer", path=name,
                        hint="LNMP timestamps and sequences are u64")


def _utf8_value(name: str, value: str) -> bytes:
    raw = value.encode("utf-8")
    if len(raw) > U16_MAX:
        raise LnmpError(f"{name} is {len(raw)} bytes, over the TLV limit of {U16_MAX}", path=name,
                        hint="the spec recommends <= 64 chars for source and <= 128 for trace_id")
    return raw


def tlv_entries(env: LnmpEnvelope) -> list[tuple[int, bytes]]:
    """All entries of `env` (known and extra) in canonical ascending type order."""
    entries: list[tuple[int, bytes]] = []
    if env.timestamp is not None:
        _check_u64("timestamp", env.timestamp)
        entries.append((Tlv.TIMESTAMP, env.timestamp.to_bytes(8, "big")))
    if env.source is not None:
        entries.append((Tlv.SOURCE, _utf8_value("source", env.source)))
    if env.trace_id is not None:
        entries.append((Tlv.TRACE_ID, _utf8_value("trace_id", env.trace_id)))
    if env.sequence is not None:
        _check_u64("sequence", env.sequence)
        entries.append((Tlv.SEQUENCE, env.sequence.to_bytes(8, "big")))
    known = {t for t, _ in entries}
    for t, v in env.extra_tlv:
        if not 0 <= t <= 0xFF:
            raise LnmpError(f"TLV type {t} is not a byte", path="extra_tlv", hint="TLV types are 0..255")
        if t in known or t in (Tlv.TIMESTAMP, Tlv.SOURCE, Tlv.TRACE_ID, Tlv.SEQUENCE):
            raise LnmpError(f"TLV type 0x{t:02x} given twice", path="extra_tlv",
                            hint="each type appears at most once; known types belong in their fields")
        if len(v) > U16_MAX:
            raise LnmpError(f"TLV 0x{t:02x} value is {len(v)} bytes, over {U16_MAX}", path="extra_tlv")
        known.add(t)
        entries.append((t, bytes(v)))
    entries.sort(key=lambda e: e[0])
    return entries


def encode_tlv(env: LnmpEnvelope) -> bytes:
    """The TLV chain of `env`, canonical (ascending types)."""
    return b"".join(struct.pack(">BH", t, len(v)) + v for t, v in tlv_entries(env))


def decode_tlv(block: bytes | memoryview) -> LnmpEnvelope:
    """Parse a TLV chain strictly (spec 4.2/4.3): ascending types, each at most once,
    fixed lengths for timestamp and sequence, UTF-8 strings, unknown types skipped (kept)."""
    view = memoryview(block)
    pos, end = 0, len(view)
    last = -1
    values: dict[int, object] = {}
    extra: list[tuple[int, bytes]] = []
    while pos < end:
        if end - pos < 3:
            raise LnmpError(f"TLV header truncated: {end - pos} byte(s) left, 3 needed", path=f"metadata byte {pos}",
                            hint="metadata_length must cover whole TLV entries")
        t = view[pos]
        length = (view[pos + 1] << 8) | view[pos + 2]
        start = pos + 3
        if length > end - start:
            raise LnmpError(f"TLV 0x{t:02x} claims {length} bytes but only {end - start} remain",
                            path=f"metadata byte {pos}", hint="the metadata block is truncated or corrupted")
        if t == last:
            raise LnmpError(f"TLV type 0x{t:02x} appears twice", path=f"metadata byte {pos}",
                            hint="each type may appear at most once (spec 4.2 rule 2)")
        if t < last:
            raise LnmpError(f"TLV type 0x{t:02x} follows 0x{last:02x}", path=f"metadata byte {pos}",
                            hint="entries must be in ascending type order (spec 4.2 rule 1)")
        last = t
        value = view[start : start + length]
        if t in (Tlv.TIMESTAMP, Tlv.SEQUENCE):
            name = Tlv(t).name.lower()
            if length != 8:
                raise LnmpError(f"{name} TLV has length {length}, must be 8", path=f"metadata byte {pos}",
                                hint=f"encode {name} as a u64 big-endian")
            values[t] = int.from_bytes(value, "big")
        elif t in (Tlv.SOURCE, Tlv.TRACE_ID):
            name = Tlv(t).name.lower()
            try:
                values[t] = str(value, "utf-8")
            except UnicodeDecodeError:
                raise LnmpError(f"{name} TLV is not valid UTF-8", path=f"metadata byte {pos}",
                                hint=f"{name} is a UTF-8 string") from None
        else:
            extra.append((t, bytes(value)))  # unknown: skipped by length, kept verbatim
        pos = start + length
    return _envelope(values, extra)


def _envelope(values: dict[int, object], extra: list[tuple[int, bytes]] | None = None) -> LnmpEnvelope:
    """The envelope of decoded TLV `values` (type -> int or str) and unknown entries `extra`."""
    return LnmpEnvelope(
        timestamp=values.get(Tlv.TIMESTAMP),  # type: ignore[arg-type]
        source=values.get(Tlv.SOURCE),  # type: ignore[arg-type]
        trace_id=values.get(Tlv.TRACE_ID),  # type: ignore[arg-type]
        sequence=values.get(Tlv.SEQUENCE),  # type: ignore[arg-type]
        extra_tlv=tuple(extra or ()),
    )


def _lenient_value(t: int, value: memoryview) -> int | str | None:
    """An envelope entry's value, or None where it breaks the rules (loose mode stops there
    instead of raising, as `decode_tlv` does): 8-byte numbers, UTF-8 strings."""
    if t in (Tlv.TIMESTAMP, Tlv.SEQUENCE):
        return int.from_bytes(value, "big") if len(value) == 8 else None
    try:
        return str(value, "utf-8")
    except UnicodeDecodeError:
        return None


# --------------------------------------------------------------------------- container


def is_container(data: bytes | memoryview) -> bool:
    """Magic, version 0x01 and a known mode: cheap and specific enough for shape detection."""
    return (len(data) >= HEADER_LEN and bytes(data[:4]) == MAGIC and data[4] == CONTAINER_VERSION
            and data[5] in Mode._value2member_map_)


def encode_container(c: Container) -> bytes:
    """Serialize canonically. Bit 15 and the TLV chain appear only when the envelope has
    entries, so a container without an envelope is byte-identical to the bare container."""
    if not 0 <= c.mode <= 0xFF:
        raise LnmpError(f"mode {c.mode} is not a byte", path="mode")
    if c.flags & FLAG_EXT_METADATA or not 0 <= c.flags <= U16_MAX:
        raise LnmpError(f"flags 0x{c.flags:x} must be a u16 without bit 15", path="flags",
                        hint="bit 15 (has_ext_metadata) is derived from the envelope")
    tlv = encode_tlv(c.envelope) if c.envelope is not None else b""
    flags = c.flags | (FLAG_EXT_METADATA if tlv else 0)
    if tlv:
        fixed = MODE_METADATA_LENGTH.get(c.mode, 0)
        if len(c.mode_metadata) != fixed:
            raise LnmpError(f"mode 0x{c.mode:02x} needs {fixed} bytes of fixed metadata before the TLV chain, "
                            f"got {len(c.mode_metadata)}", path="mode_metadata",
                            hint="Stream takes 6 bytes, Delta 10, other modes none")
    metadata = c.mode_metadata + tlv
    header = MAGIC + struct.pack(">BBHI", CONTAINER_VERSION, c.mode, flags, len(metadata))
    return b"".join((header, metadata, c.record))


def decode_container(data: bytes | memoryview, *, strict: bool = True) -> Container:
    """Parse a container; the record is a zero-copy view of `data`."""
    view = memoryview(data)
    if len(view) < HEADER_LEN:
        raise LnmpError(f"LNMP container is {len(view)} bytes, shorter than its 12-byte header",
                        path="byte 0", hint="the message was truncated")
    if bytes(view[:4]) != MAGIC:
        raise LnmpError("not an LNMP container: magic is not 'LNMP'", path="byte 0",
                        hint="an LNMP container starts with the 4 bytes 'LNMP'")
    version, mode, flags, mlen = struct.unpack_from(">BBHI", view, 4)
    if version != CONTAINER_VERSION:
        raise LnmpError(f"unsupported LNMP container version 0x{version:02x}", path="byte 4",
                        hint="this reader supports container version 0x01")
    if mode not in Mode._value2member_map_:
        raise LnmpError(f"unknown LNMP mode 0x{mode:02x}", path="byte 5",
                        hint="modes are 0x01 text, 0x02 binary, 0x03 stream, 0x04 delta, 0x05 quantum-safe")
    past_end = mlen > len(view) - HEADER_LEN
    if past_end and (strict or not flags & FLAG_EXT_METADATA):
        raise LnmpError(f"metadata_length {mlen} runs past the end ({len(view) - HEADER_LEN} bytes follow the header)",
                        path="byte 8", hint="the message was truncated or metadata_length is wrong")
    warnings: list[str] = []
    reserved = flags & ~_KNOWN_FLAGS
    if reserved:
        msg = f"reserved container flag bits 0x{reserved:04x} are set"
        if strict:
            raise LnmpError(msg, path="byte 6", hint="only bit 0 (checksum) and bit 15 (has_ext_metadata) are defined")
        warnings.append(msg + "; kept as is (loose mode)")
    block = view[HEADER_LEN : HEADER_LEN + mlen]
    record = view[HEADER_LEN + mlen :]
    envelope: LnmpEnvelope | None = None
    mode_metadata = bytes(block)
    if flags & FLAG_EXT_METADATA:
        fixed = MODE_METADATA_LENGTH.get(mode, 0)
        problem: LnmpError | None = None
        try:
            if past_end:
                raise LnmpError(f"metadata_length {mlen} runs past the end ({len(view) - HEADER_LEN} bytes follow "
                                "the header)", path="byte 8", hint="the message was truncated or metadata_length is wrong")
            if mlen < fixed:
                raise LnmpError(f"metadata_length {mlen} is shorter than mode 0x{mode:02x}'s {fixed}-byte fixed metadata",
                                path="byte 8", hint="the TLV chain follows the fixed mode metadata")
            mode_metadata = bytes(block[:fixed])
            envelope = decode_tlv(block[fixed:])
        except LnmpError as exc:
            if strict:
                raise
            problem = exc
        if not strict and (problem is not None or (envelope is not None and envelope.is_empty())):
            found = _recover_chain(view, mode, mlen)
            if found is not None:
                mode_metadata, envelope, end = found
                record = view[end:]
                warnings.append(
                    f"metadata_length declares {mlen} bytes but the TLV chain ends after {end - HEADER_LEN}; "
                    f"envelope recovered from the TLVs, record starts at byte {end} (loose mode)")
            elif past_end:
                assert problem is not None
                raise problem
            elif problem is not None:
                mode_metadata = bytes(block[: min(fixed, mlen)])
                kept = _salvage_whole_entries(block[fixed:]) if mlen >= fixed else None
                if kept is None:
                    envelope = None
                    warnings.append(f"envelope ignored (loose mode): {problem}")
                else:
                    envelope, count = kept
                    warnings.append(
                        f"metadata_length declares {mlen} bytes, which does not end on a TLV boundary ({problem}); "
                        f"kept the {count} whole TLV entr{'y' if count == 1 else 'ies'} inside it, record starts at "
                        f"byte {HEADER_LEN + mlen} as declared (loose mode)")
    return Container(record=record, envelope=envelope, mode=mode, flags=flags & ~FLAG_EXT_METADATA,
                     mode_metadata=mode_metadata, warnings=tuple(warnings))


def _salvage_whole_entries(chain: memoryview) -> tuple[LnmpEnvelope, int] | None:
    """Loose mode, when `_recover_chain` cannot place the record boundary: the TLV entries that
    parse whole inside the declared block (LNMP spec v1 Appendix A and section 9: be lenient in
    what you accept, but never guess where the record starts).

    Applies only when the declared length disagrees with the self-delimiting chain - walking the
    entries by their own lengths does not land exactly on the declared end (an entry runs past
    it, or 1-2 bytes of a TLV header are left). A chain that fills the block exactly but breaks
    a rule (duplicate, order, bad value) is a broken chain, not a length disagreement: it stays
    ignored, as before. What is kept is the longest prefix of whole entries that also obeys the
    rules (ascending types, 8-byte numbers, UTF-8 strings); unknown types are kept verbatim, as
    `decode_tlv` keeps them. The record stays where the header says it starts, so no record byte
    ever becomes metadata. Returns (envelope, entries kept), or None when nothing applies."""
    end = len(chain)
    pos = 0
    whole: list[tuple[int, memoryview]] = []
    while end - pos >= 3:
        length = (chain[pos + 1] << 8) | chain[pos + 2]
        if pos + 3 + length > end:
            break
        whole.append((chain[pos], chain[pos + 3 : pos + 3 + length]))
        pos += 3 + length
    if pos == end:
        return None  # the lengths agree: the chain itself is broken
    values: dict[int, object] = {}
    extra: list[tuple[int, bytes]] = []
    last = -1
    for t, value in whole:
        if t <= last:
            break
        if t in _ENVELOPE_TYPES:
            parsed = _lenient_value(t, value)
            if parsed is None:
                break
            values[t] = parsed
        else:
            extra.append((t, bytes(value)))
        last = t
    count = len(values) + len(extra)
    if not count:
        return None
    return _envelope(values, extra), count


_ENVELOPE_TYPES = frozenset(t.value for t in (Tlv.TIMESTAMP, Tlv.SOURCE, Tlv.TRACE_ID, Tlv.SEQUENCE))


def _recover_chain(view: memoryview, mode: int, mlen: int) -> tuple[bytes, LnmpEnvelope, int] | None:
    """Loose mode: find where the metadata really ends when `metadata_length` disagrees with it.

    Reads the TLV chain from where it starts (after the mode's fixed metadata) without trusting
    `mlen`: envelope entries only (0x10-0x13), strictly ascending, each valid (8-byte numbers,
    UTF-8 strings) and inside the input. The chain ends at the first bytes that are not such an
    entry. Recovery returns (fixed metadata, envelope, index where the record starts) only when
    that boundary is unambiguous:

    * at least one entry was found, a non-empty record follows (the spec makes it mandatory),
      and the boundary is not the declared one (then the length was right and the chain is broken);
    * the first record bytes cannot be read as one more entry: a TLV header whose length fits in
      the input and whose type would continue the chain, or whose length fits in the declared
      block (a duplicated or out-of-order entry the declared length accounts for). Otherwise we
      cannot tell metadata from record, and recovering could hand record bytes to the envelope.

    Never reads past the input (every length is checked against it) and always terminates
    (each step advances by at least 3 bytes, at most 4 entries).
    """
    n = len(view)
    start = HEADER_LEN + MODE_METADATA_LENGTH.get(mode, 0)
    declared_end = HEADER_LEN + mlen
    pos, last = start, -1
    values: dict[int, object] = {}
    while n - pos >= 3:
        t = view[pos]
        length = (view[pos + 1] << 8) | view[pos + 2]
        end = pos + 3 + length
        if t not in _ENVELOPE_TYPES or t <= last or end > n:
            break
        parsed = _lenient_value(t, view[pos + 3 : end])
        if parsed is None:
            break
        values[t] = parsed
        last, pos = t, end
    if not values or pos >= n or pos == declared_end:
        return None
    if n - pos >= 3:
        nxt_end = pos + 3 + ((view[pos + 1] << 8) | view[pos + 2])
        if nxt_end <= n and (view[pos] > last or nxt_end <= declared_end):
            return None
    return bytes(view[HEADER_LEN:start]), _envelope(values), pos


# --------------------------------------------------------------------------- text header


def _quote(value: str) -> str:
    """Minimal quoting (spec 5.3): only values with a space - or that would otherwise read as
    quoted, i.e. start with a double quote - are quoted; inside quotes `\\` and `"` are escaped."""
    if " " not in value and not value.startswith('"'):
        return value
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _check_line_value(name: str, value: str) -> None:
    if "\n" in value or "\r" in value:
        raise LnmpError(f"{name} contains a line break", path=name,
                        hint="the #ENVELOPE header is one line; remove CR/LF from the value")


def encode_text_header(env: LnmpEnvelope | None) -> str:
    """The canonical `#ENVELOPE …` line (without newline); "" when there is nothing to say."""
    if env is None or env.is_empty():
        return ""
    parts = [TEXT_KEYWORD]
    if env.timestamp is not None:
        _check_u64("timestamp", env.timestamp)
        parts.append(f"timestamp={env.timestamp}")
    if env.source is not None:
        _check_line_value("source", env.source)
        parts.append(f"source={_quote(env.source)}")
    if env.trace_id is not None:
        _check_line_value("trace_id", env.trace_id)
        parts.append(f"trace_id={_quote(env.trace_id)}")
    if env.sequence is not None:
        _check_u64("sequence", env.sequence)
        parts.append(f"sequence={env.sequence}")
    seen: set[str] = set()
    for key, value in sorted(env.extra_keys):
        if not key or any(c in key for c in ' ="\r\n') or key in TEXT_KEYS or key in seen:
            raise LnmpError(f"extra key {key!r} is empty, duplicated, known, or has a space, '=', quote or line break",
                            path="extra_keys", hint="extra keys are bare words, each once")
        seen.add(key)
        _check_line_value(key, value)
        parts.append(f"{key}={_quote(value)}")
    return " ".join(parts)


def _tokenize(body: str) -> list[tuple[str, str]]:
    """Split `key=value key="quoted value"` pairs (spec 5.1). Raises LnmpError on bad syntax."""
    pairs: list[tuple[str, str]] = []
    i, n = 0, len(body)
    while True:
        while i < n and body[i] == " ":
            i += 1
        if i >= n:
            return pairs
        eq = body.find("=", i)
        sp = body.find(" ", i)
        if eq < 0 or (0 <= sp < eq):
            token = body[i : sp if sp >= 0 else n]
            raise LnmpError(f"#ENVELOPE token {token[:40]!r} has no '='", path=f"#ENVELOPE char {i}",
                            hint="write key=value pairs separated by spaces")
        key = body[i:eq]
        if '"' in key:
            raise LnmpError(f"#ENVELOPE key {key[:40]!r} contains a quote", path=f"#ENVELOPE char {i}",
                            hint="keys are bare words; only values may be quoted")
        i = eq + 1
        if i < n and body[i] == '"':
            out: list[str] = []
            i += 1
            while True:
                if i >= n:
                    raise LnmpError(f"unterminated quoted value for {key!r}", path=f"#ENVELOPE char {eq + 1}",
                                    hint='close the value with a double quote')
                c = body[i]
                if c == "\\":
                    nxt = body[i + 1 : i + 2]
                    if nxt not in ("\\", '"'):
                        raise LnmpError(f"bad escape '\\{nxt}' in the value of {key!r}", path=f"#ENVELOPE char {i}",
                                        hint='only \\\\ and \\" are escapes in #ENVELOPE values')
                    out.append(nxt)
                    i += 2
                elif c == '"':
                    i += 1
                    break
                else:
                    out.append(c)
                    i += 1
            if i < n and body[i] != " ":
                raise LnmpError(f"text after the closing quote of {key!r}", path=f"#ENVELOPE char {i}",
                                hint="separate pairs with a space")
            value = "".join(out)
        else:
            end = body.find(" ", i)
            end = n if end < 0 else end
            value = body[i:end]
            i = end
        pairs.append((key, value))


def _u64_text(key: str, value: str) -> int:
    # decimal(), not int() after [0-9]+: 5,000 digits were int()'s ValueError out of the decoder
    number = decimal(value, most_digits=20) if _DIGITS.fullmatch(value) else None
    if number is None or number > U64_MAX:
        raise LnmpError(f"#ENVELOPE {key} {value[:40]!r} is not an unsigned 64-bit decimal", path=f"#ENVELOPE {key}",
                        hint=f"write {key} as digits only, e.g. {key}=42")
    return number


def parse_text_header(line: str) -> LnmpEnvelope:
    """Parse one `#ENVELOPE …` line strictly (no trailing newline). Pair order is free
    (spec 5.2); a key given twice is an error; unknown keys are kept in `extra_keys`."""
    if not line.startswith(TEXT_KEYWORD) or line[len(TEXT_KEYWORD) : len(TEXT_KEYWORD) + 1] not in ("", " "):
        raise LnmpError("line does not start with '#ENVELOPE '", path="line 1",
                        hint="the header line starts with '#ENVELOPE' and a space")
    known: dict[str, str] = {}
    extra: dict[str, str] = {}
    for key, value in _tokenize(line[len(TEXT_KEYWORD) :]):
        if not key:
            raise LnmpError("#ENVELOPE has a pair with an empty key", path="#ENVELOPE",
                            hint="write key=value with a non-empty key")
        if key in known or key in extra:
            raise LnmpError(f"#ENVELOPE key {key!r} appears twice", path=f"#ENVELOPE {key}",
                            hint="give each key once")
        (known if key in TEXT_KEYS else extra)[key] = value
    return LnmpEnvelope(
        timestamp=_u64_text("timestamp", known["timestamp"]) if "timestamp" in known else None,
        source=known.get("source"),
        trace_id=known.get("trace_id"),
        sequence=_u64_text("sequence", known["sequence"]) if "sequence" in known else None,
        extra_keys=tuple(sorted(extra.items())),
    )


def has_text_header(data: bytes | memoryview) -> bool:
    """True when the first line is an `#ENVELOPE` header (not e.g. a `#ENVELOPES` comment)."""
    head = bytes(data[: len(TEXT_KEYWORD) + 1])
    return head[: len(TEXT_KEYWORD)] == TEXT_KEYWORD.encode() and head[len(TEXT_KEYWORD) :] in (b"", b" ", b"\n", b"\r")


def decode_text(data: bytes | memoryview, *, strict: bool = True) -> TextMessage:
    """Split an optional `#ENVELOPE` first line from the record.

    No header: the record is `data` itself, not a copy (spec 5.2: records without the line are
    valid). With a header, the record is a zero-copy view of what follows the first newline.
    """
    if not has_text_header(data):
        return TextMessage(None, data)
    view = memoryview(data)
    nl = bytes(view).find(b"\n") if len(view) < 4096 else _find_newline(view)
    line_bytes = view[:nl] if nl >= 0 else view
    record = view[nl + 1 :] if nl >= 0 else view[len(view) :]
    try:
        line = str(line_bytes, "utf-8")
        if line.endswith("\r"):
            line = line[:-1]
        env = parse_text_header(line)
    except UnicodeDecodeError as exc:
        if strict:
            raise LnmpError(f"#ENVELOPE line is not valid UTF-8 (byte {exc.start})", path="line 1",
                            hint="write the header as UTF-8 text") from None
        return TextMessage(None, record, (f"envelope ignored (loose mode): not UTF-8 at byte {exc.start}",))
    except LnmpError as exc:
        if strict:
            raise
        return TextMessage(None, record, (f"envelope ignored (loose mode): {exc}",))
    return TextMessage(env, record)


def _find_newline(view: memoryview) -> int:
    """Find the first newline without copying a large record: scan growing prefixes."""
    size = 4096
    while True:
        chunk = bytes(view[:size])
        idx = chunk.find(b"\n")
        if idx >= 0 or size >= len(view):
            return idx
        size *= 4


def encode_text(record: bytes | memoryview, envelope: LnmpEnvelope | None) -> bytes | memoryview:
    """Header line + newline + record; without envelope metadata, the record object itself."""
    header = encode_text_header(envelope)
    if not header:
        return record
    return b"".join((header.encode("utf-8"), b"\n", record))

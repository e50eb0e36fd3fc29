"""A tiny protobuf wire-format walker for the envelope's top level.

Why not just `ParseFromString`? Three things need the records themselves, not a message:

* header-only parsing - skip the payload record by its length prefix, keep it as a
  zero-copy `memoryview`, so the cost of reading metadata/security does not grow with
  the payload (memo-031 "Question 2");
* signature scope - the signed bytes are cut from the received bytes (scope v2: the
  security record re-framed without its signature and token; legacy: without the security
  record), so no re-serialisation (which protobuf does not make canonical across
  languages) is ever needed (docs/signing.md);
* layout detection - the draft and reviewed layouts differ in field numbers and wire types.

Only the top level is walked here; nested messages are left to upb.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

from .. import native as _native
from ..errors import LengthError, SizeLimitError, TruncatedError, WireTypeError

VARINT, I64, LEN, SGROUP, EGROUP, I32 = 0, 1, 2, 3, 4, 5
_MAX_FIELD = (1 << 29) - 1


class Record(NamedTuple):
    """One top-level record: `buf[start:end]` is the whole record (tag included);
    for LEN records `buf[value_start:end]` is the value."""

    field: int
    wire_type: int
    start: int
    value_start: int
    end: int


def read_varint(buf: memoryview | bytes, pos: int, end: int) -> tuple[int, int]:
    """Decode a base-128 varint at `pos`; returns (value, position after it)."""
    result = 0
    shift = 0
    while True:
        if pos >= end:
            raise TruncatedError("varint runs past the end of the input", path=f"byte {pos}")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift >= 70:
            raise LengthError("varint longer than 10 bytes", path=f"byte {pos}")


def scan(buf: memoryview | bytes, start: int = 0, end: int | None = None) -> list[tuple[int, int, int, int, int]]:
    """All records of one message in `buf[start:end]` as plain tuples
    `(field, wire_type, start, value_start, end)`, without copying anything.

    This is on every message's hot path: the common case (tags and lengths of one or two
    bytes) is decoded inline and records are plain tuples (a NamedTuple costs ~5x more to
    build); `iter_records` gives the named form.
    """
    return _walk(buf, start, len(buf) if end is None else end, None)


def _walk(buf: memoryview | bytes, start: int, end: int, limit: tuple[tuple[int, ...], int] | None,
          ) -> list[tuple[int, int, int, int, int]]:
    """`scan`'s walk; with `limit` = (payload fields, max header bytes), `scan_envelope`'s,
    which stops once the header is over the limit for every payload field (layout) given."""
    pos = start
    out: list[tuple[int, int, int, int, int]] = []
    append = out.append
    if limit is not None:
        payload_fields, max_header = limit
        header = [0] * len(payload_fields)
        seen = [False] * len(payload_fields)
    while pos < end:
        rec_start = pos
        b = buf[pos]
        if b < 0x80:
            key = b
            pos += 1
        elif pos + 1 < end and buf[pos + 1] < 0x80:
            key = (b & 0x7F) | (buf[pos + 1] << 7)
            pos += 2
        else:
            key, pos = read_varint(buf, pos, end)
        field = key >> 3
        wt = key & 7
        if field == 0 or field > _MAX_FIELD:
            raise WireTypeError(f"invalid field number {field}", path=f"byte {rec_start}")
        if wt == LEN:
            b = buf[pos] if pos < end else 0x80
            if b < 0x80:
                length = b
                value_start = pos + 1
            elif pos + 1 < end and buf[pos + 1] < 0x80:  # 128 B - 16 KB: the security context, a payload
                length = (b & 0x7F) | (buf[pos + 1] << 7)
                value_start = pos + 2
            else:
                length, value_start = read_varint(buf, pos, end)
            pos = value_start + length
            if pos > end:
                raise LengthError(
                    f"field {field} claims {length} bytes but only {end - value_start} remain",
                    path=f"byte {rec_start}",
                    hint="the message was truncated or corrupted in transit",
                )
            append((field, wt, rec_start, value_start, pos))
        elif wt == VARINT:
            if pos < end and buf[pos] < 0x80:  # a one-byte value (flags, small enums)
                pos += 1
            else:
                _, pos = read_varint(buf, pos, end)
            append((field, wt, rec_start, rec_start, pos))
        elif wt in (I64, I32):
            pos += 8 if wt == I64 else 4
            if pos > end:
                raise TruncatedError(f"fixed-width field {field} runs past the end", path=f"byte {rec_start}")
            append((field, wt, rec_start, rec_start, pos))
        else:
            raise WireTypeError(
                f"wire type {wt} (group or invalid) for field {field} is not supported at the envelope's top level",
                path=f"byte {rec_start}",
            )
        if limit is not None:
            over = True
            for i, pf in enumerate(payload_fields):
                if field != pf or wt != LEN:
                    header[i] += pos - rec_start
                elif seen[i]:  # a repeated payload record: its tag and length are header
                    header[i] += out[-1][3] - rec_start
                else:
                    seen[i] = True
                if header[i] <= max_header:
                    over = False
            if over:
                raise SizeLimitError(
                    f"envelope header is over the {max_header}-byte limit ({min(header)} bytes by byte {pos})",
                    hint="move bulky data into the payload, or raise Limits.max_header_bytes",
                )
    return out


_py_scan = scan

if _native.module is not None:
    _native_scan = _native.module.scan
    _WireFault = _native.module.WireFault
    _fault = _native.scan_fault

    def scan(  # the compiled walk replaces the Python one (app/native.py)
        buf: memoryview | bytes, start: int = 0, end: int | None = None,
    ) -> list[tuple[int, int, int, int, int]]:
        """`scan`, compiled (`prism_native.scan`, the Rust client's walker): the same tuples,
        and the same `PrismError` for bad input."""
        try:
            return _native_scan(buf, start, end)  # type: ignore[no-any-return]
        except _WireFault as exc:
            raise _fault(exc.args) from None


def scan_envelope(buf: memoryview | bytes, payload_fields: tuple[int, ...], max_header: int,
                  ) -> list[tuple[int, int, int, int, int]]:
    """`scan` of an envelope's top level with the header limit applied while walking.

    A record is a ~100-byte tuple and may be 2-3 bytes of input, so 16 MiB of tiny records
    (or of empty payload records, which are not header) became millions of tuples, gigabytes,
    before the header was checked. The header is every record but the payload record; a
    repeated payload record's tag and length count as header (encoders write one payload
    record; protobuf merges copies). `payload_fields`: the payload's field number in each
    layout the bytes may be (3 draft, 99 reviewed); the walk stops with `SizeLimitError` once
    the header is over `max_header` in all of them - the Go and Rust clients' `ScanEnvelope` /
    `scan_envelope`, the same rule (docs/formats.md, "Size first").

    Input no longer than `max_header` cannot hold a header over it and has at most half as many
    records as bytes: that (every message the worker's hot path sees but large ones) is walked
    by `scan`, compiled where it is; the rest by the Python walk, which can stop.
    """
    if len(buf) <= max_header:
        return scan(buf)
    return _walk(buf, 0, len(buf), (payload_fields, max_header))


def iter_records(buf: memoryview | bytes, start: int = 0, end: int | None = None) -> Iterator[Record]:
    """Iterate the records of one message as named `Record`s (see `scan` for the fast form)."""
    return (Record(*t) for t in scan(buf, start, end))


def encode_varint(value: int) -> bytes:
    out = bytearray()
    while True:
        b = value & 0x7F
        value >>= 7
        if value:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def len_record(field: int, value: bytes | memoryview) -> list[bytes | memoryview]:
    """The parts of a length-delimited record; returned as parts so a large value is not copied twice."""
    return [encode_varint((field << 3) | LEN) + encode_varint(len(value)), value]


def strip_field(buf: memoryview | bytes, field: int) -> list[memoryview]:
    """The contiguous runs of `buf` that remain after removing every top-level record of `field`."""
    view = memoryview(buf)
    runs: list[memoryview] = []
    run_start = 0
    for f, _, start, _, end in scan(view):
        if f == field:
            if start > run_start:
                runs.append(view[run_start:start])
            run_start = end
    if run_start < len(view):
        runs.append(view[run_start:])
    return runs

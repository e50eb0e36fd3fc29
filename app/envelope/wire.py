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
from ..errors import LengthError, TruncatedError, WireTypeError

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
    end = len(buf) if end is None else end
    pos = start
    out: list[tuple[int, int, int, int, int]] = []
    append = out.append
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

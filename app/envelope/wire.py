"""A tiny protobuf wire-format walker for the envelope's top level.

Why not just `ParseFromString`? Three things need the records themselves, not a message:

* header-only parsing - skip the payload record by its length prefix, keep it as a
  zero-copy `memoryview`, so the cost of reading metadata/security does not grow with
  the payload (memo-031 "Question 2");
* signature scope - the signed bytes are the envelope minus every record of the security
  field, cut out of the received bytes, so no re-serialisation (which protobuf does not
  make canonical across languages) is ever needed;
* layout detection - the draft and reviewed layouts differ in field numbers and wire types.

Only the top level is walked here; nested messages are left to upb.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

from app.errors import LengthError, TruncatedError, WireTypeError

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


def iter_records(buf: memoryview | bytes, start: int = 0, end: int | None = None) -> Iterator[Record]:
    """Walk the records of one message in `buf[start:end]` without copying anything."""
    end = len(buf) if end is None else end
    pos = start
    while pos < end:
        rec_start = pos
        key, pos = read_varint(buf, pos, end)
        field, wt = key >> 3, key & 7
        if field == 0 or field > _MAX_FIELD:
            raise WireTypeError(f"invalid field number {field}", path=f"byte {rec_start}")
        if wt == VARINT:
            _, pos = read_varint(buf, pos, end)
            yield Record(field, wt, rec_start, rec_start, pos)
        elif wt == LEN:
            length, value_start = read_varint(buf, pos, end)
            if length > end - value_start:
                raise LengthError(
                    f"field {field} claims {length} bytes but only {end - value_start} remain",
                    path=f"byte {rec_start}",
                    hint="the message was truncated or corrupted in transit",
                )
            pos = value_start + length
            yield Record(field, wt, rec_start, value_start, pos)
        elif wt in (I64, I32):
            pos += 8 if wt == I64 else 4
            if pos > end:
                raise TruncatedError(f"fixed-width field {field} runs past the end", path=f"byte {rec_start}")
            yield Record(field, wt, rec_start, rec_start, pos)
        else:
            raise WireTypeError(
                f"wire type {wt} (group or invalid) for field {field} is not supported at the envelope's top level",
                path=f"byte {rec_start}",
            )


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
    for rec in iter_records(view):
        if rec.field == field:
            if rec.start > run_start:
                runs.append(view[run_start : rec.start])
            run_start = rec.end
    if run_start < len(view):
        runs.append(view[run_start:])
    return runs

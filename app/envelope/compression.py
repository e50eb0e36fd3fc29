"""Payload compression per `metadata.content_encoding` (gzip, snappy, zstd).

gzip is the stdlib, snappy comes from cramjam, zstd from the `zstandard` bindings (which
can stream with a bound).

Decompression is bounded (`max_size`) so a small "zip bomb" cannot exhaust memory: the
check happens while inflating, not after. Snappy uses the raw block format, whose
preamble declares the uncompressed length, so it is checked before any work is done.

A gzip payload is one gzip member or one zlib stream, and a zstd payload one zstd frame, with
nothing after it: runtimes disagree on what follows (Python's decoders read the first member or
frame and stop, Go's and Rust's readers concatenated them), so one signed payload could read as
two values in two clients. Bytes after the compressed data are refused, as the Go and Rust
clients refuse them (docs/formats.md, "Payload compression").
"""

from __future__ import annotations

import zlib

import cramjam
import zstandard

from ..errors import CompressionError

DEFAULT_MAX_DECOMPRESSED = 64 * 1024 * 1024
IDENTITY = frozenset({"", "none", "identity"})
SUPPORTED = frozenset({"gzip", "snappy", "zstd"}) | IDENTITY


def compress(data: bytes | memoryview, encoding: str) -> bytes:
    if encoding in IDENTITY:
        return bytes(data)
    if encoding == "gzip":
        c = zlib.compressobj(6, zlib.DEFLATED, 31)  # wbits=31: gzip container
        return c.compress(data) + c.flush()
    if encoding == "snappy":
        return bytes(cramjam.snappy.compress_raw(bytes(data)))
    if encoding == "zstd":
        return zstandard.ZstdCompressor(level=3).compress(bytes(data))
    raise CompressionError(
        f"unsupported content_encoding {encoding!r}",
        path="metadata.content_encoding",
        hint=f"use one of {sorted(SUPPORTED - {''})}",
    )


def _varint_prefix(data: bytes | memoryview) -> int:
    result = shift = 0
    for i in range(min(len(data), 5)):
        b = data[i]
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result
        shift += 7
    raise CompressionError("snappy preamble is not a valid varint", path="payload")


def _trailing(encoding: str, n: int) -> CompressionError:
    return CompressionError(
        f"{encoding} payload has {n} bytes after its compressed data (a second member or frame, or garbage)",
        path="payload", hint="compress the payload as one gzip member or one zstd frame",
    )


_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


def _zstd_frame_len(data: bytes | memoryview) -> int:
    """The length of the regular zstd frame `data` starts with (header, blocks, optional
    checksum), walked from the block headers without decoding. Empty, truncated or skippable
    input, or a reserved block type, is a `CompressionError`: Python's stream reader read
    those as b"" or as part of a payload, where Go's and Rust's decoders fail."""
    if bytes(data[:4]) != _ZSTD_MAGIC:
        raise CompressionError(
            "zstd payload does not start with a zstd frame" + (" (it is empty)" if not len(data) else ""),
            path="payload", hint="compress the payload as one zstd frame",
        )
    truncated = CompressionError("zstd payload is truncated (its frame does not end)", path="payload",
                                 hint="the message was truncated or corrupted in transit")
    try:
        pos = zstandard.frame_header_size(bytes(data[:18]))
        checksum = zstandard.get_frame_parameters(bytes(data[:18])).has_checksum
    except zstandard.ZstdError:
        raise truncated from None
    end = len(data)
    while True:
        if end - pos < 3:
            raise truncated
        header = data[pos] | (data[pos + 1] << 8) | (data[pos + 2] << 16)
        pos += 3
        kind = (header >> 1) & 3
        if kind == 3:
            raise CompressionError("zstd payload has a block of the reserved type", path="payload")
        size = 1 if kind == 1 else header >> 3  # an RLE block is one byte, repeated
        if end - pos < size:
            raise truncated
        pos += size
        if header & 1:  # the last block
            break
    pos += 4 if checksum else 0
    if pos > end:
        raise truncated
    return pos


def decompress(data: bytes | memoryview, encoding: str, *, max_size: int = DEFAULT_MAX_DECOMPRESSED) -> bytes:
    if encoding in IDENTITY:
        return bytes(data)
    try:
        if encoding == "gzip":
            d = zlib.decompressobj(47)  # auto-detect gzip/zlib header
            out = d.decompress(data, max_size + 1)
            if len(out) > max_size or d.unconsumed_tail:
                raise CompressionError(
                    f"gzip payload inflates beyond the {max_size}-byte limit", path="payload",
                    hint="raise Limits.max_decompressed_bytes if this size is legitimate",
                )
            if not d.eof:
                raise CompressionError("gzip payload is truncated", path="payload")
            if d.unused_data:
                raise _trailing("gzip", len(d.unused_data))
            return out
        if encoding == "snappy":
            declared = _varint_prefix(data)
            if declared > max_size:
                raise CompressionError(
                    f"snappy payload declares {declared} bytes, over the {max_size}-byte limit", path="payload"
                )
            return bytes(cramjam.snappy.decompress_raw(bytes(data)))
        if encoding == "zstd":
            # One whole frame and nothing after it: the stream reader stops at the end of the
            # first frame and answers b"" for an empty or truncated input, so the frame's length
            # is walked from its block headers first.
            size = _zstd_frame_len(data)
            if size < len(data):
                raise _trailing("zstd", len(data) - size)
            # Streamed and bounded: a frame may not declare its size, and one that does may lie.
            with zstandard.ZstdDecompressor().stream_reader(bytes(data)) as reader:
                out = reader.read(max_size + 1)
            if len(out) > max_size:
                raise CompressionError(f"zstd payload inflates beyond the {max_size}-byte limit", path="payload")
            return out
    except CompressionError:
        raise
    except Exception as exc:  # zlib.error, cramjam.DecompressionError
        raise CompressionError(
            f"payload is not valid {encoding} data: {exc}", path="payload",
            hint="check the producer's content_encoding matches how it compressed the payload",
        ) from exc
    raise CompressionError(
        f"unsupported content_encoding {encoding!r}",
        path="metadata.content_encoding",
        hint=f"use one of {sorted(SUPPORTED - {''})}",
    )

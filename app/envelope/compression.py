"""Payload compression per `metadata.content_encoding` (gzip, snappy, zstd).

gzip is the stdlib, snappy comes from cramjam, zstd from the `zstandard` bindings (which
can stream with a bound).

Decompression is bounded (`max_size`) so a small "zip bomb" cannot exhaust memory: the
check happens while inflating, not after. Snappy uses the raw block format, whose
preamble declares the uncompressed length, so it is checked before any work is done.
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
            return out
        if encoding == "snappy":
            declared = _varint_prefix(data)
            if declared > max_size:
                raise CompressionError(
                    f"snappy payload declares {declared} bytes, over the {max_size}-byte limit", path="payload"
                )
            return bytes(cramjam.snappy.decompress_raw(bytes(data)))
        if encoding == "zstd":
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

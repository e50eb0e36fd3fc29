"""app/envelope/compression.py: a compressed payload is one gzip member / zlib stream or one
zstd frame and nothing after it, as the Go and Rust clients read it (one signed payload must not
read as two values in two clients), and empty or truncated input is an error, never b""."""

from __future__ import annotations

import zlib

import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from app.envelope.compression import compress, decompress
from app.errors import CompressionError

# The Rust client's vectors (clients/rust/src/compression.rs): compress(b"AAAA"/b"BBBB", ...).
GZIP_A = bytes.fromhex("1f8b0800000000000003737474740400f1080d9b04000000")
GZIP_B = bytes.fromhex("1f8b08000000000000037372727202003f1bda3904000000")
ZLIB_A = bytes.fromhex("789c737474740400028e0105")
ZSTD_A = bytes.fromhex("28b52ffd200421000041414141")
ZSTD_B = bytes.fromhex("28b52ffd200421000042424242")


@pytest.mark.parametrize(("what", "encoding", "data"), [
    ("two gzip members", "gzip", GZIP_A + GZIP_B),
    ("gzip then a byte", "gzip", GZIP_A + b"\x00"),
    ("zlib then garbage", "gzip", ZLIB_A + b"junk"),
    ("two zstd frames", "zstd", ZSTD_A + ZSTD_B),
    ("zstd then garbage", "zstd", ZSTD_A + b"junk"),
])
def test_bytes_after_the_first_member_or_frame_are_refused(what: str, encoding: str, data: bytes) -> None:
    # Python read AAAA and ignored the rest; Go read AAAABBBB: refused everywhere now.
    with pytest.raises(CompressionError, match="after its compressed data"):
        decompress(data, encoding)


@pytest.mark.parametrize(("encoding", "data"), [("gzip", GZIP_A), ("gzip", ZLIB_A), ("zstd", ZSTD_A)])
def test_one_member_or_frame_reads(encoding: str, data: bytes) -> None:
    assert decompress(data, encoding) == b"AAAA"


def test_empty_and_truncated_zstd_are_errors() -> None:
    # the stream reader answered b"" for both
    with pytest.raises(CompressionError, match="empty"):
        decompress(b"", "zstd")
    for cut in range(1, len(ZSTD_A)):
        with pytest.raises(CompressionError):
            decompress(ZSTD_A[:cut], "zstd")


def test_a_zstd_frame_with_a_checksum_reads() -> None:
    data = zstandard.ZstdCompressor(write_checksum=True).compress(b"hello prism " * 20000)
    assert decompress(data, "zstd") == b"hello prism " * 20000
    with pytest.raises(CompressionError, match="truncated"):
        decompress(data[:-1], "zstd")


def test_the_decompressed_size_bound_still_holds() -> None:
    for encoding in ("gzip", "zstd"):
        with pytest.raises(CompressionError, match="limit"):
            decompress(compress(b"\x00" * 100_000, encoding), encoding, max_size=1000)


@settings(max_examples=150, deadline=None)
@given(a=st.binary(max_size=3000), tail=st.binary(min_size=1, max_size=40),
       encoding=st.sampled_from(["gzip", "zstd", "zlib"]))
def test_round_trip_and_any_tail_refused(a: bytes, tail: bytes, encoding: str) -> None:
    data = zlib.compress(a) if encoding == "zlib" else compress(a, encoding)
    encoding = "gzip" if encoding == "zlib" else encoding
    assert decompress(data, encoding) == a
    with pytest.raises(CompressionError):
        decompress(data + tail, encoding)

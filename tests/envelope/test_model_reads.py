"""The envelope model's per-message reads made cheaper for issue 29 - `Payload`'s parse of the
common `Any` shape, `get_content_type` without `HasField`, `is_encrypted` without the
`security` property - against the code they replaced, kept here as the reference. The payload
is untrusted input: random bytes as well as well-formed `Any` records."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from app.envelope.model import _CT_TO_MIME, Envelope, Payload, get_content_type, new_envelope, pb
from app.envelope.wire import LEN, encode_varint, scan
from app.errors import PrismError, Utf8Error


def _reference_parse(raw: memoryview) -> tuple[str, bytes]:
    """`Payload._parse` before the common-shape shortcut: the walk over every record."""
    type_url = ""
    value: memoryview = raw[0:0]
    for field, wt, _, vstart, end in scan(raw):
        if wt != LEN:
            continue
        if field == 1:
            try:
                type_url = str(raw[vstart:end], "utf-8")
            except UnicodeDecodeError as exc:
                raise Utf8Error("payload type_url is not valid UTF-8", path="payload.type_url") from exc
        elif field == 2:
            value = raw[vstart:end]
    return type_url, bytes(value)


def _outcome(f, raw: bytes):
    try:
        return f(raw)
    except PrismError as exc:
        return (type(exc), exc.code, str(exc))


def _new(raw: bytes) -> tuple[str, bytes]:
    p = Payload.from_wire(raw)
    value = p.value
    assert isinstance(value, memoryview)  # still a zero-copy view of the input
    return p.type_url, bytes(value)


def _old(raw: bytes) -> tuple[str, bytes]:
    return _reference_parse(memoryview(raw))


def _record(field: int, value: bytes, *, padded: bool) -> bytes:
    """A LEN record; `padded` writes the length with one redundant varint byte (0x80 .. 0x00)."""
    length = encode_varint(len(value))
    if padded:
        length = bytes([*length[:-1], length[-1] | 0x80, 0x00])
    return encode_varint(field << 3 | LEN) + length + value


ANY_RECORDS = st.lists(st.tuples(st.sampled_from([1, 2, 3]), st.binary(max_size=300), st.booleans()), max_size=3)


@settings(max_examples=1500, deadline=None)
@given(raw=st.binary(max_size=40))
def test_random_bytes_parse_as_before(raw: bytes) -> None:
    assert _outcome(_new, raw) == _outcome(_old, raw)


@settings(max_examples=1500, deadline=None)
@given(records=ANY_RECORDS, cut=st.integers(0, 3), tail=st.binary(max_size=3))
def test_any_records_parse_as_before(records: list[tuple[int, bytes, bool]], cut: int, tail: bytes) -> None:
    """Well-formed records (one- and two-byte lengths, non-minimal ones), cut short or followed
    by stray bytes: the shortcut answers exactly what the walk answers, errors included."""
    raw = b"".join(_record(f, v, padded=p) for f, v, p in records)
    for candidate in (raw, raw[:max(0, len(raw) - cut)], raw + tail):
        assert _outcome(_new, candidate) == _outcome(_old, candidate)


def test_the_common_shapes_take_the_shortcut_and_give_the_value() -> None:
    for size in (0, 1, 127, 128, 1000, 16383):
        value = bytes(range(256)) * (size // 256) + bytes(size % 256)
        raw = _record(2, value, padded=False)
        assert _new(raw) == ("", value) == _old(raw)
    raw = _record(2, b"ab", padded=False) + b"\x00"  # a stray byte: the walk decides (and rejects it)
    assert _outcome(_new, raw) == _outcome(_old, raw)
    assert issubclass(_outcome(_new, raw)[0], PrismError)
    # a three-byte length whose first two bytes, read as a two-byte one, would claim the rest:
    # 0x80 0x80 0x01 is 16384, the buffer holds one byte less - the walk's LengthError
    raw = b"\x12\x80\x80\x01" + bytes(16383)
    assert _outcome(_new, raw) == _outcome(_old, raw)
    assert issubclass(_outcome(_new, raw)[0], PrismError)
    for size in (16384, 100_000):  # three-byte lengths, whole: the walk's answer
        raw = _record(2, bytes(size), padded=False)
        assert _new(raw) == ("", bytes(size)) == _old(raw)


def _reference_content_type(md: pb.PrismMetadata) -> str:
    if not md.HasField("content_type"):
        return ""
    if md.content_type == pb.CONTENT_TYPE_CUSTOM:
        return md.content_type_custom
    return _CT_TO_MIME.get(md.content_type, "")


@settings(max_examples=500, deadline=None)
@given(ct=st.one_of(st.none(), st.sampled_from([0, 1, 2, 3, 4, 98, 99, 100]), st.integers(-(2**31), 2**31 - 1)),
       custom=st.one_of(st.none(), st.text(max_size=20)))
def test_content_type_reads_as_before(ct: int | None, custom: str | None) -> None:
    """Every enum value (known, unknown, UNSPECIFIED, CUSTOM), set or not, with or without a
    custom string - also after a decode, where an unknown value may arrive on the wire."""
    md = pb.PrismMetadata()
    if ct is not None:
        md.content_type = ct
    if custom is not None:
        md.content_type_custom = custom
    again = pb.PrismMetadata.FromString(md.SerializeToString())
    for m in (md, again):
        assert get_content_type(m) == _reference_content_type(m)


@given(security=st.booleans(), encryption=st.booleans(), pii=st.booleans())
def test_is_encrypted_reads_as_before(security: bool, encryption: bool, pii: bool) -> None:
    env = new_envelope("t", b"x", namespace="ns")
    if security:
        env.ensure_security().contains_pii = pii
    if encryption:
        env.header.security.encryption.algorithm = "AES-256-GCM"
    sec = env.security
    assert env.is_encrypted is (sec is not None and sec.HasField("encryption"))
    assert Envelope(env.header, env.payload).is_encrypted is encryption

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.envelope import wire
from app.envelope.wire import LEN, VARINT, encode_varint, iter_records, read_varint, scan, scan_envelope, strip_field
from app.errors import LengthError, SizeLimitError, TruncatedError, WireTypeError


@pytest.mark.parametrize("n", [0, 1, 127, 128, 300, 2**31, 2**63 - 1])
def test_varint_round_trip(n):
    b = encode_varint(n)
    assert read_varint(b, 0, len(b)) == (n, len(b))


def test_records_and_strip():
    data = b"\x08\x96\x01" + b"\x12\x03abc" + b"\x1a\x01z" + b"\x12\x00"
    recs = list(iter_records(data))
    assert [(r.field, r.wire_type) for r in recs] == [(1, VARINT), (2, LEN), (3, LEN), (2, LEN)]
    assert data[recs[1].value_start : recs[1].end] == b"abc"
    assert b"".join(strip_field(data, 2)) == b"\x08\x96\x01\x1a\x01z"


@pytest.mark.parametrize(
    ("data", "error"),
    [
        (b"\x12\x05ab", LengthError),               # length runs past the end
        (b"\x08", TruncatedError),                  # varint value missing
        (b"\x08\xff\xff", TruncatedError),          # unterminated varint
        (b"\x0b", WireTypeError),                   # start-group
        (b"\x00\x01", WireTypeError),               # field number 0
        (b"\x0e", WireTypeError),                   # wire type 6
        (b"\x08" + b"\xff" * 11, LengthError),      # varint longer than 10 bytes
        (b"\x09\x01\x02", TruncatedError),          # fixed64 cut short
    ],
)
def test_malformed(data, error):
    with pytest.raises(error):
        list(iter_records(data))


@pytest.mark.parametrize("n", [0, 1, 127, 128, 129, 300, 16383, 16384, 70000])
def test_lengths_of_every_varint_size_frame_the_same_value(n):
    """One- and two-byte lengths are decoded inline, longer ones by read_varint: all agree."""
    data = b"\x12" + encode_varint(n) + b"v" * n + b"\x08\x01"
    recs = list(iter_records(data))
    assert [(r.field, r.wire_type) for r in recs] == [(2, LEN), (1, VARINT)]
    assert recs[0].value_start == 1 + len(encode_varint(n)) and recs[0].end == recs[0].value_start + n
    if n:
        with pytest.raises(LengthError):
            list(iter_records(data[: recs[0].end - 1]))  # one byte short: the length runs past the end


@pytest.mark.parametrize("prefix", [b"\x12\x80", b"\x12\x80\x80"])
def test_a_length_cut_inside_its_varint_is_truncated(prefix):
    with pytest.raises(TruncatedError):
        list(iter_records(prefix))


def test_a_non_minimal_two_byte_length_is_read_as_its_value():
    assert [(r.value_start, r.end) for r in iter_records(b"\x12\x81\x00x")] == [(3, 4)]


@pytest.mark.parametrize("n", [0, 1, 127, 128, 2**35])
def test_varint_records_of_every_size_end_where_their_value_ends(n):
    data = b"\x08" + encode_varint(n) + b"\x12\x01z"
    recs = list(iter_records(data))
    assert [(r.field, r.start, r.end) for r in recs] == [(1, 0, 1 + len(encode_varint(n))),
                                                          (2, 1 + len(encode_varint(n)), len(data))]


# --------------------------------------------------------------------------- scan_envelope

_MIB16 = 16 * 1024 * 1024


def _flood(record: bytes, prefix: bytes = b"") -> bytes:
    """16 MiB of `record`, ending in a truncated one (field 50 claims 5 bytes, none there)."""
    return prefix + record * ((_MIB16 - len(prefix)) // len(record) - 2) + b"\x92\x03\x05"


@pytest.mark.parametrize(("what", "data"), [
    ("unknown varint records", _flood(b"\x90\x03\x00")),
    ("empty reviewed payload records", _flood(b"\x9a\x06\x00")),  # not header, but their framing is
    ("empty draft payload records", _flood(b"\x1a\x00", b"\x08\x01")),
])
@pytest.mark.parametrize("fields", [(3, 99), (3,), (99,)])
def test_the_header_limit_stops_the_walk(what: str, data: bytes, fields: tuple[int, ...]) -> None:
    # The walk went through every record first (5.6M tuples, ~1 GB with the compiled walk's list)
    # and then failed on the truncated last one; now it stops near the limit's byte.
    with pytest.raises(SizeLimitError, match=r"over the 262144-byte limit \(26214\d bytes by byte 2621\d\d\)"):
        scan_envelope(memoryview(data), fields, 256 * 1024)


def test_one_payload_record_of_any_size_is_not_header() -> None:
    for field, fields in ((99, (99,)), (3, (3,)), (99, (3, 99)), (3, (3, 99))):
        data = b"\x0a\x02id" + encode_varint((field << 3) | LEN) + encode_varint(1 << 20) + b"\x07" * (1 << 20)
        assert scan_envelope(data, fields, 1024) == scan(data)
        with pytest.raises(SizeLimitError):
            scan_envelope(data, (99,) if field == 3 else (3,), 1024)  # the other layout's header


_records = st.lists(st.one_of(
    st.tuples(st.sampled_from([1, 2, 3, 50, 99]), st.just(VARINT), st.integers(0, 2**20)),
    st.tuples(st.sampled_from([1, 2, 3, 50, 99]), st.just(LEN), st.integers(0, 40)),
), max_size=40)


def _header_sizes(records: list[tuple[int, int, int, int, int]], fields: tuple[int, ...]) -> list[list[int]]:
    """Each layout's running header size after each record, by the documented rule."""
    out: list[list[int]] = []
    for pf in fields:
        seen, total, sizes = False, 0, []
        for f, wt, start, vstart, end in records:
            if f != pf or wt != LEN:
                total += end - start
            elif seen:
                total += vstart - start
            else:
                seen = True
            sizes.append(total)
        out.append(sizes)
    return out


@settings(max_examples=300, deadline=None)
@given(recs=_records, max_header=st.integers(0, 120), fields=st.sampled_from([(3, 99), (3,), (99,)]))
def test_scan_envelope_is_scan_stopped_where_the_header_is_over_the_limit(recs, max_header, fields) -> None:
    data = b"".join(
        encode_varint((f << 3) | wt) + (encode_varint(v) if wt == VARINT else encode_varint(v) + b"x" * v)
        for f, wt, v in recs)
    full = wire._py_scan(data)
    sizes = _header_sizes(full, fields)
    stop = next((i for i in range(len(full)) if all(s[i] > max_header for s in sizes)), None)
    if stop is None or len(data) <= max_header:
        assert scan_envelope(data, fields, max_header) == full
    else:
        with pytest.raises(SizeLimitError, match=f"by byte {full[stop][4]}"):
            scan_envelope(data, fields, max_header)

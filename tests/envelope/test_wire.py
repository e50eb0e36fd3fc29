import pytest

from app.envelope.wire import LEN, VARINT, encode_varint, iter_records, read_varint, strip_field
from app.errors import LengthError, TruncatedError, WireTypeError


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

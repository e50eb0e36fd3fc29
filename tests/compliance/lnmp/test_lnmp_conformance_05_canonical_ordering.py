"""LNMP envelope spec section 11, item 5: produces deterministic encoding (section 6.2):
binary TLV entries in type order, text keys in the order timestamp, source, trace_id, sequence,
whatever order the metadata was built or received in."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from app.formats import lnmp

FIELDS = {"timestamp": 123, "source": "srv", "trace_id": "abc", "sequence": 7}


def test_construction_order_does_not_matter() -> None:
    """The spec's test: two builders setting fields in different orders encode identically."""
    outputs = set()
    for order in itertools.permutations(FIELDS):
        env = lnmp.LnmpEnvelope(**{k: FIELDS[k] for k in order})
        outputs.add((lnmp.encode_tlv(env), lnmp.encode_text_header(env)))
    assert len(outputs) == 1
    tlv, text = outputs.pop()
    assert [tlv[0], tlv[11], tlv[17], tlv[23]] == [0x10, 0x11, 0x12, 0x13]
    assert text == "#ENVELOPE timestamp=123 source=srv trace_id=abc sequence=7"


def test_extra_tlv_order_does_not_matter() -> None:
    a = lnmp.LnmpEnvelope(source="s", extra_tlv=((0x20, b"b"), (0x01, b"a")))
    b = lnmp.LnmpEnvelope(source="s", extra_tlv=((0x01, b"a"), (0x20, b"b")))
    assert lnmp.encode_tlv(a) == lnmp.encode_tlv(b)
    assert lnmp.encode_tlv(a) == bytes.fromhex("010001") + b"a" + bytes.fromhex("110001") + b"s" \
        + bytes.fromhex("200001") + b"b"


@settings(max_examples=200, deadline=None)
@given(st.permutations(["timestamp=5", 'source="a b"', "trace_id=t", "sequence=9", "zz=1", "aa=2"]),
       st.integers(1, 3))
def test_any_received_order_re_encodes_canonically(pairs: list[str], spaces: int) -> None:
    line = "#ENVELOPE" + "".join(" " * spaces + p for p in pairs)
    env = lnmp.parse_text_header(line)
    assert lnmp.encode_text_header(env) == '#ENVELOPE timestamp=5 source="a b" trace_id=t sequence=9 aa=2 zz=1'


def test_binary_encoding_is_a_pure_function_of_the_metadata() -> None:
    env = lnmp.LnmpEnvelope(timestamp=1, source="é", trace_id="t", sequence=2, extra_tlv=((0x30, b"x"),))
    c = lnmp.Container(record=b"R", envelope=env)
    assert lnmp.encode_container(c) == lnmp.encode_container(lnmp.decode_container(lnmp.encode_container(c)))

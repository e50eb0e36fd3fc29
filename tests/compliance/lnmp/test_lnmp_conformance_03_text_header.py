"""LNMP envelope spec section 11, item 3: encodes/decodes the `#ENVELOPE` text header
(sections 5.1-5.3)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.errors import LnmpError
from app.formats import lnmp

APPENDIX_B = (b'#ENVELOPE timestamp=1732373147000 source=auth-service trace_id="abc-123-xyz" sequence=42\n'
              b'F12=14532\nF7=1\nF20="Alice"\nF23=["admin","developer"]\n')


def test_appendix_b_decodes() -> None:
    msg = lnmp.decode_text(APPENDIX_B)
    assert msg.envelope == lnmp.LnmpEnvelope(timestamp=1732373147000, source="auth-service",
                                             trace_id="abc-123-xyz", sequence=42)
    assert bytes(msg.record) == b'F12=14532\nF7=1\nF20="Alice"\nF23=["admin","developer"]\n'


def test_canonical_form_uses_minimal_quoting() -> None:
    """Section 5.3: the example's quoted trace_id has no space, so canonically it is bare."""
    env = lnmp.decode_text(APPENDIX_B).envelope
    assert lnmp.encode_text_header(env) == (
        "#ENVELOPE timestamp=1732373147000 source=auth-service trace_id=abc-123-xyz sequence=42")


def test_values_with_spaces_and_quotes() -> None:
    env = lnmp.LnmpEnvelope(source='my "auth" service', trace_id='"starts-with-quote')
    line = lnmp.encode_text_header(env)
    assert line == r'#ENVELOPE source="my \"auth\" service" trace_id="\"starts-with-quote"'
    assert lnmp.parse_text_header(line) == env
    # a quote or backslash inside a value without spaces needs no quoting
    env2 = lnmp.LnmpEnvelope(source='a"b', trace_id="c\\d")
    assert lnmp.encode_text_header(env2) == '#ENVELOPE source=a"b trace_id=c\\d'
    assert lnmp.parse_text_header(lnmp.encode_text_header(env2)) == env2


def test_no_header_means_no_envelope() -> None:
    msg = lnmp.decode_text(b"F12=14532\nF7=1")
    assert msg.envelope is None and msg.record == b"F12=14532\nF7=1"
    assert lnmp.decode_text(b"#ENVELOPES are nice\nF1=1").envelope is None  # another comment


def test_header_only_and_crlf() -> None:
    assert lnmp.decode_text(b"#ENVELOPE sequence=1").envelope == lnmp.LnmpEnvelope(sequence=1)
    msg = lnmp.decode_text(b"#ENVELOPE source=x\r\nF1=1")
    assert msg.envelope == lnmp.LnmpEnvelope(source="x") and bytes(msg.record) == b"F1=1"
    assert lnmp.decode_text(b"#ENVELOPE\nF1=1").envelope == lnmp.LnmpEnvelope()


def test_pair_order_does_not_matter() -> None:
    a = lnmp.parse_text_header("#ENVELOPE sequence=42 source=s timestamp=5")
    b = lnmp.parse_text_header("#ENVELOPE timestamp=5 source=s sequence=42")
    assert a == b


@pytest.mark.parametrize(("line", "message"), [
    ("#ENVELOPE timestamp=12x", "not an unsigned 64-bit decimal"),
    ("#ENVELOPE sequence=-1", "not an unsigned 64-bit decimal"),
    (f"#ENVELOPE sequence={2**64}", "not an unsigned 64-bit decimal"),
    ("#ENVELOPE source=a source=b", "appears twice"),
    ("#ENVELOPE source", "has no '='"),
    ('#ENVELOPE source="unterminated', "unterminated"),
    ('#ENVELOPE source="a"b', "after the closing quote"),
    ('#ENVELOPE source="a\\nb"', "bad escape"),
    ("#ENVELOPE =x", "empty key"),
])
def test_malformed_header_strict_and_loose(line: str, message: str) -> None:
    data = line.encode() + b"\nF1=1"
    with pytest.raises(LnmpError, match=message):
        lnmp.decode_text(data)
    loose = lnmp.decode_text(data, strict=False)
    assert loose.envelope is None and bytes(loose.record) == b"F1=1" and loose.warnings


def test_non_utf8_header() -> None:
    data = b"#ENVELOPE source=\xff\nF1=1"
    with pytest.raises(LnmpError, match="UTF-8"):
        lnmp.decode_text(data)
    assert bytes(lnmp.decode_text(data, strict=False).record) == b"F1=1"


def test_encoder_refuses_line_breaks() -> None:
    with pytest.raises(LnmpError, match="line break"):
        lnmp.encode_text_header(lnmp.LnmpEnvelope(source="a\nb"))


_value = st.text(st.characters(blacklist_characters="\r\n", blacklist_categories=("Cs",)), max_size=24)
envelopes = st.builds(
    lnmp.LnmpEnvelope,
    timestamp=st.none() | st.integers(0, 2**64 - 1),
    source=st.none() | _value,
    trace_id=st.none() | _value,
    sequence=st.none() | st.integers(0, 2**64 - 1),
    extra_keys=st.dictionaries(st.from_regex(r"[a-z][a-z0-9_.\-]{0,10}", fullmatch=True).filter(
        lambda k: k not in lnmp.TEXT_KEYS), _value, max_size=3).map(lambda d: tuple(sorted(d.items()))),
)


@settings(max_examples=300, deadline=None)
@given(env=envelopes, record=st.binary(max_size=40))
def test_text_round_trip(env: lnmp.LnmpEnvelope, record: bytes) -> None:
    wire = lnmp.encode_text(record, env)
    msg = lnmp.decode_text(wire)
    if env.is_empty():
        assert wire is record and msg.envelope is None
    else:
        assert msg.envelope == env and bytes(msg.record) == record

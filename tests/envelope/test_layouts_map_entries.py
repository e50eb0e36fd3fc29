"""An `extensions` map entry that holds more than a key and a value (a third field, a key or
value of another wire type) is refused by a layout conversion (`AmbiguousMapEntryError`,
`ambiguous_map_entry`), never dropped: upb keeps such an entry among the unknown fields on
the map's own number, where the unknown-field carry cannot take it, and other runtimes (Go's,
Java's) would store its key and value. Re-encoding in the same layout keeps it byte for byte.
The worker sends such a record to the DLQ with that reason."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.agents.chain import Chain, Outcome
from app.agents.normalize import Normalize
from app.agents.publish import Publisher
from app.envelope import Layout, convert, decode, encode, new_envelope
from app.envelope.codec import draft_split, split_header
from app.envelope.wire import encode_varint, scan
from app.errors import AmbiguousMapEntryError, PrismError
from app.topology import Archive, NormalizeStage, Outputs, Topology
from tests.agents.conftest import make_msg

EXT_FIELD = {Layout.REVIEWED: 97, Layout.DRAFT: 99}


def rec(field: int, wire: int, value: bytes) -> bytes:
    return encode_varint(field << 3 | wire) + (encode_varint(len(value)) + value if wire == 2 else value)


KEY, VALUE = rec(1, 2, b"tier"), rec(2, 2, b"gold")
ODD = {"third field": KEY + VALUE + rec(3, 0, b"\x01"), "unknown field only": KEY + rec(10, 2, b"x"),
       "varint key": rec(1, 0, b"\x05") + VALUE, "varint value": KEY + rec(2, 0, b"\x07")}


def envelope(layout: Layout, *entries: bytes) -> bytes:
    env = new_envelope("orders.created", {"order_id": 1}, namespace="order-events")
    env.ensure_security().publisher_id = "svc"
    return encode(env, layout) + b"".join(rec(EXT_FIELD[layout], 2, e) for e in entries)


@pytest.mark.parametrize("kind", sorted(ODD))
def test_a_conversion_refuses_an_odd_entry_and_the_same_layout_keeps_it(kind: str) -> None:
    odd, plain = ODD[kind], rec(1, 2, b"region") + rec(2, 2, b"eu")
    reviewed = envelope(Layout.REVIEWED, plain, odd)
    env = decode(reviewed)  # read as upb reads it: the plain entry in the map, the odd one aside
    assert dict(env.extensions) == {"region": b"eu"}
    # same layout: kept (as upb writes the entry again: its key and value, then the rest)
    assert [r[0] for r in scan(encode(env, Layout.REVIEWED))].count(97) == 2
    assert convert(reviewed, Layout.REVIEWED)[0] == encode(env, Layout.REVIEWED)
    with pytest.raises(AmbiguousMapEntryError) as e:
        convert(reviewed, Layout.DRAFT)
    assert e.value.code == "ambiguous_map_entry" and e.value.path == "extensions (field 97)"
    assert "reviewed layout" in str(e.value) and "fix:" in str(e.value)
    with pytest.raises(AmbiguousMapEntryError):
        encode(env, Layout.DRAFT)
    # the fast draft copy the worker takes declines it rather than renumbering it
    assert draft_split(env.header, split_header(env.header, Layout.REVIEWED)[0]) is None
    draft = envelope(Layout.DRAFT, odd, plain)
    for to in (Layout.REVIEWED, Layout.DRAFT):  # reading a draft header is its conversion
        with pytest.raises(AmbiguousMapEntryError, match="from the draft layout"):
            convert(draft, to)
    with pytest.raises(AmbiguousMapEntryError):
        decode(draft)


def test_plain_entries_still_convert_both_ways() -> None:
    entries = (KEY + VALUE, rec(1, 2, b"k"), b"")  # key only, and an empty entry, are plain
    for layout in (Layout.REVIEWED, Layout.DRAFT):
        data = envelope(layout, *entries)
        other = Layout.DRAFT if layout is Layout.REVIEWED else Layout.REVIEWED
        back = convert(convert(data, other)[0], layout)[0]
        assert dict(decode(back).extensions) == {"tier": b"gold", "k": b"", "": b""}


def _publisher() -> Publisher:
    topo = Topology(name="t", namespace="ns", sources=[{"topic": "orders.created"}],
                    stages=[{"name": "normalize", "settings": {}}], outputs=Outputs(sign=False),
                    archive=Archive(enabled=False))
    return Publisher(topo, worker_key=None)


def test_the_worker_dead_letters_it_with_the_reason() -> None:
    chain = Chain([Normalize(NormalizeStage(), namespaces={"orders.created": "order-events"},
                             formats={"orders.created": "auto"})], dlq_topic_for=lambda t: t + ".dlq")
    value = envelope(Layout.DRAFT, ODD["third field"])
    res = chain.run(make_msg(value))
    assert res.outcome is Outcome.DLQ and res.reason == "ambiguous_map_entry"
    assert res.dlq.value == value  # the record as received
    # a reviewed record reads, but its .v2 copy cannot be written: prepare raises for it alone
    msg = make_msg(envelope(Layout.REVIEWED, ODD["third field"]))
    assert chain.run(msg).outcome is Outcome.EMITTED
    with pytest.raises(AmbiguousMapEntryError):
        _publisher().prepare(msg)


@settings(max_examples=300, deadline=None)
@given(layout=st.sampled_from([Layout.REVIEWED, Layout.DRAFT]),
       entries=st.lists(st.lists(st.tuples(st.integers(1, 12), st.sampled_from([0, 2]), st.binary(max_size=6)),
                                 max_size=4), max_size=3))
def test_any_map_entry_converts_or_is_a_typed_error(layout: Layout, entries: list[list[tuple[int, int, bytes]]]
                                                    ) -> None:
    """Hand-written entries of any shape: each conversion gives bytes or a PrismError, and an
    entry the conversion keeps is in the output (nothing silently dropped)."""
    raw = [b"".join(rec(f, w, v if w == 2 else encode_varint(len(v))) for f, w, v in e) for e in entries]
    data = envelope(layout, *raw)
    for to in (Layout.REVIEWED, Layout.DRAFT):
        try:
            out, _ = convert(data, to)
        except PrismError:
            continue
        assert dict(decode(out).extensions) == dict(decode(data).extensions)

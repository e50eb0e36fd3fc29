"""PostgreSQL binding: the prism_events row and its JSONB envelope document (pure)."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime

import pytest
from hypothesis import given, settings

from app.bindings import postgres as pg
from app.envelope import new_envelope
from app.errors import BindingError
from tests.bindings.strategies import binding_envelopes


def order(payload=None, **kw):
    return new_envelope("orders.created", payload if payload is not None else {"order_id": 42, "amount": 9.5},
                        namespace="order-events", message_id="01890a5d-ac96-774b-bcce-b302099a8057",
                        published_at_ms=1697200000123, **kw)


@settings(max_examples=200, deadline=None)
@given(binding_envelopes())
def test_round_trip_is_exact(env):
    row = pg.encode(env)
    # Through JSON text, as the database stores it, and back: same envelope, same payload bytes.
    doc = json.loads(row.envelope_json())
    out = pg.decode({"message_id": row.message_id, "topic": row.topic, "envelope": doc,
                     "published_at": row.published_at})
    assert out == env
    assert bytes(out.payload.value) == bytes(env.payload.value)
    assert row.published_at == datetime.fromtimestamp(0, UTC) + (env.published_at_ms * pg._MS)


@settings(max_examples=100, deadline=None)
@given(binding_envelopes())
def test_json_payload_survives_jsonb_key_reordering(env):
    """JSONB re-orders object keys (shorter keys first); the payload must still come back exact."""
    doc = pg.to_document(env)

    def jsonb_order(value):
        if isinstance(value, dict):
            return {k: jsonb_order(value[k]) for k in sorted(value, key=lambda k: (len(k.encode()), k.encode()))}
        if isinstance(value, list):
            return [jsonb_order(v) for v in value]
        return value

    assert pg.from_document(jsonb_order(doc)) == env


def test_document_shape():
    env = order(correlation_id="cart-9")
    doc = pg.to_document(env)
    assert doc["metadata"] == {
        "message_id": "01890a5d-ac96-774b-bcce-b302099a8057",
        "topic": "orders.created",
        "namespace": "order-events",
        "published_at_ms": "1697200000123",  # proto3 JSON: int64 as a string
        "content_type": "CONTENT_TYPE_JSON",
        "correlation_id": "cart-9",
    }
    # Inline JSON for queries; new_envelope's compact insertion-order JSON is not canonical
    # (keys unsorted), so the exact bytes ride along.
    assert doc["payload"]["json"] == {"order_id": 42, "amount": 9.5}
    assert base64.b64decode(doc["payload"]["base64"]) == b'{"order_id":42,"amount":9.5}'


def test_canonical_json_is_stored_once():
    env = order(b'{"amount":9.5,"order_id":42}', content_type="application/json")
    assert pg.to_document(env)["payload"] == {"json": {"amount": 9.5, "order_id": 42}}
    assert bytes(pg.from_document(pg.to_document(env)).payload.value) == b'{"amount":9.5,"order_id":42}'


@pytest.mark.parametrize(("payload", "kw"), [
    (b'{"a":1}', {"content_type": "text/plain"}),                                   # not a JSON type
    ({"a": 1}, {"content_encoding": "gzip"}),                                       # compressed
    (b'{"a":"\\u0000"}', {"content_type": "application/json"}),                     # JSONB refuses U+0000
    (b'{"a":1e400}', {"content_type": "application/json"}),                         # not finite
    (b"not json", {"content_type": "application/json"}),
    (b"\xff\xfe", {"content_type": "application/json"}),
])
def test_base64_only_when_json_cannot_be_inlined(payload, kw):
    env = order(payload, **kw)
    doc = pg.to_document(env)["payload"]
    assert "json" not in doc and "base64" in doc
    assert pg.from_document(pg.to_document(env)) == env


def test_encrypted_payload_is_never_inlined():
    env = order(b'{"a":1}', content_type="application/json")
    enc = env.ensure_security().encryption
    enc.key_id, enc.algorithm = "k1", "aes-256-gcm"
    assert "json" not in pg.to_document(env)["payload"]


def test_json_numbers_that_jsonb_rewrites_keep_exact_bytes():
    for text in (b'{"a":1e+16}', b'{"a":-0.0}', b'{"a":1e-07}'):
        env = order(text, content_type="application/json")
        doc = pg.to_document(env)["payload"]
        assert "base64" in doc, text
        assert bytes(pg.from_document(pg.to_document(env)).payload.value) == text


def test_type_url_and_absent_payload():
    env = order(b"\x08\x01", content_type="application/protobuf")
    env.payload._type_url = "type.googleapis.com/shop.Order"
    doc = pg.to_document(env)
    assert doc["payload"]["type_url"] == "type.googleapis.com/shop.Order"
    assert pg.from_document(doc) == env
    env.payload = type(env.payload).absent()
    doc = pg.to_document(env)
    assert "payload" not in doc and not pg.from_document(doc).payload.present


def test_unknown_fields_from_newer_producers_survive():
    env = order()
    env.header.MergeFromString(b"\x90\x03\x07")                 # top-level field 50
    env.header.metadata.MergeFromString(b"\xc2\x02\x02hi")      # metadata field 40
    doc = pg.to_document(env)
    assert set(doc["unknown_fields"]) == {"", "metadata"}
    assert pg.from_document(json.dumps(doc)) == env


def test_nul_in_metadata_is_a_precise_error():
    env = order(correlation_id="a\x00b")
    with pytest.raises(BindingError, match="U\\+0000"):
        pg.encode(env)


def test_row_columns_must_agree_with_the_document():
    row = pg.encode(order())
    for column, value in (("message_id", "other"), ("topic", "other"),
                          ("published_at", datetime(2020, 1, 1, tzinfo=UTC))):
        data = {"message_id": row.message_id, "topic": row.topic, "envelope": row.envelope, column: value}
        with pytest.raises(BindingError, match=column):
            pg.decode(data)
    assert pg.decode(row) == order()


@pytest.mark.parametrize(("doc", "message"), [
    ("[1]", "must be a JSON object"),
    ("{", "not valid JSON"),
    ({"metadata": {"nope": 1}}, "does not match prism.envelope.v1.PrismEnvelope"),
    ({"security": {"auth_token": 5}}, "a security field has the wrong type"),
    ({"payload": {"base64": "***"}}, "not valid base64"),
    ({"payload": {}}, "neither 'json' nor 'base64'"),
    ({"payload": 3}, "must be an object"),
    ({"unknown_fields": {"bogus": "AA=="}}, "does not name a present message"),
])
def test_malformed_documents(doc, message):
    with pytest.raises(BindingError, match=message):
        pg.from_document(doc)


def test_insert_sql_and_params_line_up():
    row = pg.encode(order())
    assert pg.INSERT_SQL.count("%s") == len(row.params())
    assert json.loads(row.params()[2]) == row.envelope

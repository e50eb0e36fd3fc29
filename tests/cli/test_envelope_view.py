"""What `prism dlq show` and the console show of a DLQ record value (app.cli.envelope_view):
hostile JSON is shown as text or base64, never a RecursionError (issue 28)."""

from __future__ import annotations

import json

from app.cli.envelope_view import envelope_doc, value_doc
from app.envelope import Layout, encode
from app.envelope.model import new_envelope

DEEP = b"[" * 200_000 + b"]" * 200_000


def test_a_cloudevent_whose_data_is_nested_200000_deep_is_shown_as_text() -> None:
    value = b'{"specversion":"1.0","id":"1","source":"s","type":"t","data":' + DEEP + b"}"
    doc = value_doc(value)
    assert doc["kind"] == "text" and doc["text"].startswith('{"specversion"') and doc["shown_bytes"] == 512
    json.dumps(doc)  # what the CLI and the console render


def test_an_envelope_with_a_deep_json_payload_shows_the_payload_as_base64() -> None:
    data = encode(new_envelope("t", DEEP, namespace="n", content_type="application/json"), Layout.REVIEWED)
    doc = envelope_doc(data, payload=True)
    assert "json" not in doc["payload"] and doc["payload"]["base64"]
    assert value_doc(data)["kind"] == "envelope"


def test_json_within_the_limits_is_still_shown_as_a_tree() -> None:
    assert value_doc(b'{"a":[1,2]}')["json"] == {"a": [1, 2]}


def test_a_deeply_nested_dlq_value_says_why_it_is_not_shown_as_json() -> None:
    doc = value_doc(b"[" * 50_000 + b"]" * 50_000)
    assert doc["kind"] == "text" and "nested too deeply" in doc["not_an_envelope"]
    json.dumps(doc, indent=2)  # what the console's pretty filter does: no RecursionError

"""ReceivedEnvelope.payload() parses a JSON payload with the bounded decoder (app.untrusted_json):
hostile payloads give a PayloadError, never RecursionError (issue 28)."""

from __future__ import annotations

import pytest

from app.envelope.model import new_envelope
from app.errors import PayloadError
from app.sdk.received import ReceivedEnvelope


def _received(payload: bytes) -> ReceivedEnvelope:
    env = new_envelope("t", payload, namespace="n", content_type="application/json")
    return ReceivedEnvelope(env, delivery=None)  # type: ignore[arg-type]


@pytest.mark.parametrize(("payload", "says"), [
    (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
    (b'{"a":' * 3_000 + b"1" + b"}" * 3_000, "nested too deeply"),
    (b"[1e999]", "out of range"),
    (b"\xff\xfe", "not valid UTF-8"),
    (b"NaN", "NaN is not JSON"),
    (b"[1,", "not valid JSON"),
])
def test_hostile_json_payloads_are_payload_errors(payload: bytes, says: str) -> None:
    with pytest.raises(PayloadError, match=says):
        _received(payload).payload()
    with pytest.raises(PayloadError, match=says):
        new_envelope("t", payload, namespace="n", content_type="application/json").payload_json()


def test_a_json_payload_within_the_limits_is_parsed() -> None:
    assert _received(b'{"a":[1,{"b":null}]}').payload() == {"a": [1, {"b": None}]}

"""ReceivedEnvelope.payload() parses a JSON payload with the bounded decoder (app.untrusted_json):
hostile payloads give a PayloadError, never RecursionError (issue 28)."""

from __future__ import annotations

import pytest

from app.envelope.model import new_envelope
from app.errors import PayloadError, ValidationError
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


@pytest.mark.parametrize("ms", [2**62, 2**63 - 1, 253_402_300_800_000])  # the last: 10000-01-01
def test_a_publish_time_no_datetime_can_hold_is_a_validation_error(ms: int) -> None:
    """The producer writes published_at_ms; `msg.published_at` of year 146,140,482 raised a bare
    ValueError out of a consumer loop that logged it. Now the SDK's typed error, naming the field."""
    msg = _received(b"{}")
    msg.envelope.header.metadata.published_at_ms = ms
    with pytest.raises(ValidationError, match=f"metadata.published_at_ms: {ms} is not a time") as info:
        _ = msg.published_at
    assert info.value.problems[0].path == "metadata.published_at_ms"
    msg.envelope.header.metadata.published_at_ms = 1_760_000_000_000
    assert msg.published_at.year == 2025

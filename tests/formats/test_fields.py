"""Shared metadata parsing rules (app.formats._fields)."""

from __future__ import annotations

import pytest

from app.envelope import Envelope
from app.errors import LegacyFormatError
from app.formats import _fields as f


@pytest.mark.parametrize(("text", "ms"), [
    ("1697200000", 1697200000000),              # seconds (RFC-031's Kafka example)
    ("1697200000.25", 1697200000250),           # fractional seconds
    ("1697200000123", 1697200000123),           # milliseconds
    ("1697200000123456", 1697200000123),        # microseconds
    ("1697200000123456789", 1697200000123),     # nanoseconds
    ("2023-10-13T12:26:40Z", 1697200000000),
    ("2023-10-13T14:26:40.5+02:00", 1697200000500),
    ("2023-10-13t12:26:40.123456789z", 1697200000123),
])
def test_time_parsing(text: str, ms: int) -> None:
    assert f.parse_time_ms(text, "timestamp", LegacyFormatError) == ms


@pytest.mark.parametrize("text", ["0", "-5", "soon", "2023-10-13", "2023-13-01T00:00:00Z", "1e9", "1969-12-31T00:00:00Z"])
def test_bad_times(text: str) -> None:
    with pytest.raises(LegacyFormatError, match=r"timestamp|time"):
        f.parse_time_ms(text, "header timestamp", LegacyFormatError)


def test_auth_token_priority_and_secret_headers() -> None:
    pairs = f.header_pairs([("Authorization", b"Bearer from-authz"), ("prism-auth-token", "from-prism"),
                            ("Cookie", b"session=abc"), ("x-api-key", b"k")])
    r = f.take_auth_token(pairs)
    assert r.token == "from-prism"
    assert r.consumed == {"authorization", "prism-auth-token", "cookie", "x-api-key"}
    text = " ".join(r.notes)
    assert "cookie" in text and "from-authz" not in text and "session=abc" not in text


def test_non_bearer_authorization_is_kept_whole() -> None:
    r = f.take_auth_token([("authorization", b"Basic dXNlcjpwYXNz")])
    assert r.token == "Basic dXNlcjpwYXNz" and "dXNlcjpwYXNz" not in " ".join(r.notes)


def test_set_auth_token_never_overwrites() -> None:
    env = Envelope()
    env.ensure_security().auth_token = "in-envelope"
    notes: list[str] = []
    f.set_auth_token(env, "from-header", notes, "headers")
    assert env.security.auth_token == "in-envelope" and "from-header" not in " ".join(notes) and notes


def test_apply_found_conflicts_and_fallbacks() -> None:
    found: dict[str, f.Found] = {}
    f.add_found(found, "message_id", f.Found("a", "header message-id", "header.message-id"), LegacyFormatError)
    with pytest.raises(LegacyFormatError, match="disagree"):
        f.add_found(found, "message_id", f.Found("b", "header msg-id", "header.msg-id"), LegacyFormatError)
    env = Envelope()
    notes: list[str] = []
    found = {
        "traceparent": f.Found("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "h traceparent", "header.tp"),
        "trace_id": f.Found("AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA", "h trace-id", "header.trace-id"),
        "baggage": f.Found("user=alice,team=a%20b", "h baggage", "header.baggage"),
    }
    f.apply_found(env, found, LegacyFormatError, notes)
    assert env.observability.trace_id == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert env.extensions["header.trace-id"] == b"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"  # disagreed: kept aside
    assert dict(env.observability.baggage) == {"user": "alice", "team": "a b"}


@pytest.mark.parametrize(("field", "value", "message"), [
    ("priority", "11", "0..10"),
    ("priority", "high", "0..10"),
    ("ttl_seconds", "-1", "ttl_seconds"),
    ("data_classification", "top-secret", "unknown"),
    ("contains_pii", "maybe", "boolean"),
])
def test_apply_found_rejects_bad_values(field: str, value: str, message: str) -> None:
    with pytest.raises(LegacyFormatError, match=message):
        f.apply_found(Envelope(), {field: f.Found(value, f"header {field}", "x")}, LegacyFormatError, [])

"""Reading the delivery-audit topic (app.sdk.audit.records_from): anyone who can publish to the
topic can put anything there; a hostile record is counted as skipped, never a crash (issue 28)."""

from __future__ import annotations

from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.envelope.model import new_envelope
from app.errors import ConfigError
from app.sdk.audit import (
    AUDIT_EVENT,
    REFUSAL_EVENT,
    AuditFilter,
    audit_envelope,
    parse_since,
    records_from,
    refused_reads,
)


def _raw(payload: bytes) -> SimpleNamespace:
    return SimpleNamespace(envelope=new_envelope("audit", payload, namespace="n", content_type="application/json"),
                           value=None)


def test_hostile_records_are_skipped_and_real_ones_kept() -> None:
    real = b'{"event":"%s","namespace":"n"}' % AUDIT_EVENT.encode()
    hostile = [b"[" * 200_000 + b"]" * 200_000, b'{"event":' * 5_000 + b"1" + b"}" * 5_000, b"NaN", b"\xff"]
    records, skipped = records_from([_raw(real), *map(_raw, hostile)])
    assert records == [{"event": AUDIT_EVENT, "namespace": "n"}] and skipped == len(hostile)


_JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
                     lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=10), inner, max_size=5),
                     max_leaves=30)


@given(st.dictionaries(st.sampled_from(["event", "messages", "count", "namespace", "classification", "principal",
                                        "topic", "time_ms", "message_id", "ref"]) | st.text(max_size=8),
                       _JSON | st.lists(st.lists(st.text(max_size=8), max_size=5), max_size=4), max_size=10),
       st.sampled_from([REFUSAL_EVENT, AUDIT_EVENT, "other"]))
def test_any_record_gives_refused_reads_and_a_filter_answer_never_an_exception(record: dict[str, Any],
                                                                               event: str) -> None:
    """A record of several refusals is read from the audit topic, which anyone able to publish
    there can fill: whatever it holds, `refused_reads` gives one-message records (never raises)
    and `AuditFilter` answers yes or no."""
    record = {**record, "event": event}
    reads = refused_reads(record)
    assert isinstance(reads, list) and all(isinstance(r, dict) and r["event"] == event for r in reads)
    assert event == REFUSAL_EVENT or reads == []
    since = datetime(2026, 1, 1, tzinfo=UTC)
    for where in (AuditFilter(), AuditFilter(namespace="n", classification="internal"), AuditFilter(topic="t"),
                  AuditFilter(since=since)):  # `prism audit --since`: a forged time_ms crashed it (int("x"))
        assert where.matches(record) in (True, False)


def test_since_reads_durations_and_iso_times() -> None:
    now = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
    assert parse_since("10m", now=now) == datetime(2026, 11, 30, 11, 50, tzinfo=UTC)
    assert parse_since(" 2w ", now=now) == datetime(2026, 11, 16, 12, 0, tzinfo=UTC)
    assert parse_since("2026-01-01T00:00:00Z") == datetime(2026, 1, 1, tzinfo=UTC)
    assert parse_since("2026-01-01T00:00:00") == datetime(2026, 1, 1, tzinfo=UTC)  # no zone: UTC
    for bad in ("yesterday", "5q", "99999999999999d", "1" * 40 + "s"):
        with pytest.raises(ConfigError) as exc:
            parse_since(bad, now=now)
        assert exc.value.path == "--since" and exc.value.hint


@given(st.text(max_size=60))
def test_since_ends_in_a_time_or_a_config_error(text: str) -> None:
    """`--since` is the user's text: any of it is a UTC-aware time or a `ConfigError`, never an
    `OverflowError` (`prism audit --since 999999999999999d` was a traceback)."""
    try:
        when = parse_since(text)
    except ConfigError:
        return
    assert when.tzinfo is not None


@pytest.mark.parametrize(("message_id", "kept"), [("0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b", True), ("x" * 128, True),
                                                  ("x" * 129, False), ("a\nb", False), ("a\x7fb", False)])
def test_an_audit_record_is_built_whatever_id_the_audited_message_carries(message_id: str, kept: bool) -> None:
    """The correlation id is the message id only where the worker would accept it as an id:
    a rogue producer's id must not make the audit record unwritable (the message would then be
    nacked and fetched again for good). The record still names the id."""
    env = audit_envelope({"message_id": message_id, "event": AUDIT_EVENT}, "prism.audit", "n")
    assert env.metadata.correlation_id == (message_id if kept else "")
    assert env.payload_json()["message_id"] == message_id


async def test_reading_a_missing_audit_topic_is_topic_not_found_on_every_backend(backend_url: str, topic: str) -> None:
    """`prism audit --audit-topic typo` read a never-written topic as an empty audit ("0 audited
    deliveries", exit 0) on every backend; an existing topic without audit records stays an
    empty answer, not an error."""
    from app.errors import TopicNotFoundError
    from app.sdk.audit import read_audit_entries
    from app.sdk.backends import backend_for_url

    with pytest.raises(TopicNotFoundError, match=f"the audit topic '{topic}' does not exist"):
        await read_audit_entries(backend_url, None, audit_topic=topic)
    backend = backend_for_url(backend_url)
    await backend.connect()
    try:
        assert not await backend.topic_exists(topic)  # asking did not create it
        await backend.publish_bytes(topic, b"not an audit record")
        assert await backend.topic_exists(topic)
    finally:
        await backend.close()
    if not backend_url.startswith("postgresql"):  # its publish_bytes row is no envelope to sample
        assert await read_audit_entries(backend_url, None, audit_topic=topic) == ([], 1)

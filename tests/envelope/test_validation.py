import pytest

from app._gen.prism.envelope.v1 import envelope_pb2 as vpb
from app.envelope import Envelope, decode, new_envelope, sanity_problems, validate
from app.errors import ValidationError


def test_valid_envelope_passes():
    validate(new_envelope("t", b"x", namespace="n"))


def test_lists_every_problem_at_once():
    env = decode(vpb.PrismEnvelope(metadata=vpb.PrismMetadata(priority=11, ttl_seconds=-1)).SerializeToString())
    sec = env.ensure_security()
    sec.data_classification = "secret"
    sec.signature = b"s"
    env.ensure_observability().trace_id = "XYZ"
    with pytest.raises(ValidationError) as e:
        validate(env)
    paths = {p.path for p in e.value.problems}
    assert paths == {
        "metadata.message_id", "metadata.topic", "metadata.namespace", "metadata.published_at_ms",
        "metadata.priority", "metadata.ttl_seconds", "payload", "security.data_classification",
        "security.signature_algorithm", "observability.trace_id",
    }
    assert "10 problem(s)" in str(e.value) and e.value.code == "invalid_envelope"


def test_missing_metadata_block():
    with pytest.raises(ValidationError, match="metadata: is required but absent"):
        validate(Envelope())


def test_sanity_checks_untrusted_metadata():
    now = 1_700_000_000_000
    env = new_envelope("t\x07", b"x", namespace="n", published_at_ms=now + 3600_000,
                       message_id="m" * 200, correlation_id="ok\n", labels={f"k{i}": "v" for i in range(70)})
    problems = {p.path for p in sanity_problems(env, now_ms=now)}
    assert {"metadata.published_at_ms", "metadata.message_id", "metadata.correlation_id", "metadata.topic",
            "observability.labels"} <= problems
    assert sanity_problems(new_envelope("t", b"x", namespace="n", published_at_ms=now), now_ms=now) == []


_STRINGS = [("metadata", "message_id"), ("metadata", "correlation_id"), ("metadata", "causality_parent"),
            ("metadata", "topic"), ("metadata", "namespace"), ("security", "publisher_id"),
            ("security", "publisher_team")]


def _sane(now: int) -> Envelope:
    env = new_envelope("t", b"x", namespace="n", published_at_ms=now, correlation_id="c", causality_parent="p")
    env.ensure_security().publisher_id = "svc"
    return env


@pytest.mark.parametrize(("ctx", "name"), _STRINGS)
def test_each_string_field_is_named_by_itself(ctx, name):
    """The one-search fast path must still name exactly the offending field, whichever it is."""
    now = 1_700_000_000_000
    env = _sane(now)
    msg = env.metadata if ctx == "metadata" else env.security
    setattr(msg, name, "ok\x1b")
    assert [(p.path, p.problem) for p in sanity_problems(env, now_ms=now)] == [
        (f"{ctx}.{name}", "contains control characters")]
    if ctx == "metadata":
        limit = 128 if name not in ("topic", "namespace") else 249
        setattr(msg, name, "x" * (limit + 1))
        assert [(p.path, p.problem) for p in sanity_problems(env, now_ms=now)] == [
            (f"{ctx}.{name}", f"is {limit + 1} chars, over {limit}")]


def test_string_problems_keep_their_order():
    now = 1_700_000_000_000
    env = _sane(now)
    for ctx, name in reversed(_STRINGS):
        setattr(env.metadata if ctx == "metadata" else env.security, name, "\x00")
    env.metadata.message_id = "\x00" * 200
    assert [p.path for p in sanity_problems(env, now_ms=now)] == [
        "metadata.message_id", "metadata.message_id", *(f"{c}.{n}" for c, n in _STRINGS[1:])]

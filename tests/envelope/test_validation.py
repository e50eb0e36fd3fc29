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

"""enrich reads `is_encrypted`, the content type and the plaintext payload once per message
(issue 29): the stage before that change is kept here as the reference, and both run on the
same generated messages - the same validator/checker/tracking calls with the same arguments,
the same counts, headers, errors and envelope bytes."""

from __future__ import annotations

import types
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

import app.agents.enrich as enrich_mod
from app.agents.enrich import VALIDATION_HEADER, Enrich, SchemaInfo
from app.envelope import Layout, encode, new_envelope
from app.envelope.model import Envelope
from app.errors import PayloadSchemaError, SchemaValidationError
from app.schema.payload_check import Violation
from tests.agents.conftest import make_msg


class _Reference(Enrich):
    """`Enrich.process` and `_validate` as they were before the reads were shared."""

    def process(self, msg: Any) -> None:
        env = msg.env
        if self.trace:
            enrich_mod.continue_or_start(env, msg.headers)
        s = self.schema
        if s is None:
            return
        if self._stamps:
            sc = env.ensure_schema()
            sc.schema_url, sc.schema_version, sc.schema_format = s.url, s.version, s.format
            sc.schema_hash, sc.schema_name, sc.compatibility_mode = s.hash, s.name, s.compatibility
        if s.pii_fields:
            env.ensure_security().contains_pii = True
        if self._validates:
            self._old_validate(msg, s)
        if not self._reads_payload:
            return
        track_deprecated = self._may_track and env.content_type == "application/protobuf"
        if env.is_encrypted or (s.checker is None and not track_deprecated):
            return
        body = env.payload_bytes()
        if s.checker is not None:
            problems = s.checker(body, env.content_type)
            if problems:
                raise PayloadSchemaError(f"payload does not conform to {s.name or s.url} {s.version}: "
                                         + "; ".join(problems), path="payload",
                                         hint="fix the producer, or turn enrich.schema.validate_payloads off")
        if track_deprecated:
            used = enrich_mod.deprecated_fields_used(body, s.resolved)
            if used:
                env.ensure_schema().deprecated_fields_used.extend(used)

    def _old_validate(self, msg: Any, s: SchemaInfo) -> None:
        env = msg.env
        namespace = env.namespace
        mode = self.namespace_validation.get(namespace, self.validation)
        if mode == "off":
            return
        key = (namespace, s.version)
        if env.is_encrypted:
            self.validations[(*key, mode, "skipped")] += 1
            return
        assert s.validator is not None
        violations = s.validator(env.payload_bytes(), env.content_type)
        if not violations:
            self.validations[(*key, mode, "valid")] += 1
            return
        self.validations[(*key, mode, "invalid")] += 1
        paths = ", ".join(v.path for v in violations[:3]) + (", ..." if len(violations) > 3 else "")
        self._log(msg, mode, violations, s)
        if mode == "strict":
            raise SchemaValidationError(
                f"payload does not match {s.name or s.url} {s.version}: " + "; ".join(map(str, violations[:5])),
                violations=violations, schema_version=s.version,
                hint="fix the producer (the path names the field), or set this namespace's validation to warn")
        headers = msg.out_headers
        if headers is None:
            headers = msg.out_headers = []
        headers.append((VALIDATION_HEADER, f"failed; {paths}".encode()))


CONTENT_TYPES = ["application/json", "application/protobuf", "", "text/plain; charset=utf-8", "application/avro"]
MODES = ["off", "warn", "strict"]


def _run(cls: type[Enrich], case: dict[str, Any]) -> dict[str, Any]:
    calls: list[tuple[str, bytes, object]] = []
    n_violations = case["violations"]

    def validator(body: bytes, content_type: str) -> list[Violation]:
        calls.append(("validate", body, content_type))
        return [Violation(f"$.f{i}", "bad", "type") for i in range(n_violations)]

    def checker(body: bytes, content_type: str) -> list[str]:
        calls.append(("check", body, content_type))
        return ["$.x: bad"] if case["check_fails"] else []

    resolved = types.SimpleNamespace(deprecated_fields=("old",) if case["deprecated"] else ())
    schema = SchemaInfo(url="u", version="v1", format=case["format"], name=case["name"],
                        pii_fields=("email",) if case["pii"] else (), resolved=resolved,
                        checker=checker if case["checker"] else None,
                        validator=validator if case["validator"] else None)
    stage = cls(trace=False, schema=schema, validation=case["mode"],
                namespace_validation={"other": case["other_mode"]})
    msg = make_msg(b"")
    msg.envelope = new_envelope("orders.created", case["payload"], namespace=case["namespace"],
                                content_type=case["content_type"], content_encoding=case["encoding"],
                                message_id="m-1", published_at_ms=1_700_000_000_000)
    if case["encrypted"]:
        msg.envelope.ensure_security().encryption.algorithm = "AES-256-GCM"
    original = enrich_mod.deprecated_fields_used

    def tracked(body: bytes, resolved: Any) -> list[str]:
        calls.append(("track", body, resolved))
        return ["old"] if case["uses_deprecated"] else []

    enrich_mod.deprecated_fields_used = tracked  # type: ignore[assignment]
    error = None
    try:
        stage.process(msg)
    except Exception as exc:  # compared below: the same error both times
        error = (type(exc), str(exc))
    finally:
        enrich_mod.deprecated_fields_used = original  # type: ignore[assignment]
    return {"calls": calls, "error": error, "validations": dict(stage.validations),
            "headers": msg.out_headers, "bytes": bytes(encode(msg.envelope, Layout.REVIEWED))}


CASES = st.fixed_dictionaries({
    "payload": st.binary(max_size=64), "namespace": st.sampled_from(["order-events", "other"]),
    "content_type": st.sampled_from(CONTENT_TYPES), "encoding": st.sampled_from(["", "gzip"]),
    "encrypted": st.booleans(), "mode": st.sampled_from(MODES), "other_mode": st.sampled_from(MODES),
    "violations": st.integers(0, 5), "validator": st.booleans(), "checker": st.booleans(),
    "check_fails": st.booleans(), "deprecated": st.booleans(), "uses_deprecated": st.booleans(),
    "format": st.sampled_from(["protobuf", "json"]), "name": st.sampled_from(["", "Order"]), "pii": st.booleans(),
})


@settings(max_examples=400, deadline=None)
@given(case=CASES)
def test_enrich_does_what_it_did_before_the_reads_were_shared(case: dict[str, Any]) -> None:
    assert _run(Enrich, case) == _run(_Reference, case)


def test_the_payload_is_read_once_for_validation_and_the_checker(monkeypatch) -> None:
    """The point of the change, seen directly: one `payload_bytes` and one content type read."""
    counts = {"payload_bytes": 0}
    real = Envelope.payload_bytes

    def counting(self: Envelope, **kw: Any) -> bytes:
        counts["payload_bytes"] += 1
        return real(self, **kw)

    monkeypatch.setattr(Envelope, "payload_bytes", counting)
    case = {"payload": b"{}", "namespace": "order-events", "content_type": "application/protobuf", "encoding": "",
            "encrypted": False, "mode": "warn", "other_mode": "off", "violations": 0, "validator": True,
            "checker": True, "check_fails": False, "deprecated": True, "uses_deprecated": True,
            "format": "protobuf", "name": "Order", "pii": False}
    out = _run(Enrich, case)
    assert counts["payload_bytes"] == 1
    assert [c[0] for c in out["calls"]] == ["validate", "check", "track"]
    assert all(c[1] == b"{}" for c in out["calls"])
    assert out["validations"] == {("order-events", "v1", "warn", "valid"): 1}

"""Attacks on the security context, end to end through the real worker on the embedded broker
(issue 13). Each attack is a signed envelope changed after signing; each must end in the DLQ
at the verify_signature stage with a specific reason, and none may reach `.v3` (or `.v2`).

* classification downgrade (restricted -> public) and PII-flag removal on input;
* a second security record appended to a signed envelope, and duplicated metadata records;
* a legacy-scope signature, clean and with its classification rewritten (the shipped
  topology does not accept the legacy scope);
* identity swap on the worker's own `.v3` output: the worker re-signs with scope v2, so a
  changed `publisher_id` fails against the worker's public key, and re-injected it is DLQed.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from app.envelope import Layout, decode, encode, new_envelope
from app.envelope.wire import encode_varint, iter_records
from app.errors import SignatureError
from app.security.signing import SCOPE_BATCH, SCOPE_LEGACY, VerificationKeys, sign, verify
from tests.brokers import BrokerUnderTest
from tests.worker.conftest import dev_keys, make_topology  # noqa: F401 - dev_keys is a fixture used by name
from tests.worker.harness import RunningPipeline


def _record(field: int, value: bytes) -> bytes:
    return encode_varint(field << 3 | 2) + encode_varint(len(value)) + value


def _replace_in_security(data: bytes, layout: Layout, field: int, value: bytes) -> bytes:
    """Byte-level edit, as an attacker on the wire would do it: replace one security-context
    field's value and re-frame the security record (no decode/encode round trip)."""
    sec = next(r for r in iter_records(data) if r.field == layout.security_field)
    body = data[sec.value_start:sec.end]
    kept = b"".join(body[r.start:r.end] for r in iter_records(body) if r.field != field)
    return data[:sec.start] + _record(layout.security_field, kept + _record(field, value)) + data[sec.end:]


async def test_security_context_attacks_end_in_the_dlq(any_broker: BrokerUnderTest, tmp_path: Path,
                                                      dev_keys) -> None:  # noqa: F811
    broker = any_broker  # the embedded broker and Apache Kafka
    topo = make_topology(tmp_path, dev_keys, partitions=2)
    topic = topo.sources[0].topic
    producer = dev_keys.keyring.signing["dev-producer-1"]

    def restricted(**kw):
        env = new_envelope(topic, {"order_id": "o-13", "email": "jane@example.com"}, namespace="order-events",
                           data_classification="restricted", contains_pii=True, **kw)
        env.ensure_security().publisher_id = "svc-orders"
        return env

    def tampered(layout: Layout, **changes) -> bytes:
        env = decode(sign(restricted(), producer, layout))
        for name, value in changes.items():
            setattr(env.security, name, value)
        return encode(env, layout)

    signed = sign(restricted(), producer)
    md = next(r for r in iter_records(signed) if r.field == 1)
    attacks: dict[str, tuple[bytes, str]] = {
        "downgrade-classification-v3": (tampered(Layout.REVIEWED, data_classification="public"), "bad_signature"),
        "downgrade-classification-v2": (tampered(Layout.DRAFT, data_classification="public"), "bad_signature"),
        "remove-pii-flag-v3": (tampered(Layout.REVIEWED, contains_pii=False), "bad_signature"),
        "remove-pii-flag-v2": (tampered(Layout.DRAFT, contains_pii=False), "bad_signature"),
        "second-security-record": (signed + _record(2, _record(8, b"public") + b"\x38\x00"), "ambiguous_envelope"),
        "second-security-record-empty-signature": (
            sign(restricted(), producer) + _record(2, _record(4, b"") + _record(8, b"public")), "ambiguous_envelope"),
        "duplicated-metadata": (signed + signed[md.start:md.end], "ambiguous_envelope"),
        "legacy-scope": (sign(restricted(), producer, scope=SCOPE_LEGACY), "legacy_signature_scope"),
        "legacy-scope-downgraded": (
            _replace_in_security(sign(restricted(), producer, scope=SCOPE_LEGACY), Layout.REVIEWED, 8, b"public"),
            "legacy_signature_scope"),
    }
    control = new_envelope(topic, {"order_id": "o-ok"}, namespace="order-events", data_classification="internal")
    control.ensure_security().publisher_id = "svc-orders"
    control_id = control.message_id
    attack_ids = {name: decode(value).message_id for name, (value, _) in attacks.items()}

    async with RunningPipeline(topo, broker.bootstrap, tmp_path / "w", embedded=broker.embedded) as p:
        for name, (value, _) in attacks.items():
            await p.send(value, key=name.encode())
        await p.send(sign(control, producer), key=b"control")
        await p.wait_read(len(attacks) + 1)
        out = await p.outputs()

        # --- every attack in the DLQ, at verify_signature, with its reason ------------------
        dlq = {r.key.decode(): dict(r.headers) for r in out[topic + ".dlq"]}
        assert set(dlq) == set(attacks), sorted(dlq)
        for name, (_, reason) in attacks.items():
            assert dlq[name]["prism.errors.stage"] == b"verify_signature", name
            assert dlq[name]["prism.errors.reason"] == reason.encode(), (name, dlq[name]["prism.errors.reason"])

        # --- nothing of an attack reached the outputs; the control did ---------------------
        for suffix in ("v3", "v2"):
            ids = [decode(r.value).message_id for r in out[f"{topic}.{suffix}"]]
            assert ids == [control_id], (suffix, ids)
            assert not set(attack_ids.values()) & set(ids)

        # --- the worker's outputs: one batch-scope signature for both copies (and the batch),
        # verifiable with its public key only, each copy on its own ------------------------------
        worker_key = VerificationKeys.of([dev_keys.keyring.verify_all.keys["prism-worker-1"]])
        v3 = out[f"{topic}.v3"][0].value
        v2 = out[f"{topic}.v2"][0].value
        assert verify(v3, worker_key).scope == SCOPE_BATCH
        assert verify(v2, worker_key).scope == SCOPE_BATCH
        assert decode(v3).security.signature == decode(v2).security.signature
        assert decode(v3).security.publisher_id == "svc-orders"

        # --- identity swap on .v3: rejected by any consumer, and by the worker if replayed ---
        swapped = _replace_in_security(v3, Layout.REVIEWED, 1, b"svc-mallory")
        assert decode(swapped).security.publisher_id == "svc-mallory"
        with pytest.raises(SignatureError, match="forged or tampered"):
            verify(swapped, worker_key)
        downgraded_v2 = _replace_in_security(v2, Layout.DRAFT, 8, b"public")
        with pytest.raises(SignatureError, match="forged or tampered"):
            verify(downgraded_v2, worker_key)

        await p.send(swapped, key=b"replayed-identity-swap")
        await p.wait_read(len(attacks) + 2)
        out = await p.outputs()

    replayed = [dict(r.headers) for r in out[topic + ".dlq"] if r.key == b"replayed-identity-swap"]
    assert len(replayed) == 1
    assert replayed[0]["prism.errors.stage"] == b"verify_signature"
    assert replayed[0]["prism.errors.reason"] == b"bad_signature"
    assert [decode(r.value).message_id for r in out[f"{topic}.v3"]] == [control_id]
    summary = p.pipeline.summary()
    assert summary["emitted"] == 1 and summary["dlq"] == len(attacks) + 1, summary

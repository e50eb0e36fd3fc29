"""An attacker who can read the DLQ and write the source topic tries to publish under someone
else's identity by forging DLQ replays. Real worker, real embedded broker: every forgery goes
back to the DLQ with its own reason and nothing of it reaches `.v3`; the genuine replay sent
alongside does.

Forgeries: an attestation signed with another key under the worker's key id; one signed by a
key the worker does not trust; an identity edited after signing; a genuine attestation moved
onto another record's payload; a genuine attestation on its record with a header added; one
older than the maximum age; and a record with its attestation removed (left with its masked token: it fails authentication
exactly as replays did before attestations existed)."""

from __future__ import annotations

import base64
import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from app.agents.dlq import error_context, strip_error_headers
from app.demo.runner import read_all
from app.envelope import decode
from app.security.attestation import DOMAIN, HEADER
from app.security.devkeys import DevKeys, ensure_dev_keys
from tests.brokers import BrokerUnderTest
from tests.worker.conftest import make_topology
from tests.worker.harness import RunningPipeline
from tests.worker.replay import attestation_doc, authenticated_messages, fixed_topology


@pytest.fixture(scope="module")
def dev_keys(tmp_path_factory: pytest.TempPathFactory) -> DevKeys:
    return ensure_dev_keys(tmp_path_factory.mktemp("dev-keys"))


def _b64(data: bytes) -> bytes:
    return base64.urlsafe_b64encode(data).rstrip(b"=")


def _split(raw: bytes) -> tuple[dict[str, Any], bytes]:
    body, sig = raw.split(b".")
    return json.loads(base64.urlsafe_b64decode(body + b"=" * (-len(body) % 4))), sig


def _signed(doc: dict[str, Any], key: Ed25519PrivateKey) -> bytes:
    data = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
    return _b64(data) + b"." + _b64(key.sign(DOMAIN + data))


def _with_attestation(headers: list[tuple[str, bytes]], raw: bytes | None) -> list[tuple[str, bytes]]:
    out = [(k, v) for k, v in headers if k != HEADER]
    return [*out, (HEADER, raw)] if raw is not None else out


async def test_forged_replays_never_reach_v3(any_broker: BrokerUnderTest, tmp_path: Path, dev_keys: DevKeys) -> None:
    broker = any_broker  # the embedded broker and Apache Kafka
    topo = make_topology(tmp_path, dev_keys, partitions=1)
    src = topo.sources[0].topic
    group = f"test-forgery-{uuid.uuid4().hex[:8]}"
    messages = authenticated_messages(src, dev_keys, 4)
    async with RunningPipeline(topo, broker.bootstrap, tmp_path / "w", app_id=group, embedded=broker.embedded) as p:
        for value, headers, _ in messages:
            await p.send(value, headers=headers)
        await p.wait_read(len(messages))
    dlq = (await read_all(broker.bootstrap, {src + ".dlq": 1}, expected_total=4, timeout=30))[src + ".dlq"]
    assert len(dlq) == 4 and all(HEADER in dict(r.headers) for r in dlq)
    # What `prism dlq replay` would send: the record minus its error context.
    env_a, legacy_b, env_c, legacy_d = [(r.key, r.value, strip_error_headers(list(r.headers))) for r in dlq]
    real, sig_a = _split(dict(env_a[2])[HEADER])

    impostor = Ed25519PrivateKey.generate()
    worker = dev_keys.keyring.signing["prism-worker-1"]
    edited = dict(real, publisher_id="payments-admin", publisher_team="payments")
    forged: dict[str, tuple[Any, bytes, list[tuple[str, bytes]], str]] = {
        "other key, worker's key id": (*env_a[:2], _with_attestation(env_a[2], _signed(real, impostor)),
                                       "attestation_invalid"),
        "untrusted key id": (*env_a[:2], _with_attestation(env_a[2], _signed(dict(real, kid="ops-laptop"), impostor)),
                             "attestation_untrusted_key"),
        "identity edited after signing": (*env_a[:2], _with_attestation(
            env_a[2], _b64(json.dumps(edited, sort_keys=True, separators=(",", ":")).encode()) + b"." + sig_a),
            "attestation_invalid"),
        "attestation moved onto another payload": (env_c[0], env_c[1],
                                                   _with_attestation(env_c[2], dict(env_a[2])[HEADER]),
                                                   "attestation_mismatch"),
        "header added to an attested record": (legacy_b[0], legacy_b[1],
                                               [("publisher-id", b"payments-admin"), *legacy_b[2]],
                                               "attestation_mismatch"),
        "attestation removed (masked token left)": (*env_c[:2], _with_attestation(env_c[2], None),
                                                    "malformed_token"),
        # a genuine worker signature, but issued longer ago than dlq.attestation.max_age_s (7 days)
        "genuine but too old": (*env_a[:2], _with_attestation(env_a[2], _signed(
            dict(real, iat_ms=real["iat_ms"] - 8 * 86_400_000), worker.private_key)), "attestation_expired"),
    }

    fixed = fixed_topology(topo, tmp_path / "fixed")  # the policy is fixed: genuine replays now pass
    async with RunningPipeline(fixed, broker.bootstrap, tmp_path / "w", app_id=group, embedded=broker.embedded) as p2:
        sent: dict[int, str] = {}
        for name, (key, value, headers, _) in forged.items():
            sent[(await p2.send(value, headers=headers, key=key)).offset] = name
        await p2.send(legacy_d[1], headers=legacy_d[2], key=legacy_d[0])  # control: a genuine replay
        await p2.wait_read(len(forged) + 1)
        out = await read_all(broker.bootstrap, {src + ".dlq": 1, src + ".v3": 1}, expected_total=4 + len(forged) + 1,
                             timeout=30)
    s = p2.pipeline.summary()
    assert s["emitted"] == 1 and s["dlq"] == len(forged), s

    reasons = {}
    for rec in out[src + ".dlq"][4:]:
        ctx = error_context(rec.headers)
        assert ctx["stage"] == "authenticate"
        reasons[sent[int(ctx["offset"])]] = ctx["reason"]
    assert reasons == {name: f[3] for name, f in forged.items()}

    v3 = out[src + ".v3"]
    assert len(v3) == 1  # only the genuine replay
    env = decode(v3[0].value)
    control = attestation_doc(dlq[3])
    assert env.message_id == control["message_id"]
    assert (env.security.publisher_id, env.security.publisher_team) == (control["publisher_id"],
                                                                         control["publisher_team"])
    assert env.security.publisher_id != "payments-admin"

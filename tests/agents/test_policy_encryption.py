"""The topology's `encryption:` block: validated at load and at start-up with every problem at
once, and what the policy stage does with it (encrypt a classified plaintext payload, or send it
to the DLQ as `worker_encryption_failed` when its key is not usable)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml

from app.agents.base import Message
from app.agents.policy import Policy
from app.envelope import new_envelope
from app.errors import ConfigError, PolicyError, WorkerEncryptionError
from app.security import keys as keymod
from app.security.algorithms import KEY_ML_KEM_1024, KEY_SYMMETRIC_256, KEY_X25519_ML_KEM_1024
from app.security.encryption import decrypt_envelope
from app.security.worker_encryption import build_worker_encryption
from app.topology import load_topology

ROOT = Path(__file__).resolve().parents[2]
NS = "order-events"


def topology(tmp_path: Path, encryption: dict | None, policy: dict | None = None):
    doc = yaml.safe_load((ROOT / "topologies/orders-created.yaml").read_text())
    if encryption is not None:
        doc["encryption"] = encryption
    if policy is not None:
        for stage in doc["stages"]:
            if "policy" in stage:
                stage["policy"].update(policy)
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(doc))
    return load_topology(path)


def test_load_reports_every_problem_of_the_block_at_once(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        topology(tmp_path, {"provider": "aws-kms", "path": "keys", "refresh_s": 5, "encrypt_unencrypted": [],
                            "algorithm": "ml-kem-1024"})
    text = str(info.value)
    for expected in ("encryption.encrypt_unencrypted: is empty", "encryption.path: not used by provider aws-kms",
                     "encryption.kms: provider aws-kms needs", "symmetric data keys only",
                     "encryption.refresh_s: only provider k8s-secrets"):
        assert expected in text, expected
    with pytest.raises(ConfigError) as info:
        topology(tmp_path, {"provider": "k8s-secrets", "encrypt_unencrypted": ["secret"], "algorithm": "rsa-oaep-1024"})
    text = str(info.value)
    assert "encrypt_unencrypted" in text and "encryption.algorithm" in text and "encryption.path" in text
    with pytest.raises(ConfigError, match="allowed_algorithms"):
        topology(tmp_path, {"provider": "file", "path": "k.json", "encrypt_unencrypted": ["restricted"],
                            "algorithm": "x25519-ml-kem-1024"}, policy={"fips_mode": True})


def test_startup_refuses_a_worker_that_could_decrypt_and_keys_that_do_not_serve(tmp_path: Path) -> None:
    """Both problems in one error: the private half of a consumer key, and a namespace whose
    rotation group has no key."""
    ring = keymod.FileKeyring([keymod.new_key_record("hyb-other-ns", KEY_X25519_ML_KEM_1024, namespace="billing")])
    ring.save(tmp_path / "worker-keys.json")
    topo = topology(tmp_path, {"provider": "file", "path": "worker-keys.json", "encrypt_unencrypted": ["restricted"],
                               "algorithm": "x25519-ml-kem-1024"})
    with pytest.raises(ConfigError) as info:
        build_worker_encryption(topo)
    text = str(info.value)
    assert "2 problem(s)" in text and "private half of ['hyb-other-ns']" in text
    assert f"namespace {NS!r} has no current x25519-ml-kem-1024 key" in text
    with pytest.raises(ConfigError, match="the worker's encryption keys do not load"):
        build_worker_encryption(topology(tmp_path, {"provider": "k8s-secrets", "path": "missing-dir",
                                                    "encrypt_unencrypted": ["restricted"],
                                                    "algorithm": "ml-kem-1024"}))
    ring.public_only().save(tmp_path / "pub.json")
    with pytest.raises(ConfigError, match="is a x25519-ml-kem-1024 key; ml-kem-1024 needs"):
        build_worker_encryption(topology(tmp_path, {"provider": "file", "path": "pub.json", "key_id": "hyb-other-ns",
                                                    "encrypt_unencrypted": ["restricted"],
                                                    "algorithm": "ml-kem-1024"}))


def msg_for(classification: str) -> Message:
    env = new_envelope("orders.created", {"card": "4111"}, namespace=NS, data_classification=classification)
    return Message("orders.created", 0, 0, b"", envelope=env)


def test_policy_encrypts_listed_classifications_and_still_refuses_the_others(tmp_path: Path) -> None:
    consumer = keymod.FileKeyring([keymod.new_key_record("pq-1", KEY_ML_KEM_1024, namespace=NS)])
    consumer.public_only().save(tmp_path / "pub.yaml")
    topo = topology(tmp_path, {"provider": "file", "path": "pub.yaml", "encrypt_unencrypted": ["restricted"],
                               "algorithm": "ml-kem-1024"})
    enc = build_worker_encryption(topo)
    stage = Policy(topo.stage("policy"), enc)
    msg = msg_for("restricted")
    stage.process(msg)
    assert msg.env.is_encrypted and msg.env.security.encryption.key_id == "pq-1"
    assert decrypt_envelope(msg.env, consumer) == b'{"card":"4111"}'
    with pytest.raises(PolicyError):  # confidential is required but not listed: still the producer's job
        stage.process(msg_for("confidential"))
    public = msg_for("public")
    stage.process(public)
    assert not public.env.is_encrypted
    assert enc.encrypted == {"restricted": 1}


def test_a_key_that_stopped_serving_sends_the_message_to_the_dlq_with_its_own_reason(tmp_path: Path) -> None:
    now = datetime.now(UTC)
    clock = [now]
    key = keymod.new_key_record("sym-1", KEY_SYMMETRIC_256, namespace=NS, created=now - timedelta(days=1),
                                expires=now + timedelta(hours=1))
    ring = keymod.FileKeyring([key], clock=lambda: clock[0])
    topo = topology(tmp_path, {"provider": "file", "path": "unused.json", "encrypt_unencrypted": ["restricted"],
                               "algorithm": "aes-256-gcm", "key_id": "sym-1"})
    enc = build_worker_encryption(topo, provider=ring)
    stage = Policy(topo.stage("policy"), enc)
    clock[0] = now + timedelta(hours=2)  # the key expired while the worker runs
    with pytest.raises(WorkerEncryptionError) as info:
        stage.process(msg_for("restricted"))
    err = info.value
    assert err.code == "worker_encryption_failed" and err.path == "encryption.key_id"
    assert "sym-1" in err.message and "expired" in err.message and err.hint

"""How a worker sets up DLQ attestations from its topology and keyring (app/worker/pipeline.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from app.errors import ConfigError
from app.security.signing import load_signing_keyring
from app.topology import load_topology
from app.worker.pipeline import attestation_setup
from tests.worker.conftest import make_topology


def _with(tmp_path: Path, dev_keys, **dlq_attestation):
    make_topology(tmp_path, dev_keys)
    doc = yaml.safe_load((tmp_path / "topology.yaml").read_text())
    doc.setdefault("dlq", {})["attestation"] = dlq_attestation
    (tmp_path / "topology.yaml").write_text(yaml.safe_dump(doc))
    return load_topology(tmp_path / "topology.yaml")


def test_the_worker_key_signs_and_is_trusted(tmp_path: Path, dev_keys) -> None:
    ring = load_signing_keyring(dev_keys.signing_path)
    attester, verifier = attestation_setup(_with(tmp_path, dev_keys), ring, None)
    assert attester is not None and attester.key.key_id == "prism-worker-1"
    assert verifier is not None and set(verifier.keys) == {"prism-worker-1"} and verifier.max_age_s == 7 * 86400


def test_off_when_disabled_or_without_a_keyring(tmp_path: Path, dev_keys) -> None:
    ring = load_signing_keyring(dev_keys.signing_path)
    assert attestation_setup(_with(tmp_path, dev_keys, enabled=False), ring, None) == (None, None)
    assert attestation_setup(_with(tmp_path, dev_keys), None, None) == (None, None)


def test_a_producer_key_can_never_vouch_for_identities(tmp_path: Path, dev_keys) -> None:
    ring = load_signing_keyring(dev_keys.signing_path)
    with pytest.raises(ConfigError, match=r"dev-producer-1.*hmac-sha256") as e:
        attestation_setup(_with(tmp_path, dev_keys, trusted_keys=["dev-producer-1"]), ring, None)
    assert e.value.path == "dlq.attestation.trusted_keys"


def test_without_an_ed25519_worker_key_replays_keep_failing_authentication(tmp_path: Path, dev_keys,
                                                                         caplog) -> None:
    ring = load_signing_keyring(dev_keys.signing_path)
    hmac_only = ring.signing["dev-producer-1"]
    assert attestation_setup(_with(tmp_path, dev_keys), ring, hmac_only) == (None, None)
    ring.worker_key_id = None
    assert attestation_setup(_with(tmp_path, dev_keys), ring, None) == (None, None)
    assert "DLQ attestations are off" in caplog.text

"""How the worker and the CLI get the keys a topology names: the DLQ attestation set-up (app/security/topology_keys.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from app.errors import ConfigError
from app.security.devkeys import DevKeys, ensure_dev_keys
from app.security.signing import load_signing_keyring
from app.security.topology_keys import attestation_setup
from app.topology import load_topology
from tests.worker.conftest import make_topology


@pytest.fixture(scope="module")
def dev_keys(tmp_path_factory: pytest.TempPathFactory) -> DevKeys:
    return ensure_dev_keys(tmp_path_factory.mktemp("dev-keys"))


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


def test_the_cli_reads_attestations_with_the_worker_keys_public_half(tmp_path: Path, dev_keys) -> None:
    """`prism dlq list|show` check attestations with the keys the worker would trust, and need no
    private key to do it."""
    from app.security.topology_keys import attestation_reader

    reader = attestation_reader(_with(tmp_path, dev_keys, trusted_keys=[]))
    assert reader is not None and set(reader.keys) == {"prism-worker-1"}
    assert attestation_reader(_with(tmp_path, dev_keys, enabled=False)) is None


def test_an_unreadable_keyring_is_a_reason_in_the_listing_not_a_crash(tmp_path: Path, dev_keys) -> None:
    from app.cli.ops import attestation_reader_for

    topo = _with(tmp_path, dev_keys)
    doc = yaml.safe_load((tmp_path / "topology.yaml").read_text())
    doc["outputs"]["keyring"] = str(tmp_path / "missing.json")
    (tmp_path / "topology.yaml").write_text(yaml.safe_dump(doc))
    reader, why = attestation_reader_for(load_topology(tmp_path / "topology.yaml"))
    assert reader is None and why.startswith("the topology's keyring could not be read (")
    assert attestation_reader_for(topo)[0] is not None

"""`MountedSecretsKeyProvider`: keys from a Kubernetes-mounted Secret, rotated by swapping the
`..data` symlink exactly as kubelet does, picked up without a restart."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml

from app.envelope.model import new_envelope
from app.errors import KeyNotUsableError, KeyringError, UnknownKeyError
from app.security import keys as keymod
from app.security.algorithms import KEY_SYMMETRIC_256, KEY_X25519_ML_KEM_1024
from app.security.encryption import decrypt_envelope, encrypt_envelope
from app.security.keys import KeyUse, MountedSecretsKeyProvider, write_secret_mount

T0 = datetime(2026, 1, 1, tzinfo=UTC)


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def key_file(record: keymod.KeyRecord, *, public_only: bool = False) -> str:
    ring = keymod.FileKeyring([record])
    if public_only:
        ring = ring.public_only()
    return yaml.safe_dump(ring.to_mapping()["keys"][0])


def sym(key_id: str, not_before: datetime) -> keymod.KeyRecord:
    return keymod.new_key_record(key_id, KEY_SYMMETRIC_256, created=not_before, not_before=not_before,
                                 namespace="orders")


def test_reads_a_kubelet_mount_and_picks_up_a_rotation_without_restart(tmp_path: Path) -> None:
    mount = tmp_path / "keys"
    k1, k2 = sym("orders-k1", T0), sym("orders-k2", T0 + timedelta(days=30))
    write_secret_mount(mount, {"k1.yaml": key_file(k1)}, version="2026_01_01_v1")
    assert (mount / "..data").is_symlink() and (mount / "k1.yaml").is_symlink()
    clock = Clock()
    now = [T0 + timedelta(days=31)]
    provider = MountedSecretsKeyProvider(mount, refresh_s=30, monotonic=clock, clock=lambda: now[0])
    assert provider.current_key_id(KEY_SYMMETRIC_256, "orders") == "orders-k1"
    env = new_envelope("orders.created", {"a": 1}, namespace="orders")
    encrypt_envelope(env, provider)

    # kubelet's update: new files in a new hidden dir, `..data` swapped in one rename
    write_secret_mount(mount, {"k1.yaml": key_file(k1), "k2.yaml": key_file(k2)}, version="2026_02_01_v2")
    assert provider.current_key_id(KEY_SYMMETRIC_256, "orders") == "orders-k1"  # inside refresh_s: not looked yet
    clock.t += 31
    assert provider.current_key_id(KEY_SYMMETRIC_256, "orders") == "orders-k2"  # rotated, no restart
    assert provider.reloads == 1
    assert decrypt_envelope(env, provider) == b'{"a":1}'  # the old key still decrypts (overlap)


def test_an_unknown_key_id_forces_a_re_read_at_once(tmp_path: Path) -> None:
    mount = tmp_path / "keys"
    write_secret_mount(mount, {"k1.yaml": key_file(sym("orders-k1", T0))}, version="v1")
    clock = Clock()
    provider = MountedSecretsKeyProvider(mount, refresh_s=3600, monotonic=clock)
    producer_ring = keymod.FileKeyring([sym("orders-k2", T0)])
    env = new_envelope("orders.created", {"a": 2}, namespace="orders")
    encrypt_envelope(env, producer_ring, key_id="orders-k2")
    clock.t += 5
    with pytest.raises(UnknownKeyError):
        decrypt_envelope(env, provider)  # not mounted yet
    write_secret_mount(mount, {"k1.yaml": key_file(sym("orders-k1", T0)),
                               "k2.json": json.dumps(producer_ring.to_mapping())}, version="v2")  # a whole keyring file
    with pytest.raises(UnknownKeyError):
        decrypt_envelope(env, provider)  # forced re-reads are at most one per second
    clock.t += 1.5
    assert decrypt_envelope(env, provider) == b'{"a":2}'


def test_a_broken_update_keeps_the_last_good_keys(tmp_path: Path, caplog) -> None:
    mount = tmp_path / "keys"
    write_secret_mount(mount, {"k1.yaml": key_file(sym("orders-k1", T0))}, version="v1")
    clock = Clock()
    provider = MountedSecretsKeyProvider(mount, refresh_s=1, monotonic=clock)
    write_secret_mount(mount, {"k1.yaml": "id: orders-k1\ntype: symmetric-256\ncreated: 2026-01-01T00:00:00Z\n"
                                          "secret: dG9vIHNob3J0\n"}, version="v2")
    caplog.set_level(logging.ERROR, logger="prism.security.keys")
    for _ in range(3):
        clock.t += 2
        assert provider.get_symmetric_key("orders-k1", KeyUse.DECRYPT).key_id == "orders-k1"
    assert provider.reloads == 0 and "is 9 bytes, secret needs 32" in (provider.last_error or "")
    assert len([r for r in caplog.records if "keeping the previous keys" in r.getMessage()]) == 1  # once, not per poll
    assert "dG9v" not in caplog.text  # never material


def test_public_only_refuses_private_halves_of_consumer_keys(tmp_path: Path) -> None:
    mount = tmp_path / "keys"
    hyb = keymod.new_key_record("hyb-1", KEY_X25519_ML_KEM_1024, created=T0)
    rsa = keymod.new_key_record("rsa-1", "rsa-3072", created=T0)
    write_secret_mount(mount, {"hyb.yaml": key_file(hyb), "rsa.yaml": key_file(rsa),
                               "sym.yaml": key_file(sym("orders-k1", T0))}, version="v1")
    with pytest.raises(KeyringError) as info:
        MountedSecretsKeyProvider(mount, public_only=True)
    text = str(info.value)
    assert "hyb.yaml" in text and "rsa.yaml" in text and "2 problem(s)" in text and "public-only" in text
    write_secret_mount(mount, {"hyb.yaml": key_file(hyb, public_only=True), "rsa.yaml": key_file(rsa, public_only=True),
                               "sym.yaml": key_file(sym("orders-k1", T0))}, version="v2")
    provider = MountedSecretsKeyProvider(mount, public_only=True)
    assert provider.get_public_key("hyb-1").key_type == KEY_X25519_ML_KEM_1024
    with pytest.raises(KeyNotUsableError, match="no private key"):
        provider.get_private_key("hyb-1")
    assert keymod.private_key_ids(provider) == []


def test_a_plain_directory_is_watched_by_file_stat(tmp_path: Path) -> None:
    """Outside Kubernetes (a docker secret dir, a dev folder) there is no `..data`: changes are
    seen from the files' names, sizes, mtimes and inodes."""
    clock = Clock()
    (tmp_path / "k1.yaml").write_text(key_file(sym("orders-k1", T0)))
    provider = MountedSecretsKeyProvider(tmp_path, refresh_s=1, monotonic=clock)
    (tmp_path / "k2.yaml").write_text(key_file(sym("orders-k2", T0 + timedelta(seconds=1))))
    clock.t += 2
    assert provider.list_key_ids() == ["orders-k1", "orders-k2"]
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(KeyringError, match="holds no key files"):
        MountedSecretsKeyProvider(empty)

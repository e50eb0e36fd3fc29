"""`ensure_dev_keys` (`prism run --dev-keys`, `prism demo`) on a folder holding an issuer key it
cannot use: one `ConfigError` naming the file and the fix, never a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from app.errors import ConfigError
from app.security.devkeys import ensure_dev_keys


def _ec_pem() -> bytes:
    key = ec.generate_private_key(ec.SECP256R1())
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


@pytest.mark.parametrize("content, why", [
    (b"garbage\n", "not an unencrypted PEM private key"),  # was a ValueError traceback
    (b"", "not an unencrypted PEM private key"),
    (b"\xff\xfe", "not UTF-8"),
    (None, "not the Ed25519 key"),  # another key type: was an AssertionError traceback
    (b"-----BEGIN PRIVATE KEY-----\n" + b"A" * 70_000, "over 65536 bytes"),
])
def test_an_unusable_issuer_key_is_one_config_error(tmp_path: Path, content: bytes | None, why: str) -> None:
    folder = tmp_path / "keys"
    folder.mkdir()
    (folder / "issuer.pem").write_bytes(_ec_pem() if content is None else content)
    with pytest.raises(ConfigError, match=why) as err:
        ensure_dev_keys(folder)
    assert err.value.path == str(folder / "issuer.pem") and "prism keys init" in (err.value.hint or "")


def test_a_good_set_is_kept(tmp_path: Path) -> None:
    first = ensure_dev_keys(tmp_path / "keys")
    again = ensure_dev_keys(tmp_path / "keys")
    raw = serialization.Encoding.Raw
    assert first.issuer_key.public_key().public_bytes(raw, serialization.PublicFormat.Raw) == \
        again.issuer_key.public_key().public_bytes(raw, serialization.PublicFormat.Raw)

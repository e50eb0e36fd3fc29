"""Development keys for the embedded demo: never for production.

`ensure_dev_keys(dir)` creates (once) a signing keyring (`signing.json`: an HMAC producer
key and the worker's Ed25519 key), an Ed25519 token-issuer key (`issuer.pem`, private)
and its JWKS (`jwks.json`, public only), all mode 0600 in a folder that is git-ignored.
`DevKeys.mint_token(...)` issues JWTs the demo topology accepts.
"""

from __future__ import annotations

import base64
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

import jwt
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    PublicFormat,
    load_pem_private_key,
)

from app.security.signing import SigningKeyring, load_signing_keyring, write_dev_keyring

ISSUER = "https://auth.prism.dev"
AUDIENCE = "prism"
TOKEN_KID = "dev-issuer-1"


@dataclass
class DevKeys:
    folder: Path
    keyring: SigningKeyring
    issuer_key: Ed25519PrivateKey

    @property
    def signing_path(self) -> Path:
        return self.folder / "signing.json"

    @property
    def jwks_path(self) -> Path:
        return self.folder / "jwks.json"

    def mint_token(self, sub: str, *, team: str = "commerce", ttl_s: int = 3600, now: float | None = None,
                   audience: str = AUDIENCE) -> str:
        t = time.time() if now is None else now
        claims = {"sub": sub, "team": team, "iss": ISSUER, "aud": audience, "iat": int(t), "exp": int(t + ttl_s)}
        return jwt.encode(claims, self.issuer_key, algorithm="EdDSA", headers={"kid": TOKEN_KID})


def _b64url(b: bytes) -> str:
    return base64.urlsafe_b64encode(b).rstrip(b"=").decode()


def ensure_dev_keys(folder: str | Path) -> DevKeys:
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    signing = folder / "signing.json"
    keyring = load_signing_keyring(signing) if signing.exists() else write_dev_keyring(signing)
    pem = folder / "issuer.pem"
    if pem.exists():
        key = load_pem_private_key(pem.read_bytes(), password=None)
        assert isinstance(key, Ed25519PrivateKey)
    else:
        key = Ed25519PrivateKey.generate()
        pem.write_bytes(key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()))
        os.chmod(pem, 0o600)
    jwks = folder / "jwks.json"
    if not jwks.exists():
        pub = key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
        jwks.write_text(json.dumps({"keys": [{"kty": "OKP", "crv": "Ed25519", "x": _b64url(pub),
                                              "kid": TOKEN_KID, "alg": "EdDSA", "use": "sig"}]}, indent=2))
    return DevKeys(folder, keyring, key)

"""Key sets for a worker: generated on purpose, never behind the operator's back.

A key set is three files in one directory: a signing keyring (`signing.json`: an HMAC producer
key and the worker's Ed25519 key), an Ed25519 token-issuer key (`issuer.pem`, private) and its
JWKS (`jwks.json`, public only), all mode 0600 in a 0700 directory.

* `init_keys(dir)` - `prism keys init`: a fresh set, written once (never over an existing one
  unless forced), to be shared by every worker of a consumer group (a volume, a Secret).
* `ensure_dev_keys(dir)` - `prism demo` and `prism run --dev-keys`: creates whatever is missing,
  for a throwaway try-out on one machine.
* `check_topology_keys(topology)` - what `prism run` does instead of generating keys: the key
  files a topology names must exist. `prism run` used to create development keys silently
  wherever none were configured - in containers too, so two workers of one group each signed
  with their own throwaway key and consumers rejected part of the stream.

`DevKeys.mint_token(...)` issues JWTs the shipped topology accepts (tests, the demo).
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

from app.errors import ConfigError, PrismError
from app.security.signing import SigningKeyring, dev_keyring_doc, load_signing_keyring, write_dev_keyring

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


#: Written next to keys that `prism demo` / `--dev-keys` made: `prism keys init` replaces such a
#: set without `--force` (nothing real uses it), and says so.
THROWAWAY_MARK = ".throwaway"


def is_throwaway(folder: str | Path) -> bool:
    """True when every key file in `folder` was made by `ensure_dev_keys` (demo / --dev-keys)."""
    return (Path(folder) / THROWAWAY_MARK).is_file()


def _load_issuer_key(pem: Path) -> Ed25519PrivateKey:
    """The Ed25519 token-issuer key an earlier `--dev-keys` (or `prism keys init`) left in
    `pem`. Read through the bounded reader of configuration files; a file that is not such a
    key is one `ConfigError` (it was a ValueError or AssertionError traceback from `prism run
    --dev-keys`, with an issuer.pem that is garbage, empty, or an RSA key)."""
    from app.config_files import read_text

    fix = (f"move {pem} away so --dev-keys makes a fresh one (workers that trust the old JWKS will refuse "
           f"new tokens), or run `prism keys init --dir {pem.parent} --force`")
    try:
        text = read_text(pem, what="token issuer key", max_bytes=64 * 1024)
    except ConfigError as exc:  # unreadable, too large, not text: the same way out
        raise ConfigError(exc.message, path=str(pem), hint=fix) from None
    try:
        key = load_pem_private_key(text.encode(), password=None)
    except (ValueError, TypeError) as exc:  # not PEM, encrypted (TypeError), unsupported
        raise ConfigError(f"token issuer key is not an unencrypted PEM private key ({str(exc).split('.')[0]})",
                          path=str(pem), hint=fix) from None
    if not isinstance(key, Ed25519PrivateKey):
        raise ConfigError(f"token issuer key holds a key of type {type(key).__name__}, not the Ed25519 key the "
                          "development JWKS (EdDSA) needs", path=str(pem), hint=fix)
    return key


def ensure_dev_keys(folder: str | Path) -> DevKeys:
    """Throwaway keys in `folder` (the demo, `prism run --dev-keys`): the existing files are kept,
    missing ones made; the folder is 0700 like `prism keys init`'s. A set this function started
    is marked throwaway, so `prism keys init` may replace it later without `--force` - right after
    `make demo` it used to fail with `keys_exist`."""
    folder = Path(folder)
    fresh = not existing_key_files(folder)
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(folder, 0o700)
    if fresh:
        (folder / THROWAWAY_MARK).write_text("made by prism demo / prism run --dev-keys; `prism keys init` "
                                              "replaces this set\n")
    signing = folder / "signing.json"
    keyring = load_signing_keyring(signing) if signing.exists() else write_dev_keyring(signing)
    pem = folder / "issuer.pem"
    if pem.exists():
        key = _load_issuer_key(pem)
    else:
        key = Ed25519PrivateKey.generate()
        pem.write_bytes(key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()))
        os.chmod(pem, 0o600)
    jwks = folder / "jwks.json"
    if not jwks.exists():
        jwks.write_text(json.dumps(_jwks_doc(key), indent=2))
        os.chmod(jwks, 0o600)
    return DevKeys(folder, keyring, key)


def _jwks_doc(key: Ed25519PrivateKey) -> dict[str, object]:
    pub = key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    return {"keys": [{"kty": "OKP", "crv": "Ed25519", "x": _b64url(pub), "kid": TOKEN_KID, "alg": "EdDSA",
                      "use": "sig"}]}


#: The files of a key set, in the order `prism keys init` writes and reports them.
KEY_FILES = ("signing.json", "issuer.pem", "jwks.json")


class KeysExistError(PrismError):
    """`prism keys init` would replace keys that workers and producers may already use."""

    code = "keys_exist"


class NoKeysError(ConfigError):
    """A worker without the keys its topology names (and no `--dev-keys`)."""

    code = "no_keys"


def _write_private(path: Path, data: bytes) -> None:
    """Write `data` with mode 0600 from the first byte (no window in which the umask's mode
    lets another user read a private key), atomically (a reader never sees half a key)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def existing_key_files(folder: str | Path) -> list[Path]:
    """The files of a key set already present in `folder`."""
    return [Path(folder) / name for name in KEY_FILES if (Path(folder) / name).exists()]


def init_keys(folder: str | Path, *, force: bool = False) -> DevKeys:
    """Write a fresh key set into `folder` (created 0700); refuse to replace an existing file
    unless `force`: workers, producers and consumers may already sign or verify with it."""
    folder = Path(folder)
    present = existing_key_files(folder)
    if present and not force and not is_throwaway(folder):
        raise KeysExistError(f"{', '.join(p.name for p in present)} already in {folder}", path=str(folder),
                             hint="keep them (every worker of the group must use the same keys), or pass --force "
                                  "to replace them - producers and consumers then need the new keys too")
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(folder, 0o700)
    key = Ed25519PrivateKey.generate()
    _write_private(folder / "signing.json", json.dumps(dev_keyring_doc(), indent=2).encode())
    _write_private(folder / "issuer.pem", key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()))
    _write_private(folder / "jwks.json", json.dumps(_jwks_doc(key), indent=2).encode())
    (folder / THROWAWAY_MARK).unlink(missing_ok=True)  # a key set made on purpose now
    return DevKeys(folder, load_signing_keyring(folder / "signing.json"), key)


def topology_key_files(topology: object) -> dict[str, Path]:
    """The local key files a topology names, by the field that names them (URLs are not files)."""
    files: dict[str, Path] = {}
    resolve = topology.resolve  # type: ignore[attr-defined]
    stage = topology.stage  # type: ignore[attr-defined]
    auth = stage("authenticate")
    if auth is not None and auth.policy != "off" and "://" not in auth.jwks:
        files["authenticate.jwks"] = resolve(auth.jwks)
    verify = stage("verify_signature")
    if verify is not None:
        files["verify_signature.keyring"] = resolve(verify.keyring)
    outputs = topology.outputs  # type: ignore[attr-defined]
    if outputs.keyring:
        files["outputs.keyring"] = resolve(outputs.keyring)
    return files


def check_topology_keys(topology: object, topology_file: str | Path) -> dict[str, Path]:
    """Raise `NoKeysError` (with the command that makes them) when a key file the topology
    names does not exist; returns the missing ones otherwise (none)."""
    missing = {field: path for field, path in topology_key_files(topology).items() if not path.exists()}
    if missing:
        raise NoKeysError(
            "no keys: " + "; ".join(f"{field} names {display_path(path)}, which does not exist"
                                    for field, path in missing.items()),
            path=str(topology_file), hint=keys_init_hint(topology_file, missing))
    return missing


def keys_init_hint(topology_file: str | Path, missing: dict[str, Path]) -> str:
    """How to make the missing keys: `prism keys init` for the directory the topology names (so the
    next `prism run` finds them), or `--dev-keys` for a throwaway try-out."""
    dirs = sorted({str(display_path(p.parent)) for p in missing.values()})
    where = f" --dir {dirs[0]}" if len(dirs) == 1 else ""
    return (f"run `prism keys init{where}` once and give every worker of the group that same directory "
            "(a shared volume or Secret), or pass --dev-keys for a throwaway try-out")


def display_path(path: Path) -> Path:
    """`path` relative to the working directory when it is inside it (shorter, copy-pastable)."""
    path = Path(os.path.normpath(path))
    try:
        return path.resolve().relative_to(Path.cwd().resolve())
    except ValueError:
        return path

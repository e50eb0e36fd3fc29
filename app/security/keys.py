"""Key providers for payload encryption: keys are only ever referenced by key id.

An envelope never carries key material, only `EncryptionMetadata.key_id` (and
`public_key_id`). Whoever encrypts or decrypts asks a provider for the key behind an id.
Two provider shapes exist, because key services work in two ways:

* `KeyProvider` hands out key material: a 256-bit secret, a public key, a private key.
  `FileKeyring` (dev, a JSON/YAML file) implements it; a Vault KV provider would too.
* `DataKeyProvider` never lets its master key out: it generates a fresh data key per
  message and returns it with a wrapped copy (envelope encryption). `AwsKmsProvider`
  implements it with KMS `GenerateDataKey`/`Decrypt`; Vault Transit's `datakey` endpoint
  fits the same protocol. Only symmetric algorithms use data keys.

Rotation (RFC-031 rev. 2 "Key Rotation"): keys live in rotation groups, one per
(purpose, namespace); the purpose defaults to the key type. The *current* key of a group
- what `encrypt_envelope` uses when no key id is given - is the newest key whose
`not_before` has passed and that has not expired. Adding a newer key retires the older one
for encryption at the newer key's `not_before`; a retired or expired key keeps decrypting
for the keyring's `overlap` (default 7 days) and is then refused with `KeyNotUsableError`
saying when and why. See docs/encryption.md for the file format and how to add Vault.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import re
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.hazmat.primitives.asymmetric.mlkem import (
    MLKEM768PrivateKey,
    MLKEM768PublicKey,
    MLKEM1024PrivateKey,
    MLKEM1024PublicKey,
)
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey

from ..errors import KeyNotUsableError, KeyProviderError, KeyringError, UnknownKeyError
from .algorithms import (
    KEY_ML_KEM_768,
    KEY_ML_KEM_1024,
    KEY_RSA_3072,
    KEY_RSA_4096,
    KEY_SYMMETRIC_256,
    KEY_TYPES,
    KEY_X25519_ML_KEM_1024,
)

SYMMETRIC_KEY_BYTES = 32
DEFAULT_OVERLAP = timedelta(days=7)
DEFAULT_CLOCK_SKEW = timedelta(minutes=5)
_RSA_BITS = {KEY_RSA_3072: 3072, KEY_RSA_4096: 4096}


class KeyUse(StrEnum):
    """Why a key is asked for: encryption needs an active key, decryption allows the overlap."""

    ENCRYPT = "encrypt"
    DECRYPT = "decrypt"


# --------------------------------------------------------------------------- key material


@dataclass(frozen=True, slots=True)
class HybridPublicKey:
    """The recipient half of an X25519 + ML-KEM-1024 hybrid key."""

    x25519: X25519PublicKey
    ml_kem: MLKEM1024PublicKey


@dataclass(frozen=True, slots=True, repr=False)
class HybridPrivateKey:
    x25519: X25519PrivateKey
    ml_kem: MLKEM1024PrivateKey

    def public_key(self) -> HybridPublicKey:
        return HybridPublicKey(self.x25519.public_key(), self.ml_kem.public_key())

    def __repr__(self) -> str:
        return "HybridPrivateKey(<redacted>)"


PublicKey = rsa.RSAPublicKey | MLKEM768PublicKey | MLKEM1024PublicKey | HybridPublicKey
PrivateKey = rsa.RSAPrivateKey | MLKEM768PrivateKey | MLKEM1024PrivateKey | HybridPrivateKey


@dataclass(frozen=True, slots=True, repr=False)
class SymmetricKey:
    key_id: str
    secret: bytes

    def __repr__(self) -> str:
        return f"SymmetricKey({self.key_id!r}, <redacted>)"


@dataclass(frozen=True, slots=True)
class PublicKeyRef:
    """A recipient's public key. `key_id` names the key pair (what the consumer looks up to
    decrypt); `public_key_id` is the id the producer knew the public half by."""

    key_id: str
    public_key_id: str
    key_type: str
    key: PublicKey


@dataclass(frozen=True, slots=True, repr=False)
class PrivateKeyRef:
    key_id: str
    key_type: str
    key: PrivateKey

    def __repr__(self) -> str:
        return f"PrivateKeyRef({self.key_id!r}, {self.key_type!r}, <redacted>)"


@dataclass(frozen=True, slots=True, repr=False)
class DataKey:
    """A per-message data key from a `DataKeyProvider`: use `plaintext`, ship `wrapped`.

    `key_id` is the master key's canonical id as the service reports it (for KMS the key
    ARN, even when the caller named an alias), so decryption still works after the alias
    moves to a new key."""

    key_id: str
    plaintext: bytes
    wrapped: bytes

    def __repr__(self) -> str:
        return f"DataKey({self.key_id!r}, <redacted>, wrapped={len(self.wrapped)}B)"


# --------------------------------------------------------------------------- protocols


@runtime_checkable
class KeyProvider(Protocol):
    """Hands out key material by key id. Implement this to add Vault KV, a HSM, ...

    Contract (what `app.security.encryption` relies on):

    * `current_key_id(purpose, namespace)` - the key id to encrypt with now for a rotation
      group. `purpose` is a key type from `app.security.algorithms.KEY_TYPES` unless the
      deployment names its own groups. Raises `UnknownKeyError` when the group has no active key.
    * `list_key_ids(key_type=None)` - every id the provider knows, optionally of one type.
    * `get_symmetric_key(key_id, use)` - a 32-byte secret. `use` says whether rotation rules
      for encryption (active only) or decryption (overlap allowed) apply.
    * `get_public_key(key_id)` - for encryption; accepts the pair's key id or its public id.
    * `get_private_key(key_id)` - for decryption.

    Unknown ids raise `UnknownKeyError`; known keys that may not be used (expired, not yet
    valid, public-only, wrong type) raise `KeyNotUsableError`; a failing backend raises
    `KeyProviderError`. Messages name key ids, never key material.
    """

    name: str

    def current_key_id(self, purpose: str, namespace: str | None = None) -> str: ...

    def list_key_ids(self, key_type: str | None = None) -> list[str]: ...

    def get_symmetric_key(self, key_id: str, use: KeyUse) -> SymmetricKey: ...

    def get_public_key(self, key_id: str) -> PublicKeyRef: ...

    def get_private_key(self, key_id: str) -> PrivateKeyRef: ...


@runtime_checkable
class DataKeyProvider(Protocol):
    """Envelope encryption with a master key that never leaves the key service.

    `context` is authenticated, non-secret data (KMS "encryption context"); decryption must
    pass the same mapping. `wrap_name` is recorded in `algorithm_params["key_wrap"]` so a
    consumer can tell which service unwraps the data key.
    """

    name: str
    wrap_name: str

    def current_key_id(self, purpose: str, namespace: str | None = None) -> str: ...

    def list_key_ids(self, key_type: str | None = None) -> list[str]: ...

    def generate_data_key(self, key_id: str, context: Mapping[str, str]) -> DataKey: ...

    def decrypt_data_key(self, key_id: str, wrapped: bytes, context: Mapping[str, str]) -> bytes: ...


# --------------------------------------------------------------------------- file keyring


def _utcnow() -> datetime:
    return datetime.now(UTC)


def _iso(ts: datetime | None) -> str | None:
    return None if ts is None else ts.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True, slots=True, repr=False)
class KeyRecord:
    """One key of a `FileKeyring`. Material fields are set according to `key_type`."""

    key_id: str
    key_type: str
    created: datetime
    not_before: datetime
    expires: datetime | None = None
    purpose: str | None = None
    namespace: str | None = None
    public_key_id: str | None = None
    secret: bytes | None = None
    public: PublicKey | None = None
    private: PrivateKey | None = None

    @property
    def group(self) -> tuple[str, str | None]:
        return (self.purpose or self.key_type, self.namespace)

    def __repr__(self) -> str:
        kind = "private" if (self.secret or self.private) else "public"
        return f"KeyRecord({self.key_id!r}, {self.key_type!r}, {kind}, not_before={_iso(self.not_before)})"


_DURATION = re.compile(r"^\s*([0-9]{1,12})\s*([smhdw]?)\s*$")
#: The longest duration a keyring setting takes: ten years (timedelta overflows near 2.7 million).
_MAX_DURATION_S = 10 * 366 * 86400
_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_duration(value: Any) -> timedelta:
    """`7d`, `12h`, `30m`, `45s`, `2w` or a number of seconds."""
    if isinstance(value, bool):
        raise ValueError("expected a duration like '7d', '12h' or seconds")
    if isinstance(value, int | float):
        secs = float(value)
    else:
        m = _DURATION.match(str(value))
        if not m:
            raise ValueError(f"{value!r} is not a duration like '7d', '12h', '30m' or a number of seconds")
        secs = int(m.group(1)) * _UNITS[m.group(2)]
    if not 0 <= secs <= _MAX_DURATION_S:  # NaN fails both; inf and 10**15 s overflowed timedelta
        raise ValueError(f"duration must be from 0 to {_MAX_DURATION_S} seconds (ten years), got {value!r}")
    return timedelta(seconds=secs)


def _format_duration(td: timedelta) -> str:
    s = int(td.total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if s and s % size == 0:
            return f"{s // size}{unit}"
    return f"{s}s"


_COMMON = {"id", "type", "purpose", "namespace", "created", "not_before", "expires", "public_key_id"}
_MATERIAL = {
    KEY_SYMMETRIC_256: ({"secret"}, set()),
    KEY_RSA_3072: ({"private_pem"}, {"public_pem"}),
    KEY_RSA_4096: ({"private_pem"}, {"public_pem"}),
    KEY_ML_KEM_768: ({"private_seed"}, {"public"}),
    KEY_ML_KEM_1024: ({"private_seed"}, {"public"}),
    KEY_X25519_ML_KEM_1024: ({"x25519_private", "ml_kem_private_seed"}, {"x25519_public", "ml_kem_public"}),
}


class _Problems:
    """Collects every problem of a keyring file so one error lists them all."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.items: list[str] = []

    def add(self, where: str, what: str) -> None:
        self.items.append(f"{where}: {what}")

    def raise_if_any(self) -> None:
        if self.items:
            raise KeyringError(
                f"keyring {self.source} has {len(self.items)} problem(s): " + "; ".join(self.items),
                path=self.source,
                hint="fix the listed keys (docs/encryption.md describes the format), or regenerate a dev "
                     "keyring with `python -m app.security.keys generate PATH`",
            )


def _b64(value: Any) -> bytes:
    if not isinstance(value, str):
        raise ValueError("must be a base64 string")
    try:
        return base64.b64decode(value.strip(), validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("is not valid base64") from None


def _time(value: Any) -> datetime:
    if isinstance(value, datetime):
        ts = value
    elif isinstance(value, str):
        try:
            ts = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
        except ValueError:
            raise ValueError(f"{value!r} is not an ISO-8601 timestamp like 2026-01-31T00:00:00Z") from None
    else:
        raise ValueError("must be an ISO-8601 timestamp string like 2026-01-31T00:00:00Z")
    if ts.tzinfo is None:
        raise ValueError(f"{value!s} has no time zone; add 'Z' for UTC")
    return ts.astimezone(UTC)


def _load_material(key_type: str, raw: Mapping[str, Any], where: str, probs: _Problems) -> dict[str, Any]:
    out: dict[str, Any] = {}

    def get(name: str, parse: Callable[[Any], Any]) -> Any:
        if name not in raw:
            return None
        try:
            return parse(raw[name])
        except Exception as exc:  # each parser raises ValueError/TypeError/UnsupportedAlgorithm
            probs.add(f"{where} field {name!r}", str(exc) if isinstance(exc, ValueError) else "cannot be parsed")
            return None

    def sized(n: int, what: str) -> Callable[[Any], bytes]:
        def parse(v: Any) -> bytes:
            b = _b64(v)
            if len(b) != n:
                extra = " (AES-128 is deprecated; generate 32 random bytes)" if what == "secret" and len(b) == 16 else ""
                raise ValueError(f"is {len(b)} bytes, {what} needs {n}{extra}")
            return b

        return parse

    private_fields, public_fields = _MATERIAL[key_type]
    if not any(f in raw for f in private_fields | public_fields):
        probs.add(where, f"no key material: a {key_type} key needs {' + '.join(sorted(private_fields))}"
                         + (f" or {' + '.join(sorted(public_fields))}" if public_fields else ""))
        return out
    if key_type == KEY_SYMMETRIC_256:
        out["secret"] = get("secret", sized(SYMMETRIC_KEY_BYTES, "secret"))
    elif key_type in _RSA_BITS:
        bits = _RSA_BITS[key_type]

        def rsa_check(k: Any) -> Any:
            if not isinstance(k, rsa.RSAPrivateKey | rsa.RSAPublicKey):
                raise ValueError("is not an RSA key")
            if k.key_size != bits:
                old = " (RSA below 3072 bits is deprecated)" if k.key_size < 3072 else ""
                raise ValueError(f"is a {k.key_size}-bit RSA key but the type says {key_type}{old}")
            return k

        priv = get("private_pem", lambda v: rsa_check(serialization.load_pem_private_key(str(v).encode(), None)))
        pub = get("public_pem", lambda v: rsa_check(serialization.load_pem_public_key(str(v).encode())))
        if priv is not None and pub is not None and priv.public_key().public_numbers() != pub.public_numbers():
            probs.add(where, "public_pem is not the public half of private_pem")
        out["private"], out["public"] = priv, pub if pub is not None else (priv.public_key() if priv else None)
    elif key_type in (KEY_ML_KEM_768, KEY_ML_KEM_1024):
        priv_cls, pub_cls = ((MLKEM768PrivateKey, MLKEM768PublicKey) if key_type == KEY_ML_KEM_768
                             else (MLKEM1024PrivateKey, MLKEM1024PublicKey))
        priv = get("private_seed", lambda v: priv_cls.from_seed_bytes(sized(64, "an ML-KEM seed")(v)))
        pub = get("public", lambda v: pub_cls.from_public_bytes(_b64(v)))
        if priv is not None and pub is not None and priv.public_key() != pub:
            probs.add(where, "public is not the public half of private_seed")
        out["private"], out["public"] = priv, pub if pub is not None else (priv.public_key() if priv else None)
    else:  # hybrid
        xpriv = get("x25519_private", lambda v: X25519PrivateKey.from_private_bytes(sized(32, "an X25519 key")(v)))
        mpriv = get("ml_kem_private_seed", lambda v: MLKEM1024PrivateKey.from_seed_bytes(sized(64, "an ML-KEM seed")(v)))
        xpub = get("x25519_public", lambda v: X25519PublicKey.from_public_bytes(sized(32, "an X25519 key")(v)))
        mpub = get("ml_kem_public", lambda v: MLKEM1024PublicKey.from_public_bytes(_b64(v)))
        if ("x25519_private" in raw) != ("ml_kem_private_seed" in raw):
            probs.add(where, "a hybrid private key needs both x25519_private and ml_kem_private_seed")
        if ("x25519_public" in raw) != ("ml_kem_public" in raw):
            probs.add(where, "a hybrid public key needs both x25519_public and ml_kem_public")
        priv = HybridPrivateKey(xpriv, mpriv) if xpriv is not None and mpriv is not None else None
        pub = HybridPublicKey(xpub, mpub) if xpub is not None and mpub is not None else None
        if priv is not None and pub is not None:
            derived = priv.public_key()
            if derived.x25519.public_bytes_raw() != pub.x25519.public_bytes_raw() or derived.ml_kem != pub.ml_kem:
                probs.add(where, "the public halves do not match the private halves")
        out["private"], out["public"] = priv, pub if pub is not None else (priv.public_key() if priv else None)
    return out


def _parse_record(raw: Any, index: int, probs: _Problems) -> KeyRecord | None:
    where = f"keys[{index}]"
    if not isinstance(raw, Mapping):
        probs.add(where, "must be a mapping with id, type, created and key material")
        return None
    key_id = raw.get("id")
    if not isinstance(key_id, str) or not key_id.strip():
        probs.add(where, "missing 'id' (a non-empty string)")
        return None
    where = f"keys[{index}] (id {key_id!r})"
    key_type = raw.get("type")
    if key_type not in KEY_TYPES:
        probs.add(where, f"type {key_type!r} is not one of {list(KEY_TYPES)}")
        return None
    allowed = _COMMON | _MATERIAL[key_type][0] | _MATERIAL[key_type][1]
    for unknown in sorted(set(raw) - allowed):
        probs.add(where, f"unknown field {unknown!r} for a {key_type} key (allowed: {sorted(allowed)})")
    times: dict[str, datetime | None] = {}
    for name in ("created", "not_before", "expires"):
        if raw.get(name) is None:
            times[name] = None
            continue
        try:
            times[name] = _time(raw[name])
        except ValueError as exc:
            probs.add(f"{where} field {name!r}", str(exc))
            return None
    if times["created"] is None:
        probs.add(where, "missing 'created' (ISO-8601 timestamp; rotation orders keys by it)")
        return None
    not_before = times["not_before"] or times["created"]
    if times["expires"] is not None and times["expires"] <= not_before:
        probs.add(where, f"expires ({_iso(times['expires'])}) is not after not_before ({_iso(not_before)})")
    for name in ("purpose", "namespace", "public_key_id"):
        if name in raw and raw[name] is not None and (not isinstance(raw[name], str) or not raw[name]):
            probs.add(f"{where} field {name!r}", "must be a non-empty string")
    material = _load_material(key_type, raw, where, probs)
    return KeyRecord(
        key_id=key_id,
        key_type=key_type,
        created=times["created"],
        not_before=not_before,
        expires=times["expires"],
        purpose=raw.get("purpose"),
        namespace=raw.get("namespace"),
        public_key_id=raw.get("public_key_id"),
        **material,
    )


class FileKeyring:
    """A development keyring kept in a JSON or YAML file (see the module docstring).

    Not for production: the file holds raw key material. Production uses a key service
    (`AwsKmsProvider`, or a Vault provider written against `KeyProvider`).
    """

    name = "file"

    def __init__(
        self,
        records: Iterable[KeyRecord],
        *,
        overlap: timedelta = DEFAULT_OVERLAP,
        clock: Callable[[], datetime] = _utcnow,
        clock_skew: timedelta = DEFAULT_CLOCK_SKEW,
        source: str = "<memory>",
    ) -> None:
        self.records: dict[str, KeyRecord] = {}
        self._by_public: dict[str, str] = {}
        self.overlap = overlap
        self.clock = clock
        self.clock_skew = clock_skew
        self.source = source
        probs = _Problems(source)
        for r in records:
            if r.key_id in self.records or r.key_id in self._by_public:
                probs.add(f"key {r.key_id!r}", "duplicate key id")
                continue
            self.records[r.key_id] = r
            if r.public_key_id and r.public_key_id != r.key_id:
                if r.public_key_id in self.records or r.public_key_id in self._by_public:
                    probs.add(f"key {r.key_id!r}", f"public_key_id {r.public_key_id!r} is already used")
                self._by_public[r.public_key_id] = r.key_id
        probs.raise_if_any()

    # -- loading / saving -----------------------------------------------------------------------
    @classmethod
    def load(cls, path: str | os.PathLike[str], *, clock: Callable[[], datetime] = _utcnow) -> FileKeyring:
        """Load and validate a keyring file; `KeyringError` lists every problem at once."""
        from ..config_files import read_config

        p = Path(path)
        data = read_config(p, what="keyring file", error=KeyringError,
                           missing_hint="check the path, or create one with `python -m app.security.keys generate PATH`")
        return cls.from_mapping(data, source=str(p), clock=clock)

    @classmethod
    def from_mapping(cls, data: Any, *, source: str = "<memory>",
                     clock: Callable[[], datetime] = _utcnow) -> FileKeyring:
        probs = _Problems(source)
        if not isinstance(data, Mapping):
            probs.add("top level", "must be a mapping with 'version' and 'keys'")
            probs.raise_if_any()
        if data.get("version", 1) != 1:
            probs.add("version", f"{data.get('version')!r} is not supported (expected 1)")
        for unknown in sorted(set(data) - {"version", "overlap", "keys"}):
            probs.add("top level", f"unknown field {unknown!r} (allowed: version, overlap, keys)")
        overlap = DEFAULT_OVERLAP
        if "overlap" in data:
            try:
                overlap = parse_duration(data["overlap"])
            except ValueError as exc:
                probs.add("overlap", str(exc))
        keys = data.get("keys")
        if not isinstance(keys, list) or not keys:
            probs.add("keys", "must be a non-empty list of keys")
            keys = []
        records: list[KeyRecord] = []
        seen: set[str] = set()
        for i, raw in enumerate(keys):
            r = _parse_record(raw, i, probs)
            if r is None:
                continue
            for name in {r.key_id, r.public_key_id} - {None}:
                if name in seen:
                    probs.add(f"keys[{i}] (id {r.key_id!r})", f"duplicate key id {name!r}")
                seen.add(name)  # type: ignore[arg-type]
            records.append(r)
        probs.raise_if_any()
        return cls(records, overlap=overlap, clock=clock, source=source)

    def to_mapping(self) -> dict[str, Any]:
        """The file form of this keyring (includes private material: keep it secret)."""
        keys = []
        for r in self.records.values():
            d: dict[str, Any] = {"id": r.key_id, "type": r.key_type, "created": _iso(r.created),
                                 "not_before": _iso(r.not_before)}
            if r.expires is not None:
                d["expires"] = _iso(r.expires)
            for name in ("purpose", "namespace", "public_key_id"):
                if getattr(r, name):
                    d[name] = getattr(r, name)
            d.update(_dump_material(r))
            keys.append(d)
        return {"version": 1, "overlap": _format_duration(self.overlap), "keys": keys}

    def save(self, path: str | os.PathLike[str], *, overwrite: bool = False) -> Path:
        """Write the keyring (JSON for `.json`, YAML otherwise) readable by its owner only."""
        p = Path(path)
        data = self.to_mapping()
        text = json.dumps(data, indent=2) + "\n" if p.suffix.lower() == ".json" else yaml.safe_dump(data, sort_keys=False)
        flags = os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if overwrite else os.O_EXCL)
        try:
            fd = os.open(p, flags, 0o600)
        except FileExistsError:
            raise KeyringError(f"keyring file {p} already exists", path=str(p),
                               hint="pass overwrite=True (or --force) to replace it") from None
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        return p

    # -- rotation ---------------------------------------------------------------------------------
    def _record(self, key_id: str) -> KeyRecord:
        r = self.records.get(key_id) or self.records.get(self._by_public.get(key_id, ""))
        if r is None:
            raise UnknownKeyError(f"key {key_id!r} is not in keyring {self.source}", path="security.encryption.key_id",
                                  hint="add the key to the keyring, or check the producer's key id")
        return r

    def retired_at(self, r: KeyRecord) -> datetime | None:
        """When `r` stops encrypting: its expiry, or the moment a newer key of its rotation
        group takes over, whichever comes first (None: not retired)."""
        ends = [r.expires] if r.expires is not None else []
        for other in self.records.values():
            if other.group == r.group and (other.not_before, other.created) > (r.not_before, r.created):
                ends.append(other.not_before)
        return min(ends) if ends else None

    def _check_use(self, r: KeyRecord, use: KeyUse) -> None:
        now = self.clock()
        if use is KeyUse.ENCRYPT:
            if now < r.not_before:
                raise KeyNotUsableError(f"key {r.key_id!r} is not valid before {_iso(r.not_before)}",
                                        path="security.encryption.key_id",
                                        hint="encrypt with the current key (omit key_id) or wait for not_before")
            end = self.retired_at(r)
            if end is not None and now >= end:
                why = "expired" if r.expires is not None and end == r.expires else "was superseded by a newer key"
                raise KeyNotUsableError(f"key {r.key_id!r} {why} at {_iso(end)} and no longer encrypts",
                                        path="security.encryption.key_id",
                                        hint="encrypt with the current key of its rotation group (omit key_id)")
            return
        if now < r.not_before - self.clock_skew:
            raise KeyNotUsableError(f"key {r.key_id!r} is not valid before {_iso(r.not_before)}",
                                    path="security.encryption.key_id",
                                    hint="the producer's clock is ahead, or the key was used before its not_before")
        end = self.retired_at(r)
        if end is not None and now >= end + self.overlap:
            raise KeyNotUsableError(
                f"key {r.key_id!r} retired at {_iso(end)} and its {_format_duration(self.overlap)} decrypt overlap "
                f"ended at {_iso(end + self.overlap)}",
                path="security.encryption.key_id",
                hint="messages under a retired key must be re-encrypted within the overlap; to read old data, "
                     "restore the key with a later expires or raise the keyring's overlap",
            )

    # -- KeyProvider ------------------------------------------------------------------------------
    def current_key_id(self, purpose: str, namespace: str | None = None) -> str:
        """Newest active key of the (purpose, namespace) group; keys without a namespace
        serve namespaces that have no keys of their own."""
        now = self.clock()
        for ns in ([namespace, None] if namespace else [None]):
            group = [r for r in self.records.values() if r.group == (purpose, ns)]
            if not group:
                continue
            active = []
            for r in group:
                try:
                    self._check_use(r, KeyUse.ENCRYPT)
                except KeyNotUsableError:
                    continue
                if r.public is not None or r.secret is not None:
                    active.append(r)
            if active:
                return max(active, key=lambda r: (r.not_before, r.created)).key_id
            states = ", ".join(f"{r.key_id} (not_before {_iso(r.not_before)}, retired {_iso(self.retired_at(r))})"
                               for r in group)
            raise UnknownKeyError(f"no active {purpose} key for namespace {ns or '*'} at {_iso(now)} in {self.source}: "
                                  f"{states}", path="security.encryption.key_id",
                                  hint="add a new key (rotation) or extend the current key's expires")
        raise UnknownKeyError(f"keyring {self.source} has no {purpose} key for namespace {namespace or '*'}",
                              path="security.encryption.key_id",
                              hint="add one, e.g. with `python -m app.security.keys generate PATH`")

    def list_key_ids(self, key_type: str | None = None) -> list[str]:
        return sorted(k for k, r in self.records.items() if key_type is None or r.key_type == key_type)

    def get_symmetric_key(self, key_id: str, use: KeyUse) -> SymmetricKey:
        r = self._record(key_id)
        if r.key_type != KEY_SYMMETRIC_256 or r.secret is None:
            raise KeyNotUsableError(f"key {key_id!r} is a {r.key_type} key, not a symmetric one",
                                    path="security.encryption.key_id", hint="use a symmetric-256 key id")
        self._check_use(r, use)
        return SymmetricKey(r.key_id, r.secret)

    def get_public_key(self, key_id: str) -> PublicKeyRef:
        r = self._record(key_id)
        if r.public is None:
            raise KeyNotUsableError(f"key {key_id!r} is a {r.key_type} key without a public key",
                                    path="security.encryption.public_key_id",
                                    hint="asymmetric, post-quantum and hybrid encryption need a public key")
        self._check_use(r, KeyUse.ENCRYPT)
        return PublicKeyRef(r.key_id, r.public_key_id or r.key_id, r.key_type, r.public)

    def get_private_key(self, key_id: str) -> PrivateKeyRef:
        r = self._record(key_id)
        if r.private is None:
            raise KeyNotUsableError(f"key {key_id!r} has no private key in keyring {self.source}",
                                    path="security.encryption.key_id",
                                    hint="only the consumer's keyring holds the private key; decrypt there")
        self._check_use(r, KeyUse.DECRYPT)
        return PrivateKeyRef(r.key_id, r.key_type, r.private)

    def public_only(self) -> FileKeyring:
        """The same keyring without private material: what a producer of asymmetric, PQ and
        hybrid messages needs (it must not be able to decrypt what it sends)."""
        recs = []
        for r in self.records.values():
            if r.key_type == KEY_SYMMETRIC_256:
                continue
            recs.append(KeyRecord(r.key_id, r.key_type, r.created, r.not_before, r.expires, r.purpose, r.namespace,
                                  r.public_key_id, public=r.public))
        return FileKeyring(recs, overlap=self.overlap, clock=self.clock, clock_skew=self.clock_skew,
                           source=f"{self.source} (public only)")

    def __repr__(self) -> str:
        return f"FileKeyring({self.source!r}, {len(self.records)} keys)"


def _b64e(b: bytes) -> str:
    return base64.b64encode(b).decode()


def _dump_material(r: KeyRecord) -> dict[str, str]:
    raw = serialization.Encoding.Raw
    if r.key_type == KEY_SYMMETRIC_256:
        return {"secret": _b64e(r.secret)} if r.secret is not None else {}
    out: dict[str, str] = {}
    if r.key_type in _RSA_BITS:
        if r.private is not None:
            out["private_pem"] = r.private.private_bytes(  # type: ignore[union-attr]
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()).decode()
        if r.public is not None:
            out["public_pem"] = r.public.public_bytes(  # type: ignore[union-attr]
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode()
    elif r.key_type in (KEY_ML_KEM_768, KEY_ML_KEM_1024):
        if r.private is not None:
            out["private_seed"] = _b64e(r.private.private_bytes_raw())  # type: ignore[union-attr]
        if r.public is not None:
            out["public"] = _b64e(r.public.public_bytes_raw())  # type: ignore[union-attr]
    else:
        if isinstance(r.private, HybridPrivateKey):
            out["x25519_private"] = _b64e(r.private.x25519.private_bytes_raw())
            out["ml_kem_private_seed"] = _b64e(r.private.ml_kem.private_bytes_raw())
        if isinstance(r.public, HybridPublicKey):
            out["x25519_public"] = _b64e(r.public.x25519.public_bytes(raw, serialization.PublicFormat.Raw))
            out["ml_kem_public"] = _b64e(r.public.ml_kem.public_bytes_raw())
    return out


def new_key_record(
    key_id: str,
    key_type: str,
    *,
    created: datetime | None = None,
    not_before: datetime | None = None,
    expires: datetime | None = None,
    purpose: str | None = None,
    namespace: str | None = None,
    public_key_id: str | None = None,
) -> KeyRecord:
    """A freshly generated key of `key_type` (random material from the OS CSPRNG)."""
    created = created or _utcnow()
    material: dict[str, Any] = {}
    if key_type == KEY_SYMMETRIC_256:
        material["secret"] = os.urandom(SYMMETRIC_KEY_BYTES)
    elif key_type in _RSA_BITS:
        priv = rsa.generate_private_key(public_exponent=65537, key_size=_RSA_BITS[key_type])
        material = {"private": priv, "public": priv.public_key()}
    elif key_type == KEY_ML_KEM_768:
        p768 = MLKEM768PrivateKey.generate()
        material = {"private": p768, "public": p768.public_key()}
    elif key_type == KEY_ML_KEM_1024:
        p1024 = MLKEM1024PrivateKey.generate()
        material = {"private": p1024, "public": p1024.public_key()}
    elif key_type == KEY_X25519_ML_KEM_1024:
        hyb = HybridPrivateKey(X25519PrivateKey.generate(), MLKEM1024PrivateKey.generate())
        material = {"private": hyb, "public": hyb.public_key()}
    else:
        raise KeyringError(f"cannot generate a key of type {key_type!r}", hint=f"use one of {list(KEY_TYPES)}")
    return KeyRecord(key_id, key_type, created, not_before or created, expires, purpose, namespace,
                     public_key_id, **material)


def generate(
    path: str | os.PathLike[str] | None = None,
    *,
    namespace: str | None = None,
    key_types: Iterable[str] = KEY_TYPES,
    valid_for: timedelta | None = None,
    overlap: timedelta = DEFAULT_OVERLAP,
    now: datetime | None = None,
    overwrite: bool = False,
) -> FileKeyring:
    """Create a dev keyring with one fresh key of every type (ids `dev-<type>-<date>`),
    and write it to `path` (mode 0600) when given. `valid_for` sets each key's expiry."""
    now = (now or _utcnow()).replace(microsecond=0)
    stamp = now.strftime("%Y%m%d")
    prefix = f"{namespace}-" if namespace else "dev-"
    records = [
        new_key_record(f"{prefix}{t}-{stamp}", t, created=now, expires=now + valid_for if valid_for else None,
                       namespace=namespace,
                       public_key_id=None if t == KEY_SYMMETRIC_256 else f"{prefix}{t}-{stamp}.pub")
        for t in key_types
    ]
    ring = FileKeyring(records, overlap=overlap, source=str(path) if path else "<generated>")
    if path is not None:
        ring.save(path, overwrite=overwrite)
    return ring


# --------------------------------------------------------------------------- Kubernetes-mounted secrets

#: Shortest pause between two re-reads forced by an unknown key id: a producer that names a key
#: nobody has must not turn every message into a directory scan.
FORCED_RELOAD_MIN_S = 1.0


def _is_private(r: KeyRecord) -> bool:
    return r.private is not None


class MountedSecretsKeyProvider:
    """Keys from a Kubernetes Secret mounted as a directory (`KeyProvider`, name `k8s-secrets`).

    Kubernetes writes one file per Secret key into the mount and, on an update, writes the new
    files into a fresh hidden directory and atomically swaps the `..data` symlink the visible
    files point through. Each visible file holds either one key in the `FileKeyring` record
    format (a mapping with `id`, `type`, `created`, material ...) or a whole keyring document
    (`{version, overlap, keys: [...]}`); JSON when the name ends in `.json`, YAML otherwise.
    Hidden entries (`..data`, `..2026_...`) are skipped, so nothing is read twice.

    Rotation without a restart: every call checks, at most once per `refresh_s`, whether the
    mount changed (the `..data` link target, or for a plain directory each file's name, size,
    mtime and inode) and then re-reads it; an unknown key id forces that check at once (at most
    once per second), so a consumer sees a producer's new key as soon as it is mounted. No
    thread and no inotify: a polling check costs one `readlink`. A re-read that does not
    validate keeps the last good keys and logs an ERROR naming every problem, so a half-edited
    Secret never takes working keys away.

    `public_only=True` (the worker's mode) refuses private halves of asymmetric, post-quantum
    and hybrid keys: those patterns hide the payload from whoever does not hold the private
    key, and a worker that could decrypt would defeat them. At construction that is a
    `KeyringError` listing every such key; on a later re-read the new keys are not taken.
    """

    name = "k8s-secrets"

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        refresh_s: float = 30.0,
        public_only: bool = False,
        overlap: timedelta | None = None,
        clock: Callable[[], datetime] = _utcnow,
        monotonic: Callable[[], float] | None = None,
    ) -> None:
        import threading
        import time

        self.path = Path(path)
        self.refresh_s = float(refresh_s)
        self.public_only = public_only
        self.overlap = overlap
        self.clock = clock
        self._monotonic = monotonic or time.monotonic
        self._lock = threading.Lock()
        #: times the mounted keys were re-read and taken (0 after construction)
        self.reloads = 0
        #: why the last re-read was not taken (None when it was, or none failed)
        self.last_error: str | None = None
        self._fingerprint = self._scan()
        self._ring = self._load()
        self._checked = self._forced = self._monotonic()

    # -- reading the mount ------------------------------------------------------------------------
    def _files(self) -> list[Path]:
        try:
            entries = sorted(self.path.iterdir())
        except OSError as exc:
            raise KeyringError(f"cannot read the mounted secret directory {self.path}: {exc.strerror}",
                               path=str(self.path),
                               hint="mount the Secret there (volumeMounts[].mountPath), or fix the path") from None
        return [p for p in entries if not p.name.startswith(".") and p.is_file()]

    def _scan(self) -> tuple[Any, ...]:
        """What changes when the mount changes: kubelet's `..data` target, else every file's stat."""
        data = self.path / "..data"
        try:
            if data.is_symlink():
                return ("..data", os.readlink(data))
            out = []
            for p in self._files():
                st = p.stat()
                out.append((p.name, st.st_size, st.st_mtime_ns, st.st_ino))
            return tuple(out)
        except (OSError, KeyringError):
            return ("unreadable",)

    def _load(self) -> FileKeyring:
        from ..config_files import read_config

        probs = _Problems(f"mounted secret {self.path}")
        files = self._files()
        if not files:
            probs.add(str(self.path), "holds no key files")
        records: list[KeyRecord] = []
        overlap = self.overlap
        for f in files:
            fp = _Problems(f.name)
            try:
                data = read_config(f, what="key file", error=KeyringError)
            except KeyringError as exc:
                probs.add(f.name, f"cannot be read as a key ({exc.message}); each file holds one key "
                                  "record or a keyring document")
                continue
            if isinstance(data, Mapping) and "keys" in data:
                raws = data.get("keys")
                if not isinstance(raws, list):
                    fp.add("keys", "must be a list of keys")
                    raws = []
                if "overlap" in data and overlap is None:
                    try:
                        overlap = parse_duration(data["overlap"])
                    except ValueError as exc:
                        fp.add("overlap", str(exc))
            elif isinstance(data, Mapping):
                raws = [data]
            else:
                probs.add(f.name, "is not a key record (a mapping with id, type, created and material) nor a "
                                  "keyring document (keys: [...])")
                continue
            for i, raw in enumerate(raws):
                r = _parse_record(raw, i, fp)
                if r is None:
                    continue
                if self.public_only and r.key_type != KEY_SYMMETRIC_256 and _is_private(r):
                    fp.add(f"keys[{i}] (id {r.key_id!r})",
                           f"holds the private half of a {r.key_type} key, and this provider is public-only: the "
                           "worker must never be able to decrypt what only consumers may read - mount the public "
                           "half only (public_pem / public / x25519_public + ml_kem_public)")
                    continue
                records.append(r)
            probs.items += [f"{f.name}: {item}" for item in fp.items]
        probs.raise_if_any()
        return FileKeyring(records, overlap=overlap or DEFAULT_OVERLAP, clock=self.clock,
                           source=f"mounted secret {self.path}")

    def refresh(self, *, force: bool = False) -> bool:
        """Re-read the mount if it changed (at most once per `refresh_s` unless `force`).
        True when new keys were taken."""
        now = self._monotonic()
        with self._lock:
            if not force and now - self._checked < self.refresh_s:
                return False
            self._checked = now
            scan = self._scan()
            if scan == self._fingerprint:
                return False
            try:
                ring = self._load()
            except KeyringError as exc:
                if exc.message != self.last_error:  # once per distinct problem, not once per poll
                    _log().error("the mounted keys in %s changed but do not load; keeping the previous keys: %s",
                                 self.path, exc.message)
                self.last_error = exc.message
                return False
            self._ring, self._fingerprint, self.last_error = ring, scan, None
            self.reloads += 1
            _log().info("re-read the mounted keys in %s: %d key(s)", self.path, len(ring.records))
            return True

    def _retry_unknown(self) -> bool:
        now = self._monotonic()
        if now - self._forced < FORCED_RELOAD_MIN_S:
            return False
        self._forced = now
        return self.refresh(force=True)

    def _call(self, fn: Callable[[FileKeyring], Any]) -> Any:
        self.refresh()
        try:
            return fn(self._ring)
        except UnknownKeyError:
            if not self._retry_unknown():
                raise
            return fn(self._ring)

    # -- KeyProvider --------------------------------------------------------------------------------
    @property
    def keyring(self) -> FileKeyring:
        """The keys as last read (for inspection and tests)."""
        return self._ring

    def current_key_id(self, purpose: str, namespace: str | None = None) -> str:
        return str(self._call(lambda ring: ring.current_key_id(purpose, namespace)))

    def list_key_ids(self, key_type: str | None = None) -> list[str]:
        self.refresh()
        return self._ring.list_key_ids(key_type)

    def get_symmetric_key(self, key_id: str, use: KeyUse) -> SymmetricKey:
        key: SymmetricKey = self._call(lambda ring: ring.get_symmetric_key(key_id, use))
        return key

    def get_public_key(self, key_id: str) -> PublicKeyRef:
        key: PublicKeyRef = self._call(lambda ring: ring.get_public_key(key_id))
        return key

    def get_private_key(self, key_id: str) -> PrivateKeyRef:
        key: PrivateKeyRef = self._call(lambda ring: ring.get_private_key(key_id))
        return key

    def private_key_ids(self) -> list[str]:
        """Ids of keys whose private half (or symmetric secret) this provider holds."""
        return sorted(k for k, r in self._ring.records.items() if r.private is not None or r.secret is not None)

    def __repr__(self) -> str:
        return (f"MountedSecretsKeyProvider({str(self.path)!r}, {len(self._ring.records)} keys, "
                f"public_only={self.public_only})")


def _log() -> Any:
    import logging

    return logging.getLogger("prism.security.keys")


def write_secret_mount(root: str | os.PathLike[str], files: Mapping[str, str], *, version: str) -> Path:
    """Lay `files` out in `root` the way kubelet mounts a Secret, or swap them in atomically
    the way it updates one: the files go to `..<version>/`, a temporary link to it replaces
    `..data` with one `rename`, and each visible name is a link through `..data`. Used by the
    tests and handy for rehearsing a rotation on a workstation."""
    base = Path(root)
    base.mkdir(parents=True, exist_ok=True)
    target = base / f"..{version}"
    target.mkdir()
    for name, text in files.items():
        fd = os.open(target / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
    tmp = base / "..data_tmp"
    if tmp.is_symlink():
        tmp.unlink()
    os.symlink(target.name, tmp)
    old = os.readlink(base / "..data") if (base / "..data").is_symlink() else None
    os.replace(tmp, base / "..data")
    for entry in list(base.iterdir()):
        if not entry.name.startswith(".") and entry.is_symlink() and entry.name not in files:
            entry.unlink()
    for name in files:
        link = base / name
        if not link.is_symlink():
            os.symlink(f"..data/{name}", link)
    if old and old != target.name:
        import shutil

        shutil.rmtree(base / old, ignore_errors=True)
    return base


def private_key_ids(provider: Any) -> list[str]:
    """Ids of the asymmetric, post-quantum and hybrid keys whose private half `provider`
    holds: what a worker must never have (`app.security.worker_encryption`)."""
    ring = provider.keyring if isinstance(provider, MountedSecretsKeyProvider) else provider
    if not isinstance(ring, FileKeyring):
        return []
    return sorted(k for k, r in ring.records.items() if r.key_type != KEY_SYMMETRIC_256 and r.private is not None)


# --------------------------------------------------------------------------- AWS KMS


class AwsKmsProvider:
    """Symmetric envelope encryption with AWS KMS data keys (`DataKeyProvider`).

    Per message, `GenerateDataKey` (AES_256) returns a fresh data key and its copy wrapped
    under the KMS key; the payload is encrypted with the data key, the wrapped copy goes to
    `EncryptionMetadata.encapsulated_key` and the KMS key ARN to `key_id`. Decrypting calls
    KMS `Decrypt` with the same encryption context, which KMS authenticates (and CloudTrail
    logs): the namespace, topic and message id of the envelope plus `encryption_context`
    given here (e.g. `{"environment": "production"}`).

    The KMS master key never leaves KMS, so this provider serves no key material
    (`KeyProvider`) and no asymmetric algorithms.
    """

    name = "aws-kms"
    wrap_name = "aws-kms"

    def __init__(
        self,
        *,
        default_key_id: str | None = None,
        namespace_keys: Mapping[str, str] | None = None,
        encryption_context: Mapping[str, str] | None = None,
        client: Any = None,
        region_name: str | None = None,
        endpoint_url: str | None = None,
        **client_kwargs: Any,
    ) -> None:
        if client is None:
            import boto3

            client = boto3.client("kms", region_name=region_name, endpoint_url=endpoint_url, **client_kwargs)
        self.client = client
        self.default_key_id = default_key_id
        self.namespace_keys = dict(namespace_keys or {})
        self.encryption_context = dict(encryption_context or {})

    def current_key_id(self, purpose: str, namespace: str | None = None) -> str:
        if purpose != KEY_SYMMETRIC_256:
            raise KeyNotUsableError(f"the AWS KMS provider serves symmetric data keys only, not {purpose!r}",
                                    path="security.encryption.algorithm",
                                    hint="use aes-256-gcm or chacha20-poly1305 with KMS, or a KeyProvider for others")
        key = (self.namespace_keys.get(namespace) if namespace else None) or self.default_key_id
        if not key:
            raise UnknownKeyError(f"no KMS key configured for namespace {namespace or '*'}",
                                  path="security.encryption.key_id",
                                  hint="set default_key_id or namespace_keys (a key ARN, key id or alias/...)")
        return key

    def list_key_ids(self, key_type: str | None = None) -> list[str]:
        if key_type not in (None, KEY_SYMMETRIC_256):
            return []
        ids = set(self.namespace_keys.values())
        if self.default_key_id:
            ids.add(self.default_key_id)
        return sorted(ids)

    def _context(self, context: Mapping[str, str]) -> dict[str, str]:
        return {**self.encryption_context, **context}

    def generate_data_key(self, key_id: str, context: Mapping[str, str]) -> DataKey:
        try:
            resp = self.client.generate_data_key(KeyId=key_id, KeySpec="AES_256", EncryptionContext=self._context(context))
        except Exception as exc:
            raise _kms_error(exc, "GenerateDataKey", key_id) from None
        return DataKey(resp["KeyId"], resp["Plaintext"], resp["CiphertextBlob"])

    def decrypt_data_key(self, key_id: str, wrapped: bytes, context: Mapping[str, str]) -> bytes:
        try:
            resp = self.client.decrypt(CiphertextBlob=wrapped, KeyId=key_id, EncryptionContext=self._context(context))
        except Exception as exc:
            raise _kms_error(exc, "Decrypt", key_id) from None
        plaintext: bytes = resp["Plaintext"]
        return plaintext

    def __repr__(self) -> str:
        return f"AwsKmsProvider(default_key_id={self.default_key_id!r}, namespaces={sorted(self.namespace_keys)})"


def _kms_error(exc: Exception, op: str, key_id: str) -> Exception:
    """Map botocore errors onto Prism's hierarchy; the AWS message may name ARNs, never key material."""
    from botocore.exceptions import BotoCoreError, ClientError

    from ..errors import DecryptionError

    if isinstance(exc, ClientError):
        code = exc.response.get("Error", {}).get("Code", "Unknown")
        where = "security.encryption.key_id"
        if code in ("InvalidCiphertextException", "IncorrectKeyException"):
            return DecryptionError(f"KMS {op} refused the wrapped data key for {key_id!r} ({code})",
                                   path="security.encryption.encapsulated_key",
                                   hint="the wrapped key, key id or encryption context (namespace/topic/message id) "
                                        "changed after encryption")
        if code == "NotFoundException":
            return UnknownKeyError(f"KMS key {key_id!r} does not exist ({op})", path=where,
                                   hint="check the key ARN/alias and the region")
        if code in ("DisabledException", "KMSInvalidStateException", "KeyUnavailableException"):
            return KeyNotUsableError(f"KMS key {key_id!r} cannot be used now ({code})", path=where,
                                     hint="enable the key or cancel its pending deletion")
        err = KeyProviderError(f"KMS {op} failed for {key_id!r}: {code}", path=where,
                               hint="check IAM permissions (kms:GenerateDataKey/kms:Decrypt) and KMS availability")
        if code in ("AccessDeniedException", "ValidationException", "InvalidKeyUsageException"):
            err.transient = False
        return err
    if isinstance(exc, BotoCoreError):
        return KeyProviderError(f"KMS {op} for {key_id!r} could not be sent: {type(exc).__name__}",
                                hint="check the endpoint, region, credentials and network")
    return KeyProviderError(f"KMS {op} for {key_id!r} failed unexpectedly: {type(exc).__name__}")


# --------------------------------------------------------------------------- CLI


def main(argv: list[str] | None = None) -> int:
    """`python -m app.security.keys generate PATH [--namespace NS] [--valid-for 90d] [--force]`"""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m app.security.keys", description="Prism dev keyrings")
    sub = parser.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("generate", help="write a dev keyring with one key of every type")
    g.add_argument("path")
    g.add_argument("--namespace")
    g.add_argument("--valid-for", help="key lifetime, e.g. 90d")
    g.add_argument("--overlap", default="7d")
    g.add_argument("--force", action="store_true", help="overwrite an existing file")
    c = sub.add_parser("check", help="load and validate a keyring file")
    c.add_argument("path")
    args = parser.parse_args(argv)
    try:
        if args.cmd == "generate":
            ring = generate(args.path, namespace=args.namespace, overlap=parse_duration(args.overlap),
                            valid_for=parse_duration(args.valid_for) if args.valid_for else None, overwrite=args.force)
        else:
            ring = FileKeyring.load(args.path)
    except (KeyringError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for key_id in ring.list_key_ids():
        print(f"{key_id}\t{ring.records[key_id].key_type}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

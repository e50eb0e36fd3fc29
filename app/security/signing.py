"""Envelope signatures (HMAC-SHA256, Ed25519) that any language can verify without
re-serializing.

Scope (memo-031 Recommendation 6): the signature covers the whole envelope except its
security context. Protobuf encodings are not canonical across implementations, so the
verifier never re-encodes: it cuts every top-level record of the security field out of
the bytes it received and verifies exactly what remains. The producer side (`sign`)
emits `head + security + payload` where `head + payload` are the signed bytes.

Known limit of that scope, stated in the docs: the security context itself (publisher
identity, classification, encryption metadata) is not covered. Prism's worker derives
identity from the verified JWT, AEAD ciphertext binds its own metadata, and the worker
re-signs what it emits with its own key.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from app._gen.prism.envelope.draft import envelope_pb2 as dpb
from app._gen.prism.envelope.v1 import envelope_pb2 as vpb
from app.envelope.codec import (
    DEFAULT_LIMITS,
    Layout,
    Limits,
    _detect,
    decode_records,
    layout_header,
    payload_parts,
    security_bytes,
    split_header,
)
from app.envelope.model import Envelope, SecurityContext
from app.envelope.wire import LEN, scan
from app.errors import AlgorithmError, ConfigError, DecodeError, SignatureError, UnknownKeyError

HMAC_SHA256 = "hmac-sha256"
ED25519 = "ed25519"
ALGORITHMS = frozenset({HMAC_SHA256, ED25519})
MIN_HMAC_KEY_BYTES = 32


@dataclass(frozen=True, slots=True)
class SigningKey:
    """A key that signs. Never serialized; only `key_id` ever leaves the process."""

    key_id: str
    algorithm: str
    secret: bytes | None = None
    private_key: Ed25519PrivateKey | None = None

    @classmethod
    def hmac_sha256(cls, key_id: str, secret: bytes) -> SigningKey:
        if len(secret) < MIN_HMAC_KEY_BYTES:
            raise AlgorithmError(f"HMAC key {key_id!r} is {len(secret)} bytes; at least {MIN_HMAC_KEY_BYTES} required",
                                 hint="generate 32 random bytes (e.g. `openssl rand -base64 32`)")
        return cls(key_id, HMAC_SHA256, secret=secret)

    @classmethod
    def ed25519(cls, key_id: str, private_key: Ed25519PrivateKey) -> SigningKey:
        return cls(key_id, ED25519, private_key=private_key)

    def verification_key(self) -> VerificationKey:
        if self.algorithm == HMAC_SHA256:
            return VerificationKey(self.key_id, HMAC_SHA256, secret=self.secret)
        assert self.private_key is not None
        return VerificationKey(self.key_id, ED25519, public_key=self.private_key.public_key())

    def __repr__(self) -> str:
        return f"SigningKey({self.key_id!r}, {self.algorithm!r})"


@dataclass(frozen=True, slots=True)
class VerificationKey:
    key_id: str
    algorithm: str
    secret: bytes | None = None
    public_key: Ed25519PublicKey | None = None

    def __repr__(self) -> str:
        return f"VerificationKey({self.key_id!r}, {self.algorithm!r})"


@dataclass(slots=True)
class VerificationKeys:
    """The keys a verifier trusts, by key id (a namespace's keyring)."""

    keys: dict[str, VerificationKey] = field(default_factory=dict)

    @classmethod
    def of(cls, keys: Iterable[VerificationKey | SigningKey]) -> VerificationKeys:
        out = cls()
        for k in keys:
            out.add(k.verification_key() if isinstance(k, SigningKey) else k)
        return out

    def add(self, key: VerificationKey) -> None:
        self.keys[key.key_id] = key

    def candidates(self, key_id: str, algorithm: str) -> list[VerificationKey]:
        if key_id:
            k = self.keys.get(key_id)
            if k is None:
                raise UnknownKeyError(f"signature key {key_id!r} is not in the verifier's keyring",
                                      path="security.signature_key_id",
                                      hint="add the producer's verification key to the namespace keyring")
            if k.algorithm != algorithm:
                raise SignatureError(f"key {key_id!r} is a {k.algorithm} key but the envelope says {algorithm}",
                                     path="security.signature_algorithm")
            return [k]
        found = [k for k in self.keys.values() if k.algorithm == algorithm]
        if not found:
            raise UnknownKeyError(f"no {algorithm} key configured and the envelope names none",
                                  path="security.signature_key_id")
        return found


@dataclass(frozen=True, slots=True)
class SignatureInfo:
    key_id: str
    algorithm: str


@functools.lru_cache(maxsize=256)
def _hmac_state(secret: bytes) -> hmac.HMAC:
    # The keyed inner/outer pad state, computed once per key; each message copies it.
    return hmac.new(secret, digestmod=hashlib.sha256)


def _mac(secret: bytes, parts: list[bytes | memoryview]) -> bytes:
    m = _hmac_state(secret).copy()
    for p in parts:
        m.update(p)
    return m.digest()


def begin_signature(env: Envelope, key: SigningKey) -> SecurityContext:
    """Record algorithm and key id in `env.security` and clear any old signature: the
    state in which the signed bytes are computed (they exclude the security context)."""
    if key.algorithm not in ALGORITHMS:
        raise AlgorithmError(f"signature algorithm {key.algorithm!r} is not supported",
                             hint=f"use one of {sorted(ALGORITHMS)}")
    sec = env.ensure_security()
    sec.signature_algorithm = key.algorithm
    sec.signature_key_id = key.key_id
    sec.ClearField("signature")
    return sec


def signature_over(key: SigningKey, parts: list[bytes | memoryview]) -> bytes:
    """The signature of the concatenation of `parts` (HMAC streams them; Ed25519 needs one buffer)."""
    if key.algorithm == HMAC_SHA256:
        assert key.secret is not None
        return _mac(key.secret, parts)
    assert key.private_key is not None
    return key.private_key.sign(b"".join(parts))


def sign(env: Envelope, key: SigningKey, layout: Layout = Layout.REVIEWED) -> bytes:
    """Sign the envelope with `key` and return the wire bytes in `layout`.

    Also records algorithm and key id in `env.security` (the signature value itself is
    only in the returned bytes' security record, and in `env` afterwards).
    """
    sec = begin_signature(env, key)
    header = layout_header(env, layout)  # converted once for the draft layout
    head, _ = split_header(header, layout)
    payload = payload_parts(env, layout)
    sig = signature_over(key, [head, *payload])
    sec.signature = sig
    header.security.signature = sig
    return b"".join([head, security_bytes(header.security, layout), *payload])


def verify(data: bytes | memoryview, keys: VerificationKeys, *, layout: Layout | None = None) -> SignatureInfo:
    """Verify the signature on received envelope bytes. Raises `SignatureError` if it is
    missing, malformed or wrong (comparison is constant-time), `UnknownKeyError` if the
    named key is not trusted."""
    view = memoryview(data)
    records = scan(view)
    lay = layout or _detect(records)
    signed, sec_bytes = _signed_runs(view, records, lay)
    if not sec_bytes:
        raise _not_signed("envelope is not signed (no security context)")
    # The two layouts' SecurityContext share field numbers 1-9 but not the nested
    # EncryptionMetadata, so each is read with its own class.
    sec = vpb.SecurityContext() if lay is Layout.REVIEWED else dpb.SecurityContext()
    try:
        sec.MergeFromString(b"".join(sec_bytes))
    except Exception as exc:
        raise DecodeError("security context is not valid protobuf", path="security") from exc
    return _check(sec.signature, sec.signature_algorithm, sec.signature_key_id, signed, keys)


def verify_and_decode(
    data: bytes | memoryview, keys: VerificationKeys, *, layout: Layout | None = None, limits: Limits = DEFAULT_LIMITS
) -> tuple[Envelope, SignatureInfo]:
    """Decode and verify in one pass over the records (what a consumer normally wants)."""
    view = memoryview(data)
    records = scan(view)
    lay = layout or _detect(records)
    signed, sec_bytes = _signed_runs(view, records, lay)
    env = decode_records(view, records, lay, limits)
    sec = env.security
    if not sec_bytes or sec is None:
        raise _not_signed("envelope is not signed (no security context)")
    return env, _check(sec.signature, sec.signature_algorithm, sec.signature_key_id, signed, keys)


def _signed_runs(
    view: memoryview, records: list[tuple[int, int, int, int, int]], lay: Layout
) -> tuple[list[memoryview], list[memoryview]]:
    sf = lay.security_field
    signed: list[memoryview] = []
    sec_bytes: list[memoryview] = []
    run = 0
    for fno, wt, start, vstart, end in records:
        if fno == sf:
            if wt != LEN:
                raise DecodeError(f"security field {sf} must be length-delimited", path=f"byte {start}")
            if start > run:
                signed.append(view[run:start])
            sec_bytes.append(view[vstart:end])
            run = end
    if run < len(view):
        signed.append(view[run:])
    return signed, sec_bytes


def _not_signed(message: str) -> SignatureError:
    return SignatureError(message, path="security.signature",
                          hint="sign it in the producer, or set the namespace's signature policy to optional")


def _check(signature: bytes, alg: str, key_id: str, signed: list[memoryview], keys: VerificationKeys) -> SignatureInfo:
    if not signature:
        raise _not_signed("envelope is not signed")
    if alg not in ALGORITHMS:
        raise AlgorithmError(f"signature algorithm {alg!r} is not supported", path="security.signature_algorithm",
                             hint=f"use one of {sorted(ALGORITHMS)}")
    for k in keys.candidates(key_id, alg):
        if alg == HMAC_SHA256:
            assert k.secret is not None
            if hmac.compare_digest(_mac(k.secret, signed), signature):
                return SignatureInfo(k.key_id, alg)
        else:
            assert k.public_key is not None
            try:
                k.public_key.verify(signature, b"".join(signed))
                return SignatureInfo(k.key_id, alg)
            except InvalidSignature:
                pass
    raise SignatureError("signature does not match the envelope (forged or tampered)", path="security.signature",
                         hint="the bytes changed after signing, or the producer used a different key")


# --------------------------------------------------------------------------- keyring files


@dataclass(slots=True)
class SigningKeyring:
    """Signature keys from a file: who may sign for which namespace, and the worker's own key.

    File format (YAML or JSON)::

        keys:
          - id: orders-producer-1
            algorithm: hmac-sha256
            secret_b64: <32+ random bytes, base64>
            namespaces: [order-events]      # optional: restrict to these namespaces
          - id: prism-worker-1
            algorithm: ed25519
            private_key_b64: <32-byte Ed25519 seed>   # or public_key_b64 to verify only
        worker_key: prism-worker-1                     # optional: what the worker re-signs with
    """

    verify_all: VerificationKeys
    by_namespace: dict[str, VerificationKeys]
    unrestricted: VerificationKeys
    signing: dict[str, SigningKey]
    worker_key_id: str | None = None
    _merged: dict[str, VerificationKeys] = field(default_factory=dict, repr=False)

    def keys_for(self, namespace: str) -> VerificationKeys:
        """Keys allowed to vouch for `namespace`: a producer key scoped to namespace A never
        verifies a message that claims namespace B. (Memoized: called once per message.)"""
        cached = self._merged.get(namespace)
        if cached is not None:
            return cached
        scoped = self.by_namespace.get(namespace)
        merged = self.unrestricted
        if scoped is not None:
            merged = VerificationKeys(dict(self.unrestricted.keys))
            merged.keys.update(scoped.keys)
        self._merged[namespace] = merged
        return merged

    def worker_key(self) -> SigningKey | None:
        if self.worker_key_id is None:
            return None
        return self.signing[self.worker_key_id]


def load_signing_keyring(path: str | Path) -> SigningKeyring:
    """Load and validate a signing keyring file; every problem is one `ConfigError`."""
    import base64
    import binascii

    import yaml

    path = Path(path)
    try:
        doc = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read signing keyring: {exc.strerror}", path=str(path),
                          hint="generate one with `prism keys init` or point the topology at an existing file") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"signing keyring is not valid YAML/JSON: {exc}", path=str(path)) from exc
    if not isinstance(doc, dict) or not isinstance(doc.get("keys"), list):
        raise ConfigError("signing keyring must be a mapping with a `keys` list", path=str(path))
    problems: list[str] = []
    all_keys, unrestricted = VerificationKeys(), VerificationKeys()
    by_ns: dict[str, VerificationKeys] = {}
    signing: dict[str, SigningKey] = {}
    for i, raw in enumerate(doc["keys"]):
        where = f"keys[{i}]"
        if not isinstance(raw, dict) or not isinstance(raw.get("id"), str) or not raw["id"]:
            problems.append(f"{where}: needs a non-empty `id`")
            continue
        kid, alg = raw["id"], raw.get("algorithm")
        where = f"keys[{i}] ({kid})"
        if kid in all_keys.keys:
            problems.append(f"{where}: duplicate key id")
            continue
        try:
            if alg == HMAC_SHA256:
                sk = SigningKey.hmac_sha256(kid, base64.b64decode(raw["secret_b64"], validate=True))
                signing[kid] = sk
                vk = sk.verification_key()
            elif alg == ED25519:
                if "private_key_b64" in raw:
                    seed = base64.b64decode(raw["private_key_b64"], validate=True)
                    sk = SigningKey.ed25519(kid, Ed25519PrivateKey.from_private_bytes(seed))
                    signing[kid] = sk
                    vk = sk.verification_key()
                else:
                    pub = base64.b64decode(raw["public_key_b64"], validate=True)
                    vk = VerificationKey(kid, ED25519, public_key=Ed25519PublicKey.from_public_bytes(pub))
            else:
                problems.append(f"{where}: algorithm must be {HMAC_SHA256!r} or {ED25519!r}, got {alg!r}")
                continue
        except KeyError as exc:
            problems.append(f"{where}: missing {exc.args[0]!r}")
            continue
        except (binascii.Error, ValueError) as exc:
            problems.append(f"{where}: key material is not valid base64 of the right length ({exc})")
            continue
        except AlgorithmError as exc:
            problems.append(f"{where}: {exc.message}")
            continue
        all_keys.add(vk)
        namespaces = raw.get("namespaces")
        if namespaces is None:
            unrestricted.add(vk)
        elif isinstance(namespaces, list) and all(isinstance(n, str) for n in namespaces):
            for ns in namespaces:
                by_ns.setdefault(ns, VerificationKeys()).add(vk)
        else:
            problems.append(f"{where}: `namespaces` must be a list of names")
    worker = doc.get("worker_key")
    if worker is not None and worker not in signing:
        problems.append(f"worker_key: {worker!r} is not a key with private material in this file")
    if problems:
        raise ConfigError(f"invalid signing keyring ({len(problems)} problem(s)): " + "; ".join(problems),
                          path=str(path), hint="see docs/security.md for the keyring format")
    return SigningKeyring(all_keys, by_ns, unrestricted, signing, worker)


def write_dev_keyring(path: str | Path, *, namespaces: Iterable[str] = ()) -> SigningKeyring:
    """Create a development keyring: one HMAC producer key and the worker's Ed25519 key."""
    import base64
    import json
    import os

    from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat

    seed = Ed25519PrivateKey.generate().private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())
    doc = {
        "keys": [
            {"id": "dev-producer-1", "algorithm": HMAC_SHA256,
             "secret_b64": base64.b64encode(os.urandom(32)).decode(), **({"namespaces": list(namespaces)}
                                                                         if namespaces else {})},
            {"id": "prism-worker-1", "algorithm": ED25519, "private_key_b64": base64.b64encode(seed).decode()},
        ],
        "worker_key": "prism-worker-1",
    }
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2))
    os.chmod(path, 0o600)
    return load_signing_keyring(path)

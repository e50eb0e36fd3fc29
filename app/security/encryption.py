"""End-to-end payload encryption: the four RFC-031 rev. 2 patterns.

`encrypt_envelope` replaces `env.payload.value` with ciphertext and fills
`env.header.security.encryption` (`EncryptionMetadata`); `decrypt_envelope` reverses it.
Only the payload value is encrypted: metadata, contexts, extensions and the payload's
`type_url` stay readable so brokers can route. Compression is the builder's job and happens
before encryption (ciphertext does not compress); this module encrypts the bytes as they are.

Patterns (docs/encryption.md has the byte-level details for other languages):

=================== ======================== ==================================================
algorithm           EncryptionType           payload / metadata
=================== ======================== ==================================================
aes-256-gcm,        SYMMETRIC                AEAD(key, iv, payload, aad); key from the provider,
chacha20-poly1305                            or a KMS data key wrapped in `encapsulated_key`
rsa-oaep-3072/4096  ASYMMETRIC               payload <= k/8-66 bytes: RSA-OAEP-SHA256(payload,
                                             label=aad); larger: RSA-OAEP wraps a random
                                             AES-256-GCM key (`encapsulated_key`), see params
ml-kem-768/1024     POST_QUANTUM             ML-KEM encapsulation (`encapsulated_key`); its
                                             32-byte shared secret is the AES-256-GCM key
x25519-ml-kem-1024  HYBRID                   AES-256-GCM key = HKDF-SHA256(x25519_ss || mlkem_ss,
                                             salt, info); ephemeral X25519 key in params
=================== ======================== ==================================================

Every algorithm uses a fresh 96-bit nonce from `os.urandom` and authenticates the AAD
(`build_aad`), which binds the ciphertext to the envelope's message id, namespace, topic,
algorithm and key id: moving a ciphertext to another envelope fails to decrypt.

Failure contract of the decrypt side: anything wrong with the ciphertext, nonce, tag, AAD,
encapsulated key, parameters or key material raises `DecryptionError` - never another
exception type and never a hint about *which* check failed inside the cryptography.
Policy refusals raise `AlgorithmError`; key lookups raise `UnknownKeyError`,
`KeyNotUsableError` or `KeyProviderError`.

Audit (RFC-031 rev. 2 "Audit Logging"): every encryption, decryption and key use produces an
`AuditRecord` (timestamp, operation, key id, algorithm, success, message id, ...) passed to
the `audit` callback, or logged on the `prism.audit` logger when none is given. Records
never contain key material or payload bytes. A failing audit sink fails the operation: an
unaudited decryption must not happen.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import logging
import os
import struct
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from cryptography.hazmat.primitives.asymmetric.mlkem import (
    MLKEM768PrivateKey,
    MLKEM768PublicKey,
    MLKEM1024PrivateKey,
    MLKEM1024PublicKey,
)
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM, ChaCha20Poly1305
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from .._gen.prism.envelope.v1 import envelope_pb2 as pb
from ..envelope.model import Envelope, Payload
from ..errors import (
    AuditError,
    DecryptionError,
    EncryptionClaimError,
    EncryptionError,
    KeyNotUsableError,
    PrismError,
)
from .algorithms import (
    AES_256_GCM,
    ASYMMETRIC,
    CHACHA20_POLY1305,
    DEFAULT_POLICY,
    HYBRID,
    KEY_ML_KEM_768,
    KEY_ML_KEM_1024,
    KEY_X25519_ML_KEM_1024,
    POST_QUANTUM,
    SYMMETRIC,
    AlgorithmPolicy,
    AlgorithmSpec,
)
from .keys import (
    DataKeyProvider,
    HybridPrivateKey,
    HybridPublicKey,
    KeyProvider,
    KeyUse,
)

audit_log = logging.getLogger("prism.audit")

NONCE_BYTES = 12
KEY_BYTES = 32
#: The authentication tag every AEAD ciphertext (AES-256-GCM, ChaCha20-Poly1305) ends with.
TAG_BYTES = 16
#: FIPS 203 ciphertext sizes: the `encapsulated_key` of the post-quantum and hybrid patterns.
ML_KEM_CIPHERTEXT_BYTES = {KEY_ML_KEM_768: 1088, KEY_ML_KEM_1024: 1568, KEY_X25519_ML_KEM_1024: 1568}
X25519_PUBLIC_BYTES = 32
#: Prefix of every Prism AAD; a stored `aad` starting with it claims Prism's binding.
AAD_PREFIX = b"prism-envelope-aad/v1\x00"
HYBRID_KDF_SALT = b"prism-envelope/x25519-ml-kem-1024/v1"
HYBRID_KDF_INFO = b"prism-envelope payload key"
OAEP_OVERHEAD = 2 * 32 + 2  # RSA-OAEP with SHA-256: max message = k/8 - 66 bytes

AuditSink = Callable[["AuditRecord"], None]
AnyProvider = KeyProvider | DataKeyProvider


# --------------------------------------------------------------------------- audit


@dataclass(frozen=True, slots=True)
class AuditRecord:
    """One audited operation. Never holds key material or payload bytes."""

    timestamp: float
    operation: str  # "encrypt" | "decrypt" | "key_use"
    key_id: str
    algorithm: str
    success: bool
    message_id: str
    namespace: str = ""
    topic: str = ""
    provider: str = ""
    #: For key_use: what the key was used for ("encrypt", "decrypt", "wrap", "unwrap").
    purpose: str = ""
    #: Prism error code when `success` is false.
    error: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def log_audit_sink(record: AuditRecord) -> None:
    """Default sink: one INFO line on `prism.audit`, the record in `extra["prism_audit"]`."""
    audit_log.info(
        "%s %s key_id=%s algorithm=%s message_id=%s%s",
        record.operation,
        "ok" if record.success else "FAILED",
        record.key_id,
        record.algorithm,
        record.message_id,
        f" error={record.error}" if record.error else "",
        extra={"prism_audit": record.to_dict()},
    )


class _Auditor:
    def __init__(self, sink: AuditSink | None, env: Envelope, provider: object) -> None:
        self.sink = sink or log_audit_sink
        self.env = env
        self.provider = str(getattr(provider, "name", type(provider).__name__))

    def emit(self, operation: str, key_id: str, algorithm: str, success: bool, *, purpose: str = "",
             error: str = "") -> None:
        rec = AuditRecord(time.time(), operation, key_id, algorithm, success, self.env.message_id,
                          self.env.namespace, self.env.topic, self.provider, purpose, error)
        try:
            self.sink(rec)
        except Exception as exc:
            raise AuditError(f"audit sink failed ({type(exc).__name__}); {operation} refused because every "
                              "encryption operation must be audited", hint="fix the audit callback") from None


# --------------------------------------------------------------------------- AAD


def build_aad(message_id: str, namespace: str, topic: str, algorithm: str, key_id: str) -> bytes:
    """The AAD Prism authenticates, stored verbatim in `EncryptionMetadata.aad`.

    `b"prism-envelope-aad/v1\\x00"` followed by five fields, each as a 4-byte big-endian
    length and UTF-8 bytes: message_id, namespace, topic, algorithm (as written in the
    metadata), key_id. Length prefixes make the encoding unambiguous in any language.
    """
    parts = [AAD_PREFIX]
    for value in (message_id, namespace, topic, algorithm, key_id):
        b = value.encode("utf-8")
        parts += [struct.pack(">I", len(b)), b]
    return b"".join(parts)


def envelope_aad(env: Envelope, algorithm: str, key_id: str) -> bytes:
    md = env.metadata
    return build_aad(md.message_id, md.namespace, md.topic, algorithm, key_id)


def _kms_context(env: Envelope) -> dict[str, str]:
    md = env.metadata
    return {"prism:message_id": md.message_id, "prism:namespace": md.namespace, "prism:topic": md.topic}


# --------------------------------------------------------------------------- primitives


def _aead(algorithm: str, key: bytes) -> AESGCM | ChaCha20Poly1305:
    if len(key) != KEY_BYTES:
        raise KeyNotUsableError(f"{algorithm} needs a {KEY_BYTES}-byte key, got {len(key)} bytes",
                                path="security.encryption.key_id", hint="use a symmetric-256 key")
    return ChaCha20Poly1305(key) if algorithm == CHACHA20_POLY1305 else AESGCM(key)


def _oaep(label: bytes | None) -> padding.OAEP:
    return padding.OAEP(mgf=padding.MGF1(hashes.SHA256()), algorithm=hashes.SHA256(), label=label or None)


def _hybrid_key(x_ss: bytes, m_ss: bytes, eph_pub: bytes, recipient_pub: bytes) -> bytes:
    info = HYBRID_KDF_INFO + eph_pub + recipient_pub
    return HKDF(hashes.SHA256(), KEY_BYTES, salt=HYBRID_KDF_SALT, info=info).derive(x_ss + m_ss)


def _legacy_hybrid_key(x_ss: bytes, m_ss: bytes) -> bytes:
    """RFC-031 rev. 2's derivation: HKDF-Extract(SHA-256, salt=nil, x25519_ss || kyber_ss)."""
    return hmac.new(b"\x00" * 32, x_ss + m_ss, hashlib.sha256).digest()


def _raw(pub: X25519PublicKey) -> bytes:
    return pub.public_bytes_raw()


# --------------------------------------------------------------------------- encrypt


def encrypt_envelope(
    env: Envelope,
    provider: AnyProvider,
    *,
    key_id: str | None = None,
    algorithm: str = AES_256_GCM,
    policy: AlgorithmPolicy = DEFAULT_POLICY,
    purpose: str | None = None,
    audit: AuditSink | None = None,
) -> pb.EncryptionMetadata:
    """Encrypt `env.payload.value` in place and fill `env.header.security.encryption`.

    `key_id` defaults to the provider's current key for (`purpose` or the algorithm's key
    type, the envelope's namespace). For RSA/PQ/hybrid, `key_id` may be the public key id.
    Returns the metadata written. Raises `AlgorithmError` (policy), `EncryptionError`
    (already encrypted), `UnknownKeyError`/`KeyNotUsableError`/`KeyProviderError` (keys).
    """
    auditor = _Auditor(audit, env, provider)
    if env.is_encrypted:
        raise EncryptionError("payload is already encrypted", path="security.encryption",
                              hint="decrypt first; Prism never double-encrypts a payload")
    try:
        spec = policy.check(algorithm)
    except PrismError as exc:
        auditor.emit("encrypt", key_id or "", algorithm, False, error=exc.code)
        raise
    kid = key_id or ""
    meta = pb.EncryptionMetadata(encryption_type=spec.encryption_type, algorithm=spec.name)
    try:
        if not kid:
            kid = provider.current_key_id(purpose or spec.key_type, env.namespace or None)
        plaintext = bytes(env.payload.value)
        if spec.pattern == SYMMETRIC:
            ciphertext = _encrypt_symmetric(env, provider, spec, kid, plaintext, meta, auditor)
        elif spec.pattern == ASYMMETRIC:
            ciphertext = _encrypt_rsa(env, _material(provider), spec, kid, plaintext, meta, auditor)
        elif spec.pattern == POST_QUANTUM:
            ciphertext = _encrypt_ml_kem(env, _material(provider), spec, kid, plaintext, meta, auditor)
        else:
            ciphertext = _encrypt_hybrid(env, _material(provider), spec, kid, plaintext, meta, auditor)
    except AuditError:
        raise
    except PrismError as exc:
        auditor.emit("encrypt", meta.key_id or kid, spec.name, False, error=exc.code)
        raise
    env.ensure_security().encryption.CopyFrom(meta)
    env.payload = Payload(ciphertext, env.payload.type_url)
    auditor.emit("encrypt", meta.key_id, meta.algorithm, True)
    return env.header.security.encryption


def _material(provider: AnyProvider) -> KeyProvider:
    if not isinstance(provider, KeyProvider):
        raise KeyNotUsableError(f"provider {getattr(provider, 'name', provider)!r} serves symmetric data keys only",
                                path="security.encryption.algorithm",
                                hint="asymmetric, post-quantum and hybrid encryption need a KeyProvider with public keys")
    return provider


def _encrypt_symmetric(env: Envelope, provider: AnyProvider, spec: AlgorithmSpec, kid: str, plaintext: bytes,
                       meta: pb.EncryptionMetadata, auditor: _Auditor) -> bytes:
    if isinstance(provider, DataKeyProvider):
        try:
            dk = provider.generate_data_key(kid, _kms_context(env))
        except PrismError as exc:
            auditor.emit("key_use", kid, spec.name, False, purpose="wrap", error=exc.code)
            raise
        auditor.emit("key_use", dk.key_id, spec.name, True, purpose="wrap")
        meta.key_id = dk.key_id
        meta.encapsulated_key = dk.wrapped
        meta.algorithm_params = json.dumps({"key_wrap": provider.wrap_name}, separators=(",", ":"))
        key = dk.plaintext
    else:
        sym = _use_key(auditor, kid, spec, "encrypt", lambda: provider.get_symmetric_key(kid, KeyUse.ENCRYPT))
        meta.key_id = sym.key_id
        key = sym.secret
    aead = _aead(spec.name, key)
    meta.iv = os.urandom(NONCE_BYTES)
    meta.aad = envelope_aad(env, meta.algorithm, meta.key_id)
    return aead.encrypt(meta.iv, plaintext, meta.aad)


def _use_key(auditor: _Auditor, kid: str, spec: AlgorithmSpec, purpose: str, fetch: Callable[[], Any]) -> Any:
    try:
        key = fetch()
    except PrismError as exc:
        auditor.emit("key_use", kid, spec.name, False, purpose=purpose, error=exc.code)
        raise
    auditor.emit("key_use", getattr(key, "key_id", kid), spec.name, True, purpose=purpose)
    return key


def _public(auditor: _Auditor, provider: KeyProvider, kid: str, spec: AlgorithmSpec, cls: type | tuple[type, ...]):
    ref = _use_key(auditor, kid, spec, "encrypt", lambda: provider.get_public_key(kid))
    if ref.key_type != spec.key_type or not isinstance(ref.key, cls):
        raise KeyNotUsableError(f"key {kid!r} is a {ref.key_type} key; {spec.name} needs a {spec.key_type} key",
                                path="security.encryption.key_id", hint=f"pass the id of a {spec.key_type} key")
    return ref


def _encrypt_rsa(env: Envelope, provider: KeyProvider, spec: AlgorithmSpec, kid: str, plaintext: bytes,
                 meta: pb.EncryptionMetadata, auditor: _Auditor) -> bytes:
    ref = _public(auditor, provider, kid, spec, rsa.RSAPublicKey)
    if ref.key.key_size != spec.rsa_bits:
        raise KeyNotUsableError(f"key {kid!r} has {ref.key.key_size} bits; {spec.name} needs {spec.rsa_bits}",
                                path="security.encryption.key_id")
    meta.key_id, meta.public_key_id = ref.key_id, ref.public_key_id
    meta.aad = envelope_aad(env, meta.algorithm, meta.key_id)
    limit = ref.key.key_size // 8 - OAEP_OVERHEAD
    if len(plaintext) <= limit:
        meta.algorithm_params = json.dumps({"mode": "direct", "oaep": "sha-256", "oaep_label": "aad"},
                                           separators=(",", ":"))
        return ref.key.encrypt(plaintext, _oaep(meta.aad))
    cek = os.urandom(KEY_BYTES)
    meta.encapsulated_key = ref.key.encrypt(cek, _oaep(meta.aad))
    meta.algorithm_params = json.dumps({"mode": "wrapped", "oaep": "sha-256", "oaep_label": "aad",
                                        "dem": AES_256_GCM}, separators=(",", ":"))
    meta.iv = os.urandom(NONCE_BYTES)
    return AESGCM(cek).encrypt(meta.iv, plaintext, meta.aad)


def _encrypt_ml_kem(env: Envelope, provider: KeyProvider, spec: AlgorithmSpec, kid: str, plaintext: bytes,
                    meta: pb.EncryptionMetadata, auditor: _Auditor) -> bytes:
    cls = MLKEM768PublicKey if spec.key_type == KEY_ML_KEM_768 else MLKEM1024PublicKey
    ref = _public(auditor, provider, kid, spec, cls)
    shared, kem_ct = ref.key.encapsulate()
    meta.key_id, meta.public_key_id = ref.key_id, ref.public_key_id
    meta.encapsulated_key = kem_ct
    meta.algorithm_params = json.dumps({"kem": spec.name, "dem": AES_256_GCM, "kdf": "none"}, separators=(",", ":"))
    meta.iv = os.urandom(NONCE_BYTES)
    meta.aad = envelope_aad(env, meta.algorithm, meta.key_id)
    return AESGCM(shared).encrypt(meta.iv, plaintext, meta.aad)


def _encrypt_hybrid(env: Envelope, provider: KeyProvider, spec: AlgorithmSpec, kid: str, plaintext: bytes,
                    meta: pb.EncryptionMetadata, auditor: _Auditor) -> bytes:
    ref = _public(auditor, provider, kid, spec, HybridPublicKey)
    eph = X25519PrivateKey.generate()
    eph_pub = _raw(eph.public_key())
    x_ss = eph.exchange(ref.key.x25519)
    m_ss, kem_ct = ref.key.ml_kem.encapsulate()
    key = _hybrid_key(x_ss, m_ss, eph_pub, _raw(ref.key.x25519))
    meta.key_id, meta.public_key_id = ref.key_id, ref.public_key_id
    meta.encapsulated_key = kem_ct
    meta.algorithm_params = json.dumps({
        "x25519_ephemeral_public": base64.b64encode(eph_pub).decode(),
        "kdf": "hkdf-sha256",
        "kdf_salt": base64.b64encode(HYBRID_KDF_SALT).decode(),
        "kdf_info_prefix": base64.b64encode(HYBRID_KDF_INFO).decode(),
        "dem": AES_256_GCM,
    }, separators=(",", ":"))
    meta.iv = os.urandom(NONCE_BYTES)
    meta.aad = envelope_aad(env, meta.algorithm, meta.key_id)
    return AESGCM(key).encrypt(meta.iv, plaintext, meta.aad)


# --------------------------------------------------------------------------- claims of encryption


_CLAIM_HINT = ("encrypt the payload before setting security.encryption (Prism SDK `encryption=`, or "
               "encrypt_envelope), or send a plaintext payload without security.encryption; "
               "see docs/encryption.md, \"Claims of encryption\"")


def _short(value: object) -> str:
    """A metadata value for an error message: its repr, cut short (never payload bytes)."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _type_name(value: int) -> str:
    """`EncryptionType` name of `value`, or the bare number for a value the enum does not define
    (proto3 keeps unknown enum numbers; `EncryptionType.Name` would raise ValueError)."""
    try:
        return pb.EncryptionType.Name(value)
    except ValueError:
        return str(value)


def check_encryption_claim(env: Envelope, policy: AlgorithmPolicy = DEFAULT_POLICY) -> AlgorithmSpec:
    """Check that an envelope which claims an encrypted payload has the shape its algorithm
    produces, and return the algorithm's spec. The policy stage runs this on every envelope with
    `security.encryption` (app/agents/policy.py); it reads metadata and lengths only, never key
    material, so a worker without the consumers' keys can run it.

    Why: a present `security.encryption` is only a label. Without this check a plaintext payload
    whose block named an algorithm and a key id travelled to `.v2`/`.v3` as "encrypted" - every
    consumer failed to decrypt it while a plain reader of the topic read the data - and the
    worker's `encrypt_unencrypted` skipped it.

    What is checked, per pattern (docs/encryption.md, "The four patterns, byte by byte"):

    * every algorithm: the policy allows it (`AlgorithmError`, as before); `key_id` is set;
      `encryption_type` is unset or the algorithm's own; an `aad` in Prism's format is this
      envelope's (message id, namespace, topic, algorithm, key id); `algorithm_params`, when
      present, is a JSON object;
    * an AEAD payload (symmetric, RSA wrapped, ML-KEM, hybrid): a 12-byte `iv` and a payload of at
      least the 16-byte tag;
    * symmetric: `encapsulated_key` only with `algorithm_params.key_wrap` (a KMS data key), and
      then present;
    * RSA-OAEP: `direct` - a payload of exactly one modulus-sized block; `wrapped` - an
      `encapsulated_key` of exactly one block, AES-256-GCM as the DEM; OAEP with SHA-256;
    * ML-KEM: an `encapsulated_key` of the parameter set's ciphertext size (1088 / 1568 bytes);
    * X25519 + ML-KEM-1024: a 1568-byte `encapsulated_key`, a 32-byte
      `algorithm_params.x25519_ephemeral_public`, `kdf` `hkdf-sha256` when given.

    Every problem is reported at once in one `EncryptionClaimError` (DLQ reason
    `encryption_claim_invalid`). Passing is necessary, not sufficient: only the consumer's key
    shows whether the bytes really are ciphertext, and a producer that deliberately fakes the
    shape (fields of the right lengths around plaintext) is not detectable here.
    """
    sec = env.security
    if sec is None or not sec.HasField("encryption"):
        raise EncryptionClaimError("the envelope claims no encryption (security.encryption is absent)",
                                   path="security.encryption", hint="check only envelopes that claim encryption")
    meta = sec.encryption
    spec = policy.check(meta.algorithm, decrypt=True)
    name = spec.name
    problems: list[tuple[str, str]] = []

    def bad(where: str, what: str) -> None:
        problems.append((where, what))

    if not meta.key_id:
        bad("security.encryption.key_id", "is empty: no consumer could know which key decrypts")
    if meta.encryption_type not in (pb.ENCRYPTION_TYPE_UNSPECIFIED, spec.encryption_type):
        bad("security.encryption.encryption_type", f"is {_type_name(meta.encryption_type)}, but {name} is "
            f"{_type_name(spec.encryption_type)} (the metadata describes another algorithm)")
    if meta.HasField("aad") and meta.aad.startswith(AAD_PREFIX) and not hmac.compare_digest(
            meta.aad, envelope_aad(env, meta.algorithm, meta.key_id)):
        bad("security.encryption.aad", "is Prism's binding of another message id, namespace, topic, algorithm "
            "or key id (the ciphertext was moved, or the metadata changed after encryption)")
    params: Mapping[str, Any] = {}
    if meta.HasField("algorithm_params") and meta.algorithm_params:
        try:
            parsed = json.loads(meta.algorithm_params)
        except (ValueError, RecursionError):
            parsed = None
            bad("security.encryption.algorithm_params", "is not valid JSON")
        else:
            if isinstance(parsed, dict):
                params = parsed
            else:
                bad("security.encryption.algorithm_params", f"is a JSON {type(parsed).__name__}, not an object")
    size = len(env.payload.value)
    encapsulated = len(meta.encapsulated_key)

    def aead_fields(dem: str) -> None:
        if len(meta.iv) != NONCE_BYTES:
            bad("security.encryption.iv", f"is {len(meta.iv)} bytes; {dem} needs a {NONCE_BYTES}-byte nonce")
        if size < TAG_BYTES:
            bad("payload", f"is {size} bytes, shorter than the {TAG_BYTES}-byte tag every {dem} ciphertext ends with")

    if spec.pattern == SYMMETRIC:
        wrap = params.get("key_wrap")
        if wrap is not None and not (isinstance(wrap, str) and wrap):
            bad("security.encryption.algorithm_params", f"key_wrap is {_short(wrap)}, not the name of a key service")
        if wrap and not encapsulated:
            bad("security.encryption.encapsulated_key", f"is missing: key_wrap {_short(wrap)} needs the wrapped data key")
        if not wrap and encapsulated:
            bad("security.encryption.encapsulated_key", f"is {encapsulated} bytes, but {name} without "
                "algorithm_params.key_wrap carries no wrapped key (the fields fit another algorithm)")
        aead_fields(name)
    elif spec.pattern == ASYMMETRIC:
        assert spec.rsa_bits is not None
        block = spec.rsa_bits // 8
        if params.get("oaep", "sha-256") != "sha-256":
            bad("security.encryption.algorithm_params", f"oaep is {_short(params.get('oaep'))}; only sha-256 is used")
        mode = params.get("mode", "direct")
        if mode == "direct":
            if size != block:
                bad("payload", f"is {size} bytes; {name} in direct mode is exactly one {block}-byte RSA block")
        elif mode == "wrapped":
            if params.get("dem", AES_256_GCM) != AES_256_GCM:
                bad("security.encryption.algorithm_params", f"dem is {_short(params.get('dem'))}; only "
                    f"{AES_256_GCM} is used")
            if encapsulated != block:
                bad("security.encryption.encapsulated_key", f"is {encapsulated} bytes; {name} wraps the content "
                    f"key in exactly one {block}-byte RSA block")
            aead_fields(AES_256_GCM)
        else:
            bad("security.encryption.algorithm_params", f"mode is {_short(mode)}; {name} knows direct and wrapped")
    elif spec.pattern == POST_QUANTUM:
        expected = ML_KEM_CIPHERTEXT_BYTES[spec.key_type]
        if encapsulated != expected:
            bad("security.encryption.encapsulated_key", f"is {encapsulated} bytes; a {spec.key_type} ciphertext "
                f"is {expected} bytes")
        aead_fields(AES_256_GCM)
    else:
        expected = ML_KEM_CIPHERTEXT_BYTES[KEY_X25519_ML_KEM_1024]
        if encapsulated != expected:
            bad("security.encryption.encapsulated_key", f"is {encapsulated} bytes; the ML-KEM-1024 ciphertext "
                f"of {name} is {expected} bytes")
        if not spec.is_legacy and params.get("kdf", "hkdf-sha256") != "hkdf-sha256":
            bad("security.encryption.algorithm_params", f"kdf is {_short(params.get('kdf'))}; {name} uses "
                "hkdf-sha256")
        eph = params.get("x25519_ephemeral_public")
        try:
            eph_len = len(base64.b64decode(eph, validate=True)) if isinstance(eph, str) else -1
        except (binascii.Error, ValueError):
            eph_len = -1
        if eph_len != X25519_PUBLIC_BYTES:
            what = "is missing or not base64" if eph_len < 0 else f"is {eph_len} bytes"
            bad("security.encryption.algorithm_params", f"x25519_ephemeral_public {what}; {name} needs the "
                f"{X25519_PUBLIC_BYTES}-byte ephemeral X25519 public key")
        aead_fields(AES_256_GCM)
    if problems:
        listed = "; ".join(f"{where} {what}" for where, what in problems)
        raise EncryptionClaimError(f"the payload claims {name} encryption, but its metadata does not have the "
                                   f"shape {name} produces ({len(problems)} problem(s)): {listed}",
                                   path=problems[0][0], hint=_CLAIM_HINT)
    return spec


# --------------------------------------------------------------------------- decrypt


def _fail(what: str, path: str = "security.encryption") -> DecryptionError:
    return DecryptionError(what, path=path, hint="the payload or its encryption metadata was altered, "
                           "the key differs from the producer's, or the envelope was re-labelled")


_OPAQUE = "payload does not decrypt: tampered ciphertext, iv, tag or encapsulated key, or the wrong key"


def decrypt_envelope(
    env: Envelope,
    provider: AnyProvider,
    *,
    policy: AlgorithmPolicy = DEFAULT_POLICY,
    audit: AuditSink | None = None,
    require_aad: bool = True,
) -> bytes:
    """Decrypt the payload and return its bytes as they were before encryption (still
    compressed when `content_encoding` says so). The envelope is not modified.

    `require_aad=False` also accepts envelopes from RFC-style producers that set no AAD or
    one of their own (legacy interop); a stored AAD in Prism's format must still match.
    """
    auditor = _Auditor(audit, env, provider)
    sec = env.security
    if sec is None or not sec.HasField("encryption"):
        raise DecryptionError("envelope is not encrypted (no security.encryption)", path="security.encryption",
                              hint="read it with Envelope.payload_bytes()")
    meta = sec.encryption
    try:
        spec = policy.check(meta.algorithm, decrypt=True)
    except PrismError as exc:
        auditor.emit("decrypt", meta.key_id, meta.algorithm, False, error=exc.code)
        raise
    try:
        plaintext = _decrypt(env, provider, spec, meta, auditor, require_aad)
    except AuditError:
        raise
    except PrismError as exc:
        auditor.emit("decrypt", meta.key_id, meta.algorithm, False, error=exc.code)
        raise
    auditor.emit("decrypt", meta.key_id, meta.algorithm, True)
    return plaintext


def decrypt_to_envelope(
    env: Envelope,
    provider: AnyProvider,
    *,
    policy: AlgorithmPolicy = DEFAULT_POLICY,
    audit: AuditSink | None = None,
    require_aad: bool = True,
) -> Envelope:
    """A new envelope with the plaintext payload and no `security.encryption`.

    The signature (if any) is removed too: it covered the ciphertext, and a stage that
    forwards the plaintext re-signs what it emits. `payload_bytes()` on the result
    decompresses as usual.
    """
    plaintext = decrypt_envelope(env, provider, policy=policy, audit=audit, require_aad=require_aad)
    out = env.copy()
    sec = out.header.security
    for name in ("encryption", "signature", "signature_algorithm", "signature_key_id", "signature_scope",
                 "sibling_digest", "tree_index", "tree_size", "tree_path"):
        sec.ClearField(name)
    out.payload = Payload(plaintext, env.payload.type_url)
    return out


def _resolve_aad(env: Envelope, meta: pb.EncryptionMetadata, require_aad: bool) -> bytes | None:
    expected = envelope_aad(env, meta.algorithm, meta.key_id)
    stored = meta.aad if meta.HasField("aad") else b""
    if hmac.compare_digest(stored, expected):
        return expected
    if stored.startswith(AAD_PREFIX) or require_aad:
        raise _fail("aad does not match this envelope's message id, namespace, topic, algorithm or key id "
                    "(the ciphertext was moved to another envelope or its metadata changed)",
                    path="security.encryption.aad")
    return stored or None


def _params(meta: pb.EncryptionMetadata) -> dict[str, Any]:
    if not meta.HasField("algorithm_params") or not meta.algorithm_params:
        return {}
    try:
        params = json.loads(meta.algorithm_params)
    except (ValueError, RecursionError):  # RecursionError: deeply nested JSON
        raise _fail("algorithm_params is not valid JSON", "security.encryption.algorithm_params") from None
    if not isinstance(params, dict):
        raise _fail("algorithm_params must be a JSON object", "security.encryption.algorithm_params")
    return params


def _b64param(params: Mapping[str, Any], name: str, size: int) -> bytes:
    try:
        value = base64.b64decode(params[name], validate=True)
    except (KeyError, TypeError, binascii.Error, ValueError):
        raise _fail(f"algorithm_params.{name} is missing or not base64",
                    "security.encryption.algorithm_params") from None
    if len(value) != size:
        raise _fail(f"algorithm_params.{name} is {len(value)} bytes, expected {size}",
                    "security.encryption.algorithm_params")
    return value


def _iv(meta: pb.EncryptionMetadata) -> bytes:
    if len(meta.iv) != NONCE_BYTES:
        raise _fail(f"iv is {len(meta.iv)} bytes; a {NONCE_BYTES * 8}-bit nonce is required", "security.encryption.iv")
    return meta.iv


def _private(auditor: _Auditor, provider: AnyProvider, spec: AlgorithmSpec, kid: str, cls: type | tuple[type, ...]):
    ref = _use_key(auditor, kid, spec, "decrypt", lambda: _material(provider).get_private_key(kid))
    if ref.key_type != spec.key_type or not isinstance(ref.key, cls):
        raise KeyNotUsableError(f"key {kid!r} is a {ref.key_type} key; {spec.name} needs a {spec.key_type} key",
                                path="security.encryption.key_id",
                                hint="the key id in the envelope names a key of another type in this keyring")
    return ref.key


def _decrypt(env: Envelope, provider: AnyProvider, spec: AlgorithmSpec, meta: pb.EncryptionMetadata,
             auditor: _Auditor, require_aad: bool) -> bytes:
    if meta.encryption_type not in (pb.ENCRYPTION_TYPE_UNSPECIFIED, spec.encryption_type):
        raise _fail(f"encryption_type {_type_name(meta.encryption_type)} does not match algorithm "
                    f"{meta.algorithm!r}", "security.encryption.encryption_type")
    kid = meta.key_id
    if not kid:
        raise _fail("key_id is empty: the consumer cannot know which key decrypts", "security.encryption.key_id")
    aad = _resolve_aad(env, meta, require_aad)
    params = _params(meta)
    ciphertext = bytes(env.payload.value)
    # Key lookups raise their own typed errors; everything cryptographic below becomes a
    # DecryptionError with one opaque message (no oracle on which step failed).
    if spec.pattern == SYMMETRIC:
        wrap = params.get("key_wrap")
        if wrap:
            if not isinstance(provider, DataKeyProvider) or provider.wrap_name != wrap:
                raise KeyNotUsableError(f"the data key is wrapped by {wrap!r}; provider "
                                        f"{getattr(provider, 'name', provider)!r} cannot unwrap it",
                                        path="security.encryption.algorithm_params",
                                        hint=f"decrypt with the {wrap} provider")
            if not meta.encapsulated_key:
                raise _fail("encapsulated_key (the wrapped data key) is missing", "security.encryption.encapsulated_key")
            try:
                key = provider.decrypt_data_key(kid, meta.encapsulated_key, _kms_context(env))
            except PrismError as exc:
                auditor.emit("key_use", kid, spec.name, False, purpose="unwrap", error=exc.code)
                raise
            auditor.emit("key_use", kid, spec.name, True, purpose="unwrap")
        else:
            key = _use_key(auditor, kid, spec, "decrypt",
                           lambda: _material(provider).get_symmetric_key(kid, KeyUse.DECRYPT)).secret
        iv = _iv(meta)
        return _opaque(lambda: _aead(spec.name, key).decrypt(iv, ciphertext, aad))
    if spec.pattern == ASYMMETRIC:
        priv = _private(auditor, provider, spec, kid, rsa.RSAPrivateKey)
        if priv.key_size != spec.rsa_bits:
            raise KeyNotUsableError(f"key {kid!r} has {priv.key_size} bits; {spec.name} needs {spec.rsa_bits}",
                                    path="security.encryption.key_id")
        mode = params.get("mode", "direct")
        if params.get("oaep", "sha-256") != "sha-256":
            raise _fail(f"unsupported OAEP hash {params.get('oaep')!r}", "security.encryption.algorithm_params")
        if mode == "direct":
            return _opaque(lambda: priv.decrypt(ciphertext, _oaep(aad)))
        if mode != "wrapped" or params.get("dem", AES_256_GCM) != AES_256_GCM:
            raise _fail(f"unsupported RSA mode {mode!r}", "security.encryption.algorithm_params")
        iv = _iv(meta)
        return _opaque(lambda: AESGCM(priv.decrypt(meta.encapsulated_key, _oaep(aad))).decrypt(iv, ciphertext, aad))
    if spec.pattern == POST_QUANTUM:
        cls = MLKEM768PrivateKey if spec.key_type == KEY_ML_KEM_768 else MLKEM1024PrivateKey
        priv = _private(auditor, provider, spec, kid, cls)
        iv = _iv(meta)
        return _opaque(lambda: AESGCM(priv.decapsulate(meta.encapsulated_key)).decrypt(iv, ciphertext, aad))
    assert spec.pattern == HYBRID
    hyb: HybridPrivateKey = _private(auditor, provider, spec, kid, HybridPrivateKey)
    if not spec.is_legacy and params.get("kdf", "hkdf-sha256") != "hkdf-sha256":
        raise _fail(f"unsupported KDF {params.get('kdf')!r}", "security.encryption.algorithm_params")
    eph_pub = _b64param(params, "x25519_ephemeral_public", 32)
    iv = _iv(meta)

    def run() -> bytes:
        x_ss = hyb.x25519.exchange(X25519PublicKey.from_public_bytes(eph_pub))
        m_ss = hyb.ml_kem.decapsulate(meta.encapsulated_key)
        if spec.is_legacy:
            key = _legacy_hybrid_key(x_ss, m_ss)
        else:
            key = _hybrid_key(x_ss, m_ss, eph_pub, _raw(hyb.x25519.public_key()))
        return AESGCM(key).decrypt(iv, ciphertext, aad)

    return _opaque(run)


def _opaque(fn: Callable[[], bytes]) -> bytes:
    try:
        return fn()
    except PrismError:
        raise
    except Exception:  # InvalidTag, ValueError (OAEP, ML-KEM length, X25519 low order), TypeError ...
        raise _fail(_OPAQUE) from None


__all__ = [
    "AAD_PREFIX",
    "HYBRID_KDF_INFO",
    "HYBRID_KDF_SALT",
    "AuditRecord",
    "AuditSink",
    "build_aad",
    "check_encryption_claim",
    "decrypt_envelope",
    "decrypt_to_envelope",
    "encrypt_envelope",
    "envelope_aad",
    "log_audit_sink",
]

"""Payload-encryption algorithm registry and policy (RFC-031 rev. 2, "FIPS 140-3").

One table says, for every algorithm name Prism understands, which encryption pattern it
belongs to, which key type it needs and whether FIPS 140-3 approves it. `AlgorithmPolicy`
is the single gate both `encrypt_envelope` and `decrypt_envelope` pass through, so an
algorithm the policy refuses can be neither produced nor consumed.

Names are canonical, lower case, hyphenated. Lookups normalise case, surrounding blanks
and `_` -> `-`, because configuration files spell them every way.

Where this module departs from RFC-031 rev. 2's table, and why:

* **ChaCha20-Poly1305 is not FIPS-approved.** The RFC lists it as "FIPS approved"; it is
  not in any NIST standard (FIPS 197 / SP 800-38D cover AES-GCM only), and no FIPS 140-3
  validated module offers it as an approved service. In `fips_mode` it is refused.
* **X25519 is not FIPS-approved for key agreement** (SP 800-56A Rev. 3 lists NIST P-curves
  and finite-field groups only). A hybrid with ML-KEM can still be used in FIPS mode when
  the ML-KEM secret comes *first* in the KDF input (SP 800-56C Rev. 2, Z' = Z || T; that is
  why TLS's X25519MLKEM768 puts ML-KEM first). RFC-031's hybrid, which Prism implements as
  written, puts the X25519 secret first, so `x25519-ml-kem-1024` is refused in
  `fips_mode`; FIPS deployments use `ml-kem-1024`.
* RSA-OAEP key transport is SP 800-56B Rev. 2 (the RFC cites FIPS 186-5, which covers key
  generation), and HKDF is the SP 800-56C two-step KDF (the RFC cites SP 800-108).
* `fips_mode` is an algorithm policy. It does not make the `cryptography` wheel's bundled
  OpenSSL a validated module; `fips_module_active()` tells whether OpenSSL runs with its
  FIPS provider.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from .._gen.prism.envelope.v1 import envelope_pb2 as pb
from ..errors import AlgorithmError

log = logging.getLogger("prism.security")

# Pattern names (RFC-031 rev. 2 "Payload Encryption Patterns").
SYMMETRIC = "symmetric"
ASYMMETRIC = "asymmetric"
POST_QUANTUM = "post_quantum"
HYBRID = "hybrid"

# Key types a key provider stores (see app.security.keys).
KEY_SYMMETRIC_256 = "symmetric-256"
KEY_RSA_3072 = "rsa-3072"
KEY_RSA_4096 = "rsa-4096"
KEY_ML_KEM_768 = "ml-kem-768"
KEY_ML_KEM_1024 = "ml-kem-1024"
KEY_X25519_ML_KEM_1024 = "x25519-ml-kem-1024"
KEY_TYPES = (KEY_SYMMETRIC_256, KEY_RSA_3072, KEY_RSA_4096, KEY_ML_KEM_768, KEY_ML_KEM_1024, KEY_X25519_ML_KEM_1024)

AES_256_GCM = "aes-256-gcm"
CHACHA20_POLY1305 = "chacha20-poly1305"
RSA_OAEP_3072 = "rsa-oaep-3072"
RSA_OAEP_4096 = "rsa-oaep-4096"
ML_KEM_768 = "ml-kem-768"
ML_KEM_1024 = "ml-kem-1024"
X25519_ML_KEM_1024 = "x25519-ml-kem-1024"

_PATTERN_TYPE = {
    SYMMETRIC: pb.ENCRYPTION_TYPE_SYMMETRIC,
    ASYMMETRIC: pb.ENCRYPTION_TYPE_ASYMMETRIC,
    POST_QUANTUM: pb.ENCRYPTION_TYPE_POST_QUANTUM,
    HYBRID: pb.ENCRYPTION_TYPE_HYBRID,
}


@dataclass(frozen=True, slots=True)
class AlgorithmSpec:
    """What Prism knows about one payload-encryption algorithm."""

    name: str
    pattern: str
    key_type: str
    fips_approved: bool
    standard: str
    #: RSA modulus size the key must have (RSA algorithms only).
    rsa_bits: int | None = None
    #: Set for the RFC's legacy spellings: decrypt-only, with the RFC's exact derivation.
    legacy_of: str | None = None

    @property
    def encryption_type(self) -> int:
        """The `EncryptionType` enum value written to `EncryptionMetadata.encryption_type`."""
        return _PATTERN_TYPE[self.pattern]

    @property
    def is_legacy(self) -> bool:
        return self.legacy_of is not None


APPROVED: dict[str, AlgorithmSpec] = {
    s.name: s
    for s in (
        AlgorithmSpec(AES_256_GCM, SYMMETRIC, KEY_SYMMETRIC_256, True, "FIPS 197 + SP 800-38D"),
        AlgorithmSpec(CHACHA20_POLY1305, SYMMETRIC, KEY_SYMMETRIC_256, False, "RFC 8439 (not a NIST standard)"),
        AlgorithmSpec(RSA_OAEP_3072, ASYMMETRIC, KEY_RSA_3072, True, "SP 800-56B Rev. 2 (KTS-OAEP)", rsa_bits=3072),
        AlgorithmSpec(RSA_OAEP_4096, ASYMMETRIC, KEY_RSA_4096, True, "SP 800-56B Rev. 2 (KTS-OAEP)", rsa_bits=4096),
        AlgorithmSpec(ML_KEM_768, POST_QUANTUM, KEY_ML_KEM_768, True, "FIPS 203"),
        AlgorithmSpec(ML_KEM_1024, POST_QUANTUM, KEY_ML_KEM_1024, True, "FIPS 203"),
        AlgorithmSpec(X25519_ML_KEM_1024, HYBRID, KEY_X25519_ML_KEM_1024, False,
                      "RFC 7748 + FIPS 203 + RFC 5869 (X25519 secret first: not SP 800-56C)"),
    )
}

#: RFC-031 rev. 2 spellings, accepted on decrypt only. Kyber768/1024 messages use the
#: ML-KEM shared secret directly as the AES-256-GCM key (as the RFC's Go code does, and as
#: Prism's ml-kem-* do); `x25519-kyber1024` uses the RFC's `HKDF-Extract(salt=nil, x||k)`.
LEGACY_ALIASES: dict[str, AlgorithmSpec] = {
    "kyber768": AlgorithmSpec("kyber768", POST_QUANTUM, KEY_ML_KEM_768, True, "FIPS 203", legacy_of=ML_KEM_768),
    "kyber1024": AlgorithmSpec("kyber1024", POST_QUANTUM, KEY_ML_KEM_1024, True, "FIPS 203", legacy_of=ML_KEM_1024),
    "x25519-kyber1024": AlgorithmSpec("x25519-kyber1024", HYBRID, KEY_X25519_ML_KEM_1024, False,
                                      "RFC-031 rev. 2 hybrid", legacy_of=X25519_ML_KEM_1024),
}

#: Refused everywhere, with what to use instead (RFC-031 rev. 2 "Deprecated/Weak Algorithms").
DEPRECATED: dict[str, tuple[str, str]] = {
    "aes-128-gcm": ("128-bit key is below the 256-bit minimum", AES_256_GCM),
    "aes-128": ("128-bit key is below the 256-bit minimum", AES_256_GCM),
    "aes-128-cbc": ("128-bit key and unauthenticated mode", AES_256_GCM),
    "aes-128-ctr": ("128-bit key and unauthenticated mode", AES_256_GCM),
    "3des": ("64-bit block, weak and slow", AES_256_GCM),
    "tripledes": ("64-bit block, weak and slow", AES_256_GCM),
    "des-ede3": ("64-bit block, weak and slow", AES_256_GCM),
    "des-ede3-cbc": ("64-bit block, weak and slow", AES_256_GCM),
    "des": ("56-bit key, completely broken", AES_256_GCM),
    "des-cbc": ("56-bit key, completely broken", AES_256_GCM),
    "rc4": ("biased keystream, multiple practical attacks", CHACHA20_POLY1305),
    "arcfour": ("biased keystream, multiple practical attacks", CHACHA20_POLY1305),
    "md5": ("cryptographically broken hash", "sha-256"),
    "sha-1": ("practical collision attacks", "sha-256"),
    "sha1": ("practical collision attacks", "sha-256"),
    "rsa-oaep-sha1": ("OAEP with SHA-1", RSA_OAEP_4096),
}

# Any RSA name with a modulus below 3072 bits ("rsa-2048", "rsa-oaep-2048", "rsa2048-kyber768", ...).
_RSA_BITS = re.compile(r"^rsa(?:-oaep)?-?(\d{3,5})(?:$|-)")


def normalize(name: str) -> str:
    """Canonical spelling of an algorithm name: lower case, hyphens, no blanks."""
    return name.strip().lower().replace("_", "-")


def _deprecated(name: str) -> tuple[str, str] | None:
    if name in DEPRECATED:
        return DEPRECATED[name]
    m = _RSA_BITS.match(name)
    if m and int(m.group(1)) < 3072:
        return (f"RSA-{m.group(1)} is insufficient for 2025 and later (minimum 3072 bits)", RSA_OAEP_4096)
    return None


def lookup(name: str, *, decrypt: bool = False) -> AlgorithmSpec:
    """The spec for `name`, or `AlgorithmError` saying why not and what to use instead.

    Legacy RFC spellings (`kyber1024`, ...) resolve only when `decrypt` is true: Prism reads
    what existing producers send but always writes canonical names.
    """
    n = normalize(name)
    if not n:
        raise AlgorithmError("no encryption algorithm given", path="security.encryption.algorithm",
                             hint=f"use one of {sorted(APPROVED)}")
    bad = _deprecated(n)
    if bad is not None:
        reason, replacement = bad
        raise AlgorithmError(f"algorithm {name!r} is deprecated: {reason}", path="security.encryption.algorithm",
                             hint=f"use {replacement} instead")
    if n in APPROVED:
        return APPROVED[n]
    if n in LEGACY_ALIASES:
        spec = LEGACY_ALIASES[n]
        if decrypt:
            return spec
        raise AlgorithmError(f"algorithm {name!r} is a legacy RFC-031 spelling, accepted on decrypt only",
                             path="security.encryption.algorithm", hint=f"encrypt with {spec.legacy_of!r}")
    raise AlgorithmError(f"algorithm {name!r} is not supported for payload encryption",
                         path="security.encryption.algorithm", hint=f"use one of {sorted(APPROVED)}")


@dataclass(slots=True)
class AlgorithmPolicy:
    """Which algorithms a producer may write and a consumer may read.

    `fips_mode=True` admits only FIPS 140-3 approved algorithms (see the module docstring
    for why ChaCha20-Poly1305 and the X25519 hybrid are not). `allowlist`, when given,
    narrows further (canonical names; legacy spellings are allowed when their canonical
    algorithm is). Contradictory configuration fails at construction, not per message.
    """

    fips_mode: bool = False
    allowlist: set[str] | frozenset[str] | None = None
    #: Log one warning per non-FIPS algorithm used outside fips_mode (RFC: "proxy MUST log").
    warn_non_fips: bool = True
    _warned: set[str] = field(default_factory=set, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.allowlist is None:
            return
        names: set[str] = set()
        for raw in self.allowlist:
            spec = lookup(raw)  # deprecated / unknown / legacy names fail here, with the reason
            if self.fips_mode and not spec.fips_approved:
                raise AlgorithmError(f"allowlist names {spec.name!r}, which fips_mode forbids",
                                     path="encryption.allowlist",
                                     hint="remove it from the allowlist or turn fips_mode off")
            names.add(spec.name)
        if not names:
            raise AlgorithmError("allowlist is empty: no payload could be encrypted or decrypted",
                                 path="encryption.allowlist", hint="list at least one algorithm, or omit it")
        self.allowlist = frozenset(names)

    def check(self, name: str, *, decrypt: bool = False) -> AlgorithmSpec:
        """Resolve `name` and apply the policy; raises `AlgorithmError` when refused."""
        spec = lookup(name, decrypt=decrypt)
        canonical = spec.legacy_of or spec.name
        if self.fips_mode and not spec.fips_approved:
            raise AlgorithmError(f"algorithm {spec.name!r} is not FIPS 140-3 approved ({spec.standard})",
                                 path="security.encryption.algorithm",
                                 hint=f"in fips_mode use one of {sorted(self.allowed())}")
        if self.allowlist is not None and canonical not in self.allowlist:
            raise AlgorithmError(f"algorithm {spec.name!r} is not in this namespace's allowlist",
                                 path="security.encryption.algorithm",
                                 hint=f"use one of {sorted(self.allowlist)} or extend the allowlist")
        if not spec.fips_approved and self.warn_non_fips and spec.name not in self._warned:
            self._warned.add(spec.name)
            log.warning("payload encryption uses %s, which is not FIPS 140-3 approved (%s)", spec.name, spec.standard)
        return spec

    def allowed(self) -> frozenset[str]:
        """Canonical names this policy admits for encryption."""
        names: Iterable[str] = self.allowlist if self.allowlist is not None else APPROVED
        return frozenset(n for n in names if not self.fips_mode or APPROVED[n].fips_approved)


DEFAULT_POLICY = AlgorithmPolicy()
FIPS_POLICY = AlgorithmPolicy(fips_mode=True)


def fips_module_active() -> bool:
    """True when the OpenSSL behind `cryptography` runs with its FIPS provider enabled.

    `AlgorithmPolicy(fips_mode=True)` restricts algorithms either way; a FIPS 140-3
    deployment needs both.
    """
    from cryptography.hazmat.backends.openssl.backend import backend

    return bool(backend._fips_enabled)

//! Payload encryption (docs/encryption.md; the Rust twin of `app/security/encryption.py`):
//! every pattern the Python worker produces and accepts, with the AAD that binds a ciphertext
//! to its envelope. Only `payload.value` is encrypted.
//!
//! | algorithm | type | payload / metadata |
//! |---|---|---|
//! | `aes-256-gcm`, `chacha20-poly1305` | SYMMETRIC | AEAD(shared key, iv, payload, aad); or a KMS data key wrapped in `encapsulated_key` (`algorithm_params.key_wrap`, a [`DataKeyService`]) |
//! | `rsa-oaep-3072`, `rsa-oaep-4096` | ASYMMETRIC | payload <= k/8-66 bytes: RSA-OAEP-SHA256(payload, label = aad) (`mode: direct`); larger: RSA-OAEP wraps a random AES-256-GCM key (`mode: wrapped`) |
//! | `ml-kem-768`, `ml-kem-1024` | POST_QUANTUM | ML-KEM encapsulation in `encapsulated_key`; the shared secret is the AES-256-GCM key |
//! | `x25519-ml-kem-1024` | HYBRID | AES-256-GCM key = HKDF-SHA256(x25519_ss ‖ mlkem_ss, salt, info ‖ eph_pub ‖ recipient_pub) |
//!
//! The RFC-031 spellings `kyber768`, `kyber1024` and `x25519-kyber1024` are read (decrypt
//! only, with the RFC's derivation for the hybrid), never written - as in Python.
//!
//! Every cryptographic failure is one opaque `PrismError::Decryption` (no oracle on which
//! step failed); key lookups fail with `UnknownKey` / `KeyNotUsable`; policy refusals with
//! `Algorithm`.

use std::collections::BTreeMap;
use std::sync::Arc;

use aes_gcm::aead::{Aead, KeyInit, Payload as AeadPayload};
use aes_gcm::{Aes256Gcm, Nonce};
use base64::Engine;
use chacha20poly1305::ChaCha20Poly1305;
use ml_kem::kem::{Decapsulate, Encapsulate};
use ml_kem::{EncodedSizeUser, KemCore, MlKem1024, MlKem768};
use rsa::traits::PublicKeyParts;
use rsa::{Oaep, RsaPrivateKey, RsaPublicKey};
use sha2::Sha256;
use subtle_eq::ct_eq;

use crate::error::{err, PrismError, Result};
use crate::gen::v1::{self, EncryptionType};
use crate::model::{random_bytes, Envelope};

pub const AES_256_GCM: &str = "aes-256-gcm";
pub const CHACHA20_POLY1305: &str = "chacha20-poly1305";
pub const RSA_OAEP_3072: &str = "rsa-oaep-3072";
pub const RSA_OAEP_4096: &str = "rsa-oaep-4096";
pub const ML_KEM_768: &str = "ml-kem-768";
pub const ML_KEM_1024: &str = "ml-kem-1024";
pub const X25519_ML_KEM_1024: &str = "x25519-ml-kem-1024";
pub const AAD_PREFIX: &[u8] = b"prism-envelope-aad/v1\x00";
pub const HYBRID_KDF_SALT: &[u8] = b"prism-envelope/x25519-ml-kem-1024/v1";
pub const HYBRID_KDF_INFO: &[u8] = b"prism-envelope payload key";
const NONCE_BYTES: usize = 12;
/// RSA-OAEP with SHA-256: the largest message is k/8 - 66 bytes.
const OAEP_OVERHEAD: usize = 2 * 32 + 2;
const OPAQUE: &str =
    "payload does not decrypt (wrong key, or the ciphertext, iv, aad, encapsulated key or parameters were changed)";

type DK = <MlKem1024 as KemCore>::DecapsulationKey;
type EK = <MlKem1024 as KemCore>::EncapsulationKey;
type DK768 = <MlKem768 as KemCore>::DecapsulationKey;
type EK768 = <MlKem768 as KemCore>::EncapsulationKey;

mod subtle_eq {
    /// Constant-time equality of two byte strings (the length is not secret).
    pub fn ct_eq(a: &[u8], b: &[u8]) -> bool {
        a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
    }
}

fn fail(what: &str, at: &str) -> PrismError {
    err!(
        Decryption,
        what,
        at,
        "check the key and that the envelope was not changed after encryption"
    )
}

// ------------------------------------------------------------------ algorithms and policy

/// How an algorithm encrypts (RFC-031 rev. 2's four patterns).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pattern {
    Symmetric,
    Asymmetric,
    PostQuantum,
    Hybrid,
}

/// One algorithm: its canonical name, pattern, FIPS 140-3 status, and for an RFC-031 legacy
/// spelling (decrypt only) the canonical algorithm it stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AlgorithmSpec {
    pub name: &'static str,
    pub pattern: Pattern,
    pub fips_approved: bool,
    pub legacy_of: Option<&'static str>,
}

impl AlgorithmSpec {
    /// The canonical algorithm (the legacy spelling's, or its own name).
    pub fn canonical(&self) -> &'static str {
        self.legacy_of.unwrap_or(self.name)
    }
    fn encryption_type(&self) -> EncryptionType {
        match self.pattern {
            Pattern::Symmetric => EncryptionType::Symmetric,
            Pattern::Asymmetric => EncryptionType::Asymmetric,
            Pattern::PostQuantum => EncryptionType::PostQuantum,
            Pattern::Hybrid => EncryptionType::Hybrid,
        }
    }
}

const fn spec(name: &'static str, pattern: Pattern, fips: bool, legacy_of: Option<&'static str>) -> AlgorithmSpec {
    AlgorithmSpec {
        name,
        pattern,
        fips_approved: fips,
        legacy_of,
    }
}

/// The approved algorithms (`app/security/algorithms.py` APPROVED).
pub const APPROVED: [AlgorithmSpec; 7] = [
    spec(AES_256_GCM, Pattern::Symmetric, true, None),
    spec(CHACHA20_POLY1305, Pattern::Symmetric, false, None),
    spec(RSA_OAEP_3072, Pattern::Asymmetric, true, None),
    spec(RSA_OAEP_4096, Pattern::Asymmetric, true, None),
    spec(ML_KEM_768, Pattern::PostQuantum, true, None),
    spec(ML_KEM_1024, Pattern::PostQuantum, true, None),
    spec(X25519_ML_KEM_1024, Pattern::Hybrid, false, None),
];

const LEGACY: [AlgorithmSpec; 3] = [
    spec("kyber768", Pattern::PostQuantum, true, Some(ML_KEM_768)),
    spec("kyber1024", Pattern::PostQuantum, true, Some(ML_KEM_1024)),
    spec("x25519-kyber1024", Pattern::Hybrid, false, Some(X25519_ML_KEM_1024)),
];

const DEPRECATED: [(&str, &str, &str); 16] = [
    ("aes-128-gcm", "128-bit key is below the 256-bit minimum", AES_256_GCM),
    ("aes-128", "128-bit key is below the 256-bit minimum", AES_256_GCM),
    ("aes-128-cbc", "128-bit key and unauthenticated mode", AES_256_GCM),
    ("aes-128-ctr", "128-bit key and unauthenticated mode", AES_256_GCM),
    ("3des", "64-bit block, weak and slow", AES_256_GCM),
    ("tripledes", "64-bit block, weak and slow", AES_256_GCM),
    ("des-ede3", "64-bit block, weak and slow", AES_256_GCM),
    ("des-ede3-cbc", "64-bit block, weak and slow", AES_256_GCM),
    ("des", "56-bit key, completely broken", AES_256_GCM),
    ("des-cbc", "56-bit key, completely broken", AES_256_GCM),
    ("rc4", "biased keystream, multiple practical attacks", CHACHA20_POLY1305),
    (
        "arcfour",
        "biased keystream, multiple practical attacks",
        CHACHA20_POLY1305,
    ),
    ("md5", "cryptographically broken hash", "sha-256"),
    ("sha-1", "practical collision attacks", "sha-256"),
    ("sha1", "practical collision attacks", "sha-256"),
    ("rsa-oaep-sha1", "OAEP with SHA-1", RSA_OAEP_4096),
];

/// Canonical spelling: lower case, hyphens, no surrounding blanks.
pub fn normalize(name: &str) -> String {
    name.trim().to_ascii_lowercase().replace('_', "-")
}

/// The modulus size of an RSA name (`^rsa(-oaep)?-?(\d{3,5})($|-)`), as Python's check reads it.
fn rsa_name_bits(n: &str) -> Option<u32> {
    let rest = n.strip_prefix("rsa")?;
    let rest = rest.strip_prefix("-oaep").unwrap_or(rest);
    let rest = rest.strip_prefix('-').unwrap_or(rest);
    let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
    if !(3..=5).contains(&digits) {
        return None;
    }
    let after = &rest[digits..];
    if !(after.is_empty() || after.starts_with('-')) {
        return None;
    }
    rest[..digits].parse().ok()
}

fn algorithm_error(what: String, hint: String) -> PrismError {
    err!(Algorithm, what, "security.encryption.algorithm", hint)
}

fn approved_names() -> String {
    let mut names: Vec<&str> = APPROVED.iter().map(|s| s.name).collect();
    names.sort_unstable();
    names.join(", ")
}

/// The spec for `name`, or `Algorithm` saying why not and what to use instead. Legacy RFC
/// spellings resolve only when `decrypt` is true (Prism reads them, never writes them).
pub fn lookup(name: &str, decrypt: bool) -> Result<AlgorithmSpec> {
    let n = normalize(name);
    if n.is_empty() {
        return Err(algorithm_error(
            "no encryption algorithm given".into(),
            format!("use one of {}", approved_names()),
        ));
    }
    if let Some((_, why, instead)) = DEPRECATED.iter().find(|(d, _, _)| *d == n) {
        return Err(algorithm_error(
            format!("algorithm {name:?} is deprecated: {why}"),
            format!("use {instead} instead"),
        ));
    }
    if let Some(bits) = rsa_name_bits(&n).filter(|b| *b < 3072) {
        return Err(algorithm_error(
            format!(
                "algorithm {name:?} is deprecated: RSA-{bits} is insufficient for 2025 and later (minimum 3072 bits)"
            ),
            format!("use {RSA_OAEP_4096} instead"),
        ));
    }
    if let Some(s) = APPROVED.iter().find(|s| s.name == n) {
        return Ok(*s);
    }
    if let Some(s) = LEGACY.iter().find(|s| s.name == n) {
        if decrypt {
            return Ok(*s);
        }
        return Err(algorithm_error(
            format!("algorithm {name:?} is a legacy RFC-031 spelling, accepted on decrypt only"),
            format!("encrypt with {}", s.canonical()),
        ));
    }
    Err(algorithm_error(
        format!("algorithm {name:?} is not supported for payload encryption"),
        format!("use one of {}", approved_names()),
    ))
}

/// The canonical algorithm name (for encryption: legacy spellings refused); deprecated and
/// unknown names are refused (`Algorithm`), as in Python.
pub fn canonical_algorithm(name: &str) -> Result<&'static str> {
    lookup(name, false).map(|s| s.name)
}

/// Which algorithms a producer may write and a consumer may read (Python's `AlgorithmPolicy`):
/// `fips_mode` admits only FIPS 140-3 approved algorithms (not ChaCha20-Poly1305, not the
/// X25519 hybrid); `allowlist`, when set, narrows further (canonical names).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Policy {
    pub fips_mode: bool,
    pub allowlist: Option<Vec<String>>,
}

impl Policy {
    /// A policy, checked as Python checks it at construction: every allowlisted name must be
    /// an approved algorithm that `fips_mode` admits, and the list must not be empty.
    pub fn new(fips_mode: bool, allowlist: Option<Vec<String>>) -> Result<Self> {
        let allowlist = match allowlist {
            None => None,
            Some(names) => {
                let mut out = Vec::new();
                for raw in &names {
                    let s = lookup(raw, false)?;
                    if fips_mode && !s.fips_approved {
                        return Err(err!(
                            Algorithm,
                            format!("allowlist names {:?}, which fips_mode forbids", s.name),
                            "encryption.allowlist",
                            "remove it from the allowlist or turn fips_mode off"
                        ));
                    }
                    if !out.iter().any(|n: &String| n == s.name) {
                        out.push(s.name.to_owned());
                    }
                }
                if out.is_empty() {
                    return Err(err!(
                        Algorithm,
                        "allowlist is empty: no payload could be encrypted or decrypted",
                        "encryption.allowlist",
                        "list at least one algorithm, or omit it"
                    ));
                }
                Some(out)
            }
        };
        Ok(Policy { fips_mode, allowlist })
    }

    /// Resolve `name` and apply the policy.
    pub fn check(&self, name: &str, decrypt: bool) -> Result<AlgorithmSpec> {
        let s = lookup(name, decrypt)?;
        if self.fips_mode && !s.fips_approved {
            return Err(algorithm_error(
                format!("algorithm {:?} is not FIPS 140-3 approved", s.name),
                "in fips_mode use aes-256-gcm, rsa-oaep-3072/4096 or ml-kem-768/1024".into(),
            ));
        }
        if let Some(list) = &self.allowlist {
            if !list.iter().any(|n| n == s.canonical()) {
                return Err(algorithm_error(
                    format!("algorithm {:?} is not in this namespace's allowlist", s.name),
                    format!("use one of {} or extend the allowlist", list.join(", ")),
                ));
            }
        }
        Ok(s)
    }
}

// ------------------------------------------------------------------ keys

/// A key of one of the supported types. The private parts are optional: a producer that only
/// encrypts to a recipient holds its public keys. Debug output never shows material.
#[derive(Clone)]
pub enum Key {
    /// `symmetric-256`: 32 shared bytes (AES-256-GCM or ChaCha20-Poly1305).
    Symmetric { key_id: String, secret: [u8; 32] },
    /// `rsa-3072` / `rsa-4096`: the public key and, to decrypt, the private key.
    Rsa {
        key_id: String,
        public: Box<RsaPublicKey>,
        private: Option<Box<RsaPrivateKey>>,
    },
    /// `ml-kem-768`: the encapsulation key and, to decrypt, the decapsulation key.
    MlKem768 {
        key_id: String,
        public: Box<EK768>,
        private: Option<Box<DK768>>,
    },
    /// `ml-kem-1024`: the encapsulation key and, to decrypt, the decapsulation key.
    MlKem1024 {
        key_id: String,
        public: Box<EK>,
        private: Option<Box<DK>>,
    },
    /// `x25519-ml-kem-1024`: both public keys and, to decrypt, both private keys.
    Hybrid {
        key_id: String,
        x25519_public: x25519_dalek::PublicKey,
        ml_kem_public: Box<EK>,
        x25519_private: Option<x25519_dalek::StaticSecret>,
        ml_kem_private: Option<Box<DK>>,
    },
}

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Key({}, {})", self.key_id(), self.key_type())
    }
}

fn arr32(b: &[u8], what: &str) -> Result<[u8; 32]> {
    b.try_into().map_err(|_| {
        err!(
            KeyNotUsable,
            format!("{what} is {} bytes, not 32", b.len()),
            "key",
            "pass the raw 32-byte key"
        )
    })
}

fn ml_kem_from_seed<P: KemCore>(seed: &[u8]) -> Result<(P::DecapsulationKey, P::EncapsulationKey)> {
    if seed.len() != 64 {
        return Err(err!(
            KeyNotUsable,
            format!("an ML-KEM seed (d || z) is 64 bytes, not {}", seed.len()),
            "key",
            "pass the FIPS 203 seed"
        ));
    }
    let d = ml_kem::B32::try_from(&seed[..32]).map_err(|_| err!(KeyNotUsable, "bad seed", "key", ""))?;
    let z = ml_kem::B32::try_from(&seed[32..]).map_err(|_| err!(KeyNotUsable, "bad seed", "key", ""))?;
    Ok(P::generate_deterministic(&d, &z))
}

fn ml_kem_public<P: KemCore>(b: &[u8], name: &str) -> Result<P::EncapsulationKey> {
    let enc = ml_kem::Encoded::<P::EncapsulationKey>::try_from(b).map_err(|_| {
        err!(
            KeyNotUsable,
            format!("this is not an {name} public key ({} bytes)", b.len()),
            "key",
            "pass the encoded encapsulation key"
        )
    })?;
    Ok(P::EncapsulationKey::from_bytes(&enc))
}

fn rsa_bits_ok(bits: usize) -> Result<()> {
    if bits == 3072 || bits == 4096 {
        Ok(())
    } else {
        Err(err!(
            KeyNotUsable,
            format!("an RSA key of {bits} bits; Prism encrypts with rsa-3072 or rsa-4096"),
            "key",
            "generate a 3072- or 4096-bit key"
        ))
    }
}

impl Key {
    pub fn symmetric(key_id: impl Into<String>, secret: &[u8]) -> Result<Self> {
        Ok(Key::Symmetric {
            key_id: key_id.into(),
            secret: arr32(secret, "a symmetric-256 key")?,
        })
    }
    /// An RSA key pair from its private key in PEM (PKCS#8, as Python's keyring writes it, or
    /// PKCS#1). Only 3072- and 4096-bit moduli are accepted.
    pub fn rsa_private_pem(key_id: impl Into<String>, pem: &str) -> Result<Self> {
        use rsa::pkcs1::DecodeRsaPrivateKey;
        use rsa::pkcs8::DecodePrivateKey;
        let private = RsaPrivateKey::from_pkcs8_pem(pem)
            .or_else(|_| RsaPrivateKey::from_pkcs1_pem(pem))
            .map_err(|_| {
                err!(
                    KeyNotUsable,
                    "not an RSA private key in PEM",
                    "key",
                    "pass a PKCS#8 or PKCS#1 PEM"
                )
            })?;
        rsa_bits_ok(private.size() * 8)?;
        Ok(Key::Rsa {
            key_id: key_id.into(),
            public: Box::new(private.to_public_key()),
            private: Some(Box::new(private)),
        })
    }
    /// An RSA recipient (encrypt only) from its SubjectPublicKeyInfo (or PKCS#1) PEM.
    pub fn rsa_public_pem(key_id: impl Into<String>, pem: &str) -> Result<Self> {
        use rsa::pkcs1::DecodeRsaPublicKey;
        use rsa::pkcs8::DecodePublicKey;
        let public = RsaPublicKey::from_public_key_pem(pem)
            .or_else(|_| RsaPublicKey::from_pkcs1_pem(pem))
            .map_err(|_| {
                err!(
                    KeyNotUsable,
                    "not an RSA public key in PEM",
                    "key",
                    "pass a SubjectPublicKeyInfo PEM"
                )
            })?;
        rsa_bits_ok(public.size() * 8)?;
        Ok(Key::Rsa {
            key_id: key_id.into(),
            public: Box::new(public),
            private: None,
        })
    }
    /// An ML-KEM-768 key pair from its 64-byte FIPS 203 seed (d || z).
    pub fn ml_kem_768_from_seed(key_id: impl Into<String>, seed: &[u8]) -> Result<Self> {
        let (dk, ek) = ml_kem_from_seed::<MlKem768>(seed)?;
        Ok(Key::MlKem768 {
            key_id: key_id.into(),
            public: Box::new(ek),
            private: Some(Box::new(dk)),
        })
    }
    /// An ML-KEM-768 recipient (encrypt only), from its 1184-byte encapsulation key.
    pub fn ml_kem_768_public(key_id: impl Into<String>, public: &[u8]) -> Result<Self> {
        Ok(Key::MlKem768 {
            key_id: key_id.into(),
            public: Box::new(ml_kem_public::<MlKem768>(public, ML_KEM_768)?),
            private: None,
        })
    }
    /// An ML-KEM-1024 key pair from its 64-byte FIPS 203 seed (d || z).
    pub fn ml_kem_1024_from_seed(key_id: impl Into<String>, seed: &[u8]) -> Result<Self> {
        let (dk, ek) = ml_kem_from_seed::<MlKem1024>(seed)?;
        Ok(Key::MlKem1024 {
            key_id: key_id.into(),
            public: Box::new(ek),
            private: Some(Box::new(dk)),
        })
    }
    /// An ML-KEM-1024 recipient (encrypt only), from its 1568-byte encapsulation key.
    pub fn ml_kem_1024_public(key_id: impl Into<String>, public: &[u8]) -> Result<Self> {
        Ok(Key::MlKem1024 {
            key_id: key_id.into(),
            public: Box::new(ml_kem_public::<MlKem1024>(public, ML_KEM_1024)?),
            private: None,
        })
    }
    /// A hybrid key pair from the X25519 private key and the ML-KEM seed.
    pub fn hybrid_from_private(key_id: impl Into<String>, x25519_private: &[u8], ml_kem_seed: &[u8]) -> Result<Self> {
        let xs = x25519_dalek::StaticSecret::from(arr32(x25519_private, "an X25519 private key")?);
        let (dk, ek) = ml_kem_from_seed::<MlKem1024>(ml_kem_seed)?;
        Ok(Key::Hybrid {
            key_id: key_id.into(),
            x25519_public: x25519_dalek::PublicKey::from(&xs),
            ml_kem_public: Box::new(ek),
            x25519_private: Some(xs),
            ml_kem_private: Some(Box::new(dk)),
        })
    }
    /// A hybrid recipient (encrypt only).
    pub fn hybrid_public(key_id: impl Into<String>, x25519_public: &[u8], ml_kem_public_key: &[u8]) -> Result<Self> {
        Ok(Key::Hybrid {
            key_id: key_id.into(),
            x25519_public: x25519_dalek::PublicKey::from(arr32(x25519_public, "an X25519 public key")?),
            ml_kem_public: Box::new(ml_kem_public::<MlKem1024>(ml_kem_public_key, ML_KEM_1024)?),
            x25519_private: None,
            ml_kem_private: None,
        })
    }
    pub fn key_id(&self) -> &str {
        match self {
            Key::Symmetric { key_id, .. }
            | Key::Rsa { key_id, .. }
            | Key::MlKem768 { key_id, .. }
            | Key::MlKem1024 { key_id, .. }
            | Key::Hybrid { key_id, .. } => key_id,
        }
    }
    /// The key type as Python's keyring names it.
    pub fn key_type(&self) -> &'static str {
        match self {
            Key::Symmetric { .. } => "symmetric-256",
            Key::Rsa { public, .. } if public.size() == 384 => "rsa-3072",
            Key::Rsa { .. } => "rsa-4096",
            Key::MlKem768 { .. } => ML_KEM_768,
            Key::MlKem1024 { .. } => ML_KEM_1024,
            Key::Hybrid { .. } => X25519_ML_KEM_1024,
        }
    }
    /// The algorithm this key encrypts with by default (a symmetric key also serves
    /// ChaCha20-Poly1305: [`encrypt_envelope_with`]).
    pub fn algorithm(&self) -> &'static str {
        match self {
            Key::Symmetric { .. } => AES_256_GCM,
            Key::Rsa { public, .. } if public.size() == 384 => RSA_OAEP_3072,
            Key::Rsa { .. } => RSA_OAEP_4096,
            Key::MlKem768 { .. } => ML_KEM_768,
            Key::MlKem1024 { .. } => ML_KEM_1024,
            Key::Hybrid { .. } => X25519_ML_KEM_1024,
        }
    }
    /// True when this key serves `canonical` (an approved algorithm name).
    fn serves(&self, canonical: &str) -> bool {
        match self {
            Key::Symmetric { .. } => canonical == AES_256_GCM || canonical == CHACHA20_POLY1305,
            _ => self.algorithm() == canonical,
        }
    }
    /// The encoded ML-KEM encapsulation key, for ML-KEM and hybrid keys.
    pub fn ml_kem_public_bytes(&self) -> Option<Vec<u8>> {
        match self {
            Key::MlKem768 { public, .. } => Some(public.as_bytes().to_vec()),
            Key::MlKem1024 { public, .. } => Some(public.as_bytes().to_vec()),
            Key::Hybrid { ml_kem_public, .. } => Some(ml_kem_public.as_bytes().to_vec()),
            Key::Symmetric { .. } | Key::Rsa { .. } => None,
        }
    }
}

// ------------------------------------------------------------------ KMS data keys

/// The KMS encryption context Prism binds a wrapped data key to (Python's `_kms_context`).
pub type KmsContext = BTreeMap<String, String>;

/// A fresh data key from a key service: its plaintext (to encrypt with, then dropped) and
/// its copy wrapped under the service's master key (sent in `encapsulated_key`).
#[derive(Clone)]
pub struct DataKey {
    /// The master key's id as the service reports it (e.g. the KMS key ARN): what the
    /// envelope records as `key_id`.
    pub key_id: String,
    pub plaintext: [u8; 32],
    pub wrapped: Vec<u8>,
}

impl std::fmt::Debug for DataKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DataKey({}, {} wrapped bytes)", self.key_id, self.wrapped.len())
    }
}

/// Envelope encryption with a master key that never leaves a key service (AWS KMS in the
/// Python worker: `AwsKmsProvider`, wrap name `aws-kms`). This crate has no KMS client of
/// its own: implement this trait on the service's SDK (e.g. `aws-sdk-kms` GenerateDataKey
/// with KeySpec AES_256 and Decrypt, passing `context` as the EncryptionContext).
/// `wrap_name` is recorded in `algorithm_params.key_wrap` and must equal Python's.
pub trait DataKeyService: Send + Sync {
    fn wrap_name(&self) -> &str;
    fn generate_data_key(&self, key_id: &str, context: &KmsContext) -> Result<DataKey>;
    fn decrypt_data_key(&self, key_id: &str, wrapped: &[u8], context: &KmsContext) -> Result<[u8; 32]>;
}

/// The context of `env`: its message id, namespace and topic.
pub fn kms_context(env: &Envelope) -> KmsContext {
    [
        ("prism:message_id", env.message_id()),
        ("prism:namespace", env.namespace()),
        ("prism:topic", env.topic()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect()
}

// ------------------------------------------------------------------ keyring

/// Keys by id: what a consumer decrypts with; and the key services that unwrap KMS data keys.
#[derive(Clone, Default)]
pub struct Keyring {
    keys: Vec<Key>,
    services: Vec<Arc<dyn DataKeyService>>,
}

impl std::fmt::Debug for Keyring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let wraps: Vec<&str> = self.services.iter().map(|s| s.wrap_name()).collect();
        f.debug_struct("Keyring")
            .field("keys", &self.keys)
            .field("key_services", &wraps)
            .finish()
    }
}

impl Keyring {
    pub fn new(keys: impl IntoIterator<Item = Key>) -> Self {
        Keyring {
            keys: keys.into_iter().collect(),
            services: Vec::new(),
        }
    }
    /// Also unwrap data keys wrapped by `service` (`algorithm_params.key_wrap`).
    pub fn with_data_key_service(mut self, service: Arc<dyn DataKeyService>) -> Self {
        self.services.push(service);
        self
    }
    pub fn get(&self, key_id: &str) -> Result<&Key> {
        self.keys.iter().find(|k| k.key_id() == key_id).ok_or_else(|| {
            err!(
                UnknownKey,
                format!("encryption key {key_id:?} is not in the keyring"),
                "security.encryption.key_id",
                "add the key to the consumer's keyring"
            )
        })
    }
    /// The keys of a Prism keyring file in its JSON form (what `prism keys init` and Python's
    /// `FileKeyring` write; docs/encryption.md), so a Rust consumer decrypts with the same
    /// file as a Python one. Every key type loads, private or public only; rotation windows
    /// are not applied (every key decrypts). Every problem is reported at once (`Config`).
    pub fn from_file_keyring_json(data: &[u8]) -> Result<Self> {
        let doc: serde_json::Value = serde_json::from_slice(data).map_err(|e| {
            err!(
                Config,
                format!("keyring is not JSON: {e}"),
                "keyring",
                "pass the JSON form of a Prism keyring"
            )
        })?;
        let Some(records) = doc.get("keys").and_then(|k| k.as_array()) else {
            return Err(err!(
                Config,
                "keyring has no \"keys\" list",
                "keyring.keys",
                "pass the JSON form of a Prism keyring"
            ));
        };
        let mut keys = Vec::new();
        let mut problems = Vec::new();
        for (i, raw) in records.iter().enumerate() {
            let id = raw.get("id").and_then(|v| v.as_str()).unwrap_or("");
            if id.is_empty() {
                problems.push(format!("keys[{i}]: missing id"));
                continue;
            }
            let s = |name: &str| raw.get(name).and_then(|v| v.as_str());
            let b64 = |name: &str| -> Result<Option<Vec<u8>>> {
                match s(name) {
                    None => Ok(None),
                    Some(v) => base64::engine::general_purpose::STANDARD
                        .decode(v.trim())
                        .map(Some)
                        .map_err(|_| {
                            err!(
                                Config,
                                format!("{id:?}: field {name} is not valid base64"),
                                "keyring",
                                ""
                            )
                        }),
                }
            };
            let typ = s("type").unwrap_or("");
            let key = (|| -> Result<Option<Key>> {
                Ok(match typ {
                    "symmetric-256" => b64("secret")?.map(|b| Key::symmetric(id, &b)).transpose()?,
                    "rsa-3072" | "rsa-4096" => match (s("private_pem"), s("public_pem")) {
                        (Some(p), _) => Some(Key::rsa_private_pem(id, p)?),
                        (None, Some(p)) => Some(Key::rsa_public_pem(id, p)?),
                        _ => None,
                    },
                    "ml-kem-768" => match (b64("private_seed")?, b64("public")?) {
                        (Some(seed), _) => Some(Key::ml_kem_768_from_seed(id, &seed)?),
                        (None, Some(p)) => Some(Key::ml_kem_768_public(id, &p)?),
                        _ => None,
                    },
                    "ml-kem-1024" => match (b64("private_seed")?, b64("public")?) {
                        (Some(seed), _) => Some(Key::ml_kem_1024_from_seed(id, &seed)?),
                        (None, Some(p)) => Some(Key::ml_kem_1024_public(id, &p)?),
                        _ => None,
                    },
                    X25519_ML_KEM_1024 => match (
                        b64("x25519_private")?,
                        b64("ml_kem_private_seed")?,
                        b64("x25519_public")?,
                        b64("ml_kem_public")?,
                    ) {
                        (Some(x), Some(m), _, _) => Some(Key::hybrid_from_private(id, &x, &m)?),
                        (_, _, Some(x), Some(m)) => Some(Key::hybrid_public(id, &x, &m)?),
                        _ => None,
                    },
                    other => {
                        return Err(err!(
                            Config,
                            format!("{id:?}: unknown key type {other:?}"),
                            "keyring",
                            ""
                        ));
                    }
                })
            })();
            match key {
                Ok(Some(k)) if typ.starts_with("rsa") && k.key_type() != typ => {
                    problems.push(format!("{id:?}: a {} key labelled {typ}", k.key_type()));
                }
                Ok(Some(k)) => keys.push(k),
                Ok(None) => problems.push(format!("{id:?}: no key material")),
                Err(e) => problems.push(format!("{id:?}: {}", e.detail().what)),
            }
        }
        if !problems.is_empty() {
            return Err(err!(
                Config,
                format!("keyring does not load: {}", problems.join("; ")),
                "keyring",
                "fix the listed keys"
            ));
        }
        Ok(Keyring::new(keys))
    }
    fn service(&self, wrap: &str) -> Option<&dyn DataKeyService> {
        self.services.iter().find(|s| s.wrap_name() == wrap).map(|s| s.as_ref())
    }
}

// ------------------------------------------------------------------ primitives

/// The AAD (docs/encryption.md, "AAD: the exact bytes").
pub fn build_aad(message_id: &str, namespace: &str, topic: &str, algorithm: &str, key_id: &str) -> Vec<u8> {
    let mut out = AAD_PREFIX.to_vec();
    for s in [message_id, namespace, topic, algorithm, key_id] {
        out.extend_from_slice(&(s.len() as u32).to_be_bytes());
        out.extend_from_slice(s.as_bytes());
    }
    out
}

fn envelope_aad(env: &Envelope, algorithm: &str, key_id: &str) -> Vec<u8> {
    build_aad(env.message_id(), env.namespace(), env.topic(), algorithm, key_id)
}

fn hybrid_key(x_ss: &[u8], m_ss: &[u8], eph_pub: &[u8], recipient_pub: &[u8]) -> [u8; 32] {
    let ikm = [x_ss, m_ss].concat();
    let info = [HYBRID_KDF_INFO, eph_pub, recipient_pub].concat();
    let mut okm = [0u8; 32];
    // 32 bytes is far below HKDF-SHA256's limit (255 * 32), so expand cannot fail.
    let _ = hkdf::Hkdf::<Sha256>::new(Some(HYBRID_KDF_SALT), &ikm).expand(&info, &mut okm);
    okm
}

/// RFC-031 rev. 2's derivation (`x25519-kyber1024`, read only): HKDF-Extract(SHA-256,
/// salt = nil, x25519_ss || kyber_ss), i.e. HMAC-SHA256(32 zero bytes, ikm).
fn legacy_hybrid_key(x_ss: &[u8], m_ss: &[u8]) -> [u8; 32] {
    let (prk, _) = hkdf::Hkdf::<Sha256>::extract(None, &[x_ss, m_ss].concat());
    let mut out = [0u8; 32];
    out.copy_from_slice(&prk);
    out
}

fn aead_open(alg: &str, key: &[u8; 32], iv: &[u8], ciphertext: &[u8], aad: &[u8]) -> Result<Vec<u8>> {
    let payload = AeadPayload { msg: ciphertext, aad };
    let out = if alg == CHACHA20_POLY1305 {
        ChaCha20Poly1305::new(key.into()).decrypt(chacha20poly1305::Nonce::from_slice(iv), payload)
    } else {
        Aes256Gcm::new(key.into()).decrypt(Nonce::from_slice(iv), payload)
    };
    out.map_err(|_| fail(OPAQUE, "payload"))
}

fn aead_seal(alg: &str, key: &[u8; 32], iv: &[u8], plaintext: &[u8], aad: &[u8]) -> Result<Vec<u8>> {
    let payload = AeadPayload { msg: plaintext, aad };
    let out = if alg == CHACHA20_POLY1305 {
        ChaCha20Poly1305::new(key.into()).encrypt(chacha20poly1305::Nonce::from_slice(iv), payload)
    } else {
        Aes256Gcm::new(key.into()).encrypt(Nonce::from_slice(iv), payload)
    };
    out.map_err(|_| {
        err!(
            Encryption,
            format!("{alg} refused the payload (too large)"),
            "payload",
            "split the message"
        )
    })
}

/// OAEP-SHA256 with the AAD as label. The `rsa` crate takes the label as a `String`; an AAD
/// that is not UTF-8 (a field of 128 bytes or more puts a non-ASCII byte in its length
/// prefix) cannot be passed, and is refused with a typed error rather than mangled.
fn oaep(aad: &[u8]) -> Result<Oaep> {
    let label = String::from_utf8(aad.to_vec()).map_err(|_| {
        err!(
            Algorithm,
            "RSA-OAEP with this envelope's AAD is not supported by the Rust client (a message id, namespace, \
             topic or key id of 128 bytes or more)",
            "security.encryption.aad",
            "use ml-kem-1024, x25519-ml-kem-1024 or aes-256-gcm for such envelopes, or read them with the Python SDK"
        )
    })?;
    Ok(Oaep::new_with_label::<Sha256, _>(label))
}

fn ml_kem_decap<P: KemCore>(dk: &P::DecapsulationKey, encap: &[u8]) -> Result<[u8; 32]> {
    let ct =
        ml_kem::Ciphertext::<P>::try_from(encap).map_err(|_| fail(OPAQUE, "security.encryption.encapsulated_key"))?;
    let ss = dk
        .decapsulate(&ct)
        .map_err(|_| fail(OPAQUE, "security.encryption.encapsulated_key"))?;
    let mut out = [0u8; 32];
    out.copy_from_slice(ss.as_slice());
    Ok(out)
}

fn ml_kem_encap<P: KemCore>(ek: &P::EncapsulationKey) -> Result<(Vec<u8>, [u8; 32])> {
    let (ct, ss) = ek
        .encapsulate(&mut aes_gcm::aead::OsRng)
        .map_err(|_| err!(Encryption, "ML-KEM encapsulation failed", "key", ""))?;
    let mut k = [0u8; 32];
    k.copy_from_slice(ss.as_slice());
    Ok((ct.to_vec(), k))
}

/// What decryption derived on the way (tests compare these with the conformance vectors).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Derived {
    pub aad: Vec<u8>,
    pub x25519_shared_secret: Option<[u8; 32]>,
    pub ml_kem_shared_secret: Option<[u8; 32]>,
    /// The AEAD key (for RSA direct mode, where there is none: all zero).
    pub aead_key: [u8; 32],
}

/// Decrypt the payload; returns the plaintext bytes as they were before encryption.
pub fn decrypt_envelope(env: &Envelope, keys: &Keyring) -> Result<Vec<u8>> {
    decrypt_with_details(env, keys).map(|(p, _)| p)
}

/// [`decrypt_envelope`], also returning the derived secrets (default policy).
pub fn decrypt_with_details(env: &Envelope, keys: &Keyring) -> Result<(Vec<u8>, Derived)> {
    decrypt_with_policy(env, keys, &Policy::default())
}

type Params = serde_json::Map<String, serde_json::Value>;

fn params_of(meta: &v1::EncryptionMetadata) -> Result<Params> {
    match meta.algorithm_params.as_deref() {
        None | Some("") => Ok(Params::default()),
        // serde_json stops at 128 levels: deep nesting is an error, not a stack overflow.
        Some(p) => match serde_json::from_str::<serde_json::Value>(p) {
            Ok(serde_json::Value::Object(m)) => Ok(m),
            Ok(_) => Err(fail(
                "algorithm_params must be a JSON object",
                "security.encryption.algorithm_params",
            )),
            Err(_) => Err(fail(
                "algorithm_params is not valid JSON",
                "security.encryption.algorithm_params",
            )),
        },
    }
}

/// A parameter's value when present, as Python's `params.get(name, default)` compares it:
/// anything but the expected string is a mismatch.
fn param_is(params: &Params, name: &str, default: &str, want: &str) -> bool {
    match params.get(name) {
        None => default == want,
        Some(serde_json::Value::String(s)) => s == want,
        Some(_) => false,
    }
}

/// Python's truthiness of a JSON value (`if wrap:`).
fn truthy(v: &serde_json::Value) -> bool {
    match v {
        serde_json::Value::Null => false,
        serde_json::Value::Bool(b) => *b,
        serde_json::Value::Number(n) => n.as_f64() != Some(0.0),
        serde_json::Value::String(s) => !s.is_empty(),
        serde_json::Value::Array(a) => !a.is_empty(),
        serde_json::Value::Object(o) => !o.is_empty(),
    }
}

fn iv_of(meta: &v1::EncryptionMetadata) -> Result<&[u8]> {
    let iv = meta.iv.as_deref().unwrap_or(&[]);
    if iv.len() != NONCE_BYTES {
        return Err(fail(
            &format!("iv is {} bytes; a 96-bit nonce is required", iv.len()),
            "security.encryption.iv",
        ));
    }
    Ok(iv)
}

/// [`decrypt_with_details`] under `policy` (FIPS mode, allowlist), as Python's
/// `decrypt_envelope(policy=...)`. The AAD is always required.
pub fn decrypt_with_policy(env: &Envelope, keys: &Keyring, policy: &Policy) -> Result<(Vec<u8>, Derived)> {
    let meta = env
        .security()
        .and_then(|s| s.encryption.as_ref())
        .ok_or_else(|| fail("envelope is not encrypted", "security.encryption"))?;
    let spec = policy.check(&meta.algorithm, true)?;
    if meta.encryption_type != 0 && meta.encryption_type != spec.encryption_type() as i32 {
        return Err(fail(
            &format!(
                "encryption_type {} does not match algorithm {:?}",
                meta.encryption_type, meta.algorithm
            ),
            "security.encryption.encryption_type",
        ));
    }
    let kid = meta.key_id.as_str();
    if kid.is_empty() {
        return Err(fail(
            "key_id is empty: the consumer cannot know which key decrypts",
            "security.encryption.key_id",
        ));
    }
    let aad = envelope_aad(env, &meta.algorithm, kid);
    if !ct_eq(meta.aad.as_deref().unwrap_or(&[]), &aad) {
        return Err(fail(
            "aad does not match this envelope's message id, namespace, topic, algorithm or key id \
            (the ciphertext was moved to another envelope or its metadata changed)",
            "security.encryption.aad",
        ));
    }
    let params = params_of(meta)?;
    let ciphertext = env.payload.as_ref().map(|p| p.value.as_slice()).unwrap_or(&[]);
    let encap = meta.encapsulated_key.as_deref().unwrap_or(&[]);
    let canonical = spec.canonical();
    let mut derived = Derived {
        aad: aad.clone(),
        ..Default::default()
    };
    // A KMS-wrapped data key: the key service, not the keyring, holds the key.
    if spec.pattern == Pattern::Symmetric {
        if let Some(wrap) = params.get("key_wrap").filter(|w| truthy(w)) {
            let service = wrap.as_str().and_then(|w| keys.service(w)).ok_or_else(|| {
                err!(
                    KeyNotUsable,
                    format!("the data key is wrapped by {wrap}; no key service for it is in this keyring"),
                    "security.encryption.algorithm_params",
                    format!("add a DataKeyService named {wrap} (Keyring::with_data_key_service)")
                )
            })?;
            if encap.is_empty() {
                return Err(fail(
                    "encapsulated_key (the wrapped data key) is missing",
                    "security.encryption.encapsulated_key",
                ));
            }
            derived.aead_key = service.decrypt_data_key(kid, encap, &kms_context(env))?;
            let plain = aead_open(canonical, &derived.aead_key, iv_of(meta)?, ciphertext, &aad)?;
            return Ok((plain, derived));
        }
    }
    let key = keys.get(kid)?;
    if !key.serves(canonical) {
        return Err(err!(
            KeyNotUsable,
            format!(
                "key {kid:?} is a {} key; {} needs another type",
                key.key_type(),
                spec.name
            ),
            "security.encryption.key_id",
            "the key id in the envelope names a key of another type in this keyring"
        ));
    }
    let no_private = || {
        err!(
            KeyNotUsable,
            format!("key {kid:?} is public only"),
            "security.encryption.key_id",
            "decrypting needs the private key"
        )
    };
    derived.aead_key = match key {
        Key::Symmetric { secret, .. } => {
            let iv = iv_of(meta)?;
            let plain = aead_open(canonical, secret, iv, ciphertext, &aad)?;
            derived.aead_key = *secret;
            return Ok((plain, derived));
        }
        Key::Rsa { private, .. } => {
            let private = private.as_deref().ok_or_else(no_private)?;
            if !param_is(&params, "oaep", "sha-256", "sha-256") {
                return Err(fail(
                    &format!("unsupported OAEP hash {:?}", params.get("oaep")),
                    "security.encryption.algorithm_params",
                ));
            }
            if param_is(&params, "mode", "direct", "direct") {
                let plain = private
                    .decrypt(oaep(&aad)?, ciphertext)
                    .map_err(|_| fail(OPAQUE, "payload"))?;
                return Ok((plain, derived));
            }
            if !param_is(&params, "mode", "direct", "wrapped") || !param_is(&params, "dem", AES_256_GCM, AES_256_GCM) {
                return Err(fail(
                    &format!("unsupported RSA mode {:?}", params.get("mode")),
                    "security.encryption.algorithm_params",
                ));
            }
            iv_of(meta)?;
            let cek = private
                .decrypt(oaep(&aad)?, encap)
                .map_err(|_| fail(OPAQUE, "security.encryption.encapsulated_key"))?;
            <[u8; 32]>::try_from(cek.as_slice()).map_err(|_| fail(OPAQUE, "security.encryption.encapsulated_key"))?
        }
        Key::MlKem768 { private, .. } => {
            let ss = ml_kem_decap::<MlKem768>(private.as_deref().ok_or_else(no_private)?, encap)?;
            derived.ml_kem_shared_secret = Some(ss);
            ss
        }
        Key::MlKem1024 { private, .. } => {
            let ss = ml_kem_decap::<MlKem1024>(private.as_deref().ok_or_else(no_private)?, encap)?;
            derived.ml_kem_shared_secret = Some(ss);
            ss
        }
        Key::Hybrid {
            x25519_public,
            x25519_private,
            ml_kem_private,
            ..
        } => {
            let (xs, dk) = match (x25519_private, ml_kem_private) {
                (Some(x), Some(m)) => (x, m),
                _ => return Err(no_private()),
            };
            let legacy = spec.legacy_of.is_some();
            if !legacy && !param_is(&params, "kdf", "hkdf-sha256", "hkdf-sha256") {
                return Err(fail(
                    &format!("unsupported KDF {:?}", params.get("kdf")),
                    "security.encryption.algorithm_params",
                ));
            }
            let eph = params
                .get("x25519_ephemeral_public")
                .and_then(|v| v.as_str())
                .and_then(|s| base64::engine::general_purpose::STANDARD.decode(s).ok())
                .and_then(|b| <[u8; 32]>::try_from(b.as_slice()).ok())
                .ok_or_else(|| {
                    fail(
                        "algorithm_params.x25519_ephemeral_public is missing or not 32 bytes of base64",
                        "security.encryption.algorithm_params",
                    )
                })?;
            iv_of(meta)?;
            let x_ss = xs.diffie_hellman(&x25519_dalek::PublicKey::from(eph));
            if !x_ss.was_contributory() {
                return Err(fail(OPAQUE, "security.encryption.algorithm_params"));
            }
            let m_ss = ml_kem_decap::<MlKem1024>(dk, encap)?;
            derived.x25519_shared_secret = Some(*x_ss.as_bytes());
            derived.ml_kem_shared_secret = Some(m_ss);
            if legacy {
                legacy_hybrid_key(x_ss.as_bytes(), &m_ss)
            } else {
                hybrid_key(x_ss.as_bytes(), &m_ss, &eph, x25519_public.as_bytes())
            }
        }
    };
    let plain = aead_open(AES_256_GCM, &derived.aead_key, iv_of(meta)?, ciphertext, &aad)?;
    Ok((plain, derived))
}

/// A copy of the envelope with the plaintext payload and without `security.encryption`; the
/// signature is removed too, because it covered the ciphertext.
pub fn decrypt_to_envelope(env: &Envelope, keys: &Keyring) -> Result<Envelope> {
    let plain = decrypt_envelope(env, keys)?;
    let mut out = env.clone();
    if let Some(p) = out.payload.as_mut() {
        p.value = plain;
    }
    if let Some(s) = out.header.security.as_mut() {
        s.encryption = None;
        s.signature = None;
        s.signature_algorithm = None;
        s.signature_key_id = None;
        s.signature_scope = None;
        s.sibling_digest = None;
        s.tree_index = None;
        s.tree_size = None;
        s.tree_path = None;
    }
    Ok(out)
}

fn refuse_encrypted(env: &Envelope) -> Result<()> {
    if env.is_encrypted() {
        return Err(err!(
            Encryption,
            "payload is already encrypted",
            "security.encryption",
            "encrypt once"
        ));
    }
    Ok(())
}

fn new_iv() -> [u8; NONCE_BYTES] {
    let mut iv = [0u8; NONCE_BYTES];
    random_bytes(&mut iv);
    iv
}

/// Encrypt the payload in place for `key` with its default algorithm (AES-256-GCM for a
/// shared key, RSA-OAEP, ML-KEM-768/1024, or the X25519 + ML-KEM-1024 hybrid). Sign
/// afterwards, never before.
pub fn encrypt_envelope(env: &mut Envelope, key: &Key) -> Result<()> {
    encrypt_envelope_with(env, key, key.algorithm())
}

/// Encrypt the payload in place for `key` with `algorithm` (e.g. `chacha20-poly1305` with a
/// shared key); the name is checked as Python checks it (legacy spellings refused).
pub fn encrypt_envelope_with(env: &mut Envelope, key: &Key, algorithm: &str) -> Result<()> {
    refuse_encrypted(env)?;
    let spec = lookup(algorithm, false)?;
    let alg = spec.name;
    if !key.serves(alg) {
        return Err(err!(
            KeyNotUsable,
            format!(
                "key {:?} is a {} key; {alg} needs another type",
                key.key_id(),
                key.key_type()
            ),
            "security.encryption.key_id",
            "pass a key of the algorithm's type"
        ));
    }
    let key_id = key.key_id().to_owned();
    let aad = envelope_aad(env, alg, &key_id);
    let mut meta = v1::EncryptionMetadata {
        key_id: key_id.clone(),
        encryption_type: spec.encryption_type() as i32,
        algorithm: alg.to_owned(),
        aad: Some(aad.clone()),
        ..Default::default()
    };
    let plaintext = env.payload.as_ref().map(|p| p.value.as_slice()).unwrap_or(&[]);
    let mut rng = aes_gcm::aead::OsRng;
    let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
    let (aead_alg, aead_key): (&str, [u8; 32]) = match key {
        Key::Symmetric { secret, .. } => (alg, *secret),
        Key::Rsa { public, .. } => {
            let limit = public.size() - OAEP_OVERHEAD;
            if plaintext.len() <= limit {
                let ct = public
                    .encrypt(&mut rng, oaep(&aad)?, plaintext)
                    .map_err(|_| err!(Encryption, "RSA-OAEP encryption failed", "payload", ""))?;
                meta.algorithm_params = Some(r#"{"mode":"direct","oaep":"sha-256","oaep_label":"aad"}"#.to_owned());
                set_ciphertext(env, ct, meta);
                return Ok(());
            }
            let mut cek = [0u8; 32];
            random_bytes(&mut cek);
            let wrapped = public
                .encrypt(&mut rng, oaep(&aad)?, &cek)
                .map_err(|_| err!(Encryption, "RSA-OAEP key wrap failed", "key", ""))?;
            meta.encapsulated_key = Some(wrapped);
            meta.algorithm_params =
                Some(r#"{"mode":"wrapped","oaep":"sha-256","oaep_label":"aad","dem":"aes-256-gcm"}"#.to_owned());
            (AES_256_GCM, cek)
        }
        Key::MlKem768 { public, .. } => {
            let (ct, ss) = ml_kem_encap::<MlKem768>(public)?;
            meta.encapsulated_key = Some(ct);
            meta.algorithm_params = Some(r#"{"kem":"ml-kem-768","dem":"aes-256-gcm","kdf":"none"}"#.to_owned());
            (AES_256_GCM, ss)
        }
        Key::MlKem1024 { public, .. } => {
            let (ct, ss) = ml_kem_encap::<MlKem1024>(public)?;
            meta.encapsulated_key = Some(ct);
            meta.algorithm_params = Some(r#"{"kem":"ml-kem-1024","dem":"aes-256-gcm","kdf":"none"}"#.to_owned());
            (AES_256_GCM, ss)
        }
        Key::Hybrid {
            x25519_public,
            ml_kem_public,
            ..
        } => {
            let eph = x25519_dalek::EphemeralSecret::random_from_rng(rng);
            let eph_pub = x25519_dalek::PublicKey::from(&eph);
            let x_ss = eph.diffie_hellman(x25519_public);
            let (ct, m_ss) = ml_kem_encap::<MlKem1024>(ml_kem_public)?;
            meta.encapsulated_key = Some(ct);
            meta.algorithm_params = Some(
                serde_json::json!({
                    "x25519_ephemeral_public": b64(eph_pub.as_bytes()),
                    "kdf": "hkdf-sha256",
                    "kdf_salt": b64(HYBRID_KDF_SALT),
                    "kdf_info_prefix": b64(HYBRID_KDF_INFO),
                    "dem": "aes-256-gcm",
                })
                .to_string(),
            );
            (
                AES_256_GCM,
                hybrid_key(x_ss.as_bytes(), &m_ss, eph_pub.as_bytes(), x25519_public.as_bytes()),
            )
        }
    };
    let iv = new_iv();
    let ct = aead_seal(aead_alg, &aead_key, &iv, plaintext, &aad)?;
    meta.iv = Some(iv.to_vec());
    set_ciphertext(env, ct, meta);
    Ok(())
}

fn set_ciphertext(env: &mut Envelope, ciphertext: Vec<u8>, meta: v1::EncryptionMetadata) {
    env.payload.get_or_insert_with(Default::default).value = ciphertext;
    env.security_mut().encryption = Some(meta);
}

/// Encrypt the payload in place with a fresh data key from `service` under its master key
/// `key_id` (AES-256-GCM or ChaCha20-Poly1305): the wrapped key goes to `encapsulated_key`,
/// the service's key id to `key_id`, and `{"key_wrap": <wrap name>}` to `algorithm_params`,
/// as Python's KMS path writes them.
pub fn encrypt_envelope_with_data_key(
    env: &mut Envelope,
    service: &dyn DataKeyService,
    key_id: &str,
    algorithm: &str,
) -> Result<()> {
    refuse_encrypted(env)?;
    let spec = lookup(algorithm, false)?;
    if spec.pattern != Pattern::Symmetric {
        return Err(err!(
            KeyNotUsable,
            format!("a key service serves symmetric data keys only, not {}", spec.name),
            "security.encryption.algorithm",
            "use aes-256-gcm or chacha20-poly1305 with a key service"
        ));
    }
    let dk = service.generate_data_key(key_id, &kms_context(env))?;
    let aad = envelope_aad(env, spec.name, &dk.key_id);
    let iv = new_iv();
    let plaintext = env.payload.as_ref().map(|p| p.value.as_slice()).unwrap_or(&[]);
    let ct = aead_seal(spec.name, &dk.plaintext, &iv, plaintext, &aad)?;
    let meta = v1::EncryptionMetadata {
        key_id: dk.key_id.clone(),
        encryption_type: spec.encryption_type() as i32,
        algorithm: spec.name.to_owned(),
        iv: Some(iv.to_vec()),
        aad: Some(aad),
        encapsulated_key: Some(dk.wrapped),
        algorithm_params: Some(serde_json::json!({ "key_wrap": service.wrap_name() }).to_string()),
        ..Default::default()
    };
    set_ciphertext(env, ct, meta);
    Ok(())
}

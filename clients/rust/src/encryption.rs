//! Payload encryption (docs/encryption.md; the Rust twin of `app/security/encryption.py`):
//! AES-256-GCM with a shared key, ML-KEM-1024, and the X25519 + ML-KEM-1024 hybrid, with
//! the AAD that binds a ciphertext to its envelope. Only `payload.value` is encrypted.
//!
//! Every cryptographic failure is one opaque `PrismError::Decryption` (no oracle on which
//! step failed); key lookups fail with `UnknownKey` / `KeyNotUsable`.

use aes_gcm::aead::{Aead, KeyInit, Payload as AeadPayload};
use aes_gcm::{Aes256Gcm, Nonce};
use base64::Engine;
use ml_kem::kem::{Decapsulate, Encapsulate};
use ml_kem::{EncodedSizeUser, KemCore, MlKem1024};
use sha2::Sha256;
use subtle_eq::ct_eq;

use crate::error::{err, PrismError, Result};
use crate::gen::v1::{self, EncryptionType};
use crate::model::{random_bytes, Envelope};

pub const AES_256_GCM: &str = "aes-256-gcm";
pub const ML_KEM_1024: &str = "ml-kem-1024";
pub const X25519_ML_KEM_1024: &str = "x25519-ml-kem-1024";
pub const AAD_PREFIX: &[u8] = b"prism-envelope-aad/v1\x00";
pub const HYBRID_KDF_SALT: &[u8] = b"prism-envelope/x25519-ml-kem-1024/v1";
pub const HYBRID_KDF_INFO: &[u8] = b"prism-envelope payload key";
const NONCE_BYTES: usize = 12;
const OPAQUE: &str =
    "payload does not decrypt (wrong key, or the ciphertext, iv, aad, encapsulated key or parameters were changed)";

type DK = <MlKem1024 as KemCore>::DecapsulationKey;
type EK = <MlKem1024 as KemCore>::EncapsulationKey;

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

/// A key of one of the supported types. The private parts are optional: a producer that only
/// encrypts to a recipient holds its public keys. Debug output never shows material.
#[derive(Clone)]
pub enum Key {
    /// `symmetric-256`: 32 shared bytes.
    Symmetric { key_id: String, secret: [u8; 32] },
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

fn ml_kem_from_seed(seed: &[u8]) -> Result<(DK, EK)> {
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
    Ok(MlKem1024::generate_deterministic(&d, &z))
}

fn ml_kem_public(b: &[u8]) -> Result<EK> {
    let enc = ml_kem::Encoded::<EK>::try_from(b).map_err(|_| {
        err!(
            KeyNotUsable,
            format!("an ML-KEM-1024 public key is 1568 bytes, not {}", b.len()),
            "key",
            "pass the encoded key"
        )
    })?;
    Ok(EK::from_bytes(&enc))
}

impl Key {
    pub fn symmetric(key_id: impl Into<String>, secret: &[u8]) -> Result<Self> {
        Ok(Key::Symmetric {
            key_id: key_id.into(),
            secret: arr32(secret, "a symmetric-256 key")?,
        })
    }
    /// An ML-KEM-1024 key pair from its 64-byte FIPS 203 seed (d || z).
    pub fn ml_kem_1024_from_seed(key_id: impl Into<String>, seed: &[u8]) -> Result<Self> {
        let (dk, ek) = ml_kem_from_seed(seed)?;
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
            public: Box::new(ml_kem_public(public)?),
            private: None,
        })
    }
    /// A hybrid key pair from the X25519 private key and the ML-KEM seed.
    pub fn hybrid_from_private(key_id: impl Into<String>, x25519_private: &[u8], ml_kem_seed: &[u8]) -> Result<Self> {
        let xs = x25519_dalek::StaticSecret::from(arr32(x25519_private, "an X25519 private key")?);
        let (dk, ek) = ml_kem_from_seed(ml_kem_seed)?;
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
            ml_kem_public: Box::new(ml_kem_public(ml_kem_public_key)?),
            x25519_private: None,
            ml_kem_private: None,
        })
    }
    pub fn key_id(&self) -> &str {
        match self {
            Key::Symmetric { key_id, .. } | Key::MlKem1024 { key_id, .. } | Key::Hybrid { key_id, .. } => key_id,
        }
    }
    pub fn key_type(&self) -> &'static str {
        match self {
            Key::Symmetric { .. } => "symmetric-256",
            Key::MlKem1024 { .. } => ML_KEM_1024,
            Key::Hybrid { .. } => X25519_ML_KEM_1024,
        }
    }
    /// The algorithm this key is used with.
    pub fn algorithm(&self) -> &'static str {
        match self {
            Key::Symmetric { .. } => AES_256_GCM,
            Key::MlKem1024 { .. } => ML_KEM_1024,
            Key::Hybrid { .. } => X25519_ML_KEM_1024,
        }
    }
    /// The public part of the ML-KEM encapsulation key (1568 bytes), for hybrid and ML-KEM keys.
    pub fn ml_kem_public_bytes(&self) -> Option<Vec<u8>> {
        match self {
            Key::MlKem1024 { public, .. } => Some(public.as_bytes().to_vec()),
            Key::Hybrid { ml_kem_public, .. } => Some(ml_kem_public.as_bytes().to_vec()),
            Key::Symmetric { .. } => None,
        }
    }
}

/// Keys by id: what a consumer decrypts with.
#[derive(Debug, Clone, Default)]
pub struct Keyring {
    keys: Vec<Key>,
}

impl Keyring {
    pub fn new(keys: impl IntoIterator<Item = Key>) -> Self {
        Keyring {
            keys: keys.into_iter().collect(),
        }
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
}

/// The canonical algorithm name: case-insensitive, `_` counts as `-`; deprecated and unknown
/// names are refused (`Algorithm`), as in Python.
pub fn canonical_algorithm(name: &str) -> Result<&'static str> {
    let n = name.to_ascii_lowercase().replace('_', "-");
    match n.as_str() {
        AES_256_GCM => Ok(AES_256_GCM),
        ML_KEM_1024 => Ok(ML_KEM_1024),
        X25519_ML_KEM_1024 => Ok(X25519_ML_KEM_1024),
        s if s.starts_with("aes-128") || s.contains("des") || s.contains("rc4") => Err(err!(
            Algorithm,
            format!("algorithm {name:?} is deprecated"),
            "security.encryption.algorithm",
            "use aes-256-gcm"
        )),
        _ => Err(err!(
            Algorithm,
            format!("algorithm {name:?} is not supported by the Rust client"),
            "security.encryption.algorithm",
            "use aes-256-gcm, ml-kem-1024 or x25519-ml-kem-1024"
        )),
    }
}

fn expected_type(alg: &str) -> EncryptionType {
    match alg {
        AES_256_GCM => EncryptionType::Symmetric,
        ML_KEM_1024 => EncryptionType::PostQuantum,
        _ => EncryptionType::Hybrid,
    }
}

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

fn aead_open(key: &[u8; 32], iv: &[u8], ciphertext: &[u8], aad: &[u8]) -> Result<Vec<u8>> {
    let cipher = Aes256Gcm::new(key.into());
    cipher
        .decrypt(Nonce::from_slice(iv), AeadPayload { msg: ciphertext, aad })
        .map_err(|_| fail(OPAQUE, "payload"))
}

fn aead_seal(key: &[u8; 32], iv: &[u8], plaintext: &[u8], aad: &[u8]) -> Result<Vec<u8>> {
    let cipher = Aes256Gcm::new(key.into());
    cipher
        .encrypt(Nonce::from_slice(iv), AeadPayload { msg: plaintext, aad })
        .map_err(|_| {
            err!(
                Encryption,
                "AES-256-GCM refused the payload (too large)",
                "payload",
                "split the message"
            )
        })
}

/// What decryption derived on the way (tests compare these with the conformance vectors).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Derived {
    pub aad: Vec<u8>,
    pub x25519_shared_secret: Option<[u8; 32]>,
    pub ml_kem_shared_secret: Option<[u8; 32]>,
    pub aead_key: [u8; 32],
}

/// Decrypt the payload; returns the plaintext bytes as they were before encryption.
pub fn decrypt_envelope(env: &Envelope, keys: &Keyring) -> Result<Vec<u8>> {
    decrypt_with_details(env, keys).map(|(p, _)| p)
}

/// [`decrypt_envelope`], also returning the derived secrets.
pub fn decrypt_with_details(env: &Envelope, keys: &Keyring) -> Result<(Vec<u8>, Derived)> {
    let meta = env
        .security()
        .and_then(|s| s.encryption.as_ref())
        .ok_or_else(|| fail("envelope is not encrypted", "security.encryption"))?;
    let alg = canonical_algorithm(&meta.algorithm)?;
    if meta.encryption_type != 0 && meta.encryption_type != expected_type(alg) as i32 {
        return Err(fail(
            &format!(
                "encryption_type {} does not match algorithm {:?}",
                meta.encryption_type, meta.algorithm
            ),
            "security.encryption.encryption_type",
        ));
    }
    if meta.key_id.is_empty() {
        return Err(fail(
            "key_id is empty: the consumer cannot know which key decrypts",
            "security.encryption.key_id",
        ));
    }
    let aad = envelope_aad(env, &meta.algorithm, &meta.key_id);
    if !ct_eq(meta.aad.as_deref().unwrap_or(&[]), &aad) {
        return Err(fail(
            "aad does not match this envelope's message id, namespace, topic, algorithm or key id \
            (the ciphertext was moved to another envelope or its metadata changed)",
            "security.encryption.aad",
        ));
    }
    let params: serde_json::Map<String, serde_json::Value> = match meta.algorithm_params.as_deref() {
        None | Some("") => Default::default(),
        Some(p) => match serde_json::from_str::<serde_json::Value>(p) {
            Ok(serde_json::Value::Object(m)) => m,
            Ok(_) => {
                return Err(fail(
                    "algorithm_params must be a JSON object",
                    "security.encryption.algorithm_params",
                ))
            }
            Err(_) => {
                return Err(fail(
                    "algorithm_params is not valid JSON",
                    "security.encryption.algorithm_params",
                ))
            }
        },
    };
    let key = keys.get(&meta.key_id)?;
    if key.algorithm() != alg {
        return Err(err!(
            KeyNotUsable,
            format!(
                "key {:?} is a {} key; {alg} needs another type",
                meta.key_id,
                key.key_type()
            ),
            "security.encryption.key_id",
            "the key id names a key of another type in this keyring"
        ));
    }
    let iv = meta.iv.as_deref().unwrap_or(&[]);
    if iv.len() != NONCE_BYTES {
        return Err(fail(
            &format!("iv is {} bytes; a 96-bit nonce is required", iv.len()),
            "security.encryption.iv",
        ));
    }
    let ciphertext = env.payload.as_ref().map(|p| p.value.as_slice()).unwrap_or(&[]);
    let encap = meta.encapsulated_key.as_deref().unwrap_or(&[]);
    let no_private = || {
        err!(
            KeyNotUsable,
            format!("key {:?} is public only", meta.key_id),
            "security.encryption.key_id",
            "decrypting needs the private key"
        )
    };
    let mut derived = Derived {
        aad: aad.clone(),
        ..Default::default()
    };
    let decap = |dk: &DK| -> Result<[u8; 32]> {
        let ct = ml_kem::Ciphertext::<MlKem1024>::try_from(encap)
            .map_err(|_| fail(OPAQUE, "security.encryption.encapsulated_key"))?;
        let ss = dk
            .decapsulate(&ct)
            .map_err(|_| fail(OPAQUE, "security.encryption.encapsulated_key"))?;
        let mut out = [0u8; 32];
        out.copy_from_slice(ss.as_slice());
        Ok(out)
    };
    derived.aead_key = match key {
        Key::Symmetric { secret, .. } => *secret,
        Key::MlKem1024 { private, .. } => {
            let ss = decap(private.as_deref().ok_or_else(no_private)?)?;
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
            match params.get("kdf") {
                None => {}
                Some(serde_json::Value::String(s)) if s == "hkdf-sha256" => {}
                Some(other) => {
                    return Err(fail(
                        &format!("unsupported KDF {other}"),
                        "security.encryption.algorithm_params",
                    ))
                }
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
            let x_ss = xs.diffie_hellman(&x25519_dalek::PublicKey::from(eph));
            if !x_ss.was_contributory() {
                return Err(fail(OPAQUE, "security.encryption.algorithm_params"));
            }
            let m_ss = decap(dk)?;
            derived.x25519_shared_secret = Some(*x_ss.as_bytes());
            derived.ml_kem_shared_secret = Some(m_ss);
            hybrid_key(x_ss.as_bytes(), &m_ss, &eph, x25519_public.as_bytes())
        }
    };
    let plain = aead_open(&derived.aead_key, iv, ciphertext, &aad)?;
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

/// Encrypt the payload in place for `key` (its algorithm: AES-256-GCM for a shared key,
/// ML-KEM-1024, or the X25519 + ML-KEM-1024 hybrid). Sign afterwards, never before.
pub fn encrypt_envelope(env: &mut Envelope, key: &Key) -> Result<()> {
    if env.is_encrypted() {
        return Err(err!(
            Encryption,
            "payload is already encrypted",
            "security.encryption",
            "encrypt once"
        ));
    }
    let alg = key.algorithm();
    let key_id = key.key_id().to_owned();
    let aad = envelope_aad(env, alg, &key_id);
    let mut iv = [0u8; NONCE_BYTES];
    random_bytes(&mut iv);
    let mut meta = v1::EncryptionMetadata {
        key_id: key_id.clone(),
        encryption_type: expected_type(alg) as i32,
        algorithm: alg.to_owned(),
        iv: Some(iv.to_vec()),
        aad: Some(aad.clone()),
        ..Default::default()
    };
    let mut rng = aes_gcm::aead::OsRng;
    let aead_key: [u8; 32] = match key {
        Key::Symmetric { secret, .. } => *secret,
        Key::MlKem1024 { public, .. } => {
            let (ct, ss) = public
                .encapsulate(&mut rng)
                .map_err(|_| err!(Encryption, "ML-KEM encapsulation failed", "key", ""))?;
            meta.encapsulated_key = Some(ct.to_vec());
            meta.algorithm_params = Some(r#"{"kem":"ml-kem-1024","dem":"aes-256-gcm","kdf":"none"}"#.to_owned());
            let mut k = [0u8; 32];
            k.copy_from_slice(ss.as_slice());
            k
        }
        Key::Hybrid {
            x25519_public,
            ml_kem_public,
            ..
        } => {
            let eph = x25519_dalek::EphemeralSecret::random_from_rng(rng);
            let eph_pub = x25519_dalek::PublicKey::from(&eph);
            let x_ss = eph.diffie_hellman(x25519_public);
            let (ct, m_ss) = ml_kem_public
                .encapsulate(&mut rng)
                .map_err(|_| err!(Encryption, "ML-KEM encapsulation failed", "key", ""))?;
            meta.encapsulated_key = Some(ct.to_vec());
            let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
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
            hybrid_key(
                x_ss.as_bytes(),
                m_ss.as_slice(),
                eph_pub.as_bytes(),
                x25519_public.as_bytes(),
            )
        }
    };
    let payload = env.payload.get_or_insert_with(Default::default);
    payload.value = aead_seal(&aead_key, &iv, &payload.value, &aad)?;
    env.security_mut().encryption = Some(meta);
    Ok(())
}

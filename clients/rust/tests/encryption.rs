//! Every encryption pattern of docs/encryption.md in Rust: round trips for each algorithm in
//! both layouts, RSA's direct and wrapped modes, KMS-wrapped data keys, the legacy RFC-031
//! spellings, the policy, and the hostile cases (tampering, relabelling, wrong or public-only
//! keys). Python decrypting what Rust encrypts, and the other way round, is
//! tests/clients/test_rust_client.py.

use std::sync::{Arc, OnceLock};

use prism_client::codec::{self, Layout, Limits};
use prism_client::encryption::{
    self, Key, Keyring, Policy, AES_256_GCM, CHACHA20_POLY1305, ML_KEM_1024, ML_KEM_768, RSA_OAEP_3072, RSA_OAEP_4096,
    X25519_ML_KEM_1024,
};
use prism_client::{Envelope, PrismError};

fn rsa_pem(bits: usize) -> String {
    use rsa::pkcs8::EncodePrivateKey;
    let k = rsa::RsaPrivateKey::new(&mut aes_gcm::aead::OsRng, bits).unwrap();
    k.to_pkcs8_pem(Default::default()).unwrap().to_string()
}

/// One key of every type (RSA generation is slow: once per test binary).
fn keyring() -> &'static Keyring {
    static RING: OnceLock<Keyring> = OnceLock::new();
    RING.get_or_init(|| {
        Keyring::new([
            Key::symmetric("sym-1", &[7u8; 32]).unwrap(),
            Key::rsa_private_pem("rsa-1", &rsa_pem(3072)).unwrap(),
            Key::rsa_private_pem("rsa-2", &rsa_pem(4096)).unwrap(),
            Key::ml_kem_768_from_seed("kem768-1", &[8u8; 64]).unwrap(),
            Key::ml_kem_1024_from_seed("kem-1", &[9u8; 64]).unwrap(),
            Key::hybrid_from_private("hyb-1", &[10u8; 32], &[11u8; 64]).unwrap(),
        ])
        .with_data_key_service(Arc::new(TestWrap))
    })
}

const CASES: [(&str, &str); 7] = [
    (AES_256_GCM, "sym-1"),
    (CHACHA20_POLY1305, "sym-1"),
    (RSA_OAEP_3072, "rsa-1"),
    (RSA_OAEP_4096, "rsa-2"),
    (ML_KEM_768, "kem768-1"),
    (ML_KEM_1024, "kem-1"),
    (X25519_ML_KEM_1024, "hyb-1"),
];

fn envelope(payload: &[u8]) -> Envelope {
    Envelope::builder("orders.created", "order-events")
        .bytes(payload.to_vec())
        .build()
        .unwrap()
}

fn reread(env: &Envelope, lay: Layout) -> Envelope {
    codec::decode(&codec::encode(env, lay), &Limits::default()).unwrap()
}

#[test]
fn every_algorithm_round_trips_in_both_layouts() {
    let ring = keyring();
    // 10 bytes fit one RSA block (direct mode); 5,000 do not (wrapped mode).
    for payload in [&b"secret"[..], &[0x5a; 5000][..], &[][..]] {
        for (alg, kid) in CASES {
            for lay in [Layout::Draft, Layout::Reviewed] {
                let mut env = envelope(payload);
                encryption::encrypt_envelope_with(&mut env, ring.get(kid).unwrap(), alg).unwrap();
                let meta = env.security().unwrap().encryption.clone().unwrap();
                assert_eq!((meta.algorithm.as_str(), meta.key_id.as_str()), (alg, kid));
                assert_ne!(env.payload.as_ref().unwrap().value, payload, "{alg}: ciphertext");
                let back = reread(&env, lay);
                assert!(
                    back.payload_bytes().is_err(),
                    "ciphertext is never handed out as plaintext"
                );
                let plain = encryption::decrypt_envelope(&back, ring).unwrap();
                assert_eq!(plain, payload, "{alg} {lay:?} {} bytes", payload.len());
            }
        }
    }
}

#[test]
fn rsa_uses_direct_mode_for_one_block_and_wraps_a_key_beyond() {
    let ring = keyring();
    for (size, mode, has_iv) in [(384 - 66, "direct", false), (384 - 65, "wrapped", true)] {
        let mut env = envelope(&vec![1u8; size]);
        encryption::encrypt_envelope(&mut env, ring.get("rsa-1").unwrap()).unwrap();
        let meta = env.security().unwrap().encryption.clone().unwrap();
        let params: serde_json::Value = serde_json::from_str(meta.algorithm_params.as_deref().unwrap()).unwrap();
        assert_eq!(params["mode"], mode);
        assert_eq!(meta.iv.is_some(), has_iv);
        assert_eq!(meta.encapsulated_key.is_some(), has_iv);
        assert_eq!(encryption::decrypt_envelope(&env, ring).unwrap().len(), size);
    }
}

#[path = "test_wrap.rs"]
mod test_wrap;
use test_wrap::TestWrap;

#[test]
fn kms_wrapped_data_keys_round_trip_and_bind_the_envelope() {
    let ring = keyring();
    for alg in [AES_256_GCM, CHACHA20_POLY1305] {
        let mut env = envelope(b"kms secret");
        encryption::encrypt_envelope_with_data_key(&mut env, &TestWrap, "orders", alg).unwrap();
        let meta = env.security().unwrap().encryption.clone().unwrap();
        assert_eq!(meta.key_id, "arn:test:orders");
        assert_eq!(
            meta.algorithm_params.as_deref(),
            Some(r#"{"key_wrap":"prism-test-wrap"}"#)
        );
        assert_eq!(
            encryption::decrypt_envelope(&reread(&env, Layout::Draft), ring).unwrap(),
            b"kms secret"
        );
        // a keyring without the service cannot unwrap: a typed refusal, not a guess
        let plain_ring = Keyring::new([Key::symmetric("arn:test:orders", &[0u8; 32]).unwrap()]);
        assert!(matches!(
            encryption::decrypt_envelope(&env, &plain_ring),
            Err(PrismError::KeyNotUsable(_))
        ));
        // the wrapped key is bound to the topic: moving the ciphertext fails
        let mut moved = env.clone();
        moved.header.metadata.as_mut().unwrap().topic = "orders.other".into();
        assert!(matches!(
            encryption::decrypt_envelope(&moved, ring),
            Err(PrismError::Decryption(_))
        ));
        // a missing wrapped key
        let mut gone = env.clone();
        gone.security_mut().encryption.as_mut().unwrap().encapsulated_key = None;
        assert!(matches!(
            encryption::decrypt_envelope(&gone, ring),
            Err(PrismError::Decryption(_))
        ));
    }
    let mut env = envelope(b"x");
    assert!(matches!(
        encryption::encrypt_envelope_with_data_key(&mut env, &TestWrap, "orders", ML_KEM_1024),
        Err(PrismError::KeyNotUsable(_))
    ));
}

type Edit = Box<dyn Fn(&mut Envelope)>;

#[test]
fn tampering_fails_opaquely_for_every_algorithm() {
    let ring = keyring();
    for (alg, kid) in CASES {
        for payload in [&b"secret"[..], &[1u8; 1000][..]] {
            let mut env = envelope(payload);
            encryption::encrypt_envelope_with(&mut env, ring.get(kid).unwrap(), alg).unwrap();
            let edits: Vec<Edit> = vec![
                Box::new(|e| e.payload.as_mut().unwrap().value[0] ^= 1),
                Box::new(|e| {
                    let v = &mut e.payload.as_mut().unwrap().value;
                    v.truncate(v.len() - 1);
                }),
                Box::new(|e| {
                    let m = e.security_mut().encryption.as_mut().unwrap();
                    if let Some(k) = m.encapsulated_key.as_mut() {
                        k[5] ^= 0x10;
                    } else if let Some(iv) = m.iv.as_mut() {
                        iv[0] ^= 1;
                    } else {
                        m.aad.as_mut().unwrap()[0] ^= 1;
                    }
                }),
                Box::new(|e| e.header.metadata.as_mut().unwrap().namespace = "other".into()),
            ];
            for (i, edit) in edits.iter().enumerate() {
                let mut bad = env.clone();
                edit(&mut bad);
                let got = encryption::decrypt_envelope(&bad, ring);
                assert!(matches!(got, Err(PrismError::Decryption(_))), "{alg} edit {i}: {got:?}");
            }
        }
    }
}

#[test]
fn keys_of_another_type_or_public_only_are_refused() {
    let ring = keyring();
    let mut env = envelope(b"x");
    encryption::encrypt_envelope(&mut env, ring.get("kem-1").unwrap()).unwrap();
    // relabel the key id to a key of another type (AAD recomputed, as an attacker would)
    let mut other = env.clone();
    let m = other.security_mut().encryption.as_mut().unwrap();
    m.key_id = "kem768-1".into();
    m.aad = Some(encryption::build_aad(
        env.message_id(),
        env.namespace(),
        env.topic(),
        ML_KEM_1024,
        "kem768-1",
    ));
    assert!(matches!(
        encryption::decrypt_envelope(&other, ring),
        Err(PrismError::KeyNotUsable(_))
    ));
    // a producer's recipient keys encrypt but cannot decrypt
    let public = Keyring::new([Key::ml_kem_768_public(
        "kem768-1",
        &ring.get("kem768-1").unwrap().ml_kem_public_bytes().unwrap(),
    )
    .unwrap()]);
    let mut env = envelope(b"x");
    encryption::encrypt_envelope(&mut env, public.get("kem768-1").unwrap()).unwrap();
    assert!(matches!(
        encryption::decrypt_envelope(&env, &public),
        Err(PrismError::KeyNotUsable(_))
    ));
    assert_eq!(encryption::decrypt_envelope(&env, ring).unwrap(), b"x");
    // a symmetric key does not do RSA; an RSA key does not do ChaCha20
    let mut env = envelope(b"x");
    assert!(encryption::encrypt_envelope_with(&mut env, ring.get("sym-1").unwrap(), RSA_OAEP_3072).is_err());
    assert!(encryption::encrypt_envelope_with(&mut env, ring.get("rsa-1").unwrap(), CHACHA20_POLY1305).is_err());
    assert!(matches!(
        Key::rsa_private_pem("small", &rsa_pem(2048)),
        Err(PrismError::KeyNotUsable(_))
    ));
}

#[test]
fn names_and_policy_as_python_reads_them() {
    for (name, ok) in [
        ("AES_256_GCM", true),
        (" chacha20-poly1305 ", true),
        ("rsa-oaep-2048", false),
        ("rsa2048-kyber768", false),
        ("aes-128-gcm", false),
        ("kyber1024", false),
        ("rot13", false),
        ("", false),
    ] {
        assert_eq!(encryption::canonical_algorithm(name).is_ok(), ok, "{name:?}");
    }
    assert_eq!(encryption::lookup("kyber1024", true).unwrap().canonical(), ML_KEM_1024);
    let fips = Policy::new(true, None).unwrap();
    assert!(matches!(
        fips.check(CHACHA20_POLY1305, false),
        Err(PrismError::Algorithm(_))
    ));
    assert!(fips.check(ML_KEM_768, false).is_ok());
    assert!(Policy::new(true, Some(vec![X25519_ML_KEM_1024.into()])).is_err());
    assert!(Policy::new(false, Some(vec![])).is_err());
    let only_aes = Policy::new(false, Some(vec!["aes_256_gcm".into()])).unwrap();
    let ring = keyring();
    let mut env = envelope(b"x");
    encryption::encrypt_envelope_with(&mut env, ring.get("sym-1").unwrap(), CHACHA20_POLY1305).unwrap();
    assert!(matches!(
        encryption::decrypt_with_policy(&env, ring, &only_aes),
        Err(PrismError::Algorithm(_))
    ));
    assert!(encryption::decrypt_with_policy(&env, ring, &Policy::default()).is_ok());
}

/// Seal `env` as an RFC-031 producer would: `algorithm` as written (the AAD names it),
/// AES-256-GCM under `key`.
fn seal_as(env: &mut Envelope, algorithm: &str, kid: &str, key: &[u8], encap: Vec<u8>, params: Option<String>) {
    use aes_gcm::aead::{Aead, KeyInit, Payload};
    let aad = encryption::build_aad(env.message_id(), env.namespace(), env.topic(), algorithm, kid);
    let iv = [5u8; 12];
    let ct = aes_gcm::Aes256Gcm::new_from_slice(key)
        .unwrap()
        .encrypt(
            aes_gcm::Nonce::from_slice(&iv),
            Payload {
                msg: b"legacy",
                aad: &aad,
            },
        )
        .unwrap();
    env.payload.as_mut().unwrap().value = ct;
    env.security_mut().encryption = Some(prism_client::gen::v1::EncryptionMetadata {
        key_id: kid.into(),
        algorithm: algorithm.into(),
        iv: Some(iv.to_vec()),
        aad: Some(aad),
        encapsulated_key: Some(encap),
        algorithm_params: params,
        ..Default::default()
    });
}

/// RFC-031's spellings are read, never written: `kyber768` as ML-KEM-768 and
/// `x25519-kyber1024` with the RFC's derivation, HKDF-Extract(SHA-256, salt = nil, x || k).
#[test]
fn legacy_spellings_decrypt() {
    use ml_kem::kem::Encapsulate;
    use ml_kem::{EncodedSizeUser, KemCore};
    let ring = keyring();
    let rng = &mut aes_gcm::aead::OsRng;
    // kyber768
    let pk = ring.get("kem768-1").unwrap().ml_kem_public_bytes().unwrap();
    let ek = <ml_kem::MlKem768 as KemCore>::EncapsulationKey::from_bytes(&pk.as_slice().try_into().unwrap());
    let (ct, ss) = ek.encapsulate(rng).unwrap();
    let mut env = envelope(b"");
    seal_as(&mut env, "kyber768", "kem768-1", &ss, ct.to_vec(), None);
    assert_eq!(
        encryption::decrypt_envelope(&reread(&env, Layout::Draft), ring).unwrap(),
        b"legacy"
    );
    // x25519-kyber1024: the recipient is hyb-1 (X25519 private key [10; 32])
    let recipient = x25519_dalek::PublicKey::from(&x25519_dalek::StaticSecret::from([10u8; 32]));
    let eph = x25519_dalek::StaticSecret::from([77u8; 32]);
    let x_ss = eph.diffie_hellman(&recipient);
    let pk = ring.get("hyb-1").unwrap().ml_kem_public_bytes().unwrap();
    let ek = <ml_kem::MlKem1024 as KemCore>::EncapsulationKey::from_bytes(&pk.as_slice().try_into().unwrap());
    let (ct, m_ss) = ek.encapsulate(rng).unwrap();
    let (prk, _) = hkdf::Hkdf::<sha2::Sha256>::extract(None, &[x_ss.as_bytes(), m_ss.as_slice()].concat());
    let b64 = |b: &[u8]| base64::Engine::encode(&base64::engine::general_purpose::STANDARD, b);
    let params = serde_json::json!({"x25519_ephemeral_public": b64(x25519_dalek::PublicKey::from(&eph).as_bytes())});
    let mut env = envelope(b"");
    seal_as(
        &mut env,
        "x25519-kyber1024",
        "hyb-1",
        &prk,
        ct.to_vec(),
        Some(params.to_string()),
    );
    assert_eq!(encryption::decrypt_envelope(&env, ring).unwrap(), b"legacy");
    // the same bytes labelled with the canonical name use Prism's derivation: they do not open
    let mut relabelled = env.clone();
    relabelled.security_mut().encryption.as_mut().unwrap().algorithm = X25519_ML_KEM_1024.into();
    relabelled.security_mut().encryption.as_mut().unwrap().aad = Some(encryption::build_aad(
        env.message_id(),
        env.namespace(),
        env.topic(),
        X25519_ML_KEM_1024,
        "hyb-1",
    ));
    assert!(matches!(
        encryption::decrypt_envelope(&relabelled, ring),
        Err(PrismError::Decryption(_))
    ));
    // and nothing writes a legacy name
    let mut env = envelope(b"x");
    assert!(matches!(
        encryption::encrypt_envelope_with(&mut env, ring.get("kem768-1").unwrap(), "kyber768"),
        Err(PrismError::Algorithm(_))
    ));
}

#[test]
fn python_keyring_files_load() {
    let ring = keyring();
    let pem = rsa_pem(3072);
    let b64 = |b: &[u8]| base64::Engine::encode(&base64::engine::general_purpose::STANDARD, b);
    let kem_pub = ring.get("kem-1").unwrap().ml_kem_public_bytes().unwrap();
    let doc = serde_json::json!({"version": 1, "keys": [
        {"id": "s", "type": "symmetric-256", "secret": b64(&[1u8; 32])},
        {"id": "r", "type": "rsa-3072", "private_pem": pem},
        {"id": "m7", "type": "ml-kem-768", "private_seed": b64(&[2u8; 64])},
        {"id": "m", "type": "ml-kem-1024", "public": b64(&kem_pub)},
        {"id": "h", "type": "x25519-ml-kem-1024", "x25519_private": b64(&[3u8; 32]), "ml_kem_private_seed": b64(&[4u8; 64])},
    ]});
    let loaded = Keyring::from_file_keyring_json(doc.to_string().as_bytes()).unwrap();
    for (id, t) in [
        ("s", "symmetric-256"),
        ("r", "rsa-3072"),
        ("m7", ML_KEM_768),
        ("m", ML_KEM_1024),
        ("h", X25519_ML_KEM_1024),
    ] {
        assert_eq!(loaded.get(id).unwrap().key_type(), t);
    }
    let bad = serde_json::json!({"keys": [
        {"id": "a", "type": "symmetric-256", "secret": "!!"},
        {"id": "b", "type": "rsa-4096", "private_pem": pem},
        {"id": "c", "type": "ml-kem-768", "private_seed": b64(&[1u8; 10])},
        {"type": "symmetric-256"},
        {"id": "d", "type": "dsa"},
    ]});
    match Keyring::from_file_keyring_json(bad.to_string().as_bytes()) {
        Err(PrismError::Config(d)) => {
            for needle in ["\"a\"", "\"b\"", "\"c\"", "keys[3]", "\"d\""] {
                assert!(d.what.contains(needle), "{needle} not named in {}", d.what);
            }
        }
        other => panic!("{other:?}"),
    }
    assert!(Keyring::from_file_keyring_json(b"[").is_err());
}

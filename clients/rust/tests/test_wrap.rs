//! A stand-in key service for the KMS (`key_wrap`) pattern, shared by tests/encryption.rs and
//! examples/encryption_interop.rs; tests/clients/test_rust_client.py implements the same one
//! in Python, so each side unwraps the other's data keys. The data key is AES-256-GCM-wrapped
//! (random nonce first) under a fixed TEST master key, with the KMS context as compact JSON
//! with sorted keys as its AAD - as a real KMS binds a data key to its encryption context.

use prism_client::encryption::{DataKey, DataKeyService, KmsContext};
use prism_client::{Detail, PrismError};

use aes_gcm::aead::rand_core::RngCore;
use aes_gcm::aead::{Aead, KeyInit, OsRng, Payload};
use aes_gcm::{Aes256Gcm, Nonce};

/// TEST ONLY master key.
const MASTER: [u8; 32] = [42u8; 32];

pub struct TestWrap;

fn refuse() -> PrismError {
    PrismError::Decryption(Detail::new(
        "the test key service refused the wrapped key",
        "security.encryption.encapsulated_key",
        "the wrapped key or its context changed",
    ))
}

impl DataKeyService for TestWrap {
    fn wrap_name(&self) -> &str {
        "prism-test-wrap"
    }
    fn generate_data_key(&self, key_id: &str, context: &KmsContext) -> prism_client::Result<DataKey> {
        let mut plaintext = [0u8; 32];
        let mut nonce = [0u8; 12];
        OsRng.fill_bytes(&mut plaintext);
        OsRng.fill_bytes(&mut nonce);
        let aad = serde_json::to_vec(context).map_err(|_| refuse())?;
        let ct = Aes256Gcm::new(&MASTER.into())
            .encrypt(
                Nonce::from_slice(&nonce),
                Payload {
                    msg: &plaintext,
                    aad: &aad,
                },
            )
            .map_err(|_| refuse())?;
        Ok(DataKey {
            key_id: format!("arn:test:{key_id}"),
            plaintext,
            wrapped: [&nonce[..], &ct].concat(),
        })
    }
    fn decrypt_data_key(&self, _key_id: &str, wrapped: &[u8], context: &KmsContext) -> prism_client::Result<[u8; 32]> {
        if wrapped.len() < 12 {
            return Err(refuse());
        }
        let aad = serde_json::to_vec(context).map_err(|_| refuse())?;
        let plain = Aes256Gcm::new(&MASTER.into())
            .decrypt(
                Nonce::from_slice(&wrapped[..12]),
                Payload {
                    msg: &wrapped[12..],
                    aad: &aad,
                },
            )
            .map_err(|_| refuse())?;
        plain.try_into().map_err(|_| refuse())
    }
}

//! Envelopes made by the Rust client for the Python SDK to check (tests/clients/test_rust_client.py):
//! one JSON line per envelope, `{"kind", "layout", "hex"}`: scope-v2, pair and batch signatures
//! (HMAC-SHA256 and Ed25519, the conformance keys) and payloads encrypted with each algorithm.

use std::path::Path;

use prism_client::codec::{encode, Layout};
use prism_client::encryption::{self, Key};
use prism_client::signing::{self, SigningKey, SCOPE_V2};
use prism_client::{Envelope, PrismError};
use serde_json::{json, Value};

fn conformance(path: &str) -> Value {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../conformance")
        .join(path);
    serde_json::from_slice(&std::fs::read(p).expect("conformance file")).expect("json")
}

fn h(v: &Value, f: &str) -> Vec<u8> {
    hex::decode(v[f].as_str().expect("hex field")).expect("hex")
}

fn emit(kind: &str, layout: Layout, bytes: &[u8]) {
    println!(
        "{}",
        json!({"kind": kind, "layout": layout.name(), "hex": hex::encode(bytes)})
    );
}

fn main() -> Result<(), PrismError> {
    let hk = &conformance("signatures/scope-v2-hmac-sha256.json")["key"];
    let ek = &conformance("signatures/scope-v2-ed25519.json")["key"];
    let keys = [
        SigningKey::hmac_sha256(hk["key_id"].as_str().unwrap_or(""), &h(hk, "secret_hex"))?,
        SigningKey::ed25519_from_seed(ek["key_id"].as_str().unwrap_or(""), &h(ek, "private_seed_hex"))?,
    ];
    let env = |i: usize| {
        Envelope::builder("orders.created", "order-events")
            .json(&json!({"i": i}))
            .and_then(|b| b.data_classification("confidential").contains_pii(true).build())
    };
    for k in &keys {
        let alg = k.algorithm();
        for lay in [Layout::Draft, Layout::Reviewed] {
            emit(&format!("v2/{alg}"), lay, &signing::sign(&env(0)?, k, lay, SCOPE_V2)?);
        }
        let (d, r) = signing::sign_pair(&env(1)?, k)?;
        emit(&format!("pair/{alg}"), Layout::Draft, &d);
        emit(&format!("pair/{alg}"), Layout::Reviewed, &r);
        let batch: Vec<Envelope> = (0..5).map(env).collect::<Result<_, _>>()?;
        for (d, r) in signing::sign_batch(&batch, k)? {
            emit(&format!("batch/{alg}"), Layout::Draft, &d);
            emit(&format!("batch/{alg}"), Layout::Reviewed, &r);
        }
    }
    let ek = &conformance("encryption/vectors.json")["keys"];
    let enc_keys = [
        Key::symmetric("conf-aes-1", &h(&ek["conf-aes-1"], "secret_hex"))?,
        Key::ml_kem_1024_public("conf-mlkem-1", &h(&ek["conf-mlkem-1"], "public_key_hex"))?,
        Key::hybrid_public(
            "conf-hybrid-1",
            &h(&ek["conf-hybrid-1"], "x25519_public_hex"),
            &h(&ek["conf-hybrid-1"], "ml_kem_public_hex"),
        )?,
    ];
    for k in &enc_keys {
        for lay in [Layout::Draft, Layout::Reviewed] {
            let mut e = Envelope::builder("orders.created", "order-events")
                .text("secret from rust")
                .build()?;
            encryption::encrypt_envelope(&mut e, k)?;
            emit(&format!("encrypted/{}", k.algorithm()), lay, &encode(&e, lay));
        }
    }
    Ok(())
}

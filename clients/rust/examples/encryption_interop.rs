//! The Rust side of the encryption cross-language test (tests/clients/test_rust_client.py),
//! with a Python keyring file (`FileKeyring` JSON) given as the first argument. One command
//! per stdin line, one JSON answer line each:
//!
//! * `decrypt HEX` -> `{"outcome": "plaintext", "plaintext_hex"}` or `{"outcome": <reason>}`
//! * `encrypt ALGORITHM KEY_ID LAYOUT HEX` -> `{"outcome": "ok", "hex"}`: HEX as the payload
//!   of a new envelope, encrypted, written in LAYOUT (`draft` or `reviewed`)
//! * `encrypt-kms ALGORITHM KEY_ID LAYOUT HEX`: the same with a data key of the test key
//!   service (`tests/test_wrap.rs`)

use std::io::BufRead;
use std::sync::Arc;

#[path = "../tests/test_wrap.rs"]
mod test_wrap;

use prism_client::codec::{self, Layout, Limits};
use prism_client::encryption::{self, Keyring};
use prism_client::{Envelope, PrismError};
use serde_json::{json, Value};

fn layout(name: &str) -> Layout {
    if name == "draft" {
        Layout::Draft
    } else {
        Layout::Reviewed
    }
}

fn answer(ring: &Keyring, line: &str) -> Result<Value, PrismError> {
    let words: Vec<&str> = line.split_whitespace().collect();
    let bytes = |w: &str| hex::decode(w).unwrap_or_default();
    match words.as_slice() {
        ["decrypt", h] => {
            let env = codec::decode(&bytes(h), &Limits::default())?;
            let plain = encryption::decrypt_envelope(&env, ring)?;
            Ok(json!({"outcome": "plaintext", "plaintext_hex": hex::encode(plain)}))
        }
        [cmd @ ("encrypt" | "encrypt-kms"), alg, kid, lay, h] => {
            let mut env = Envelope::builder("orders.created", "order-events")
                .bytes(bytes(h))
                .content_type("application/json")
                .data_classification("restricted")
                .build()?;
            if *cmd == "encrypt" {
                encryption::encrypt_envelope_with(&mut env, ring.get(kid)?, alg)?;
            } else {
                encryption::encrypt_envelope_with_data_key(&mut env, &test_wrap::TestWrap, kid, alg)?;
            }
            Ok(json!({"outcome": "ok", "hex": hex::encode(codec::encode(&env, layout(lay)))}))
        }
        _ => Ok(json!({"error": "unknown command"})),
    }
}

fn main() {
    let path = std::env::args().nth(1).unwrap_or_default();
    let ring = match std::fs::read(&path)
        .map_err(|e| e.to_string())
        .and_then(|b| Keyring::from_file_keyring_json(&b).map_err(|e| e.to_string()))
    {
        Ok(r) => r.with_data_key_service(Arc::new(test_wrap::TestWrap)),
        Err(e) => {
            eprintln!("error [bad_keyring] {path}: {e}");
            std::process::exit(2);
        }
    };
    for line in std::io::stdin().lock().lines().map_while(Result::ok) {
        let out = answer(&ring, &line).unwrap_or_else(|e| json!({"outcome": e.reason(), "message": e.to_string()}));
        println!("{out}");
    }
}

//! The shared conformance suite (`conformance/manifest.json`, conformance/README.md): every
//! vector of every file of the kinds this crate implements, each reported by path and name.

use std::path::{Path, PathBuf};

use prism_client::signing::{self, SigningKey, VerificationKey, VerificationKeys};
use prism_client::PrismError;
use serde_json::Value;

fn conformance_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../conformance")
}

fn files_of(kind: &str) -> Vec<(String, Value)> {
    let dir = conformance_dir();
    let manifest: Value =
        serde_json::from_slice(&std::fs::read(dir.join("manifest.json")).unwrap()).unwrap();
    let mut out = Vec::new();
    for f in manifest["files"].as_array().unwrap() {
        if f["kind"] == kind {
            let path = f["path"].as_str().unwrap().to_owned();
            let v: Value =
                serde_json::from_slice(&std::fs::read(dir.join(&path)).unwrap()).unwrap();
            assert_eq!(v["kind"], kind, "{path}: kind");
            out.push((path, v));
        }
    }
    assert!(!out.is_empty(), "manifest lists no {kind} files");
    out
}

fn hex(v: &Value) -> Vec<u8> {
    hex::decode(v.as_str().unwrap()).unwrap()
}

/// Map this crate's errors onto the suite's error kinds (manifest.json `error_kinds`).
pub fn kind_of(e: &PrismError) -> &'static str {
    match e {
        PrismError::Malformed(d)
            if d.what.contains("past the end") || d.what.contains("remain") =>
        {
            "truncated"
        }
        PrismError::Malformed(_) => "malformed",
        PrismError::Layout(_) => "unknown_layout",
        PrismError::SizeLimit(_) => "too_large",
        PrismError::BadSignature(_) | PrismError::UnknownKey(_) | PrismError::Algorithm(_) => {
            "bad_signature"
        }
        PrismError::LegacySignatureScope(_) => "legacy_signature_scope",
        PrismError::UnsupportedSignatureScope(_) => "unsupported_signature_scope",
        PrismError::AmbiguousEnvelope(_) => "ambiguous_envelope",
        PrismError::Decryption(_) => "decryption_failed",
        _ => "other",
    }
}

fn verification_keys(key: &Value) -> VerificationKeys {
    let id = key["key_id"].as_str().unwrap();
    let k = match key["algorithm"].as_str().unwrap() {
        "hmac-sha256" => SigningKey::hmac_sha256(id, &hex(&key["secret_hex"]))
            .unwrap()
            .verification_key(),
        "ed25519" => {
            let vk = VerificationKey::ed25519_public(id, &hex(&key["public_key_hex"])).unwrap();
            let sk = SigningKey::ed25519_from_seed(id, &hex(&key["private_seed_hex"])).unwrap();
            assert_eq!(format!("{:?}", sk.verification_key()), format!("{vk:?}"));
            vk
        }
        other => panic!("unknown algorithm {other}"),
    };
    VerificationKeys::new([k])
}

fn verdict(r: Result<signing::SignatureInfo, PrismError>) -> String {
    match r {
        Ok(_) => "valid".into(),
        Err(e) => kind_of(&e).into(),
    }
}

#[test]
fn signature_vectors() {
    let mut failures = Vec::new();
    let mut count = 0;
    for (path, file) in files_of("signature") {
        let keys = verification_keys(&file["key"]);
        for v in file["vectors"].as_array().unwrap() {
            count += 1;
            let name = v["name"].as_str().unwrap();
            let data = hex(&v["envelope_hex"]);
            let got = verdict(signing::verify(&data, &keys, None, None));
            if got != v["expected"].as_str().unwrap() {
                failures.push(format!(
                    "{path} {name}: default {got}, expected {}",
                    v["expected"]
                ));
            }
            let got = verdict(signing::verify(&data, &keys, None, Some(true)));
            if got != v["expected_accept_legacy_scope"].as_str().unwrap() {
                failures.push(format!(
                    "{path} {name}: legacy accepted {got}, expected {}",
                    v["expected_accept_legacy_scope"]
                ));
            }
            if let Some(m) = v.get("signed_message_hex") {
                match signing::signed_message(&data, None) {
                    Ok((_, _, got)) if got == hex(m) => {}
                    Ok(_) => failures.push(format!("{path} {name}: signed message differs")),
                    Err(e) => failures.push(format!("{path} {name}: signed message: {e}")),
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {count} signature vectors fail:\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert!(count > 200);
}

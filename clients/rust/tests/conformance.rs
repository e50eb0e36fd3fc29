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
    let manifest: Value = serde_json::from_slice(&std::fs::read(dir.join("manifest.json")).unwrap()).unwrap();
    let mut out = Vec::new();
    for f in manifest["files"].as_array().unwrap() {
        if f["kind"] == kind {
            let path = f["path"].as_str().unwrap().to_owned();
            let v: Value = serde_json::from_slice(&std::fs::read(dir.join(&path)).unwrap()).unwrap();
            assert_eq!(v["kind"], kind, "{path}: kind");
            out.push((path, v));
        }
    }
    assert!(!out.is_empty(), "manifest lists no {kind} files");
    out
}

/// How many vectors manifest.json lists for one file (a runner must run all of them).
fn manifest_vectors(path: &str) -> u64 {
    let manifest: Value =
        serde_json::from_slice(&std::fs::read(conformance_dir().join("manifest.json")).unwrap()).unwrap();
    let files = manifest["files"].as_array().unwrap();
    let entry = files.iter().find(|f| f["path"] == path).unwrap();
    entry["vectors"].as_u64().unwrap()
}

fn hex(v: &Value) -> Vec<u8> {
    hex::decode(v.as_str().unwrap()).unwrap()
}

/// Map this crate's errors onto the suite's error kinds (manifest.json `error_kinds`).
pub fn kind_of(e: &PrismError) -> &'static str {
    match e {
        PrismError::Truncated(_) => "truncated",
        PrismError::Malformed(_) => "malformed",
        PrismError::Layout(_) => "unknown_layout",
        PrismError::SizeLimit(_) => "too_large",
        PrismError::BadSignature(_) | PrismError::UnknownKey(_) | PrismError::Algorithm(_) => "bad_signature",
        PrismError::LegacySignatureScope(_) => "legacy_signature_scope",
        PrismError::UnsupportedSignatureScope(_) => "unsupported_signature_scope",
        PrismError::AmbiguousEnvelope(_) => "ambiguous_envelope",
        PrismError::AmbiguousMapEntry(_) => "ambiguous_map_entry",
        PrismError::Decryption(_) => "decryption_failed",
        PrismError::KeyNotUsable(_) => "key_not_usable",
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
                failures.push(format!("{path} {name}: default {got}, expected {}", v["expected"]));
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

mod jsonform;
use jsonform::json_form;
use prism_client::codec::{self, Layout, Limits};

fn layout_name(l: Layout) -> &'static str {
    l.name()
}

/// The model's JSON form: the decoded envelope written in the reviewed layout, read back
/// field by field (so it shows unknown fields and presence exactly as the crate keeps them).
fn model_form(env: &prism_client::Envelope) -> Value {
    json_form(&codec::encode(env, Layout::Reviewed), "v1")
}

#[test]
fn envelope_vectors() {
    let mut failures = Vec::new();
    let mut count = 0;
    for (path, file) in files_of("envelope") {
        for v in file["vectors"].as_array().unwrap() {
            count += 1;
            let name = v["name"].as_str().unwrap();
            let data = hex(&v["envelope_hex"]);
            let mut fail = |what: String| failures.push(format!("{path} {name}: {what}"));
            let lay = codec::detect_layout(&data).unwrap();
            if layout_name(lay) != v["layout"] {
                fail(format!("layout {lay:?}"));
            }
            let wire = json_form(&data, if lay == Layout::Draft { "draft" } else { "v1" });
            if wire != v["wire"] {
                fail(format!("wire form {wire}"));
            }
            let view = match codec::decode_view(&data, None, &Limits::default()) {
                Ok(view) => view,
                Err(e) => {
                    fail(format!("decode: {e}"));
                    continue;
                }
            };
            let env = view.to_envelope().unwrap();
            let model = model_form(&env);
            if model != v["model"] {
                fail(format!("model {model}\n   expected {}", v["model"]));
            }
            let eff = serde_json::json!({
                "content_type": env.content_type(),
                "content_encoding": env.content_encoding(),
                "priority": env.metadata().and_then(|m| m.priority).unwrap_or(5),
            });
            if eff != v["effective"] {
                fail(format!("effective {eff}"));
            }
            // The payload is found without parsing it: the borrowed slices point into `data`.
            let loc = match &view.payload {
                None => Value::Null,
                Some(p) => {
                    let value = p.value().unwrap();
                    let base = data.as_ptr() as usize;
                    let rec = prism_client::wire::scan(&data, 0, data.len())
                        .unwrap()
                        .into_iter()
                        .rfind(|r| r.field == lay.payload_field())
                        .unwrap();
                    let mut m = serde_json::json!({
                        "record_offset": rec.start, "record_length": rec.end - rec.start,
                        "any_offset": rec.value_start, "any_length": rec.end - rec.value_start,
                    });
                    if !value.is_empty() {
                        m["value_offset"] = (value.as_ptr() as usize - base).into();
                        m["value_length"] = value.len().into();
                    }
                    m
                }
            };
            if loc != v["payload_location"] {
                fail(format!("payload location {loc}"));
            }
            let again = codec::encode(&env, lay);
            if v["canonical"] == true && again != data {
                fail(format!(
                    "re-encoded differs:\n   {}\n   {}",
                    hex::encode(&again),
                    v["envelope_hex"]
                ));
            }
            if v["canonical"] == false {
                if again == data {
                    fail("non-canonical input re-encoded identically".into());
                }
                let back = codec::decode(&again, &Limits::default()).unwrap();
                if model_form(&back) != v["model"] {
                    fail("re-encoded non-canonical input decodes to another model".into());
                }
            }
        }
    }
    assert_eq!(count, 32, "envelope vectors run");
    assert!(
        failures.is_empty(),
        "{} of {count} envelope vectors fail:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn conversion_vectors() {
    let mut failures = Vec::new();
    let mut count = 0;
    for (path, file) in files_of("conversion") {
        for v in file["vectors"].as_array().unwrap() {
            count += 1;
            let name = v["name"].as_str().unwrap();
            let to = if v["to"] == "draft" {
                Layout::Draft
            } else {
                Layout::Reviewed
            };
            if let Some(h) = v.get("same_layout_hex") {
                // an odd extensions entry stays in its own layout, written as upb writes it
                let from = if v["from"] == "draft" {
                    Layout::Draft
                } else {
                    Layout::Reviewed
                };
                match codec::decode(&hex(&v["input_hex"]), &Limits::default()) {
                    Ok(env) if codec::encode(&env, from) == hex(h) => {}
                    Ok(env) => failures.push(format!(
                        "{path} {name}: same layout\n   {}\n   {h}",
                        hex::encode(codec::encode(&env, from))
                    )),
                    Err(e) => failures.push(format!("{path} {name}: same layout: {e}")),
                }
            }
            let converted = codec::convert(&hex(&v["input_hex"]), to, &Limits::default());
            if let Some(kind) = v.get("expected").and_then(Value::as_str) {
                match converted {
                    Err(e) if kind_of(&e) == kind => {}
                    other => failures.push(format!("{path} {name}: {other:?}, expected {kind}")),
                }
                continue;
            }
            let (out, dropped) = match converted {
                Ok(x) => x,
                Err(e) => {
                    failures.push(format!("{path} {name}: {e}"));
                    continue;
                }
            };
            if let Some(h) = v.get("output_hex") {
                if out != hex(h) {
                    failures.push(format!("{path} {name}: output\n   {}\n   {h}", hex::encode(&out)));
                }
            }
            let model = model_form(&codec::decode(&out, &Limits::default()).unwrap());
            if model != v["output_model"] {
                failures.push(format!(
                    "{path} {name}: model {model}\n   expected {}",
                    v["output_model"]
                ));
            }
            let mut paths: Vec<String> = dropped
                .iter()
                .map(|d| d.split(':').next().unwrap_or("").to_owned())
                .collect();
            paths.sort();
            paths.dedup();
            let expected: Vec<String> = v["not_carried"]
                .as_array()
                .unwrap()
                .iter()
                .map(|p| p.as_str().unwrap().to_owned())
                .collect();
            if paths != expected {
                failures.push(format!("{path} {name}: not carried {paths:?}, expected {expected:?}"));
            }
        }
    }
    assert!(count >= 30, "conversion vectors run");
    assert!(
        failures.is_empty(),
        "{} of {count} conversion vectors fail:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

use prism_client::encryption::{self, Key, Keyring};

fn encryption_keys(keys: &Value) -> Keyring {
    let mut out = Vec::new();
    for (id, k) in keys.as_object().unwrap() {
        let key = match k["type"].as_str().unwrap() {
            "symmetric-256" => Key::symmetric(id, &hex(&k["secret_hex"])).unwrap(),
            "ml-kem-1024" => {
                let key = Key::ml_kem_1024_from_seed(id, &hex(&k["private_seed_hex"])).unwrap();
                assert_eq!(
                    key.ml_kem_public_bytes().unwrap(),
                    hex(&k["public_key_hex"]),
                    "{id}: public key from seed"
                );
                key
            }
            "x25519-ml-kem-1024" => {
                let key =
                    Key::hybrid_from_private(id, &hex(&k["x25519_private_hex"]), &hex(&k["ml_kem_private_seed_hex"]))
                        .unwrap();
                assert_eq!(
                    key.ml_kem_public_bytes().unwrap(),
                    hex(&k["ml_kem_public_hex"]),
                    "{id}: public key from seed"
                );
                key
            }
            other => panic!("key type {other}"),
        };
        out.push(key);
    }
    Keyring::new(out)
}

#[test]
fn encryption_vectors() {
    let mut failures = Vec::new();
    let mut count = 0;
    for (path, file) in files_of("encryption") {
        let keys = encryption_keys(&file["keys"]);
        for v in file["vectors"].as_array().unwrap() {
            count += 1;
            let name = v["name"].as_str().unwrap();
            let env = match codec::decode(&hex(&v["envelope_hex"]), &Limits::default()) {
                Ok(e) => e,
                Err(e) => {
                    failures.push(format!("{path} {name}: decode {e}"));
                    continue;
                }
            };
            let got = encryption::decrypt_with_details(&env, &keys);
            let verdict = match &got {
                Ok(_) => "plaintext",
                Err(e) => kind_of(e),
            };
            if verdict != v["expected"].as_str().unwrap() {
                failures.push(format!(
                    "{path} {name}: {verdict} ({:?}), expected {}",
                    got.as_ref().err(),
                    v["expected"]
                ));
                continue;
            }
            if let Ok((plain, d)) = got {
                let checks: [(&str, Option<Vec<u8>>); 5] = [
                    ("plaintext_hex", Some(plain)),
                    ("aad_hex", Some(d.aad)),
                    ("aead_key_hex", Some(d.aead_key.to_vec())),
                    ("ml_kem_shared_secret_hex", d.ml_kem_shared_secret.map(|s| s.to_vec())),
                    ("x25519_shared_secret_hex", d.x25519_shared_secret.map(|s| s.to_vec())),
                ];
                for (field, value) in checks {
                    if let Some(want) = v.get(field) {
                        if value.as_deref() != Some(hex(want).as_slice()) {
                            failures.push(format!("{path} {name}: {field} differs"));
                        }
                    }
                }
            }
        }
    }
    assert!(count >= 31, "encryption vectors run");
    assert!(
        failures.is_empty(),
        "{} of {count} encryption vectors fail:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// What this crate encrypts, this crate decrypts, in both layouts, for every algorithm; and
/// the vectors' keys work for encryption too (Python decrypting Rust output is
/// tests/clients/test_rust_client.py).
#[test]
fn encrypt_round_trip_with_vector_keys() {
    let (_, file) = files_of("encryption").remove(0);
    let keys = encryption_keys(&file["keys"]);
    for id in ["conf-aes-1", "conf-mlkem-1", "conf-hybrid-1"] {
        for lay in [Layout::Draft, Layout::Reviewed] {
            let mut env = prism_client::Envelope::builder("orders.created", "orders")
                .text("secret")
                .build()
                .unwrap();
            encryption::encrypt_envelope(&mut env, keys.get(id).unwrap()).unwrap();
            assert!(
                encryption::encrypt_envelope(&mut env, keys.get(id).unwrap()).is_err(),
                "encrypts once"
            );
            let wire = codec::encode(&env, lay);
            let back = codec::decode(&wire, &Limits::default()).unwrap();
            assert!(
                back.payload_bytes().is_err(),
                "ciphertext is never handed out as plaintext"
            );
            let plain = encryption::decrypt_to_envelope(&back, &keys).unwrap();
            assert_eq!(plain.payload_bytes().unwrap().as_ref(), b"secret", "{id} {lay:?}");
        }
    }
}

/// Decode with the vector's limits, then verify as a consumer does: size, records and
/// ambiguity, the header-only decode, then the signature (Python's `verify_and_decode`).
fn negative_verify(data: &[u8], limits: &Limits, keys: &VerificationKeys) -> String {
    if data.len() > limits.max_message_bytes {
        return "too_large".into();
    }
    if let Err(e) = signing::check_unambiguous(data, None) {
        return kind_of(&e).into();
    }
    if let Err(e) = codec::decode_view(data, None, limits) {
        return kind_of(&e).into();
    }
    verdict(signing::verify(data, keys, None, None))
}

#[test]
fn negative_vectors() {
    let mut failures = Vec::new();
    let mut count = 0;
    for (path, file) in files_of("negative") {
        let keys = verification_keys(&file["key"]);
        for v in file["vectors"].as_array().unwrap() {
            count += 1;
            let name = v["name"].as_str().unwrap();
            let data = hex(&v["input_hex"]);
            let limits = match v.get("limits") {
                Some(l) => Limits {
                    max_message_bytes: l["max_message_bytes"].as_u64().unwrap() as usize,
                    max_header_bytes: l["max_header_bytes"].as_u64().unwrap() as usize,
                },
                None => Limits::default(),
            };
            let decoded = codec::decode_view(&data, None, &limits);
            let got = match &decoded {
                Ok(_) => "ok",
                Err(e) => kind_of(e),
            };
            if got != v["expected_decode"] {
                failures.push(format!(
                    "{path} {name}: decode {got} ({:?}), expected {}",
                    decoded.as_ref().err(),
                    v["expected_decode"]
                ));
            } else if let (Ok(view), Some(model)) = (&decoded, v.get("model")) {
                let form = model_form(&view.to_envelope().unwrap_or_else(|_| view.header_envelope()));
                if &form != model {
                    failures.push(format!("{path} {name}: model {form}\n   expected {model}"));
                }
            }
            let verified = negative_verify(&data, &limits, &keys);
            if verified != v["expected_verify"] {
                failures.push(format!(
                    "{path} {name}: verify {verified}, expected {}",
                    v["expected_verify"]
                ));
            }
        }
    }
    assert!(count >= 80, "negative vectors run");
    assert!(
        failures.is_empty(),
        "{} failures in {count} negative vectors:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// The key service of a `key_wrap` file, standing in for AWS KMS with its table of answers:
/// it unwraps a key only when the key id, the wrapped bytes and the whole encryption context
/// (its provider context merged with the envelope's, the envelope's keys winning) equal an
/// entry, and records the context it was sent.
struct TableService {
    wrap_name: String,
    provider_context: encryption::KmsContext,
    data_keys: Vec<(String, Vec<u8>, [u8; 32], encryption::KmsContext)>,
    sent: std::sync::Mutex<Vec<encryption::KmsContext>>,
}

impl encryption::DataKeyService for TableService {
    fn wrap_name(&self) -> &str {
        &self.wrap_name
    }
    fn generate_data_key(
        &self,
        _key_id: &str,
        _context: &encryption::KmsContext,
    ) -> prism_client::Result<encryption::DataKey> {
        Err(PrismError::Config(prism_client::Detail::new(
            "the table stands in for decryption only",
            "",
            "",
        )))
    }
    fn decrypt_data_key(
        &self,
        key_id: &str,
        wrapped: &[u8],
        context: &encryption::KmsContext,
    ) -> prism_client::Result<[u8; 32]> {
        let mut full = self.provider_context.clone();
        full.extend(context.clone());
        self.sent.lock().unwrap().push(full.clone());
        self.data_keys
            .iter()
            .find(|(k, w, _, c)| k == key_id && w == wrapped && *c == full)
            .map(|(_, _, p, _)| *p)
            .ok_or_else(|| {
                PrismError::Decryption(prism_client::Detail::new(
                    "the key service refused the wrapped key",
                    "security.encryption.encapsulated_key",
                    "",
                ))
            })
    }
}

fn context_of(v: &Value) -> encryption::KmsContext {
    v.as_object()
        .unwrap()
        .iter()
        .map(|(k, x)| (k.clone(), x.as_str().unwrap().to_owned()))
        .collect()
}

/// The key_wrap pattern (kind "key_wrap"): every vector decrypted through the crate's
/// key-service path (`Keyring::with_data_key_service`) with the file's table as the service.
#[test]
fn key_wrap_vectors() {
    let mut failures = Vec::new();
    let mut count = 0;
    for (path, file) in files_of("key_wrap") {
        let service = std::sync::Arc::new(TableService {
            wrap_name: file["wrap_name"].as_str().unwrap().to_owned(),
            provider_context: context_of(&file["provider_context"]),
            data_keys: file["data_keys"]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| {
                    (
                        d["key_id"].as_str().unwrap().to_owned(),
                        hex(&d["wrapped_hex"]),
                        hex(&d["plaintext_hex"]).try_into().unwrap(),
                        context_of(&d["encryption_context"]),
                    )
                })
                .collect(),
            sent: Default::default(),
        });
        let keys = Keyring::new([]).with_data_key_service(service.clone());
        for v in file["vectors"].as_array().unwrap() {
            count += 1;
            let name = v["name"].as_str().unwrap();
            let mut fail = |what: String| failures.push(format!("{path} {name}: {what}"));
            let env = match codec::decode(&hex(&v["envelope_hex"]), &Limits::default()) {
                Ok(e) => e,
                Err(e) => {
                    fail(format!("decode {e}"));
                    continue;
                }
            };
            service.sent.lock().unwrap().clear();
            let got = encryption::decrypt_with_details(&env, &keys);
            let verdict = match &got {
                Ok(_) => "plaintext",
                Err(e) => kind_of(e),
            };
            if verdict != v["expected"].as_str().unwrap() {
                fail(format!(
                    "{verdict} ({:?}), expected {}",
                    got.as_ref().err(),
                    v["expected"]
                ));
                continue;
            }
            if let Ok((plain, d)) = got {
                if plain != hex(&v["plaintext_hex"]) {
                    fail("plaintext differs".into());
                }
                if d.aad != hex(&v["aad_hex"]) {
                    fail("aad differs".into());
                }
                let sent = service.sent.lock().unwrap().clone();
                if sent != vec![context_of(&v["encryption_context"])] {
                    fail(format!("context sent {sent:?}"));
                }
            }
        }
    }
    assert!(count >= 10, "key_wrap vectors run");
    assert!(
        failures.is_empty(),
        "{} of {count} key_wrap vectors fail:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// LNMP (kind "lnmp"): each input decoded strictly; its form, its LNMP fields, its record, the
/// envelope it maps to and its canonical re-encoding, or the refusal `bad_lnmp`.
#[test]
fn lnmp_vectors() {
    use prism_client::lnmp;
    let mut failures = Vec::new();
    let mut count = 0;
    for (path, file) in files_of("lnmp") {
        for v in file["vectors"].as_array().unwrap() {
            count += 1;
            let name = v["name"].as_str().unwrap();
            let data = hex(&v["input_hex"]);
            let mut fail = |what: String| failures.push(format!("{path} {name}: {what}"));
            assert_eq!(v["strict"], true, "{path} {name}: only strict vectors exist");
            let env = match (lnmp::to_envelope(&data), v["expected"].as_str().unwrap()) {
                (Err(PrismError::Lnmp(_)), "bad_lnmp") => continue,
                (Ok(env), "ok") => env,
                (got, want) => {
                    fail(format!("got {got:?}, expected {want}"));
                    continue;
                }
            };
            let form = lnmp::form_of(&data);
            if form.name() != v["form"] {
                fail(format!("form {form:?}"));
            }
            let mut fields = serde_json::Map::new();
            let (meta, record) = if form == lnmp::Form::Binary {
                let c = lnmp::decode_container(&data).unwrap();
                fields.insert("mode".into(), c.mode.into());
                fields.insert("flags".into(), c.flags.into());
                fields.insert("mode_metadata".into(), hex::encode(&c.mode_metadata).into());
                (c.envelope, c.record)
            } else {
                let t = lnmp::decode_text(&data).unwrap();
                (t.envelope, t.record)
            };
            if let Some(m) = meta {
                if let Some(x) = m.timestamp {
                    fields.insert("timestamp".into(), x.into());
                }
                if let Some(x) = m.source {
                    fields.insert("source".into(), x.into());
                }
                if let Some(x) = m.trace_id {
                    fields.insert("trace_id".into(), x.into());
                }
                if let Some(x) = m.sequence {
                    fields.insert("sequence".into(), x.into());
                }
                let tlv: Vec<Value> = m
                    .extra_tlv
                    .iter()
                    .map(|(t, x)| serde_json::json!([t, hex::encode(x)]))
                    .collect();
                let keys: Vec<Value> = m.extra_keys.iter().map(|(k, x)| serde_json::json!([k, x])).collect();
                fields.insert("extra_tlv".into(), tlv.into());
                fields.insert("extra_keys".into(), keys.into());
            }
            let fields = Value::Object(fields);
            if fields != v["lnmp"] {
                fail(format!("lnmp fields {fields}\n   expected {}", v["lnmp"]));
            }
            if hex::encode(record) != v["record_hex"].as_str().unwrap() {
                fail(format!("record {}", hex::encode(record)));
            }
            let form = model_form(&env);
            if form != v["model"] {
                fail(format!("model {form}\n   expected {}", v["model"]));
            }
            match lnmp::from_envelope(&env) {
                Ok(out) if hex::encode(&out) == v["reencoded_hex"].as_str().unwrap() => {}
                Ok(out) => fail(format!("re-encoded {}", hex::encode(out))),
                Err(e) => fail(format!("re-encode: {e}")),
            }
        }
    }
    assert!(count >= 38, "lnmp vectors run");
    assert!(
        failures.is_empty(),
        "{} of {count} lnmp vectors fail:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// The Kafka binding's headers (kind "kafka_headers"): for each decoded envelope,
/// `binding::headers_for` must give exactly Python's headers - names, values and order - so a
/// router or tracing tool reading them sees the same message whichever SDK published it.
#[test]
fn kafka_headers_vectors() {
    use prism_client::binding;
    let mut failures = Vec::new();
    let mut count = 0;
    let mut listed = 0;
    for (path, file) in files_of("kafka_headers") {
        listed += manifest_vectors(&path);
        for v in file["vectors"].as_array().unwrap() {
            let name = v["name"].as_str().unwrap();
            let data = hex(&v["envelope_hex"]);
            let lay = codec::detect_layout(&data).unwrap();
            if layout_name(lay) != v["layout"] {
                failures.push(format!("{path} {name}: layout {}", layout_name(lay)));
                continue;
            }
            let env = codec::decode(&data, &Limits::default()).unwrap();
            let got: Vec<(String, String)> = binding::headers_for(&env, lay)
                .into_iter()
                .map(|(n, v)| (n, String::from_utf8(v).unwrap()))
                .collect();
            let want: Vec<(String, String)> = v["headers"]
                .as_array()
                .unwrap()
                .iter()
                .map(|h| (h[0].as_str().unwrap().to_owned(), h[1].as_str().unwrap().to_owned()))
                .collect();
            count += 1;
            if got != want {
                failures.push(format!("{path} {name}:\n  got  {got:?}\n  want {want:?}"));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {count} kafka_headers vectors fail:\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert_eq!(count, listed, "ran {count} of the {listed} vectors manifest.json lists");
    assert!(count > 100);
}

/// TTL expiry (kind "expiry"): for each decoded envelope, `Envelope::is_expired` at `now_ms`
/// must be Python's verdict and `model::expiry_ms` its exact expiry - the subscriber drops a
/// message by this rule, so an SDK that disagrees keeps what another drops. int64 values
/// are decimal strings (most are beyond 2^53); expiries beyond int64 come back as i128.
#[test]
fn expiry_vectors() {
    use prism_client::model::expiry_ms;
    let int = |v: &Value| v.as_str().map(|s| s.parse::<i128>().unwrap());
    let mut failures = Vec::new();
    let mut count = 0;
    let mut listed = 0;
    for (path, file) in files_of("expiry") {
        listed += manifest_vectors(&path);
        for v in file["vectors"].as_array().unwrap() {
            let name = v["name"].as_str().unwrap();
            let data = hex(&v["envelope_hex"]);
            let lay = codec::detect_layout(&data).unwrap();
            let env = codec::decode(&data, &Limits::default()).unwrap();
            let md = env.metadata().unwrap();
            let now = i64::try_from(int(&v["now_ms"]).unwrap()).unwrap();
            let got = (
                layout_name(lay),
                i128::from(md.published_at_ms),
                md.ttl_seconds.map(i128::from),
                expiry_ms(md.published_at_ms, md.ttl_seconds),
                env.is_expired(now),
                env.expires_at_ms(),
            );
            let want_expiry = int(&v["expires_at_ms"]);
            let want = (
                v["layout"].as_str().unwrap(),
                int(&v["published_at_ms"]).unwrap(),
                int(&v["ttl_seconds"]),
                want_expiry,
                v["expired"].as_bool().unwrap(),
                // saturated to i64::MAX where the exact expiry is past it
                want_expiry.map(|e| i64::try_from(e).unwrap_or(i64::MAX)),
            );
            count += 1;
            if got != want {
                failures.push(format!("{path} {name}:\n  got  {got:?}\n  want {want:?}"));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {count} expiry vectors fail:\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert_eq!(count, listed, "ran {count} of the {listed} vectors manifest.json lists");
    assert!(count >= 30);
}

/// Every kind in the manifest is run by a test above. A kind without a runner is not skipped
/// in silence: it must be listed in `NOT_IMPLEMENTED`, which the test prints, and which is
/// empty - so a new kind fails here until Rust runs it.
#[test]
fn every_manifest_kind_has_a_runner() {
    const RUN: [&str; 9] = [
        "signature",
        "envelope",
        "conversion",
        "encryption",
        "key_wrap",
        "negative",
        "lnmp",
        "kafka_headers",
        "expiry",
    ];
    const NOT_IMPLEMENTED: [&str; 0] = [];
    let manifest: Value =
        serde_json::from_slice(&std::fs::read(conformance_dir().join("manifest.json")).unwrap()).unwrap();
    println!("conformance kinds not run by the Rust client: {NOT_IMPLEMENTED:?}");
    for f in manifest["files"].as_array().unwrap() {
        let kind = f["kind"].as_str().unwrap();
        assert!(
            RUN.contains(&kind) || NOT_IMPLEMENTED.contains(&kind),
            "{}: kind {kind} has no Rust runner",
            f["path"]
        );
    }
    for kind in manifest["kinds"].as_object().unwrap().keys() {
        assert!(RUN.contains(&kind.as_str()), "manifest kind {kind} has no Rust runner");
    }
}

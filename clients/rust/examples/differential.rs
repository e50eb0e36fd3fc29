//! The Rust side of the differential test in tests/clients/test_rust_client.py: one command per
//! stdin line, `decode HEX` or `verify HEX`, answered as `python -m conformance.check` answers
//! (one JSON line each), so the test can compare the two implementations on any bytes; and
//! `lnmp HEX`: the input mapped from LNMP (strict) to an envelope and written back, or Python's
//! error code; `validate HEX`: the JSON `[schema, payload]` validated, the violations' paths;
//! `avro HEX`: the JSON `[schema_text, payload_hex, content_type]` validated and decoded by the
//! Avro schema; `proto HEX`: the JSON `[descriptor_hex, payload_hex, content_type, type_url]`
//! validated by the serialized `FileDescriptorProto` and decoded.

use std::io::BufRead;
use std::path::Path;

#[path = "../tests/jsonform.rs"]
mod jsonform;

use prism_client::codec::{self, Layout, Limits};
use prism_client::signing::{self, SigningKey, VerificationKeys};
use prism_client::PrismError;
use serde_json::{json, Value};

fn kind(e: &PrismError) -> &'static str {
    match e {
        PrismError::Truncated(_) => "truncated",
        PrismError::Malformed(_) | PrismError::Payload(_) => "malformed",
        PrismError::Layout(_) => "unknown_layout",
        PrismError::SizeLimit(_) => "too_large",
        PrismError::LegacySignatureScope(_) => "legacy_signature_scope",
        PrismError::UnsupportedSignatureScope(_) => "unsupported_signature_scope",
        PrismError::AmbiguousEnvelope(_) => "ambiguous_envelope",
        PrismError::AmbiguousMapEntry(_) => "ambiguous_map_entry",
        PrismError::UnknownKey(_) => "unknown_key",
        PrismError::Algorithm(_) => "algorithm_not_allowed",
        _ => "bad_signature",
    }
}

fn keys() -> VerificationKeys {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../conformance/signatures");
    let key = |f: &str| -> Value {
        serde_json::from_slice::<Value>(&std::fs::read(dir.join(f)).expect("vector file")).expect("json")["key"].clone()
    };
    let (h, e) = (key("scope-v2-hmac-sha256.json"), key("scope-v2-ed25519.json"));
    let x = |v: &Value, f: &str| hex::decode(v[f].as_str().unwrap_or("")).unwrap_or_default();
    VerificationKeys::new([
        SigningKey::hmac_sha256(h["key_id"].as_str().unwrap_or(""), &x(&h, "secret_hex"))
            .expect("key")
            .verification_key(),
        SigningKey::ed25519_from_seed(e["key_id"].as_str().unwrap_or(""), &x(&e, "private_seed_hex"))
            .expect("key")
            .verification_key(),
    ])
}

fn decode(data: &[u8]) -> Value {
    match codec::decode_view(data, None, &Limits::default()) {
        Err(e) => json!({"outcome": kind(&e)}),
        Ok(view) => {
            let layout = if view.layout == Layout::Draft {
                "draft"
            } else {
                "reviewed"
            };
            let (env, payload_error) = match view.to_envelope() {
                Ok(env) => (env, None),
                Err(e) => (view.header_envelope(), Some(kind(&e))),
            };
            let mut out = json!({"outcome": "ok", "layout": layout,
                "model": jsonform::json_form(&codec::encode(&env, Layout::Reviewed), "v1")});
            if let Some(p) = payload_error {
                out["payload_error"] = p.into();
            }
            out
        }
    }
}

/// `validate HEX` where HEX is the JSON `[schema, payload]`: the paths of every violation.
fn validate(data: &[u8]) -> Value {
    let Ok(Value::Array(pair)) = serde_json::from_slice::<Value>(data) else {
        return json!({"error": "bad request"});
    };
    match prism_client::registry::violations(&pair[0], &pair[1]) {
        Ok(v) if v.is_empty() => json!({"outcome": "valid"}),
        Ok(v) => json!({"outcome": "invalid", "paths": v.iter().map(|x| x.path.clone()).collect::<Vec<_>>()}),
        Err(e) => json!({"outcome": e.reason()}),
    }
}

fn lnmp(data: &[u8]) -> Value {
    match prism_client::lnmp::to_envelope(data) {
        Err(e) => json!({"outcome": e.reason()}),
        Ok(env) => {
            let mut out = json!({"outcome": "ok",
                "model": jsonform::json_form(&codec::encode(&env, Layout::Reviewed), "v1")});
            match prism_client::lnmp::from_envelope(&env) {
                Ok(bytes) => out["reencoded_hex"] = hex::encode(bytes).into(),
                Err(e) => out["reencode_error"] = e.reason().into(),
            }
            out
        }
    }
}

fn failed(e: &PrismError) -> Value {
    json!({"outcome": "invalid", "reason": e.reason(), "at": e.detail().at})
}

/// `avro HEX`: validation's verdict and, for a valid payload, the decoded value.
fn avro(data: &[u8]) -> Value {
    use prism_client::avro::AvroSchema;
    let Ok(Value::Array(a)) = serde_json::from_slice::<Value>(data) else {
        return json!({"error": "bad request"});
    };
    let text = |i: usize| a.get(i).and_then(Value::as_str).unwrap_or("");
    let payload = hex::decode(text(1)).unwrap_or_default();
    let schema = match AvroSchema::parse(text(0)) {
        Ok(s) => s,
        Err(e) => return failed(&e),
    };
    if let Err(e) = schema.validate(&payload, text(2)) {
        return failed(&e);
    }
    if text(2).contains("json") {
        return json!({"outcome": "valid"});
    }
    match schema.decode_binary(&payload) {
        Ok(v) => json!({"outcome": "valid", "value": v}),
        Err(e) => json!({"outcome": "valid", "decode": e.reason()}),
    }
}

/// `proto HEX`: validation's verdict and, for a valid payload, the decoded value.
fn proto(data: &[u8]) -> Value {
    use prism_client::schema_decode::{validate_protobuf, ResolvedSchema};
    use prost::Message;
    let Ok(Value::Array(a)) = serde_json::from_slice::<Value>(data) else {
        return json!({"error": "bad request"});
    };
    let text = |i: usize| a.get(i).and_then(Value::as_str).unwrap_or("");
    let Ok(file) = prost_types::FileDescriptorProto::decode(hex::decode(text(0)).unwrap_or_default().as_slice()) else {
        return json!({"error": "bad descriptor"});
    };
    let payload = hex::decode(text(1)).unwrap_or_default();
    if let Err(e) = validate_protobuf(&file, &payload, text(2), text(3)) {
        return failed(&e);
    }
    let schema = ResolvedSchema {
        subject: String::new(),
        version: 1,
        format: "protobuf".into(),
        hash: String::new(),
        text: String::new(),
        descriptor: Some(file),
        imports: Vec::new(),
        references: Vec::new(),
    };
    let name = text(3).rsplit('/').next().unwrap_or("");
    let mut answer = match schema.decode(&payload, text(2), name) {
        Ok(d) => json!({"outcome": "valid", "value": d.value}),
        Err(e) => json!({"outcome": "valid", "decode": e.reason()}),
    };
    // a fifth item, the registry's PII fields (`Msg.field`): the decoded value and a JSON
    // payload as sent, masked by their payload paths
    if let Some(pii) = a.get(4).and_then(Value::as_array) {
        let pii: Vec<String> = pii.iter().filter_map(Value::as_str).map(String::from).collect();
        let file = schema.descriptor.as_ref().expect("set above");
        let Ok(paths) = prism_client::schema_decode::payload_pii_paths(file, name, &pii) else {
            return json!({"error": "no pii paths"});
        };
        if let Some(v) = answer.get_mut("value") {
            prism_client::registry::mask_pii(v, &paths);
        }
        if text(2).contains("json") {
            if let Ok(mut sent) = serde_json::from_slice::<Value>(&payload) {
                prism_client::registry::mask_pii(&mut sent, &paths);
                answer["masked_payload"] = sent;
            }
        }
        answer["mask_paths"] = json!(paths);
    }
    answer
}

fn main() {
    let keys = keys();
    for line in std::io::stdin().lock().lines().map_while(Result::ok) {
        let (cmd, hex_text) = line.split_once(' ').unwrap_or((line.as_str(), ""));
        let Ok(data) = hex::decode(hex_text.trim()) else {
            println!("{}", json!({"error": "bad hex"}));
            continue;
        };
        let answer = match cmd {
            "decode" => decode(&data),
            "verify" => match signing::verify_and_decode(&data, &keys, None, &Limits::default(), None) {
                Ok((_, info)) => json!({"outcome": "valid", "key_id": info.key_id, "scope": info.scope}),
                Err(e) => json!({"outcome": kind(&e)}),
            },
            "lnmp" => lnmp(&data),
            "validate" => validate(&data),
            "avro" => avro(&data),
            "proto" => proto(&data),
            _ => json!({"error": "unknown command"}),
        };
        println!("{answer}");
    }
}

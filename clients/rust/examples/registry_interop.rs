//! The Rust side of tests/clients/test_rust_client.py's registry test: read a subject through
//! the Confluent and Prism routes, validate payloads before publishing, mask PII.
//!
//! ```text
//! registry_interop URL USER PASSWORD SUBJECT
//! ```
//! Reads payloads, one per line, on stdin: a JSON document, or `hex:` and the hex of a binary
//! payload (protobuf wire format); prints one JSON line per payload. For a protobuf subject a
//! payload that validates is also decoded by the envelope's schema (`resolve_for_envelope`,
//! which fetches the files its references import) and masked (`decoded`).

use std::io::BufRead;

use prism_client::registry::{self, Auth, RegistryClient};
use serde_json::{json, Value};

fn main() {
    let a: Vec<String> = std::env::args().collect();
    if a.len() != 5 {
        eprintln!("usage: registry_interop URL USER PASSWORD SUBJECT");
        std::process::exit(2);
    }
    let run = || -> Result<(), prism_client::PrismError> {
        let client = RegistryClient::new(
            &a[1],
            Auth::Basic {
                user: a[2].clone(),
                password: a[3].clone(),
            },
        )?;
        let latest = client.latest(&a[4])?;
        let by_id = client.schema_by_id(latest.id)?;
        let pii = client.pii_fields(&a[4], &latest.version.to_string())?;
        // an Avro schema's PII paths are schema paths (`Order.email`): as payload paths
        let mask_paths = match latest.schema_type.as_str() {
            "AVRO" => client.avro_schema(&a[4], latest.version)?.payload_pii_paths(&pii),
            // a protobuf schema's PII paths are by message (`Money.payer_email`), its imports' too
            "PROTOBUF" => {
                let (file, imports) = client.protobuf_descriptors(&a[4], latest.version)?;
                prism_client::schema_decode::payload_pii_paths_with_imports(&file, &imports, "", &pii)?
            }
            _ => pii.clone(),
        };
        println!(
            "{}",
            json!({"version": latest.version, "id": latest.id, "type": latest.schema_type,
            "same_text": by_id == latest.schema, "pii_fields": pii, "mask_paths": mask_paths,
            "subjects": client.subjects()?})
        );
        for line in std::io::stdin().lock().lines().map_while(Result::ok) {
            let (bytes, content_type) = match line.strip_prefix("hex:") {
                Some(h) => (
                    hex_bytes(h).ok_or_else(|| {
                        prism_client::PrismError::Config(prism_client::error::Detail::new(
                            "a hex: line that is not hex",
                            "stdin",
                            "",
                        ))
                    })?,
                    "application/protobuf",
                ),
                None => (line.as_bytes().to_vec(), "application/json"),
            };
            let mut v: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
            let masked = registry::mask_pii(&mut v, &mask_paths);
            // the check on an envelope, as a producer runs it before publishing (an Avro
            // subject's JSON document, by the content type)
            let mut env = prism_client::Envelope::builder(a[4].clone(), "orders")
                .bytes(bytes.clone())
                .content_type(content_type)
                .build()?;
            let checked = registry::validate_for_publish(&mut env, &client, &a[4], "latest");
            let verdict = if latest.schema_type == "JSON" {
                let direct = registry::validate_json(&latest.schema, &bytes);
                assert_eq!(checked.is_ok(), direct.is_ok());
                direct
            } else {
                checked
            };
            // decoded by the schema the envelope now names, as a consumer decodes it
            let decoded = if latest.schema_type == "PROTOBUF" && verdict.is_ok() {
                let schema = client.resolve_for_envelope(&env, &[])?;
                let mut d = schema.decode(&bytes, content_type, "")?.value;
                registry::mask_pii(&mut d, &mask_paths);
                d
            } else {
                Value::Null
            };
            let schema = env.header.schema.as_ref().map(|s| {
                json!({"url": s.schema_url, "version": s.schema_version,
                "hash": s.schema_hash, "format": s.schema_format})
            });
            println!(
                "{}",
                json!({"valid": verdict.is_ok(), "at": verdict.err().map(|e| e.detail().at.clone()),
                "masked": masked, "payload": v, "schema": schema, "decoded": decoded,
                "contains_pii": env.security().and_then(|s| s.contains_pii)})
            );
        }
        Ok(())
    };
    if let Err(e) = run() {
        println!("{}", json!({"fatal": e.to_string(), "reason": e.reason()}));
        std::process::exit(1);
    }
}

fn hex_bytes(h: &str) -> Option<Vec<u8>> {
    let h = h.trim();
    if h.len() % 2 != 0 {
        return None;
    }
    (0..h.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(h.get(i..i + 2)?, 16).ok())
        .collect()
}

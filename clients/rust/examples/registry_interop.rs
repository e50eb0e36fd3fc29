//! The Rust side of tests/clients/test_rust_client.py's registry test: read a subject through
//! the Confluent and Prism routes, validate payloads before publishing, mask PII.
//!
//! ```text
//! registry_interop URL USER PASSWORD SUBJECT
//! ```
//! Reads JSON payloads, one per line, on stdin; prints one JSON line per payload.

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
        let mask_paths = if latest.schema_type == "AVRO" {
            client.avro_schema(&a[4], latest.version)?.payload_pii_paths(&pii)
        } else {
            pii.clone()
        };
        println!(
            "{}",
            json!({"version": latest.version, "id": latest.id, "type": latest.schema_type,
            "same_text": by_id == latest.schema, "pii_fields": pii, "subjects": client.subjects()?})
        );
        for line in std::io::stdin().lock().lines().map_while(Result::ok) {
            let mut v: Value = serde_json::from_str(&line).unwrap_or(Value::Null);
            let masked = registry::mask_pii(&mut v, &mask_paths);
            // the check on an envelope, as a producer runs it before publishing (an Avro
            // subject's JSON document, by the content type)
            let mut env = prism_client::Envelope::builder(a[4].clone(), "orders")
                .bytes(line.as_bytes())
                .content_type("application/json")
                .build()?;
            let checked = registry::validate_for_publish(&mut env, &client, &a[4], "latest");
            let verdict = if latest.schema_type == "JSON" {
                let direct = registry::validate_json(&latest.schema, line.as_bytes());
                assert_eq!(checked.is_ok(), direct.is_ok());
                direct
            } else {
                checked
            };
            let schema = env.header.schema.as_ref().map(|s| {
                json!({"url": s.schema_url, "version": s.schema_version,
                "hash": s.schema_hash, "format": s.schema_format})
            });
            println!(
                "{}",
                json!({"valid": verdict.is_ok(), "at": verdict.err().map(|e| e.detail().at.clone()),
                "masked": masked, "payload": v, "schema": schema,
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

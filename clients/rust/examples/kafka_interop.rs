//! The Rust side of the cross-language Kafka test (tests/clients/test_rust_client.py), and a
//! worked example of `prism_client::kafka`. Keys are the conformance suite's test keys.
//!
//! ```text
//! kafka_interop publish        BROKERS TOPIC N JWT
//! kafka_interop publish-orders BROKERS TOPIC N NAMESPACE
//! kafka_interop subscribe      BROKERS TOPIC EXPECTED CLEARANCE PRINCIPAL AUDIT_TOPIC [ED25519_KEY_ID ED25519_PUBLIC_HEX]
//! ```
//! `publish-orders` writes N plain `internal` JSON orders signed with the HMAC test key (no
//! token, reviewed layout): the producer of tests/clients/test_chain.py, whose worker verifies
//! that key. The optional Ed25519 key of `subscribe` is trusted as well as the HMAC test key:
//! the chain test passes the Prism worker's public key, to verify its re-signed outputs.
//! `subscribe` judges EXPECTED messages (handed out, withheld, undeliverable or dropped as
//! expired), then prints its counters and consumer group as the last line.
//! Every result is one JSON line on stdout. With `PRISM_INTEROP_ASYNC=1`, `publish` and
//! `subscribe` use the async API (`AsyncPublisher`, `AsyncSubscriber`, feature `kafka-async`)
//! on a tokio runtime instead: the test runs both and expects the same results.

use std::path::Path;
use std::time::{Duration, Instant};

use prism_client::codec::Layout;
use prism_client::encryption::{self, Key, Keyring};
use prism_client::error::Detail;
use prism_client::kafka::{
    AsyncPublisher, AsyncSubscriber, Clearance, Delivery, Publisher, Stats, SubscribeOptions, Subscriber,
};
use prism_client::registry::{Auth, RegistryClient};
use prism_client::signing::{SigningKey, VerificationKey, VerificationKeys};
use prism_client::{Envelope, PrismError};
use serde_json::{json, Value};

fn conformance(path: &str) -> Value {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../conformance")
        .join(path);
    serde_json::from_slice(&std::fs::read(p).expect("conformance file")).expect("json")
}

fn hmac_key() -> SigningKey {
    let k = &conformance("signatures/scope-v2-hmac-sha256.json")["key"];
    let secret = hex::decode(k["secret_hex"].as_str().unwrap()).unwrap();
    SigningKey::hmac_sha256(k["key_id"].as_str().unwrap(), &secret).unwrap()
}

fn keyring() -> Keyring {
    let keys = &conformance("encryption/vectors.json")["keys"];
    let h = |k: &Value, f: &str| hex::decode(k[f].as_str().unwrap()).unwrap();
    Keyring::new([
        Key::symmetric("conf-aes-1", &h(&keys["conf-aes-1"], "secret_hex")).unwrap(),
        Key::hybrid_from_private(
            "conf-hybrid-1",
            &h(&keys["conf-hybrid-1"], "x25519_private_hex"),
            &h(&keys["conf-hybrid-1"], "ml_kem_private_seed_hex"),
        )
        .unwrap(),
    ])
}

fn use_async() -> bool {
    std::env::var("PRISM_INTEROP_ASYNC").is_ok_and(|v| v == "1")
}

fn runtime() -> Result<tokio::runtime::Runtime, PrismError> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| PrismError::Config(Detail::new(format!("no tokio runtime: {e}"), "runtime", "")))
}

/// The sync or the async publisher, behind one call.
enum AnyPublisher {
    Sync(Publisher),
    Async(AsyncPublisher, tokio::runtime::Runtime),
}

impl AnyPublisher {
    fn connect(brokers: &str, jwt: &str) -> Result<Self, PrismError> {
        Ok(if use_async() {
            let rt = runtime()?;
            let p = rt.block_on(async { AsyncPublisher::connect(brokers, &[]) })?;
            AnyPublisher::Async(p.with_signing_key(hmac_key()).with_auth_token(jwt), rt)
        } else {
            AnyPublisher::Sync(
                Publisher::connect(brokers, &[])?
                    .with_signing_key(hmac_key())
                    .with_auth_token(jwt),
            )
        })
    }
    fn publish(&self, topic: &str, env: &Envelope, layout: Layout) -> Result<(i32, i64), PrismError> {
        match self {
            AnyPublisher::Sync(p) => p.publish(topic, env, layout),
            AnyPublisher::Async(p, rt) => rt.block_on(p.publish(topic, env, layout)),
        }
    }
}

fn publish(brokers: &str, topic: &str, n: usize, jwt: &str) -> Result<(), PrismError> {
    let publisher = AnyPublisher::connect(brokers, jwt)?;
    let ring = keyring();
    for i in 0..n {
        let mut b = Envelope::builder(topic, "interop")
            .json(&json!({"i": i}))?
            .correlation_id(format!("c-{i}"));
        if i == 3 {
            b = b.data_classification("restricted").contains_pii(true);
        }
        let mut env = b.build()?;
        match i {
            0 => encryption::encrypt_envelope(&mut env, ring.get("conf-aes-1")?)?,
            1 => encryption::encrypt_envelope(&mut env, ring.get("conf-hybrid-1")?)?,
            _ => {}
        }
        let layout = if i % 2 == 0 { Layout::Draft } else { Layout::Reviewed };
        let (partition, offset) = publisher.publish(topic, &env, layout)?;
        println!(
            "{}",
            json!({"i": i, "message_id": env.message_id(), "partition": partition, "offset": offset,
            "layout": layout.name()})
        );
    }
    Ok(())
}

fn publish_orders(brokers: &str, topic: &str, n: usize, namespace: &str) -> Result<(), PrismError> {
    let publisher = Publisher::connect(brokers, &[])?.with_signing_key(hmac_key());
    for i in 0..n {
        let payload = json!({"order_id": format!("rust-{i}"), "customer_id": "c-7", "total": 10.5 + i as f64,
            "currency": "EUR"});
        let env = Envelope::builder(topic, namespace)
            .json(&payload)?
            .data_classification("internal")
            .correlation_id(format!("rust-c-{i}"))
            .build()?;
        let (partition, offset) = publisher.publish(topic, &env, Layout::Reviewed)?;
        println!(
            "{}",
            json!({"i": i, "message_id": env.message_id(), "partition": partition, "offset": offset,
            "payload": payload})
        );
    }
    Ok(())
}

/// One JSON line for a delivered message: what the Python test checks.
/// The registry the subscriber decodes payloads with, when `PRISM_INTEROP_REGISTRY_URL` is set
/// (`PRISM_INTEROP_REGISTRY_USER`/`_PASSWORD`: Basic auth, the registry's `read` role).
fn registry() -> Result<Option<RegistryClient>, PrismError> {
    let Ok(url) = std::env::var("PRISM_INTEROP_REGISTRY_URL") else {
        return Ok(None);
    };
    let auth = match std::env::var("PRISM_INTEROP_REGISTRY_USER") {
        Ok(user) => Auth::Basic {
            user,
            password: std::env::var("PRISM_INTEROP_REGISTRY_PASSWORD").unwrap_or_default(),
        },
        Err(_) => Auth::None,
    };
    RegistryClient::new(&url, auth).map(Some)
}

/// The payload: decoded by the schema its envelope references (resolved from the registry,
/// subject and hash checked) with what decoded it, or - without a registry - read as JSON.
fn payload_of(env: &Envelope, registry: Option<&RegistryClient>) -> Result<(Value, Value), PrismError> {
    let Some(reg) = registry else {
        return Ok((env.payload_json()?, Value::Null));
    };
    let schema = reg.resolve_for_envelope(env, &[])?;
    let content_type = env.content_type().to_owned();
    let name = env
        .header
        .schema
        .as_ref()
        .map(|s| s.schema_name.clone())
        .unwrap_or_default();
    let decoded = schema.decode(&env.payload_bytes()?, &content_type, &name)?;
    let by = json!({"subject": schema.subject, "version": schema.version, "format": schema.format,
        "type": decoded.message_type, "content_type": content_type});
    Ok((decoded.value, by))
}

fn report(d: &Delivery, ring: &Keyring, registry: Option<&RegistryClient>) -> Result<(), PrismError> {
    let env = if d.envelope.is_encrypted() {
        encryption::decrypt_to_envelope(&d.envelope, ring)?
    } else {
        d.envelope.clone()
    };
    let (payload, decoded_by) = payload_of(&env, registry)?;
    let sec = d.envelope.security();
    let schema = d.envelope.header.schema.as_ref();
    let extensions: serde_json::Map<String, Value> = d
        .envelope
        .header
        .extensions
        .iter()
        .map(|(k, v)| (k.clone(), Value::from(String::from_utf8_lossy(v).into_owned())))
        .collect();
    println!(
        "{}",
        json!({
            "message_id": d.envelope.message_id(), "offset": d.offset,
            "key_id": d.signature.as_ref().map(|s| s.key_id.clone()),
            "scope": d.signature.as_ref().map(|s| s.scope),
            "classification": sec.and_then(|s| s.data_classification.clone()),
            "auth_token": sec.and_then(|s| s.auth_token.clone()),
            "publisher_id": sec.and_then(|s| s.publisher_id.clone()),
            "payload": payload,
            "schema": schema.map(|s| json!({"name": s.schema_name, "version": s.schema_version,
                "format": s.schema_format, "hash": s.schema_hash, "url": s.schema_url})),
            "decoded_by": decoded_by,
            "extensions": extensions,
        })
    );
    Ok(())
}

/// The async subscriber's loop: one `next().await` at a time, until `expected` messages were
/// judged or 60 s passed.
fn subscribe_async(brokers: &str, topic: &str, expected: u64, opts: SubscribeOptions) -> Result<(), PrismError> {
    let group = opts.group.clone();
    let rt = runtime()?;
    let ring = keyring();
    let reg = registry()?;
    let stats = rt.block_on(async {
        let mut sub = AsyncSubscriber::connect(brokers, topic, opts, &[])?;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        while judged(&sub.stats) < expected {
            let Ok(next) = tokio::time::timeout_at(deadline, sub.next()).await else {
                break;
            };
            match next? {
                Ok(d) => {
                    sub.ack(&d)?;
                    report(&d, &ring, reg.as_ref())?;
                }
                Err(u) => {
                    println!("{}", json!({"offset": u.offset, "error": u.error.reason()}));
                    sub.ack_at(u.partition, u.offset)?;
                }
            }
        }
        sub.flush_refusals().await?; // `next` cancelled at the deadline may still hold some
        Ok::<_, PrismError>(sub.stats.clone())
    })?;
    print_stats(&stats, &group);
    Ok(())
}

/// The messages judged so far: handed out, withheld, undeliverable or dropped as expired.
fn judged(s: &Stats) -> u64 {
    s.delivered + s.withheld + s.failed + s.expired
}

/// The last line: the subscription's counters and its consumer group (whose committed
/// offsets the test reads).
fn print_stats(s: &Stats, group: &str) {
    println!(
        "{}",
        json!({"stats": {"delivered": s.delivered, "withheld": s.withheld, "audited": s.audited,
        "failed": s.failed, "expired": s.expired, "refusal_records": s.refusal_records}, "group": group})
    );
}

fn subscribe(
    brokers: &str,
    topic: &str,
    expected: u64,
    clearance: &str,
    principal: &str,
    audit_topic: &str,
    ed25519: Option<(&str, &str)>,
) -> Result<(), PrismError> {
    let clearance = match clearance {
        "public" => Clearance::Public,
        "internal" => Clearance::Internal,
        "confidential" => Clearance::Confidential,
        _ => Clearance::Restricted,
    };
    let mut trusted = vec![hmac_key().verification_key()];
    if let Some((key_id, public_hex)) = ed25519 {
        let public = hex::decode(public_hex).map_err(|_| {
            PrismError::KeyNotUsable(Detail::new(
                "ED25519_PUBLIC_HEX is not hex",
                "argv",
                "pass the 32-byte public key as hex",
            ))
        })?;
        trusted.push(VerificationKey::ed25519_public(key_id, &public)?);
    }
    let opts = SubscribeOptions {
        verify_with: Some(VerificationKeys::new(trusted)),
        clearance,
        principal: Some(principal.to_owned()),
        group: format!("rust-interop-{}", std::process::id()),
        audit_topic: audit_topic.to_owned(),
        signing_key: Some(hmac_key()),
        ..Default::default()
    };
    let group = opts.group.clone();
    if use_async() {
        return subscribe_async(brokers, topic, expected, opts);
    }
    let mut sub = Subscriber::connect(brokers, topic, opts, &[])?;
    let ring = keyring();
    let reg = registry()?;
    let deadline = Instant::now() + Duration::from_secs(60);
    while judged(&sub.stats) < expected && Instant::now() < deadline {
        for r in sub.poll(Duration::from_millis(500), 100)? {
            match r {
                Ok(d) => {
                    sub.ack(&d)?;
                    report(&d, &ring, reg.as_ref())?;
                }
                Err(u) => {
                    println!("{}", json!({"offset": u.offset, "error": u.error.reason()}));
                    sub.ack_at(u.partition, u.offset)?; // reported (a real consumer: DLQ), then settled
                }
            }
        }
    }
    print_stats(&sub.stats, &group);
    Ok(())
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let brokers = args.get(2).cloned().unwrap_or_default();
    let result = match (args.get(1).map(String::as_str), args.len()) {
        (Some("publish"), 6) => publish(&brokers, &args[3], args[4].parse().unwrap_or(0), &args[5]),
        (Some("publish-orders"), 6) => publish_orders(&brokers, &args[3], args[4].parse().unwrap_or(0), &args[5]),
        (Some("subscribe"), 8 | 10) => subscribe(
            &brokers,
            &args[3],
            args[4].parse().unwrap_or(0),
            &args[5],
            &args[6],
            &args[7],
            args.get(8).map(String::as_str).zip(args.get(9).map(String::as_str)),
        ),
        _ => {
            eprintln!("usage: kafka_interop publish BROKERS TOPIC N JWT | publish-orders BROKERS TOPIC N NAMESPACE | subscribe BROKERS TOPIC EXPECTED CLEARANCE PRINCIPAL AUDIT_TOPIC [ED25519_KEY_ID ED25519_PUBLIC_HEX]");
            std::process::exit(2);
        }
    };
    if let Err(e) = result {
        println!("{}", json!({"fatal": e.to_string(), "reason": e.reason()}));
        std::process::exit(1);
    }
}

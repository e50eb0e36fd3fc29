//! Kafka publish and subscribe (feature `kafka`), on rskafka: a pure-Rust Kafka client, so the
//! crate builds without librdkafka's C/cmake build (docs/sdk-rust.md, "Kafka" says why and what
//! that costs). Records are laid out by [`crate::binding`], exactly as the Python SDK does.
//!
//! * Publish: optional JWT in `security.auth_token` (verified and stripped by the worker; not
//!   covered by a scope-v2 signature), signature scope v2, key = correlation id, murmur2
//!   partitioning like Kafka's Java client (and so aiokafka), timestamp = `published_at_ms`.
//! * Subscribe: `read_committed` fetches (rskafka's fetch requests always ask for
//!   READ_COMMITTED, so records of aborted or open transactions are never delivered), signature
//!   verification before decoding, classification clearance, and a signed audit record before a
//!   confidential or restricted message is handed out (docs/sdk.md, "Classification and audit").

use std::collections::BTreeMap;
use std::sync::Arc;

use rskafka::client::partition::{Compression, OffsetAt, PartitionClient, UnknownTopicHandling};
use rskafka::client::{Client, ClientBuilder};
use rskafka::record::Record;

use crate::binding::{self, KafkaRecord};
use crate::codec::{Layout, Limits};
use crate::error::{err, PrismError, Result};
use crate::model::{now_ms, Envelope};
use crate::signing::{SignatureInfo, SigningKey, VerificationKeys};

fn transport(e: impl std::fmt::Display, what: &str) -> PrismError {
    err!(
        Transport,
        format!("{what}: {e}"),
        "kafka",
        "check the broker address and that the broker is up"
    )
}

/// Kafka's default partitioner for keyed records (murmur2, as the Java client and aiokafka).
pub fn murmur2_partition(key: &[u8], partitions: i32) -> i32 {
    const M: u32 = 0x5bd1_e995;
    let mut h: u32 = 0x9747_b28c ^ key.len() as u32;
    let chunks = key.chunks_exact(4);
    let tail = chunks.remainder();
    for c in chunks {
        let mut k = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> 24;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M) ^ k;
    }
    if tail.len() >= 3 {
        h ^= u32::from(tail[2]) << 16;
    }
    if tail.len() >= 2 {
        h ^= u32::from(tail[1]) << 8;
    }
    if !tail.is_empty() {
        h ^= u32::from(tail[0]);
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    ((h & 0x7fff_ffff) % partitions.max(1) as u32) as i32
}

async fn connect(brokers: &[String]) -> Result<Client> {
    ClientBuilder::new(brokers.to_vec())
        .build()
        .await
        .map_err(|e| transport(e, "cannot connect"))
}

async fn partitions_of(client: &Client, topic: &str) -> Result<Vec<i32>> {
    let topics = client
        .list_topics()
        .await
        .map_err(|e| transport(e, "cannot list topics"))?;
    let mut parts = topics
        .into_iter()
        .find(|t| t.name == topic)
        .map(|t| t.partitions.into_iter().collect::<Vec<_>>())
        .ok_or_else(|| {
            err!(
                Transport,
                format!("topic {topic:?} does not exist"),
                "kafka",
                "create it first (Publisher::create_topic, or the broker's tools)"
            )
        })?;
    parts.sort_unstable();
    Ok(parts)
}

/// Publishes envelopes to Kafka.
pub struct Publisher {
    client: Client,
    signing_key: Option<SigningKey>,
    auth_token: Option<String>,
    partitions: tokio::sync::Mutex<BTreeMap<String, Vec<Arc<PartitionClient>>>>,
    round_robin: std::sync::atomic::AtomicUsize,
}

impl Publisher {
    /// Connect to `brokers` (`host:port`).
    pub async fn connect(brokers: &[String]) -> Result<Self> {
        Ok(Publisher {
            client: connect(brokers).await?,
            signing_key: None,
            auth_token: None,
            partitions: Default::default(),
            round_robin: Default::default(),
        })
    }
    /// Sign every envelope (scope v2).
    pub fn with_signing_key(mut self, key: SigningKey) -> Self {
        self.signing_key = Some(key);
        self
    }
    /// Attach a JWT to every envelope (`security.auth_token`), for the worker's `authenticate` stage.
    pub fn with_auth_token(mut self, jwt: impl Into<String>) -> Self {
        self.auth_token = Some(jwt.into());
        self
    }
    /// Create a topic (no error when it exists).
    pub async fn create_topic(&self, topic: &str, partitions: i32, replication: i16) -> Result<()> {
        let ctl = self
            .client
            .controller_client()
            .map_err(|e| transport(e, "no controller"))?;
        match ctl.create_topic(topic, partitions, replication, 10_000).await {
            Ok(()) => Ok(()),
            Err(rskafka::client::error::Error::ServerError {
                protocol_error: rskafka::client::error::ProtocolError::TopicAlreadyExists,
                ..
            }) => Ok(()),
            Err(e) => Err(transport(e, "cannot create topic")),
        }
    }

    async fn partition_clients(&self, topic: &str) -> Result<Vec<Arc<PartitionClient>>> {
        let mut cache = self.partitions.lock().await;
        if let Some(p) = cache.get(topic) {
            return Ok(p.clone());
        }
        let mut out = Vec::new();
        for p in partitions_of(&self.client, topic).await? {
            let pc = self
                .client
                .partition_client(topic, p, UnknownTopicHandling::Retry)
                .await
                .map_err(|e| transport(e, "no partition leader"))?;
            out.push(Arc::new(pc));
        }
        cache.insert(topic.to_owned(), out.clone());
        Ok(out)
    }

    /// Publish `env` to `topic` in `layout`; returns (partition, offset).
    pub async fn publish(&self, topic: &str, env: &Envelope, layout: Layout) -> Result<(i32, i64)> {
        let mut env = env.clone();
        if let Some(t) = &self.auth_token {
            env.security_mut().auth_token = Some(t.clone());
        }
        let rec = binding::encode(&env, layout, None, &[], self.signing_key.as_ref())?;
        self.send(topic, rec).await
    }

    /// Send an already encoded record.
    pub async fn send(&self, topic: &str, rec: KafkaRecord) -> Result<(i32, i64)> {
        let parts = self.partition_clients(topic).await?;
        let i = match &rec.key {
            Some(k) => murmur2_partition(k, parts.len() as i32) as usize,
            None => self.round_robin.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % parts.len(),
        };
        let pc = &parts[i];
        let timestamp = chrono::DateTime::from_timestamp_millis(rec.timestamp_ms).unwrap_or_default();
        let record = Record {
            key: rec.key,
            value: Some(rec.value),
            // rskafka keeps headers in a map: one value per name, which is all the binding writes
            headers: rec.headers.into_iter().collect(),
            timestamp,
        };
        let offsets = pc
            .produce(vec![record], Compression::NoCompression)
            .await
            .map_err(|e| transport(e, "produce failed"))?;
        Ok((pc.partition(), offsets.first().copied().unwrap_or(-1)))
    }
}

/// What a subscriber may read: `public` < `internal` < `confidential` < `restricted`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Clearance {
    Public,
    Internal,
    Confidential,
    Restricted,
}

impl Clearance {
    /// The level of a classification word: absent or empty is `internal`, unknown is `restricted`
    /// (as in the Python SDK).
    pub fn of(classification: Option<&str>) -> Clearance {
        match classification.unwrap_or("").to_ascii_lowercase().as_str() {
            "" | "internal" => Clearance::Internal,
            "public" => Clearance::Public,
            "confidential" => Clearance::Confidential,
            _ => Clearance::Restricted,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Clearance::Public => "public",
            Clearance::Internal => "internal",
            Clearance::Confidential => "confidential",
            Clearance::Restricted => "restricted",
        }
    }
}

/// Subscription settings (the Python SDK's `subscribe(...)` arguments).
#[derive(Debug, Clone)]
pub struct SubscribeOptions {
    /// Every message must be signed by one of these (None: signatures are not checked).
    pub verify_with: Option<VerificationKeys>,
    /// Default `internal`; above `internal` needs a `principal`.
    pub clearance: Clearance,
    /// Who reads (a service account), recorded in audit records.
    pub principal: Option<String>,
    /// A name for this reader in audit records (rskafka has no consumer groups; see docs).
    pub group: String,
    /// Where audit records go (default `prism.audit`).
    pub audit_topic: String,
    /// Signs audit records when set.
    pub signing_key: Option<SigningKey>,
    pub limits: Limits,
    /// Start at the earliest offset (true) or at the end (false).
    pub from_beginning: bool,
}

impl Default for SubscribeOptions {
    fn default() -> Self {
        SubscribeOptions {
            verify_with: None,
            clearance: Clearance::Internal,
            principal: None,
            group: "prism-rust".into(),
            audit_topic: "prism.audit".into(),
            signing_key: None,
            limits: Limits::default(),
            from_beginning: true,
        }
    }
}

/// One message handed out.
#[derive(Debug, Clone)]
pub struct Delivery {
    pub envelope: Envelope,
    pub signature: Option<SignatureInfo>,
    pub partition: i32,
    pub offset: i64,
}

/// A message that could not be handed out: where it is and why (never dropped silently).
#[derive(Debug, Clone)]
pub struct Undeliverable {
    pub partition: i32,
    pub offset: i64,
    pub error: PrismError,
}

/// Counters of a subscription.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    pub delivered: u64,
    pub withheld: u64,
    pub audited: u64,
    pub failed: u64,
}

/// Reads one topic's partitions (read_committed), verifying and judging every message.
pub struct Subscriber {
    topic: String,
    parts: Vec<(Arc<PartitionClient>, i64)>,
    opts: SubscribeOptions,
    audit: Publisher,
    pub stats: Stats,
}

impl Subscriber {
    /// Subscribe to every partition of `topic`.
    pub async fn connect(brokers: &[String], topic: &str, opts: SubscribeOptions) -> Result<Self> {
        let mut problems = Vec::new();
        if opts.clearance > Clearance::Internal && opts.principal.as_deref().unwrap_or("").is_empty() {
            problems.push(format!("clearance {} needs a principal", opts.clearance.name()));
        }
        if opts
            .principal
            .as_deref()
            .is_some_and(|p| p.contains(char::is_whitespace))
        {
            problems.push("principal must not contain spaces".into());
        }
        if opts.audit_topic == topic {
            problems.push("audit_topic must differ from the subscribed topic".into());
        }
        if !problems.is_empty() {
            return Err(err!(
                Config,
                problems.join("; "),
                "subscribe",
                "fix the subscription options"
            ));
        }
        let client = connect(brokers).await?;
        let mut parts = Vec::new();
        for p in partitions_of(&client, topic).await? {
            let pc = client
                .partition_client(topic, p, UnknownTopicHandling::Retry)
                .await
                .map_err(|e| transport(e, "no partition leader"))?;
            let at = if opts.from_beginning {
                OffsetAt::Earliest
            } else {
                OffsetAt::Latest
            };
            let start = pc
                .get_offset(at)
                .await
                .map_err(|e| transport(e, "cannot read offsets"))?;
            parts.push((Arc::new(pc), start));
        }
        let mut audit = Publisher::connect(brokers).await?;
        if let Some(k) = &opts.signing_key {
            audit = audit.with_signing_key(k.clone());
        }
        Ok(Subscriber {
            topic: topic.to_owned(),
            parts,
            opts,
            audit,
            stats: Stats::default(),
        })
    }

    /// The next offset to read of each partition (persist it to resume; rskafka has no group commits).
    pub fn positions(&self) -> Vec<(i32, i64)> {
        self.parts.iter().map(|(p, o)| (p.partition(), *o)).collect()
    }

    /// Fetch what is there (waiting up to `max_wait_ms` per partition) and judge each record.
    pub async fn poll(&mut self, max_wait_ms: i32) -> Result<Vec<std::result::Result<Delivery, Undeliverable>>> {
        let mut out = Vec::new();
        for i in 0..self.parts.len() {
            let (pc, offset) = (Arc::clone(&self.parts[i].0), self.parts[i].1);
            let (records, _high) = pc
                .fetch_records(offset, 1..4 * 1024 * 1024, max_wait_ms)
                .await
                .map_err(|e| transport(e, "fetch failed"))?;
            for r in records {
                self.parts[i].1 = r.offset + 1;
                let rec = KafkaRecord {
                    key: r.record.key,
                    value: r.record.value.unwrap_or_default(),
                    headers: r.record.headers.into_iter().collect(),
                    timestamp_ms: r.record.timestamp.timestamp_millis(),
                };
                match self.judge(&rec, pc.partition(), r.offset).await {
                    Ok(Some(d)) => {
                        self.stats.delivered += 1;
                        out.push(Ok(d));
                    }
                    Ok(None) => self.stats.withheld += 1,
                    Err(error) => {
                        self.stats.failed += 1;
                        out.push(Err(Undeliverable {
                            partition: pc.partition(),
                            offset: r.offset,
                            error,
                        }));
                    }
                }
            }
        }
        Ok(out)
    }

    /// Verify, decode, apply the clearance, audit; `None` when withheld.
    async fn judge(&mut self, rec: &KafkaRecord, partition: i32, offset: i64) -> Result<Option<Delivery>> {
        let (view, signature) = binding::decode(rec, &self.opts.limits, self.opts.verify_with.as_ref())?;
        let envelope = view.to_envelope();
        let level = Clearance::of(envelope.security().and_then(|s| s.data_classification.as_deref()));
        if level > self.opts.clearance {
            return Ok(None); // withheld: judged by the envelope, never by a header
        }
        if level >= Clearance::Confidential {
            self.write_audit(&envelope, level, partition, offset).await?;
            self.stats.audited += 1;
        }
        Ok(Some(Delivery {
            envelope,
            signature,
            partition,
            offset,
        }))
    }

    async fn write_audit(&self, env: &Envelope, level: Clearance, partition: i32, offset: i64) -> Result<()> {
        let now = now_ms();
        let record = serde_json::json!({
            "event": "classified_delivery",
            "principal": self.opts.principal.clone().unwrap_or_default(),
            "group": self.opts.group,
            "message_id": env.message_id(),
            "namespace": env.namespace(),
            "topic": self.topic,
            "classification": level.name(),
            "time": chrono::DateTime::from_timestamp_millis(now).unwrap_or_default().to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
            "time_ms": now,
            "backend": "kafka",
            "ref": format!("{partition}:{offset}"),
        });
        let audit = Envelope::builder(self.opts.audit_topic.clone(), env.namespace())
            .json(&record)?
            .correlation_id(env.message_id())
            .data_classification("internal")
            .build()?;
        self.audit
            .publish(&self.opts.audit_topic, &audit, Layout::Reviewed)
            .await
            .map(|_| ())
            .map_err(|e| {
                err!(
                    Transport,
                    format!("audit record not written, message not handed out: {e}"),
                    "audit_topic",
                    "the message is fetched again from the same position; check the audit topic"
                )
            })
    }

    /// Rewind a partition (a nack): its records from `offset` on are fetched again.
    pub fn seek(&mut self, partition: i32, offset: i64) {
        for (pc, o) in &mut self.parts {
            if pc.partition() == partition {
                *o = offset;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn murmur2_matches_kafka() {
        // The same partitions as aiokafka's DefaultPartitioner (murmur2 & 0x7fffffff, mod n)
        assert_eq!(murmur2_partition(b"21", i32::MAX), 1_173_551_340);
        assert_eq!(murmur2_partition(b"foobar", i32::MAX), 1_357_151_166);
        assert_eq!(murmur2_partition(b"c-1", 7), 5);
        assert_eq!(murmur2_partition(b"abc", 7), 4);
    }

    #[test]
    fn clearance_words() {
        assert_eq!(Clearance::of(None), Clearance::Internal);
        assert_eq!(Clearance::of(Some("PUBLIC")), Clearance::Public);
        assert_eq!(Clearance::of(Some("secret")), Clearance::Restricted);
    }
}

//! Kafka publish and subscribe (feature `kafka`), on rdkafka (librdkafka) linked dynamically to
//! the system library, so the crate has no C build (docs/sdk-rust.md, "Kafka", says why).
//! Records are laid out by [`crate::binding`], exactly as the Python SDK does.
//!
//! * Publish: optional JWT in `security.auth_token` (verified and stripped by the worker; not
//!   covered by a scope-v2 signature), signature scope v2, key = correlation id, the `murmur2`
//!   partitioner of Kafka's Java client (and so aiokafka's), timestamp = `published_at_ms`,
//!   idempotent producer; `publish` returns once the broker acknowledged.
//! * Subscribe: a consumer group with `isolation.level=read_committed` (records of aborted or
//!   open transactions are never delivered), signature verification before decoding,
//!   classification clearance, a signed audit record before a confidential or restricted
//!   message is handed out (docs/sdk.md, "Classification and audit"), explicit commits (`ack`).
//!   A message past its TTL ([`Envelope::is_expired`]: `published_at_ms + ttl_seconds * 1000`,
//!   the Python SDK's and the Go client's rule) is counted in [`Stats::expired`], committed
//!   and skipped - after the clearance check, before any audit record - unless
//!   [`SubscribeOptions::drop_expired`] is false ([`ExpiredCommits`] says when it is committed).
//!   A message withheld for clearance is held until the one signed `classified_refused`
//!   record of the refusals met in one fetch (at most [`REFUSALS_PER_RECORD`] messages and
//!   ~[`REFUSAL_RECORD_BYTES`]) is written, then committed - the Python SDK's format
//!   (app/sdk/audit.py), so `prism audit --keyring` reads and verifies it.
//! * Async (feature `kafka-async`): [`AsyncPublisher`] and [`AsyncSubscriber`] do the same on
//!   rdkafka's `FutureProducer` and `StreamConsumer`, for tokio applications.

use std::collections::HashMap;
use std::sync::mpsc::{sync_channel, SyncSender};
use std::sync::Mutex;
use std::time::Duration;

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::message::{Header, Headers, Message, OwnedHeaders};
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use rdkafka::ClientContext;

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

type Ack = std::result::Result<(i32, i64), String>;

/// The producer settings both publishers share: murmur2 partitioning (Kafka's Java client's,
/// so the same key lands on the same partition as from Python), idempotence.
fn producer_config(bootstrap: &str, extra: &[(&str, &str)]) -> ClientConfig {
    let mut cfg = ClientConfig::new();
    cfg.set("bootstrap.servers", bootstrap)
        .set("partitioner", "murmur2_random")
        .set("enable.idempotence", "true");
    for (k, v) in extra {
        cfg.set(*k, *v);
    }
    cfg
}

/// The record for `env`: the JWT attached, laid out and signed by [`crate::binding`].
fn outgoing(env: &Envelope, layout: Layout, jwt: Option<&str>, key: Option<&SigningKey>) -> Result<KafkaRecord> {
    let mut env = env.clone();
    if let Some(t) = jwt {
        env.security_mut().auth_token = Some(t.to_owned());
    }
    binding::encode(&env, layout, None, &[], key)
}

fn headers_of(rec: &KafkaRecord) -> OwnedHeaders {
    let mut headers = OwnedHeaders::new_with_capacity(rec.headers.len());
    for (n, v) in &rec.headers {
        headers = headers.insert(Header { key: n, value: Some(v) });
    }
    headers
}

/// A received message as the binding reads it, with its partition and offset.
fn incoming<M: Message>(m: &M) -> (KafkaRecord, i32, i64) {
    let headers = m
        .headers()
        .map(|h| {
            h.iter()
                .map(|x| (x.key.to_owned(), x.value.unwrap_or(&[]).to_vec()))
                .collect()
        })
        .unwrap_or_default();
    let rec = KafkaRecord {
        key: m.key().map(<[u8]>::to_vec),
        value: m.payload().unwrap_or(&[]).to_vec(),
        headers,
        timestamp_ms: m.timestamp().to_millis().unwrap_or(0),
    };
    (rec, m.partition(), m.offset())
}

/// Hands each delivery report to the `publish` call that waits for it.
pub struct DeliveryContext;

impl ClientContext for DeliveryContext {}

impl ProducerContext for DeliveryContext {
    type DeliveryOpaque = Box<SyncSender<Ack>>;
    fn delivery(&self, result: &DeliveryResult<'_>, tx: Self::DeliveryOpaque) {
        let ack = match result {
            Ok(m) => Ok((m.partition(), m.offset())),
            Err((e, _)) => Err(e.to_string()),
        };
        let _ = tx.send(ack); // the caller may have timed out and gone: nothing to report to then
    }
}

/// Publishes envelopes to Kafka.
pub struct Publisher {
    producer: ThreadedProducer<DeliveryContext>,
    signing_key: Option<SigningKey>,
    auth_token: Option<String>,
    timeout: Duration,
}

impl Publisher {
    /// Connect to `bootstrap` (`host:port[,host:port]`). `extra` are librdkafka settings
    /// (security.protocol, sasl.*, ssl.*, acks, linger.ms, ...).
    pub fn connect(bootstrap: &str, extra: &[(&str, &str)]) -> Result<Self> {
        let producer = producer_config(bootstrap, extra)
            .create_with_context(DeliveryContext)
            .map_err(|e| transport(e, "cannot create producer"))?;
        Ok(Publisher {
            producer,
            signing_key: None,
            auth_token: None,
            timeout: Duration::from_secs(30),
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

    /// Publish `env` to `topic` in `layout`; returns (partition, offset) once acknowledged.
    pub fn publish(&self, topic: &str, env: &Envelope, layout: Layout) -> Result<(i32, i64)> {
        let rec = outgoing(env, layout, self.auth_token.as_deref(), self.signing_key.as_ref())?;
        self.send(topic, &rec)
    }

    /// Send an already encoded record and wait for the broker's acknowledgement.
    pub fn send(&self, topic: &str, rec: &KafkaRecord) -> Result<(i32, i64)> {
        let (tx, rx) = sync_channel(1);
        let mut r = BaseRecord::with_opaque_to(topic, Box::new(tx))
            .payload(&rec.value)
            .headers(headers_of(rec))
            .timestamp(rec.timestamp_ms);
        if let Some(k) = &rec.key {
            r = r.key(k);
        }
        self.producer
            .send(r)
            .map_err(|(e, _)| transport(e, "produce refused"))?;
        match rx.recv_timeout(self.timeout) {
            Ok(Ok(at)) => Ok(at),
            Ok(Err(e)) => Err(transport(e, "produce failed")),
            Err(_) => Err(transport("no acknowledgement in time", "produce timed out")),
        }
    }

    /// Wait until everything sent was acknowledged.
    pub fn flush(&self) -> Result<()> {
        self.producer
            .flush(self.timeout)
            .map_err(|e| transport(e, "flush failed"))
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
    /// The consumer group (offsets are committed by `ack`).
    pub group: String,
    /// Every message must be signed by one of these (None: signatures are not checked).
    pub verify_with: Option<VerificationKeys>,
    /// Default `internal`; above `internal` needs a `principal`.
    pub clearance: Clearance,
    /// Who reads (a service account), recorded in audit records.
    pub principal: Option<String>,
    /// Where audit records go (default `prism.audit`).
    pub audit_topic: String,
    /// Signs audit records when set.
    pub signing_key: Option<SigningKey>,
    pub limits: Limits,
    /// Where a new group starts: the earliest offset (true) or the end (false).
    pub from_beginning: bool,
    /// Drop messages past their TTL (default true, as the Python SDK's `drop_expired` and the
    /// Go client's `KeepExpired: false`): counted in [`Stats::expired`], committed, never
    /// handed out. False hands them out like any other (check [`Envelope::is_expired`]).
    pub drop_expired: bool,
}

impl Default for SubscribeOptions {
    fn default() -> Self {
        SubscribeOptions {
            group: "prism-rust".into(),
            verify_with: None,
            clearance: Clearance::Internal,
            principal: None,
            audit_topic: "prism.audit".into(),
            signing_key: None,
            limits: Limits::default(),
            from_beginning: true,
            drop_expired: true,
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

/// A message that could not be handed out: where it is and why (never dropped silently; the
/// caller decides, typically a DLQ, then `ack_at`).
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
    /// Messages past their TTL, dropped (committed, never handed out): Python's
    /// `stats["expired"]`, Go's `Stats().Expired`.
    pub expired: u64,
    /// `classified_refused` audit records written (one per fetch's refusals, or per
    /// [`REFUSALS_PER_RECORD`]).
    pub refusal_records: u64,
}

/// Most refused messages one `classified_refused` record names (as in the Python SDK).
pub const REFUSALS_PER_RECORD: usize = 256;
/// About the most bytes the refused messages of one record take (as in the Python SDK).
pub const REFUSAL_RECORD_BYTES: usize = 48 * 1024;

/// One message withheld for clearance, held (not committed) until its audit record is written.
#[derive(Debug, Clone)]
struct Refusal {
    message_id: String,
    namespace: String,
    level: Clearance,
    partition: i32,
    offset: i64,
}

impl Refusal {
    fn reference(&self) -> String {
        format!("{}:{}", self.partition, self.offset)
    }
}

/// The refusals met while working through one fetch. Whoever can publish to a topic can make
/// every message a refusal for some subscriber, so they share one record (app/sdk/audit.py
/// says why): a flood costs the audit topic ~60 bytes per refused message, never a record each.
#[derive(Debug, Default)]
struct Refusals {
    held: Vec<Refusal>,
    bytes: usize,
}

impl Refusals {
    /// Hold one; true when the record is full and must be written now.
    fn push(&mut self, r: Refusal) -> bool {
        self.bytes += r.message_id.len() + r.namespace.len() + r.level.name().len() + r.reference().len() + 12;
        self.held.push(r);
        self.held.len() >= REFUSALS_PER_RECORD || self.bytes >= REFUSAL_RECORD_BYTES
    }

    /// Hand over what is held, leaving nothing.
    fn take(&mut self) -> Vec<Refusal> {
        self.bytes = 0;
        std::mem::take(&mut self.held)
    }
}

/// The one `classified_refused` record of `held` (not empty), in the Python SDK's form: a
/// single refusal as a delivery record plus `clearance`; several as the first one's fields
/// with the highest classification, `count`, and every message as `[id, classification, ref]`
/// (a fourth item, the namespace, where it is not the record's).
fn refusal_record(topic: &str, opts: &SubscribeOptions, held: &[Refusal]) -> Result<Envelope> {
    let first = &held[0];
    let top = held.iter().map(|r| r.level).max().unwrap_or(first.level);
    let now = now_ms();
    let mut record = serde_json::json!({
        "event": "classified_refused",
        "principal": opts.principal.clone(),
        "group": opts.group,
        "message_id": first.message_id,
        "namespace": first.namespace,
        "topic": topic,
        "classification": top.name(),
        "time": iso8601_utc(now),
        "time_ms": now,
        "backend": "kafka",
        "ref": first.reference(),
        "clearance": opts.clearance.name(),
    });
    if held.len() > 1 {
        let messages: Vec<serde_json::Value> = held
            .iter()
            .map(|r| {
                let mut m = vec![r.message_id.clone(), r.level.name().to_owned(), r.reference()];
                if r.namespace != first.namespace {
                    m.push(r.namespace.clone());
                }
                serde_json::json!(m)
            })
            .collect();
        record["count"] = serde_json::json!(held.len());
        record["messages"] = serde_json::Value::Array(messages);
    }
    audit_builder(&opts.audit_topic, &first.namespace, &first.message_id)
        .json(&record)?
        .build_quoting()
}

/// An audit record's envelope: classified internal, in the audited message's namespace, its
/// id as the correlation id - unless the worker would refuse it as an id (only a producer
/// outside Prism writes one), as the Python and Go clients do; the record still names it.
fn audit_builder(audit_topic: &str, namespace: &str, message_id: &str) -> crate::model::EnvelopeBuilder {
    let b = Envelope::builder(audit_topic.to_owned(), namespace.to_owned()).data_classification("internal");
    match crate::model::text_problem(message_id, crate::model::MAX_ID_LENGTH) {
        None => b.correlation_id(message_id.to_owned()),
        Some(_) => b,
    }
}

/// Where each partition of `held` must be read again from (its earliest held offset).
fn rewind_points(held: &[Refusal]) -> Vec<(i32, i64)> {
    let mut at: Vec<(i32, i64)> = Vec::new();
    for r in held {
        match at.iter_mut().find(|(p, _)| *p == r.partition) {
            Some((_, o)) => *o = (*o).min(r.offset),
            None => at.push((r.partition, r.offset)),
        }
    }
    at
}

fn refusal_audit_failed(e: PrismError, n: usize) -> PrismError {
    err!(
        Transport,
        format!("refusal audit record not written, {n} withheld message(s) not committed: {e}"),
        "audit_topic",
        "they are fetched (and refused, and audited) again; check the audit topic"
    )
}

/// The subscription's options checked (every problem at once), then the consumer settings:
/// read_committed, explicit commits, where a new group starts.
fn consumer_config(
    bootstrap: &str,
    topic: &str,
    opts: &SubscribeOptions,
    extra: &[(&str, &str)],
) -> Result<ClientConfig> {
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
    let mut cfg = ClientConfig::new();
    cfg.set("bootstrap.servers", bootstrap)
        .set("group.id", &opts.group)
        .set("isolation.level", "read_committed")
        .set("enable.auto.commit", "false")
        .set(
            "auto.offset.reset",
            if opts.from_beginning { "earliest" } else { "latest" },
        );
    for (k, v) in extra {
        cfg.set(*k, *v);
    }
    Ok(cfg)
}

/// What a subscriber does with one record.
enum Verdict {
    /// Above the subscriber's clearance: never handed out; committed once its refusal's
    /// audit record is written.
    Withheld(Box<Refusal>),
    /// Past its TTL (and `drop_expired`): never handed out, not audited; committed as
    /// [`ExpiredCommits`] says.
    Expired,
    /// Hand it out, after publishing the audit record when there is one.
    Deliver(Box<Delivery>, Option<Box<Envelope>>),
}

/// Verify, decode, apply the clearance, drop an expired message (at `now_ms`), and build the
/// audit record a confidential or restricted delivery needs - shared by the sync and async
/// subscribers. The order is the Python SDK's and the Go client's: a message above the
/// clearance is withheld (and its refusal audited) whether or not it expired; an expired one
/// is dropped before its delivery would be audited.
fn judge(
    topic: &str,
    opts: &SubscribeOptions,
    rec: &KafkaRecord,
    partition: i32,
    offset: i64,
    now_ms: i64,
) -> Result<Verdict> {
    let (view, signature) = binding::decode(rec, &opts.limits, opts.verify_with.as_ref())?;
    let envelope = view.to_envelope()?;
    let level = Clearance::of(envelope.security().and_then(|s| s.data_classification.as_deref()));
    if level > opts.clearance {
        // judged by the envelope, never by a header
        return Ok(Verdict::Withheld(Box::new(Refusal {
            message_id: envelope.message_id().to_owned(),
            namespace: envelope.namespace().to_owned(),
            level,
            partition,
            offset,
        })));
    }
    if opts.drop_expired && envelope.is_expired(now_ms) {
        return Ok(Verdict::Expired);
    }
    let audit = if level >= Clearance::Confidential {
        Some(Box::new(audit_record(
            topic, opts, &envelope, level, partition, offset,
        )?))
    } else {
        None
    };
    Ok(Verdict::Deliver(
        Box::new(Delivery {
            envelope,
            signature,
            partition,
            offset,
        }),
        audit,
    ))
}

fn audit_record(
    topic: &str,
    opts: &SubscribeOptions,
    env: &Envelope,
    level: Clearance,
    partition: i32,
    offset: i64,
) -> Result<Envelope> {
    let now = now_ms();
    let record = serde_json::json!({
        "event": "classified_delivery",
        "principal": opts.principal.clone().unwrap_or_default(),
        "group": opts.group,
        "message_id": env.message_id(),
        "namespace": env.namespace(),
        "topic": topic,
        "classification": level.name(),
        "time": iso8601_utc(now),
        "time_ms": now,
        "backend": "kafka",
        "ref": format!("{partition}:{offset}"),
    });
    audit_builder(&opts.audit_topic, env.namespace(), env.message_id())
        .json(&record)?
        .build_quoting()
}

fn audit_failed(e: PrismError) -> PrismError {
    err!(
        Transport,
        format!("audit record not written, message not handed out: {e}"),
        "audit_topic",
        "the message is fetched again; check the audit topic"
    )
}

fn commit_list(topic: &str, partition: i32, offset: i64) -> Result<TopicPartitionList> {
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, partition, Offset::Offset(offset + 1))
        .map_err(|e| transport(e, "bad offset"))?;
    Ok(tpl)
}

/// When a dropped (expired) message is committed. Python and Go acknowledge it at once, and
/// their commit moves only over the contiguous prefix of settled messages, so it never
/// commits a message handed out before it that the application has not acknowledged yet.
/// Here `ack` commits through an offset (everything before it on its partition), so the same
/// guarantee takes this bookkeeping: an expired message is committed at once when nothing
/// fetched before it on its partition (handed out, withheld or undeliverable) is still
/// unacknowledged; otherwise it is committed by the acknowledgement that settles the last
/// such message. A message kept after it needs no bookkeeping: its own `ack` commits past
/// the expired one. Unknown state (after a seek or a rebalance) only delays a commit - the
/// message is then fetched again and dropped again - never commits one that is still out.
#[derive(Debug, Default)]
pub struct ExpiredCommits {
    partitions: HashMap<i32, Outstanding>,
}

#[derive(Debug, Default, Clone, Copy)]
struct Outstanding {
    /// The last offset fetched and not dropped (handed out, withheld or undeliverable).
    kept: Option<i64>,
    /// The highest offset committed through this subscriber.
    committed: Option<i64>,
    /// The last expired offset waiting for the `ack` of `kept`.
    waiting: Option<i64>,
}

impl ExpiredCommits {
    /// A message at `offset` was fetched and kept (delivered, withheld or undeliverable).
    pub fn kept(&mut self, partition: i32, offset: i64) {
        let p = self.partitions.entry(partition).or_default();
        p.kept = Some(p.kept.map_or(offset, |k| k.max(offset)));
        if p.waiting.is_some_and(|w| w < offset) {
            p.waiting = None; // acknowledging the kept message commits past it
        }
    }

    /// A message at `offset` was dropped as expired: true when it is to be committed now.
    pub fn expired(&mut self, partition: i32, offset: i64) -> bool {
        let p = self.partitions.entry(partition).or_default();
        let settled = match (p.kept, p.committed) {
            (None, _) => true,
            (Some(k), Some(c)) => c >= k,
            (Some(_), None) => false,
        };
        if settled {
            p.committed = Some(p.committed.map_or(offset, |c| c.max(offset)));
            p.waiting = None;
        } else {
            p.waiting = Some(p.waiting.map_or(offset, |w| w.max(offset)));
        }
        settled
    }

    /// Everything through `offset` was committed; returns an expired offset beyond it to
    /// commit as well, when `offset` settled the last kept message before it.
    pub fn acked(&mut self, partition: i32, offset: i64) -> Option<i64> {
        let p = self.partitions.entry(partition).or_default();
        p.committed = Some(p.committed.map_or(offset, |c| c.max(offset)));
        let waiting = p
            .waiting
            .filter(|w| *w > offset && p.kept.is_none_or(|k| offset >= k))?;
        p.waiting = None;
        p.committed = Some(waiting);
        Some(waiting)
    }

    /// The partition is read again from `offset`: a waiting expired message at or after it
    /// will be fetched (and judged) again.
    pub fn rewound(&mut self, partition: i32, offset: i64) {
        if let Some(p) = self.partitions.get_mut(&partition) {
            if p.waiting.is_some_and(|w| w >= offset) {
                p.waiting = None;
            }
        }
    }
}

/// The bookkeeping of a subscriber, shared by `&self` methods (`ack`, `seek`).
fn expired_commits(m: &Mutex<ExpiredCommits>) -> std::sync::MutexGuard<'_, ExpiredCommits> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A subscription to one topic (read_committed), verifying and judging every message.
pub struct Subscriber {
    topic: String,
    consumer: BaseConsumer,
    opts: SubscribeOptions,
    audit: Publisher,
    refused: Refusals,
    /// A refusal record that failed after good messages were handed out: the next poll's error.
    pending: Option<PrismError>,
    expired: Mutex<ExpiredCommits>,
    pub stats: Stats,
}

impl Subscriber {
    /// Join `opts.group` on `topic`. `extra` are librdkafka settings (security, ...).
    pub fn connect(bootstrap: &str, topic: &str, opts: SubscribeOptions, extra: &[(&str, &str)]) -> Result<Self> {
        let cfg = consumer_config(bootstrap, topic, &opts, extra)?;
        let consumer: BaseConsumer = cfg.create().map_err(|e| transport(e, "cannot create consumer"))?;
        consumer
            .subscribe(&[topic])
            .map_err(|e| transport(e, "cannot subscribe"))?;
        let mut audit = Publisher::connect(bootstrap, extra)?;
        if let Some(k) = &opts.signing_key {
            audit = audit.with_signing_key(k.clone());
        }
        Ok(Subscriber {
            topic: topic.to_owned(),
            consumer,
            opts,
            audit,
            refused: Refusals::default(),
            pending: None,
            expired: Mutex::default(),
            stats: Stats::default(),
        })
    }

    /// Wait up to `max_wait` for records, then take what else is there (at most `max` records),
    /// judging each (expired messages are dropped: [`Stats::expired`]). The messages withheld for clearance share one signed `classified_refused`
    /// record, written before they are committed; when it cannot be written they are read
    /// again (the partitions rewound), the messages handed out are still returned, and the
    /// next `poll` returns the error.
    pub fn poll(
        &mut self,
        max_wait: Duration,
        max: usize,
    ) -> Result<Vec<std::result::Result<Delivery, Undeliverable>>> {
        if let Some(e) = self.pending.take() {
            return Err(e);
        }
        let out = self.poll_records(max_wait, max);
        let flushed = self.flush_refusals();
        match (out, flushed) {
            (Ok(out), Ok(())) => Ok(out),
            (Ok(out), Err(e)) => {
                self.pending = Some(e); // hand out what was good first
                Ok(out)
            }
            (Err(e), _) => Err(e),
        }
    }

    /// Write the one audit record of the refusals held, then commit them; on failure rewind
    /// their partitions so they are fetched, refused and audited again.
    fn flush_refusals(&mut self) -> Result<()> {
        let held = self.refused.take();
        if held.is_empty() {
            return Ok(());
        }
        let written = refusal_record(&self.topic, &self.opts, &held)
            .and_then(|rec| self.audit.publish(&self.opts.audit_topic, &rec, Layout::Reviewed));
        if let Err(e) = written {
            for (p, o) in rewind_points(&held) {
                self.seek(p, o)?;
            }
            return Err(refusal_audit_failed(e, held.len()));
        }
        self.stats.refusal_records += 1;
        for r in &held {
            self.ack_at(r.partition, r.offset)?;
        }
        Ok(())
    }

    fn poll_records(
        &mut self,
        max_wait: Duration,
        max: usize,
    ) -> Result<Vec<std::result::Result<Delivery, Undeliverable>>> {
        let mut out = Vec::new();
        let mut wait = max_wait;
        while out.len() < max {
            let rec = match self.consumer.poll(wait) {
                None => break,
                Some(Err(e)) => return Err(transport(e, "consume failed")),
                Some(Ok(m)) => incoming(&m),
            };
            wait = Duration::ZERO;
            let (rec, partition, offset) = rec;
            match self.judge(&rec, partition, offset) {
                Ok(Judged::Expired) => {
                    self.stats.expired += 1;
                    if expired_commits(&self.expired).expired(partition, offset) {
                        if let Err(e) = self.commit_through(partition, offset) {
                            // dropped all the same (fetched and dropped again if the commit
                            // did not land); the failure is the next poll's error, after the
                            // messages judged good are handed out
                            self.pending.get_or_insert(e);
                        }
                    }
                    continue;
                }
                Ok(Judged::Delivered(d)) => {
                    self.stats.delivered += 1;
                    out.push(Ok(*d));
                }
                Ok(Judged::Withheld) => {} // held for its refusal record
                Err(error) => {
                    self.stats.failed += 1;
                    out.push(Err(Undeliverable {
                        partition,
                        offset,
                        error,
                    }));
                }
            }
        }
        Ok(out)
    }

    /// Verify, decode, apply the clearance and the TTL, audit; a withheld message is held for
    /// the refusal record (written at once when it is full). Every message but an
    /// expired one is recorded as kept (out until acknowledged) for [`ExpiredCommits`].
    fn judge(&mut self, rec: &KafkaRecord, partition: i32, offset: i64) -> Result<Judged> {
        let verdict = judge(&self.topic, &self.opts, rec, partition, offset, now_ms());
        if !matches!(verdict, Ok(Verdict::Expired)) {
            expired_commits(&self.expired).kept(partition, offset);
        }
        Ok(match verdict? {
            Verdict::Expired => Judged::Expired,
            Verdict::Withheld(r) => {
                self.stats.withheld += 1;
                if self.refused.push(*r) {
                    self.flush_refusals()?;
                }
                Judged::Withheld
            }
            Verdict::Deliver(d, None) => Judged::Delivered(d),
            Verdict::Deliver(d, Some(audit)) => {
                if let Err(e) = self.audit.publish(&self.opts.audit_topic, &audit, Layout::Reviewed) {
                    self.seek(partition, offset)?; // not handed out: fetched again later
                    return Err(audit_failed(e));
                }
                self.stats.audited += 1;
                Judged::Delivered(d)
            }
        })
    }

    /// Commit a handed-out message (and everything before it on its partition).
    pub fn ack(&self, d: &Delivery) -> Result<()> {
        self.ack_at(d.partition, d.offset)
    }

    /// Commit up to and including `offset` on `partition` (e.g. after a DLQ write of an
    /// `Undeliverable`), and the expired messages dropped right after it when it settles
    /// the last message handed out before them ([`ExpiredCommits`]).
    pub fn ack_at(&self, partition: i32, offset: i64) -> Result<()> {
        self.commit_through(partition, offset)?;
        match expired_commits(&self.expired).acked(partition, offset) {
            Some(dropped) => self.commit_through(partition, dropped),
            None => Ok(()),
        }
    }

    fn commit_through(&self, partition: i32, offset: i64) -> Result<()> {
        self.consumer
            .commit(&commit_list(&self.topic, partition, offset)?, CommitMode::Sync)
            .map_err(|e| transport(e, "commit failed"))
    }

    /// A nack: the partition is read again from `offset`.
    pub fn seek(&self, partition: i32, offset: i64) -> Result<()> {
        expired_commits(&self.expired).rewound(partition, offset);
        self.consumer
            .seek(&self.topic, partition, Offset::Offset(offset), Duration::from_secs(10))
            .map_err(|e| transport(e, "seek failed"))
    }
}

/// What the sync subscriber made of one record.
enum Judged {
    /// Handed out.
    Delivered(Box<Delivery>),
    /// Above the clearance: held for its refusal record.
    Withheld,
    /// Past its TTL: dropped.
    Expired,
}

// ------------------------------------------------------------------ async (feature `kafka-async`)

/// Publishes envelopes to Kafka without blocking a thread (rdkafka's `FutureProducer`), for
/// tokio applications: the same records, headers, JWT and signature as [`Publisher`].
#[cfg(feature = "kafka-async")]
pub struct AsyncPublisher {
    producer: rdkafka::producer::FutureProducer,
    signing_key: Option<SigningKey>,
    auth_token: Option<String>,
    timeout: Duration,
}

#[cfg(feature = "kafka-async")]
impl AsyncPublisher {
    /// Connect to `bootstrap`; `extra` are librdkafka settings, as for [`Publisher::connect`].
    pub fn connect(bootstrap: &str, extra: &[(&str, &str)]) -> Result<Self> {
        let producer = producer_config(bootstrap, extra)
            .create()
            .map_err(|e| transport(e, "cannot create producer"))?;
        Ok(AsyncPublisher {
            producer,
            signing_key: None,
            auth_token: None,
            timeout: Duration::from_secs(30),
        })
    }
    /// Sign every envelope (scope v2).
    pub fn with_signing_key(mut self, key: SigningKey) -> Self {
        self.signing_key = Some(key);
        self
    }
    /// Attach a JWT to every envelope (`security.auth_token`).
    pub fn with_auth_token(mut self, jwt: impl Into<String>) -> Self {
        self.auth_token = Some(jwt.into());
        self
    }
    /// Publish `env` to `topic` in `layout`; resolves to (partition, offset) once acknowledged.
    pub async fn publish(&self, topic: &str, env: &Envelope, layout: Layout) -> Result<(i32, i64)> {
        let rec = outgoing(env, layout, self.auth_token.as_deref(), self.signing_key.as_ref())?;
        self.send(topic, &rec).await
    }
    /// Send an already encoded record; resolves once the broker acknowledged it.
    pub async fn send(&self, topic: &str, rec: &KafkaRecord) -> Result<(i32, i64)> {
        let mut r = rdkafka::producer::FutureRecord::to(topic)
            .payload(&rec.value)
            .headers(headers_of(rec))
            .timestamp(rec.timestamp_ms);
        if let Some(k) = &rec.key {
            r = r.key(k);
        }
        self.producer
            .send(r, rdkafka::util::Timeout::After(self.timeout))
            .await
            .map_err(|(e, _)| transport(e, "produce failed"))
    }
    /// Wait until everything sent was acknowledged (blocks up to the timeout: call it at shutdown).
    pub fn flush(&self) -> Result<()> {
        self.producer
            .flush(self.timeout)
            .map_err(|e| transport(e, "flush failed"))
    }
}

/// A subscription (read_committed) for tokio applications (rdkafka's `StreamConsumer`): the
/// same verification, clearance and signed audit records as [`Subscriber`], one message per
/// `next().await`. Withheld messages are acknowledged and skipped, as in `Subscriber::poll`.
#[cfg(feature = "kafka-async")]
pub struct AsyncSubscriber {
    topic: String,
    consumer: rdkafka::consumer::StreamConsumer,
    opts: SubscribeOptions,
    audit: AsyncPublisher,
    refused: Refusals,
    /// A refusal record that failed after a good message was handed out: the next call's error.
    pending: Option<PrismError>,
    expired: Mutex<ExpiredCommits>,
    pub stats: Stats,
}

#[cfg(feature = "kafka-async")]
impl AsyncSubscriber {
    /// Join `opts.group` on `topic` (call it inside a tokio runtime).
    pub fn connect(bootstrap: &str, topic: &str, opts: SubscribeOptions, extra: &[(&str, &str)]) -> Result<Self> {
        let consumer: rdkafka::consumer::StreamConsumer = consumer_config(bootstrap, topic, &opts, extra)?
            .create()
            .map_err(|e| transport(e, "cannot create consumer"))?;
        consumer
            .subscribe(&[topic])
            .map_err(|e| transport(e, "cannot subscribe"))?;
        let mut audit = AsyncPublisher::connect(bootstrap, extra)?;
        if let Some(k) = &opts.signing_key {
            audit = audit.with_signing_key(k.clone());
        }
        Ok(AsyncSubscriber {
            topic: topic.to_owned(),
            consumer,
            opts,
            audit,
            refused: Refusals::default(),
            pending: None,
            expired: Mutex::default(),
            stats: Stats::default(),
        })
    }

    /// The next message: `Ok(Ok(delivery))`, or `Ok(Err(undeliverable))` for one that failed
    /// verification or decoding (never dropped: the caller decides, then `ack_at`). `Err` is a
    /// transport failure. Pending until a message arrives (wrap it in a timeout as needed).
    /// Expired messages are dropped on the way ([`Stats::expired`]).
    ///
    /// Messages withheld for clearance are held until the one signed `classified_refused`
    /// record of those met in a row is written - before waiting for more, before the next
    /// message is returned, or when it is full - then committed. When it cannot be written
    /// they are read again (the partitions rewound); a message already judged good is still
    /// returned, and the next call returns the error.
    pub async fn next(&mut self) -> Result<std::result::Result<Delivery, Undeliverable>> {
        if let Some(e) = self.pending.take() {
            return Err(e);
        }
        let out = self.next_record().await;
        let flushed = self.flush_refusals().await;
        match (out, flushed) {
            (Ok(out), Ok(())) => Ok(out),
            (Ok(out), Err(e)) => {
                self.pending = Some(e);
                Ok(out)
            }
            (Err(e), _) => Err(e),
        }
    }

    /// Write the one audit record of the refusals held, then commit them; on failure rewind
    /// their partitions so they are fetched, refused and audited again.
    /// Cancel safe: the refusals stay held until the write's outcome is known (a `next` cancelled
    /// meanwhile writes them again on the next call: a record may repeat, none is missing).
    /// `next` calls it itself; call it before dropping a subscriber whose last `next` was
    /// cancelled, so refusals it held are audited and committed now rather than re-read later.
    pub async fn flush_refusals(&mut self) -> Result<()> {
        if self.refused.held.is_empty() {
            return Ok(());
        }
        let written = match refusal_record(&self.topic, &self.opts, &self.refused.held) {
            Ok(rec) => self.audit.publish(&self.opts.audit_topic, &rec, Layout::Reviewed).await,
            Err(e) => Err(e),
        };
        let held = self.refused.take();
        if let Err(e) = written {
            for (p, o) in rewind_points(&held) {
                self.seek(p, o)?;
            }
            return Err(refusal_audit_failed(e, held.len()));
        }
        self.stats.refusal_records += 1;
        for r in &held {
            self.ack_at(r.partition, r.offset)?;
        }
        Ok(())
    }

    async fn next_record(&mut self) -> Result<std::result::Result<Delivery, Undeliverable>> {
        loop {
            let received = if self.refused.held.is_empty() {
                self.consumer.recv().await
            } else {
                match now_or_never(self.consumer.recv()) {
                    Some(m) => m,
                    None => {
                        // nothing more fetched: the refusals held are written before waiting
                        self.flush_refusals().await?;
                        continue;
                    }
                }
            };
            let (rec, partition, offset) = incoming(&received.map_err(|e| transport(e, "consume failed"))?);
            let verdict = judge(&self.topic, &self.opts, &rec, partition, offset, now_ms());
            if !matches!(verdict, Ok(Verdict::Expired)) {
                expired_commits(&self.expired).kept(partition, offset);
            }
            match verdict {
                Ok(Verdict::Expired) => {
                    self.stats.expired += 1;
                    if expired_commits(&self.expired).expired(partition, offset) {
                        self.commit_through(partition, offset)?;
                    }
                }
                Ok(Verdict::Withheld(r)) => {
                    self.stats.withheld += 1;
                    if self.refused.push(*r) {
                        self.flush_refusals().await?;
                    }
                }
                Ok(Verdict::Deliver(d, audit)) => {
                    if let Some(audit) = audit {
                        if let Err(e) = self
                            .audit
                            .publish(&self.opts.audit_topic, &audit, Layout::Reviewed)
                            .await
                        {
                            self.seek(partition, offset)?; // not handed out: fetched again later
                            self.stats.failed += 1;
                            return Ok(Err(Undeliverable {
                                partition,
                                offset,
                                error: audit_failed(e),
                            }));
                        }
                        self.stats.audited += 1;
                    }
                    self.stats.delivered += 1;
                    return Ok(Ok(*d));
                }
                Err(error) => {
                    self.stats.failed += 1;
                    return Ok(Err(Undeliverable {
                        partition,
                        offset,
                        error,
                    }));
                }
            }
        }
    }

    /// Commit a handed-out message (and everything before it on its partition). The commit
    /// is queued without blocking the runtime (librdkafka sends it in the background); one
    /// that fails leaves the offset where it was, so the message is delivered again (at least
    /// once), never lost. `ack_blocking` waits for the broker.
    pub fn ack(&self, d: &Delivery) -> Result<()> {
        self.ack_at(d.partition, d.offset)
    }

    /// Queue the commit of everything up to and including `offset` on `partition`, and of the
    /// expired messages dropped right after it when it settles the last message handed out
    /// before them ([`ExpiredCommits`]).
    pub fn ack_at(&self, partition: i32, offset: i64) -> Result<()> {
        self.commit_through(partition, offset)?;
        match expired_commits(&self.expired).acked(partition, offset) {
            Some(dropped) => self.commit_through(partition, dropped),
            None => Ok(()),
        }
    }

    fn commit_through(&self, partition: i32, offset: i64) -> Result<()> {
        self.consumer
            .commit(&commit_list(&self.topic, partition, offset)?, CommitMode::Async)
            .map_err(|e| transport(e, "commit failed"))
    }

    /// [`ack`](Self::ack), waiting for the broker's answer (blocks the thread for one round
    /// trip: call it at shutdown or from `spawn_blocking`).
    pub fn ack_blocking(&self, d: &Delivery) -> Result<()> {
        let commit = |offset| {
            self.consumer
                .commit(&commit_list(&self.topic, d.partition, offset)?, CommitMode::Sync)
                .map_err(|e| transport(e, "commit failed"))
        };
        commit(d.offset)?;
        match expired_commits(&self.expired).acked(d.partition, d.offset) {
            Some(dropped) => commit(dropped),
            None => Ok(()),
        }
    }

    /// A nack: the partition is read again from `offset`.
    pub fn seek(&self, partition: i32, offset: i64) -> Result<()> {
        expired_commits(&self.expired).rewound(partition, offset);
        self.consumer
            .seek(&self.topic, partition, Offset::Offset(offset), Duration::from_secs(10))
            .map_err(|e| transport(e, "seek failed"))
    }
}

/// `f`'s output if it is ready at once (polled once, then dropped: rdkafka's `recv` is
/// cancel safe), else None.
#[cfg(feature = "kafka-async")]
fn now_or_never<F: std::future::Future>(f: F) -> Option<F::Output> {
    let mut f = std::pin::pin!(f);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    match f.as_mut().poll(&mut cx) {
        std::task::Poll::Ready(v) => Some(v),
        std::task::Poll::Pending => None,
    }
}

/// `2026-11-28T23:59:59.123Z` for Unix milliseconds (what Python's audit records carry).
fn iso8601_utc(ms: i64) -> String {
    let at = std::time::UNIX_EPOCH + Duration::from_millis(u64::try_from(ms).unwrap_or(0));
    humantime::format_rfc3339_millis(at).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iso_time() {
        assert_eq!(iso8601_utc(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(iso8601_utc(1_767_225_600_001), "2026-01-01T00:00:00.001Z");
    }

    #[test]
    fn clearance_words() {
        assert_eq!(Clearance::of(None), Clearance::Internal);
        assert_eq!(Clearance::of(Some("PUBLIC")), Clearance::Public);
        assert_eq!(Clearance::of(Some("secret")), Clearance::Restricted);
    }

    fn refusal(n: i64, ns: &str, level: Clearance) -> Refusal {
        Refusal {
            message_id: format!("m-{n}"),
            namespace: ns.into(),
            level,
            partition: (n % 2) as i32,
            offset: n,
        }
    }

    fn record_of(env: &Envelope) -> serde_json::Value {
        serde_json::from_slice(&env.payload_bytes().unwrap()).unwrap()
    }

    #[test]
    fn an_audit_record_is_built_whatever_the_audited_message_carries() {
        // a rogue producer's id (too long, a control character) and namespace (empty): the
        // audit record is still written - the message would otherwise be fetched again for
        // good - and the id is left out of its correlation id only where it is unacceptable
        let opts = SubscribeOptions::default();
        for (id, ns, kept) in [
            ("m-1", "ns", true),
            (&*"x".repeat(128), "ns", true),
            (&*"x".repeat(129), "ns", false),
            ("a\nb", "", false),
        ] {
            let mut r = refusal(1, ns, Clearance::Restricted);
            r.message_id = id.to_owned();
            let env = refusal_record("t", &opts, &[r]).unwrap();
            let corr = env.metadata().and_then(|m| m.correlation_id.as_deref());
            assert_eq!(corr, kept.then_some(id), "{id:?}");
            assert_eq!(record_of(&env)["message_id"].as_str(), Some(id));
            let received = crate::model::Envelope::builder("t", "n")
                .text("x")
                .message_id("m")
                .build()
                .unwrap();
            let mut received = received;
            received.header.metadata.as_mut().unwrap().message_id = id.to_owned();
            received.header.metadata.as_mut().unwrap().namespace = ns.to_owned();
            let env = audit_record("t", &opts, &received, Clearance::Restricted, 0, 1).unwrap();
            assert_eq!(
                env.metadata().and_then(|m| m.correlation_id.as_deref()),
                kept.then_some(id)
            );
        }
    }

    #[test]
    fn refusal_records_in_the_python_form() {
        let opts = SubscribeOptions {
            clearance: Clearance::Public,
            principal: Some("svc-a".into()),
            ..Default::default()
        };
        let one = refusal_record("t", &opts, &[refusal(4, "ns", Clearance::Confidential)]).unwrap();
        let r = record_of(&one);
        assert_eq!(r["event"], "classified_refused");
        assert_eq!(
            (r["clearance"].as_str(), r["classification"].as_str()),
            (Some("public"), Some("confidential"))
        );
        assert_eq!(
            (r["message_id"].as_str(), r["ref"].as_str()),
            (Some("m-4"), Some("0:4"))
        );
        assert!(r.get("messages").is_none() && r.get("count").is_none());
        assert_eq!(
            one.security().and_then(|s| s.data_classification.as_deref()),
            Some("internal")
        );
        let several = [
            refusal(1, "ns", Clearance::Internal),
            refusal(2, "ns", Clearance::Restricted),
            refusal(3, "other", Clearance::Internal),
        ];
        let r = record_of(&refusal_record("t", &opts, &several).unwrap());
        assert_eq!(r["count"], 3);
        assert_eq!(r["classification"], "restricted"); // the highest refused
        assert_eq!(r["message_id"], "m-1");
        assert_eq!(
            r["messages"],
            serde_json::json!([
                ["m-1", "internal", "1:1"],
                ["m-2", "restricted", "0:2"],
                ["m-3", "internal", "1:3", "other"]
            ])
        );
        // no principal (a public/internal subscriber): null, as in Python
        let anon = refusal_record("t", &SubscribeOptions::default(), &several[..1]).unwrap();
        assert!(record_of(&anon)["principal"].is_null());
        assert_eq!(rewind_points(&several), vec![(1, 1), (0, 2)]);
    }

    const T0: i64 = 1_767_225_600_000;

    fn record(classification: &str, ttl: Option<i64>) -> KafkaRecord {
        let mut b = Envelope::builder("t", "ns")
            .text("x")
            .published_at_ms(T0)
            .data_classification(classification);
        if let Some(t) = ttl {
            b = b.ttl_seconds(t);
        }
        binding::encode(&b.build().unwrap(), Layout::Reviewed, None, &[], None).unwrap()
    }

    fn verdict(opts: &SubscribeOptions, rec: &KafkaRecord, now: i64) -> &'static str {
        match judge("t", opts, rec, 0, 7, now).unwrap() {
            Verdict::Withheld(_) => "withheld",
            Verdict::Expired => "expired",
            Verdict::Deliver(_, None) => "delivered",
            Verdict::Deliver(_, Some(_)) => "delivered+audit",
        }
    }

    #[test]
    fn an_expired_message_is_dropped_after_the_clearance_check_and_before_its_audit() {
        let opts = SubscribeOptions {
            clearance: Clearance::Confidential,
            principal: Some("svc".into()),
            ..Default::default()
        };
        let live = record("internal", Some(60));
        assert_eq!(verdict(&opts, &live, T0 + 59_999), "delivered");
        // at the boundary: expired
        assert_eq!(verdict(&opts, &live, T0 + 60_000), "expired");
        // no TTL, a TTL of 0, a TTL whose milliseconds overflow i64: never expired
        for ttl in [None, Some(0), Some(i64::MAX), Some(i64::MAX / 1000 + 1)] {
            assert_eq!(
                verdict(&opts, &record("internal", ttl), i64::MAX),
                "delivered",
                "{ttl:?}"
            );
        }
        // an expired confidential message: dropped, and no audit record (it is not read)
        let confidential = record("confidential", Some(1));
        assert_eq!(verdict(&opts, &confidential, T0 + 999), "delivered+audit");
        assert_eq!(verdict(&opts, &confidential, T0 + 1000), "expired");
        // above the clearance: withheld (and audited as refused) whether or not it expired
        assert_eq!(verdict(&opts, &record("restricted", Some(1)), T0 + 1000), "withheld");
        // drop_expired false: handed out like any other
        let keep = SubscribeOptions {
            drop_expired: false,
            ..opts
        };
        assert_eq!(verdict(&keep, &live, T0 + 60_000), "delivered");
        assert!(SubscribeOptions::default().drop_expired);
    }

    #[test]
    fn an_expired_message_is_committed_only_when_nothing_before_it_is_still_out() {
        let mut c = ExpiredCommits::default();
        // first on its partition: nothing out before it, committed at once
        assert!(c.expired(0, 3));
        // 4 handed out, not acknowledged: 5 and 6 wait for 4's ack, which commits through 6
        c.kept(0, 4);
        assert!(!c.expired(0, 5));
        assert!(!c.expired(0, 6));
        assert_eq!(c.acked(0, 4), Some(6));
        // everything out is settled again
        assert!(c.expired(0, 7));
        // a message kept after the expired one: its own ack commits past it
        c.kept(0, 8);
        assert!(!c.expired(0, 9));
        c.kept(0, 10);
        assert_eq!(c.acked(0, 8), None); // 9 is not committed with 8: 10 is still out
        assert!(!c.expired(0, 11));
        assert_eq!(c.acked(0, 10), Some(11));
        // partitions are separate
        c.kept(1, 0);
        assert!(c.expired(2, 0));
        assert!(!c.expired(1, 1));
        // a nack (seek) at or before the waiting one: it is fetched again, nothing to commit
        c.rewound(1, 0);
        assert_eq!(c.acked(1, 0), None);
        assert!(c.expired(1, 1)); // fetched again after 0 was acknowledged: committed at once
    }

    #[test]
    fn a_record_holds_at_most_256_refusals_or_about_48_kib() {
        let mut held = Refusals::default();
        let full = (0..REFUSALS_PER_RECORD as i64).map(|n| held.push(refusal(n, "ns", Clearance::Restricted)));
        assert_eq!(full.filter(|&f| f).count(), 1); // full at the 256th
        assert_eq!(held.take().len(), REFUSALS_PER_RECORD);
        let long = "n".repeat(200);
        let mut n = 0;
        while !held.push(refusal(n, &long, Clearance::Restricted)) {
            n += 1;
        }
        assert!(held.held.len() < REFUSALS_PER_RECORD && held.bytes >= REFUSAL_RECORD_BYTES);
    }
}

//! The envelope model: the reviewed (memo-031) header plus a payload, as in the Python SDK
//! (`app/envelope/model.py`). Both layouts decode into it; the draft layout is converted
//! field by field (`crate::layouts`).

use std::time::{SystemTime, UNIX_EPOCH};

use crate::error::{err, Result};
use crate::gen::v1::{self, ContentEncoding, ContentType};

/// What this SDK writes into `metadata.producer_sdk_version`.
pub const SDK_VERSION: &str = concat!("prism-rust/", env!("CARGO_PKG_VERSION"));
/// `type_url` prefix of packed protobuf payloads (`Any.Pack`).
pub const PROTOBUF_TYPE_URL_PREFIX: &str = "type.googleapis.com/";
/// The largest JSON payload `payload_json` parses (Python's `DEFAULT_MAX_DECOMPRESSED`).
pub const MAX_JSON_PAYLOAD_BYTES: usize = 64 * 1024 * 1024;
/// Priority when the field is absent (memo-031).
pub const DEFAULT_PRIORITY: i32 = 5;

/// An owned payload: the `google.protobuf.Any` of the envelope.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Payload {
    pub type_url: String,
    pub value: Vec<u8>,
}

/// A payload borrowed from the received bytes (the zero-copy header-only parse): the serialized
/// `google.protobuf.Any`, not parsed until asked for, so a header-only reader never touches it
/// (a payload record that is not a valid `Any` decodes, and fails only when read).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PayloadRef<'a> {
    /// The `Any` bodies of the payload records, in order (one, unless a producer repeated it:
    /// protobuf merges repeated records, and both `Any` fields are last-wins).
    pub parts: Vec<&'a [u8]>,
}

impl<'a> PayloadRef<'a> {
    /// `(type_url, value)`, both slices of the input.
    pub fn parse(&self) -> Result<(&'a str, &'a [u8])> {
        let (mut type_url, mut value): (&'a str, &'a [u8]) = ("", &[]);
        for part in &self.parts {
            let part: &'a [u8] = part;
            for r in crate::wire::scan(part, 0, part.len()).map_err(|e| {
                err!(
                    Payload,
                    format!("payload is not a google.protobuf.Any: {}", e.detail().what),
                    "payload",
                    "the producer wrote something else into the payload record"
                )
            })? {
                match (r.field, r.wire_type) {
                    (1, crate::wire::LEN) => {
                        type_url = std::str::from_utf8(&part[r.value_start..r.end]).map_err(|_| {
                            err!(
                                Payload,
                                "payload type_url is not valid UTF-8",
                                "payload.type_url",
                                "the producer is broken"
                            )
                        })?;
                    }
                    (2, crate::wire::LEN) => value = &part[r.value_start..r.end],
                    (1 | 2, wt) => {
                        return Err(err!(
                            Payload,
                            format!("payload field {} has wire type {wt}, not 2", r.field),
                            "payload",
                            "the payload is not a google.protobuf.Any"
                        ))
                    }
                    _ => {} // unknown Any fields are skipped, as every protobuf reader does
                }
            }
        }
        Ok((type_url, value))
    }
    /// The payload value, a slice of the input.
    pub fn value(&self) -> Result<&'a [u8]> {
        Ok(self.parse()?.1)
    }
    /// The payload's `type_url`.
    pub fn type_url(&self) -> Result<&'a str> {
        Ok(self.parse()?.0)
    }
    pub fn to_owned_payload(&self) -> Result<Payload> {
        let (t, v) = self.parse()?;
        Ok(Payload {
            type_url: t.to_owned(),
            value: v.to_vec(),
        })
    }
}

/// An envelope: the reviewed-layout header (its `payload` field is always `None`) and the payload.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Envelope {
    pub header: v1::PrismEnvelope,
    pub payload: Option<Payload>,
    /// Fields this build does not know, kept byte for byte and written back by `encode`.
    pub unknown: crate::unknown::UnknownFields,
}

fn meta_str(m: Option<&v1::PrismMetadata>, f: impl Fn(&v1::PrismMetadata) -> &str) -> &str {
    m.map(f).unwrap_or("")
}

impl Envelope {
    /// Start building an envelope for `topic` in `namespace` (memo-031 defaults: a UUIDv7 id,
    /// now as `published_at_ms`, this SDK's version).
    pub fn builder(topic: impl Into<String>, namespace: impl Into<String>) -> EnvelopeBuilder {
        EnvelopeBuilder::new(topic.into(), namespace.into())
    }

    pub fn metadata(&self) -> Option<&v1::PrismMetadata> {
        self.header.metadata.as_ref()
    }
    pub fn message_id(&self) -> &str {
        meta_str(self.metadata(), |m| &m.message_id)
    }
    pub fn topic(&self) -> &str {
        meta_str(self.metadata(), |m| &m.topic)
    }
    pub fn namespace(&self) -> &str {
        meta_str(self.metadata(), |m| &m.namespace)
    }
    pub fn security(&self) -> Option<&v1::SecurityContext> {
        self.header.security.as_ref()
    }
    /// The security context, created empty when absent.
    pub fn security_mut(&mut self) -> &mut v1::SecurityContext {
        self.header.security.get_or_insert_with(Default::default)
    }
    /// The content type as a MIME string ("" when unset).
    pub fn content_type(&self) -> &str {
        self.metadata().map(content_type).unwrap_or("")
    }
    /// The content encoding name ("" when unset, "none", "gzip", ...).
    pub fn content_encoding(&self) -> &str {
        self.metadata().map(content_encoding).unwrap_or("")
    }
    /// True when `security.encryption` is set: the payload is ciphertext.
    pub fn is_encrypted(&self) -> bool {
        self.security().is_some_and(|s| s.encryption.is_some())
    }

    /// The plaintext payload bytes, decompressed per `content_encoding` (at most 64 MiB, as in
    /// Python). Refuses encrypted payloads (decrypt with `crate::encryption`).
    pub fn payload_bytes(&self) -> Result<std::borrow::Cow<'_, [u8]>> {
        let p = self.payload.as_ref().ok_or_else(|| {
            err!(
                Payload,
                "envelope has no payload",
                "payload",
                "the producer must set a payload"
            )
        })?;
        if self.is_encrypted() {
            return Err(err!(
                Payload,
                "payload is encrypted",
                "security.encryption",
                "decrypt it first (prism_client::encryption::decrypt_envelope)"
            ));
        }
        match self.content_encoding() {
            "" | "none" | "identity" => Ok(std::borrow::Cow::Borrowed(&p.value)),
            #[cfg(feature = "compression")]
            other => crate::compression::decompress(&p.value, other, crate::compression::DEFAULT_MAX_DECOMPRESSED)
                .map(std::borrow::Cow::Owned),
            #[cfg(not(feature = "compression"))]
            other => Err(err!(
                Payload,
                format!("payload is compressed with {other:?}"),
                "metadata.content_encoding",
                "build prism-client with the `compression` feature"
            )),
        }
    }

    /// The payload parsed as JSON into `T`, within the Python SDK's limits: at most 64 MiB and
    /// 64 levels of nesting (`crate::untrusted_json`).
    pub fn payload_json<T: serde::de::DeserializeOwned>(&self) -> Result<T> {
        crate::untrusted_json::parse(
            &self.payload_bytes()?,
            "payload.value",
            MAX_JSON_PAYLOAD_BYTES,
            crate::untrusted_json::DEFAULT_MAX_DEPTH,
            crate::error::PrismError::Payload,
        )
    }

    /// The payload decoded as protobuf message `M`; its `type_url` must name `M` when set.
    pub fn payload_proto<M: prost::Message + prost::Name + Default>(&self) -> Result<M> {
        let bytes = self.payload_bytes()?;
        let expected = M::type_url();
        let got = self.payload.as_ref().map(|p| p.type_url.as_str()).unwrap_or("");
        if !got.is_empty() && got != expected {
            return Err(err!(
                Payload,
                format!("payload holds {got:?}, not {expected:?}"),
                "payload.type_url",
                "pass the message type that matches the payload's type_url"
            ));
        }
        M::decode(bytes.as_ref()).map_err(|e| {
            err!(
                Payload,
                format!("payload is not a valid {}: {e}", M::full_name()),
                "payload.value",
                "the producer sent another message type"
            )
        })
    }
}

impl Envelope {
    /// When the message expires, in Unix milliseconds: `published_at_ms + ttl_seconds * 1000`;
    /// None when it never does (no metadata, no TTL, or a TTL of 0 or less). An expiry past
    /// the i64 range (a TTL of `i64::MAX`, which the builders of every SDK accept) is
    /// saturated to `i64::MAX`, as Go's `ExpiresAt` does; [`Envelope::is_expired`] compares
    /// the exact value.
    pub fn expires_at_ms(&self) -> Option<i64> {
        let m = self.metadata()?;
        expiry_ms(m.published_at_ms, m.ttl_seconds).map(|e| i64::try_from(e).unwrap_or(i64::MAX))
    }

    /// Whether the message is expired at `now_ms` (Unix milliseconds): the rule of
    /// [`ttl_expired`], on this envelope's `published_at_ms` and `ttl_seconds`.
    pub fn is_expired(&self, now_ms: i64) -> bool {
        self.metadata()
            .is_some_and(|m| ttl_expired(m.published_at_ms, m.ttl_seconds, now_ms))
    }

    /// [`Envelope::is_expired`] by this machine's clock.
    pub fn is_expired_now(&self) -> bool {
        self.is_expired(now_ms())
    }
}

/// The exact expiry `published_at_ms + ttl_seconds * 1000` (i128: no i64 operands can
/// overflow it), or None when `ttl_seconds` is absent, 0 or negative (no expiry).
pub fn expiry_ms(published_at_ms: i64, ttl_seconds: Option<i64>) -> Option<i128> {
    let ttl = ttl_seconds.filter(|t| *t > 0)?;
    Some(i128::from(published_at_ms) + i128::from(ttl) * 1000)
}

/// The TTL rule every SDK applies (Python's `Envelope.is_expired`, Go's `IsExpired`, the
/// vectors of conformance/expiry/): a message with a TTL above 0 is expired once `now_ms` is
/// at or past `published_at_ms + ttl_seconds * 1000`. The producer's `published_at_ms` is the
/// start (not the broker's timestamp, not when it was received), there is no allowance for
/// clock skew (a producer whose clock runs ahead gets a later expiry), a TTL of 0 or less
/// means "never expires", and the sum is exact: a huge TTL or a `published_at_ms` near the
/// i64 limits never wraps around to a time in the past (Go's int64 arithmetic once did, and
/// dropped messages that never expire).
pub fn ttl_expired(published_at_ms: i64, ttl_seconds: Option<i64>, now_ms: i64) -> bool {
    expiry_ms(published_at_ms, ttl_seconds).is_some_and(|e| i128::from(now_ms) >= e)
}

/// The metadata's content type as a MIME string ("" when unset).
pub fn content_type(m: &v1::PrismMetadata) -> &str {
    match m.content_type.map(ContentType::try_from) {
        None => "",
        Some(Ok(ContentType::Protobuf)) => "application/protobuf",
        Some(Ok(ContentType::Json)) => "application/json",
        Some(Ok(ContentType::Avro)) => "application/avro",
        Some(Ok(ContentType::Custom)) => m.content_type_custom.as_deref().unwrap_or(""),
        Some(_) => "",
    }
}

/// Store a MIME string; the enum only for the exact canonical spellings, so any string
/// round-trips unchanged through both layouts.
pub fn set_content_type(m: &mut v1::PrismMetadata, mime: &str) {
    m.content_type_custom = None;
    m.content_type = match mime {
        "" => None,
        "application/protobuf" => Some(ContentType::Protobuf as i32),
        "application/json" => Some(ContentType::Json as i32),
        "application/avro" => Some(ContentType::Avro as i32),
        other => {
            m.content_type_custom = Some(other.to_owned());
            Some(ContentType::Custom as i32)
        }
    };
}

/// The content encoding name ("" when unset).
pub fn content_encoding(m: &v1::PrismMetadata) -> &str {
    match m.content_encoding.map(ContentEncoding::try_from) {
        None => "",
        Some(Ok(ContentEncoding::None)) => "none",
        Some(Ok(ContentEncoding::Gzip)) => "gzip",
        Some(Ok(ContentEncoding::Snappy)) => "snappy",
        Some(Ok(ContentEncoding::Zstd)) => "zstd",
        Some(Ok(ContentEncoding::Custom)) => m.content_encoding_custom.as_deref().unwrap_or(""),
        Some(_) => "",
    }
}

pub fn set_content_encoding(m: &mut v1::PrismMetadata, name: &str) {
    m.content_encoding_custom = None;
    m.content_encoding = match name {
        "" => None,
        "none" => Some(ContentEncoding::None as i32),
        "gzip" => Some(ContentEncoding::Gzip as i32),
        "snappy" => Some(ContentEncoding::Snappy as i32),
        "zstd" => Some(ContentEncoding::Zstd as i32),
        other => {
            m.content_encoding_custom = Some(other.to_owned());
            Some(ContentEncoding::Custom as i32)
        }
    };
}

/// Fill `buf` from the operating system's CSPRNG.
pub(crate) fn random_bytes(buf: &mut [u8]) {
    use aes_gcm::aead::rand_core::RngCore;
    aes_gcm::aead::OsRng.fill_bytes(buf);
}

/// A new UUIDv7 (RFC 9562): 48-bit Unix milliseconds, version 7, variant 10, random rest.
pub fn new_message_id() -> String {
    let ms = now_ms() as u64;
    let mut b = [0u8; 16];
    random_bytes(&mut b[6..]);
    b[..6].copy_from_slice(&ms.to_be_bytes()[2..]);
    b[6] = (b[6] & 0x0f) | 0x70;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

pub(crate) fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// Builds a complete envelope with memo-031's defaults (the Python SDK's `new_envelope`).
#[derive(Debug, Clone)]
pub struct EnvelopeBuilder {
    env: Envelope,
}

impl EnvelopeBuilder {
    fn new(topic: String, namespace: String) -> Self {
        let metadata = v1::PrismMetadata {
            message_id: new_message_id(),
            topic,
            namespace,
            published_at_ms: now_ms(),
            producer_sdk_version: Some(SDK_VERSION.to_owned()),
            ..Default::default()
        };
        let header = v1::PrismEnvelope {
            metadata: Some(metadata),
            ..Default::default()
        };
        EnvelopeBuilder {
            env: Envelope {
                header,
                ..Default::default()
            },
        }
    }

    fn md(&mut self) -> &mut v1::PrismMetadata {
        self.env.header.metadata.get_or_insert_with(Default::default)
    }

    /// Raw bytes; the content type stays unset unless given with [`Self::content_type`].
    pub fn bytes(mut self, value: impl Into<Vec<u8>>) -> Self {
        self.env.payload = Some(Payload {
            type_url: String::new(),
            value: value.into(),
        });
        self
    }
    /// Text, content type `text/plain; charset=utf-8`.
    pub fn text(self, value: &str) -> Self {
        self.bytes(value.as_bytes()).content_type("text/plain; charset=utf-8")
    }
    /// A JSON value (compact), content type `application/json`.
    pub fn json<T: serde::Serialize>(self, value: &T) -> Result<Self> {
        let v = serde_json::to_vec(value).map_err(|e| {
            err!(
                Payload,
                format!("payload does not serialize as JSON: {e}"),
                "payload",
                "pass a JSON-able value"
            )
        })?;
        Ok(self.bytes(v).content_type("application/json"))
    }
    /// A protobuf message packed like `Any.Pack`, content type `application/protobuf`.
    pub fn proto<M: prost::Message + prost::Name>(mut self, msg: &M) -> Self {
        self.env.payload = Some(Payload {
            type_url: M::type_url(),
            value: msg.encode_to_vec(),
        });
        self.content_type("application/protobuf")
    }
    pub fn content_type(mut self, mime: &str) -> Self {
        set_content_type(self.md(), mime);
        self
    }
    /// Compress the payload with `gzip`, `snappy` or `zstd` when the envelope is built
    /// (feature `compression`); decoding reverses it in `payload_bytes()`.
    pub fn content_encoding(mut self, name: &str) -> Self {
        set_content_encoding(self.md(), name);
        self
    }
    pub fn message_id(mut self, id: impl Into<String>) -> Self {
        self.md().message_id = id.into();
        self
    }
    pub fn published_at_ms(mut self, ms: i64) -> Self {
        self.md().published_at_ms = ms;
        self
    }
    pub fn priority(mut self, p: i32) -> Self {
        self.md().priority = Some(p);
        self
    }
    pub fn ttl_seconds(mut self, s: i64) -> Self {
        self.md().ttl_seconds = Some(s);
        self
    }
    pub fn correlation_id(mut self, id: impl Into<String>) -> Self {
        self.md().correlation_id = Some(id.into());
        self
    }
    pub fn causality_parent(mut self, id: impl Into<String>) -> Self {
        self.md().causality_parent = Some(id.into());
        self
    }
    pub fn label(mut self, k: impl Into<String>, v: impl Into<String>) -> Self {
        self.env
            .header
            .observability
            .get_or_insert_with(Default::default)
            .labels
            .insert(k.into(), v.into());
        self
    }
    pub fn extension(mut self, k: impl Into<String>, v: impl Into<Vec<u8>>) -> Self {
        self.env.header.extensions.insert(k.into(), v.into());
        self
    }
    pub fn data_classification(mut self, c: impl Into<String>) -> Self {
        self.env.security_mut().data_classification = Some(c.into());
        self
    }
    pub fn contains_pii(mut self, pii: bool) -> Self {
        self.env.security_mut().contains_pii = Some(pii);
        self
    }
    /// The envelope; it must have a payload (compressed here when a content encoding is set),
    /// and its metadata must be within the worker's limits ([`builder_problems`]): a mistake is
    /// refused here, every problem at once, not dead-lettered by the worker later.
    pub fn build(self) -> Result<Envelope> {
        let problems = builder_problems(&self.env);
        if !problems.is_empty() {
            return Err(err!(
                Validation,
                problems.join("; "),
                "",
                "fix every field listed; the limits are the worker's metadata checks (docs/sdk.md, PrismPublishOptions)"
            ));
        }
        self.build_quoting()
    }

    /// [`Self::build`] without the metadata limits, for records that quote a received message
    /// (audit records: its namespace, its id) and must be written whatever it carries - the
    /// message would otherwise be fetched again for good. As Python's `new_envelope`.
    pub(crate) fn build_quoting(mut self) -> Result<Envelope> {
        let encoding = self.env.content_encoding().to_owned();
        let Some(p) = self.env.payload.as_mut() else {
            return Err(err!(
                Validation,
                "envelope has no payload",
                "payload",
                "set one with .bytes(), .text(), .json() or .proto()"
            ));
        };
        if !matches!(encoding.as_str(), "" | "none" | "identity") {
            #[cfg(feature = "compression")]
            {
                p.value = crate::compression::compress(&p.value, &encoding)?;
            }
            #[cfg(not(feature = "compression"))]
            {
                let _ = p;
                return Err(err!(
                    Payload,
                    format!("cannot compress with {encoding:?}"),
                    "metadata.content_encoding",
                    "build prism-client with the `compression` feature"
                ));
            }
        }
        Ok(self.env)
    }
}

/// The worker's metadata limits (its sanity check dead-letters an envelope over them).
pub(crate) const MAX_ID_LENGTH: usize = 128; // message_id, correlation_id, causality_parent
const MAX_NAME_LENGTH: usize = 249; // topic (Kafka's own limit), namespace, content type and encoding
const MAX_LABELS: usize = 64;
const MAX_LABEL_LENGTH: usize = 256; // a label's key and value together
const CLASSIFICATIONS: [&str; 4] = ["public", "internal", "confidential", "restricted"];

/// Why `s` cannot be an envelope string: over `longest` characters, or a control character.
pub(crate) fn text_problem(s: &str, longest: usize) -> Option<String> {
    let n = s.chars().count();
    if n > longest {
        return Some(format!("is {n} characters, over {longest}"));
    }
    s.chars()
        .any(|c| (c as u32) < 0x20 || c as u32 == 0x7f)
        .then(|| "contains control characters".to_owned())
}

/// What [`EnvelopeBuilder::build`] refuses, each with its field path: the required topic and
/// namespace, priority 0-10, a TTL of at least 0, the ids', names' and labels' lengths, control
/// characters, and a classification other than public, internal, confidential or restricted.
pub fn builder_problems(env: &Envelope) -> Vec<String> {
    let mut out = Vec::new();
    let mut add = |path: String, why: Option<String>| {
        if let Some(why) = why {
            out.push(format!("{path} {why}"));
        }
    };
    if let Some(m) = env.metadata() {
        for (name, v) in [("topic", &m.topic), ("namespace", &m.namespace)] {
            let why = if v.is_empty() {
                Some("is required".to_owned())
            } else {
                text_problem(v, MAX_NAME_LENGTH)
            };
            add(format!("metadata.{name}"), why);
        }
        let ids = [
            ("message_id", Some(&m.message_id)),
            ("correlation_id", m.correlation_id.as_ref()),
            ("causality_parent", m.causality_parent.as_ref()),
        ];
        for (name, v) in ids {
            add(
                format!("metadata.{name}"),
                v.and_then(|v| text_problem(v, MAX_ID_LENGTH)),
            );
        }
        add(
            "metadata.content_type".to_owned(),
            text_problem(env.content_type(), MAX_NAME_LENGTH),
        );
        add(
            "metadata.content_encoding".to_owned(),
            text_problem(env.content_encoding(), MAX_NAME_LENGTH),
        );
        if let Some(p) = m.priority.filter(|p| !(0..=10).contains(p)) {
            add("metadata.priority".to_owned(), Some(format!("{p} is outside 0-10")));
        }
        if let Some(t) = m.ttl_seconds.filter(|t| *t < 0) {
            add(
                "metadata.ttl_seconds".to_owned(),
                Some(format!("must be >= 0, got {t}")),
            );
        }
    }
    if let Some(c) = env.security().and_then(|s| s.data_classification.as_deref()) {
        if !CLASSIFICATIONS.contains(&c) {
            add(
                "security.data_classification".to_owned(),
                Some(format!(
                    "must be public, internal, confidential or restricted, got {c:?}"
                )),
            );
        }
    }
    if let Some(labels) = env.header.observability.as_ref().map(|o| &o.labels) {
        if labels.len() > MAX_LABELS {
            add(
                "observability.labels".to_owned(),
                Some(format!("has {} entries, over {MAX_LABELS}", labels.len())),
            );
        }
        for (k, v) in labels {
            let why = text_problem(k, MAX_LABEL_LENGTH)
                .or_else(|| text_problem(v, MAX_LABEL_LENGTH.saturating_sub(k.chars().count())));
            add(
                format!("observability.labels[{:?}]", k.chars().take(32).collect::<String>()),
                why,
            );
        }
    }
    for k in env.header.extensions.keys() {
        add(
            format!("extensions[{:?}]", k.chars().take(32).collect::<String>()),
            text_problem(k, MAX_LABEL_LENGTH),
        );
    }
    out.sort(); // map order is not the caller's: the same mistake reads the same every time
    out
}

/// Required fields (memo-031): message_id, topic, namespace, published_at_ms, payload; priority 0-10.
pub fn required_problems(env: &Envelope) -> Vec<String> {
    let mut out = Vec::new();
    match env.metadata() {
        None => out.push("metadata is missing".to_owned()),
        Some(m) => {
            for (name, v) in [
                ("message_id", &m.message_id),
                ("topic", &m.topic),
                ("namespace", &m.namespace),
            ] {
                if v.is_empty() {
                    out.push(format!("metadata.{name} is empty"));
                }
            }
            if m.published_at_ms <= 0 {
                out.push("metadata.published_at_ms is not set".to_owned());
            }
            if let Some(p) = m.priority {
                if !(0..=10).contains(&p) {
                    out.push(format!("metadata.priority {p} is outside 0-10"));
                }
            }
        }
    }
    if env.payload.is_none() {
        out.push("payload is missing".to_owned());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuid_v7_shape() {
        let id = new_message_id();
        assert_eq!(id.len(), 36);
        assert_eq!(&id[14..15], "7");
        assert!(matches!(&id[19..20], "8" | "9" | "a" | "b"));
    }

    #[test]
    fn content_type_round_trips_any_string() {
        let mut m = v1::PrismMetadata::default();
        for s in ["application/json", "text/csv", "", "application/avro"] {
            set_content_type(&mut m, s);
            assert_eq!(content_type(&m), s);
        }
    }

    #[test]
    fn builder_refuses_what_the_worker_would_dead_letter_every_problem_at_once() {
        let err = Envelope::builder("t", "n")
            .text("x")
            .priority(11)
            .ttl_seconds(-1)
            .correlation_id("a\nb")
            .message_id("x".repeat(129))
            .data_classification("topsecret")
            .label("k", "v".repeat(256))
            .build()
            .unwrap_err();
        assert_eq!(err.reason(), "invalid_envelope");
        let text = err.to_string();
        for want in [
            "metadata.priority 11 is outside 0-10",
            "metadata.ttl_seconds must be >= 0, got -1",
            "metadata.correlation_id contains control characters",
            "metadata.message_id is 129 characters, over 128",
            "security.data_classification must be",
            "observability.labels[\"k\"] is 256 characters, over 255",
        ] {
            assert!(text.contains(want), "{want:?} missing from {text}");
        }
        let mut many = Envelope::builder("t", "n").text("x");
        for i in 0..65 {
            many = many.label(i.to_string(), "v");
        }
        assert!(many
            .build()
            .unwrap_err()
            .to_string()
            .contains("has 65 entries, over 64"));
        assert!(Envelope::builder("", "n")
            .text("x")
            .build()
            .unwrap_err()
            .to_string()
            .contains("metadata.topic is required"));
        let ok = Envelope::builder("t", "n")
            .text("x")
            .priority(10)
            .ttl_seconds(0)
            .label("k", "v".repeat(255));
        assert!(ok.data_classification("restricted").build().is_ok());
    }

    fn with_ttl(published_at_ms: i64, ttl: Option<i64>) -> Envelope {
        let mut env = Envelope::builder("t", "n")
            .text("x")
            .published_at_ms(published_at_ms)
            .build()
            .unwrap();
        // set directly: a foreign producer may write what the builder refuses (a negative TTL)
        env.header.metadata.as_mut().unwrap().ttl_seconds = ttl;
        env
    }

    #[test]
    fn expiry_is_published_at_plus_ttl_at_or_after() {
        let t0 = 1_767_225_600_000;
        let env = with_ttl(t0, Some(60));
        assert_eq!(env.expires_at_ms(), Some(t0 + 60_000));
        assert!(!env.is_expired(t0 + 59_999));
        assert!(env.is_expired(t0 + 60_000)); // the boundary is expired (>=), as in Python
        assert!(env.is_expired(t0 + 60_001));
        for ttl in [None, Some(0), Some(-5), Some(i64::MIN)] {
            let env = with_ttl(t0, ttl);
            assert_eq!(env.expires_at_ms(), None, "{ttl:?}");
            assert!(!env.is_expired(i64::MAX), "{ttl:?}: never expires");
        }
        // no metadata at all: nothing expires
        assert!(!Envelope::default().is_expired(i64::MAX));
        // by this machine's clock: an hour's TTL from now is live, one second from 1970 is not
        assert!(!with_ttl(now_ms(), Some(3600)).is_expired_now());
        assert!(with_ttl(0, Some(1)).is_expired_now());
    }

    #[test]
    fn huge_ttls_and_timestamps_near_the_i64_limits_never_wrap() {
        // ttl * 1000 alone overflows i64 (Go's old bug made these expired at once)
        for ttl in [i64::MAX, i64::MAX / 1000 + 1] {
            let env = with_ttl(1_767_225_600_000, Some(ttl));
            assert!(!env.is_expired(1_767_225_600_000));
            assert!(!env.is_expired(i64::MAX));
            assert_eq!(env.expires_at_ms(), Some(i64::MAX)); // saturated for display
        }
        // the sum lands exactly on i64::MAX: expired at i64::MAX; one past it: never
        assert!(with_ttl(i64::MAX - 1000, Some(1)).is_expired(i64::MAX));
        assert!(!with_ttl(i64::MAX - 999, Some(1)).is_expired(i64::MAX));
        assert!(!with_ttl(i64::MAX, Some(i64::MAX)).is_expired(i64::MAX));
        // a published_at_ms at the bottom of the range
        assert!(!with_ttl(i64::MIN, Some(1)).is_expired(i64::MIN + 999));
        assert!(with_ttl(i64::MIN, Some(1)).is_expired(i64::MIN + 1000));
        assert_eq!(with_ttl(i64::MIN, Some(1)).expires_at_ms(), Some(i64::MIN + 1000));
        assert_eq!(expiry_ms(i64::MAX, Some(i64::MAX)), Some(i128::from(i64::MAX) * 1001));
        assert!(!ttl_expired(i64::MAX, Some(i64::MAX), i64::MAX));
    }

    #[test]
    fn builder_refuses_missing_payload_and_reads_json() {
        assert!(Envelope::builder("t", "n").build().is_err());
        let env = Envelope::builder("orders.created", "orders")
            .json(&serde_json::json!({"a": 1}))
            .unwrap()
            .build()
            .unwrap();
        assert!(required_problems(&env).is_empty());
        let v: serde_json::Value = env.payload_json().unwrap();
        assert_eq!(v["a"], 1);
        assert_eq!(env.content_type(), "application/json");
    }
}

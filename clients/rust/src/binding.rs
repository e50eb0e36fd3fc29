//! The Kafka binding, without I/O (the Rust twin of `app/bindings/kafka.py`, docs/bindings.md):
//! envelope bytes in one layout as the record value, metadata copies in `prism-*` headers for
//! tools that never parse protobuf, W3C trace headers, the key and the timestamp. On decode,
//! every header copy must agree with the envelope (a router that reads headers and a consumer
//! that reads the envelope must never see two different messages).

use crate::codec::{decode_view, layout_of_records, scan_envelope, EnvelopeView, Layout, Limits};
use crate::error::{err, Result};
use crate::model::Envelope;
use crate::signing::{self, SignatureInfo, SigningKey, VerificationKeys, SCOPE_V2};

pub const ENVELOPE_VERSION: &str = "prism-envelope-version";
pub const ENVELOPE_LAYOUT: &str = "prism-envelope-layout";
pub const MESSAGE_ID: &str = "prism-message-id";
pub const TOPIC: &str = "prism-topic";
pub const NAMESPACE: &str = "prism-namespace";
pub const TRACE_ID: &str = "prism-trace-id";
pub const CONTENT_TYPE: &str = "prism-content-type";
pub const TRACEPARENT: &str = "traceparent";
pub const TRACESTATE: &str = "tracestate";
/// The extension that carries `tracestate` (the envelope has no field for it).
pub const TRACESTATE_EXTENSION: &str = "w3c.tracestate";

/// What to hand to a Kafka producer, or what a consumer received.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct KafkaRecord {
    pub key: Option<Vec<u8>>,
    pub value: Vec<u8>,
    pub headers: Vec<(String, Vec<u8>)>,
    pub timestamp_ms: i64,
}

impl KafkaRecord {
    /// The first value of header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_slice())
    }
}

/// The layout a migration topic carries: `<topic>.v2` draft, `<topic>.v3` reviewed.
pub fn layout_for_topic(topic: &str) -> Result<Layout> {
    if topic.ends_with(".v2") {
        Ok(Layout::Draft)
    } else if topic.ends_with(".v3") {
        Ok(Layout::Reviewed)
    } else {
        Err(err!(
            Config,
            format!("topic {topic:?} is neither a .v2 nor a .v3 migration topic"),
            "topic",
            "pass the layout explicitly for other topics"
        ))
    }
}

/// The trace flag bits propagated (W3C Level 1 `sampled`, Level 2 `random-trace-id`): the
/// others are sent as zero ("Vendors MUST set those to zero").
const KNOWN_TRACE_FLAGS: i32 = 0x03;
/// At most this many `tracestate` list members (W3C); more drops the whole value.
const TRACESTATE_MAX_MEMBERS: usize = 32;
/// A longer `tracestate` is dropped before parsing (Python's DoS guard, as OpenTelemetry's).
const TRACESTATE_MAX_LENGTH: usize = 8192;

/// A lowercase-hex id of `len` characters that is not all zeros (`_from_envelope_fields`).
fn is_trace_hex(id: &[u8], len: usize) -> bool {
    id.len() == len && id.iter().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) && id.iter().any(|&b| b != b'0')
}

/// The `traceparent` value for an observability context's fields, or `None` when they make
/// no usable trace: the one place of the rule in this crate (the SDK's [`traceparent_of`] and
/// the worker's compiled headers, `pair::envelope_headers`, both call it).
pub(crate) fn traceparent_value(trace_id: &[u8], span_id: &[u8], flags: i32) -> Option<Vec<u8>> {
    if !((0..=0xff).contains(&flags) && is_trace_hex(trace_id, 32) && is_trace_hex(span_id, 16)) {
        return None;
    }
    let mut tp = Vec::with_capacity(55);
    tp.extend_from_slice(b"00-");
    tp.extend_from_slice(trace_id);
    tp.push(b'-');
    tp.extend_from_slice(span_id);
    tp.push(b'-');
    let known = (flags & KNOWN_TRACE_FLAGS) as u8; // 0..=3: two hex digits
    tp.extend_from_slice(&[b'0', b"0123"[known as usize]]);
    Some(tp)
}

/// `00-<trace_id>-<span_id>-<flags:02x>` when the ids are 32 and 16 lowercase hex digits, not
/// all zero, and the flags fit the header's byte (0..=255); only the known flag bits are sent.
/// These are Python's rules (`app/observability/tracecontext.py`, `_from_envelope_fields` and
/// `TraceParent.propagated_flags`), pinned by `conformance/bindings/kafka-headers.json`.
pub fn traceparent_of(env: &Envelope) -> Option<String> {
    let o = env.header.observability.as_ref()?;
    let tp = traceparent_value(o.trace_id.as_bytes(), o.span_id.as_bytes(), o.trace_flags)?;
    // only ASCII hex digits and dashes went in
    Some(String::from_utf8(tp).expect("traceparent is ASCII"))
}

/// The `tracestate` header for the `w3c.tracestate` extension, or `None` when it is absent or
/// invalid: an invalid tracestate is dropped, never forwarded (W3C Trace Context).
pub fn tracestate_of(env: &Envelope) -> Option<String> {
    normalize_tracestate(env.header.extensions.get(TRACESTATE_EXTENSION)?)
}

/// Python's strict W3C Level 1 parse and re-format (`parse_tracestate` then
/// `format_tracestate`): at most 8192 ASCII characters; members split on `,`, spaces and tabs
/// around each trimmed, empty ones dropped; every other member `key=value` by the Level 1
/// grammar with no key twice, at most 32 of them; the members joined again with `,`. Anything
/// else drops the whole value (`None`), as does a value with no member.
pub fn normalize_tracestate(raw: &[u8]) -> Option<String> {
    if raw.len() > TRACESTATE_MAX_LENGTH || !raw.is_ascii() {
        return None;
    }
    let text = std::str::from_utf8(raw).ok()?;
    let mut keys = std::collections::HashSet::new();
    let mut members = Vec::new();
    for member in text.split(',') {
        let member = member.trim_matches([' ', '\t']);
        if member.is_empty() {
            continue;
        }
        let (key, value) = member.split_once('=')?;
        if !is_tracestate_key(key) || !is_tracestate_value(value) || !keys.insert(key) {
            return None;
        }
        members.push(member);
    }
    (!members.is_empty() && members.len() <= TRACESTATE_MAX_MEMBERS).then(|| members.join(","))
}

/// A Level 1 key: `simple-key` (a-z, then up to 255 of a-z 0-9 `_ - * /`) or
/// `tenant@system` (a-z or 0-9 then up to 240 key characters; a-z then up to 13).
fn is_tracestate_key(key: &str) -> bool {
    fn part(s: &str, max: usize, first: fn(u8) -> bool) -> bool {
        let b = s.as_bytes();
        (1..=max).contains(&b.len())
            && first(b[0])
            && b.iter()
                .all(|&c| c.is_ascii_lowercase() || c.is_ascii_digit() || b"_-*/".contains(&c))
    }
    match key.split_once('@') {
        None => part(key, 256, |c| c.is_ascii_lowercase()),
        Some((tenant, system)) => {
            part(tenant, 241, |c| c.is_ascii_lowercase() || c.is_ascii_digit())
                && part(system, 14, |c| c.is_ascii_lowercase())
        }
    }
}

/// A value: 1 to 256 printable ASCII characters other than `,` and `=`, the last not a space.
fn is_tracestate_value(value: &str) -> bool {
    let b = value.as_bytes();
    (1..=256).contains(&b.len())
        && b.iter().all(|&c| (0x20..=0x7e).contains(&c) && c != b',' && c != b'=')
        && b[b.len() - 1] != b' '
}

/// The binding's own headers for `env` in `layout` (docs/bindings.md, the Kafka table).
pub fn headers_for(env: &Envelope, layout: Layout) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    let mut put = |n: &str, v: &str| {
        if !v.is_empty() {
            out.push((n.to_owned(), v.as_bytes().to_vec()));
        }
    };
    if layout == Layout::Draft {
        put(ENVELOPE_VERSION, "1");
    }
    put(ENVELOPE_LAYOUT, layout.name());
    put(MESSAGE_ID, env.message_id());
    put(TOPIC, env.topic());
    put(NAMESPACE, env.namespace());
    put(
        TRACE_ID,
        env.header
            .observability
            .as_ref()
            .map(|o| o.trace_id.as_str())
            .unwrap_or(""),
    );
    put(CONTENT_TYPE, env.content_type());
    if let Some(tp) = traceparent_of(env) {
        put(TRACEPARENT, &tp);
        if let Some(ts) = tracestate_of(env) {
            put(TRACESTATE, &ts);
        }
    }
    out
}

/// Encode one record: the key is `key`, else the correlation id (related messages stay in
/// order on one partition), else none; the timestamp is `published_at_ms`. With `sign_with`,
/// the bytes are signed with scope v2. Caller `headers` come first; a caller `prism-*` header
/// that disagrees with the envelope is refused (every decoder would refuse the record).
pub fn encode(
    env: &Envelope,
    layout: Layout,
    key: Option<Vec<u8>>,
    headers: &[(String, Vec<u8>)],
    sign_with: Option<&SigningKey>,
) -> Result<KafkaRecord> {
    let value = match sign_with {
        Some(k) => signing::sign(env, k, layout, SCOPE_V2)?,
        None => crate::codec::try_encode(env, layout)?,
    };
    let ours = headers_for(env, layout);
    let mut merged: Vec<(String, Vec<u8>)> = Vec::new();
    for (n, v) in headers {
        if n.to_ascii_lowercase().starts_with("prism-") {
            match ours.iter().find(|(o, _)| o.eq_ignore_ascii_case(n)) {
                Some((_, ov)) if ov == v => continue,
                _ => {
                    return Err(err!(
                        Validation,
                        format!("caller header {n} disagrees with the envelope"),
                        n.clone(),
                        "the binding owns prism-* headers; drop it (passthrough)"
                    ))
                }
            }
        }
        merged.push((n.clone(), v.clone()));
    }
    for (n, v) in ours {
        if !merged.iter().any(|(m, _)| m.eq_ignore_ascii_case(&n)) {
            merged.push((n, v));
        }
    }
    let key = key.or_else(|| {
        env.metadata()
            .and_then(|m| m.correlation_id.as_ref())
            .filter(|c| !c.is_empty())
            .map(|c| c.as_bytes().to_vec())
    });
    let timestamp_ms = env.metadata().map(|m| m.published_at_ms).unwrap_or(0);
    Ok(KafkaRecord {
        key,
        value,
        headers: merged,
        timestamp_ms,
    })
}

fn binding_err(what: String, header: &str) -> crate::PrismError {
    err!(
        Validation,
        what,
        header,
        "a header copy disagrees with the envelope: the record was changed or its producer is broken"
    )
}

/// Decode a received record: size limit, then the signature (with `verify_with`), then the
/// header-only parse, then every `prism-*` header copy against the envelope. The payload stays
/// borrowed from `record.value`.
pub fn decode<'a>(
    record: &'a KafkaRecord,
    limits: &Limits,
    verify_with: Option<&VerificationKeys>,
) -> Result<(EnvelopeView<'a>, Option<SignatureInfo>)> {
    let data = record.value.as_slice();
    if data.is_empty() {
        return Err(err!(
            Validation,
            "kafka record has no value (tombstone)",
            "kafka value",
            "tombstones carry no envelope; skip them before decoding"
        ));
    }
    if data.len() > limits.max_message_bytes {
        return Err(err!(
            SizeLimit,
            format!(
                "envelope is {} bytes, over the {}-byte limit",
                data.len(),
                limits.max_message_bytes
            ),
            "kafka value",
            "raise Limits::max_message_bytes"
        ));
    }
    let mut found: Vec<(&str, String)> = Vec::new();
    for (n, v) in &record.headers {
        let low = n.to_ascii_lowercase();
        let known = [
            ENVELOPE_VERSION,
            ENVELOPE_LAYOUT,
            MESSAGE_ID,
            TOPIC,
            NAMESPACE,
            TRACE_ID,
            CONTENT_TYPE,
        ];
        let Some(name) = known.iter().find(|k| **k == low) else {
            continue;
        };
        let text =
            String::from_utf8(v.clone()).map_err(|_| binding_err(format!("kafka header {n} is not valid UTF-8"), n))?;
        if let Some((_, prev)) = found.iter().find(|(k, _)| k == name) {
            if *prev != text {
                return Err(binding_err(
                    format!("kafka header {n} appears twice with different values"),
                    n,
                ));
            }
            continue;
        }
        found.push((name, text));
    }
    let get = |k: &str| found.iter().find(|(n, _)| *n == k).map(|(_, v)| v.as_str());
    // within the header limit: an unbounded walk of a 16 MiB value of tiny records is millions
    // of records before the decode below would refuse the header (codec::scan_envelope)
    let detected = layout_of_records(&scan_envelope(data, None, limits.max_header_bytes)?)?;
    let layout = match (get(ENVELOPE_LAYOUT), get(ENVELOPE_VERSION)) {
        (Some("draft"), _) => Layout::Draft,
        (Some("reviewed"), _) => Layout::Reviewed,
        (Some(other), _) => {
            return Err(binding_err(
                format!("unknown envelope layout {other:?}"),
                ENVELOPE_LAYOUT,
            ))
        }
        (None, Some(_)) => Layout::Draft,
        (None, None) => detected,
    };
    if let Some(v) = get(ENVELOPE_VERSION) {
        if v != "1" {
            return Err(binding_err(
                format!("unsupported envelope version {v:?}"),
                ENVELOPE_VERSION,
            ));
        }
        if layout != Layout::Draft {
            return Err(binding_err(
                "a version header with the reviewed layout".into(),
                ENVELOPE_VERSION,
            ));
        }
    }
    if layout != detected {
        return Err(binding_err(
            format!(
                "header says {} layout, the bytes are {}",
                layout.name(),
                detected.name()
            ),
            ENVELOPE_LAYOUT,
        ));
    }
    let info = match verify_with {
        Some(keys) => Some(signing::verify(data, keys, Some(layout), None)?),
        None => None,
    };
    let view = decode_view(data, Some(layout), limits)?;
    let env_md = view.metadata();
    let field = |f: fn(&crate::gen::v1::PrismMetadata) -> &str| env_md.map(f).unwrap_or("");
    let ct = env_md.map(crate::model::content_type).unwrap_or("");
    let trace = view
        .header
        .observability
        .as_ref()
        .map(|o| o.trace_id.as_str())
        .unwrap_or("");
    for (name, actual) in [
        (MESSAGE_ID, field(|m| &m.message_id)),
        (TOPIC, field(|m| &m.topic)),
        (NAMESPACE, field(|m| &m.namespace)),
        (TRACE_ID, trace),
        (CONTENT_TYPE, ct),
    ] {
        if let Some(h) = get(name) {
            if h != actual {
                return Err(binding_err(
                    format!("header {name} is {h:?} but the envelope says {actual:?}"),
                    name,
                ));
            }
        }
    }
    Ok((view, info))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env() -> Envelope {
        Envelope::builder("orders.created", "orders")
            .text("hi")
            .correlation_id("c-1")
            .build()
            .unwrap()
    }

    /// The layout is detected within the header limit: 16 MiB of tiny records ending in a
    /// truncated one is refused for its size before the walk reaches the end. `detect_layout`
    /// walked every record first (5.6M of them) and answered `Truncated`.
    #[test]
    fn layout_detection_stops_at_the_header_limit() {
        let mut value = [0x90u8, 0x03, 0x00].repeat(Limits::default().max_message_bytes / 3 - 2);
        value.extend_from_slice(&[0x92, 0x03, 0x05]);
        let rec = KafkaRecord {
            key: None,
            value,
            headers: vec![],
            timestamp_ms: 0,
        };
        let got = decode(&rec, &Limits::default(), None);
        assert!(matches!(got, Err(crate::PrismError::SizeLimit(_))), "{got:?}");
    }

    #[test]
    fn headers_key_and_round_trip() {
        let e = env();
        let rec = encode(&e, Layout::Draft, None, &[("x-mine".into(), b"1".to_vec())], None).unwrap();
        assert_eq!(rec.headers[0].0, "x-mine");
        assert_eq!(rec.header(ENVELOPE_VERSION), Some(&b"1"[..]));
        assert_eq!(rec.header(ENVELOPE_LAYOUT), Some(&b"draft"[..]));
        assert_eq!(rec.key.as_deref(), Some(&b"c-1"[..]));
        let (view, _) = decode(&rec, &Limits::default(), None).unwrap();
        assert_eq!(view.payload.unwrap().value().unwrap(), b"hi");
        let rec3 = encode(&e, Layout::Reviewed, None, &[], None).unwrap();
        assert!(rec3.header(ENVELOPE_VERSION).is_none());
    }

    #[test]
    fn disagreeing_headers_are_refused() {
        let e = env();
        let mut rec = encode(&e, Layout::Reviewed, None, &[], None).unwrap();
        rec.headers.push(("Prism-Topic".into(), b"other".to_vec()));
        assert!(decode(&rec, &Limits::default(), None).is_err());
        let mut rec = encode(&e, Layout::Reviewed, None, &[], None).unwrap();
        for h in rec.headers.iter_mut().filter(|(n, _)| n == ENVELOPE_LAYOUT) {
            h.1 = b"draft".to_vec();
        }
        assert!(decode(&rec, &Limits::default(), None).is_err());
        assert!(encode(&e, Layout::Reviewed, None, &[(TOPIC.into(), b"other".to_vec())], None).is_err());
        let empty = KafkaRecord::default();
        assert!(decode(&empty, &Limits::default(), None).is_err());
    }

    #[test]
    fn traceparent_only_for_valid_ids() {
        let mut e = env();
        let o = e.header.observability.get_or_insert_with(Default::default);
        o.trace_id = "4bf92f3577b34da6a3ce929d0e0e4736".into();
        o.span_id = "00f067aa0ba902b7".into();
        o.trace_flags = 1;
        assert_eq!(
            traceparent_of(&e).unwrap(),
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
        );
        e.header.observability.as_mut().unwrap().span_id = "0000000000000000".into();
        assert!(traceparent_of(&e).is_none());
    }

    // conformance/bindings/kafka-headers.json pins the rules case by case (tests/conformance.rs);
    // these check what no list of cases can: any bytes at all.
    proptest::proptest! {
        /// Untrusted extension bytes never panic, and what comes out is a tracestate the
        /// parser takes back unchanged: ASCII, no longer than the input, at most 32 members,
        /// none empty or padded.
        #[test]
        fn tracestate_of_any_bytes_is_a_fixed_point(raw in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..600)) {
            if let Some(out) = normalize_tracestate(&raw) {
                proptest::prop_assert!(out.is_ascii() && out.len() <= raw.len());
                proptest::prop_assert_eq!(normalize_tracestate(out.as_bytes()), Some(out.clone()));
                let members: Vec<&str> = out.split(',').collect();
                proptest::prop_assert!(members.len() <= TRACESTATE_MAX_MEMBERS);
                proptest::prop_assert!(members.iter().all(|m| !m.is_empty() && m.trim_matches([' ', '\t']) == *m));
            }
        }

        /// Lists of members built from the Level 1 grammar, padded with spaces and tabs: the
        /// output is the trimmed members joined with `,` when the keys are distinct and there
        /// are 1 to 32 of them, else nothing (random bytes rarely reach these paths).
        #[test]
        fn tracestate_of_grammar_members(members in proptest::collection::vec(
            "[ \t]{0,2}[a-z][a-z0-9_*/-]{0,2}(@[a-z][a-z0-9]{0,2})?=[!-+\\--<>-~ ]{0,3}[!-+\\--<>-~][ \t]{0,2}", 0..40)
        ) {
            let trimmed: Vec<&str> = members.iter().map(|m| m.trim_matches([' ', '\t'])).collect();
            let keys: std::collections::HashSet<&str> = trimmed.iter().map(|m| m.split_once('=').unwrap().0).collect();
            let expected = (!trimmed.is_empty() && trimmed.len() <= TRACESTATE_MAX_MEMBERS && keys.len() == trimmed.len())
                .then(|| trimmed.join(","));
            proptest::prop_assert_eq!(normalize_tracestate(members.join(",").as_bytes()), expected);
        }
    }
}

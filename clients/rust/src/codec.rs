//! Encode and decode envelopes in either wire layout (the Rust twin of `app/envelope/codec.py`).
//!
//! [`decode_view`] is the header-only parse: it walks the top-level records, decodes every
//! record but the payload, and *borrows* the payload (type_url and value) from the input
//! buffer. Its cost does not depend on the payload size (BENCHMARKS.md, "Rust client").
//!
//! [`encode`] writes `[header without security][security][payload]`, as Python does: the
//! payload last (a streaming reader can stop before it), and the signature scopes cut their
//! bytes from exactly these runs (docs/signing.md).

use prost::Message;

use crate::error::{err, Result};
use crate::gen::{draft, v1};
use crate::layouts::{draft_to_reviewed, reviewed_to_draft};
use crate::model::{Envelope, Payload, PayloadRef};
use crate::unknown::{self, UnknownFields};
use crate::wire::{self, Record, LEN, VARINT};

const DRAFT_UNKNOWN: &str = "prism.unknown.draft";
const REVIEWED_UNKNOWN: &str = "prism.unknown.reviewed";

/// The two wire layouts of RFC-031.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Layout {
    /// RFC-031 draft: `envelope_version = 1`, payload at field 3 (`<topic>.v2`).
    Draft,
    /// memo-031 reviewed layout: payload at field 99 (`<topic>.v3`).
    Reviewed,
}

impl Layout {
    pub fn security_field(self) -> u32 {
        match self {
            Layout::Draft => 4,
            Layout::Reviewed => 2,
        }
    }
    pub fn payload_field(self) -> u32 {
        match self {
            Layout::Draft => 3,
            Layout::Reviewed => 99,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Layout::Draft => "draft",
            Layout::Reviewed => "reviewed",
        }
    }
}

/// Size limits, checked before any payload byte is touched (Python's `Limits`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub max_message_bytes: usize,
    pub max_header_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_message_bytes: 16 * 1024 * 1024,
            max_header_bytes: 256 * 1024,
        }
    }
}

/// Tell the layouts apart by field 1's wire type (draft: varint `envelope_version`; reviewed:
/// the `metadata` message); without field 1, fields 5/6 mean draft, anything else reviewed.
pub fn detect_layout(data: &[u8]) -> Result<Layout> {
    layout_of_records(&wire::scan(data, 0, data.len())?)
}

/// [`detect_layout`] for callers that already scanned the records.
pub fn layout_of_records(records: &[Record]) -> Result<Layout> {
    if let Some(r) = records.iter().find(|r| r.field == 1) {
        return Ok(if r.wire_type == VARINT {
            Layout::Draft
        } else {
            Layout::Reviewed
        });
    }
    if records.iter().any(|r| r.field == 5 || r.field == 6) {
        return Ok(Layout::Draft);
    }
    if records.is_empty() {
        return Err(err!(
            Layout,
            "empty input is not an envelope",
            "byte 0",
            "check the producer sends envelope bytes"
        ));
    }
    Ok(Layout::Reviewed)
}

/// A decoded header with the payload borrowed from the input: the zero-copy, header-only parse.
#[derive(Debug, Clone, PartialEq)]
pub struct EnvelopeView<'a> {
    pub layout: Layout,
    /// The reviewed-layout header (`payload` is always `None`; see [`Self::payload`]).
    pub header: v1::PrismEnvelope,
    /// Borrowed from the input buffer; `None` when the envelope has no payload record.
    pub payload: Option<PayloadRef<'a>>,
    /// What the draft -> reviewed mapping could not carry (empty for the reviewed layout).
    pub dropped: Vec<String>,
    /// Fields this build does not know (see `crate::unknown`).
    pub unknown: UnknownFields,
}

impl EnvelopeView<'_> {
    /// Copy the payload out: an owned [`Envelope`] (fails when the payload is not an `Any`).
    pub fn to_envelope(&self) -> Result<Envelope> {
        let payload = match &self.payload {
            Some(p) => Some(p.to_owned_payload()?),
            None => None,
        };
        Ok(Envelope {
            header: self.header.clone(),
            payload,
            unknown: self.unknown.clone(),
        })
    }
    /// The header alone as an owned [`Envelope`] (no payload): never reads the payload.
    pub fn header_envelope(&self) -> Envelope {
        Envelope {
            header: self.header.clone(),
            payload: None,
            unknown: self.unknown.clone(),
        }
    }
    pub fn metadata(&self) -> Option<&v1::PrismMetadata> {
        self.header.metadata.as_ref()
    }
}

fn too_large(what: &str, size: usize, limit: usize, hint: &str) -> crate::PrismError {
    err!(
        SizeLimit,
        format!("{what} is {size} bytes, over the {limit}-byte limit"),
        "",
        hint
    )
}

/// The top-level records of an envelope whose header (every record but the payload) may take at
/// most `max_header` bytes, checked while walking: a record is 32 bytes of memory and as little
/// as 2 of input, so 16 MiB of tiny records would otherwise become millions of records before
/// [`decode_records`] refused the header. `layout: None`: the walk stops once the header is
/// over the limit in both layouts. A repeated payload record's tag and length count as header
/// (encoders write one payload record; protobuf merges copies), so a flood of empty payload
/// records is bounded too.
pub fn scan_envelope(data: &[u8], layout: Option<Layout>, max_header: usize) -> Result<Vec<Record>> {
    let layouts: &[Layout] = match layout {
        Some(Layout::Draft) => &[Layout::Draft],
        Some(Layout::Reviewed) => &[Layout::Reviewed],
        None => &[Layout::Draft, Layout::Reviewed],
    };
    let mut header = [0usize; 2]; // by position in `layouts`
    let mut payload = [false; 2];
    let (records, whole) = wire::walk_while(data, 0, data.len(), |r| {
        let mut over = true;
        for (i, lay) in layouts.iter().enumerate() {
            if r.field != lay.payload_field() || r.wire_type != LEN {
                header[i] += r.end - r.start;
            } else if payload[i] {
                header[i] += r.value_start - r.start;
            } else {
                payload[i] = true;
            }
            over &= header[i] > max_header;
        }
        !over
    })?;
    if !whole {
        let least = header[..layouts.len()].iter().min().copied().unwrap_or_default();
        let at = records.last().map_or(0, |r| r.end);
        return Err(err!(
            SizeLimit,
            format!("envelope header is over the {max_header}-byte limit ({least} bytes by byte {at})"),
            "",
            "move bulky data into the payload, or raise Limits::max_header_bytes"
        ));
    }
    Ok(records)
}

/// The header-only parse, borrowing the payload. `layout: None` detects it.
pub fn decode_view<'a>(data: &'a [u8], layout: Option<Layout>, limits: &Limits) -> Result<EnvelopeView<'a>> {
    if data.len() > limits.max_message_bytes {
        return Err(too_large(
            "envelope",
            data.len(),
            limits.max_message_bytes,
            "raise Limits::max_message_bytes or have the producer split the message",
        ));
    }
    let records = scan_envelope(data, layout, limits.max_header_bytes)?;
    let lay = match layout {
        Some(l) => l,
        None => layout_of_records(&records)?,
    };
    decode_records(data, &records, lay, limits)
}

/// [`decode_view`] for callers that already scanned the records (signature verification).
pub fn decode_records<'a>(
    data: &'a [u8],
    records: &[Record],
    lay: Layout,
    limits: &Limits,
) -> Result<EnvelopeView<'a>> {
    let pf = lay.payload_field();
    let mut payload: Option<PayloadRef<'a>> = None;
    let mut header_len = 0usize;
    let mut contiguous_end: Option<usize> = Some(0); // header records form data[..n] so far
    let mut any_payload = false;
    for r in records {
        if r.field == pf {
            if r.wire_type != LEN {
                return Err(err!(
                    Malformed,
                    format!(
                        "payload field {pf} must be length-delimited, got wire type {}",
                        r.wire_type
                    ),
                    format!("byte {}", r.start),
                    "the bytes are not an envelope of this layout"
                ));
            }
            // kept unparsed (header-only); a repeated record merges, see PayloadRef::parts
            payload
                .get_or_insert_with(|| PayloadRef {
                    parts: Vec::with_capacity(1),
                })
                .parts
                .push(&data[r.value_start..r.end]);
            any_payload = true;
        } else {
            header_len += r.end - r.start;
            contiguous_end = match contiguous_end {
                Some(e) if e == r.start && !any_payload => Some(r.end),
                _ => None,
            };
        }
    }
    if header_len > limits.max_header_bytes {
        return Err(too_large(
            "envelope header",
            header_len,
            limits.max_header_bytes,
            "move bulky data into the payload, or raise Limits::max_header_bytes",
        ));
    }
    let joined;
    let head: &[u8] = match contiguous_end {
        Some(e) => &data[..e],
        None => {
            let mut v = Vec::with_capacity(header_len);
            for r in records.iter().filter(|r| r.field != pf) {
                v.extend_from_slice(&data[r.start..r.end]);
            }
            joined = v;
            &joined
        }
    };
    let (header, dropped, unknown) = parse_header(head, lay)?;
    Ok(EnvelopeView {
        layout: lay,
        header,
        payload,
        dropped,
        unknown,
    })
}

fn parse_header(head: &[u8], lay: Layout) -> Result<(v1::PrismEnvelope, Vec<String>, UnknownFields)> {
    let bad = |e: prost::DecodeError| {
        err!(
            Malformed,
            format!(
                "envelope header is not valid protobuf for the {} layout: {e}",
                lay.name()
            ),
            "header",
            "check the producer's layout and encoder"
        )
    };
    let draft = lay == Layout::Draft;
    // prost refuses a known field written with another wire type, and puts a map entry with
    // extra fields into the map; protobuf (upb, Python) keeps both as unknown fields. When the
    // header holds such records, prost reads it without them (they are in `u` either way).
    let u = unknown::of_header(head, draft)?;
    let clean;
    let head = if unknown::has_known_numbers(&u, draft) {
        clean = unknown::without_mistyped(head, 0, head.len(), draft, "")?;
        clean.as_slice()
    } else {
        head
    };
    fn decode_lenient<M: Message + Default>(head: &[u8], _draft: bool) -> std::result::Result<M, prost::DecodeError> {
        M::decode(head)
    }
    match lay {
        Layout::Reviewed => Ok((
            decode_lenient::<v1::PrismEnvelope>(head, false).map_err(bad)?,
            Vec::new(),
            u,
        )),
        Layout::Draft => {
            // reading a draft header is its conversion to the reviewed model: an odd
            // extensions entry cannot be carried (refused, as in Python and Go)
            unknown::refuse_odd_map_entries(&u.top, true)?;
            let d = decode_lenient::<draft::PrismEnvelope>(head, true).map_err(bad)?;
            let (mut h, dropped) = draft_to_reviewed(&d)?;
            unknown::carry(&u, DRAFT_UNKNOWN, &mut h.extensions);
            let mut mu = UnknownFields {
                observability: u.observability,
                schema: u.schema,
                ..Default::default()
            };
            unknown::restore(&mut h.extensions, REVIEWED_UNKNOWN, false, &mut mu);
            Ok((h, dropped, mu))
        }
    }
}

/// Decode into an owned [`Envelope`] (the payload copied out of `data`).
pub fn decode(data: &[u8], limits: &Limits) -> Result<Envelope> {
    decode_view(data, None, limits)?.to_envelope()
}

fn payload_any(p: &Payload) -> Vec<u8> {
    let mut any = Vec::with_capacity(p.value.len() + p.type_url.len() + 12);
    if !p.type_url.is_empty() {
        wire::put_len_record(&mut any, 1, p.type_url.as_bytes());
    }
    if !p.value.is_empty() {
        wire::put_len_record(&mut any, 2, &p.value);
    }
    any
}

/// A LEN record of `field` whose value is `known` followed by `extra` (unknown records).
fn put_message(out: &mut Vec<u8>, field: u32, known: &[u8], extra: &[u8]) {
    wire::len_tag(out, field);
    wire::put_varint(out, (known.len() + extra.len()) as u64);
    out.extend_from_slice(known);
    out.extend_from_slice(extra);
}

/// A security context's value: prost writes the fields in number order; the encryption
/// record (field 6, with its unknown fields) goes between fields 5 and 7, the context's own
/// unknown fields last.
fn security_value(without_enc: &[u8], enc: Option<(Vec<u8>, &[u8])>, unknown_sec: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(without_enc.len() + unknown_sec.len() + 64);
    let mut enc = enc;
    // prost output is valid protobuf, so the scan cannot fail; on the impossible failure the
    // encryption record is appended after the other fields, still a valid encoding.
    for r in wire::scan(without_enc, 0, without_enc.len()).unwrap_or_default() {
        if r.field > 6 {
            if let Some((e, eu)) = enc.take() {
                put_message(&mut out, 6, &e, eu);
            }
        }
        out.extend_from_slice(&without_enc[r.start..r.end]);
    }
    if out.len() < without_enc.len() {
        out = without_enc.to_vec();
    }
    if let Some((e, eu)) = enc.take() {
        put_message(&mut out, 6, &e, eu);
    }
    out.extend_from_slice(unknown_sec);
    out
}

/// The three runs of the encoding: header without security, the security record, the payload
/// record (conformance/README.md, "The canonical encoding").
pub fn encode_parts(env: &Envelope, layout: Layout) -> (Vec<u8>, Vec<u8>, Vec<u8>) {
    let mut head = Vec::new();
    let mut security = Vec::new();
    let h = &env.header;
    match layout {
        Layout::Reviewed => {
            let u = &env.unknown;
            if h.metadata.is_some() || !u.metadata.is_empty() {
                put_message(
                    &mut head,
                    1,
                    &h.metadata.as_ref().map(|m| m.encode_to_vec()).unwrap_or_default(),
                    &u.metadata,
                );
            }
            if h.observability.is_some() || !u.observability.is_empty() {
                put_message(
                    &mut head,
                    3,
                    &h.observability.as_ref().map(|m| m.encode_to_vec()).unwrap_or_default(),
                    &u.observability,
                );
            }
            if h.schema.is_some() || !u.schema.is_empty() {
                put_message(
                    &mut head,
                    4,
                    &h.schema.as_ref().map(|m| m.encode_to_vec()).unwrap_or_default(),
                    &u.schema,
                );
            }
            let ext = v1::PrismEnvelope {
                extensions: h.extensions.clone(),
                ..Default::default()
            };
            head.extend_from_slice(&ext.encode_to_vec());
            head.extend_from_slice(&u.top);
            if let Some(s) = &h.security {
                let mut s = s.clone();
                let enc = s.encryption.take().map(|e| e.encode_to_vec());
                let v = security_value(
                    &s.encode_to_vec(),
                    enc.map(|e| (e, u.encryption.as_slice())),
                    &u.security,
                );
                put_message(&mut security, 2, &v, &[]);
            }
        }
        Layout::Draft => {
            let (d, _) = reviewed_to_draft(h);
            let mut ext = d.extensions.clone();
            unknown::carry(&env.unknown, REVIEWED_UNKNOWN, &mut ext);
            let mut u = UnknownFields {
                observability: env.unknown.observability.clone(),
                schema: env.unknown.schema.clone(),
                ..Default::default()
            };
            unknown::restore(&mut ext, DRAFT_UNKNOWN, true, &mut u);
            let version = draft::PrismEnvelope {
                envelope_version: d.envelope_version,
                ..Default::default()
            };
            head.extend_from_slice(&version.encode_to_vec());
            if d.metadata.is_some() || !u.metadata.is_empty() {
                put_message(
                    &mut head,
                    2,
                    &d.metadata.as_ref().map(|m| m.encode_to_vec()).unwrap_or_default(),
                    &u.metadata,
                );
            }
            if d.observability.is_some() || !u.observability.is_empty() {
                put_message(
                    &mut head,
                    5,
                    &d.observability.as_ref().map(|m| m.encode_to_vec()).unwrap_or_default(),
                    &u.observability,
                );
            }
            if d.schema.is_some() || !u.schema.is_empty() {
                put_message(
                    &mut head,
                    6,
                    &d.schema.as_ref().map(|m| m.encode_to_vec()).unwrap_or_default(),
                    &u.schema,
                );
            }
            let e = draft::PrismEnvelope {
                extensions: ext,
                ..Default::default()
            };
            head.extend_from_slice(&e.encode_to_vec());
            head.extend_from_slice(&u.top);
            if let Some(s) = &d.security {
                let mut s = s.clone();
                let enc = s.encryption.take().map(|e| e.encode_to_vec());
                let v = security_value(
                    &s.encode_to_vec(),
                    enc.map(|e| (e, u.encryption.as_slice())),
                    &u.security,
                );
                put_message(&mut security, 4, &v, &[]);
            }
        }
    }
    let mut payload = Vec::new();
    if let Some(p) = &env.payload {
        wire::put_len_record(&mut payload, layout.payload_field(), &payload_any(p));
    }
    (head, security, payload)
}

/// Serialize the envelope in the given layout, refusing what cannot be written in it: a
/// reviewed model that holds an odd `extensions` entry (kept aside among its unknown fields,
/// see [`unknown::refuse_odd_map_entries`]) is not written as a draft
/// ([`PrismError::AmbiguousMapEntry`](crate::PrismError::AmbiguousMapEntry)). Use this for a
/// model decoded from bytes someone else wrote; [`encode`] is the same without the check.
pub fn try_encode(env: &Envelope, layout: Layout) -> Result<Vec<u8>> {
    check_encodable(env, layout)?;
    Ok(encode(env, layout))
}

/// Refuse a reviewed model holding an odd `extensions` entry when it is to be written in the
/// draft layout (the reviewed layout keeps the entry, re-encoded where it was).
pub fn check_encodable(env: &Envelope, layout: Layout) -> Result<()> {
    match layout {
        Layout::Draft => unknown::refuse_odd_map_entries(&env.unknown.top, false),
        Layout::Reviewed => Ok(()),
    }
}

/// Serialize the envelope in the given layout. A reviewed model holding an odd `extensions`
/// entry written as a draft carries that entry in `prism.unknown.reviewed` rather than
/// refusing it: [`try_encode`] (which `convert`, signing and the Kafka binding use) refuses.
pub fn encode(env: &Envelope, layout: Layout) -> Vec<u8> {
    let (mut head, sec, payload) = encode_parts(env, layout);
    head.reserve(sec.len() + payload.len());
    head.extend_from_slice(&sec);
    head.extend_from_slice(&payload);
    head
}

/// Re-encode envelope bytes in another layout; returns the bytes and what was dropped.
/// A signature never survives a layout change (it covers the old bytes): it is removed and
/// reported, and whoever forwards the copy re-signs it.
pub fn convert(data: &[u8], to: Layout, limits: &Limits) -> Result<(Vec<u8>, Vec<String>)> {
    let view = decode_view(data, None, limits)?;
    let mut dropped = view.dropped.clone();
    let mut env = view.to_envelope()?;
    if to == Layout::Draft {
        dropped.extend(reviewed_to_draft(&env.header).1);
    }
    if let Some(s) = env.header.security.as_mut() {
        if s.signature.is_some() {
            s.signature = None;
            s.signature_algorithm = None;
            s.signature_key_id = None;
            s.signature_scope = None;
            s.sibling_digest = None;
            s.tree_index = None;
            s.tree_size = None;
            s.tree_path = None;
            dropped.push("security.signature: covers the original bytes only; re-sign after conversion".to_owned());
        }
    }
    Ok((try_encode(&env, to)?, dropped))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::PrismError;

    /// 16 MiB of three-byte records with a truncated record at the very end: the header limit
    /// stops the walk long before the end (it refuses the size, never reaching the truncation).
    /// The walk used to go through every record first - 5.6M records, 180 MB of them - and
    /// answer `Truncated`; with the last record intact it refused the header only afterwards.
    fn flood(record: &[u8], prefix: &[u8]) -> Vec<u8> {
        let mut data = prefix.to_vec();
        data.extend(record.repeat(Limits::default().max_message_bytes / record.len() - 2));
        data.extend_from_slice(&[0x92, 0x03, 0x05]); // field 50, 5 bytes claimed, none there
        data
    }

    #[test]
    fn the_header_limit_stops_the_walk() {
        for (what, data) in [
            ("unknown varint records", flood(&[0x90, 0x03, 0x00], b"")),
            // empty payload records are not header, but their repeated framing is:
            // a flood of them was accepted whole
            ("empty reviewed payload records", flood(&[0x9a, 0x06, 0x00], b"")),
            ("empty draft payload records", flood(&[0x1a, 0x00], &[0x08, 0x01])),
        ] {
            for layout in [None, Some(Layout::Draft), Some(Layout::Reviewed)] {
                match decode_view(&data, layout, &Limits::default()) {
                    Err(PrismError::SizeLimit(_)) => {}
                    other => panic!("{what} as {layout:?}: {other:?}"),
                }
            }
        }
        let mut many = [0x9a, 0x06, 0x00].repeat(1000);
        many.extend_from_slice(&[0x0a, 0x00]);
        assert!(
            decode_view(&many, None, &Limits::default()).is_ok(),
            "a few repeated payload records merge"
        );
    }

    /// One payload record of any size is not header, whatever layout the walk assumes.
    #[test]
    fn one_payload_record_is_not_header() {
        let env = Envelope::builder("t", "ns").bytes(vec![7u8; 1 << 20]).build().unwrap();
        for lay in [Layout::Draft, Layout::Reviewed] {
            let data = encode(&env, lay);
            for as_layout in [None, Some(lay)] {
                assert!(
                    scan_envelope(&data, as_layout, 1024).is_ok(),
                    "{lay:?} as {as_layout:?}"
                );
            }
            assert!(matches!(
                scan_envelope(&data, Some(lay), 8),
                Err(PrismError::SizeLimit(_))
            ));
        }
    }
}

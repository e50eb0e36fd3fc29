//! Both layouts' copies of a message to be signed in the pair or batch scope, worked out from
//! the reviewed header's serialized bytes alone: the reviewed head (the header without its
//! security record), the draft head and draft security context, and each copy's digest.
//!
//! This is the Python worker's `app.security.signing._pair_copies` (with
//! `app.envelope.codec.draft_split` and `app.envelope.layouts.draft_metadata`) done on bytes,
//! for the compiled hot path (`prism_native.pair_copies`). The worker writes every message in
//! both layouts; building the draft header field by field as protobuf objects was the largest
//! remaining piece of its per-message CPU (BENCHMARKS.md, issue 29).
//!
//! **Contract.** The input is a reviewed header as a protobuf encoder writes it (upb, prost):
//! known fields in field-number order, each at most once, minimal varints. Anything this
//! shortcut does not handle byte for byte - unknown fields anywhere it reads, an encryption
//! context, observability maps, more than one `extensions` entry or a carried
//! `prism.unknown.*` one, a security record that is not right after the metadata, a varint
//! that is not minimal or not 64-bit, a string that is not UTF-8, a record that cannot be
//! walked - gives `None`: the caller takes its general path (the full layout conversion),
//! which gives the same bytes or words the error. So there is no fault to report: a `None`
//! is never wrong, only slower. Nothing here panics on any input (`cargo test`: generated
//! headers against [`crate::layouts::reviewed_to_draft`], hostile and 70-bit inputs).

use std::borrow::Cow;

use sha2::{Digest, Sha256};

use crate::wire::{read_varint_wide, LEN, VARINT};

/// The security context fields a pair-scope digest leaves out (`auth_token`, `signature`,
/// `sibling_digest`): `_CUT_PAIR` in app/security/signing.py.
pub const CUT_PAIR: &[u32] = &[3, 4, 11];
/// The batch scope's: the pair scope's and the tree fields (`_CUT_BATCH`).
pub const CUT_BATCH: &[u32] = &[3, 4, 11, 12, 13, 14];

/// What [`pair_copies`] works out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PairCopies {
    /// The reviewed header without its security record (`split_header(header, REVIEWED)[0]`).
    pub head_reviewed: Vec<u8>,
    /// The draft header without its security record: version, metadata, observability,
    /// schema, extension entry.
    pub head_draft: Vec<u8>,
    /// The draft security context's value bytes (no tag or length), as a draft
    /// `SecurityContext` serializes.
    pub security_draft: Vec<u8>,
    /// SHA-256 over the draft copy as the pair/batch statement digests it.
    pub digest_draft: [u8; 32],
    /// The same over the reviewed copy.
    pub digest_reviewed: [u8; 32],
}

/// One record of a canonically written message: field, wire type, the whole record
/// `start..end`, and for VARINT records the value, for LEN records the value's start.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Rec {
    pub(crate) field: u32,
    pub(crate) wire_type: u8,
    pub(crate) start: usize,
    pub(crate) value_start: usize,
    pub(crate) end: usize,
    pub(crate) value: u64,
}

/// The minimal number of bytes of `v` as a varint.
pub(crate) fn varint_len(v: u64) -> usize {
    (64 - (v | 1).leading_zeros() as usize).div_ceil(7)
}

/// A minimal varint of at most 64 bits at `pos` (`None` otherwise).
fn canon_varint(buf: &[u8], pos: usize, end: usize) -> Option<(u64, usize)> {
    let (v, p) = read_varint_wide(buf, pos, end).ok()?;
    let v = u64::try_from(v).ok()?;
    (p - pos == varint_len(v)).then_some((v, p))
}

/// The records of `buf[start..end]` when they are written as an encoder writes known fields:
/// VARINT and LEN only, field numbers strictly increasing, minimal tags, lengths and values.
pub(crate) fn canon_records(buf: &[u8], start: usize, end: usize) -> Option<Vec<Rec>> {
    canon_records_repeating(buf, start, end, 0)
}

/// [`canon_records`], where field `repeated` (0: none) may also follow itself: the entries of
/// a repeated field, which an encoder writes one after the other.
fn canon_records_repeating(buf: &[u8], start: usize, end: usize, repeated: u32) -> Option<Vec<Rec>> {
    let mut out = Vec::with_capacity(12);
    let mut pos = start;
    let mut last = 0u32;
    while pos < end {
        let (key, p) = canon_varint(buf, pos, end)?;
        let field = u32::try_from(key >> 3).ok()?;
        let wire_type = (key & 7) as u8;
        if (field <= last && !(field == last && field == repeated)) || field > (1 << 29) - 1 {
            return None;
        }
        last = field;
        let (value, value_start, rec_end) = match wire_type {
            VARINT => {
                let (v, q) = canon_varint(buf, p, end)?;
                (v, p, q)
            }
            LEN => {
                let (len, vs) = canon_varint(buf, p, end)?;
                let len = usize::try_from(len).ok()?;
                if len > end - vs {
                    return None;
                }
                (len as u64, vs, vs + len)
            }
            _ => return None,
        };
        out.push(Rec {
            field,
            wire_type,
            start: pos,
            value_start,
            end: rec_end,
            value,
        });
        pos = rec_end;
    }
    Some(out)
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8 & 0x7f) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn put_len(out: &mut Vec<u8>, tag: u8, value: &[u8]) {
    out.push(tag);
    put_varint(out, value.len() as u64);
    out.extend_from_slice(value);
}

/// A VARINT value that is an int32 as an encoder writes it (sign-extended to 64 bits).
fn as_i32(v: u64) -> Option<i32> {
    i32::try_from(v as i64).ok()
}

fn utf8(b: &[u8]) -> Option<&[u8]> {
    std::str::from_utf8(b).ok().map(|_| b)
}

/// The draft `PrismMetadata` value for a reviewed `PrismMetadata` value:
/// `layouts.draft_metadata(vm).SerializeToString()` in app/envelope/layouts.py.
/// `None` for unknown fields or anything not written canonically.
pub fn draft_metadata(m: &[u8]) -> Option<Vec<u8>> {
    let mut s: [&[u8]; 14] = [&[]; 14];
    let (mut ms, mut priority, mut ttl) = (0i64, 0i32, 0i64);
    let (mut ct, mut ce) = (None::<i32>, None::<i32>);
    for r in canon_records(m, 0, m.len())? {
        match (r.field, r.wire_type) {
            // 1-4 have no presence: an encoder leaves a zero value out, so a record of one is
            // not an encoder's output (upb would drop it and the reviewed bytes would differ)
            (1..=3, LEN) if r.value == 0 => return None,
            (4, VARINT) if r.value == 0 => return None,
            (1..=3 | 9..=13, LEN) => s[r.field as usize] = utf8(&m[r.value_start..r.end])?,
            (4, VARINT) => ms = r.value as i64,
            (5, VARINT) => ct = Some(as_i32(r.value)?),
            (6, VARINT) => priority = as_i32(r.value)?,
            (7, VARINT) => ttl = r.value as i64,
            (8, VARINT) => ce = Some(as_i32(r.value)?),
            _ => return None, // unknown, or a known number with another wire type
        }
    }
    let content_type: &[u8] = match ct {
        None => b"",
        Some(99) => s[11],
        Some(1) => b"application/protobuf",
        Some(2) => b"application/json",
        Some(3) => b"application/avro",
        Some(_) => b"",
    };
    let content_encoding: &[u8] = match ce {
        None => b"",
        Some(99) => s[12],
        Some(0) => b"none",
        Some(1) => b"gzip",
        Some(2) => b"snappy",
        Some(3) => b"zstd",
        Some(_) => b"",
    };
    let mut out = Vec::with_capacity(m.len() + 16);
    for f in 1..=3u8 {
        if !s[f as usize].is_empty() {
            put_len(&mut out, (f << 3) | LEN, s[f as usize]);
        }
    }
    // published_at: always set (Timestamp of ms // 1000 and the rest as nanos, floored)
    let mut ts = Vec::with_capacity(16);
    let (secs, nanos) = (ms.div_euclid(1000), ms.rem_euclid(1000) * 1_000_000);
    if secs != 0 {
        ts.push(0x08);
        put_varint(&mut ts, secs as u64);
    }
    if nanos != 0 {
        ts.push(0x10);
        put_varint(&mut ts, nanos as u64);
    }
    put_len(&mut out, 0x22, &ts);
    if !content_type.is_empty() {
        put_len(&mut out, 0x2a, content_type);
    }
    if !content_encoding.is_empty() {
        put_len(&mut out, 0x32, content_encoding);
    }
    if priority != 0 {
        out.push(0x38);
        put_varint(&mut out, i64::from(priority) as u64);
    }
    if ttl != 0 {
        out.push(0x40);
        put_varint(&mut out, ttl as u64);
    }
    for f in [9u8, 10] {
        if !s[f as usize].is_empty() {
            put_len(&mut out, (f << 3) | LEN, s[f as usize]);
        }
    }
    if !s[13].is_empty() {
        put_len(&mut out, (13 << 3) | LEN, s[13]);
    }
    Some(out)
}

/// The draft `SecurityContext` value for a reviewed one without encryption or unknown fields
/// (fields 1-5 and 7-14 have the same numbers and wire types in both): the records kept byte
/// for byte, those with a zero value left out (the draft's plain proto3 fields do not write
/// them). Also says whether an `auth_token` record was present (the reviewed copy's
/// `HasField`) and whether the draft keeps one (a non-empty token: what the draft copy's
/// digest checks, `_as_is` in Python).
fn draft_security(sec: &[u8], recs: &[Rec]) -> Option<(Vec<u8>, bool, bool)> {
    let mut out = Vec::with_capacity(sec.len());
    let (mut token, mut token_draft) = (false, false);
    for r in recs {
        let zero = match (r.field, r.wire_type) {
            (1 | 2 | 3 | 5 | 8 | 9, LEN) => {
                utf8(&sec[r.value_start..r.end])?;
                r.value == 0
            }
            (4 | 11 | 14, LEN) => r.value == 0,
            (7, VARINT) if r.value <= 1 => r.value == 0,
            (10, VARINT) => as_i32(r.value)? == 0,
            (12 | 13, VARINT) => r.value == 0,
            _ => return None, // encryption (6), unknown, or another wire type
        };
        token |= r.field == 3;
        if !zero {
            token_draft |= r.field == 3;
            out.extend_from_slice(&sec[r.start..r.end]);
        }
    }
    Some((out, token, token_draft))
}

/// A security record (`tag`, value) as the pair or batch digest covers it: as is when it
/// holds no `auth_token` (the signing fields were cleared by the caller), else with the
/// `cut` fields' records removed and re-framed (`scope_v2_security` in Python).
fn digest_security(tag: u8, value: &[u8], recs: &[Rec], token: bool, cut: &[u32], out: &mut Vec<u8>) {
    let kept: Vec<u8>;
    let body = if token {
        let mut k = Vec::with_capacity(value.len());
        for r in recs.iter().filter(|r| !cut.contains(&r.field)) {
            k.extend_from_slice(&value[r.start..r.end]);
        }
        kept = k;
        &kept[..]
    } else {
        value
    };
    put_len(out, tag, body);
}

fn digest(head: &[u8], security: &[u8], payload_prefix: &[u8], payload: Option<&[u8]>) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(head);
    h.update(security);
    if let Some(p) = payload {
        h.update(payload_prefix);
        h.update(p);
    }
    h.finalize().into()
}

const UNKNOWN_EXT_KEY: &[u8] = b"prism.unknown.";

/// Whether `buf[start..end]` is a message of strings and at most one int32, as an encoder
/// writes it: fields `1..=strings` non-empty UTF-8 strings (no presence: a zero value is left
/// out), field `repeated` (0: none) UTF-8 strings that may be empty (the entries of a repeated
/// string), field `int32` a non-zero int32, nothing else. These records are copied into both
/// heads byte for byte, so they must be bytes upb reads and writes back unchanged: a record
/// that does not walk, an unknown field or an invalid string gives `None` (the general path
/// then words the error) instead of copies of bytes no parser would accept.
fn canon_plain_message(
    buf: &[u8],
    start: usize,
    end: usize,
    strings: u32,
    repeated: u32,
    int32: Option<u32>,
) -> Option<()> {
    for r in canon_records_repeating(buf, start, end, repeated)? {
        match (r.field, r.wire_type) {
            (f, LEN) if (1..=strings).contains(&f) && r.value > 0 => {
                utf8(&buf[r.value_start..r.end])?;
            }
            (f, LEN) if f == repeated && f != 0 => {
                utf8(&buf[r.value_start..r.end])?;
            }
            (f, VARINT) if Some(f) == int32 && as_i32(r.value)? != 0 => {}
            _ => return None,
        }
    }
    Some(())
}

/// The draft head's tail for the reviewed head's records after the metadata (observability 3
/// -> 5, schema 4 -> 6, one extensions entry 97 -> 99: same fields, new tags).
fn draft_tail(head: &[u8], recs: &[Rec], out: &mut Vec<u8>) -> Option<()> {
    for r in recs {
        if r.wire_type != LEN {
            return None;
        }
        let tag: &[u8] = match r.field {
            3 => {
                // observability: trace_id, span_id, parent_span_id, trace_flags (int32); the
                // maps (5, 6) may be written in another order after a re-parse: not converted
                canon_plain_message(head, r.value_start, r.end, 3, 0, Some(4))?;
                b"\x2a"
            }
            // schema: six strings and the entries of `deprecated_fields_used`
            4 => {
                canon_plain_message(head, r.value_start, r.end, 6, 7, None)?;
                b"\x32"
            }
            97 => {
                // one entry (records are strictly increasing): a key first, not a carried
                // unknown one, then at most a value record and nothing else
                let (start, end) = (r.value_start, r.end);
                if start >= end || head[start] != 0x0a {
                    return None;
                }
                let (klen, ks) = canon_varint(head, start + 1, end)?;
                let vpos = ks.checked_add(usize::try_from(klen).ok()?)?;
                if vpos > end || head[ks..vpos].starts_with(UNKNOWN_EXT_KEY) {
                    return None;
                }
                utf8(&head[ks..vpos])?;
                if vpos < end {
                    if head[vpos] != 0x12 {
                        return None;
                    }
                    let (vlen, vs) = canon_varint(head, vpos + 1, end)?;
                    if usize::try_from(vlen).ok()? != end - vs {
                        return None;
                    }
                }
                b"\x9a\x06"
            }
            _ => return None,
        };
        out.extend_from_slice(tag);
        let tag_len = if r.field == 97 { 2 } else { 1 };
        out.extend_from_slice(&head[r.start + tag_len..r.end]);
    }
    Some(())
}

/// Both copies of a message whose signing fields are cleared, from its reviewed header
/// serialized (`full`, no payload) and its payload `Any` value: the heads, the draft security
/// context and the two digests (SHA-256 of head, security record as `cut` leaves it, payload
/// record). `None` when the header is not one this shortcut converts byte for byte (see the
/// module's contract).
pub fn pair_copies(full: &[u8], payload: Option<&[u8]>, cut: &[u32]) -> Option<PairCopies> {
    let top = canon_records(full, 0, full.len())?;
    let (meta, sec) = match top.as_slice() {
        [m, s, ..] if m.field == 1 && m.wire_type == LEN && s.field == 2 && s.wire_type == LEN => (m, s),
        _ => return None,
    };
    let rest = &top[2..];
    let mut head_reviewed = Vec::with_capacity(full.len());
    head_reviewed.extend_from_slice(&full[..sec.start]);
    head_reviewed.extend_from_slice(&full[sec.end..]);

    let mut head_draft = Vec::with_capacity(full.len() + 16);
    head_draft.extend_from_slice(b"\x08\x01"); // envelope_version = 1
    put_len(
        &mut head_draft,
        0x12,
        &draft_metadata(&full[meta.value_start..meta.end])?,
    );
    draft_tail(full, rest, &mut head_draft)?;

    let sec_value = &full[sec.value_start..sec.end];
    let sec_recs = canon_records(sec_value, 0, sec_value.len())?;
    let (security_draft, token, token_draft) = draft_security(sec_value, &sec_recs)?;

    let mut cut_r = Vec::with_capacity(sec_value.len() + 4);
    digest_security(0x12, sec_value, &sec_recs, token, cut, &mut cut_r);
    let mut cut_d = Vec::with_capacity(security_draft.len() + 4);
    if token_draft {
        let d_recs = canon_records(&security_draft, 0, security_draft.len())?;
        digest_security(0x22, &security_draft, &d_recs, true, cut, &mut cut_d);
    } else {
        put_len(&mut cut_d, 0x22, &security_draft);
    }
    let mut prefix_d = vec![0x1a];
    let mut prefix_r = vec![0x9a, 0x06];
    if let Some(p) = payload {
        put_varint(&mut prefix_d, p.len() as u64);
        put_varint(&mut prefix_r, p.len() as u64);
    }
    Some(PairCopies {
        digest_draft: digest(&head_draft, &cut_d, &prefix_d, payload),
        digest_reviewed: digest(&head_reviewed, &cut_r, &prefix_r, payload),
        head_reviewed,
        head_draft,
        security_draft,
    })
}

/// The Kafka binding's headers that depend on the envelope alone, read from the reviewed
/// header's bytes: what `app.bindings.kafka._envelope_headers` builds from the protobuf
/// objects, in its order and wording ([`envelope_headers`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvelopeHeaders<'a> {
    /// `(name, value)` of the non-empty ones among `prism-message-id`, `prism-topic`,
    /// `prism-namespace`, `prism-trace-id`, `prism-content-type` (the MIME string), then
    /// `traceparent` when the observability context holds a valid trace.
    pub headers: Vec<(&'static str, Cow<'a, [u8]>)>,
    /// A `traceparent` is among them and the header has an extensions entry that is, or may
    /// be, `w3c.tracestate`: the caller still checks its value against the W3C grammar and
    /// appends `tracestate` when it holds (the Python side's `tracestate_of`).
    pub tracestate_pending: bool,
}

/// The `prism-content-type` value for metadata's `content_type` (field 5, `None`: absent) and
/// `content_type_custom` (11): `get_content_type` in app/envelope/model.py.
fn content_type_of(ct: Option<i32>, custom: &[u8]) -> &[u8] {
    match ct {
        Some(1) => b"application/protobuf",
        Some(2) => b"application/json",
        Some(3) => b"application/avro",
        Some(99) => custom,
        _ => b"",
    }
}

/// The Kafka binding's envelope headers ([`EnvelopeHeaders`]) for a reviewed header serialized
/// without its payload (`full`, as [`pair_copies`] takes it), so the worker's publisher gets
/// them from the call that already has the bytes instead of reading ten protobuf fields and
/// validating the trace ids in Python.
///
/// The rules are the Python binding's: a metadata copy only when not empty; `prism-trace-id`
/// is the observability context's `trace_id` as it is; `traceparent` is
/// `00-<trace_id>-<span_id>-<flags & 3, 2 hex digits>` when the context is present, the ids
/// are 32 and 16 lowercase hex digits, not all zeros, and the flags within 0..=255 (the
/// version-00 rules, only the known flag bits propagated), else absent.
///
/// Only what it is sure of: the top level must be metadata, security, observability, schema
/// and extensions records as an encoder writes them, the metadata and observability contexts
/// known fields only, canonical, strings UTF-8 and no observability maps; anything else gives
/// `None` and the caller builds the headers its own way. The security and schema records are
/// not read (no header depends on them); [`pair_copies`] checks them.
pub fn envelope_headers(full: &[u8]) -> Option<EnvelopeHeaders<'_>> {
    let (mut meta, mut obs) = (None, None);
    let mut tracestate_entry = false;
    for r in canon_records_repeating(full, 0, full.len(), 97)? {
        match (r.field, r.wire_type) {
            (1, LEN) => meta = Some(&full[r.value_start..r.end]),
            (3, LEN) => obs = Some(&full[r.value_start..r.end]),
            (2 | 4, LEN) => {}
            (97, LEN) => tracestate_entry |= may_be_tracestate(&full[r.value_start..r.end]),
            _ => return None,
        }
    }
    let meta = meta?;
    let mut s: [&[u8]; 12] = [&[]; 12];
    let mut ct = None;
    for r in canon_records(meta, 0, meta.len())? {
        match (r.field, r.wire_type) {
            (1..=3 | 11, LEN) => s[r.field as usize] = utf8(&meta[r.value_start..r.end])?,
            (9 | 10 | 12 | 13, LEN) => {}
            (5, VARINT) => ct = Some(as_i32(r.value)?),
            (4 | 6 | 7 | 8, VARINT) => {}
            _ => return None,
        }
    }
    let (mut trace_id, mut span_id, mut flags): (&[u8], &[u8], i32) = (b"", b"", 0);
    if let Some(o) = obs {
        for r in canon_records(o, 0, o.len())? {
            match (r.field, r.wire_type) {
                (1, LEN) => trace_id = utf8(&o[r.value_start..r.end])?,
                (2, LEN) => span_id = utf8(&o[r.value_start..r.end])?,
                (3, LEN) => {
                    utf8(&o[r.value_start..r.end])?;
                }
                (4, VARINT) => flags = as_i32(r.value)?,
                _ => return None, // the maps (5, 6), unknown fields, other wire types
            }
        }
    }
    let mut headers: Vec<(&'static str, Cow<'_, [u8]>)> = Vec::with_capacity(7);
    let content_type = content_type_of(ct, s[11]);
    for (name, value) in [
        (crate::binding::MESSAGE_ID, s[1]),
        (crate::binding::TOPIC, s[2]),
        (crate::binding::NAMESPACE, s[3]),
        (crate::binding::TRACE_ID, trace_id),
        (crate::binding::CONTENT_TYPE, content_type),
    ] {
        if !value.is_empty() {
            headers.push((name, Cow::Borrowed(value)));
        }
    }
    let traceparent = obs.and_then(|_| crate::binding::traceparent_value(trace_id, span_id, flags));
    let traced = traceparent.is_some();
    if let Some(tp) = traceparent {
        headers.push((crate::binding::TRACEPARENT, Cow::Owned(tp)));
    }
    let tracestate_pending = traced && tracestate_entry;
    Some(EnvelopeHeaders {
        headers,
        tracestate_pending,
    })
}

/// Whether an extensions map entry's key is, or may be, `w3c.tracestate`: an entry that
/// does not walk as an encoder writes one may be (the caller reads the map itself).
fn may_be_tracestate(entry: &[u8]) -> bool {
    let Some(recs) = canon_records(entry, 0, entry.len()) else {
        return true;
    };
    let key = recs.iter().find(|r| r.field == 1 && r.wire_type == LEN);
    key.is_some_and(|k| &entry[k.value_start..k.end] == crate::binding::TRACESTATE_EXTENSION.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gen::{draft, v1};
    use crate::layouts::reviewed_to_draft;
    use proptest::prelude::*;
    use prost::Message;

    fn reference(h: &v1::PrismEnvelope, payload: Option<&[u8]>, cut: &[u32]) -> PairCopies {
        let full = h.encode_to_vec();
        let sec = h.security.clone().unwrap();
        let mut no_sec = h.clone();
        no_sec.security = None;
        let head_r = no_sec.encode_to_vec();
        let (mut d, _) = reviewed_to_draft(h);
        let sec_d = d.security.take().unwrap();
        let head_d = d.encode_to_vec();
        let sec_d_bytes = sec_d.encode_to_vec();
        // Python's `_as_is`: the reviewed record is cut when it has an auth_token record
        // (even an empty one), the draft one when its token is not empty; else kept whole
        let strip_r = |s: &v1::SecurityContext| {
            let mut s = s.clone();
            if s.auth_token.is_some() {
                s.auth_token = None;
                s.signature = None;
                s.sibling_digest = None;
                if cut.len() > 3 {
                    (s.tree_index, s.tree_size, s.tree_path) = (None, None, None);
                }
            }
            s
        };
        let strip_d = |s: &draft::SecurityContext| {
            let mut s = s.clone();
            if !s.auth_token.is_empty() {
                s.auth_token.clear();
                s.signature.clear();
                s.sibling_digest.clear();
                if cut.len() > 3 {
                    (s.tree_index, s.tree_size) = (0, 0);
                    s.tree_path.clear();
                }
            }
            s
        };
        let frame = |tag: u8, v: Vec<u8>| {
            let mut o = Vec::new();
            put_len(&mut o, tag, &v);
            o
        };
        let pay = |tag: &[u8]| {
            payload.map(|p| {
                let mut o = tag.to_vec();
                put_varint(&mut o, p.len() as u64);
                o.extend_from_slice(p);
                o
            })
        };
        let dig = |parts: &[&[u8]]| -> [u8; 32] {
            let mut h = Sha256::new();
            for p in parts {
                h.update(p);
            }
            h.finalize().into()
        };
        let _ = full;
        let pd = pay(b"\x1a").unwrap_or_default();
        let pr = pay(b"\x9a\x06").unwrap_or_default();
        PairCopies {
            digest_draft: dig(&[&head_d, &frame(0x22, strip_d(&sec_d).encode_to_vec()), &pd]),
            digest_reviewed: dig(&[&head_r, &frame(0x12, strip_r(&sec).encode_to_vec()), &pr]),
            head_reviewed: head_r,
            head_draft: head_d,
            security_draft: sec_d_bytes,
        }
    }

    fn opt_str() -> impl Strategy<Value = Option<String>> {
        prop_oneof![Just(None), Just(Some(String::new())), "[a-zé/._-]{1,12}".prop_map(Some)]
    }

    fn header() -> impl Strategy<Value = v1::PrismEnvelope> {
        let meta = (
            ("[a-z0-9-]{0,12}", "[a-z.]{0,10}", "[a-z]{0,6}", any::<i64>()),
            (
                prop::option::of(prop_oneof![0..5i32, Just(99), Just(-7), Just(1 << 20)]),
                opt_str(),
            ),
            (prop::option::of(prop_oneof![0..5i32, Just(99), Just(-1)]), opt_str()),
            (prop::option::of(any::<i32>()), prop::option::of(any::<i64>())),
            (opt_str(), opt_str(), opt_str()),
        )
            .prop_map(
                |((id, topic, ns, ms), (ct, ctc), (ce, cec), (pr, ttl), (corr, cause, sdk))| v1::PrismMetadata {
                    message_id: id,
                    topic,
                    namespace: ns,
                    published_at_ms: ms,
                    content_type: ct,
                    content_type_custom: ctc,
                    content_encoding: ce,
                    content_encoding_custom: cec,
                    priority: pr,
                    ttl_seconds: ttl,
                    correlation_id: corr,
                    causality_parent: cause,
                    producer_sdk_version: sdk,
                },
            );
        let sec = (
            (opt_str(), opt_str(), opt_str(), opt_str()),
            (
                prop::option::of(any::<bool>()),
                opt_str(),
                prop::option::of(prop_oneof![0..5i32, Just(-3)]),
            ),
            (
                prop::option::of(prop::collection::vec(any::<u8>(), 0..4)),
                prop::option::of(any::<u64>()),
                prop::option::of(prop_oneof![Just(0u64), any::<u64>()]),
            ),
        )
            .prop_map(
                |((pid, team, tok, alg), (pii, class, scope), (sig, index, size))| v1::SecurityContext {
                    signature: sig.clone(),
                    sibling_digest: sig,
                    tree_index: index,
                    tree_size: size,
                    publisher_id: pid,
                    publisher_team: team,
                    auth_token: tok,
                    signature_algorithm: alg,
                    contains_pii: pii,
                    data_classification: class,
                    signature_scope: scope,
                    ..Default::default()
                },
            );
        let obs = prop::option::of(
            ("[0-9a-f]{0,8}", any::<i32>()).prop_map(|(t, f)| v1::ObservabilityContext {
                trace_id: t,
                trace_flags: f,
                ..Default::default()
            }),
        );
        let schema = prop::option::of("[a-z:/]{0,10}".prop_map(|u| v1::SchemaContext {
            schema_url: u,
            ..Default::default()
        }));
        let ext = prop::option::of(("[a-z.]{1,12}", prop::collection::vec(any::<u8>(), 0..6)));
        (meta, sec, obs, schema, ext).prop_map(|(m, s, o, sc, e)| v1::PrismEnvelope {
            metadata: Some(m),
            security: Some(s),
            observability: o,
            schema: sc,
            extensions: e.into_iter().collect(),
            ..Default::default()
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]
        #[test]
        fn same_as_the_full_conversion(h in header(), payload in prop::option::of(prop::collection::vec(any::<u8>(), 0..300)),
                                       batch in any::<bool>()) {
            let cut = if batch { CUT_BATCH } else { CUT_PAIR };
            let got = pair_copies(&h.encode_to_vec(), payload.as_deref(), cut);
            prop_assert_eq!(got, Some(reference(&h, payload.as_deref(), cut)));
        }

        #[test]
        fn any_bytes_give_a_value_or_none(bytes in prop::collection::vec(any::<u8>(), 0..200)) {
            let _ = pair_copies(&bytes, Some(&bytes), CUT_PAIR);
            let _ = draft_metadata(&bytes);
        }

        #[test]
        fn a_corrupted_header_gives_a_value_or_none(h in header(), at in any::<prop::sample::Index>(), b in any::<u8>()) {
            let mut full = h.encode_to_vec();
            let i = at.index(full.len());
            full[i] = b;
            let _ = pair_copies(&full, None, CUT_BATCH);
            full.truncate(i);
            let _ = pair_copies(&full, None, CUT_BATCH);
        }
    }

    fn base() -> v1::PrismEnvelope {
        v1::PrismEnvelope {
            metadata: Some(v1::PrismMetadata {
                message_id: "m".into(),
                published_at_ms: 1_700_000_000_123,
                ..Default::default()
            }),
            security: Some(v1::SecurityContext {
                publisher_id: Some("p".into()),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn the_base_converts() {
        let h = base();
        assert_eq!(
            pair_copies(&h.encode_to_vec(), Some(b"x"), CUT_PAIR),
            Some(reference(&h, Some(b"x"), CUT_PAIR))
        );
    }

    #[test]
    fn what_the_shortcut_leaves_to_the_general_path() {
        let full = base().encode_to_vec();
        let meta_len = full[1] as usize;
        let with = |extra_meta: &[u8], extra_top: &[u8]| {
            let mut m = full[2..2 + meta_len].to_vec();
            m.extend_from_slice(extra_meta);
            let mut out = vec![0x0a];
            put_varint(&mut out, m.len() as u64);
            out.extend_from_slice(&m);
            out.extend_from_slice(&full[2 + meta_len..]);
            out.extend_from_slice(extra_top);
            out
        };
        // a baseline that converts
        assert!(pair_copies(&with(b"", b""), None, CUT_PAIR).is_some());
        let refused: &[(&str, Vec<u8>)] = &[
            ("unknown metadata field", with(b"\xa0\x06\x01", b"")),
            ("correlation_id as VARINT", with(b"\x48\x01", b"")),
            ("ttl_seconds as LEN", with(b"\x3a\x00", b"")),
            ("a metadata field twice", with(b"\x4a\x01a\x4a\x01b", b"")),
            ("fields out of order", with(b"\x0a\x01m", b"")),
            (
                "70-bit varint in metadata",
                with(b"\x30\xff\xff\xff\xff\xff\xff\xff\xff\xff\x7f", b""),
            ),
            ("non-minimal varint", with(b"\x30\x81\x00", b"")),
            ("priority outside int32", with(b"\x30\x80\x80\x80\x80\x10", b"")),
            ("unknown top-level field", with(b"", b"\xa8\x06\x01")),
            (
                "two extension entries",
                with(b"", b"\x8a\x06\x03\x0a\x01a\x8a\x06\x03\x0a\x01b"),
            ),
            (
                "carried unknown entry",
                with(b"", b"\x8a\x06\x10\x0a\x0eprism.unknown."),
            ),
            ("entry with a third field", with(b"", b"\x8a\x06\x05\x0a\x01a\x18\x01")),
            ("entry without key", with(b"", b"\x8a\x06\x02\x12\x00")),
            ("entry with neither key nor value", with(b"", b"\x8a\x06\x00")),
            ("entry key past its end", with(b"", b"\x8a\x06\x02\x0a\x05")),
            ("entry value longer", with(b"", b"\x8a\x06\x06\x0a\x01a\x12\x05b")),
            ("observability map", with(b"", b"\x1a\x06\x2a\x04\x0a\x00\x12\x00")),
            ("observability not walkable", with(b"", b"\x1a\x02\x0a\x05")),
            ("observability unknown field", with(b"", b"\x1a\x02\x38\x01")),
            ("observability empty trace_id", with(b"", b"\x1a\x02\x0a\x00")),
            ("observability trace_flags 0", with(b"", b"\x1a\x02\x20\x00")),
            ("observability invalid UTF-8", with(b"", b"\x1a\x03\x0a\x01\xff")),
            // hypothesis found this one: a schema record that does not walk was copied as is
            ("schema not walkable", with(b"", b"\x22\x03\x2a\x00\x30")),
            ("schema unknown field", with(b"", b"\x22\x02\x40\x01")),
            ("schema empty schema_url", with(b"", b"\x22\x02\x0a\x00")),
            ("schema invalid UTF-8", with(b"", b"\x22\x03\x3a\x01\xff")),
            ("truncated", full[..full.len() - 1].to_vec()),
            (
                "70-bit tag",
                [b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\x7f".as_slice(), &full].concat(),
            ),
            ("group", [b"\x0b".as_slice(), &full].concat()),
            ("fixed64", with(b"", b"\xf9\x05\x00\x00\x00\x00\x00\x00\x00\x00")),
        ];
        for (what, bytes) in refused {
            assert_eq!(pair_copies(bytes, Some(b"p"), CUT_BATCH), None, "{what}");
        }
        // the security record: encryption, unknown, bool not 0/1, invalid UTF-8, out of order
        for sec in [
            b"\x32\x00".as_slice(),
            b"\xa0\x06\x01",
            b"\x38\x02",
            b"\x0a\x01\xff",
            b"\x12\x01a\x0a\x01b",
            b"\x50\x80\x80\x80\x80\x10",
        ] {
            let mut f = full[..2 + meta_len].to_vec();
            f.push(0x12);
            put_varint(&mut f, sec.len() as u64);
            f.extend_from_slice(sec);
            assert_eq!(pair_copies(&f, None, CUT_PAIR), None, "{sec:?}");
        }
        // metadata fields without presence written with their zero value: not an encoder's
        // output (upb drops them, so the reviewed head would not be the Python path's)
        for meta in [b"\x0a\x01m\x12\x00\x20\x01".as_slice(), b"\x0a\x01m\x20\x00"] {
            let mut f = vec![0x0a];
            put_varint(&mut f, meta.len() as u64);
            f.extend_from_slice(meta);
            f.extend_from_slice(b"\x12\x03\x0a\x01p");
            assert_eq!(pair_copies(&f, None, CUT_PAIR), None, "{meta:?}");
        }
        // while the same with the zero fields left out converts, and so do the contexts
        // written as an encoder writes them
        assert!(pair_copies(b"\x0a\x05\x0a\x01m\x20\x01\x12\x03\x0a\x01p", None, CUT_PAIR).is_some());
        assert!(pair_copies(
            &with(b"", b"\x1a\x05\x0a\x01t\x20\x01\x22\x07\x0a\x01u\x3a\x00\x3a\x00"),
            None,
            CUT_PAIR
        )
        .is_some());
        // the entries of a repeated string may repeat; no other field may
        assert_eq!(
            pair_copies(&with(b"", b"\x22\x06\x0a\x01u\x0a\x01v"), None, CUT_PAIR),
            None
        );
        // no security record, or not right after the metadata
        assert_eq!(pair_copies(&full[..2 + meta_len], None, CUT_PAIR), None);
        assert_eq!(pair_copies(b"", None, CUT_PAIR), None);
    }

    #[test]
    fn a_token_is_cut_from_both_digests() {
        let mut h = base();
        h.security.as_mut().unwrap().auth_token = Some("tok".into());
        h.security.as_mut().unwrap().signature_scope = Some(4);
        let got = pair_copies(&h.encode_to_vec(), Some(b"v"), CUT_BATCH).unwrap();
        assert_eq!(got, reference(&h, Some(b"v"), CUT_BATCH));
        let mut h2 = h.clone();
        h2.security.as_mut().unwrap().auth_token = None;
        let without = pair_copies(&h2.encode_to_vec(), Some(b"v"), CUT_BATCH).unwrap();
        assert_eq!(got.digest_draft, without.digest_draft);
        assert_eq!(got.digest_reviewed, without.digest_reviewed);
        assert_ne!(got.security_draft, without.security_draft);
    }

    #[test]
    fn negative_times_floor_as_python_does() {
        for ms in [-1i64, -999, -1000, -1001, i64::MIN, i64::MAX, 0] {
            let mut h = base();
            h.metadata.as_mut().unwrap().published_at_ms = ms;
            assert_eq!(
                pair_copies(&h.encode_to_vec(), None, CUT_PAIR),
                Some(reference(&h, None, CUT_PAIR)),
                "{ms}"
            );
        }
    }

    /// `_envelope_headers` of app/bindings/kafka.py over the decoded message, written from the
    /// Python rules rather than from [`envelope_headers`]' walk; the tracestate left pending
    /// when a valid traceparent goes with a `w3c.tracestate` entry.
    fn reference_headers(h: &v1::PrismEnvelope) -> Owned {
        let m = h.metadata.clone().unwrap_or_default();
        let ct: &str = match m.content_type {
            Some(1) => "application/protobuf",
            Some(2) => "application/json",
            Some(3) => "application/avro",
            Some(99) => m.content_type_custom.as_deref().unwrap_or(""),
            _ => "",
        };
        let o = h.observability.as_ref();
        let tid = o.map(|o| o.trace_id.as_str()).unwrap_or("");
        let mut out = Vec::new();
        for (n, v) in [
            ("prism-message-id", m.message_id.as_str()),
            ("prism-topic", m.topic.as_str()),
            ("prism-namespace", m.namespace.as_str()),
            ("prism-trace-id", tid),
            ("prism-content-type", ct),
        ] {
            if !v.is_empty() {
                out.push((n, v.as_bytes().to_vec()));
            }
        }
        let hex =
            |s: &str, n: usize| s.len() == n && s.chars().all(|c| "0123456789abcdef".contains(c)) && s != "0".repeat(n);
        let tp = o.filter(|o| (0..=255).contains(&o.trace_flags) && hex(&o.trace_id, 32) && hex(&o.span_id, 16));
        if let Some(o) = tp {
            let v = format!("00-{}-{}-{:02x}", o.trace_id, o.span_id, o.trace_flags & 3);
            out.push(("traceparent", v.into_bytes()));
        }
        (out, tp.is_some() && h.extensions.contains_key("w3c.tracestate"))
    }

    /// The headers as owned `(name, value)` pairs and whether a tracestate is pending.
    type Owned = (Vec<(&'static str, Vec<u8>)>, bool);

    fn got_headers(full: &[u8]) -> Option<Owned> {
        let g = envelope_headers(full)?;
        Some((
            g.headers.into_iter().map(|(n, v)| (n, v.into_owned())).collect(),
            g.tracestate_pending,
        ))
    }

    fn traced_header() -> impl Strategy<Value = v1::PrismEnvelope> {
        let id = |n: usize| -> BoxedStrategy<String> {
            let re = |r: String| prop::string::string_regex(&r).unwrap().boxed();
            prop_oneof![
                Just(String::new()).boxed(),
                Just("0".repeat(n)).boxed(),
                re(format!("[0-9a-f]{{{n}}}")),
                re(format!("[0-9a-fA-F]{{{n}}}")),
                re(format!("[0-9a-f]{{{}}}", n - 1)),
                re(format!("[0-9a-f]{{{}}}", n + 1)),
                re("[0-9a-fé]{1,40}".into()),
            ]
            .boxed()
        };
        let flags = prop_oneof![0..4i32, 0..=255i32, Just(256), Just(-1), any::<i32>()];
        let obs =
            prop::option::of(
                (id(32), id(16), opt_str(), flags).prop_map(|(t, s, p, f)| v1::ObservabilityContext {
                    trace_id: t,
                    span_id: s,
                    parent_span_id: p.unwrap_or_default(),
                    trace_flags: f,
                    ..Default::default()
                }),
            );
        let ct = prop::option::of(prop_oneof![0..4i32, Just(99), Just(7), Just(-5)]);
        let ext = prop::collection::btree_map(
            prop_oneof![Just("w3c.tracestate".to_string()), Just(String::new()), "[a-z.]{1,16}"],
            prop::collection::vec(any::<u8>(), 0..6),
            0..3,
        );
        (header(), obs, ct, opt_str(), "[a-zé /._-]{0,12}", ext).prop_map(|(mut h, o, ct, ctc, id, e)| {
            let m = h.metadata.as_mut().unwrap();
            m.content_type = ct;
            m.content_type_custom = ctc;
            m.message_id = id;
            h.observability = o;
            h.extensions = e.into_iter().collect();
            h
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(3000))]
        #[test]
        fn the_headers_are_the_python_bindings(h in traced_header()) {
            prop_assert_eq!(got_headers(&h.encode_to_vec()), Some(reference_headers(&h)));
        }

        #[test]
        fn the_headers_of_any_bytes_are_a_value_or_none(bytes in prop::collection::vec(any::<u8>(), 0..200)) {
            let _ = envelope_headers(&bytes);
        }

        #[test]
        fn the_headers_of_a_corrupted_header_are_its_decoding_or_none(h in traced_header(),
                                                                      at in any::<prop::sample::Index>(), b in any::<u8>()) {
            let mut full = h.encode_to_vec();
            let i = at.index(full.len());
            full[i] = b;
            // a value only where prost reads the same message back from the bytes
            if let Some(got) = got_headers(&full) {
                // (the security and schema records are not read: prost may refuse them)
                if let Ok(back) = v1::PrismEnvelope::decode(full.as_slice()) {
                    prop_assert_eq!(got, reference_headers(&back));
                }
            }
        }
    }

    #[test]
    fn the_headers_words_and_declines() {
        let tid = "0af7651916cd43dd8448eb211c80319c";
        let sid = "b7ad6b7169203331";
        let mut h = base();
        h.metadata.as_mut().unwrap().content_type = Some(2);
        h.observability = Some(v1::ObservabilityContext {
            trace_id: tid.into(),
            span_id: sid.into(),
            trace_flags: 0x83, // unknown bits are not propagated
            ..Default::default()
        });
        let (got, pending) = got_headers(&h.encode_to_vec()).unwrap();
        assert_eq!(
            got,
            vec![
                ("prism-message-id", b"m".to_vec()),
                ("prism-trace-id", tid.as_bytes().to_vec()),
                ("prism-content-type", b"application/json".to_vec()),
                ("traceparent", format!("00-{tid}-{sid}-03").into_bytes()),
            ]
        );
        assert!(!pending);
        h.extensions.insert("w3c.tracestate".into(), b"a=b".to_vec());
        assert!(got_headers(&h.encode_to_vec()).unwrap().1);
        // an entry whose key it cannot read may be the tracestate one: left to the caller
        let mut odd = base().encode_to_vec();
        odd.extend_from_slice(b"\x1a\x34\x0a\x20");
        odd.extend_from_slice(tid.as_bytes());
        odd.extend_from_slice(b"\x12\x10");
        odd.extend_from_slice(sid.as_bytes());
        let valued = [odd.as_slice(), b"\x8a\x06\x02\x12\x00"].concat(); // key "": not the one
        assert!(!got_headers(&valued).unwrap().1);
        odd.extend_from_slice(b"\x8a\x06\x02\x0a\x05"); // its key runs past the entry
        assert!(got_headers(&odd).unwrap().1);
        let full = base().encode_to_vec();
        for (what, extra) in [
            ("observability map", b"\x1a\x06\x2a\x04\x0a\x00\x12\x00".as_slice()),
            ("observability invalid UTF-8", b"\x1a\x03\x0a\x01\xff"),
            ("trace_flags outside int32", b"\x1a\x06\x20\x80\x80\x80\x80\x10"),
            ("unknown top-level field", b"\xa8\x06\x01"),
            ("payload record", b"\x9a\x06\x00"),
            ("fixed64", b"\xf9\x05\x00\x00\x00\x00\x00\x00\x00\x00"),
        ] {
            assert_eq!(got_headers(&[full.as_slice(), extra].concat()), None, "{what}");
        }
        for (what, meta) in [
            ("unknown metadata field", b"\x0a\x01m\xa0\x06\x01".as_slice()),
            ("message_id invalid UTF-8", b"\x0a\x01\xff"),
            ("content type outside int32", b"\x28\x80\x80\x80\x80\x10"),
            ("content_type_custom as VARINT", b"\x58\x01"),
        ] {
            let mut f = vec![0x0a];
            put_varint(&mut f, meta.len() as u64);
            f.extend_from_slice(meta);
            assert_eq!(got_headers(&f), None, "{what}");
        }
        assert_eq!(got_headers(b""), None, "no metadata");
    }
}

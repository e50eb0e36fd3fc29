//! Unknown fields: what a newer producer added and this build does not know. prost drops
//! them, so the codec finds them in the received bytes itself and keeps their wire records
//! byte for byte (conformance/README.md, "The JSON form of a message"; docs/formats.md,
//! "Envelope evolution"). Encoding writes them back after the known fields of their message.
//!
//! Across a layout change they cannot keep their numbers (the same number means something else
//! in the other layout), so they travel as extensions `prism.unknown.<layout>[.<path>]` and are
//! put back when the envelope returns to the layout they came from, as in Python.

use std::collections::BTreeMap;

use crate::error::Result;
use crate::wire;

/// The unknown wire records of each message of the reviewed model (empty: none).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct UnknownFields {
    pub top: Vec<u8>,
    pub metadata: Vec<u8>,
    pub security: Vec<u8>,
    pub encryption: Vec<u8>,
    pub observability: Vec<u8>,
    pub schema: Vec<u8>,
}

impl UnknownFields {
    pub fn is_empty(&self) -> bool {
        self.top.is_empty()
            && self.metadata.is_empty()
            && self.security.is_empty()
            && self.encryption.is_empty()
            && self.observability.is_empty()
            && self.schema.is_empty()
    }
}

/// The paths carried across a layout change (observability and schema share their numbering
/// in both layouts and keep their unknown fields on their numbers).
pub const CARRIED: [&str; 4] = ["", ".metadata", ".security", ".security.encryption"];

/// The wire type of a known field of each message, per layout (None: a number the message
/// does not define).
pub fn expected_wire_type(draft: bool, path: &str, field: u32) -> Option<u8> {
    use crate::wire::{LEN as L, VARINT as V};
    match (draft, path, field) {
        (false, "", 1..=4 | 97 | 99) => Some(L),
        (true, "", 1) => Some(V),
        (true, "", 2..=6 | 99) => Some(L),
        (false, ".metadata", 1..=3 | 9..=13) => Some(L),
        (false, ".metadata", 4..=8) => Some(V),
        (true, ".metadata", 1..=6 | 9 | 10 | 13) => Some(L),
        (true, ".metadata", 7 | 8) => Some(V),
        (true, ".metadata.published_at", 1 | 2) => Some(V),
        (_, ".security", 1..=6 | 8 | 9 | 11 | 14) => Some(L),
        (_, ".security", 7 | 10 | 12 | 13) => Some(V),
        (false, ".security.encryption", 2) => Some(V),
        (false, ".security.encryption", 1 | 3..=8) => Some(L),
        (true, ".security.encryption", 1..=4) => Some(L),
        (_, ".observability", 1..=3 | 5 | 6) => Some(L),
        (_, ".observability", 4) => Some(V),
        (_, ".schema", 1..=7) => Some(L),
        (_, ".entry", 1 | 2) => Some(L),
        _ => None,
    }
}

/// Known field numbers of each message, per layout (whatever the wire type).
pub fn known(layout_draft: bool, path: &str, field: u32) -> bool {
    expected_wire_type(layout_draft, path, field).is_some()
}

/// A record protobuf keeps as an unknown field: an unknown number, or a known number with
/// another wire type (upb, and so Python, keeps those as unknown fields too).
pub fn is_unknown(draft: bool, path: &str, field: u32, wire_type: u8) -> bool {
    expected_wire_type(draft, path, field) != Some(wire_type)
}

/// The nested message a known LEN field holds, as a path of [`expected_wire_type`].
fn child(draft: bool, path: &str, field: u32) -> Option<&'static str> {
    match (draft, path, field) {
        (false, "", 1) | (true, "", 2) => Some(".metadata"),
        (false, "", 2) | (true, "", 4) => Some(".security"),
        (false, "", 3) | (true, "", 5) => Some(".observability"),
        (false, "", 4) | (true, "", 6) => Some(".schema"),
        (false, "", 97) | (true, "", 99) => Some(".entry"),
        (true, ".metadata", 4) => Some(".metadata.published_at"),
        (_, ".security", 6) => Some(".security.encryption"),
        (_, ".observability", 5 | 6) => Some(".entry"),
        _ => None,
    }
}

/// `buf[start..end]` without the records protobuf keeps as unknown because of their wire type,
/// at every nesting level, for prost (which refuses a known field with another wire type).
/// Those records are kept by [`of_header`]; unknown numbers stay (prost skips them).
pub fn without_mistyped(buf: &[u8], start: usize, end: usize, draft: bool, path: &str) -> Result<Vec<u8>> {
    let mut out = Vec::with_capacity(end - start);
    for r in wire::scan(buf, start, end)? {
        match expected_wire_type(draft, path, r.field) {
            None => out.extend_from_slice(&buf[r.start..r.end]),
            Some(wt) if wt != r.wire_type => {}
            Some(_) if kept_unknown(buf, &r, draft, path)? => {}
            Some(_) => match child(draft, path, r.field) {
                Some(sub) if r.wire_type == wire::LEN => {
                    let inner = without_mistyped(buf, r.value_start, r.end, draft, sub)?;
                    wire::put_len_record(&mut out, r.field, &inner);
                }
                _ => out.extend_from_slice(&buf[r.start..r.end]),
            },
        }
    }
    Ok(out)
}

/// A map entry (`extensions`, `labels`, `baggage`) that holds anything but its key and value:
/// protobuf (upb) keeps such an entry as an unknown field of the map's message, byte for byte,
/// instead of putting it into the map.
fn kept_unknown(buf: &[u8], r: &wire::Record, draft: bool, path: &str) -> Result<bool> {
    if r.wire_type != wire::LEN || child(draft, path, r.field) != Some(".entry") {
        return Ok(false);
    }
    Ok(wire::scan(buf, r.value_start, r.end)?
        .iter()
        .any(|e| is_unknown(draft, ".entry", e.field, e.wire_type)))
}

/// Refuse a header of the given layout whose unknown top-level records (`top`, as
/// [`of_header`] finds them) hold an `extensions` map entry with more than a key and a value.
/// Such an entry is kept aside as an unknown record on the map's own number (as upb keeps it),
/// where the unknown-field carry cannot take it across a layout change: dropping it would lose
/// it, writing it back on a map number would hand a runtime that stores odd entries (Go's,
/// Java's) a key Python never saw. So a conversion from or to the draft layout refuses it, as
/// Python and Go do (docs/formats.md, "Map entries that hold more than a key and a value").
pub fn refuse_odd_map_entries(top: &[u8], draft: bool) -> Result<()> {
    if top.is_empty() {
        return Ok(());
    }
    let field = if draft { 99 } else { 97 };
    let n = wire::scan(top, 0, top.len())?
        .iter()
        .filter(|r| r.field == field && r.wire_type == wire::LEN)
        .count();
    if n == 0 {
        return Ok(());
    }
    let layout = if draft { "draft" } else { "reviewed" };
    Err(crate::PrismError::AmbiguousMapEntry(crate::Detail::new(
        format!(
            "{n} entr{} of the extensions map hold more than a key and a value (a third field, or a key \
             or value of another wire type): protobuf runtimes read such an entry differently, so the \
             envelope is not converted from the {layout} layout",
            if n == 1 { "y" } else { "ies" }
        ),
        format!("extensions (field {field})"),
        "write extensions as plain map<string, bytes> entries (generated code or a Prism client does); the \
         record was not converted",
    )))
}

/// The record `buf[r.start..r.end]` (an odd map entry, see [`kept_unknown`]) as upb keeps it:
/// upb parses the entry as the entry message and writes it again - its key and value (the last
/// of each, omitted when empty: implicit presence), then its other records in their order. So
/// re-encoding the message gives the bytes Python (and Go) give, not the received ones.
fn upb_entry(buf: &[u8], r: &wire::Record, out: &mut Vec<u8>) -> Result<()> {
    let (mut key, mut value, mut rest): (&[u8], &[u8], Vec<u8>) = (&[], &[], Vec::new());
    for e in wire::scan(buf, r.value_start, r.end)? {
        match (e.field, e.wire_type) {
            (1, wire::LEN) => key = &buf[e.value_start..e.end],
            (2, wire::LEN) => value = &buf[e.value_start..e.end],
            _ => rest.extend_from_slice(&buf[e.start..e.end]),
        }
    }
    let mut entry = Vec::with_capacity(r.end - r.value_start);
    if !key.is_empty() {
        wire::put_len_record(&mut entry, 1, key);
    }
    if !value.is_empty() {
        wire::put_len_record(&mut entry, 2, value);
    }
    entry.extend_from_slice(&rest);
    wire::put_len_record(out, r.field, &entry);
    Ok(())
}

/// True when `u` holds records with known numbers (a mistyped field, a map entry with extra
/// fields): prost must then read the header without them ([`without_mistyped`]).
pub fn has_known_numbers(u: &UnknownFields, draft: bool) -> bool {
    [
        ("", &u.top),
        (".metadata", &u.metadata),
        (".security", &u.security),
        (".security.encryption", &u.encryption),
        (".observability", &u.observability),
        (".schema", &u.schema),
    ]
    .iter()
    .any(|(path, raw)| {
        wire::scan(raw, 0, raw.len())
            .map(|rs| rs.iter().any(|r| known(draft, path, r.field)))
            .unwrap_or(false)
    })
}

/// The records of `buf[start..end]` (message `path`) that protobuf keeps as unknown, in received order.
pub fn unknown_records(buf: &[u8], start: usize, end: usize, draft: bool, path: &str) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    for r in wire::scan(buf, start, end)? {
        if is_unknown(draft, path, r.field, r.wire_type) {
            out.extend_from_slice(&buf[r.start..r.end]);
        } else if kept_unknown(buf, &r, draft, path)? {
            upb_entry(buf, &r, &mut out)?;
        }
    }
    Ok(out)
}

/// Unknown records of a header (top-level records, payload excluded) of either layout:
/// (top, metadata, security, encryption, observability, schema). A nested message that is cut
/// short is malformed (the input itself did not end there).
pub fn of_header(head: &[u8], draft: bool) -> Result<UnknownFields> {
    of_header_inner(head, draft).map_err(|e| match e {
        crate::PrismError::Truncated(d) => crate::PrismError::Malformed(crate::Detail::new(
            format!("a nested message is not valid protobuf: {}", d.what),
            d.at,
            "the producer's encoder is broken or the bytes were changed",
        )),
        other => other,
    })
}

fn of_header_inner(head: &[u8], draft: bool) -> Result<UnknownFields> {
    let (f_md, f_sec, f_obs, f_sch) = if draft { (2, 4, 5, 6) } else { (1, 2, 3, 4) };
    let enc_field = 6;
    let mut u = UnknownFields::default();
    for r in wire::scan(head, 0, head.len())? {
        let sub = |path: &str| unknown_records(head, r.value_start, r.end, draft, path);
        match r.field {
            _ if is_unknown(draft, "", r.field, r.wire_type) => u.top.extend_from_slice(&head[r.start..r.end]),
            _ if kept_unknown(head, &r, draft, "")? => upb_entry(head, &r, &mut u.top)?,
            f if r.wire_type == wire::LEN && f == f_md => u.metadata.extend(sub(".metadata")?),
            f if r.wire_type == wire::LEN && f == f_obs => u.observability.extend(sub(".observability")?),
            f if r.wire_type == wire::LEN && f == f_sch => u.schema.extend(sub(".schema")?),
            f if r.wire_type == wire::LEN && f == f_sec => {
                u.security.extend(sub(".security")?);
                for s in wire::scan(head, r.value_start, r.end)? {
                    if s.field == enc_field && s.wire_type == wire::LEN {
                        u.encryption.extend(unknown_records(
                            head,
                            s.value_start,
                            s.end,
                            draft,
                            ".security.encryption",
                        )?);
                    }
                }
            }
            _ => {}
        }
    }
    Ok(u)
}

fn slot<'a>(u: &'a mut UnknownFields, path: &str) -> &'a mut Vec<u8> {
    match path {
        "" => &mut u.top,
        ".metadata" => &mut u.metadata,
        ".security" => &mut u.security,
        _ => &mut u.encryption,
    }
}

/// Move the carried paths of `u` into extensions `<prefix><path>`.
pub fn carry(u: &UnknownFields, prefix: &str, ext: &mut BTreeMap<String, Vec<u8>>) {
    let mut u = u.clone();
    for path in CARRIED {
        let v = std::mem::take(slot(&mut u, path));
        if !v.is_empty() {
            ext.insert(format!("{prefix}{path}"), v);
        }
    }
}

/// Take extensions `<prefix><path>` back into `u`, keeping only records whose numbers the
/// target layout does not know (an extension can never set a known field). A malformed value
/// stays where it is, an extension like any other.
pub fn restore(ext: &mut BTreeMap<String, Vec<u8>>, prefix: &str, target_draft: bool, u: &mut UnknownFields) {
    for path in CARRIED {
        let key = format!("{prefix}{path}");
        let Some(raw) = ext.get(&key) else { continue };
        let Ok(recs) = wire::scan(raw, 0, raw.len()) else {
            continue;
        };
        let keep: Vec<u8> = recs
            .iter()
            .filter(|r| !known(target_draft, path, r.field))
            .flat_map(|r| raw[r.start..r.end].to_vec())
            .collect();
        slot(u, path).extend(keep);
        ext.remove(&key);
    }
}

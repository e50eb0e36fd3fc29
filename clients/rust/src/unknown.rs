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

/// Known field numbers of each message, per layout.
pub fn known(layout_draft: bool, path: &str, field: u32) -> bool {
    match (layout_draft, path) {
        (false, "") => matches!(field, 1..=4 | 97 | 99),
        (true, "") => matches!(field, 1..=6 | 99),
        (false, ".metadata") => matches!(field, 1..=13),
        (true, ".metadata") => matches!(field, 1..=10 | 13),
        (_, ".security") => matches!(field, 1..=14),
        (false, ".security.encryption") => matches!(field, 1..=8),
        (true, ".security.encryption") => matches!(field, 1..=4),
        (_, ".observability") => matches!(field, 1..=6),
        (_, ".schema") => matches!(field, 1..=7),
        _ => true,
    }
}

/// The records of `buf[start..end]` whose numbers `is_known` rejects, in received order.
pub fn unknown_records(buf: &[u8], start: usize, end: usize, is_known: impl Fn(u32) -> bool) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    for r in wire::scan(buf, start, end)? {
        if !is_known(r.field) {
            out.extend_from_slice(&buf[r.start..r.end]);
        }
    }
    Ok(out)
}

/// Unknown records of a header (top-level records, payload excluded) of either layout:
/// (top, metadata, security, encryption, observability, schema).
pub fn of_header(head: &[u8], draft: bool) -> Result<UnknownFields> {
    let (f_md, f_sec, f_obs, f_sch) = if draft { (2, 4, 5, 6) } else { (1, 2, 3, 4) };
    let enc_field = 6;
    let mut u = UnknownFields::default();
    for r in wire::scan(head, 0, head.len())? {
        let sub = |path: &str| unknown_records(head, r.value_start, r.end, |f| known(draft, path, f));
        match r.field {
            f if !known(draft, "", f) => u.top.extend_from_slice(&head[r.start..r.end]),
            f if r.wire_type == wire::LEN && f == f_md => u.metadata.extend(sub(".metadata")?),
            f if r.wire_type == wire::LEN && f == f_obs => u.observability.extend(sub(".observability")?),
            f if r.wire_type == wire::LEN && f == f_sch => u.schema.extend(sub(".schema")?),
            f if r.wire_type == wire::LEN && f == f_sec => {
                u.security.extend(sub(".security")?);
                for s in wire::scan(head, r.value_start, r.end)? {
                    if s.field == enc_field && s.wire_type == wire::LEN {
                        u.encryption.extend(unknown_records(head, s.value_start, s.end, |f| {
                            known(draft, ".security.encryption", f)
                        })?);
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
        let Ok(keep) = unknown_records(raw, 0, raw.len(), |f| known(target_draft, path, f)) else {
            continue;
        };
        slot(u, path).extend(keep);
        ext.remove(&key);
    }
}

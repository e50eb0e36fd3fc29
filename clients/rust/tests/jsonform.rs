//! The suite's JSON form of a protobuf message (conformance/README.md, "The JSON form of a
//! message"), computed from wire bytes with a table of each message's fields. Independent of
//! prost on purpose: it is how the tests see what the crate's decoder and encoder produce.

use serde_json::{Map, Value};

#[derive(Clone, Copy)]
pub enum T {
    S,
    B,
    Bool,
    I32,
    I64,
    U64,
    Enum,
    Msg(&'static str),
    MapSB,
    MapSS,
    RepS,
}

/// (number, name, type, explicit presence)
type F = (u32, &'static str, T, bool);

fn fields(msg: &str) -> &'static [F] {
    use T::*;
    match msg {
        "v1" => &[
            (1, "metadata", Msg("v1.meta"), true),
            (2, "security", Msg("v1.sec"), true),
            (3, "observability", Msg("obs"), true),
            (4, "schema", Msg("schema"), true),
            (97, "extensions", MapSB, false),
            (99, "payload", Msg("any"), true),
        ],
        "v1.meta" => &[
            (1, "message_id", S, false),
            (2, "topic", S, false),
            (3, "namespace", S, false),
            (4, "published_at_ms", I64, false),
            (5, "content_type", Enum, true),
            (6, "priority", I32, true),
            (7, "ttl_seconds", I64, true),
            (8, "content_encoding", Enum, true),
            (9, "correlation_id", S, true),
            (10, "causality_parent", S, true),
            (11, "content_type_custom", S, true),
            (12, "content_encoding_custom", S, true),
            (13, "producer_sdk_version", S, true),
        ],
        "v1.sec" => &[
            (1, "publisher_id", S, true),
            (2, "publisher_team", S, true),
            (3, "auth_token", S, true),
            (4, "signature", B, true),
            (5, "signature_algorithm", S, true),
            (6, "encryption", Msg("v1.enc"), true),
            (7, "contains_pii", Bool, true),
            (8, "data_classification", S, true),
            (9, "signature_key_id", S, true),
            (10, "signature_scope", Enum, true),
            (11, "sibling_digest", B, true),
            (12, "tree_index", U64, true),
            (13, "tree_size", U64, true),
            (14, "tree_path", B, true),
        ],
        "v1.enc" => &[
            (1, "key_id", S, false),
            (2, "encryption_type", Enum, false),
            (3, "algorithm", S, false),
            (4, "public_key_id", S, true),
            (5, "iv", B, true),
            (6, "aad", B, true),
            (7, "encapsulated_key", B, true),
            (8, "algorithm_params", S, true),
        ],
        "obs" => &[
            (1, "trace_id", S, false),
            (2, "span_id", S, false),
            (3, "parent_span_id", S, false),
            (4, "trace_flags", I32, false),
            (5, "baggage", MapSS, false),
            (6, "labels", MapSS, false),
        ],
        "schema" => &[
            (1, "schema_url", S, false),
            (2, "schema_version", S, false),
            (3, "schema_format", S, false),
            (4, "schema_hash", S, false),
            (5, "schema_name", S, false),
            (6, "compatibility_mode", S, false),
            (7, "deprecated_fields_used", RepS, false),
        ],
        "any" => &[(1, "type_url", S, false), (2, "value", B, false)],
        "draft" => &[
            (1, "envelope_version", I32, false),
            (2, "metadata", Msg("d.meta"), true),
            (3, "payload", Msg("any"), true),
            (4, "security", Msg("d.sec"), true),
            (5, "observability", Msg("obs"), true),
            (6, "schema", Msg("schema"), true),
            (99, "extensions", MapSB, false),
        ],
        "d.meta" => &[
            (1, "message_id", S, false),
            (2, "topic", S, false),
            (3, "namespace", S, false),
            (4, "published_at", Msg("ts"), true),
            (5, "content_type", S, false),
            (6, "content_encoding", S, false),
            (7, "priority", I32, false),
            (8, "ttl_seconds", I64, false),
            (9, "correlation_id", S, false),
            (10, "causality_parent", S, false),
            (13, "producer_sdk_version", S, false),
        ],
        "d.sec" => &[
            (1, "publisher_id", S, false),
            (2, "publisher_team", S, false),
            (3, "auth_token", S, false),
            (4, "signature", B, false),
            (5, "signature_algorithm", S, false),
            (6, "encryption", Msg("d.enc"), true),
            (7, "contains_pii", Bool, false),
            (8, "data_classification", S, false),
            (9, "signature_key_id", S, false),
            (10, "signature_scope", Enum, false),
            (11, "sibling_digest", B, false),
            (12, "tree_index", U64, false),
            (13, "tree_size", U64, false),
            (14, "tree_path", B, false),
        ],
        "d.enc" => &[
            (1, "key_id", S, false),
            (2, "algorithm", S, false),
            (3, "iv", B, false),
            (4, "aad", B, false),
        ],
        "ts" => &[(1, "seconds", I64, false), (2, "nanos", I32, false)],
        "entry.sb" => &[(1, "key", S, false), (2, "value", B, false)],
        "entry.ss" => &[(1, "key", S, false), (2, "value", S, false)],
        other => panic!("no table for {other}"),
    }
}

fn varint(b: &[u8], pos: &mut usize) -> u64 {
    let mut v = 0u64;
    let mut shift = 0;
    loop {
        let x = b[*pos];
        *pos += 1;
        v |= u64::from(x & 0x7f).wrapping_shl(shift);
        if x & 0x80 == 0 {
            return v;
        }
        shift += 7;
    }
}

/// (field, wire type, whole record, value) of each record.
fn records(b: &[u8]) -> Vec<(u32, u8, &[u8], &[u8])> {
    let mut out = Vec::new();
    let mut pos = 0;
    while pos < b.len() {
        let start = pos;
        let key = varint(b, &mut pos);
        let (f, wt) = ((key >> 3) as u32, (key & 7) as u8);
        let vstart = pos;
        match wt {
            0 => {
                varint(b, &mut pos);
            }
            1 => pos += 8,
            5 => pos += 4,
            2 => {
                let n = varint(b, &mut pos) as usize;
                let vs = pos;
                pos += n;
                out.push((f, wt, &b[start..pos], &b[vs..pos]));
                continue;
            }
            _ => panic!("wire type {wt}"),
        }
        out.push((f, wt, &b[start..pos], &b[vstart..pos]));
    }
    out
}

fn scalar(t: T, wt: u8, v: &[u8]) -> Value {
    let mut p = 0;
    match t {
        T::S => Value::String(String::from_utf8(v.to_vec()).unwrap()),
        T::B => Value::String(hex::encode(v)),
        T::Bool => Value::Bool(varint(v, &mut p) != 0),
        T::I32 | T::Enum => Value::from(varint(v, &mut p) as i32),
        T::I64 => Value::from(varint(v, &mut p) as i64),
        T::U64 => Value::from(varint(v, &mut p)),
        _ => unreachable!("{wt}"),
    }
}

fn is_zero(v: &Value) -> bool {
    match v {
        Value::String(s) => s.is_empty(),
        Value::Bool(b) => !b,
        Value::Number(n) => n.as_f64() == Some(0.0),
        _ => false,
    }
}

/// The JSON form of `bytes` read as message `msg`.
pub fn json_form(bytes: &[u8], msg: &str) -> Value {
    let table = fields(msg);
    let recs = records(bytes);
    let mut out = Map::new();
    let mut unknown = Vec::new();
    let wt_of = |t: T| {
        if matches!(t, T::Bool | T::I32 | T::I64 | T::U64 | T::Enum) {
            0u8
        } else {
            2u8
        }
    };
    // a known number with another wire type is an unknown field (as protobuf parsers keep it)
    let is_known = |f: u32, wt: u8| table.iter().any(|d| d.0 == f && wt_of(d.2) == wt);
    for &(num, name, t, presence) in table {
        let mine: Vec<_> = recs.iter().filter(|r| r.0 == num && r.1 == wt_of(t)).collect();
        if mine.is_empty() {
            continue;
        }
        let v = match t {
            T::Msg(sub) => {
                let body: Vec<u8> = mine.iter().flat_map(|r| r.3.to_vec()).collect();
                json_form(&body, sub)
            }
            T::MapSB | T::MapSS => {
                let mut m = Map::new();
                for r in &mine {
                    let e = json_form(r.3, if matches!(t, T::MapSB) { "entry.sb" } else { "entry.ss" });
                    if e.get("_unknown").is_some() {
                        continue; // an entry with extra fields is kept as an unknown record, not in the map
                    }
                    let k = e.get("key").and_then(|k| k.as_str()).unwrap_or("").to_owned();
                    let val = e.get("value").cloned().unwrap_or(Value::String(String::new()));
                    m.insert(k, val);
                }
                Value::Object(m)
            }
            T::RepS => Value::Array(mine.iter().map(|r| scalar(T::S, 2, r.3)).collect()),
            _ => {
                let last = mine.last().unwrap();
                scalar(t, last.1, last.3)
            }
        };
        let present = match &v {
            Value::Object(m) if matches!(t, T::MapSB | T::MapSS) => !m.is_empty(),
            _ if presence || matches!(t, T::Msg(_) | T::RepS) => true,
            v => !is_zero(v),
        };
        if present {
            out.insert(name.to_owned(), v);
        }
    }
    for r in &recs {
        if !is_known(r.0, r.1) {
            unknown.extend_from_slice(r.2);
        }
    }
    if !unknown.is_empty() {
        out.insert("_unknown".to_owned(), Value::String(hex::encode(unknown)));
    }
    Value::Object(out)
}

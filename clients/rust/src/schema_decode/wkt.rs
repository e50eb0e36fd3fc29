//! The protobuf JSON forms of the well-known types, as Python's `json_format` writes
//! (`MessageToDict`) and reads (`Parse`) them: `Timestamp` an RFC 3339 string in UTC with 0,
//! 3, 6 or 9 fraction digits, `Duration` `"1.5s"`, the wrappers their bare value (64-bit
//! integers as strings), `Struct`/`Value`/`ListValue` plain JSON, `FieldMask` its paths in
//! camelCase joined by commas, `Any` its message with `"@type"` (the packed type must be a
//! well-known type, as in the Python SDK). Every value without a JSON form (a
//! timestamp out of range, a Value holding NaN, an Any of an unknown type) is a `Payload`
//! error at the field, never a panic.

use base64::Engine;
use serde_json::{Map, Value};

use super::{
    decode_wire, find_message, from_json as message_from_json, json_int, pay_err, well_known_files, Mode, Pool,
    MAX_DEPTH,
};
use crate::error::Result;

/// Seconds of 0001-01-01T00:00:00Z and 9999-12-31T23:59:59Z: the range of a Timestamp.
const TIMESTAMP_MIN: i64 = -62_135_596_800;
const TIMESTAMP_MAX: i64 = 253_402_300_799;
/// 10,000 years: the range of a Duration, either sign.
const DURATION_MAX: i64 = 315_576_000_000;

fn is_wrapper(name: &str) -> bool {
    matches!(
        name,
        "google.protobuf.DoubleValue"
            | "google.protobuf.FloatValue"
            | "google.protobuf.Int64Value"
            | "google.protobuf.UInt64Value"
            | "google.protobuf.Int32Value"
            | "google.protobuf.UInt32Value"
            | "google.protobuf.BoolValue"
            | "google.protobuf.StringValue"
            | "google.protobuf.BytesValue"
    )
}

/// Whether `name` has a JSON form of its own (and `Any` puts it under `"value"`).
fn is_special(name: &str) -> bool {
    is_wrapper(name)
        || matches!(
            name,
            "google.protobuf.Timestamp"
                | "google.protobuf.Duration"
                | "google.protobuf.FieldMask"
                | "google.protobuf.Struct"
                | "google.protobuf.Value"
                | "google.protobuf.ListValue"
                | "google.protobuf.Any"
        )
}

/// An int64 field of a decoded message (written as a string by the decoder), 0 when absent.
fn int_of(m: &Map<String, Value>, k: &str) -> i64 {
    match m.get(k) {
        Some(Value::String(s)) => s.parse().unwrap_or(0),
        Some(v) => v.as_i64().unwrap_or(0),
        None => 0,
    }
}

// ------------------------------------------------------------------ wire -> JSON

/// The JSON form of the well-known message `name`, from its fields as [`decode_wire`] read
/// them (`m`); None for every other message.
pub(super) fn to_json(pool: Pool<'_>, name: &str, m: &Map<String, Value>, depth: usize) -> Result<Option<Value>> {
    let at = name;
    Ok(Some(match name {
        "google.protobuf.Timestamp" => Value::String(timestamp_string(int_of(m, "seconds"), int_of(m, "nanos"), at)?),
        "google.protobuf.Duration" => Value::String(duration_string(int_of(m, "seconds"), int_of(m, "nanos"), at)?),
        "google.protobuf.FieldMask" => {
            let paths = m.get("paths").and_then(Value::as_array).cloned().unwrap_or_default();
            let camel = paths
                .iter()
                .map(|p| snake_to_camel(p.as_str().unwrap_or(""), at))
                .collect::<Result<Vec<_>>>()?;
            Value::String(camel.join(","))
        }
        "google.protobuf.Struct" => m.get("fields").cloned().unwrap_or_else(|| Value::Object(Map::new())),
        "google.protobuf.ListValue" => m.get("values").cloned().unwrap_or_else(|| Value::Array(Vec::new())),
        "google.protobuf.Value" => {
            if let Some(x) = m.get("number_value") {
                if x.is_string() {
                    return Err(pay_err(
                        format!("a google.protobuf.Value holds {x}, which has no JSON number (it would read back as a string)"),
                        at,
                    ));
                }
            }
            [
                "struct_value",
                "list_value",
                "string_value",
                "bool_value",
                "number_value",
            ]
            .iter()
            .find_map(|k| m.get(*k).cloned())
            .unwrap_or(Value::Null)
        }
        "google.protobuf.Any" => return any_to_json(pool, m, depth).map(Some),
        w if is_wrapper(w) => match m.get("value") {
            Some(v) => v.clone(),
            None => match w {
                "google.protobuf.Int64Value" | "google.protobuf.UInt64Value" => Value::String("0".into()),
                "google.protobuf.DoubleValue" | "google.protobuf.FloatValue" => serde_json::json!(0.0),
                "google.protobuf.BoolValue" => Value::Bool(false),
                "google.protobuf.StringValue" | "google.protobuf.BytesValue" => Value::String(String::new()),
                _ => Value::from(0),
            },
        },
        _ => return Ok(None),
    }))
}

fn any_to_json(pool: Pool<'_>, m: &Map<String, Value>, depth: usize) -> Result<Value> {
    let at = "google.protobuf.Any";
    let url = m.get("type_url").and_then(Value::as_str).unwrap_or("");
    let packed = m.get("value").and_then(Value::as_str).unwrap_or("");
    if url.is_empty() && packed.is_empty() {
        return Ok(Value::Object(Map::new()));
    }
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(packed)
        .map_err(|_| pay_err("an Any's value is not bytes".into(), at))?;
    let (name, msg, _) = packed_type(pool, url, at)?;
    let inner = decode_wire(pool, msg, &bytes, depth + 1, &name, Mode::Decode)?;
    let mut out = Map::new();
    out.insert("@type".into(), Value::String(url.to_owned()));
    if is_special(&name) {
        out.insert("value".into(), inner);
    } else if let Value::Object(fields) = inner {
        out.extend(fields);
    }
    Ok(Value::Object(out))
}

/// The message an Any's `type_url` names (`type.googleapis.com/pkg.Msg`): a well-known type;
/// any other is refused (no type is fetched from anywhere). The Python SDK's `json_format`
/// resolves the packed type in protobuf's default pool, which holds the well-known types but
/// not the schema's messages (they live in a pool of their own), so it refuses those too.
fn packed_type<'a>(pool: Pool<'a>, url: &str, at: &str) -> Result<(String, &'a prost_types::DescriptorProto, &'a str)> {
    let name = url.rsplit_once('/').map_or("", |(_, n)| n);
    if name.is_empty() {
        return Err(pay_err(
            format!("an Any's type_url {:?} names no message type", super::clip(url)),
            at,
        ));
    }
    let refused = || {
        pay_err(
            format!(
                "an Any packs {:?}, which is not a well-known type (google.protobuf.*): its descriptor is unknown here",
                super::clip(name)
            ),
            at,
        )
    };
    if !name.starts_with("google.protobuf.") {
        return Err(refused());
    }
    let wkt = Pool {
        main: well_known_files().first().unwrap_or(pool.main),
        imports: well_known_files(),
    };
    find_message(wkt, name).map_err(|_| refused())
}

/// Days since 1970-01-01 of a civil date (proleptic Gregorian; Howard Hinnant's algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (if m <= 2 { yoe + era * 400 + 1 } else { yoe + era * 400 }, m, d)
}

/// `.000`, `.000000`, `.000000000` or nothing: the fewest of 0, 3, 6, 9 digits that hold `nanos`.
fn fraction(nanos: i64) -> String {
    if nanos == 0 {
        String::new()
    } else if nanos % 1_000_000 == 0 {
        format!(".{:03}", nanos / 1_000_000)
    } else if nanos % 1_000 == 0 {
        format!(".{:06}", nanos / 1_000)
    } else {
        format!(".{nanos:09}")
    }
}

/// A Timestamp as RFC 3339 in UTC (`Timestamp.ToJsonString`).
pub fn timestamp_string(seconds: i64, nanos: i64, at: &str) -> Result<String> {
    if !(TIMESTAMP_MIN..=TIMESTAMP_MAX).contains(&seconds) {
        return Err(pay_err(
            format!("a Timestamp of {seconds} seconds is outside 0001-01-01T00:00:00Z..9999-12-31T23:59:59Z"),
            at,
        ));
    }
    if !(0..1_000_000_000).contains(&nanos) {
        return Err(pay_err(
            format!("a Timestamp's nanos {nanos} are outside 0..999999999"),
            at,
        ));
    }
    let (days, secs) = (seconds.div_euclid(86_400), seconds.rem_euclid(86_400));
    let (y, m, d) = civil_from_days(days);
    Ok(format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}{}Z",
        secs / 3600,
        secs / 60 % 60,
        secs % 60,
        fraction(nanos)
    ))
}

/// A Duration as `"<seconds>[.fraction]s"` (`Duration.ToJsonString`).
pub fn duration_string(seconds: i64, nanos: i64, at: &str) -> Result<String> {
    if !(-DURATION_MAX..=DURATION_MAX).contains(&seconds) {
        return Err(pay_err(
            format!("a Duration of {seconds} seconds is outside ±{DURATION_MAX} seconds"),
            at,
        ));
    }
    if nanos <= -1_000_000_000 || nanos >= 1_000_000_000 {
        return Err(pay_err(
            format!("a Duration's nanos {nanos} are outside ±999999999"),
            at,
        ));
    }
    if (nanos < 0 && seconds > 0) || (nanos > 0 && seconds < 0) {
        return Err(pay_err(
            "a Duration's seconds and nanos have different signs".into(),
            at,
        ));
    }
    let sign = if seconds < 0 || nanos < 0 { "-" } else { "" };
    Ok(format!("{sign}{}{}s", seconds.unsigned_abs(), fraction(nanos.abs())))
}

/// A FieldMask path to its JSON name (`_SnakeCaseToCamelCase`): no capitals, every `_` before a
/// lower-case letter.
fn snake_to_camel(path: &str, at: &str) -> Result<String> {
    let mut out = String::new();
    let mut after = false;
    for c in path.chars() {
        if c.is_uppercase() {
            return Err(pay_err(
                format!(
                    "a FieldMask path {:?} has capitals, which have no JSON form",
                    super::clip(path)
                ),
                at,
            ));
        }
        if after {
            if !c.is_lowercase() {
                return Err(pay_err(
                    format!(
                        "a FieldMask path {:?} has a \"_\" before a non-letter",
                        super::clip(path)
                    ),
                    at,
                ));
            }
            out.extend(c.to_uppercase());
            after = false;
        } else if c == '_' {
            after = true;
        } else {
            out.push(c);
        }
    }
    if after {
        return Err(pay_err(
            format!("a FieldMask path {:?} ends with \"_\"", super::clip(path)),
            at,
        ));
    }
    Ok(out)
}

// ------------------------------------------------------------------ JSON -> canonical JSON

/// `v` read as the well-known message `name` by its JSON form, out in the canonical form
/// (`MessageToDict(Parse(v))`); None for every other message.
pub(super) fn from_json(pool: Pool<'_>, name: &str, v: &Value, depth: usize, at: &str) -> Result<Option<Value>> {
    if depth > MAX_DEPTH {
        return Err(pay_err("the payload nests messages too deep".into(), at));
    }
    let text = |what: &str| -> Result<&str> {
        v.as_str()
            .ok_or_else(|| pay_err(format!("{at}: a {what} is a JSON string, not {}", kind(v)), at))
    };
    Ok(Some(match name {
        "google.protobuf.Timestamp" => {
            let (s, n) = parse_timestamp(text("Timestamp")?, at)?;
            Value::String(timestamp_string(s, n, at)?)
        }
        "google.protobuf.Duration" => {
            let (s, n) = parse_duration(text("Duration")?, at)?;
            Value::String(duration_string(s, n, at)?)
        }
        "google.protobuf.FieldMask" => {
            let s = text("FieldMask")?;
            let mut out = Vec::new();
            if !s.is_empty() {
                for p in s.split(',') {
                    out.push(snake_to_camel(&camel_to_snake(p, at)?, at)?);
                }
            }
            Value::String(out.join(","))
        }
        "google.protobuf.Struct" => {
            let obj = v
                .as_object()
                .ok_or_else(|| pay_err(format!("{at}: a Struct is a JSON object, not {}", kind(v)), at))?;
            let mut out = Map::new();
            for (k, x) in obj {
                out.insert(k.clone(), value_json(x, depth + 1, at)?);
            }
            Value::Object(out)
        }
        "google.protobuf.ListValue" => {
            let items = v
                .as_array()
                .ok_or_else(|| pay_err(format!("{at}: a ListValue is a JSON array, not {}", kind(v)), at))?;
            Value::Array(
                items
                    .iter()
                    .map(|x| value_json(x, depth + 1, at))
                    .collect::<Result<_>>()?,
            )
        }
        "google.protobuf.Value" => value_json(v, depth, at)?,
        "google.protobuf.Any" => any_from_json(pool, v, depth, at)?,
        w if is_wrapper(w) => wrapper_json(w, v, at)?,
        _ => return Ok(None),
    }))
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Any JSON as a google.protobuf.Value (numbers become doubles), nesting bounded.
fn value_json(v: &Value, depth: usize, at: &str) -> Result<Value> {
    if depth > MAX_DEPTH {
        return Err(pay_err(
            format!("{at}: a Struct/Value nests deeper than {MAX_DEPTH} messages"),
            at,
        ));
    }
    Ok(match v {
        Value::Object(o) => {
            let mut out = Map::new();
            for (k, x) in o {
                out.insert(k.clone(), value_json(x, depth + 2, at)?);
            }
            Value::Object(out)
        }
        // a Struct (or ListValue) and the Value in it: two messages a level, as json_format counts
        Value::Array(a) => Value::Array(a.iter().map(|x| value_json(x, depth + 2, at)).collect::<Result<_>>()?),
        Value::Number(n) => match n.as_f64() {
            Some(x) if x.is_finite() => Value::from(x),
            _ => return Err(pay_err(format!("{at}: the number {n} is not a finite double"), at)),
        },
        other => other.clone(),
    })
}

fn any_from_json(pool: Pool<'_>, v: &Value, depth: usize, at: &str) -> Result<Value> {
    let obj = v
        .as_object()
        .ok_or_else(|| pay_err(format!("{at}: an Any is a JSON object, not {}", kind(v)), at))?;
    if obj.is_empty() {
        return Ok(Value::Object(Map::new()));
    }
    let url = obj
        .get("@type")
        .ok_or_else(|| pay_err(format!("{at}: an Any without \"@type\""), at))?
        .as_str()
        .ok_or_else(|| pay_err(format!("{at}: an Any's \"@type\" is not a string"), at))?;
    let (name, msg, _) = packed_type(pool, url, at)?;
    let mut out = Map::new();
    out.insert("@type".into(), Value::String(url.to_owned()));
    if is_special(&name) {
        let inner = obj
            .get("value")
            .ok_or_else(|| pay_err(format!("{at}: an Any of {name} without \"value\""), at))?;
        let conv = from_json(pool, &name, inner, depth + 1, &format!("{at}.value"))?.unwrap_or(Value::Null);
        out.insert("value".into(), conv);
    } else {
        let rest: Map<String, Value> = obj
            .iter()
            .filter(|(k, _)| *k != "@type")
            .map(|(k, x)| (k.clone(), x.clone()))
            .collect();
        if let Value::Object(fields) = message_from_json(pool, (&name, msg), &Value::Object(rest), depth + 1, at)? {
            out.extend(fields);
        }
    }
    Ok(Value::Object(out))
}

/// A wrapper's bare value, checked as `json_format` checks the wrapped scalar, in its canonical
/// form (64-bit integers as strings, bytes in standard base64).
fn wrapper_json(name: &str, v: &Value, at: &str) -> Result<Value> {
    let bad = |what: &str| pay_err(format!("{at}: {} is not {what}", super::clip(&v.to_string())), at);
    let int = |lo: i128, hi: i128| -> Result<i128> {
        json_int(v)
            .filter(|n| (lo..=hi).contains(n))
            .ok_or_else(|| bad("an integer in range"))
    };
    Ok(match name {
        "google.protobuf.Int32Value" => Value::from(int(i32::MIN.into(), i32::MAX.into())? as i64),
        "google.protobuf.UInt32Value" => Value::from(int(0, u32::MAX.into())? as i64),
        "google.protobuf.Int64Value" => Value::String(int(i64::MIN.into(), i64::MAX.into())?.to_string()),
        "google.protobuf.UInt64Value" => Value::String(int(0, u64::MAX.into())?.to_string()),
        "google.protobuf.BoolValue" => Value::Bool(v.as_bool().ok_or_else(|| bad("a boolean"))?),
        "google.protobuf.StringValue" => Value::String(v.as_str().ok_or_else(|| bad("a string"))?.to_owned()),
        "google.protobuf.BytesValue" => {
            let s = v.as_str().ok_or_else(|| bad("base64 text"))?;
            let t = s.trim_end_matches('=');
            let e = base64::engine::GeneralPurpose::new(
                &base64::alphabet::STANDARD,
                base64::engine::GeneralPurposeConfig::new()
                    .with_decode_padding_mode(base64::engine::DecodePaddingMode::RequireNone)
                    .with_decode_allow_trailing_bits(true),
            );
            let bytes = e
                .decode(t.replace('-', "+").replace('_', "/"))
                .map_err(|_| bad("base64 text"))?;
            Value::String(base64::engine::general_purpose::STANDARD.encode(bytes))
        }
        _ => {
            // DoubleValue, FloatValue: a number, or a string a float reads ("NaN", "Infinity", "1.5")
            let float32 = name == "google.protobuf.FloatValue";
            let x = match v {
                Value::Number(n) => n.as_f64().ok_or_else(|| bad("a number"))?,
                Value::String(s) => match s.as_str() {
                    "NaN" => f64::NAN,
                    "Infinity" => f64::INFINITY,
                    "-Infinity" => f64::NEG_INFINITY,
                    t => t
                        .trim()
                        .parse::<f64>()
                        .ok()
                        .filter(|x| x.is_finite())
                        .ok_or_else(|| bad("a number"))?,
                },
                _ => return Err(bad("a number")),
            };
            if float32 && x.is_finite() && x.abs() > f64::from(f32::MAX) {
                return Err(bad("a float32 in range"));
            }
            if float32 && x.is_finite() {
                format!("{}", x as f32)
                    .parse::<f64>()
                    .map_or_else(|_| Value::from(x), Value::from)
            } else {
                super::float_json(x)
            }
        }
    })
}

/// A FieldMask path from its JSON name (`_CamelCaseToSnakeCase`): no `_` allowed.
fn camel_to_snake(path: &str, at: &str) -> Result<String> {
    let mut out = String::new();
    for c in path.chars() {
        if c == '_' {
            return Err(pay_err(
                format!("{at}: a FieldMask's JSON path {:?} has a \"_\"", super::clip(path)),
                at,
            ));
        }
        if c.is_uppercase() {
            out.push('_');
            out.extend(c.to_lowercase());
        } else {
            out.push(c);
        }
    }
    Ok(out)
}

fn digits(s: &str) -> Option<i64> {
    (!s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
        .then(|| s.parse().ok())
        .flatten()
}

/// `YYYY-MM-DDTHH:MM:SS[.f{1,9}](Z|±HH:MM)` to (seconds, nanos), as `Timestamp.FromJsonString`
/// reads it (upper-case `T` and `Z` only; the offset applied).
fn parse_timestamp(s: &str, at: &str) -> Result<(i64, i64)> {
    let bad = |why: &str| {
        pay_err(
            format!("{at}: {:?} is not an RFC 3339 timestamp ({why})", super::clip(s)),
            at,
        )
    };
    let b = s.as_bytes();
    if b.len() < 20 || !s.is_ascii() {
        return Err(bad("too short, or not ASCII"));
    }
    let (date, rest) = s.split_at(10);
    let dp: Vec<&str> = date.split('-').collect();
    if dp.len() != 3 || dp[0].len() != 4 || dp[1].len() != 2 || dp[2].len() != 2 {
        return Err(bad("the date is not YYYY-MM-DD"));
    }
    let (y, mo, d) = match (digits(dp[0]), digits(dp[1]), digits(dp[2])) {
        (Some(y), Some(m), Some(d)) => (y, m, d),
        _ => return Err(bad("the date is not YYYY-MM-DD")),
    };
    let leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    let month_days = [31, if leap { 29 } else { 28 }, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31];
    if y < 1 || !(1..=12).contains(&mo) || d < 1 || d > month_days[(mo - 1) as usize] {
        return Err(bad("no such date"));
    }
    let Some(rest) = rest.strip_prefix('T') else {
        return Err(bad("no upper-case T between date and time"));
    };
    let (time, rest) = rest.split_at(8.min(rest.len()));
    let tp: Vec<&str> = time.split(':').collect();
    if tp.len() != 3 || tp.iter().any(|p| p.len() != 2) {
        return Err(bad("the time is not HH:MM:SS"));
    }
    let (h, mi, se) = match (digits(tp[0]), digits(tp[1]), digits(tp[2])) {
        (Some(h), Some(m), Some(s)) if h < 24 && m < 60 && s < 60 => (h, m, s),
        _ => return Err(bad("no such time")),
    };
    let (nanos, rest) = match rest.strip_prefix('.') {
        Some(r) => {
            let n = r.bytes().take_while(u8::is_ascii_digit).count();
            if n == 0 || n > 9 {
                return Err(bad("1 to 9 fraction digits"));
            }
            let f: i64 = r[..n].parse().map_err(|_| bad("fraction"))?;
            (f * 10_i64.pow(9 - n as u32), &r[n..])
        }
        None => (0, rest),
    };
    let offset = if rest == "Z" {
        0
    } else {
        let (sign, hm) = match rest.split_at(1.min(rest.len())) {
            ("+", hm) => (-1, hm),
            ("-", hm) => (1, hm),
            _ => return Err(bad("the offset is not Z or ±HH:MM")),
        };
        let hp: Vec<&str> = hm.split(':').collect();
        match (
            hp.len(),
            hp.first().and_then(|x| digits(x)),
            hp.get(1).and_then(|x| digits(x)),
        ) {
            (2, Some(oh), Some(om)) if hp[0].len() == 2 && hp[1].len() == 2 && oh < 24 && om < 60 => {
                sign * (oh * 3600 + om * 60)
            }
            _ => return Err(bad("the offset is not Z or ±HH:MM")),
        }
    };
    let seconds = days_from_civil(y, mo, d) * 86_400 + h * 3600 + mi * 60 + se + offset;
    Ok((seconds, nanos))
}

/// `[-]seconds[.f{1,9}]s` to (seconds, nanos), as `Duration.FromJsonString` reads it.
fn parse_duration(s: &str, at: &str) -> Result<(i64, i64)> {
    let bad = |why: &str| pay_err(format!("{at}: {:?} is not a Duration ({why})", super::clip(s)), at);
    let body = s.strip_suffix('s').ok_or_else(|| bad("it must end with \"s\""))?;
    let (neg, body) = match body.strip_prefix('-') {
        Some(b) => (true, b),
        None => (false, body),
    };
    let (int, frac) = body.split_once('.').unwrap_or((body, ""));
    if int.len() > 12 {
        return Err(bad("seconds out of range"));
    }
    let secs = digits(int).ok_or_else(|| bad("seconds are not digits"))?;
    let nanos = if frac.is_empty() {
        0
    } else if frac.len() <= 9 && frac.bytes().all(|b| b.is_ascii_digit()) {
        frac.parse::<i64>().map_err(|_| bad("fraction"))? * 10_i64.pow(9 - frac.len() as u32)
    } else {
        // more digits than nanoseconds: rounded to them, as Python's float() and round() do
        if frac.len() > 64 || !frac.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad("the fraction is not digits"));
        }
        let x: f64 = format!("0.{frac}").parse().map_err(|_| bad("fraction"))?;
        (x * 1e9).round_ties_even() as i64
    };
    Ok(if neg { (-secs, -nanos) } else { (secs, nanos) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_format_and_parse_as_protobuf_does() {
        assert_eq!(timestamp_string(0, 0, "t").unwrap(), "1970-01-01T00:00:00Z");
        assert_eq!(
            timestamp_string(-1, 500_000_000, "t").unwrap(),
            "1969-12-31T23:59:59.500Z"
        );
        assert_eq!(timestamp_string(TIMESTAMP_MIN, 0, "t").unwrap(), "0001-01-01T00:00:00Z");
        assert_eq!(
            timestamp_string(TIMESTAMP_MAX, 999_999_999, "t").unwrap(),
            "9999-12-31T23:59:59.999999999Z"
        );
        assert_eq!(timestamp_string(1, 1_000, "t").unwrap(), "1970-01-01T00:00:01.000001Z");
        assert!(timestamp_string(TIMESTAMP_MAX + 1, 0, "t").is_err());
        assert!(timestamp_string(0, -1, "t").is_err());
        assert_eq!(
            parse_timestamp("2020-02-29T12:00:00.5+01:30", "t").unwrap(),
            (1_582_972_200, 500_000_000)
        );
        for bad in [
            "2021-02-29T00:00:00Z",
            "2020-01-01t00:00:00Z",
            "2020-01-01T00:00:00z",
            "2020-01-01T24:00:00Z",
            "2020-01-01T00:00:00.1234567890Z",
            "2020-01-01T00:00:00",
            "0000-01-01T00:00:00Z",
            "",
            "é",
        ] {
            assert!(parse_timestamp(bad, "t").is_err(), "{bad}");
        }
    }

    #[test]
    fn durations_format_and_parse_as_protobuf_does() {
        assert_eq!(duration_string(1, 500_000_000, "d").unwrap(), "1.500s");
        assert_eq!(duration_string(0, -500_000_000, "d").unwrap(), "-0.500s");
        assert_eq!(duration_string(-3, 0, "d").unwrap(), "-3s");
        assert!(duration_string(1, -1, "d").is_err());
        assert!(duration_string(DURATION_MAX + 1, 0, "d").is_err());
        assert_eq!(parse_duration("-0.5s", "d").unwrap(), (0, -500_000_000));
        assert_eq!(parse_duration("1.000000001s", "d").unwrap(), (1, 1));
        assert_eq!(parse_duration("1.0000000006s", "d").unwrap(), (1, 1));
        for bad in ["1", "s", "-s", "1.2.3s", "99999999999999s", "1 s", "1.5e3s"] {
            assert!(parse_duration(bad, "d").is_err(), "{bad}");
        }
    }

    #[test]
    fn field_masks_convert_as_protobuf_does() {
        assert_eq!(snake_to_camel("foo_bar.baz", "f").unwrap(), "fooBar.baz");
        assert!(snake_to_camel("fooBar", "f").is_err());
        assert!(snake_to_camel("foo_", "f").is_err());
        assert!(snake_to_camel("foo_1", "f").is_err());
        assert_eq!(camel_to_snake("fooBar", "f").unwrap(), "foo_bar");
        assert!(camel_to_snake("foo_bar", "f").is_err());
    }
}

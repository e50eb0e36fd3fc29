//! JSON that this crate did not write, read within the limits the Python SDK applies
//! (`app/untrusted_json.py`): a size limit checked first, then a nesting-depth limit measured
//! by a linear scan that recurses nowhere, then a strict parse.
//!
//! Why: serde_json alone stops at 128 levels, but a value nested that deep still breaks what
//! walks it afterwards (a schema validator, a masker), and Python refuses anything over 64
//! levels - a Rust consumer must not accept what a Python one refuses.

use serde::de::DeserializeOwned;

use crate::error::{Detail, PrismError, Result};

/// Python's `DEFAULT_MAX_BYTES`: 16 MiB.
pub const DEFAULT_MAX_BYTES: usize = 16 * 1024 * 1024;
/// Python's `DEFAULT_MAX_DEPTH`: 64 levels of arrays and objects.
pub const DEFAULT_MAX_DEPTH: usize = 64;

/// The deepest nesting of arrays and objects in `text` (0 for a scalar): brackets inside
/// strings do not count. Exact for valid JSON; for invalid text the parser refuses it anyway.
pub fn json_depth(text: &[u8]) -> usize {
    let (mut depth, mut max, mut in_string, mut escaped) = (0usize, 0usize, false, false);
    for &b in text {
        if in_string {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                max = max.max(depth);
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    max
}

/// Parse `data` as JSON into `T` within `max_bytes` and `max_depth`; `what` names the input in
/// the error. Every refusal is `make_error(detail)`, so each caller keeps its own error kind
/// (a payload's is `Payload`, a schema's `Config`).
pub fn parse<T: DeserializeOwned>(
    data: &[u8],
    what: &str,
    max_bytes: usize,
    max_depth: usize,
    make_error: fn(Detail) -> PrismError,
) -> Result<T> {
    if data.len() > max_bytes {
        return Err(make_error(Detail::new(
            format!("JSON of {} bytes is over the {max_bytes}-byte limit", data.len()),
            what,
            "send a smaller document",
        )));
    }
    let depth = json_depth(data);
    if depth > max_depth {
        return Err(make_error(Detail::new(
            format!("JSON is nested too deeply: {depth} levels, over the limit of {max_depth}"),
            what,
            format!("flatten the document to at most {max_depth} levels of arrays and objects"),
        )));
    }
    serde_json::from_slice(data).map_err(|e| {
        make_error(Detail::new(
            format!("not valid JSON: {e}"),
            what,
            "send strict JSON (RFC 8259)",
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn depth_ignores_brackets_in_strings_and_never_recurses() {
        assert_eq!(json_depth(br#"{"a": "[[[{{", "b": [1, [2]]}"#), 3);
        assert_eq!(json_depth(br#""\"[""#), 0);
        assert_eq!(json_depth(&vec![b'['; 1_000_000]), 1_000_000);
        let deep = format!("{}{}", "[".repeat(65), "]".repeat(65));
        let got: Result<serde_json::Value> = parse(deep.as_bytes(), "payload", 1 << 20, 64, PrismError::Payload);
        assert!(matches!(got, Err(PrismError::Payload(d)) if d.what.contains("65 levels")));
        let ok = format!("{}{}", "[".repeat(64), "]".repeat(64));
        assert!(parse::<serde_json::Value>(ok.as_bytes(), "payload", 1 << 20, 64, PrismError::Payload).is_ok());
        assert!(parse::<serde_json::Value>(b"[1]", "payload", 2, 64, PrismError::Payload).is_err());
        assert!(parse::<serde_json::Value>(b"NaN", "payload", 10, 64, PrismError::Payload).is_err());
    }
}

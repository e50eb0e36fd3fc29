//! A one-sided check that a JSON document is certainly what protobuf's JSON parser
//! (`json_format.Parse`) accepts for a message - the Python worker's payload check
//! (`app/schema/payload_check.py`, issue 29), compiled.
//!
//! Why one-sided: the Python validator must report every violation in `json_format`'s own
//! words, and copying those rules and texts here would be a second implementation to keep in
//! step. So [`Plan::fits`] says `true` only when the document certainly parses (the Python
//! validator then returns no violation without decoding it), and `false` for anything it does
//! not certainly accept - the Python path then runs unchanged and words whatever is wrong.
//!
//! The plan is not built here from descriptors: the Python side flattens the plan its own fast
//! path walks (`_json_plan`), so both follow one reading of the schema. What the plan covers:
//! strings, bools, integers in the field's range, finite numbers, nested messages and repeated
//! fields of those, each field named once (under its JSON name or its proto name, not both).
//!
//! The document is read by `serde_json` driven by seeds that follow the plan, so no value is
//! built: a key is looked up as it is read, a value checked as it is read, and the first thing
//! that does not fit stops the read. What serde_json itself refuses - invalid UTF-8, a BOM,
//! control characters in strings, lone surrogate escapes, trailing commas or garbage, NaN and
//! Infinity, numbers that overflow a double - is `false` too, all of it either refused by
//! Parse or left to the Python path, which decides it exactly.

use std::fmt;

use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};

/// A float field's bounds are narrowed by this fraction. serde_json's default float parsing is
/// not correctly rounded (within a few units in the last place), so a literal within a hair of
/// the bound (`1.7976931348623157e308`, a float32's `3.4028234663852886e38`) might read on the
/// wrong side of it; those few are left to the Python path, which reads them exactly.
const FLOAT_MARGIN: f64 = 1e-9;

/// What a field's value must be.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Kind {
    /// A JSON string (any: serde_json has already refused invalid UTF-8 and lone surrogates).
    Str,
    /// `true` or `false`.
    Bool,
    /// An integer literal (no fraction, no exponent) within `lo..=hi`.
    Int { lo: i64, hi: u64 },
    /// Any integer literal of 64 bits (`-2**63 ..< 2**64`), or a finite number within `lo..=hi`
    /// (narrowed by [`FLOAT_MARGIN`]).
    Num { lo: f64, hi: f64 },
    /// An object that fits the plan's message of this index.
    Msg(usize),
}

/// A field of a message: its kind, and whether it is repeated (a JSON array of such values).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Field {
    pub kind: Kind,
    pub repeated: bool,
}

/// A message: its JSON keys (each naming one of its fields) and its fields.
#[derive(Debug, Clone, Default)]
pub struct Message {
    keys: Vec<(Box<str>, usize)>,
    fields: Vec<Field>,
}

impl Message {
    /// A message from its fields, each with every JSON key that names it (its json_name and
    /// its proto name, or the one name when they are the same).
    pub fn new<S: Into<Box<str>>>(fields: Vec<(Vec<S>, Field)>) -> Self {
        let mut m = Message::default();
        for (names, field) in fields {
            let at = m.fields.len();
            m.fields.push(field);
            for name in names {
                m.keys.push((name.into(), at));
            }
        }
        m
    }

    /// The field a key names. A linear search: messages have a few fields, and comparing a
    /// handful of short keys beats hashing the key.
    fn field(&self, key: &str) -> Option<usize> {
        self.keys.iter().find(|(k, _)| **k == *key).map(|&(_, at)| at)
    }
}

/// Why a plan was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PlanError {
    /// No messages (the first is the document's).
    Empty,
    /// A message field points past the plan's messages.
    NoSuchMessage { message: usize, target: usize },
    /// One key names two fields of a message.
    RepeatedKey { message: usize, key: String },
    /// An integer field whose range is empty or a number field whose bounds are not finite.
    BadBounds { message: usize },
}

impl fmt::Display for PlanError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PlanError::Empty => write!(f, "a plan needs at least one message"),
            PlanError::NoSuchMessage { message, target } => {
                write!(
                    f,
                    "message {message} has a field of message {target}, which the plan lacks"
                )
            }
            PlanError::RepeatedKey { message, key } => write!(f, "message {message} names two fields {key:?}"),
            PlanError::BadBounds { message } => write!(f, "message {message} has a field with bad bounds"),
        }
    }
}

impl std::error::Error for PlanError {}

/// The compiled plan of a schema: messages (the first is the document's) and the depth of
/// nested messages followed at most (the document is depth 1; deeper objects are `false`).
#[derive(Debug, Clone)]
pub struct Plan {
    messages: Vec<Message>,
    max_depth: usize,
}

impl Plan {
    /// A plan, checked: every message a field names exists, no key names two fields of one
    /// message, bounds are sane. `max_depth` at most 48 (serde_json's own limit is 128 nested
    /// arrays and objects; a message level takes at most two).
    pub fn new(messages: Vec<Message>, max_depth: usize) -> Result<Self, PlanError> {
        if messages.is_empty() {
            return Err(PlanError::Empty);
        }
        for (i, m) in messages.iter().enumerate() {
            for (j, (key, _)) in m.keys.iter().enumerate() {
                if m.keys[..j].iter().any(|(k, _)| k == key) {
                    return Err(PlanError::RepeatedKey {
                        message: i,
                        key: key.to_string(),
                    });
                }
            }
            for f in &m.fields {
                match f.kind {
                    Kind::Msg(target) if target >= messages.len() => {
                        return Err(PlanError::NoSuchMessage { message: i, target })
                    }
                    Kind::Int { lo, hi } if lo > 0 && lo as u64 > hi => {
                        return Err(PlanError::BadBounds { message: i })
                    }
                    Kind::Num { lo, hi } if !(lo.is_finite() && hi.is_finite() && lo <= hi) => {
                        return Err(PlanError::BadBounds { message: i })
                    }
                    _ => {}
                }
            }
        }
        Ok(Plan {
            messages,
            max_depth: max_depth.min(48),
        })
    }

    /// True only when `doc` is certainly a JSON object that protobuf's JSON parser accepts
    /// for the plan's first message; false for anything else, and for anything not certain.
    pub fn fits(&self, doc: &[u8]) -> bool {
        let Ok(text) = std::str::from_utf8(doc) else {
            return false;
        };
        let mut de = serde_json::Deserializer::from_str(text);
        let seed = MsgSeed {
            plan: self,
            msg: 0,
            depth: 1,
        };
        seed.deserialize(&mut de).is_ok() && de.end().is_ok()
    }
}

/// Every refusal is this error: its text is never shown (`fits` is a yes or a no).
fn no<E: de::Error>() -> E {
    E::custom("does not certainly fit")
}

/// An object of message `msg`, at `depth`.
struct MsgSeed<'p> {
    plan: &'p Plan,
    msg: usize,
    depth: usize,
}

impl<'de> DeserializeSeed<'de> for MsgSeed<'_> {
    type Value = ();

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for MsgSeed<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object of the message")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        if self.depth > self.plan.max_depth {
            return Err(no());
        }
        let message = &self.plan.messages[self.msg];
        // Fields named so far: a key repeated, or a field under both its names, is not certain.
        let mut seen = Seen::new(message.fields.len());
        while let Some(at) = map.next_key_seed(KeySeed(message))? {
            if !seen.insert(at) {
                return Err(no());
            }
            let field = message.fields[at];
            let value = ValueSeed {
                plan: self.plan,
                kind: field.kind,
                depth: self.depth,
            };
            if field.repeated {
                map.next_value_seed(RepeatedSeed(value))?;
            } else {
                map.next_value_seed(value)?;
            }
        }
        Ok(())
    }
}

/// The fields of one object already named: a bit per field.
enum Seen {
    Small(u64),
    Large(Vec<bool>),
}

impl Seen {
    fn new(fields: usize) -> Self {
        if fields <= 64 {
            Seen::Small(0)
        } else {
            Seen::Large(vec![false; fields])
        }
    }

    /// False when `at` was already named.
    fn insert(&mut self, at: usize) -> bool {
        match self {
            Seen::Small(bits) => {
                let bit = 1u64 << at;
                let fresh = *bits & bit == 0;
                *bits |= bit;
                fresh
            }
            Seen::Large(named) => !std::mem::replace(&mut named[at], true),
        }
    }
}

/// A key of an object of a message: the index of the field it names (decoded: an escaped key
/// names the field its text spells).
struct KeySeed<'p>(&'p Message);

impl<'de> DeserializeSeed<'de> for KeySeed<'_> {
    type Value = usize;

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<usize, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for KeySeed<'_> {
    type Value = usize;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a field's JSON name")
    }

    fn visit_str<E: de::Error>(self, key: &str) -> Result<usize, E> {
        self.0.field(key).ok_or_else(no)
    }
}

/// A repeated field's value: an array of the field's values.
struct RepeatedSeed<'p>(ValueSeed<'p>);

impl<'de> DeserializeSeed<'de> for RepeatedSeed<'_> {
    type Value = ();

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for RepeatedSeed<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an array")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while seq.next_element_seed(self.0)?.is_some() {}
        Ok(())
    }
}

/// One value of a field of `kind`, in an object at `depth`.
#[derive(Clone, Copy)]
struct ValueSeed<'p> {
    plan: &'p Plan,
    kind: Kind,
    depth: usize,
}

impl<'de> DeserializeSeed<'de> for ValueSeed<'_> {
    type Value = ();

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        match self.kind {
            Kind::Str => d.deserialize_str(self),
            Kind::Bool => d.deserialize_bool(self),
            Kind::Int { .. } | Kind::Num { .. } => d.deserialize_any(self),
            Kind::Msg(msg) => MsgSeed {
                plan: self.plan,
                msg,
                depth: self.depth + 1,
            }
            .deserialize(d),
        }
    }
}

impl<'de> Visitor<'de> for ValueSeed<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a value of the field's type")
    }

    fn visit_str<E: de::Error>(self, _: &str) -> Result<(), E> {
        match self.kind {
            Kind::Str => Ok(()),
            _ => Err(no()),
        }
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<(), E> {
        match self.kind {
            Kind::Bool => Ok(()),
            _ => Err(no()),
        }
    }

    /// A non-negative integer literal of 64 bits.
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<(), E> {
        match self.kind {
            Kind::Int { lo, hi } if v <= hi && (lo <= 0 || v >= lo as u64) => Ok(()),
            Kind::Num { .. } => Ok(()),
            _ => Err(no()),
        }
    }

    /// A negative integer literal of 64 bits (`-0` arrives as a float).
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<(), E> {
        match self.kind {
            Kind::Int { lo, hi } if v >= lo && (v < 0 || v as u64 <= hi) => Ok(()),
            Kind::Num { .. } => Ok(()),
            _ => Err(no()),
        }
    }

    /// A literal with a fraction or an exponent, `-0`, or an integer beyond 64 bits: never an
    /// integer field's value here (Parse takes some, but not certainly all); a number field's
    /// when finite and within its (narrowed) bounds.
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<(), E> {
        match self.kind {
            Kind::Num { lo, hi } if v >= lo - lo * FLOAT_MARGIN && v <= hi - hi * FLOAT_MARGIN => Ok(()),
            _ => Err(no()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const INT32: Kind = Kind::Int {
        lo: -(1 << 31),
        hi: (1 << 31) - 1,
    };
    const DOUBLE: Kind = Kind::Num {
        lo: -f64::MAX,
        hi: f64::MAX,
    };
    const FLOAT: Kind = Kind::Num {
        lo: -3.4028234663852886e38,
        hi: 3.4028234663852886e38,
    };

    fn one(kind: Kind) -> Field {
        Field { kind, repeated: false }
    }

    fn many(kind: Kind) -> Field {
        Field { kind, repeated: true }
    }

    /// `fast.Order` of tests/schema/test_payload_check_fast.py.
    fn order() -> Plan {
        let item = Message::new(vec![
            (vec!["sku"], one(Kind::Str)),
            (vec!["qty"], one(INT32)),
            (vec!["parts"], many(Kind::Msg(1))),
        ]);
        let order = Message::new(vec![
            (vec!["orderId", "order_id"], one(Kind::Str)),
            (vec!["customerId", "customer_id"], one(Kind::Str)),
            (vec!["items"], many(Kind::Msg(1))),
            (vec!["total"], one(DOUBLE)),
            (vec!["weight"], one(FLOAT)),
            (
                vec!["big"],
                one(Kind::Int {
                    lo: i64::MIN,
                    hi: i64::MAX as u64,
                }),
            ),
            (
                vec!["small"],
                one(Kind::Int {
                    lo: 0,
                    hi: u32::MAX.into(),
                }),
            ),
            (vec!["gift"], one(Kind::Bool)),
            (vec!["taxAmount", "tax_amount"], one(DOUBLE)),
            (vec!["tags"], many(Kind::Str)),
            (vec!["huge"], one(Kind::Int { lo: 0, hi: u64::MAX })),
        ]);
        Plan::new(vec![order, item], 32).unwrap()
    }

    fn fits(doc: &str) -> bool {
        order().fits(doc.as_bytes())
    }

    #[test]
    fn well_typed_documents_fit() {
        assert!(fits("{}"));
        assert!(fits(" \t\r\n{ } \n"));
        assert!(fits(
            r#"{"orderId":"o-1","customer_id":"c:1","items":[{"sku":"s","qty":-2147483648,"parts":[{"sku":"p"}]}],
               "total":12.5,"weight":1,"big":-9223372036854775808,"small":4294967295,"gift":true,
               "taxAmount":0.5,"tags":["a","b"],"huge":18446744073709551615}"#
        ));
        assert!(fits(r#"{"total": -0.0, "weight": 3.4e38, "tags": [], "items": []}"#));
        assert!(fits(r#"{"order\u005fid": "\u0000\ud83d\ude00"}"#)); // an escaped key, a surrogate pair
        assert!(fits(
            r#"{"total": 18446744073709551615, "weight": -9223372036854775808}"#
        ));
    }

    #[test]
    fn anything_uncertain_does_not() {
        for doc in [
            "",
            "[]",
            "1",
            "\u{feff}{}",
            "{}x",
            "{} {}",
            r#"{"unknown": 1}"#,
            r#"{"orderId": "a", "order_id": "b"}"#,
            r#"{"gift": true, "gift": true}"#,
            r#"{"order\u005fid": "a", "order_id": "b"}"#,
            r#"{"orderId": null}"#,
            r#"{"orderId": 1}"#,
            r#"{"small": -1}"#,
            r#"{"small": 4294967296}"#,
            r#"{"big": 9223372036854775808}"#,
            r#"{"big": -9223372036854775809}"#,
            r#"{"huge": 18446744073709551616}"#,
            r#"{"small": 1.0}"#,
            r#"{"small": 1e2}"#,
            r#"{"small": -0}"#,
            r#"{"total": 1e400}"#,
            r#"{"total": NaN}"#,
            r#"{"total": Infinity}"#,
            r#"{"total": 1.7976931348623157e308}"#,
            r#"{"weight": 3.4028234663852886e38}"#,
            r#"{"weight": 3.5e38}"#,
            r#"{"total": "1"}"#,
            r#"{"orderId": "\ud800"}"#,
            r#"{"orderId": "a\udfffb"}"#,
            "{\"orderId\": \"\u{1}\"}",
            r#"{"tags": ["a",]}"#,
            r#"{"tags": ["a"],}"#,
            r#"{"tags": "a"}"#,
            r#"{"items": {}}"#,
            r#"{"items": [1]}"#,
            r#"{"items": [{"sku": "a", "sku": "b"}]}"#,
            r#"{"items": [{"colour": "red"}]}"#,
            r#"{"[ext]": 1}"#,
        ] {
            assert!(!fits(doc), "{doc}");
        }
        assert!(!order().fits(b"{\"orderId\": \"\xff\"}"));
        assert!(!order().fits(b"{\"orderId\": \"\xed\xa0\x80\"}"));
    }

    #[test]
    fn nesting_stops_at_the_depth() {
        // The document is depth 1, an item 2, each `parts` level one more: the innermost `{}`
        // of `nested(n)` is at depth n + 2.
        let nested = |n: usize, inner: &str| {
            format!(
                r#"{{"items": [{}{inner}{}]}}"#,
                r#"{"parts": ["#.repeat(n),
                "]}".repeat(n)
            )
        };
        assert!(fits(&nested(30, "{}")));
        assert!(!fits(&nested(31, "{}")));
        assert!(fits(&nested(30, "")));
        assert!(!fits(&nested(300, "{}")));
    }

    #[test]
    fn bad_plans_are_refused() {
        assert_eq!(Plan::new(vec![], 32).unwrap_err(), PlanError::Empty);
        let m = Message::new(vec![(vec!["a"], one(Kind::Msg(3)))]);
        assert!(matches!(Plan::new(vec![m], 32), Err(PlanError::NoSuchMessage { .. })));
        let m = Message::new(vec![(vec!["a"], one(Kind::Str)), (vec!["a"], one(Kind::Bool))]);
        assert!(matches!(Plan::new(vec![m], 32), Err(PlanError::RepeatedKey { .. })));
        let m = Message::new(vec![(vec!["a"], one(Kind::Num { lo: 0.0, hi: f64::NAN }))]);
        assert!(matches!(Plan::new(vec![m], 32), Err(PlanError::BadBounds { .. })));
    }

    proptest::proptest! {
        /// Any bytes, and valid orders with a byte changed: never a panic, and a yes only for a
        /// JSON object (Parse's own verdict is checked on the Python side, where Parse is).
        #[test]
        fn arbitrary_and_mutated_bytes(
            data in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..96),
            at in 0usize..200,
            byte in proptest::prelude::any::<u8>(),
        ) {
            let plan = order();
            if plan.fits(&data) {
                let v: serde_json::Value = serde_json::from_slice(&data).unwrap();
                proptest::prop_assert!(v.is_object());
            }
            let mut doc = br#"{"orderId":"o-1","items":[{"sku":"s","qty":2,"parts":[{"sku":"p"}]}],"total":12.5,"small":7,"tags":["a"]}"#.to_vec();
            let i = at % doc.len();
            doc[i] = byte;
            if plan.fits(&doc) {
                let v: serde_json::Value = serde_json::from_slice(&doc).unwrap();
                proptest::prop_assert!(v.is_object());
            }
        }
    }

    #[test]
    fn a_range_that_excludes_zero() {
        let m = Message::new(vec![(vec!["n"], one(Kind::Int { lo: 5, hi: 9 }))]);
        let plan = Plan::new(vec![m], 32).unwrap();
        assert!(plan.fits(br#"{"n": 5}"#) && plan.fits(br#"{"n": 9}"#));
        assert!(!plan.fits(br#"{"n": 4}"#) && !plan.fits(br#"{"n": 10}"#) && !plan.fits(br#"{"n": -1}"#));
    }

    #[test]
    fn many_fields_are_tracked_too() {
        let names: Vec<String> = (0..100).map(|i| format!("f{i}")).collect();
        let m = Message::new(names.iter().map(|n| (vec![n.clone()], one(Kind::Bool))).collect());
        let plan = Plan::new(vec![m], 32).unwrap();
        assert!(plan.fits(br#"{"f0": true, "f99": false, "f70": true}"#));
        assert!(!plan.fits(br#"{"f99": true, "f70": false, "f99": true}"#));
    }
}

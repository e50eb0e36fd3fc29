//! Avro payloads (feature `registry`): binary datums decoded and validated, JSON documents
//! validated, by a registry's Avro schema - what the Python SDK does with fastavro and the Go
//! client with hamba/avro plus its bounded reader (docs/sdk-rust.md, "Schema registry").
//!
//! The schema is parsed by the `apache-avro` crate (names, namespaces, aliases, logical
//! types). The datum is read by the bounded reader below, not by apache-avro's decoder, so a
//! hostile payload meets explicit limits, as in the Go client: every length is checked
//! against the bytes left before anything is allocated, nesting stops at [`MAX_DEPTH`] (a
//! recursive schema cannot turn 16 MiB of payload into 16 million stack frames), a datum may
//! hold at most one value per payload byte plus [`MAX_FREE_VALUES`] (an array of a million
//! nulls costs nothing on the wire), and strings must be UTF-8 (as fastavro decodes them).
//!
//! The decoded value is JSON: records and maps objects, arrays arrays, int/long integers,
//! float/double numbers (NaN and infinities as `"NaN"`, `"Infinity"`, `"-Infinity"`), bytes
//! and fixed base64 strings (as the protobuf decoder writes bytes), enums their symbol, null
//! null, a union its branch's value (as fastavro returns it); logical types as their
//! underlying type. So [`mask_pii`](crate::registry::mask_pii) works on it.

use std::collections::HashMap;

use apache_avro::schema::{Name, Schema};
use base64::Engine;
use serde_json::{Map, Value};

use crate::error::{err, PrismError, Result};

/// Nesting limit of a datum and of the schema's JSON (Python's and Go's 64).
pub const MAX_DEPTH: usize = 64;
/// Values a datum may hold beyond one per payload byte (values of zero-byte types).
pub const MAX_FREE_VALUES: usize = 1 << 16;

/// A parsed Avro schema with its named types (for `Ref`s: recursive and reused types).
#[derive(Debug, Clone)]
pub struct AvroSchema {
    root: Schema,
    names: HashMap<Name, Schema>,
}

fn schema_err(what: String) -> PrismError {
    err!(
        Config,
        what,
        "schema",
        "register a valid Avro schema (a named type from another subject must be among its references)"
    )
}

impl AvroSchema {
    /// Parse a schema text as the registry serves it (JSON read within Python's limits first).
    pub fn parse(text: &str) -> Result<AvroSchema> {
        Self::parse_with_references(text, &[])
    }

    /// Parse a schema whose named types may come from `referenced`: the texts of the schemas
    /// its Confluent `references` name (each a named type), dependencies first - what
    /// [`RegistryClient::avro_schema`](crate::registry::RegistryClient::avro_schema) fetches.
    pub fn parse_with_references(text: &str, referenced: &[String]) -> Result<AvroSchema> {
        for t in std::iter::once(text).chain(referenced.iter().map(String::as_str)) {
            let json: Value = crate::untrusted_json::parse(
                t.as_bytes(),
                "schema",
                crate::untrusted_json::DEFAULT_MAX_BYTES,
                MAX_DEPTH,
                PrismError::Config,
            )?;
            check_names(&json, 0)?;
        }
        // apache-avro 0.21 unwraps on some invalid names (`Name::new(..).unwrap()`); the names
        // are checked above, and a panic that still escapes its parser is a `Config` error
        // here rather than the caller's crash (with `panic = "abort"` it would still abort).
        let parsed = std::panic::catch_unwind(|| {
            if referenced.is_empty() {
                Schema::parse_str(text).map(|r| (r, Vec::new()))
            } else {
                Schema::parse_str_with_list(text, referenced)
            }
        })
        .map_err(|_| schema_err("the Avro schema does not parse (the parser gave up)".into()))?;
        let (root, others) = match parsed {
            Ok((root, others)) => (Ok(root), others),
            Err(e) => (Err(e), Vec::new()),
        };
        let root = root.map_err(|e| schema_err(format!("the Avro schema does not parse: {e}")))?;
        let all: Vec<&Schema> = others.iter().chain(std::iter::once(&root)).collect();
        let resolved = apache_avro::schema::ResolvedSchema::try_from(all.clone())
            .map_err(|e| schema_err(format!("the Avro schema's names do not resolve: {e}")))?;
        // only the types a `Ref` names are kept (a copy each), not every named type's subtree
        let mut used = std::collections::HashSet::new();
        for s in &all {
            refs_in(s, &mut used, 0);
        }
        let names = resolved
            .get_names()
            .iter()
            .filter(|(n, _)| used.contains(*n))
            .map(|(n, s)| (n.clone(), (*s).clone()))
            .collect();
        Ok(AvroSchema { root, names })
    }

    /// The registry's PII paths of this schema (`pii_fields`: schema paths, `Order.email`,
    /// `Order.total.Money.units`, as app/schema/pii.py names the fields of every record
    /// defined inline, a referenced type inlined at its first use) as payload paths for
    /// [`mask_pii`](crate::registry::mask_pii): `email`, `total.units`, `items[].ssn`, and
    /// under a map `attrs.*.x` (`*`: every key, the Python SDK's `pii_paths` notation). The
    /// registry names a record's fields only where it is defined (its first use); a record
    /// used again by name gets the same paths there, as the Python SDK masks it. A recursive
    /// record's paths stop at the recursion (a path cannot repeat forever).
    pub fn payload_pii_paths(&self, schema_paths: &[String]) -> Vec<String> {
        let mut walk = PiiWalk {
            schema: self,
            want: schema_paths,
            memo: HashMap::new(),
            steps: Vec::new(),
        };
        let mut out: Vec<String> = Vec::new();
        // a path below a root array has no name in mask_pii's notation
        for p in walk.go(&self.root, 0) {
            if let Some(p) = p.strip_prefix('.') {
                if !out.iter().any(|o| o == p) {
                    out.push(p.to_owned());
                }
            }
        }
        out
    }

    fn deref<'a>(&'a self, s: &'a Schema) -> std::result::Result<&'a Schema, String> {
        match s {
            Schema::Ref { name } => self
                .names
                .get(name)
                .ok_or_else(|| format!("the schema references an undefined type {}", name.fullname(None))),
            other => Ok(other),
        }
    }

    /// Decode one binary datum (schemaless: no container header, no magic byte). Bytes after
    /// the datum are refused, as the Python SDK's decode refuses them. Errors are `Payload`.
    pub fn decode_binary(&self, payload: &[u8]) -> Result<Value> {
        let mut r = Reader {
            buf: payload,
            pos: 0,
            steps: 0,
        };
        let v = r.read(self, &self.root, 0).map_err(|e| {
            err!(
                Payload,
                format!("payload is not binary Avro of this schema: {e}"),
                "payload",
                "read it with payload_bytes(); the producer wrote something else"
            )
        })?;
        if r.pos != payload.len() {
            return Err(err!(
                Payload,
                format!(
                    "payload is not binary Avro of this schema: {} byte(s) after the Avro datum",
                    payload.len() - r.pos
                ),
                "payload",
                "read it with payload_bytes(); the producer wrote something else"
            ));
        }
        Ok(v)
    }

    /// Validate a payload before publish: binary Avro, or (content type with `json`) a JSON
    /// document checked value by value as fastavro's `validate` does. `Validation` names the
    /// deepest failing position (`$.items[2].price`), as the Python SDK's report does.
    pub fn validate(&self, payload: &[u8], content_type: &str) -> Result<()> {
        if content_type.to_ascii_lowercase().contains("json") {
            let doc: Value = crate::untrusted_json::parse(
                payload,
                "payload",
                crate::model::MAX_JSON_PAYLOAD_BYTES,
                MAX_DEPTH,
                PrismError::Validation,
            )?;
            return match self.check(&self.root, Some(&doc), 0) {
                Ok(()) => Ok(()),
                Err((path, what)) => {
                    let mut at = String::from("$");
                    for seg in path.iter().rev() {
                        at.push_str(seg);
                    }
                    Err(err!(
                        Validation,
                        format!("payload does not match the Avro schema: {what}"),
                        at,
                        "fix the payload or publish against the right schema version"
                    ))
                }
            };
        }
        let mut r = Reader {
            buf: payload,
            pos: 0,
            steps: 0,
        };
        r.read(self, &self.root, 0).map(|_| ()).map_err(|e| {
            err!(
                Validation,
                format!("payload is not binary Avro of this schema: {e}"),
                "$",
                "fix the payload, or publish against another schema version"
            )
        })
    }

    /// fastavro's `validate` of one JSON value (None: the field is absent); on failure the
    /// path segments from the failure up (reversed) and what was expected.
    fn check(&self, s: &Schema, v: Option<&Value>, depth: usize) -> std::result::Result<(), (Vec<String>, String)> {
        let fail = |what: String| Err((Vec::new(), what));
        if depth > MAX_DEPTH {
            return fail(format!("nests more than {MAX_DEPTH} deep"));
        }
        let s = self.deref(s).map_err(|e| (Vec::new(), e))?;
        let Some(v) = v else {
            // fastavro: an absent field without a default is valid only for null
            return match s {
                Schema::Null => Ok(()),
                Schema::Union(u) if u.variants().iter().any(|b| matches!(b, Schema::Null)) => Ok(()),
                _ => fail(format!("a required {} value is missing", kind(s))),
            };
        };
        let int_in = |lo: i64, hi: i64| v.as_i64().is_some_and(|n| (lo..=hi).contains(&n));
        let ok = match s {
            Schema::Null => v.is_null(),
            Schema::Boolean => v.is_boolean(),
            Schema::Int | Schema::Date | Schema::TimeMillis => int_in(i32::MIN.into(), i32::MAX.into()),
            Schema::Long
            | Schema::TimeMicros
            | Schema::TimestampMillis
            | Schema::TimestampMicros
            | Schema::TimestampNanos
            | Schema::LocalTimestampMillis
            | Schema::LocalTimestampMicros
            | Schema::LocalTimestampNanos => v.is_i64(),
            Schema::Float | Schema::Double => v.is_number(),
            Schema::String | Schema::Uuid => v.is_string(),
            // JSON has no bytes: as for Python (json.loads + fastavro) and Go, never valid
            Schema::Bytes | Schema::BigDecimal | Schema::Decimal(_) | Schema::Fixed(_) | Schema::Duration => false,
            Schema::Enum(e) => v.as_str().is_some_and(|x| e.symbols.iter().any(|y| y == x)),
            Schema::Union(u) => u.variants().iter().any(|b| self.check(b, Some(v), depth + 1).is_ok()),
            Schema::Array(a) => {
                let Some(items) = v.as_array() else {
                    return fail("expected an array".into());
                };
                for (i, x) in items.iter().enumerate() {
                    self.check(&a.items, Some(x), depth + 1).map_err(|(mut p, w)| {
                        p.push(format!("[{i}]"));
                        (p, w)
                    })?;
                }
                true
            }
            Schema::Map(m) => {
                let Some(o) = v.as_object() else {
                    return fail("expected an object (map)".into());
                };
                for (k, x) in o {
                    self.check(&m.types, Some(x), depth + 1).map_err(|(mut p, w)| {
                        p.push(segment(k));
                        (p, w)
                    })?;
                }
                true
            }
            Schema::Record(r) => {
                let Some(o) = v.as_object() else {
                    return fail(format!("expected an object (record {})", r.name.fullname(None)));
                };
                for f in &r.fields {
                    let x = o.get(&f.name).or(f.default.as_ref());
                    self.check(&f.schema, x, depth + 1).map_err(|(mut p, w)| {
                        p.push(segment(&f.name));
                        (p, w)
                    })?;
                }
                true
            }
            Schema::Ref { .. } => false,
        };
        if ok {
            Ok(())
        } else {
            fail(format!("{} is not a {} value", clip(v), kind(s)))
        }
    }
}

const PRIMITIVES: [&str; 8] = ["null", "boolean", "int", "long", "float", "double", "bytes", "string"];

/// `a`, `a.b.C`: Avro's name grammar (`[A-Za-z_][A-Za-z0-9_]*`, dot-separated).
/// The walk of [`AvroSchema::payload_pii_paths`]: the schema in field order, with the
/// (short name, full name, field) steps of the registry's path so far. A record is walked at
/// its first use; its PII paths are reused wherever it is used again by name (as the Python
/// SDK's and the Go client's schema trees share one node per record).
struct PiiWalk<'a> {
    schema: &'a AvroSchema,
    want: &'a [String],
    /// a record's PII paths relative to it (`.email`, `.items[].ssn`); None while it is walked
    memo: HashMap<Name, Option<Vec<String>>>,
    steps: Vec<(String, String, String)>,
}

impl PiiWalk<'_> {
    /// The PII paths below a value of schema `s`, as suffixes of the path that holds it:
    /// `.email` (a record's field), `[].ssn` (an array's items), `.*.x` (a map's values).
    fn go(&mut self, s: &Schema, depth: usize) -> Vec<String> {
        if depth > MAX_DEPTH {
            return Vec::new();
        }
        match s {
            Schema::Ref { name } => match self.schema.names.get(name) {
                Some(t) => self.go(t, depth + 1),
                None => Vec::new(),
            },
            Schema::Record(r) => {
                match self.memo.get(&r.name) {
                    Some(Some(known)) => return known.clone(),
                    Some(None) => return Vec::new(), // recursion: a path cannot repeat forever
                    None => {}
                }
                self.memo.insert(r.name.clone(), None);
                let mut out = Vec::new();
                for f in &r.fields {
                    self.steps
                        .push((r.name.name.clone(), r.name.fullname(None), f.name.clone()));
                    let mut budget = 10_000;
                    if self.want.iter().any(|w| path_matches(w, &self.steps, &mut budget)) {
                        out.push(format!(".{}", f.name));
                    }
                    for below in self.go(&f.schema, depth + 1) {
                        out.push(format!(".{}{below}", f.name));
                    }
                    self.steps.pop();
                }
                self.memo.insert(r.name.clone(), Some(out.clone()));
                out
            }
            Schema::Union(u) => {
                let mut out = Vec::new();
                for b in u.variants() {
                    out.extend(self.go(b, depth + 1));
                }
                out
            }
            Schema::Array(a) => self
                .go(&a.items, depth + 1)
                .into_iter()
                .map(|p| format!("[]{p}"))
                .collect(),
            Schema::Map(m) => self
                .go(&m.types, depth + 1)
                .into_iter()
                .map(|p| format!(".*{p}"))
                .collect(),
            _ => Vec::new(),
        }
    }
}

/// Whether the registry's path `w` (`Order.total.Money.units`; a record named as its schema
/// writes it, short or full) is the path of `steps`. `budget` bounds the backtracking.
fn path_matches(w: &str, steps: &[(String, String, String)], budget: &mut usize) -> bool {
    let Some(((short, full, field), rest)) = steps.split_first() else {
        return w.is_empty();
    };
    if *budget == 0 {
        return false;
    }
    *budget -= 1;
    let names: &[&String] = if short == full { &[short] } else { &[short, full] };
    names.iter().any(|name| {
        let Some(r) = w
            .strip_prefix(name.as_str())
            .and_then(|r| r.strip_prefix('.'))
            .and_then(|r| r.strip_prefix(field.as_str()))
        else {
            return false;
        };
        if rest.is_empty() {
            r.is_empty()
        } else {
            r.strip_prefix('.').is_some_and(|r| path_matches(r, rest, budget))
        }
    })
}

fn is_fullname(s: &str) -> bool {
    !s.is_empty()
        && s.split('.').all(|p| {
            let mut c = p.chars();
            c.next().is_some_and(|x| x == '_' || x.is_ascii_alphabetic())
                && c.all(|x| x == '_' || x.is_ascii_alphanumeric())
        })
}

/// Every name, namespace, alias and type reference at a schema position of `v` follows
/// Avro's grammar (apache-avro unwraps on some that do not); defaults and other attributes
/// are not schema positions and are not looked at.
fn check_names(v: &Value, depth: usize) -> Result<()> {
    let bad = |what: &str, got: &Value| {
        Err(schema_err(format!(
            "the Avro schema has an invalid {what}: {}",
            clip(got)
        )))
    };
    if depth > MAX_DEPTH {
        return Err(schema_err(format!("the Avro schema nests more than {MAX_DEPTH} deep")));
    }
    match v {
        Value::String(s) => {
            if !PRIMITIVES.contains(&s.as_str()) && !is_fullname(s) {
                return bad("type name", v);
            }
        }
        Value::Array(branches) => {
            for b in branches {
                check_names(b, depth + 1)?;
            }
        }
        Value::Object(o) => {
            for key in ["name", "namespace"] {
                match o.get(key) {
                    None => {}
                    Some(Value::String(s)) if (key == "namespace" && s.is_empty()) || is_fullname(s) => {}
                    Some(other) => return bad(key, other),
                }
            }
            match o.get("aliases") {
                None => {}
                Some(Value::Array(a)) if a.iter().all(|x| x.as_str().is_some_and(is_fullname)) => {}
                Some(other) => return bad("aliases", other),
            }
            for key in ["type", "items", "values"] {
                if let Some(t) = o.get(key) {
                    check_names(t, depth + 1)?;
                }
            }
            if let Some(fields) = o.get("fields") {
                let Some(fields) = fields.as_array() else {
                    return bad("fields", fields);
                };
                for f in fields {
                    let Some(fo) = f.as_object() else {
                        return bad("field", f);
                    };
                    match fo.get("name") {
                        Some(Value::String(s)) if is_fullname(s) && !s.contains('.') => {}
                        other => return bad("field name", other.unwrap_or(&Value::Null)),
                    }
                    match fo.get("aliases") {
                        None => {}
                        Some(Value::Array(a)) if a.iter().all(|x| x.as_str().is_some_and(is_fullname)) => {}
                        Some(other) => return bad("field aliases", other),
                    }
                    match fo.get("type") {
                        Some(t) => check_names(t, depth + 1)?,
                        None => return bad("field without a type", f),
                    }
                }
            }
        }
        other => return bad("schema", other),
    }
    Ok(())
}

/// The names every `Ref` in `s` points at (the schema's JSON is at most 64 deep).
fn refs_in(s: &Schema, out: &mut std::collections::HashSet<Name>, depth: usize) {
    if depth > MAX_DEPTH {
        return;
    }
    match s {
        Schema::Ref { name } => {
            out.insert(name.clone());
        }
        Schema::Record(r) => r.fields.iter().for_each(|f| refs_in(&f.schema, out, depth + 1)),
        Schema::Union(u) => u.variants().iter().for_each(|b| refs_in(b, out, depth + 1)),
        Schema::Array(a) => refs_in(&a.items, out, depth + 1),
        Schema::Map(m) => refs_in(&m.types, out, depth + 1),
        Schema::Decimal(d) => refs_in(&d.inner, out, depth + 1),
        _ => {}
    }
}

fn clip(v: &Value) -> String {
    v.to_string().chars().take(60).collect()
}

/// `.name`, or `["odd key"]` for keys that are not identifiers (Python's `json_path`).
fn segment(k: &str) -> String {
    let mut c = k.chars();
    let ident = c.next().is_some_and(|x| x == '_' || x.is_alphabetic()) && c.all(|x| x == '_' || x.is_alphanumeric());
    if ident {
        format!(".{k}")
    } else {
        format!("[{}]", Value::String(k.to_owned()))
    }
}

fn kind(s: &Schema) -> String {
    match s {
        Schema::Record(r) => format!("record {}", r.name.fullname(None)),
        Schema::Enum(e) => format!("enum {}", e.name.fullname(None)),
        Schema::Fixed(f) => format!("fixed {} ({} bytes)", f.name.fullname(None), f.size),
        Schema::Union(_) => "union branch's".into(),
        other => format!("{:?}", apache_avro::schema::SchemaKind::from(other)).to_ascii_lowercase(),
    }
}

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    /// values read so far (the budget: `buf.len() + MAX_FREE_VALUES`)
    steps: usize,
}

type R<T> = std::result::Result<T, String>;

impl Reader<'_> {
    fn fail<T>(&self, what: &str) -> R<T> {
        Err(format!("{what} at byte {}", self.pos))
    }

    /// A zigzag varint long (at most 10 bytes).
    fn long(&mut self) -> R<i64> {
        let mut u: u64 = 0;
        for i in 0..10 {
            let Some(&b) = self.buf.get(self.pos + i) else {
                return self.fail("truncated varint");
            };
            if i == 9 && b > 1 {
                return self.fail("overlong varint");
            }
            u |= u64::from(b & 0x7f) << (7 * i);
            if b & 0x80 == 0 {
                self.pos += i + 1;
                return Ok((u >> 1) as i64 ^ -((u & 1) as i64));
            }
        }
        self.fail("overlong varint")
    }

    fn take(&mut self, n: i64) -> R<&[u8]> {
        let left = self.buf.len() - self.pos;
        if n < 0 || n as u64 > left as u64 {
            return self.fail(&format!("length {n} exceeds the {left} byte(s) left"));
        }
        let b = &self.buf[self.pos..self.pos + n as usize];
        self.pos += n as usize;
        Ok(b)
    }

    /// One block header of an array or map: the count (negative: followed by the block's byte
    /// size, read and ignored). Items are bounded by the step budget, not by the count.
    fn block_count(&mut self) -> R<i64> {
        let n = self.long()?;
        if n < 0 {
            if n == i64::MIN {
                return self.fail("block count out of range");
            }
            self.long()?;
            return Ok(-n);
        }
        Ok(n)
    }

    fn utf8(&self, b: &[u8], what: &str) -> R<String> {
        match std::str::from_utf8(b) {
            Ok(s) => Ok(s.to_owned()),
            Err(_) => self.fail(&format!("{what} is not UTF-8")),
        }
    }

    fn read(&mut self, sc: &AvroSchema, s: &Schema, depth: usize) -> R<Value> {
        if depth > MAX_DEPTH {
            return self.fail(&format!("datum nests more than {MAX_DEPTH} deep"));
        }
        self.steps += 1;
        if self.steps > self.buf.len() + MAX_FREE_VALUES {
            return self.fail("datum holds more values than its bytes allow");
        }
        let b64 = |b: &[u8]| Value::String(base64::engine::general_purpose::STANDARD.encode(b));
        Ok(match s {
            Schema::Null => Value::Null,
            Schema::Boolean => match self.take(1)?[0] {
                0 => false.into(),
                1 => true.into(),
                _ => return self.fail("boolean byte is not 0 or 1"),
            },
            Schema::Int | Schema::Date | Schema::TimeMillis => {
                let v = self.long()?;
                if i32::try_from(v).is_err() {
                    return self.fail("int out of range");
                }
                v.into()
            }
            Schema::Long
            | Schema::TimeMicros
            | Schema::TimestampMillis
            | Schema::TimestampMicros
            | Schema::TimestampNanos
            | Schema::LocalTimestampMillis
            | Schema::LocalTimestampMicros
            | Schema::LocalTimestampNanos => self.long()?.into(),
            Schema::Float => float(f64::from(f32::from_le_bytes(
                self.take(4)?.try_into().unwrap_or([0; 4]),
            ))),
            Schema::Double => float(f64::from_le_bytes(self.take(8)?.try_into().unwrap_or([0; 8]))),
            Schema::String | Schema::Uuid => {
                let n = self.long()?;
                let b = self.take(n)?;
                let b = b.to_vec();
                self.utf8(&b, "string")?.into()
            }
            Schema::Bytes | Schema::BigDecimal => {
                let n = self.long()?;
                b64(self.take(n)?)
            }
            Schema::Decimal(d) => return self.read(sc, &d.inner, depth + 1),
            Schema::Fixed(f) => {
                let n = i64::try_from(f.size).unwrap_or(i64::MAX);
                b64(self.take(n)?)
            }
            Schema::Duration => b64(self.take(12)?),
            Schema::Enum(e) => {
                let i = self.long()?;
                match usize::try_from(i).ok().and_then(|i| e.symbols.get(i)) {
                    Some(sym) => sym.clone().into(),
                    None => return self.fail(&format!("enum index {i} out of range")),
                }
            }
            Schema::Union(u) => {
                let i = self.long()?;
                match usize::try_from(i).ok().and_then(|i| u.variants().get(i)) {
                    Some(b) => return self.read(sc, b, depth + 1),
                    None => return self.fail(&format!("union branch {i} out of range")),
                }
            }
            Schema::Array(a) => {
                let mut out = Vec::new();
                loop {
                    let mut n = self.block_count()?;
                    if n == 0 {
                        break Value::Array(out);
                    }
                    while n > 0 {
                        out.push(self.read(sc, &a.items, depth + 1)?);
                        n -= 1;
                    }
                }
            }
            Schema::Map(m) => {
                let mut out = Map::new();
                loop {
                    let mut n = self.block_count()?;
                    if n == 0 {
                        break Value::Object(out);
                    }
                    while n > 0 {
                        let kl = self.long()?;
                        let kb = self.take(kl)?.to_vec();
                        let k = self.utf8(&kb, "map key")?;
                        // a key costs a step too: a map of empty keys to nulls is still bounded
                        self.steps += 1;
                        let v = self.read(sc, &m.types, depth + 1)?;
                        out.insert(k, v);
                        n -= 1;
                    }
                }
            }
            Schema::Record(r) => {
                let mut out = Map::new();
                for f in &r.fields {
                    let v = self.read(sc, &f.schema, depth + 1)?;
                    out.insert(f.name.clone(), v);
                }
                Value::Object(out)
            }
            Schema::Ref { .. } => {
                let target = sc.deref(s)?;
                return self.read(sc, target, depth + 1);
            }
        })
    }
}

fn float(f: f64) -> Value {
    if f.is_nan() {
        "NaN".into()
    } else if f.is_infinite() {
        if f > 0.0 { "Infinity" } else { "-Infinity" }.into()
    } else {
        f.into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const ORDER: &str = r#"{"type": "record", "name": "Order", "namespace": "shop", "fields": [
        {"name": "id", "type": "string"},
        {"name": "qty", "type": "int"},
        {"name": "price", "type": ["null", "double"], "default": null},
        {"name": "tags", "type": {"type": "array", "items": "string"}},
        {"name": "kind", "type": {"type": "enum", "name": "Kind", "symbols": ["A", "B"]}},
        {"name": "next", "type": ["null", "Order"], "default": null}]}"#;

    fn zz(n: i64) -> Vec<u8> {
        let mut u = ((n << 1) ^ (n >> 63)) as u64;
        let mut out = Vec::new();
        loop {
            let b = (u & 0x7f) as u8;
            u >>= 7;
            if u == 0 {
                out.push(b);
                return out;
            }
            out.push(b | 0x80);
        }
    }

    fn order_bytes() -> Vec<u8> {
        let mut b = Vec::new();
        b.extend(zz(2));
        b.extend(b"o1");
        b.extend(zz(3));
        b.extend(zz(1));
        b.extend(2.5f64.to_le_bytes());
        b.extend(zz(1));
        b.extend(zz(1));
        b.extend(b"x");
        b.extend(zz(0));
        b.extend(zz(1));
        // next: one nested Order, then null
        b.extend(zz(1));
        b.extend(zz(1));
        b.extend(b"p");
        b.extend(zz(-4));
        b.extend(zz(0));
        b.extend(zz(0));
        b.extend(zz(0));
        b.extend(zz(0));
        b
    }

    #[test]
    fn decodes_records_unions_enums_and_recursive_refs() {
        let s = AvroSchema::parse(ORDER).unwrap();
        let v = s.decode_binary(&order_bytes()).unwrap();
        assert_eq!(
            v,
            json!({"id": "o1", "qty": 3, "price": 2.5, "tags": ["x"], "kind": "B",
                   "next": {"id": "p", "qty": -4, "price": null, "tags": [], "kind": "A", "next": null}})
        );
        let mut extra = order_bytes();
        extra.push(0);
        assert!(matches!(s.decode_binary(&extra), Err(PrismError::Payload(_))));
        assert!(s.validate(&order_bytes(), "application/avro").is_ok());
    }

    #[test]
    fn hostile_binary_is_a_typed_error() {
        let s = AvroSchema::parse(ORDER).unwrap();
        // a string length of 2^62 with two bytes behind it: refused before allocating
        let mut huge = zz(1 << 62);
        huge.extend(b"ab");
        assert!(matches!(s.decode_binary(&huge), Err(PrismError::Payload(_))));
        assert!(matches!(s.validate(&huge, ""), Err(PrismError::Validation(_))));
        // a million nulls in three bytes: over the step budget
        let nulls = AvroSchema::parse(r#"{"type": "array", "items": "null"}"#).unwrap();
        let mut b = zz(1_000_000);
        b.extend(zz(0));
        assert!(nulls.decode_binary(&b).is_err());
        let mut ok = zz(1000);
        ok.extend(zz(0));
        assert_eq!(nulls.decode_binary(&ok).unwrap().as_array().unwrap().len(), 1000);
        // a recursive list 10 000 deep: the depth limit, not the stack
        let list =
            AvroSchema::parse(r#"{"type": "record", "name": "L", "fields": [{"name": "n", "type": ["null", "L"]}]}"#)
                .unwrap();
        let deep = vec![2u8; 10_000];
        let e = list.decode_binary(&deep).unwrap_err();
        assert!(e.to_string().contains("deep"), "{e}");
        // enum and union indexes out of range, bad booleans, overlong varints
        assert!(s.decode_binary(&[0x80; 11]).is_err());
        let bools = AvroSchema::parse(r#""boolean""#).unwrap();
        assert!(bools.decode_binary(&[2]).is_err());
        let ints = AvroSchema::parse(r#""int""#).unwrap();
        assert!(ints.decode_binary(&zz(1 << 40)).is_err());
        assert!(s.decode_binary(&[]).is_err());
    }

    #[test]
    fn json_documents_are_validated_with_paths() {
        let s = AvroSchema::parse(ORDER).unwrap();
        let ok = json!({"id": "o", "qty": 1, "tags": [], "kind": "A"});
        assert!(s.validate(ok.to_string().as_bytes(), "application/json").is_ok());
        let bad = json!({"id": "o", "qty": 1, "tags": ["a", 3], "kind": "A"});
        let e = s.validate(bad.to_string().as_bytes(), "application/json").unwrap_err();
        assert!(matches!(&e, PrismError::Validation(d) if d.at == "$.tags[1]"), "{e:?}");
        let nested = json!({"id": "o", "qty": 1, "tags": [], "kind": "A",
                            "next": {"id": "p", "qty": 1i64 << 40, "tags": [], "kind": "A"}});
        let e = s
            .validate(nested.to_string().as_bytes(), "application/json")
            .unwrap_err();
        // the union accepts no branch: the failure is reported at the union
        assert!(matches!(&e, PrismError::Validation(d) if d.at == "$.next"), "{e:?}");
        let missing = json!({"id": "o", "tags": [], "kind": "C"});
        let e = s
            .validate(missing.to_string().as_bytes(), "application/json")
            .unwrap_err();
        assert!(matches!(&e, PrismError::Validation(d) if d.at == "$.qty"), "{e:?}");
        assert!(s.validate(b"{", "application/json").is_err());
    }

    #[test]
    fn named_types_come_from_references() {
        let money = r#"{"type": "record", "name": "Money", "namespace": "common", "fields": [
            {"name": "units", "type": "long"}, {"name": "currency", "type": "string"}]}"#;
        let order = r#"{"type": "record", "name": "Order", "namespace": "shop", "fields": [
            {"name": "total", "type": "common.Money"}]}"#;
        assert!(matches!(AvroSchema::parse(order), Err(PrismError::Config(_))));
        let s = AvroSchema::parse_with_references(order, &[money.to_owned()]).unwrap();
        let mut b = zz(-3);
        b.extend(zz(3));
        b.extend(b"EUR");
        assert_eq!(
            s.decode_binary(&b).unwrap(),
            json!({"total": {"units": -3, "currency": "EUR"}})
        );
        let e = s
            .validate(br#"{"total": {"units": 1, "currency": 2}}"#, "application/json")
            .unwrap_err();
        assert!(
            matches!(&e, PrismError::Validation(d) if d.at == "$.total.currency"),
            "{e:?}"
        );
    }

    #[test]
    fn registry_pii_paths_become_payload_paths() {
        let s = AvroSchema::parse(
            r#"{"type": "record", "name": "Order", "namespace": "shop", "fields": [
            {"name": "email", "type": ["null", "string"]},
            {"name": "items", "type": {"type": "array", "items": {"type": "record", "name": "Item",
                "fields": [{"name": "ssn", "type": "string"}]}}},
            {"name": "attrs", "type": {"type": "map", "values": {"type": "record", "name": "A",
                "fields": [{"name": "x", "type": "string"}]}}}]}"#,
        )
        .unwrap();
        let want = ["Order.email", "Order.items.Item.ssn", "Order.attrs.A.x", "Order.nope"].map(String::from);
        assert_eq!(s.payload_pii_paths(&want), ["email", "items[].ssn", "attrs.*.x"]);
        let mut v = json!({"email": "a@b", "items": [{"ssn": "1"}, {"ssn": "2"}],
                           "attrs": {"k1": {"x": "s", "y": 1}, "k2": {"x": "t"}}});
        assert_eq!(crate::registry::mask_pii(&mut v, &s.payload_pii_paths(&want)), 5);
        assert_eq!(
            v,
            json!({"email": "***", "items": [{"ssn": "***"}, {"ssn": "***"}],
                   "attrs": {"k1": {"x": "***", "y": 1}, "k2": {"x": "***"}}})
        );
    }

    #[test]
    fn pii_paths_follow_referenced_types_and_maps_of_them() {
        // the registry names a referenced record's fields under its first use (it scans the
        // schema with the referenced types inlined), a map's values under the map
        let money = r#"{"type": "record", "name": "Money", "namespace": "common",
            "fields": [{"name": "units", "type": "long"}, {"name": "payer", "type": "string"}]}"#;
        let s = AvroSchema::parse_with_references(
            r#"{"type": "record", "name": "shop.Order", "fields": [
            {"name": "total", "type": "common.Money"},
            {"name": "refunds", "type": {"type": "map", "values": {"type": "map", "values": "common.Money"}}},
            {"name": "again", "type": "common.Money"}]}"#,
            &[money.to_string()],
        )
        .unwrap();
        let want = ["shop.Order.total.Money.payer", "Order.refunds.nope"].map(String::from);
        assert_eq!(
            s.payload_pii_paths(&want),
            ["total.payer", "refunds.*.*.payer", "again.payer"]
        );
        let s = AvroSchema::parse_with_references(
            r#"{"type": "record", "name": "Order", "namespace": "shop", "fields": [
            {"name": "refunds", "type": {"type": "map", "values": {"type": "map", "values": "common.Money"}}},
            {"name": "total", "type": "common.Money"}]}"#,
            &[money.to_string()],
        )
        .unwrap();
        let want = ["Order.refunds.Money.payer".to_string()];
        assert_eq!(s.payload_pii_paths(&want), ["refunds.*.*.payer", "total.payer"]);
        let mut v = json!({"refunds": {"a": {"b": {"units": 1, "payer": "p"}}}, "total": {"units": 2, "payer": "q"}});
        assert_eq!(crate::registry::mask_pii(&mut v, &s.payload_pii_paths(&want)), 2);
        assert_eq!(v["refunds"]["a"]["b"]["payer"], "***");
        assert_eq!(v["total"]["payer"], "***"); // a reuse by name: the same record's field
    }

    #[test]
    fn bad_schemas_are_config_errors() {
        assert!(matches!(AvroSchema::parse("{"), Err(PrismError::Config(_))));
        assert!(matches!(
            AvroSchema::parse(r#"{"type": "record", "name": "R", "fields": [{"name": "x", "type": "Nowhere"}]}"#),
            Err(PrismError::Config(_))
        ));
        let deep = format!(
            "{}\"int\"{}",
            "{\"type\": \"array\", \"items\": ".repeat(70),
            "}".repeat(70)
        );
        assert!(matches!(AvroSchema::parse(&deep), Err(PrismError::Config(_))));
    }
}
